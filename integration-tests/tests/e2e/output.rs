//! `lyra output`: the returns the last succeeded apply recorded, secrets masked, one by name
//! for scripts; gone after a delete; carried by export and import.

use integration_tests::Lyra;

const WEB: &str = "\
parameters:
  token: Sensitive[String]
  name: String
returns: [url, config, secret]
steps:
  site:
    returns: {url: output}
    resource: Null::Resource
    value:
      input: $name
  cfg:
    returns: {config: output, secret: output}
    resource: Null::Resource
    value:
      input: {size: 2, key: $token}
";

const SECRET: &str = "hunter2-Pa55w0rd";

fn apply(lyra: &Lyra, name: &str) {
    lyra.ok(&[
        "apply",
        "web",
        "--var",
        &format!("token={SECRET}"),
        "--var",
        &format!("name={name}"),
    ]);
}

#[test]
fn returns_are_printed_masked_and_one_by_name() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    apply(&lyra, "shop");

    let all = lyra.ok(&["output", "web"]);
    assert!(all.stdout.contains("url: \"shop\""), "{all}");
    assert!(all.stdout.contains("secret: \"(sensitive)\""), "{all}");
    assert!(!all.stdout.contains(SECRET) && !all.stderr.contains(SECRET), "{all}");

    // One by name: the string itself, for `$(lyra output web url)`.
    assert_eq!(lyra.ok(&["output", "web", "url"]).stdout, "shop\n");
    // A secret by name is refused: its value is not kept, and a script must not take the
    // mask for it.
    let refused = lyra.run(&["output", "web", "secret"]);
    refused.expect_code(1).expect_stderr(&["sensitive", "not recorded"]);
    assert!(
        refused.stdout.is_empty() && !refused.stderr.contains(SECRET),
        "{refused}"
    );
    // The history holds no secret: the returns an export carries are masked.
    let export = lyra.ok_json(&["state", "export", "web"]);
    let history = export["deployments"][0]["history"].to_string();
    assert!(
        history.contains("\"returns\"") && !history.contains(SECRET),
        "{history}"
    );

    let doc = lyra.ok_json(&["output", "web"]);
    assert_eq!(doc["returns"]["url"], "shop", "{doc:#}");
    assert_eq!(doc["returns"]["secret"], "(sensitive)", "{doc:#}");
    assert_eq!(doc["sensitive"], serde_json::json!(["config", "secret"]), "{doc:#}");
    assert!(doc["run"].is_i64() && doc["note"].is_null(), "{doc:#}");
    assert!(!doc.to_string().contains(SECRET));

    let typo = lyra.run(&["output", "web", "ulr", "-o", "json"]);
    typo.expect_code(1);
    let err = typo.json();
    assert_eq!(err["error"]["kind"], "not_found", "{err:#}");
    assert_eq!(err["error"]["did_you_mean"], serde_json::json!(["url"]), "{err:#}");

    // A new apply's returns replace the old ones.
    apply(&lyra, "store");
    assert_eq!(lyra.ok(&["output", "web", "url"]).stdout, "store\n");
}

#[test]
fn a_deleted_deployment_returns_nothing_and_export_keeps_returns() {
    let lyra = Lyra::new();
    lyra.write_workflow("web", WEB);
    apply(&lyra, "shop");

    // Export, then import into another store: the returns come along.
    let export = lyra.path("export.json");
    lyra.ok(&["state", "export", "web", "--file", export.to_str().expect("utf-8")]);
    let other = lyra.path("other.db");
    let other = other.to_str().expect("utf-8");
    lyra.ok(&["state", "import", export.to_str().expect("utf-8"), "--state", other]);
    assert_eq!(lyra.ok(&["output", "web", "url", "--state", other]).stdout, "shop\n");

    lyra.ok(&["delete", "web"]);
    let after = lyra.ok(&["output", "web"]);
    assert!(after.stdout.is_empty(), "{after}");
    after.expect_stderr(&["deleted"]);
    let doc = lyra.ok_json(&["output", "web"]);
    assert_eq!(doc["returns"], serde_json::json!({}), "{doc:#}");
    assert!(doc["run"].is_null(), "{doc:#}");
    lyra.run(&["output", "web", "url"]).expect_code(1);
}

#[test]
fn unknown_deployments_and_missing_state_are_errors() {
    let lyra = Lyra::new();
    let none = lyra.run(&["output", "web", "-o", "json"]);
    none.expect_code(1);
    assert_eq!(none.json()["error"]["kind"], "no_state");

    lyra.write_workflow("web", WEB);
    apply(&lyra, "shop");
    let unknown = lyra.run(&["output", "wbe", "-o", "json"]);
    unknown.expect_code(1);
    let err = unknown.json();
    assert_eq!(err["error"]["kind"], "not_found", "{err:#}");
    assert_eq!(err["error"]["did_you_mean"], serde_json::json!(["web"]), "{err:#}");
}

//! Commands on things that do not exist: read-only commands never create a state store, and
//! commands on an unknown deployment exit 1 naming it (with the recorded names closest to it),
//! without recording anything. On SQLite and Postgres.

use integration_tests::{Lyra, Value, pg_or_skip, postgres};

const PAIR: &str = "\
steps:
  one:
    returns: {o: output}
    resource: Null::Resource
    value:
      input: 1
  two:
    resource: Null::Resource
    value:
      input: $o
";

/// Every command that must not create a store, as run with `--state URL` appended.
fn read_only_commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["state", "list"],
        vec!["state", "show", "webapp"],
        vec!["history", "webapp"],
        vec!["state", "export"],
        vec!["state", "export", "webapp"],
        vec!["state", "unlock", "webapp"],
        vec!["state", "unlock", "webapp", "--force"],
        vec!["state", "rm", "webapp", "one"],
        vec!["delete", "webapp"],
        vec!["delete", "webapp", "--dry-run"],
    ]
}

/// Runs every read-only command against `url` (a store that does not exist) and checks each
/// fails with exit 1 "no state at …" (kind `no_state`), and that `plan` works against nothing.
fn nothing_is_created(lyra: &Lyra, url: &str, shown: &str) {
    for cmd in read_only_commands() {
        let mut args = cmd.clone();
        args.extend(["--state", url, "-o", "json"]);
        let run = lyra.run(&args);
        run.expect_code(1).expect_stderr(&[&format!("no state at {shown}")]);
        let doc = run.json();
        assert_eq!(doc["error"]["kind"], "no_state", "{run}");
        assert_eq!(doc["error"]["state"], shown, "{run}");
    }
    let migrate = lyra.run(&["state", "migrate", "--from", url, "--to", "elsewhere.db"]);
    migrate.expect_code(1).expect_stderr(&["no state at"]);
    assert!(
        !lyra.path("elsewhere.db").exists(),
        "migrate created its target for nothing"
    );

    // A plan of a new deployment is legitimate: everything would be created.
    let plan = lyra.ok_json(&["plan", "pair", "--state", url]);
    assert_eq!(plan["counts"]["created"], 2, "{plan:#}");
}

#[test]
fn sqlite_read_only_commands_create_no_store() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    nothing_is_created(&lyra, "no/such/dir/state.db", "no/such/dir/state.db");
    assert!(!lyra.path("no").exists(), "a directory was created");
    // The default state too.
    lyra.run(&["state", "list"]).expect_code(1);
    lyra.ok(&["plan", "pair"]);
    assert!(!lyra.path(".lyra").exists(), "the default state was created");
    // An empty file is not a state, and stays empty.
    lyra.write("empty.db", "");
    lyra.run(&["state", "list", "--state", "empty.db"])
        .expect_code(1)
        .expect_stderr(&["no state at empty.db"]);
    assert_eq!(lyra.read("empty.db"), "");
}

#[test]
fn postgres_read_only_commands_create_no_schema() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    let shown = pg.url().to_owned();
    nothing_is_created(&lyra, pg.url(), &shown);
    let out = postgres::psql(&format!(
        "SELECT count(*) FROM pg_namespace WHERE nspname = '{}'",
        pg.schema()
    ));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.trim() == "0"), "the schema was created: {text}");
}

/// An unknown deployment: exit 1 naming it, the closest names offered, nothing recorded.
fn unknown_deployments(lyra: &Lyra, url: &str) {
    lyra.write_workflow("pair", PAIR);
    lyra.ok(&["apply", "pair", "--name", "webapp"]);
    lyra.ok(&["apply", "pair", "--name", "database"]);
    for cmd in [
        vec!["delete", "wepapp"],
        vec!["delete", "wepapp", "--dry-run"],
        vec!["state", "show", "wepapp"],
        vec!["history", "wepapp"],
        vec!["state", "rm", "wepapp", "one"],
        vec!["state", "unlock", "wepapp"],
        vec!["state", "unlock", "wepapp", "--force"],
        vec!["state", "export", "wepapp"],
        vec!["state", "export", "webapp", "wepapp"],
    ] {
        let text = lyra.run(&cmd);
        text.expect_code(1)
            .expect_stderr(&["no deployment 'wepapp'", "did you mean: webapp?"]);
        assert!(text.stdout.is_empty(), "{text}");
        let mut json = cmd.clone();
        json.extend(["-o", "json"]);
        let run = lyra.run(&json);
        run.expect_code(1);
        let error = &run.json()["error"];
        assert_eq!(error["kind"], "not_found", "{run}");
        assert_eq!(error["deployment"], "wepapp", "{run}");
        assert_eq!(error["did_you_mean"], serde_json::json!(["webapp"]), "{run}");
    }
    // Nothing near: named, and no suggestion.
    let far = lyra.run(&["delete", "nosuch", "-o", "json"]);
    far.expect_code(1).expect_stderr(&["no deployment 'nosuch'"]);
    assert_eq!(far.json()["error"]["did_you_mean"], serde_json::json!([]));

    // No phantom deployment, no history entry, for anything above.
    let list = lyra.ok_json(&["state", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|d| d["deployment"].as_str())
        .collect();
    assert_eq!(names, ["database", "webapp"], "{list:#}");
    assert_eq!(lyra.history("webapp").len(), 1);
    let migrate = lyra.run(&["state", "migrate", "--from", url, "--to", "b.db", "wepapp"]);
    migrate.expect_code(1).expect_stderr(&["no deployment 'wepapp'"]);
    assert_eq!(lyra.ok_json(&["state", "list"]), list, "nothing moved");

    // Unknown steps are named too.
    let rm = lyra.run(&["state", "rm", "webapp", "on", "-o", "json"]);
    rm.expect_code(1).expect_stderr(&["no step 'on'"]);
    assert_eq!(rm.json()["error"]["did_you_mean"], serde_json::json!(["one"]));
    assert_eq!(lyra.resources("webapp").len(), 2);
}

#[test]
fn sqlite_unknown_deployments_exit_1_and_record_nothing() {
    unknown_deployments(&Lyra::new(), ".lyra/state.db");
}

#[test]
fn postgres_unknown_deployments_exit_1_and_record_nothing() {
    let pg = pg_or_skip!();
    unknown_deployments(&Lyra::new().with_state(pg.url()), pg.url());
}

/// `state unlock D` without --force only shows the holder, and succeeds.
#[test]
fn unlock_without_force_shows_and_succeeds() {
    let lyra = Lyra::new();
    lyra.write_workflow("pair", PAIR);
    lyra.ok(&["apply", "pair"]);
    let run = lyra.ok(&["state", "unlock", "pair"]);
    assert!(run.stdout.contains("deployment 'pair' is not locked"), "{run}");
    let doc = lyra.ok_json(&["state", "unlock", "pair"]);
    assert_eq!(
        doc,
        serde_json::json!({"deployment": "pair", "lease": null, "broken": false})
    );
    let forced = lyra.ok_json(&["state", "unlock", "pair", "--force"]);
    assert_eq!(forced["broken"], false, "nothing to break: {forced:#}");
    // Nothing was broken, so nothing is kept in the history.
    assert_eq!(lyra.history("pair").len(), 1);
    assert_eq!(lyra.history("pair")[0]["operation"], Value::from("apply"));
}

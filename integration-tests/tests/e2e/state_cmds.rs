//! `lyra state show/list/rm/export/import` and secrets: the stable JSON shapes scripts rely on,
//! recovery edits that are kept in the history, and sensitive values never printed.

use integration_tests::{Lyra, cloud_ids, count, step};

const WEB: &str = "\
parameters:
  password: Sensitive[String]
  size: String
returns: [secret_echo, plain]
steps:
  vm:
    returns: {ip: instanceIP}
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: img
      cpus: 1
      memory: $size
  login:
    returns: {secret_echo: input}
    resource: Null::Resource
    value:
      input: $password
  tag:
    returns: {plain: input}
    resource: Null::Resource
    value:
      input: $ip
";

fn web(lyra: &Lyra) {
    lyra.write_workflow("web", WEB);
    lyra.write("data.yaml", "password: hunter2-s3cret\nsize: 1G\n");
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn state_show_and_list_json_have_the_stable_shape() {
    let lyra = Lyra::new();
    web(&lyra);
    lyra.ok(&["apply", "web"]);
    let shown = lyra.state("web");
    assert_eq!(
        keys(&shown),
        ["deployment", "lease", "resources", "unreadable", "workflow"],
        "{shown:#}"
    );
    assert_eq!(shown["deployment"], "web");
    assert_eq!(shown["workflow"], "web");
    assert!(shown["lease"].is_null());
    let vm = shown["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == "vm")
        .expect("vm");
    for key in ["step", "type", "external_id", "state"] {
        assert!(vm.get(key).is_some(), "{key} missing: {vm:#}");
    }
    assert_eq!(vm["type"], "Foobernetes::Instance");
    assert!(
        vm["external_id"].as_str().is_some_and(|id| id.starts_with("i-")),
        "{vm}"
    );
    assert_eq!(vm["state"]["location"], "eu1");

    let list = lyra.ok_json(&["state", "list"]);
    let entry = &list.as_array().expect("an array")[0];
    assert!(entry.get("resources").is_none(), "list has no resources: {entry:#}");
    assert_eq!(entry["deployment"], "web");
    assert!(entry["lease"].is_null());
    assert_eq!(entry["resource_count"], 3);
}

#[test]
fn sensitive_values_are_never_printed() {
    let lyra = Lyra::new();
    web(&lyra);
    let secret = "hunter2-s3cret";
    let mut outputs = Vec::new();
    for args in [
        vec!["plan", "web"],
        vec!["plan", "web", "-o", "json"],
        vec!["apply", "web", "-v"],
        vec!["plan", "web"],
        vec!["state", "show", "web"],
        vec!["state", "show", "web", "-o", "json"],
        vec!["state", "export"],
        vec!["history", "web", "-o", "json"],
    ] {
        let run = lyra.ok(&args);
        outputs.push(run);
    }
    for run in &outputs {
        // `state export` is the one command that must carry the value: it moves the state.
        if run.args.first().is_some_and(|a| a == "state") && run.args.get(1).is_some_and(|a| a == "export") {
            assert!(run.stdout.contains(secret), "an export keeps the secret: {run}");
            continue;
        }
        assert!(
            !run.stdout.contains(secret) && !run.stderr.contains(secret),
            "the secret leaked:\n{run}"
        );
    }
    assert!(outputs[0].stdout.contains("(sensitive)"), "{}", outputs[0]);
    let plan = outputs[1].json();
    let login = step(&plan, "login");
    assert_eq!(login["changes"][0]["new"], "(sensitive)", "{login:#}");
    // Returns derived from the secret are masked; others are not.
    let apply_out = &outputs[2].stdout;
    assert!(apply_out.contains("secret_echo: \"(sensitive)\""), "{apply_out}");
    assert!(apply_out.contains("plain: \"10."), "{apply_out}");
    let shown = outputs[5].json();
    let login = shown["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == "login")
        .expect("login");
    assert_eq!(login["state"]["input"], "(sensitive)", "{login:#}");
}

#[test]
fn state_rm_forgets_without_deleting_and_is_kept_in_the_history() {
    let lyra = Lyra::new();
    web(&lyra);
    lyra.ok(&["apply", "web"]);
    let vm_id = lyra.resources("web")["vm"].clone();

    lyra.run(&["state", "rm", "web", "nosuch"])
        .expect_code(1)
        .expect_stderr(&["no step 'nosuch'", "vm"]);
    let rm = lyra.ok(&["state", "rm", "web", "vm"]);
    assert!(rm.stdout.contains("forgot vm"), "{rm}");
    assert!(!lyra.resources("web").contains_key("vm"));
    assert_eq!(
        cloud_ids(&lyra.cloud(), "Instances"),
        std::slice::from_ref(&vm_id),
        "the instance itself is untouched"
    );
    let history = lyra.history("web");
    assert_eq!(history[0]["operation"], "forget");
    assert_eq!(history[0]["changes"][0]["step"], "vm");

    // Forgotten means forgotten: the next apply makes a new instance and leaves the old one
    // alone (its idempotency key went with its record; see adoption.rs).
    let report = lyra.ok_json(&["apply", "web"]);
    assert_eq!(count(&report, "created"), 1, "{report:#}");
    let new_id = lyra.resources("web")["vm"].clone();
    assert_ne!(new_id, vm_id);
    let mut instances = cloud_ids(&lyra.cloud(), "Instances");
    instances.sort();
    let mut expected = vec![vm_id, new_id];
    expected.sort();
    assert_eq!(instances, expected);
}

#[test]
fn export_and_import_move_a_deployment_between_files() {
    let lyra = Lyra::new();
    web(&lyra);
    lyra.ok(&["apply", "web"]);
    let before = lyra.state("web");
    lyra.ok(&["state", "export", "web", "-f", "web.json"]);
    let exported: serde_json::Value = serde_json::from_str(&lyra.read("web.json")).expect("JSON");
    assert_eq!(exported["format"], "lyra-state");
    assert_eq!(exported["version"], 1);
    assert_eq!(exported["deployments"][0]["history"].as_array().map(Vec::len), Some(1));

    let other = ["--state", "other.db"];
    let import = |extra: &[&str]| {
        let mut args = vec!["state", "import", "web.json"];
        args.extend(other);
        args.extend(extra);
        lyra.run(&args)
    };
    import(&[]).expect_ok();
    import(&[])
        .expect_code(1)
        .expect_stderr(&["already exists", "--replace"]);
    import(&["--replace"]).expect_ok();

    let moved = lyra.ok_json(&["state", "show", "web", "--state", "other.db"]);
    assert_eq!(moved["resources"], before["resources"]);
    let history = lyra.ok_json(&["history", "web", "--state", "other.db"]);
    assert_eq!(history[0]["operation"], "import");
    // Applying from the imported state changes nothing.
    let report = lyra.ok_json(&["apply", "web", "--state", "other.db"]);
    assert_eq!(count(&report, "unchanged"), 3, "{report:#}");
    assert_eq!(count(&report, "created"), 0);

    lyra.write(
        "bad.json",
        "{\"format\": \"something\", \"version\": 1, \"deployments\": []}",
    );
    lyra.run(&["state", "import", "bad.json"])
        .expect_code(1)
        .expect_stderr(&["bad.json", "not a Lyra state export"]);
}

//! `lyra drift`: the Foobernetes example applied, its cloud (`deployment.json`) edited by hand,
//! and the edits reported (exit 4) without anything written; `--refresh-state` records them as
//! a `refresh` run, and the next plan reverts them.

use std::time::Duration;

use integration_tests::{Lyra, Value, pg_or_skip, sleeps_workflow, step, steps_with_action, wait_until, workspace_dir};

use super::json_output::schema_errors;

/// The Foobernetes example with its data, in a fresh directory.
fn webapp() -> Lyra {
    let lyra = Lyra::new();
    let read = |p: &str| std::fs::read_to_string(workspace_dir().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    lyra.write_workflow("webapp", &read("examples/workflows/webapp.yaml"));
    lyra.write("data.yaml", read("examples/data.yaml"));
    lyra.ok(&["apply", "webapp"]);
    lyra
}

/// Edits `deployment.json` as a person would, behind Lyra's back.
fn edit_cloud(lyra: &Lyra, change: impl FnOnce(&mut Value)) {
    let mut cloud = lyra.cloud();
    change(&mut cloud);
    lyra.write(
        "deployment.json",
        serde_json::to_string_pretty(&cloud).expect("JSON") + "\n",
    );
}

/// Everything recorded: the state and history as shown, and the whole export (every record's
/// desired and actual state unmasked, every run). Not the file's bytes: SQLite folds its
/// write-ahead log into the file when some later process closes it, which moves bytes
/// without any write.
fn recorded(lyra: &Lyra) -> (Value, Vec<Value>, Value) {
    let export = lyra.ok_json(&["state", "export", "webapp"]);
    (lyra.state("webapp"), lyra.history("webapp"), export)
}

#[track_caller]
fn assert_unchanged(lyra: &Lyra, before: &(Value, Vec<Value>, Value)) {
    let now = recorded(lyra);
    assert_eq!(now.0, before.0, "the state changed");
    assert_eq!(now.1, before.1, "the history changed");
    assert_eq!(now.2, before.2, "the export changed");
}

#[track_caller]
fn drift_doc(lyra: &Lyra, args: &[&str], code: i32) -> Value {
    let mut all = vec!["drift", "webapp"];
    all.extend(args);
    all.extend(["-o", "json"]);
    let run = lyra.run(&all);
    run.expect_code(code);
    let doc = run.json();
    let errors = schema_errors(&doc, "drift");
    assert!(errors.is_empty(), "not a drift document: {errors:#?}\n{run}");
    doc
}

#[track_caller]
fn resource<'d>(doc: &'d Value, step: &str) -> &'d Value {
    doc["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["step"] == step))
        .unwrap_or_else(|| panic!("no {step} in {doc:#}"))
}

#[test]
fn edits_of_the_cloud_are_listed_recorded_by_refresh_and_reverted_by_apply() {
    let lyra = webapp();
    let run = lyra.run(&["drift", "webapp"]);
    run.expect_code(0);
    assert_eq!(run.stdout, "no drift: 5 resources match the state\n", "{run}");

    let ids = lyra.resources("webapp");
    let (db, lb, gone) = (&ids["db"], &ids["lb"], &ids["frontends/1"]);
    edit_cloud(&lyra, |cloud| {
        cloud["Instances"][db]["Cpus"] = 8.into();
        cloud["LoadBalancers"][lb]["Tags"]["app"] = "other".into();
        cloud["Instances"]
            .as_object_mut()
            .expect("instances")
            .remove(gone.as_str());
    });
    let cloud = lyra.read("deployment.json");
    let before = recorded(&lyra);

    let run = lyra.run(&["drift", "webapp"]);
    run.expect_code(4);
    assert_eq!(
        run.stdout,
        "~ db (Foobernetes::Instance)\n\
         \x20   cpus: 4 -> 8\n\
         - frontends/1 (Foobernetes::Instance): gone\n\
         ~ lb (Foobernetes::LoadBalancer)\n\
         \x20   tags.app: \"webapp\" -> \"other\"\n\
         3 of 5 resources drifted (1 gone)\n",
        "{run}"
    );
    let doc = drift_doc(&lyra, &[], 4);
    assert_eq!((doc["drifted"].clone(), doc["run"].clone()), (true.into(), Value::Null));
    assert_eq!(doc["counts"]["unchanged"], 2, "{doc:#}");
    assert_eq!(resource(&doc, "db")["status"], "drifted");
    assert_eq!(
        resource(&doc, "db")["changes"],
        serde_json::json!([{"attribute": "cpus", "path": "cpus", "recorded": 4, "live": 8, "sensitive": false}])
    );
    assert_eq!(resource(&doc, "lb")["changes"][0]["path"], "tags.app");
    assert_eq!(resource(&doc, "frontends/1")["status"], "gone");
    assert_eq!(resource(&doc, "web")["status"], "unchanged");
    assert_unchanged(&lyra, &before);
    assert_eq!(lyra.read("deployment.json"), cloud, "nor touches the cloud");

    let run = lyra.run(&["drift", "webapp", "--refresh-state"]);
    run.expect_code(4);
    assert!(
        run.stdout
            .contains("refreshed: recorded what was read of 2 resources (run 2); no resource was changed"),
        "{run}"
    );
    assert_eq!(lyra.read("deployment.json"), cloud, "refreshing changes no resource");
    let history = lyra.history("webapp");
    assert_eq!(history[0]["operation"], "refresh", "{history:#?}");
    assert_eq!(history[0]["outcome"], "succeeded");
    let changes: Vec<(&str, &str)> = history[0]["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| (c["step"].as_str().unwrap(), c["action"].as_str().unwrap()))
        .collect();
    assert_eq!(changes, [("db", "refresh"), ("frontends/1", "gone"), ("lb", "refresh")]);
    let text = lyra.ok(&["history", "webapp"]).stdout;
    assert!(text.contains("refresh"), "{text}");
    // A refresh run moves with its deployment.
    lyra.ok(&["state", "export", "webapp", "--file", "webapp.json"]);
    lyra.ok(&["state", "import", "webapp.json", "--state", "copy.db"]);
    let copied = lyra.ok_json(&["history", "webapp", "--state", "copy.db"]);
    // (The import is the newest run there.)
    assert_eq!(copied[1]["operation"], "refresh", "{copied:#}");
    assert_eq!(copied[1]["note"], history[0]["note"]);
    let state = lyra.state("webapp");
    let db_state = &state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == "db")
        .unwrap()["state"];
    assert_eq!(db_state["cpus"], 8, "the new actual state is recorded");
    assert!(
        lyra.resources("webapp").contains_key("frontends/1"),
        "a gone resource keeps its record"
    );

    // Only the gone resource still differs from the record.
    let run = lyra.run(&["drift", "webapp"]);
    run.expect_code(4);
    assert_eq!(
        run.stdout, "- frontends/1 (Foobernetes::Instance): gone\n1 of 5 resources drifted (1 gone)\n",
        "{run}"
    );

    // The next plan reverts the drift: the updates back, the gone resource made again.
    let plan = lyra.ok_json(&["plan", "webapp"]);
    let mut updated = steps_with_action(&plan, "update");
    updated.sort();
    assert!(
        updated.contains(&"db".to_owned()) && updated.contains(&"lb".to_owned()),
        "{plan:#}"
    );
    assert_eq!(
        step(&plan, "db")["changes"],
        serde_json::json!([{"attribute": "cpus", "path": "cpus", "old": 8, "new": 4, "known_after_apply": false, "forces_replace": false}])
    );
    assert_eq!(step(&plan, "lb")["changes"][0]["old"], "other", "{plan:#}");
    assert_eq!(steps_with_action(&plan, "create"), ["frontends/1"], "{plan:#}");

    lyra.ok(&["apply", "webapp"]);
    let run = lyra.run(&["drift", "webapp"]);
    run.expect_code(0);
    assert_eq!(run.stdout, "no drift: 5 resources match the state\n", "{run}");
}

#[test]
fn secrets_are_reported_changed_and_never_shown() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "vault",
        "parameters:\n  pw: Sensitive[String]\nsteps:\n  vm:\n    resource: Foobernetes::Instance\n    value:\n      location: eu1\n      image: db\n      cpus: 1\n      memory: 1G\n      config:\n        user: admin\n        password: $pw\n",
    );
    lyra.ok(&["apply", "vault", "--var", "pw=old-s3cret"]);
    let id = lyra.resources("vault")["vm"].clone();
    edit_cloud(&lyra, |cloud| {
        cloud["Instances"][&id]["Config"]["password"] = "n3w-s3cret".into();
    });
    let text = lyra.run(&["drift", "vault"]);
    text.expect_code(4);
    assert!(
        text.stdout.contains("    config: (sensitive) -> (sensitive)\n"),
        "{text}"
    );
    let json = lyra.run(&["drift", "vault", "-o", "json"]);
    json.expect_code(4);
    let refreshed = lyra.run(&["drift", "vault", "--refresh-state", "-o", "json"]);
    refreshed.expect_code(4);
    for doc in [json.json(), refreshed.json()] {
        let change = &doc["resources"][0]["changes"][0];
        assert_eq!(
            (change["path"].clone(), change["sensitive"].clone()),
            ("config".into(), true.into()),
            "{doc:#}"
        );
        assert_eq!(
            (change["recorded"].clone(), change["live"].clone()),
            ("(sensitive)".into(), "(sensitive)".into())
        );
    }
    let history = lyra.ok(&["history", "vault", "-o", "json"]).stdout;
    for shown in [
        &text.stdout,
        &text.stderr,
        &json.stdout,
        &json.stderr,
        &refreshed.stdout,
        &history,
    ] {
        assert!(!shown.contains("s3cret"), "a secret leaked: {shown}");
    }
    assert_eq!(lyra.run(&["drift", "vault"]).code, Some(0), "refreshed");
}

#[test]
fn a_cloud_that_cannot_be_read_fails_after_the_report() {
    let lyra = webapp();
    lyra.write("deployment.json", "{ not json");
    let run = lyra.run(&["drift", "webapp"]);
    run.expect_code(1);
    assert!(
        run.stdout.contains("! db (Foobernetes::Instance): could not be read: "),
        "{run}"
    );
    assert!(
        run.stdout.contains("0 of 5 resources drifted; 5 could not be read"),
        "{run}"
    );
    let doc = drift_doc(&lyra, &[], 1);
    assert_eq!(doc["outcome"], "failed");
    assert_eq!(doc["counts"]["failed"], 5);
}

#[test]
fn unknown_deployments_and_missing_states_are_errors_that_create_nothing() {
    let lyra = Lyra::new();
    let run = lyra.run(&["drift", "nosuch", "-o", "json"]);
    run.expect_code(1);
    assert_eq!(run.json()["error"]["kind"], "no_state", "{run}");
    assert!(!lyra.path(".lyra").exists(), "no state was created");

    lyra.write_workflow(
        "one",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    lyra.ok(&["apply", "one"]);
    let run = lyra.run(&["drift", "onee", "-o", "json"]);
    run.expect_code(1);
    let doc = run.json();
    assert_eq!(doc["error"]["kind"], "not_found", "{run}");
    assert_eq!(doc["error"]["did_you_mean"], serde_json::json!(["one"]), "{run}");
    assert!(schema_errors(&doc, "error").is_empty());
    let run = lyra.run(&["drift", "one"]);
    run.expect_code(0);
    assert_eq!(run.stdout, "no drift: 1 resource matches the state\n");
    let run = lyra.run(&["drift", "one", "--help"]);
    run.expect_code(0);
    assert!(run.stdout.contains("4    drift found"), "{run}");
}

/// `--refresh-state` writes, so it takes the lease (exit 3 while another run holds it); a
/// plain check does not, so it is never blocked.
#[test]
fn only_refreshing_takes_the_lease() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "slow",
        &sleeps_workflow(12, "10ms").replace(
            "create_duration: 10ms",
            "create_duration: 10ms\n      destroy_duration: 300ms",
        ),
    );
    lyra.ok(&["apply", "slow"]);
    let mut holder = lyra.spawn("holder", &["delete", "slow", "--concurrency", "1"]);
    let held = wait_until(Duration::from_secs(30), || {
        let run = lyra.run(&["state", "show", "slow", "-o", "json"]);
        run.code == Some(0) && !run.json()["lease"].is_null()
    });
    assert!(held, "the delete never took the lease");
    lyra.run(&["drift", "slow", "--refresh-state"])
        .expect_code(3)
        .expect_stderr(&["is running delete since"]);
    lyra.run(&["drift", "slow"]).expect_code(0);
    let status = holder.wait().expect("wait");
    assert!(status.success(), "{:?}", lyra.spawned_output("holder"));
}

/// On a Postgres state: reported, refreshed (a `refresh` run passes the schema's CHECK), clean.
#[test]
fn drift_on_postgres() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    lyra.write_workflow(
        "vm",
        "steps:\n  vm:\n    resource: Foobernetes::Instance\n    value: {location: eu1, image: db, cpus: 1, memory: 1G}\n",
    );
    lyra.ok(&["apply", "vm"]);
    let id = lyra.resources("vm")["vm"].clone();
    edit_cloud(&lyra, |cloud| cloud["Instances"][&id]["Memory"] = "2G".into());
    let run = lyra.run(&["drift", "vm", "--refresh-state"]);
    run.expect_code(4);
    assert!(run.stdout.contains("    memory: \"1G\" -> \"2G\"\n"), "{run}");
    assert_eq!(lyra.history("vm")[0]["operation"], "refresh");
    lyra.run(&["drift", "vm"]).expect_code(0);
}

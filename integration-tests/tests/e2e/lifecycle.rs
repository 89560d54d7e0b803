//! The resource lifecycle: create, update in place, replace, delete removed steps, heal
//! out-of-band deletes; plans that predict exactly that.

use integration_tests::{Lyra, Value, changed_attributes, cloud_ids, count, step, step_entries, steps_with_action};

const THREE_NULLS: &str = "\
returns: [outA, outB]
steps:
  a:
    returns:
      outA: output
    resource: Null::Resource
    value:
      input: hello
      triggers_replace: t1
  b:
    returns:
      outB: output
    resource: Null::Resource
    value:
      input: $outA
  c:
    resource: Null::Resource
    value:
      input: {name: c, size: 1}
";

/// A database instance and an app server that uses its id.
const TWO_INSTANCES: &str = "\
steps:
  database:
    returns:
      databaseID: instanceID
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: db
      cpus: 16
      memory: 64G
  app:
    returns:
      appID: instanceID
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: app
      config:
        databaseID: $databaseID
      cpus: 4
      memory: 8G
";

/// The recorded (actual) state of one resource.
#[track_caller]
fn resource_state(lyra: &Lyra, deployment: &str, step_id: &str) -> Value {
    let state = lyra.state(deployment);
    state["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["step"] == step_id))
        .map(|r| r["state"].clone())
        .unwrap_or_else(|| panic!("no resource {step_id} in {state:#}"))
}

#[test]
fn changing_one_attribute_updates_exactly_that_resource() {
    let lyra = Lyra::new();
    lyra.write_workflow("nulls", THREE_NULLS);
    let first = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(count(&first, "created"), 3, "{first:#}");
    assert_eq!(first["returns"], serde_json::json!({"outA": "hello", "outB": "hello"}));
    let before = lyra.resources("nulls");

    lyra.write_workflow("nulls", &THREE_NULLS.replace("size: 1", "size: 2"));
    let plan = lyra.ok_json(&["plan", "nulls"]);
    assert_eq!(steps_with_action(&plan, "update"), ["c"], "{plan:#}");
    assert_eq!(steps_with_action(&plan, "no-op"), ["a", "b"], "{plan:#}");
    let c = step(&plan, "c");
    assert_eq!(changed_attributes(c), ["input"], "{plan:#}");
    // Only the nested value that changed, as a path into the attribute.
    assert_eq!(c["changes"][0]["path"], "input.size", "{plan:#}");
    assert_eq!(c["changes"][0]["old"], 1);
    assert_eq!(c["changes"][0]["new"], 2);
    let text = lyra.ok(&["plan", "nulls"]).stdout;
    assert!(text.contains("~ input.size: 1 -> 2"), "{text}");
    assert_eq!(c["status"], "planned");
    assert_eq!(c["external_id"], before["c"].as_str());
    assert_eq!((count(&plan, "updated"), count(&plan, "unchanged")), (1, 2), "{plan:#}");
    // The plan changed nothing.
    assert_eq!(resource_state(&lyra, "nulls", "c")["input"]["size"], 1);

    let text = lyra.ok(&["plan", "nulls"]).stdout;
    assert!(text.contains("~ c (Null::Resource) will be updated in place"), "{text}");
    assert!(text.contains("input"), "{text}");
    assert!(
        text.contains("Plan: 0 to create, 1 to update, 0 to replace, 0 to delete, 2 unchanged."),
        "{text}"
    );

    let applied = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(steps_with_action(&applied, "update"), ["c"], "{applied:#}");
    assert_eq!(step(&applied, "c")["status"], "done");
    assert_eq!(
        (count(&applied, "updated"), count(&applied, "unchanged")),
        (1, 2),
        "{applied:#}"
    );
    assert_eq!(lyra.resources("nulls"), before, "an update keeps every external id");
    assert_eq!(
        resource_state(&lyra, "nulls", "c")["output"],
        serde_json::json!({"name": "c", "size": 2})
    );

    let again = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(count(&again, "unchanged"), 3, "{again:#}");
}

#[test]
fn changing_an_immutable_attribute_replaces_the_resource() {
    let lyra = Lyra::new();
    lyra.write_workflow("nulls", THREE_NULLS);
    lyra.ok(&["apply", "nulls"]);
    let before = lyra.resources("nulls");

    lyra.write_workflow(
        "nulls",
        &THREE_NULLS.replace("triggers_replace: t1", "triggers_replace: t2"),
    );
    let plan = lyra.ok_json(&["plan", "nulls"]);
    assert_eq!(steps_with_action(&plan, "replace"), ["a"], "{plan:#}");
    let a = step(&plan, "a");
    assert_eq!(changed_attributes(a), ["triggers_replace"], "{plan:#}");
    assert_eq!(a["changes"][0]["forces_replace"], true, "{plan:#}");
    assert_eq!(
        (&a["changes"][0]["old"], &a["changes"][0]["new"]),
        (&Value::from("t1"), &Value::from("t2"))
    );
    assert_eq!(step(&plan, "c")["action"], "no-op", "{plan:#}");
    let text = lyra.ok(&["plan", "nulls"]).stdout;
    assert!(text.contains("-/+ a (Null::Resource) will be replaced"), "{text}");
    assert!(text.contains("forces replacement"), "{text}");

    let applied = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(step(&applied, "a")["action"], "replace", "{applied:#}");
    assert_eq!(count(&applied, "replaced"), 1, "{applied:#}");
    let after = lyra.resources("nulls");
    assert_ne!(after["a"], before["a"], "a replacement gets a new external id");
    assert_eq!(step(&applied, "a")["external_id"], after["a"].as_str());
    assert_eq!(
        (&after["b"], &after["c"]),
        (&before["b"], &before["c"]),
        "the others are kept"
    );
    // Its value did not change, so its dependent converges without a change.
    assert_eq!(
        applied["returns"],
        serde_json::json!({"outA": "hello", "outB": "hello"})
    );
    let again = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(count(&again, "unchanged"), 3, "{again:#}");
}

#[test]
fn removing_a_step_deletes_its_resource() {
    let lyra = Lyra::new();
    lyra.write_workflow("nulls", THREE_NULLS);
    lyra.ok(&["apply", "nulls"]);
    let before = lyra.resources("nulls");

    let without_c = THREE_NULLS.split("  c:\n").next().expect("a prefix").to_owned();
    lyra.write_workflow("nulls", &without_c);
    let plan = lyra.ok_json(&["plan", "nulls"]);
    assert_eq!(steps_with_action(&plan, "delete"), ["c"], "{plan:#}");
    assert_eq!(step(&plan, "c")["external_id"], before["c"].as_str());
    assert_eq!((count(&plan, "deleted"), count(&plan, "unchanged")), (1, 2), "{plan:#}");
    assert_eq!(lyra.resources("nulls"), before, "a plan deletes nothing");
    let text = lyra.ok(&["plan", "nulls"]).stdout;
    assert!(text.contains("- c (Null::Resource) will be deleted"), "{text}");
    assert!(text.contains("1 to delete"), "{text}");

    let applied = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(steps_with_action(&applied, "delete"), ["c"], "{applied:#}");
    assert_eq!(step(&applied, "c")["status"], "done");
    let after = lyra.resources("nulls");
    assert_eq!(after.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!((&after["a"], &after["b"]), (&before["a"], &before["b"]));
    let history = lyra.history("nulls");
    assert_eq!(history[0]["counts"]["deleted"], 1, "{history:?}");
}

#[test]
fn foobernetes_update_keeps_the_id_and_replace_changes_it() {
    let lyra = Lyra::new();
    lyra.write_workflow("two", TWO_INSTANCES);
    lyra.ok(&["apply", "two"]);
    let ids = lyra.resources("two");
    let (db, app) = (ids["database"].clone(), ids["app"].clone());
    assert_eq!(lyra.cloud()["Instances"][&app]["Config"]["databaseID"], db.as_str());

    // A mutable attribute: updated in place.
    lyra.write_workflow("two", &TWO_INSTANCES.replace("cpus: 4", "cpus: 8"));
    let plan = lyra.ok_json(&["plan", "two"]);
    assert_eq!(steps_with_action(&plan, "update"), ["app"], "{plan:#}");
    assert_eq!(changed_attributes(step(&plan, "app")), ["cpus"], "{plan:#}");
    assert_eq!(step(&plan, "app")["changes"][0]["new"], 8);
    let applied = lyra.ok_json(&["apply", "two"]);
    assert_eq!(steps_with_action(&applied, "update"), ["app"], "{applied:#}");
    assert_eq!(lyra.resources("two"), ids);
    let cloud = lyra.cloud();
    assert_eq!(cloud["Instances"][&app]["Cpus"], 8, "{cloud:#}");
    assert_eq!(resource_state(&lyra, "two", "app")["cpus"], 8);

    // An immutable attribute of the database: replaced; its dependent follows the new id.
    lyra.write_workflow(
        "two",
        &TWO_INSTANCES
            .replace("cpus: 4", "cpus: 8")
            .replacen("location: eu1", "location: eu3", 1),
    );
    let plan = lyra.ok_json(&["plan", "two"]);
    assert_eq!(steps_with_action(&plan, "replace"), ["database"], "{plan:#}");
    let change = &step(&plan, "database")["changes"][0];
    assert_eq!(
        (&change["attribute"], &change["forces_replace"]),
        (&Value::from("location"), &Value::from(true))
    );
    let text = lyra.ok(&["plan", "two"]).stdout;
    assert!(
        text.contains("-/+ database (Foobernetes::Instance) will be replaced"),
        "{text}"
    );

    let applied = lyra.ok_json(&["apply", "two"]);
    assert_eq!(step(&applied, "database")["action"], "replace", "{applied:#}");
    let after = lyra.resources("two");
    assert_ne!(after["database"], db);
    assert_eq!(after["app"], app, "the app server is updated, not replaced");
    let cloud = lyra.cloud();
    let mut instances = cloud_ids(&cloud, "Instances");
    instances.sort();
    let mut expected = vec![after["database"].clone(), app.clone()];
    expected.sort();
    assert_eq!(
        instances, expected,
        "the old database is gone from the cloud: {cloud:#}"
    );
    assert_eq!(cloud["Instances"][&after["database"]]["Location"], "eu3");
    assert_eq!(
        cloud["Instances"][&app]["Config"]["databaseID"],
        after["database"].as_str()
    );
    let again = lyra.ok_json(&["apply", "two"]);
    assert_eq!(count(&again, "unchanged"), 2, "{again:#}");
}

#[test]
fn out_of_band_delete_is_healed() {
    let lyra = Lyra::new();
    lyra.write_workflow("two", TWO_INSTANCES);
    lyra.ok(&["apply", "two"]);
    let before = lyra.resources("two");
    // Someone deletes the app server behind Lyra's back.
    let mut cloud = lyra.cloud();
    cloud["Instances"]
        .as_object_mut()
        .expect("Instances")
        .remove(&before["app"]);
    lyra.write("deployment.json", serde_json::to_string_pretty(&cloud).expect("json"));

    let plan = lyra.ok_json(&["plan", "two"]);
    assert_eq!(steps_with_action(&plan, "create"), ["app"], "{plan:#}");
    let applied = lyra.ok_json(&["apply", "two"]);
    assert_eq!(steps_with_action(&applied, "create"), ["app"], "{applied:#}");
    let after = lyra.resources("two");
    assert_eq!(after["database"], before["database"]);
    // Made again (Foobernetes reuses the id its idempotency key names).
    let instances = cloud_ids(&lyra.cloud(), "Instances");
    assert_eq!(instances.len(), 2);
    assert!(instances.contains(&after["app"]), "{instances:?}");
}

#[test]
fn deployments_of_one_workflow_are_independent() {
    let lyra = Lyra::new();
    lyra.write_workflow("two", TWO_INSTANCES);
    lyra.ok(&["apply", "two"]);
    lyra.ok(&["apply", "two", "--name", "staging"]);
    let (prod, staging) = (lyra.resources("two"), lyra.resources("staging"));
    assert_eq!(prod.len(), 2);
    assert_eq!(staging.len(), 2);
    assert!(
        prod.values().all(|id| !staging.values().any(|s| s == id)),
        "{prod:?} {staging:?}"
    );
    assert_eq!(cloud_ids(&lyra.cloud(), "Instances").len(), 4);

    lyra.ok(&["delete", "staging"]);
    assert_eq!(
        lyra.resources("two"),
        prod,
        "deleting one deployment leaves the other alone"
    );
    let mut left = cloud_ids(&lyra.cloud(), "Instances");
    left.sort();
    let mut kept: Vec<String> = prod.values().cloned().collect();
    kept.sort();
    assert_eq!(left, kept);
    let again = lyra.ok_json(&["apply", "two"]);
    assert_eq!(count(&again, "unchanged"), 2, "{again:#}");
}

#[test]
fn shrinking_and_growing_a_collection() {
    let lyra = Lyra::new();
    let workflow = |n: u32| {
        format!(
            "returns: ids\nsteps:\n  items:\n    times: {n}\n    into: ids\n    step:\n      returns: output\n      resource: Null::Resource\n      value:\n        input: same\n"
        )
    };
    lyra.write_workflow("coll", &workflow(3));
    let first = lyra.ok_json(&["apply", "coll"]);
    assert_eq!(count(&first, "created"), 3, "{first:#}");
    assert_eq!(
        first["returns"]["ids"],
        serde_json::json!(["same", "same", "same"]),
        "{first:#}"
    );
    let before = lyra.resources("coll");
    assert_eq!(before.keys().collect::<Vec<_>>(), ["items/0", "items/1", "items/2"]);

    lyra.write_workflow("coll", &workflow(1));
    let plan = lyra.ok_json(&["plan", "coll"]);
    assert_eq!(steps_with_action(&plan, "delete"), ["items/1", "items/2"], "{plan:#}");
    let applied = lyra.ok_json(&["apply", "coll"]);
    assert_eq!(
        steps_with_action(&applied, "delete"),
        ["items/1", "items/2"],
        "{applied:#}"
    );
    assert_eq!(applied["returns"]["ids"], serde_json::json!(["same"]));
    let after = lyra.resources("coll");
    assert_eq!(after.keys().collect::<Vec<_>>(), ["items/0"]);
    assert_eq!(after["items/0"], before["items/0"]);

    lyra.write_workflow("coll", &workflow(2));
    let applied = lyra.ok_json(&["apply", "coll"]);
    assert_eq!(steps_with_action(&applied, "create"), ["items/1"], "{applied:#}");
    assert_eq!(count(&applied, "unchanged"), 1, "{applied:#}");
}

#[test]
fn delete_dry_run_deletes_nothing() {
    let lyra = Lyra::new();
    lyra.write_workflow("two", TWO_INSTANCES);
    lyra.ok(&["apply", "two"]);
    let before = lyra.resources("two");
    let cloud = lyra.read("deployment.json");
    let plan = lyra.ok_json(&["delete", "two", "--dry-run"]);
    assert_eq!(steps_with_action(&plan, "delete"), ["app", "database"], "{plan:#}");
    assert_eq!(count(&plan, "deleted"), 2, "{plan:#}");
    assert_eq!(lyra.resources("two"), before);
    assert_eq!(lyra.read("deployment.json"), cloud);

    // The real delete removes dependents before what they depend on.
    let report = lyra.ok_json(&["delete", "two"]);
    let order: Vec<&str> = integration_tests::steps(&report)
        .iter()
        .filter_map(|s| s["step"].as_str())
        .collect();
    assert_eq!(order, ["app", "database"], "{report:#}");
    assert!(lyra.resources("two").is_empty());
    assert!(cloud_ids(&lyra.cloud(), "Instances").is_empty());
    assert_eq!(step_entries(&report, "app").len(), 1);
}

//! Failure isolation: a failing step skips its dependents, independent branches finish, the
//! exit status is 1, and no resource of a failed or skipped step is deleted.

use integration_tests::{Lyra, count, resource_ids, step, steps};

/// Branch A: a sleep and a resource reading its return. Branch B: two resources, independent
/// of A. `DURATION` is replaced by the sleep's duration.
const TWO_BRANCHES: &str = "\
returns: [slept, b2out]
steps:
  sleeper:
    returns:
      slept: create_duration
    resource: Time::Sleep
    value:
      create_duration: DURATION
  after:
    resource: Null::Resource
    value:
      input: $slept
  b1:
    returns: {b1out: output}
    resource: Null::Resource
    value:
      input: one
  b2:
    returns: {b2out: output}
    resource: Null::Resource
    value:
      input: $b1out
";

fn branches(duration: &str) -> String {
    TWO_BRANCHES.replace("DURATION", duration)
}

#[track_caller]
fn assert_a_failed_b_done(report: &serde_json::Value) {
    assert_eq!(report["outcome"], "failed", "{report:#}");
    let sleeper = step(report, "sleeper");
    assert_eq!(sleeper["status"], "failed", "{report:#}");
    let error = sleeper["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("bogus") && error.contains("create_duration"),
        "the error says what is wrong: {error}"
    );
    assert!(
        error.contains("f.yaml:"),
        "the error names the step's location: {error}"
    );
    let after = step(report, "after");
    assert_eq!(after["status"], "skipped", "{report:#}");
    assert!(
        after["error"].as_str().unwrap_or_default().contains("sleeper"),
        "{report:#}"
    );
    for b in ["b1", "b2"] {
        assert_eq!(step(report, b)["status"], "done", "{report:#}");
    }
    assert_eq!(
        (count(report, "failed"), count(report, "skipped")),
        (1, 1),
        "{report:#}"
    );
}

#[test]
fn a_failing_branch_does_not_stop_an_independent_one() {
    let lyra = Lyra::new();
    lyra.write_workflow("f", &branches("bogus"));
    let run = lyra.run(&["apply", "f", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    assert_a_failed_b_done(&report);
    assert_eq!(count(&report, "created"), 2, "{report:#}");
    let ids = resource_ids(&lyra.state("f"));
    assert_eq!(ids.keys().collect::<Vec<_>>(), ["b1", "b2"], "only branch B exists");

    // The text output says the same on stderr, and exits 1.
    let text = lyra.run(&["apply", "f"]);
    text.expect_code(1)
        .expect_stderr(&["failed: sleeper", "skipped: after", "apply failed"]);

    let history = lyra.history("f");
    assert_eq!(history[0]["outcome"], "failed", "{history:?}");
    let changes = history[0]["changes"].as_array().expect("changes");
    assert!(
        changes.iter().any(|c| c["step"] == "sleeper" && c["error"].is_string()),
        "{history:?}"
    );

    // Fixed: everything converges.
    lyra.write_workflow("f", &branches("10ms"));
    let fixed = lyra.ok_json(&["apply", "f"]);
    assert_eq!(count(&fixed, "created"), 2, "{fixed:#}");
    assert_eq!(count(&fixed, "unchanged"), 2, "{fixed:#}");
    assert_eq!(fixed["returns"], serde_json::json!({"slept": "10ms", "b2out": "one"}));
    assert_eq!(resource_ids(&lyra.state("f")).get("b1"), ids.get("b1"));
    let again = lyra.ok_json(&["apply", "f"]);
    assert_eq!(count(&again, "unchanged"), 4, "{again:#}");
}

#[test]
fn failed_and_skipped_steps_keep_their_resources() {
    let lyra = Lyra::new();
    lyra.write_workflow("f", &branches("10ms"));
    lyra.ok(&["apply", "f"]);
    let before = resource_ids(&lyra.state("f"));
    assert_eq!(before.len(), 4);

    // Now the sleep fails (an update) and `after` is skipped: neither may be deleted.
    lyra.write_workflow("f", &branches("bogus").replace("input: one", "input: two"));
    let run = lyra.run(&["apply", "f", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    assert_a_failed_b_done(&report);
    assert_eq!(step(&report, "b1")["action"], "update", "{report:#}");
    assert_eq!(count(&report, "deleted"), 0, "{report:#}");
    assert!(steps(&report).iter().all(|s| s["action"] != "delete"), "{report:#}");
    assert_eq!(
        resource_ids(&lyra.state("f")),
        before,
        "every resource is kept, with its id"
    );

    // Fixed: converges, keeping the resources.
    lyra.write_workflow("f", &branches("20ms").replace("input: one", "input: two"));
    let fixed = lyra.ok_json(&["apply", "f"]);
    assert_eq!(count(&fixed, "created"), 0, "{fixed:#}");
    assert_eq!(count(&fixed, "deleted"), 0, "{fixed:#}");
    assert_eq!(resource_ids(&lyra.state("f")), before);
    let again = lyra.ok_json(&["apply", "f"]);
    assert_eq!(count(&again, "unchanged"), 4, "{again:#}");
}

#[test]
fn a_skipped_collection_keeps_its_members() {
    let lyra = Lyra::new();
    let workflow = |d: &str| {
        format!(
            "steps:\n  src:\n    returns: {{names: output}}\n    resource: Null::Resource\n    value:\n      input: [x, y, z]\n  gate:\n    returns: {{d: create_duration}}\n    resource: Time::Sleep\n    value:\n      create_duration: {d}\n  coll:\n    each: $names\n    as: n\n    step:\n      resource: Null::Resource\n      value:\n        input: $n\n        triggers_replace: $d\n"
        )
    };
    lyra.write_workflow("c", &workflow("1ms"));
    let first = lyra.ok_json(&["apply", "c"]);
    assert_eq!(count(&first, "created"), 5, "{first:#}");
    let before = resource_ids(&lyra.state("c"));

    lyra.write_workflow("c", &workflow("bogus"));
    let run = lyra.run(&["apply", "c", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    assert_eq!(step(&report, "coll")["status"], "skipped", "{report:#}");
    assert_eq!(count(&report, "deleted"), 0, "{report:#}");
    assert_eq!(
        resource_ids(&lyra.state("c")),
        before,
        "the members of a skipped collection are kept"
    );
}

/// A failed step's report should say what was attempted (`create` for a new resource,
/// `update` for an existing one, with its external id), not `no-op`: scripts and the history
/// read it.
#[test]
fn a_failed_step_reports_the_attempted_action() {
    let lyra = Lyra::new();
    lyra.write_workflow("f", &branches("bogus"));
    let report = lyra.run(&["apply", "f", "-o", "json"]).json();
    assert_eq!(step(&report, "sleeper")["action"], "create", "{report:#}");

    lyra.write_workflow("f", &branches("10ms"));
    lyra.ok(&["apply", "f"]);
    let id = resource_ids(&lyra.state("f"))["sleeper"].clone();
    lyra.write_workflow("f", &branches("bogus"));
    let report = lyra.run(&["apply", "f", "-o", "json"]).json();
    let sleeper = step(&report, "sleeper");
    assert_eq!(sleeper["action"], "update", "{report:#}");
    assert_eq!(sleeper["external_id"], id.as_str(), "{report:#}");
    let history = lyra.history("f");
    let change = history[0]["changes"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["step"] == "sleeper"));
    assert_eq!(
        change.map(|c| c["action"].clone()),
        Some("update".into()),
        "{history:?}"
    );
}

//! Deep objects (issue 9, finding F4): the API server stores a Workflow whose free-form fields
//! nest thousands of levels (up to its 10,000), and the controller must cope. Such a field
//! used to fail the controller's list of Workflows at `serde_json`'s 128 levels: the controller
//! exited at start, or stopped seeing every object. Now the object is Stalled with the field
//! path where it goes past Lyra's 64 levels, and the others reconcile.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Value, cluster_or_skip, wait_until};

/// kubectl reads at most 10,000 levels; the object, `spec` and the field are three.
const LEVELS: usize = 9_990;

/// A Workflow whose `spec.data.deep` is `LEVELS` maps `{a: {a: …}}`, as JSON (which is YAML).
fn deep_data(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"lyra.dev/v1alpha1","kind":"Workflow","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"workflowName":"simple","data":{{"deep":{}1{}}}}}}}"#,
        r#"{"a":"#.repeat(LEVELS),
        "}".repeat(LEVELS)
    )
}

/// An inline workflow whose one input is `LEVELS` lists deep.
fn deep_workflow(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"lyra.dev/v1alpha1","kind":"Workflow","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"workflow":{{"steps":{{"s":{{"resource":"Null::Resource","value":{{"input":{}1{}}}}}}}}}}}}}"#,
        "[".repeat(LEVELS),
        "]".repeat(LEVELS)
    )
}

/// The message of the object's `Stalled` condition (without `-o json`: kubectl prints a
/// deep object indented, hundreds of megabytes).
fn stalled_message(cluster: &Cluster, name: &str) -> String {
    let out = cluster.kubectl.run(&[
        "get",
        "wf",
        name,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Stalled")].message}"#,
    ]);
    if out.success { out.stdout } else { String::new() }
}

#[test]
fn deep_objects_are_stalled_by_name_and_the_others_reconcile() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow(
        "simple",
        "steps:\n  s:\n    resource: Null::Resource\n    value: {input: 1}\n",
    );
    // Stored before the controller starts: its first list reads them.
    cluster.apply(&deep_data("deep-data"));
    cluster.apply(&deep_workflow("deep-workflow"));
    let mut controller = cluster.controller("c1", &[]);
    // And one that arrives through the watch.
    cluster.apply(&deep_data("deep-later"));

    let wait_stalled = |name: &str| {
        let mut message = String::new();
        let stalled = wait_until(Duration::from_secs(60), || {
            message = stalled_message(&cluster, name);
            !message.is_empty()
        });
        assert!(stalled, "wf/{name} was never Stalled:\n{}", cluster.log("c1"));
        message
    };
    let path = format!("spec.data.deep{}", ".a".repeat(63));
    for name in ["deep-data", "deep-later"] {
        let m = wait_stalled(name);
        assert!(
            m.starts_with(&format!("{path}: spec.data nests more than 64 levels")),
            "{name}: {m}"
        );
    }
    let m = wait_stalled("deep-workflow");
    assert!(
        m.starts_with("spec.workflow.steps.s.value.input[0][0]")
            && m.contains("spec.workflow nests more than 64 levels")
            && m.len() < 400,
        "{m}"
    );
    let phase = cluster
        .kubectl
        .ok(&["get", "wf", "deep-data", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Failed");

    // The controller is up, and a following normal Workflow gets applied.
    assert!(controller.running(), "{}", cluster.log("c1"));
    cluster.apply(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: normal\n  namespace: default\nspec:\n  workflowName: simple\n",
    );
    cluster.wait_for("normal", "condition=Ready", "60s");
    let wf: Value = cluster.workflow("normal");
    assert_eq!(wf["status"]["phase"], "Ready", "{wf:#}");

    // Deleting a deep object works (nothing of it was applied).
    cluster.kubectl.ok(&[
        "delete",
        "wf",
        "deep-data",
        "deep-workflow",
        "deep-later",
        "--timeout=60s",
    ]);
    let left = cluster.kubectl.ok(&["get", "wf", "-o", "name"]);
    assert_eq!(left.trim(), "workflow.lyra.dev/normal");
    assert!(controller.running(), "{}", cluster.log("c1"));
}

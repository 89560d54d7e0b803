//! Problems in an inline workflow (`spec.workflow`) are reported at their field path in the
//! object, and keys kubectl turned into booleans (YAML 1.1 `y:`, `no:`...) are pointed out
//! (issue 9, item 15). Through the real kubectl, which does that conversion.

use std::time::Duration;

use integration_tests::{Value, cluster_or_skip};

fn stalled_message(wf: &Value) -> String {
    wf["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Stalled" && c["status"] == "True"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn inline_workflow_problems_name_the_field_and_yaml_booleans() {
    let cluster = cluster_or_skip!();
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(
        "\
apiVersion: lyra.dev/v1alpha1
kind: Workflow
metadata:
  name: unknown-ref
  namespace: default
spec:
  workflow:
    steps:
      web:
        resource: Null::Resource
        value:
          input:
            port: $nosuch
",
    );
    // `y:` is a YAML 1.1 boolean to kubectl: the object says `"true":`.
    cluster.apply(
        "\
apiVersion: lyra.dev/v1alpha1
kind: Workflow
metadata:
  name: yaml-boolean
  namespace: default
spec:
  workflow:
    steps:
      web:
        resource: Null::Resource
        value:
          input: 1
        y: 2
",
    );
    let wf = cluster.workflow("yaml-boolean");
    assert_eq!(
        wf["spec"]["workflow"]["steps"]["web"]["true"], 2,
        "kubectl converted the key: {wf:#}"
    );

    let stalled = |name: &str| {
        let wf = cluster.wait_until_status(name, Duration::from_secs(60), |wf| !stalled_message(wf).is_empty());
        stalled_message(&wf)
    };
    let m = stalled("unknown-ref");
    assert!(
        m.starts_with("spec.workflow.steps.web.value.input.port: ")
            && m.contains("$nosuch")
            // What to fix, as the CLI says it (issue 9 F7).
            && m.contains("(help: add a parameter 'nosuch' or a step that returns 'nosuch')"),
        "{m}"
    );
    let m = stalled("yaml-boolean");
    assert!(
        m.starts_with("spec.workflow.steps.web.true: unknown key 'true'")
            && m.contains("probably an unquoted y, yes or on in the manifest"),
        "{m}"
    );
    // A step that fails when run: its error names the step's field too.
    cluster.apply(
        "\
apiVersion: lyra.dev/v1alpha1
kind: Workflow
metadata:
  name: failing-step
  namespace: default
spec:
  workflow:
    steps:
      wait:
        resource: Time::Sleep
        value:
          create_duration: soon
",
    );
    let wf = cluster.wait_until_status("failing-step", Duration::from_secs(60), |wf| {
        wf["status"]["steps"][0]["lastError"].is_string()
    });
    let error = wf["status"]["steps"][0]["lastError"].as_str().unwrap_or_default();
    assert!(error.starts_with("spec.workflow.steps.wait: Time::Sleep: "), "{wf:#}");
    // `kubectl get` shows where, too.
    let table = cluster.kubectl.ok(&["get", "wf", "unknown-ref"]);
    assert!(table.contains("spec.workflow.steps.web.value.input.port"), "{table}");
}

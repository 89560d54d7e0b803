//! The controller's Events as `kubectl` shows them: each describes its own run, repeats of
//! the same note form a series, and objects with names as long as names may be get events
//! too (issue 9, item 14).

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Value, cluster_or_skip};

const GREETER: &str = "\
parameters:
  greeting: {type: String, lookup: greeting}
steps:
  first:
    returns: {firstOut: output}
    resource: Null::Resource
    value: {input: $greeting}
  second:
    resource: Null::Resource
    value: {input: $firstOut}
";

fn object(name: &str, greeting: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflowName: greeter\n  data:\n    greeting: {greeting}\n"
    )
}

/// The core `v1` Events about `name`, oldest first, as `kubectl get events` lists them.
fn events_about(cluster: &Cluster, name: &str) -> Vec<Value> {
    let text = cluster.kubectl.ok(&["get", "events", "-n", "default", "-o", "json"]);
    let list: Value = serde_json::from_str(&text).expect("kubectl printed JSON");
    let mut events: Vec<Value> = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .collect();
    events.sort_by_key(|e| e["eventTime"].as_str().unwrap_or_default().to_owned());
    events
}

fn notes(events: &[Value], reason: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn events_describe_their_own_run_even_for_the_longest_names() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("greeter", GREETER);
    // A replica name (`--identity`, the pod name) longer than an event's reportingInstance
    // may be (128).
    let identity = format!("lyra-controller-{}", "p".repeat(150));
    let _controller = cluster.controller(&identity, &[]);
    // A DNS subdomain as long as object names may be: 253 characters.
    let label = "l".repeat(63);
    let long = format!("{label}.{label}.{label}.{}", "e".repeat(61));
    assert_eq!(long.len(), 253);
    for name in ["short", long.as_str()] {
        cluster.apply(&object(name, "hi"));
        cluster.wait_for(name, "condition=Ready", "90s");
        cluster.apply(&object(name, "bye"));
        let wf = cluster.wait_until_status(name, Duration::from_secs(90), |wf| {
            wf["status"]["observedGeneration"] == 2 && wf["status"]["phase"] == "Ready"
        });
        let changes = wf["status"]["lastRun"]["changes"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(changes, "updated 2", "{wf:#}");

        let events = events_about(&cluster, name);
        let applied = notes(&events, "Applied");
        assert_eq!(
            applied,
            ["applied: created 2", &format!("applied: {changes}")],
            "{name}: one Applied event per run, each with its own summary: {events:#?}"
        );
        let described = cluster.kubectl.ok(&["describe", "wf", name]);
        assert!(described.contains("applied: updated 2"), "{described}");
        for e in &events {
            let event_name = e["metadata"]["name"].as_str().unwrap_or_default();
            assert!(event_name.len() <= 253, "{event_name}");
            let instance = e["reportingInstance"].as_str().unwrap_or_default();
            assert!(identity.starts_with(instance) && instance.len() == 128, "{instance}");
        }
    }
    // The same note again is one more of the same event, not a new one.
    for at in ["1", "2"] {
        cluster.kubectl.ok(&[
            "annotate",
            "--overwrite",
            "wf",
            "short",
            &format!("lyra.dev/reconcile-requested-at={at}"),
        ]);
        cluster.wait_until_status("short", Duration::from_secs(60), |wf| {
            wf["status"]["lastHandledReconcileAt"] == at
        });
    }
    let events = events_about(&cluster, "short");
    let no_changes: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "Applied" && e["message"] == "applied: no changes")
        .collect();
    assert_eq!(no_changes.len(), 1, "{events:#?}");
    assert_eq!(no_changes[0]["series"]["count"], 2, "{events:#?}");
    let log = cluster.log(&identity);
    assert!(!log.contains("could not publish an event"), "{log}");
}

//! `driftPolicy` through the real `kubectl` and `lyra-controller`: an instance changed by hand
//! in the Foobernetes cloud is reported (a `Drifted` condition in `kubectl get`/`describe`, an
//! event, the metric) and left alone under `Report`, and put back once the policy is
//! `Correct` (issue 15, "Drift").

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Value, cluster_or_skip};

const VM: &str = "\
steps:
  vm:
    resource: Foobernetes::Instance
    value: {location: eu1, image: x, cpus: 1, memory: 1G}
";

fn object(policy: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: watched\n  namespace: default\n\
         spec:\n  workflowName: vm\n  refreshInterval: 1s\n  driftPolicy: {policy}\n"
    )
}

fn drifted(wf: &Value) -> Option<&str> {
    wf["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Drifted")
        .and_then(|c| c["status"].as_str())
}

fn cpus(cluster: &Cluster) -> Vec<i64> {
    let cloud = cluster.cloud();
    cloud["Instances"]
        .as_object()
        .map(|o| o.values().filter_map(|i| i["Cpus"].as_i64()).collect())
        .unwrap_or_default()
}

/// Someone resizes the instance behind Lyra's back.
fn resize(cluster: &Cluster, to: i64) {
    let mut cloud = cluster.cloud();
    for i in cloud["Instances"].as_object_mut().expect("instances").values_mut() {
        i["Cpus"] = to.into();
    }
    cluster.lyra.write("deployment.json", cloud.to_string());
}

#[test]
fn report_shows_drift_and_changes_nothing_until_correct() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("vm", VM);
    let controller = cluster.controller("c1", &[]);
    cluster.apply(&object("Report"));
    cluster.wait_for("watched", "condition=Ready", "90s");
    cluster.wait_until_status("watched", Duration::from_secs(30), |wf| drifted(wf) == Some("False"));
    assert_eq!(cpus(&cluster), [1]);

    resize(&cluster, 4);
    let wf = cluster.wait_until_status("watched", Duration::from_secs(30), |wf| drifted(wf) == Some("True"));
    let row = cluster.kubectl.ok(&["get", "wf", "watched"]);
    assert!(row.contains("DRIFTED"), "{row}");
    let line = row
        .lines()
        .find(|l| l.starts_with("watched"))
        .expect("the object's row");
    assert!(line.contains("True"), "{row}");
    let described = cluster.kubectl.ok(&["describe", "wf", "watched"]);
    assert!(described.contains("vm (Foobernetes::Instance): cpus"), "{described}");
    assert!(described.contains("Drifted"), "{described}");
    assert_eq!(wf["status"]["phase"], "Ready", "{wf:#}");
    // Refreshes go on, and change nothing.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cpus(&cluster), [4], "Report leaves the resource as it is");
    assert_eq!(controller.metric("lyra_drifted_resources"), 1.0);
    let events = cluster
        .kubectl
        .ok(&["get", "events", "--field-selector", "involvedObject.name=watched"]);
    assert!(events.contains("Drifted"), "{events}");

    // The user asks for it: the policy becomes Correct, and the drift is corrected.
    cluster.apply(&object("Correct"));
    let ok = integration_tests::wait_until(Duration::from_secs(60), || cpus(&cluster) == [1]);
    assert!(ok, "corrected: {:#}", cluster.cloud());
    let wf = cluster.wait_until_status("watched", Duration::from_secs(30), |wf| drifted(wf) == Some("False"));
    assert_eq!(wf["status"]["phase"], "Ready", "{wf:#}");
    assert_eq!(controller.metric("lyra_drifted_resources"), 0.0);
}

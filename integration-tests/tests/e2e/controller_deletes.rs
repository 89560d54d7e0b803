//! Deleting Workflow objects through kubectl: one delete run per deletion, and a finalizer
//! removal that finds the object already gone is not a warning (issue 9, item 12).

use std::time::Duration;

use integration_tests::cluster_or_skip;

const PAIR: &str = "\
steps:
  first:
    returns: {firstOut: output}
    resource: Null::Resource
    value: {input: hello}
  second:
    resource: Null::Resource
    value: {input: $firstOut}
";

fn object(name: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflowName: pair\n"
    )
}

#[test]
fn every_deletion_runs_one_delete_and_warns_about_nothing() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("pair", PAIR);
    let controller = cluster.controller("c1", &[]);
    let names: Vec<String> = (0..16).map(|i| format!("del-{i:02}")).collect();
    let manifest: Vec<String> = names.iter().map(|n| object(n)).collect();
    cluster.apply(&manifest.join("---\n"));
    for name in &names {
        cluster.wait_for(name, "condition=Ready", "90s");
    }
    // kubectl waits until every object is gone, i.e. until every finalizer was removed.
    cluster
        .kubectl
        .ok(&["delete", "wf", "--all", "-n", "default", "--timeout=90s"]);
    // A second cleanup would come from a reconcile queued before the finalizer went: give
    // those time to run (and to be counted) before looking.
    let settled = integration_tests::wait_until(Duration::from_secs(30), || {
        let before = controller.metric("lyra_reconciles_total");
        std::thread::sleep(Duration::from_secs(2));
        controller.metric("lyra_reconciles_total") == before
    });
    assert!(settled, "the controller kept reconciling deleted objects");

    for name in &names {
        let history = cluster.lyra.history(&format!("k8s/default/{name}"));
        let deletes = history.iter().filter(|r| r["operation"] == "delete").count();
        let applies = history.iter().filter(|r| r["operation"] == "apply").count();
        assert_eq!(
            (applies, deletes),
            (1, 1),
            "{name}: one apply and one delete run: {history:#?}\n{}",
            cluster.log("c1")
        );
    }
    let log = cluster.log("c1");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .collect();
    assert!(warnings.is_empty(), "no warnings: {warnings:#?}");
    assert!(!log.contains("failed to remove finalizer"), "{log}");
}

//! A controller killed mid-apply: its successor waits for the dead one's state lease to
//! expire, not for an exponential backoff, and says whose lease it waits for and until when
//! (issue 9, item 13).

use std::time::{Duration, Instant};

use integration_tests::{cloud_ids, cluster_or_skip, sleepy_fleet_workflow, wait_until};

const TTL_SECS: u64 = 10;

#[test]
fn a_restarted_controller_resumes_when_the_dead_ones_lease_expires() {
    let cluster = cluster_or_skip!();
    // Four 500 ms sleeps, two at a time, each followed by an instance.
    cluster.lyra.write_workflow("slow", &sleepy_fleet_workflow(4, "500ms"));
    let ttl = format!("{TTL_SECS}s");
    let args = ["--step-concurrency", "2", "--lease-ttl", ttl.as_str()];
    let mut first = cluster.controller("c1", &args);
    cluster.apply(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: slow\n  namespace: default\nspec:\n  workflowName: slow\n",
    );
    let progressed = wait_until(Duration::from_secs(60), || {
        let run = cluster.lyra.run(&["state", "show", "k8s/default/slow", "-o", "json"]);
        run.code == Some(0) && run.json()["resources"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert!(progressed, "{}", cluster.log("c1"));
    first.kill();

    let restarted = Instant::now();
    let _second = cluster.controller("c2", &args);
    // While it waits, the status names the dead replica's lease and its expiry.
    let waiting = cluster.wait_until_status("slow", Duration::from_secs(30), |wf| {
        wf["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Reconciling" && c["reason"] == "Locked"))
    });
    assert_eq!(
        waiting["status"]["leaseHolder"], "controller/default/slow@c1",
        "{waiting:#}"
    );
    let message = waiting["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("controller/default/slow@c1 is running apply since") && message.contains("lease expires"),
        "{waiting:#}"
    );

    cluster.wait_for("slow", "condition=Ready", "120s");
    let took = restarted.elapsed();
    // The acceptance bar: Ready within the lease TTL + 5 s of the restart.
    assert!(
        took < Duration::from_secs(TTL_SECS + 5),
        "Ready {took:?} after the restart (lease TTL {TTL_SECS}s):\n{}",
        cluster.log("c2")
    );
    eprintln!("Ready {took:?} after the restart, lease TTL {TTL_SECS}s");
    assert_eq!(
        cloud_ids(&cluster.cloud(), "Instances").len(),
        4,
        "no duplicates after the restart"
    );
}

/// A CLI run holding the deployment's lease: the controller waits, naming it, and runs as
/// soon as the CLI is done (it polls; it does not wait out the CLI's lease).
#[test]
fn a_cli_run_holding_the_lease_is_named_and_waited_for() {
    let cluster = cluster_or_skip!();
    cluster
        .lyra
        .write_workflow("nap", &integration_tests::sleeps_workflow(1, "4s"));
    let mut cli = cluster.lyra.spawn(
        "cli",
        &["apply", "nap", "--name", "k8s/default/nap", "--lease-ttl", "5m"],
    );
    let held = wait_until(Duration::from_secs(30), || {
        let run = cluster.lyra.run(&["state", "show", "k8s/default/nap", "-o", "json"]);
        run.code == Some(0) && run.json()["lease"].is_object()
    });
    assert!(held, "the CLI took the lease: {:?}", cluster.lyra.spawned_output("cli"));
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: nap\n  namespace: default\nspec:\n  workflowName: nap\n",
    );
    let waiting = cluster.wait_until_status("nap", Duration::from_secs(30), |wf| {
        wf["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Reconciling" && c["reason"] == "Locked"))
    });
    let holder = waiting["status"]["leaseHolder"].as_str().unwrap_or_default();
    assert!(
        !holder.is_empty() && !holder.starts_with("controller/"),
        "the CLI's user@host: {waiting:#}"
    );
    let status = cli.wait().expect("the CLI run ends");
    assert!(status.success(), "{:?}", cluster.lyra.spawned_output("cli"));
    // Its lease lasted 5 minutes; the controller does not wait for that.
    cluster.wait_for("nap", "condition=Ready", "60s");
}

//! Crashes and interrupts: progress is recorded after every step, so a killed run loses
//! nothing and the next apply converges; Ctrl-C stops cleanly with exit 130.

use std::collections::BTreeSet;
use std::process::Child;
use std::time::Duration;

use integration_tests::{Lyra, count, note_contains, sleeps_workflow, steps, wait_for_lease, wait_until};

/// How many resources the state records as made for `deployment` right now (not counting
/// creates in flight, recorded as pending); `None` while it cannot be read (a concurrent
/// writer may hold it briefly).
fn recorded(lyra: &Lyra, deployment: &str) -> Option<usize> {
    let run = lyra.run(&["state", "show", deployment, "-o", "json"]);
    if run.code != Some(0) {
        return None;
    }
    run.json()["resources"]
        .as_array()
        .map(|rs| rs.iter().filter(|r| r["pending"] != true).count())
}

/// Waits until the running apply has recorded at least `n` resources.
#[track_caller]
fn wait_for_progress(lyra: &Lyra, child: &mut Child, deployment: &str, n: usize) {
    let started = wait_until(Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the apply ended before it was interrupted: {status:?} {:?}",
                lyra.spawned_output("apply")
            );
        }
        recorded(lyra, deployment).is_some_and(|k| k >= n)
    });
    assert!(started, "the apply recorded fewer than {n} resources within 60s");
}

/// SIGKILLs the running apply once it has recorded `at_least` of its `n` resources, and
/// returns how many the state holds then (fewer than `n`: it was killed mid-run).
#[track_caller]
fn kill_mid_run(lyra: &Lyra, mut child: Child, deployment: &str, at_least: usize, n: usize) -> usize {
    wait_for_progress(lyra, &mut child, deployment, at_least);
    child.kill().expect("SIGKILL the apply");
    let status = child.wait().expect("wait");
    {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }
    let at_kill = recorded(lyra, deployment).expect("the state is readable after a crash");
    assert!(
        (at_least..n).contains(&at_kill),
        "killed mid-run, yet {at_kill} of {n} are recorded"
    );
    at_kill
}

#[test]
fn sigkill_mid_apply_loses_nothing() {
    const N: usize = 200;
    let lyra = Lyra::new();
    lyra.write_workflow("crash", &sleeps_workflow(N, "250ms"));
    // 200 steps of 250ms, 20 at a time: about 2.5s. Killed after the first waves.
    // The state file exists before the poller and the apply open it at once (see
    // sharing::concurrent_first_use_of_a_state_file).
    lyra.init_state();
    // The default lease (30 s): the resumed apply does not wait for it, as the killed run
    // has ended on this machine.
    let child = lyra.spawn("apply", &["apply", "crash", "--concurrency", "20", "-o", "json"]);
    let at_kill = kill_mid_run(&lyra, child, "crash", 20, N);
    // The killed run is in the history, unfinished.
    let history = lyra.history("crash");
    assert_eq!(history.len(), 1, "{history:?}");
    assert!(
        history[0]["outcome"].is_null(),
        "a killed run has no outcome: {history:?}"
    );

    let resumed = lyra.ok_json(&["apply", "crash", "--concurrency", "20"]);
    assert_eq!(resumed["outcome"], "succeeded", "{resumed:#}");
    assert_eq!(
        count(&resumed, "unchanged") as usize,
        at_kill,
        "what was recorded is kept: {resumed:#}"
    );
    assert_eq!(
        count(&resumed, "created") as usize,
        N - at_kill,
        "the rest is created: {resumed:#}"
    );

    let state = lyra.state("crash");
    let resources = state["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), N);
    let step_ids: BTreeSet<&str> = resources.iter().filter_map(|r| r["step"].as_str()).collect();
    let external_ids: BTreeSet<&str> = resources.iter().filter_map(|r| r["external_id"].as_str()).collect();
    assert_eq!(step_ids.len(), N, "200 distinct steps");
    assert_eq!(external_ids.len(), N, "200 distinct external ids");
    let expected: BTreeSet<String> = (0..N).map(|i| format!("s{i:03}")).collect();
    assert_eq!(
        step_ids.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>(),
        expected
    );

    let third = lyra.ok_json(&["apply", "crash", "--concurrency", "20"]);
    assert_eq!(count(&third, "unchanged") as usize, N, "{third:#}");
    assert_eq!(count(&third, "created"), 0, "{third:#}");
    // The killed run, the takeover of its lease, the resumed run, this one.
    let history = lyra.history("crash");
    assert_eq!(history.len(), 4, "{history:#?}");
    assert_eq!(history[0]["outcome"], "succeeded");
    assert_eq!(history[2]["operation"], "unlock", "{history:#?}");
    assert!(
        note_contains(&history[2], "took over the lease of a process that ended"),
        "{history:#?}"
    );
}

/// As above with thousands of independent steps: their records are written in crowds, which
/// the state's committing thread takes while the run goes on. Killed in the middle, the file
/// is whole, and the next apply keeps every record it finds and creates only the rest.
#[test]
fn sigkill_mid_crowded_apply_loses_nothing() {
    const N: usize = 12_000;
    let lyra = Lyra::new();
    let mut workflow = String::from("steps:\n");
    for i in 0..N {
        workflow.push_str(&format!(
            "  s{i:05}:\n    resource: Null::Resource\n    value:\n      input: {i}\n"
        ));
    }
    lyra.write_workflow("crowd", &workflow);
    lyra.init_state();
    let child = lyra.spawn("apply", &["apply", "crowd", "--lease-ttl", "1s", "-o", "json"]);
    let at_kill = kill_mid_run(&lyra, child, "crowd", 1, N);

    let resumed = lyra.ok_json(&["apply", "crowd", "--lock-timeout", "30s"]);
    assert_eq!(resumed["outcome"], "succeeded");
    assert_eq!(
        count(&resumed, "unchanged") as usize,
        at_kill,
        "what was recorded is kept"
    );
    assert_eq!(count(&resumed, "created") as usize, N - at_kill, "the rest is created");
    let state = lyra.state("crowd");
    let step_ids: BTreeSet<&str> = state["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter(|r| r["pending"] != true)
        .filter_map(|r| r["step"].as_str())
        .collect();
    assert_eq!(step_ids.len(), N, "every step recorded once");
}

/// Sends SIGINT (what Ctrl-C sends) to a child.
fn interrupt(child: &Child) {
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -INT failed");
}

#[test]
fn sigint_cancels_records_and_converges() {
    const N: usize = 60;
    let lyra = Lyra::new();
    lyra.write_workflow("int", &sleeps_workflow(N, "300ms"));
    // The state file exists before the poller and the apply open it at once (see
    // sharing::concurrent_first_use_of_a_state_file).
    lyra.init_state();
    let mut child = lyra.spawn("apply", &["apply", "int", "--concurrency", "10", "-o", "json"]);
    wait_for_progress(&lyra, &mut child, "int", 10);
    interrupt(&child);
    let status = child.wait().expect("wait");
    let (stdout, stderr) = lyra.spawned_output("apply");
    assert_eq!(status.code(), Some(130), "Ctrl-C exits 130\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("the report is still printed as JSON");
    assert_eq!(report["outcome"], "cancelled", "{report:#}");

    // Everything the report says was created is recorded.
    let created = count(&report, "created") as usize;
    let state = lyra.state("int");
    assert_eq!(state["resources"].as_array().map(Vec::len), Some(created), "{report:#}");
    let history = lyra.history("int");
    assert_eq!(history[0]["outcome"], "cancelled", "{history:?}");

    let resumed = lyra.ok_json(&["apply", "int", "--concurrency", "30"]);
    assert_eq!(count(&resumed, "created") as usize, N - created, "{resumed:#}");
    assert_eq!(lyra.resources("int").len(), N);
}

/// Ctrl-C while an apply still reads its workflow, holding the lease it took early (the state
/// exists and the lease was free): exit 130 before anything runs, the lease given back, no run
/// recorded. The workflow is large so that reading it outlasts noticing the lease.
#[test]
fn sigint_while_the_workflow_is_read_changes_nothing() {
    let lyra = Lyra::new();
    lyra.write_workflow("big", &sleeps_workflow(1, "1ms"));
    lyra.ok(&["apply", "big"]);
    let runs = lyra.history("big").len();
    lyra.write_workflow("big", &sleeps_workflow(50_000, "1ms"));
    let mut child = lyra.spawn("apply", &["apply", "big", "-o", "json"]);
    wait_for_lease(&lyra, "big");
    interrupt(&child);
    let status = child.wait().expect("wait");
    let (stdout, stderr) = lyra.spawned_output("apply");
    assert_eq!(status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted before the apply started"), "{stderr}");
    let error: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(error["error"]["kind"], "interrupted", "{error:#}");
    let state = lyra.state("big");
    assert!(state["lease"].is_null(), "given back: {state:#}");
    assert_eq!(state["resources"].as_array().map(Vec::len), Some(1), "nothing applied");
    assert_eq!(lyra.history("big").len(), runs, "no run recorded");
}

/// After Ctrl-C, steps that have not started must not start ("finish running steps,
/// schedule no more"). Independent steps waiting for a concurrency slot are started anyway.
#[test]
fn sigint_stops_starting_queued_steps() {
    const N: usize = 60;
    let lyra = Lyra::new();
    lyra.write_workflow("int", &sleeps_workflow(N, "300ms"));
    // The state file exists before the poller and the apply open it at once (see
    // sharing::concurrent_first_use_of_a_state_file).
    lyra.init_state();
    let mut child = lyra.spawn("apply", &["apply", "int", "--concurrency", "10", "-o", "json"]);
    wait_for_progress(&lyra, &mut child, "int", 10);
    interrupt(&child);
    child.wait().expect("wait");
    let (stdout, _) = lyra.spawned_output("apply");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let created = count(&report, "created") as usize;
    // At most the 10 recorded, the 10 running and a wave in flight when the signal arrived.
    assert!(created < N, "all {N} steps ran after Ctrl-C: {report:#}");
    assert!(count(&report, "skipped") > 0, "{report:#}");
    let cancelled = steps(&report)
        .iter()
        .filter(|s| s["status"] == "skipped" && s["error"].as_str().is_some_and(|e| e.contains("cancelled")))
        .count();
    assert_eq!(cancelled + created, N, "{report:#}");
}

//! A second Ctrl-C (or SIGTERM) aborts at once, and releases the deployment's lease first: the
//! next run is admitted straight away (not refused for the lease's 30 s), resolves the
//! `pending` records the aborted run left, and converges. On SQLite and Postgres, for apply
//! and delete.

use std::process::Child;
use std::time::Duration;

use integration_tests::{Lyra, count, pg_or_skip, sleeps_workflow, wait_until};

const N: usize = 12;

/// Sends `signal` (`INT`, `TERM`) to a child.
fn send(child: &Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} failed");
}

/// Waits until the spawned run's stderr says `what`.
#[track_caller]
fn wait_for_stderr(lyra: &Lyra, child: &mut Child, tag: &str, what: &str) {
    let seen = wait_until(Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{tag} ended early: {status:?} {:?}", lyra.spawned_output(tag));
        }
        lyra.spawned_output(tag).1.contains(what)
    });
    assert!(seen, "{tag} never printed {what:?}: {:?}", lyra.spawned_output(tag));
}

/// Signals a running command twice (the second once the first was taken in) and checks it
/// aborted with 130, released its lease and said so, printing one JSON error document.
fn abort_twice(lyra: &Lyra, mut child: Child, tag: &str, signal: &str, deployment: &str) {
    // `-v` prints a line per step as it starts: steps are in flight now.
    wait_for_stderr(lyra, &mut child, tag, "…");
    send(&child, signal);
    wait_for_stderr(lyra, &mut child, tag, "interrupted");
    send(&child, signal);
    let status = child.wait().expect("wait");
    let (stdout, stderr) = lyra.spawned_output(tag);
    assert_eq!(status.code(), Some(130), "aborted runs exit 130\n{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains(&format!("released the lease on '{deployment}'")),
        "{stderr}"
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document on stdout");
    assert_eq!(doc["error"]["kind"], "interrupted", "{doc:#}");
    assert_eq!(doc["error"]["exit_code"], 130, "{doc:#}");
}

fn pending(lyra: &Lyra, deployment: &str) -> usize {
    lyra.state(deployment)["resources"]
        .as_array()
        .map_or(0, |rs| rs.iter().filter(|r| r["pending"] == true).count())
}

fn second_signal_during_apply(lyra: &Lyra, signal: &str) {
    lyra.write_workflow("slow", &sleeps_workflow(N, "3s"));
    lyra.init_state();
    let child = lyra.spawn("apply", &["apply", "slow", "--concurrency", "4", "-v", "-o", "json"]);
    abort_twice(lyra, child, "apply", signal, "slow");
    assert!(lyra.state("slow")["lease"].is_null(), "the lease is gone");
    // The creates in flight were abandoned: recorded as intents.
    assert!(pending(lyra, "slow") > 0, "{:#}", lyra.state("slow"));
    let history = lyra.history("slow");
    assert!(
        history[0]["outcome"].is_null(),
        "the aborted run never finished: {history:#?}"
    );

    // At once, without --lock-timeout: admitted, and it converges.
    let report = lyra.ok_json(&["apply", "slow", "--concurrency", "12"]);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_eq!(count(&report, "created") + count(&report, "unchanged"), N as u64);
    assert_eq!(lyra.resources("slow").len(), N);
    assert_eq!(pending(lyra, "slow"), 0, "the pending records are resolved");
}

#[test]
fn sqlite_second_ctrl_c_releases_the_lease() {
    second_signal_during_apply(&Lyra::new(), "INT");
}

#[test]
fn sqlite_second_sigterm_releases_the_lease() {
    second_signal_during_apply(&Lyra::new(), "TERM");
}

#[test]
fn postgres_second_ctrl_c_releases_the_lease() {
    let pg = pg_or_skip!();
    second_signal_during_apply(&Lyra::new().with_state(pg.url()), "INT");
}

#[test]
fn second_ctrl_c_during_delete_releases_the_lease() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "slow",
        &sleeps_workflow(N, "1ms").replace(
            "create_duration: 1ms",
            "create_duration: 1ms\n      destroy_duration: 3s",
        ),
    );
    lyra.ok(&["apply", "slow"]);
    let child = lyra.spawn("delete", &["delete", "slow", "--concurrency", "2", "-v", "-o", "json"]);
    abort_twice(&lyra, child, "delete", "INT", "slow");
    let report = lyra.ok_json(&["delete", "slow", "--concurrency", "12"]);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert!(lyra.resources("slow").is_empty());
}

/// The first signal while waiting for a lease ends the wait (exit 130), instead of waiting on.
#[test]
fn ctrl_c_ends_a_wait_for_the_lease() {
    let lyra = Lyra::new();
    lyra.write_workflow("slow", &sleeps_workflow(N, "3s"));
    lyra.init_state();
    let mut holder = lyra.spawn("holder", &["apply", "slow", "--concurrency", "12", "-v"]);
    wait_for_stderr(&lyra, &mut holder, "holder", "…");
    let mut waiter = lyra.spawn("waiter", &["apply", "slow", "--lock-timeout", "5m", "-o", "json"]);
    wait_for_stderr(&lyra, &mut waiter, "waiter", "waiting up to 5m");
    send(&waiter, "INT");
    let status = waiter.wait().expect("wait");
    let (stdout, stderr) = lyra.spawned_output("waiter");
    assert_eq!(status.code(), Some(130), "{stdout}\n{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(doc["error"]["kind"], "interrupted", "{doc:#}");
    assert!(
        holder.wait().expect("wait").success(),
        "{:?}",
        lyra.spawned_output("holder")
    );
}

/// Whether process `pid` still exists.
fn alive(pid: &str) -> bool {
    std::process::Command::new("kill")
        .args(["-0", pid])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The first Ctrl-C reaches a running command: `Exec::Command`'s shell and what it started are
/// killed at once (not waited for, as a step that finishes would be), the step fails as
/// interrupted, and the run ends 130. Its intent stays: the command may have done its work.
#[test]
fn ctrl_c_kills_a_running_command_and_its_children() {
    let lyra = Lyra::new();
    lyra.write_workflow(
        "slow",
        "steps:\n  long:\n    resource: Exec::Command\n    value:\n      create: |\n        echo $$ > shell.pid\n        sleep 300 &\n        echo $! > child.pid\n        wait\n",
    );
    let mut child = lyra.spawn("slow", &["apply", "slow", "-o", "json"]);
    let started = wait_until(Duration::from_secs(60), || {
        lyra.path("child.pid").exists() && !lyra.read("child.pid").trim().is_empty()
    });
    assert!(started, "the command never started: {:?}", lyra.spawned_output("slow"));
    let (shell, sleeper) = (
        lyra.read("shell.pid").trim().to_owned(),
        lyra.read("child.pid").trim().to_owned(),
    );
    assert!(alive(&sleeper));
    let sent = std::time::Instant::now();
    send(&child, "INT");
    let status = child.wait().expect("wait");
    assert!(
        sent.elapsed() < Duration::from_secs(20),
        "the run waited for the command"
    );
    let (stdout, stderr) = lyra.spawned_output("slow");
    assert_eq!(status.code(), Some(130), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("the JSON report");
    let step = &report["steps"][0];
    assert_eq!(step["status"], "failed", "{report:#}");
    assert!(
        step["error"].as_str().is_some_and(|e| e.contains("interrupted")),
        "{report:#}"
    );
    let gone = wait_until(Duration::from_secs(5), || !alive(&shell) && !alive(&sleeper));
    assert!(gone, "the command's process group was killed");
    assert_eq!(
        pending(&lyra, "slow"),
        1,
        "the intent stays: the command may have had its effect"
    );
}

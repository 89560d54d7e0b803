//! Leases: one writer per deployment at a time, across processes, on SQLite and on Postgres.
//! A second writer is refused at once (exit 3, naming the holder) or waits with
//! `--lock-timeout`; a holder that ended on this machine (`kill -9`) has its lease taken over
//! at once; a stuck one's lease expires or is broken with `state unlock --force`; `plan` never
//! needs the lease.

use std::process::Child;
use std::time::Duration;

use integration_tests::{Lyra, count, note_contains, pg_or_skip, sleeps_workflow, wait_for_lease, wait_until};

/// 12 sleeps of 300ms, 4 at a time: about a second of holding the lease.
fn slow(lyra: &Lyra) {
    lyra.write_workflow("slow", &sleeps_workflow(12, "300ms"));
}

fn wait_ok(lyra: &Lyra, child: &mut Child, tag: &str) {
    let status = child.wait().expect("wait");
    assert!(status.success(), "{tag}: {status:?} {:?}", lyra.spawned_output(tag));
}

/// Two applies started together: exactly one runs, the other is refused naming the holder.
fn two_applies_exactly_one_runs(lyra: &Lyra) {
    slow(lyra);
    let args = ["apply", "slow", "--concurrency", "4", "-o", "json"];
    let mut a = lyra.spawn("a", &args);
    let mut b = lyra.spawn("b", &args);
    let (sa, sb) = (a.wait().expect("wait a"), b.wait().expect("wait b"));
    let codes = [sa.code(), sb.code()];
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(3)),
        "one runs, one is refused with 3: {codes:?}\na: {:?}\nb: {:?}",
        lyra.spawned_output("a"),
        lyra.spawned_output("b")
    );
    let refused = if sa.code() == Some(3) { "a" } else { "b" };
    let (out, err) = lyra.spawned_output(refused);
    // No report: the error document, naming the holder.
    let refusal: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(refusal["error"]["kind"], "locked", "{refusal:#}");
    assert_eq!(refusal["error"]["exit_code"], 3, "{refusal:#}");
    assert_eq!(refusal["error"]["lease"]["operation"], "apply", "{refusal:#}");
    assert!(
        err.contains("deployment 'slow' is locked") && err.contains("is running apply since"),
        "{err}"
    );
    assert!(err.contains('@'), "the holder is named user@host: {err}");
    assert_eq!(lyra.state("slow")["resources"].as_array().map(Vec::len), Some(12));
    // Exactly one run in the history: the refused one never started.
    assert_eq!(lyra.history("slow").len(), 1);
}

/// With `--lock-timeout`, the second waits for the first and then has nothing to do.
fn the_second_waits_with_a_lock_timeout(lyra: &Lyra) {
    slow(lyra);
    let args = [
        "apply",
        "slow",
        "--concurrency",
        "4",
        "--lock-timeout",
        "30s",
        "-o",
        "json",
    ];
    let mut a = lyra.spawn("a", &args);
    let mut b = lyra.spawn("b", &args);
    wait_ok(lyra, &mut a, "a");
    wait_ok(lyra, &mut b, "b");
    let reports: Vec<serde_json::Value> = ["a", "b"]
        .iter()
        .map(|t| serde_json::from_str(&lyra.spawned_output(t).0).expect("a JSON report"))
        .collect();
    let mut created: Vec<u64> = reports.iter().map(|r| count(r, "created")).collect();
    created.sort_unstable();
    assert_eq!(
        created,
        [0, 12],
        "one creates everything, the other nothing: {reports:#?}"
    );
    let waited = if count(&reports[0], "created") == 0 { "a" } else { "b" };
    assert_eq!(count(&reports[if waited == "a" { 0 } else { 1 }], "unchanged"), 12);
    assert!(
        lyra.spawned_output(waited)
            .1
            .contains("waiting up to 30s for the lease on 'slow'"),
        "{:?}",
        lyra.spawned_output(waited)
    );
}

#[test]
fn sqlite_two_applies_exactly_one_runs() {
    let lyra = Lyra::new();
    // The state file exists before the two processes race to open it.
    lyra.init_state();
    two_applies_exactly_one_runs(&lyra);
}

#[test]
fn sqlite_the_second_waits_with_a_lock_timeout() {
    let lyra = Lyra::new();
    lyra.init_state();
    the_second_waits_with_a_lock_timeout(&lyra);
}

#[test]
fn postgres_two_applies_exactly_one_runs() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    lyra.init_state();
    two_applies_exactly_one_runs(&lyra);
}

#[test]
fn postgres_the_second_waits_with_a_lock_timeout() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    lyra.init_state();
    the_second_waits_with_a_lock_timeout(&lyra);
}

#[test]
fn plan_needs_no_lease_and_the_lease_is_shown() {
    let lyra = Lyra::new();
    slow(&lyra);
    lyra.init_state();
    let mut a = lyra.spawn("a", &["apply", "slow", "--concurrency", "2"]);
    let lease = wait_for_lease(&lyra, "slow");
    assert_eq!(lease["operation"], "apply");
    assert!(lease["owner"].as_str().is_some_and(|o| o.contains('@')), "{lease}");
    for key in ["since", "expires"] {
        assert!(lease[key].as_str().is_some_and(|t| t.ends_with('Z')), "{key}: {lease}");
    }
    // A plan runs while the apply holds the lease.
    lyra.ok(&["plan", "slow"]);
    let shown = lyra.state("slow");
    assert_eq!(shown["lease"]["operation"], "apply", "{shown}");
    wait_ok(&lyra, &mut a, "a");
    assert!(lyra.state("slow")["lease"].is_null(), "released at the end");
}

/// An apply takes a free lease while it reads its workflow, and reads the state under it
/// meanwhile: a workflow then found invalid gives the lease back and records nothing. Where
/// the lease is held, the workflow's problems still come first, then the lock.
#[test]
fn an_invalid_workflow_is_reported_first_and_leaves_no_lease() {
    let lyra = Lyra::new();
    slow(&lyra);
    lyra.write_workflow(
        "broken",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: $nowhere}\n",
    );
    lyra.init_state();
    lyra.ok(&["apply", "slow", "--concurrency", "12"]);
    let runs = lyra.history("slow").len();
    lyra.run(&["apply", "broken", "--name", "slow"])
        .expect_code(1)
        .expect_stderr(&["produces '$nowhere'"]);
    assert!(lyra.state("slow")["lease"].is_null(), "given back");
    assert_eq!(lyra.history("slow").len(), runs, "no run recorded");
    assert_eq!(lyra.state("slow")["resources"].as_array().map(Vec::len), Some(12));

    let mut holder = lyra.spawn("holder", &["apply", "slow", "--name", "held", "--concurrency", "1"]);
    wait_for_lease(&lyra, "held");
    let refused = lyra.run(&["apply", "broken", "--name", "held", "-o", "json"]);
    refused.expect_code(1).expect_stderr(&["produces '$nowhere'"]);
    assert_eq!(refused.json()["error"]["kind"], "invalid_input", "{refused}");
    lyra.run(&["apply", "slow", "--name", "held"]).expect_code(3);
    wait_ok(&lyra, &mut holder, "holder");
    assert!(lyra.state("held")["lease"].is_null());
}

/// Sends `signal` (`STOP`, `KILL`) to a process.
fn signal(child: &Child, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal}");
}

/// A run holding the lease, stopped (`kill -STOP`): alive, but it neither runs nor renews, as
/// a holder hung on its disk or paused by a debugger. Killed when dropped, even by a failing
/// test.
struct Stuck(Child);

impl Drop for Stuck {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too. No assertion: this may run while a test fails.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stuck_holder(lyra: &Lyra, args: &[&str]) -> Stuck {
    let child = Stuck(lyra.spawn("holder", args));
    wait_for_lease(lyra, "slow");
    signal(&child.0, "STOP");
    child
}

/// A holder killed on this machine (`kill -9`, the OOM killer) is seen to have ended: the next
/// run takes its lease over at once, says so, and finishes the job.
#[test]
fn a_killed_holders_lease_is_taken_over_at_once() {
    let lyra = Lyra::new();
    slow(&lyra);
    lyra.init_state();
    let mut holder = lyra.spawn("holder", &["apply", "slow", "--concurrency", "1", "--lease-ttl", "10m"]);
    wait_for_lease(&lyra, "slow");
    // Its run is recorded (the lease is taken before that, while the workflow is read).
    let begun = wait_until(Duration::from_secs(30), || {
        let run = lyra.run(&["history", "slow", "-o", "json"]);
        run.code == Some(0) && run.json().as_array().is_some_and(|h| !h.is_empty())
    });
    assert!(begun, "the holder's run was never recorded");
    let shown = lyra.ok(&["state", "unlock", "slow"]);
    let pid = format!("pid {}", holder.id());
    assert!(shown.stdout.contains(&pid), "the holder's pid is shown: {shown}");
    let shown = lyra.ok_json(&["state", "unlock", "slow"]);
    assert_eq!(shown["lease"]["pid"], holder.id(), "{shown:#}");
    holder.kill().expect("kill");
    holder.wait().expect("wait");

    let took = lyra.run(&["apply", "slow", "-o", "json"]);
    took.expect_code(0).expect_stderr(&[
        "took over the lease on 'slow'",
        "ended on this machine without releasing it",
        pid.as_str(),
    ]);
    let report = took.json();
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_eq!(count(&report, "created") + count(&report, "unchanged"), 12);
    assert!(lyra.state("slow")["lease"].is_null());
    // Newest first: this run, the takeover, the killed run.
    let history = lyra.history("slow");
    assert_eq!(
        history.iter().map(|r| r["operation"].as_str()).collect::<Vec<_>>(),
        [Some("apply"), Some("unlock"), Some("apply")],
        "{history:#?}"
    );
    assert!(note_contains(&history[1], &pid), "{history:#?}");
}

#[test]
fn a_stuck_holders_lease_is_broken_with_unlock_force() {
    let lyra = Lyra::new();
    slow(&lyra);
    lyra.init_state();
    let _holder = stuck_holder(&lyra, &["apply", "slow", "--concurrency", "1"]);

    lyra.run(&["apply", "slow"])
        .expect_code(3)
        .expect_stderr(&["state unlock slow --force"]);
    // Without --force, unlock only shows the holder, and succeeds.
    let shown = lyra.ok(&["state", "unlock", "slow"]);
    assert!(
        shown.stdout.contains("is running apply since") && shown.stdout.contains("--force"),
        "{shown}"
    );
    let lease = lyra.ok_json(&["state", "unlock", "slow"]);
    assert_eq!(
        (&lease["lease"]["operation"], &lease["broken"]),
        (&"apply".into(), &false.into()),
        "{lease:#}"
    );
    lyra.run(&["apply", "slow"]).expect_code(3);
    let unlocked = lyra.ok(&["state", "unlock", "slow", "--force"]);
    assert!(unlocked.stdout.contains("unlocked 'slow'"), "{unlocked}");
    let history = lyra.history("slow");
    assert_eq!(history[0]["operation"], "unlock", "{history:#?}");
    assert!(note_contains(&history[0], "broke the lease"), "{history:#?}");
    let report = lyra.ok_json(&["apply", "slow"]);
    assert_eq!(report["outcome"], "succeeded");
    assert_eq!(count(&report, "created") + count(&report, "unchanged"), 12);
}

#[test]
fn a_stuck_holders_lease_expires() {
    let lyra = Lyra::new();
    slow(&lyra);
    lyra.init_state();
    let _holder = stuck_holder(&lyra, &["apply", "slow", "--concurrency", "1", "--lease-ttl", "1s"]);
    // Refused while the lease lasts, admitted after it lapses: waiting covers both.
    let report = lyra.ok_json(&["apply", "slow", "--lock-timeout", "20s"]);
    assert_eq!(report["outcome"], "succeeded");
    assert!(lyra.state("slow")["lease"].is_null());
}

#[test]
fn delete_and_state_rm_take_the_lease_too() {
    let lyra = Lyra::new();
    // Slow to delete as well as to create.
    lyra.write_workflow(
        "slow",
        &sleeps_workflow(12, "10ms").replace(
            "create_duration: 10ms",
            "create_duration: 10ms\n      destroy_duration: 300ms",
        ),
    );
    lyra.ok(&["apply", "slow"]);
    let mut a = lyra.spawn("a", &["apply", "slow", "--name", "other"]);
    let mut holder = lyra.spawn("holder", &["delete", "slow", "--concurrency", "1"]);
    wait_for_lease(&lyra, "slow");
    lyra.run(&["state", "rm", "slow", "s000"])
        .expect_code(3)
        .expect_stderr(&["is running delete since"]);
    wait_ok(&lyra, &mut holder, "holder");
    wait_ok(&lyra, &mut a, "a");
}

/// Leases are per deployment: runs on different deployments of one Postgres state proceed
/// side by side (each would be refused with exit 3 if the lock were global).
#[test]
fn postgres_different_deployments_do_not_block_each_other() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    slow(&lyra);
    lyra.init_state();
    let mut children: Vec<_> = (0..3)
        .map(|i| lyra.spawn(&format!("d{i}"), &["apply", "slow", "--name", &format!("d{i}")]))
        .collect();
    for (i, child) in children.iter_mut().enumerate() {
        wait_ok(&lyra, child, &format!("d{i}"));
    }
    let list = lyra.ok_json(&["state", "list"]);
    assert_eq!(list.as_array().map(Vec::len), Some(3), "{list:#}");
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|d| d["resource_count"] == 12 && d["lease"].is_null())
    );
}

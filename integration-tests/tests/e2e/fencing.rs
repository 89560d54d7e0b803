//! Fencing: a run paused past its lease's time to live (SIGSTOP) loses the lease to another
//! run; when it resumes (SIGCONT) none of its writes land. The store refuses each one in the
//! transaction that would make it, because the lease token it carries is no longer current.
//! The paused run stops and says its lease was lost; the new holder's records stand.

use std::process::Command;
use std::time::Duration;

use integration_tests::{Lyra, pg_or_skip, sleeps_workflow, wait_until};

const STEPS: usize = 6;

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}: {status:?}");
}

/// The deployment's lease as `state list` shows it (only while unexpired).
fn lease(lyra: &Lyra, deployment: &str) -> serde_json::Value {
    let list = lyra.ok_json(&["state", "list"]);
    list.as_array()
        .into_iter()
        .flatten()
        .find(|d| d["deployment"] == deployment)
        .map_or(serde_json::Value::Null, |d| d["lease"].clone())
}

fn paused_holder_cannot_write(lyra: &Lyra) {
    // The first run: slow steps, one at a time, so it is mid-run for seconds.
    lyra.write_workflow("slow", &sleeps_workflow(STEPS, "1s"));
    // The second: the same steps, quick, with other values.
    lyra.write_workflow("quick", &sleeps_workflow(STEPS, "10ms"));
    lyra.init_state();
    let args = [
        "apply",
        "slow",
        "--name",
        "web",
        "--concurrency",
        "1",
        "--lease-ttl",
        "1s",
        "-o",
        "json",
    ];
    let mut first = lyra.spawn("first", &args);
    // Paused mid-run: under its lease, after its first write.
    let started = wait_until(Duration::from_secs(30), || {
        !lease(lyra, "web").is_null()
            && lyra.run(&["state", "show", "web", "-o", "json"]).code == Some(0)
            && lyra.state("web")["resources"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert!(
        started,
        "the first run never got under way: {:?}",
        lyra.spawned_output("first")
    );
    signal(first.id(), "STOP");

    // Its lease lapses (nobody renews it), and the second run takes it and finishes.
    let lapsed = wait_until(Duration::from_secs(30), || lease(lyra, "web").is_null());
    assert!(lapsed, "the paused run's lease never lapsed");
    let second = lyra.ok_json(&["apply", "quick", "--name", "web", "--lock-timeout", "30s"]);
    assert_eq!(second["outcome"], "succeeded", "{second:#}");
    let after_second = lyra.state("web");

    signal(first.id(), "CONT");
    let status = first.wait().expect("wait for the first run");
    let (out, err) = lyra.spawned_output("first");
    assert_eq!(status.code(), Some(1), "the first run fails: {out}\n{err}");
    let refusal: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert_eq!(refusal["error"]["kind"], "lease_lost", "{refusal:#}");
    assert!(err.contains("the lease on 'web' was lost"), "{err}");

    // Nothing of the first run landed after the second took over: the state is the second
    // run's, record for record, and the history's last word is the second run's.
    let state = lyra.state("web");
    assert_eq!(state, after_second, "the resumed run changed the state");
    assert_eq!(state["workflow"], "quick", "{state:#}");
    let resources = state["resources"].as_array().expect("resources");
    assert_eq!(resources.len(), STEPS, "{state:#}");
    for r in resources {
        assert_eq!(r["pending"], false, "{r}");
        assert_eq!(r["state"]["create_duration"], "10ms", "the second run's record: {r}");
    }
    let history = lyra.history("web");
    assert_eq!(history.len(), 2, "{history:#?}");
    assert_eq!(history[0]["workflow"], "quick", "{history:#?}");
    assert_eq!(history[0]["outcome"], "succeeded", "{history:#?}");
    // The first run began under its lease; its end, after losing it, was refused.
    assert_eq!(history[1]["workflow"], "slow", "{history:#?}");
    assert!(history[1]["outcome"].is_null(), "{history:#?}");
    assert!(lease(lyra, "web").is_null(), "no lease left behind");
}

#[test]
fn sqlite_a_paused_holder_cannot_write_after_losing_its_lease() {
    paused_holder_cannot_write(&Lyra::new());
}

#[test]
fn postgres_a_paused_holder_cannot_write_after_losing_its_lease() {
    let pg = pg_or_skip!();
    paused_holder_cannot_write(&Lyra::new().with_state(pg.url()));
}

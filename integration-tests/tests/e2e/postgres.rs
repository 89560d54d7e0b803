//! The shared Postgres state, driven by the real `lyra` binary against the real server: the
//! whole lifecycle, moving deployments between SQLite and Postgres, `kill -9` in the middle of
//! many creates, and connections cut by the server mid-run.

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::postgres::{psql, recorded};
use integration_tests::{Lyra, Rng, cloud_ids, count, pg_or_skip, sleepy_fleet_workflow, wait_until};

/// Everything the deployment records, with no pending create left, and the cloud holds
/// exactly the recorded instances: nothing lost, nothing duplicated.
#[track_caller]
fn assert_converged(lyra: &Lyra, deployment: &str, n: usize) {
    assert_converged_in(lyra, deployment, n, &[]);
}

#[track_caller]
fn assert_converged_in(lyra: &Lyra, deployment: &str, n: usize, state_args: &[&str]) {
    let mut args = vec!["state", "show", deployment];
    args.extend(state_args);
    let state = lyra.ok_json(&args);
    let resources = state["resources"].as_array().expect("resources");
    assert!(
        resources.iter().all(|r| r["pending"] == false),
        "a pending record is left: {state:#}"
    );
    let recorded: BTreeSet<String> = resources
        .iter()
        .filter(|r| r["type"] == "Foobernetes::Instance")
        .map(|r| r["external_id"].as_str().expect("id").to_owned())
        .collect();
    let cloud: BTreeSet<String> = cloud_ids(&lyra.cloud(), "Instances").into_iter().collect();
    assert_eq!(recorded.len(), n, "recorded instances");
    assert_eq!(cloud, recorded, "the cloud holds exactly what the state records");
}

#[test]
fn lifecycle_on_postgres() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    lyra.write_workflow("fleet", &sleepy_fleet_workflow(5, "20ms"));
    let plan = lyra.ok_json(&["plan", "fleet"]);
    assert_eq!(plan["outcome"], "succeeded");
    let report = lyra.ok_json(&["apply", "fleet"]);
    assert_eq!(count(&report, "created"), 10, "{report:#}");
    assert_converged(&lyra, "fleet", 5);
    let again = lyra.ok_json(&["apply", "fleet"]);
    assert_eq!(count(&again, "unchanged"), 10);
    let list = lyra.ok_json(&["state", "list"]);
    assert_eq!(list[0]["deployment"], "fleet");
    assert_eq!(list[0]["last_run"]["outcome"], "succeeded");
    lyra.ok(&["delete", "fleet"]);
    assert!(cloud_ids(&lyra.cloud(), "Instances").is_empty());
    assert_eq!(lyra.history("fleet").len(), 3);
}

#[test]
fn migrate_moves_a_deployment_to_postgres_and_back() {
    let pg = pg_or_skip!();
    let lyra = Lyra::new();
    lyra.write_workflow("fleet", &sleepy_fleet_workflow(4, "20ms"));
    lyra.ok(&["apply", "fleet"]);
    let before = lyra.state("fleet")["resources"].clone();

    let moved = lyra.ok_json(&["state", "migrate", "--from", ".lyra/state.db", "--to", pg.url()]);
    assert_eq!(moved["moved"][0]["deployment"], "fleet", "{moved}");
    lyra.run(&["state", "show", "fleet"])
        .expect_code(1)
        .expect_stderr(&["no deployment 'fleet'"]);
    let on_pg = lyra.ok_json(&["state", "show", "fleet", "--state", pg.url()]);
    assert_eq!(on_pg["resources"], before);
    let report = lyra.ok_json(&["apply", "fleet", "--state", pg.url()]);
    assert_eq!(
        count(&report, "unchanged"),
        8,
        "an apply after the move changes nothing: {report:#}"
    );
    assert_eq!(count(&report, "created"), 0);

    lyra.ok(&["state", "migrate", "--from", pg.url(), "--to", "back.db"]);
    let back = lyra.ok_json(&["apply", "fleet", "--state", "back.db"]);
    assert_eq!(count(&back, "unchanged"), 8, "{back:#}");
    let history = lyra.ok_json(&["history", "fleet", "--state", "back.db"]);
    let ops: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["operation"].as_str().unwrap())
        .collect();
    // Newest first: the apply, the move back, the apply on Postgres, the move there, the first apply.
    assert_eq!(ops, ["apply", "import", "apply", "import", "apply"], "{history:#}");
    assert!(
        !history.to_string().contains(":***@") || !pg.url().contains(':'),
        "no password in notes"
    );
    assert_converged_in(&lyra, "fleet", 4, &["--state", "back.db"]);
}

/// `n` independent Foobernetes instances and nothing else: 16 at a time, they keep many
/// creates in flight (each rewrites `deployment.json` and its key file).
fn instances(n: usize) -> String {
    format!(
        "\
steps:
  vm:
    times: {n}
    step:
      resource: Foobernetes::Instance
      value:
        location: eu1
        image: img
        cpus: 1
        memory: 1G
"
    )
}

/// Kill -9 an apply on Postgres with many Foobernetes creates in flight, 20 times at random
/// moments; after each, the lease is broken and the next apply converges with no duplicate in
/// the state or in `deployment.json`.
#[test]
fn random_kills_during_applies_never_duplicate() {
    // 150 creates take about half a second on an idle machine.
    const N: usize = 150;
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    lyra.write_workflow("fleet", &instances(N));
    let mut rng = Rng::new(0x5eed_1e55);
    let mut mid_run_kills = 0;
    let (mut partial, mut pending_left) = (0, 0);
    for trial in 0..20 {
        let deployment = format!("t{trial}");
        let mut child = lyra.spawn(
            "apply",
            &["apply", "fleet", "--name", &deployment, "--concurrency", "16"],
        );
        // Once the run has recorded something (however slow the machine), kill it a random
        // moment later, while creates are in flight.
        let progressed = wait_until(Duration::from_secs(30), || {
            matches!(child.try_wait(), Ok(Some(_))) || recorded(&pg, &deployment) > 0
        });
        assert!(progressed, "trial {trial}: the apply recorded nothing in 30s");
        std::thread::sleep(Duration::from_millis(rng.below(200) as u64));
        child.kill().expect("kill -9");
        let status = child.wait().expect("wait");
        if status.code().is_none() {
            mid_run_kills += 1;
        }
        // What the dead run left: some recorded, some pending (create asked, result unknown).
        let left = lyra.run(&["state", "show", &deployment, "-o", "json"]);
        if left.code == Some(0) {
            let resources = left.json()["resources"].as_array().cloned().unwrap_or_default();
            let pending = resources.iter().filter(|r| r["pending"] == true).count();
            if (1..N).contains(&(resources.len() - pending)) {
                partial += 1;
            }
            pending_left += pending;
        }
        // The dead holder's lease stays until broken, taken over by the next run on this
        // machine, or expired; breaking it is what an operator elsewhere would do.
        let unlock = lyra.run(&["state", "unlock", &deployment, "--force"]);
        assert!(
            unlock.code == Some(0) || unlock.stderr.contains("no deployment"),
            "{unlock}"
        );
        let report = lyra.ok_json(&["apply", "fleet", "--name", &deployment, "--concurrency", "16"]);
        assert_eq!(report["outcome"], "succeeded", "trial {trial}: {report:#}");
        let again = lyra.ok_json(&["apply", "fleet", "--name", &deployment]);
        assert_eq!(count(&again, "unchanged") as usize, N, "trial {trial}: {again:#}");
        assert_converged(&lyra, &deployment, N);
        lyra.ok(&["delete", &deployment]);
        // Every trial's instances are gone: nothing leaked from the killed run.
        assert!(
            cloud_ids(&lyra.cloud(), "Instances").is_empty(),
            "trial {trial} leaked: {}",
            lyra.read("deployment.json")
        );
    }
    assert!(mid_run_kills >= 10, "most kills land mid-run ({mid_run_kills} of 20)");
    eprintln!(
        "{mid_run_kills} of 20 kills landed mid-run; {partial} left a partial state, \
         {pending_left} pending creates in all"
    );
    assert!(partial >= 5, "kills left partial states ({partial} of 20)");
    assert!(pending_left > 0, "some kills landed inside the create window");
}

/// The server cuts every connection of a running apply, several times: the run either
/// recovers or fails cleanly; what it recorded stays recorded; the next apply converges.
#[test]
fn connections_terminated_mid_run_lose_nothing() {
    const N: usize = 40;
    let pg = pg_or_skip!();
    let lyra = Lyra::new().with_state(pg.url());
    // At least 2.5 s of steps, so several rounds of cuts land mid-run even when each psql
    // round trip is slow on a loaded machine.
    lyra.write_workflow("fleet", &sleepy_fleet_workflow(N, "250ms"));
    lyra.init_state();
    let mut child = lyra.spawn("apply", &["apply", "fleet", "--concurrency", "4", "-o", "json"]);
    // Only this apply's connections: lyra names them after its process id.
    let terminate = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND application_name = 'lyra-{}'",
        child.id()
    );
    let (mut cuts, mut terminated) = (0, 0);
    let finished = wait_until(Duration::from_secs(60), || {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        let out = psql(&terminate);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        terminated += String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|w| w.parse::<u32>().ok())
            .unwrap_or(0);
        cuts += 1;
        std::thread::sleep(Duration::from_millis(150));
        false
    });
    assert!(finished, "the apply hung after its connections were cut");
    let status = child.wait().expect("wait");
    let (out, err) = lyra.spawned_output("apply");
    assert!(!err.contains("panicked"), "{err}");
    assert!(terminated > 0, "the server terminated some of the apply's connections");
    // A run that survives the cuts has met several rounds of them; one may also end cleanly
    // at the first cut that lands on a COMMIT (whether it committed is unknown, so it is
    // not repeated), checked below.
    assert!(
        cuts >= 3 || status.code() == Some(1),
        "the connections were cut during the run ({cuts} times)"
    );
    eprintln!(
        "{cuts} rounds terminated {terminated} connections; the apply exited {:?}",
        status.code()
    );
    match status.code() {
        Some(0) => {}
        Some(1) => assert!(
            err.contains("Postgres") || err.contains("state"),
            "a clean failure says what failed: {err}"
        ),
        other => panic!("unexpected exit {other:?}: {out}\n{err}"),
    }
    // What was recorded is there, and the next apply completes the rest without duplicates.
    let report = lyra.ok_json(&["apply", "fleet", "--lock-timeout", "60s"]);
    assert_eq!(report["outcome"], "succeeded", "{report:#}");
    assert_converged(&lyra, "fleet", N);
}

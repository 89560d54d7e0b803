//! The Kubernetes facade end to end: the real `kubectl` against the emulator, the real
//! `lyra-controller` binary, and the real `lyra` CLI on the same state (Postgres in CI).

use std::collections::BTreeSet;
use std::time::Duration;

use integration_tests::{Value, cloud_ids, cluster_or_skip, sleepy_fleet_workflow, wait_until, workspace_dir};

/// The example web application: db, two frontends, a web server and a load balancer.
fn install_webapp(cluster: &integration_tests::cluster::Cluster) {
    let yaml = std::fs::read_to_string(workspace_dir().join("examples/workflows/webapp.yaml")).expect("example");
    cluster.lyra.write_workflow("webapp", &yaml);
}

fn webapp_object(name: &str, replicas: u32, extra_spec: &str) -> String {
    format!(
        "\
apiVersion: lyra.dev/v1alpha1
kind: Workflow
metadata:
  name: {name}
  namespace: default
spec:
  workflowName: webapp
  data:
    webapp:
      region: eu1
      cache: false
    # The original's flat dotted keys work too.
    webapp.replicas: {replicas}
{extra_spec}"
    )
}

fn condition<'a>(wf: &'a Value, kind: &str) -> Option<&'a Value> {
    wf["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_is(wf: &Value, kind: &str, status: &str) -> bool {
    condition(wf, kind).is_some_and(|c| c["status"] == status)
}

fn instance_ids(cluster: &integration_tests::cluster::Cluster) -> BTreeSet<String> {
    cloud_ids(&cluster.cloud(), "Instances").into_iter().collect()
}

/// Acceptance 1–3: deploy, upgrade, get/list/describe, delete.
#[test]
fn deploy_upgrade_and_delete_with_kubectl() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    let controller = cluster.controller("c1", &[]);

    // Deploy.
    cluster.apply(&webapp_object("shop", 2, ""));
    cluster.wait_for("shop", "condition=Ready", "90s");
    let wf = cluster.workflow("shop");
    let status = &wf["status"];
    assert_eq!(status["phase"], "Ready", "{wf:#}");
    assert_eq!(status["observedGeneration"], 1);
    for kind in ["Ready", "Reconciling", "Stalled"] {
        let c = condition(&wf, kind).unwrap_or_else(|| panic!("no {kind} condition: {wf:#}"));
        assert_eq!(c["observedGeneration"], 1, "{c}");
    }
    assert!(condition_is(&wf, "Reconciling", "False") && condition_is(&wf, "Stalled", "False"));
    let steps: Vec<&Value> = status["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["state"] != "guarded-off")
        .collect();
    assert_eq!(steps.len(), 5, "db, frontends/0, frontends/1, web, lb: {wf:#}");
    assert!(steps.iter().all(|s| s["externalId"].is_string()), "{wf:#}");
    let cache = status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "cache");
    assert_eq!(cache.map(|c| &c["state"]), Some(&Value::from("guarded-off")), "{wf:#}");
    assert_eq!(status["progress"], "5/5");
    assert!(
        status["returns"]["lbID"]
            .as_str()
            .is_some_and(|id| id.starts_with("lb-"))
    );
    let instances = instance_ids(&cluster);
    assert_eq!(instances.len(), 3, "deployment.json holds the instances");
    // The status names the run, as the shared history records it.
    let history = cluster.lyra.history("k8s/default/shop");
    assert_eq!(status["lastRun"]["id"], history[0]["id"], "{wf:#}");
    assert_eq!(history[0]["actor"], "controller/default/shop");

    let table = cluster.kubectl.ok(&["get", "wf"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "WORKFLOW", "PHASE", "READY", "STEPS", "APPROVAL", "DRIFTED", "MESSAGE", "AGE"
        ],
        "{table}"
    );
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(
        row.starts_with("shop") && row.contains("webapp") && row.contains("Ready") && row.contains("5/5"),
        "{table}"
    );

    // The CLI sees the controller's deployment in the same state.
    let list = cluster.lyra.ok_json(&["state", "list"]);
    let entry = list
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["deployment"] == "k8s/default/shop")
        .unwrap_or_else(|| panic!("{list:#}"));
    assert_eq!(entry["resource_count"], 5);
    // And previews what the controller would do: nothing.
    let plan = cluster.lyra.ok_json(&[
        "plan",
        "webapp",
        "--name",
        "k8s/default/shop",
        "--var",
        "webapp.region=eu1",
        "--var",
        "webapp.cache=false",
        "--var",
        "webapp.replicas=2",
    ]);
    assert_eq!(plan["counts"]["unchanged"], 5, "{plan:#}");

    // Upgrade: one more replica; only that instance (and what reads the list) changes.
    cluster.apply(&webapp_object("shop", 3, ""));
    let wf = cluster.wait_until_status("shop", Duration::from_secs(90), |wf| {
        wf["status"]["observedGeneration"] == 2 && condition_is(wf, "Ready", "True")
    });
    assert_eq!(condition(&wf, "Ready").unwrap()["observedGeneration"], 2);
    let after = instance_ids(&cluster);
    assert_eq!(after.len(), 4);
    assert!(
        instances.is_subset(&after),
        "the existing instances are kept: {instances:?} {after:?}"
    );
    let actions: Vec<(String, String)> = wf["status"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["lastAction"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let changed: Vec<&str> = actions
        .iter()
        .filter(|(_, a)| a != "no-op")
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        changed,
        ["frontends/2", "web"],
        "only the new replica and the web server reading the list: {actions:?}"
    );

    // Get and describe: every step in -o yaml, Events in describe.
    let yaml = cluster.kubectl.ok(&["get", "wf", "shop", "-o", "yaml"]);
    for step in ["db", "frontends/0", "frontends/1", "frontends/2", "web", "lb"] {
        assert!(yaml.contains(&format!("name: {step}")), "{step} missing:\n{yaml}");
    }
    let described = cluster.kubectl.ok(&["describe", "wf", "shop"]);
    assert!(described.contains("Events:"), "{described}");
    assert!(
        !described.contains("Events:  <none>"),
        "the controller records Events:\n{described}"
    );

    // Delete: the finalizer tears everything down, then the object goes.
    cluster.kubectl.ok(&["delete", "wf", "shop", "--timeout=90s"]);
    assert!(
        instance_ids(&cluster).is_empty(),
        "{}",
        cluster.lyra.read("deployment.json")
    );
    assert!(cloud_ids(&cluster.cloud(), "LoadBalancers").is_empty());
    let gone = cluster.kubectl.run(&["get", "wf", "shop"]);
    assert!(!gone.success && gone.stderr.contains("NotFound"), "{}", gone.stderr);
    let list = cluster.lyra.ok_json(&["state", "list"]);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|d| d["deployment"] != "k8s/default/shop" || d["resource_count"] == 0),
        "{list:#}"
    );
    assert!(controller.metric("lyra_reconciles_total") >= 3.0);
}

#[test]
fn orphan_policy_leaves_the_resources_and_forgets_them() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(&webapp_object("keep", 1, "  deletionPolicy: Orphan\n"));
    cluster.wait_for("keep", "condition=Ready", "90s");
    let before = instance_ids(&cluster);
    assert_eq!(before.len(), 2);
    cluster.kubectl.ok(&["delete", "wf", "keep", "--timeout=60s"]);
    assert_eq!(instance_ids(&cluster), before, "orphaned resources stay");
    let show = cluster.lyra.run(&["state", "show", "k8s/default/keep", "-o", "json"]);
    let forgotten = show.code == Some(1) || show.json()["resources"].as_array().is_some_and(Vec::is_empty);
    assert!(forgotten, "the state forgets them:\n{show}");
}

/// Acceptance 4: bad input stalls with a message naming the problem, without a retry storm,
/// and recovers once fixed.
#[test]
fn bad_input_stalls_without_a_retry_storm_and_recovers() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    cluster.lyra.write_workflow(
        "cycle",
        "steps:\n  a:\n    returns: {x: output}\n    resource: Null::Resource\n    value: {input: $y}\n  b:\n    returns: {y: output}\n    resource: Null::Resource\n    value: {input: $x}\n",
    );
    let controller = cluster.controller("c1", &[]);
    let cases = [
        ("unknown", "  workflowName: nosuch\n", "nosuch"),
        ("cyclic", "  workflowName: cycle\n", "cycle"),
        (
            "badtype",
            "  workflowName: webapp\n  data:\n    webapp: {region: mars, replicas: 2, cache: false}\n",
            "region",
        ),
    ];
    for (name, spec, needle) in cases {
        cluster.apply(&format!(
            "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}"
        ));
        let wf = cluster.wait_until_status(name, Duration::from_secs(60), |wf| condition_is(wf, "Stalled", "True"));
        let message = condition(&wf, "Stalled").unwrap()["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(
            message.contains(needle),
            "{name}: the message names the problem: {message}"
        );
        assert!(condition_is(&wf, "Ready", "False"), "{wf:#}");
        assert_eq!(wf["status"]["phase"], "Failed", "{wf:#}");
    }
    // No retry storm: a terminal error is not retried until the spec changes.
    let before = controller.metric("lyra_reconciles_total");
    std::thread::sleep(Duration::from_secs(4));
    let after = controller.metric("lyra_reconciles_total");
    assert!(
        after - before <= 3.0,
        "reconciles kept running on bad input: {before} -> {after}"
    );

    // A fix is picked up.
    cluster.apply(&webapp_object("unknown", 1, ""));
    cluster.wait_for("unknown", "condition=Ready", "90s");
    let wf = cluster.workflow("unknown");
    assert!(condition_is(&wf, "Stalled", "False"), "{wf:#}");
}

fn slow_object(name: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflowName: slow\n"
    )
}

/// Acceptance 5: the controller killed mid-apply converges when restarted, without
/// duplicates; the CLI is refused while the controller runs the deployment.
#[test]
fn a_killed_controller_converges_and_the_cli_is_refused_meanwhile() {
    let cluster = cluster_or_skip!();
    // Six sleeps of 700ms, two at a time: long enough to interfere with.
    cluster.lyra.write_workflow("slow", &sleepy_fleet_workflow(6, "700ms"));
    let mut first = cluster.controller("c1", &["--step-concurrency", "2"]);
    cluster.apply(&slow_object("slow"));
    // While it runs, the CLI cannot apply the same deployment.
    let holder = cluster.wait_until_status("slow", Duration::from_secs(30), |wf| {
        wf["status"]["leaseHolder"].is_string()
    });
    let refused = cluster.lyra.run(&["apply", "slow", "--name", "k8s/default/slow"]);
    refused.expect_code(3).expect_stderr(&["is locked", "controller/"]);
    assert!(
        holder["status"]["leaseHolder"]
            .as_str()
            .is_some_and(|h| h.starts_with("controller/")),
        "{holder:#}"
    );
    // Kill it mid-run, once something is recorded.
    let progressed = wait_until(Duration::from_secs(30), || {
        let run = cluster.lyra.run(&["state", "show", "k8s/default/slow", "-o", "json"]);
        run.code == Some(0) && run.json()["resources"].as_array().is_some_and(|r| !r.is_empty())
    });
    assert!(progressed, "{}", cluster.log("c1"));
    first.kill();
    let _second = cluster.controller("c2", &["--step-concurrency", "2"]);
    cluster.wait_for("slow", "condition=Ready", "120s");
    let instances = instance_ids(&cluster);
    assert_eq!(instances.len(), 6, "no duplicates after the restart: {instances:?}");
    let state = cluster.lyra.state("k8s/default/slow");
    assert_eq!(state["resources"].as_array().map(Vec::len), Some(12));
}

/// Acceptance 5: a provider failure makes Ready=False with the step's error, is retried with
/// backoff, and turns Ready once the fault clears, without a spec change.
#[test]
fn a_provider_failure_is_retried_until_it_clears() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    // The Foobernetes key file cannot be read while a directory stands in its place.
    std::fs::create_dir_all(cluster.lyra.path("deployment.json.lyra-keys")).expect("fault");
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(&webapp_object("flaky", 1, ""));
    let wf = cluster.wait_until_status("flaky", Duration::from_secs(60), |wf| {
        condition_is(wf, "Ready", "False")
            && wf["status"]["steps"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["lastError"].is_string()))
    });
    assert!(
        !condition_is(&wf, "Stalled", "True"),
        "a provider failure is retryable: {wf:#}"
    );
    let failing = wf["status"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["lastError"].is_string())
        .unwrap()
        .clone();
    assert!(
        failing["lastError"].as_str().unwrap().contains("lyra-keys"),
        "{failing:#}"
    );
    // Retried: attempts grow.
    cluster.wait_until_status("flaky", Duration::from_secs(60), |wf| {
        wf["status"]["steps"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["attempts"].as_i64().unwrap_or(0) >= 2))
    });
    std::fs::remove_dir(cluster.lyra.path("deployment.json.lyra-keys")).expect("clear the fault");
    cluster.wait_for("flaky", "condition=Ready", "120s");
    assert_eq!(instance_ids(&cluster).len(), 2);
}

/// Acceptance 6: with leader election only one replica reconciles; when it dies, the other
/// takes over.
#[test]
fn leader_election_lets_one_replica_reconcile() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    let mut a = cluster.controller("a", &["--leader-elect"]);
    // `a` leads before `b` starts.
    cluster.apply(&webapp_object("one", 1, ""));
    cluster.wait_for("one", "condition=Ready", "90s");
    let b = cluster.controller("b", &["--leader-elect"]);
    cluster.apply(&webapp_object("two", 1, ""));
    cluster.wait_for("two", "condition=Ready", "90s");
    assert!(a.metric("lyra_reconciles_total") >= 2.0);
    assert_eq!(
        b.metric("lyra_reconciles_total"),
        0.0,
        "the follower does not reconcile"
    );

    a.kill();
    cluster.apply(&webapp_object("three", 1, ""));
    cluster.wait_for("three", "condition=Ready", "120s");
    assert!(b.metric("lyra_reconciles_total") >= 1.0, "the follower took over");
}

/// SIGTERM stops the controller cleanly: the running apply's steps finish and are recorded,
/// the lease is released (the CLI can take it at once), and a new controller converges.
#[test]
fn sigterm_releases_the_lease_and_a_new_controller_converges() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("slow", &sleepy_fleet_workflow(6, "700ms"));
    let mut first = cluster.controller("c1", &["--step-concurrency", "2"]);
    cluster.apply(&slow_object("slow"));
    cluster.wait_until_status("slow", Duration::from_secs(30), |wf| {
        wf["status"]["leaseHolder"].is_string()
    });
    let code = first.terminate();
    assert_eq!(code, Some(0), "a graceful stop exits 0:\n{}", cluster.log("c1"));
    // No lease is left behind: a CLI plan and state list show none, and nothing is pending.
    let state = cluster.lyra.state("k8s/default/slow");
    assert!(state["lease"].is_null(), "the lease was released: {state:#}");
    assert!(
        state["resources"]
            .as_array()
            .is_some_and(|rs| rs.iter().all(|r| r["pending"] == false)),
        "running steps finished and were recorded: {state:#}"
    );
    let _second = cluster.controller("c2", &["--step-concurrency", "2"]);
    cluster.wait_for("slow", "condition=Ready", "120s");
    assert_eq!(instance_ids(&cluster).len(), 6);
}

/// `suspend: true` applies nothing; deleting a suspended object still cleans up.
#[test]
fn a_suspended_workflow_applies_nothing_but_can_be_deleted() {
    let cluster = cluster_or_skip!();
    install_webapp(&cluster);
    let controller = cluster.controller("c1", &[]);
    cluster.apply(&webapp_object("paused", 1, "  suspend: true\n"));
    let wf = cluster.wait_until_status("paused", Duration::from_secs(30), |wf| {
        wf["status"]["observedGeneration"] == 1
    });
    assert_ne!(wf["status"]["phase"], "Ready", "{wf:#}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(instance_ids(&cluster).is_empty(), "nothing applied while suspended");

    // Resumed: applied. Suspended again, then deleted: torn down all the same.
    cluster.apply(&webapp_object("paused", 1, "  suspend: false\n"));
    cluster.wait_for("paused", "condition=Ready", "90s");
    assert_eq!(instance_ids(&cluster).len(), 2);
    cluster.apply(&webapp_object("paused", 1, "  suspend: true\n"));
    cluster.wait_until_status("paused", Duration::from_secs(30), |wf| {
        wf["status"]["observedGeneration"] == 3
    });
    cluster.kubectl.ok(&["delete", "wf", "paused", "--timeout=60s"]);
    assert!(
        instance_ids(&cluster).is_empty(),
        "{}",
        cluster.lyra.read("deployment.json")
    );
    assert!(controller.metric("lyra_reconciles_total") >= 3.0);
}

/// Our own writes cause no work: an object is taken from created to Ready by one run, and
/// adding the finalizer and writing the status (several times) cause at most one more,
/// idle, reconcile (the finalizer's change), not one per write.
#[test]
fn our_own_finalizer_and_status_writes_cause_no_runs() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow(
        "one",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: 1}\n  b:\n    resource: Null::Resource\n    value: {input: 2}\n",
    );
    let controller = cluster.controller("c1", &[]);
    cluster.apply(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: quiet\n  namespace: default\nspec:\n  workflowName: one\n",
    );
    cluster.wait_for("quiet", "condition=Ready", "90s");
    std::thread::sleep(Duration::from_secs(2));
    let reconciles = controller.metric("lyra_reconciles_total");
    assert!(
        (1.0..=2.0).contains(&reconciles),
        "{reconciles} reconciles for one object"
    );
    let history = cluster.lyra.history("k8s/default/quiet");
    assert_eq!(history.len(), 1, "one run: {history:#?}");
}

//! `approval: Manual` through the real `kubectl`, `lyra-controller` and `lyra approve`: a plan
//! waits in the status and nothing is created until its hash is approved; an approval of a
//! plan that is no longer the plan does nothing (issue 15, "Approval on Kubernetes").

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Run, Value, cloud_ids, cluster_or_skip, run_command};

const VM: &str = "\
parameters:
  cpus: {type: Integer, lookup: cpus}
steps:
  vm:
    resource: Foobernetes::Instance
    value: {location: eu1, image: x, cpus: $cpus, memory: 1G}
";

fn object(cpus: u32) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: gated\n  namespace: default\n\
         spec:\n  workflowName: vm\n  approval: Manual\n  data:\n    cpus: {cpus}\n"
    )
}

fn condition<'a>(wf: &'a Value, kind: &str) -> Option<&'a Value> {
    wf["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn awaiting(wf: &Value, reason: &str) -> bool {
    condition(wf, "AwaitingApproval").is_some_and(|c| c["status"] == "True" && c["reason"] == reason)
}

fn instances(cluster: &Cluster) -> Vec<String> {
    cloud_ids(&cluster.cloud(), "Instances")
}

/// `lyra ARGS` with the emulator's KUBECONFIG.
fn lyra_k(cluster: &Cluster, args: &[&str]) -> Run {
    let mut cmd = cluster.lyra.command(args);
    cmd.env("KUBECONFIG", cluster.emulator.kubeconfig_path());
    run_command(cmd, args)
}

#[test]
fn a_manual_workflow_waits_for_the_approval_of_its_plan() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("vm", VM);
    let _controller = cluster.controller("c1", &[]);

    // Nothing to approve before the object exists, or while it waits on nothing.
    let none = lyra_k(&cluster, &["approve", "gated"]);
    none.expect_code(1);

    cluster.apply(&object(1));
    let wf = cluster.wait_until_status("gated", Duration::from_secs(90), |wf| awaiting(wf, "PlanReady"));
    let first = wf["status"]["plan"]["hash"]
        .as_str()
        .expect("status.plan.hash")
        .to_owned();
    assert!(first.starts_with("sha256:") && first.len() == 71, "{wf:#}");
    assert_eq!(wf["status"]["plan"]["create"], 1, "{wf:#}");
    assert_eq!(wf["status"]["plan"]["changes"][0]["step"], "vm", "{wf:#}");
    assert_eq!(wf["status"]["phase"], "Pending", "{wf:#}");
    assert!(
        condition(&wf, "Ready").is_some_and(|c| c["status"] == "False"),
        "{wf:#}"
    );
    // Shown by kubectl: the printer column, the condition and the event.
    let row = cluster.kubectl.ok(&["get", "wf", "gated"]);
    assert!(row.contains("APPROVAL") && row.contains("PlanReady"), "{row}");
    let described = cluster.kubectl.ok(&["describe", "wf", "gated"]);
    assert!(described.contains("AwaitingApproval"), "{described}");
    assert!(described.contains("awaits approval"), "{described}");
    // Nothing was created, and nothing is while it waits.
    std::thread::sleep(Duration::from_secs(2));
    assert!(instances(&cluster).is_empty(), "{:#}", cluster.cloud());
    assert!(cluster.lyra.run(&["state", "show", "k8s/default/gated"]).code != Some(0));

    // The spec moves, then someone approves the plan they saw before: a new plan waits, and
    // the stale approval applies nothing.
    cluster.apply(&object(2));
    let wf = cluster.wait_until_status("gated", Duration::from_secs(90), |wf| {
        wf["status"]["plan"]["generation"] == 2 && awaiting(wf, "PlanReady")
    });
    let second = wf["status"]["plan"]["hash"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    cluster.kubectl.ok(&[
        "annotate",
        "--overwrite",
        "wf",
        "gated",
        &format!("lyra.dev/approve-plan={first}"),
    ]);
    let wf = cluster.wait_until_status("gated", Duration::from_secs(60), |wf| awaiting(wf, "ApprovalStale"));
    assert_eq!(wf["status"]["plan"]["hash"], second.as_str(), "{wf:#}");
    let row = cluster.kubectl.ok(&["get", "wf", "gated"]);
    assert!(row.contains("ApprovalStale"), "{row}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(instances(&cluster).is_empty(), "{:#}", cluster.cloud());

    // `lyra approve` shows the plan it approves and sets the annotation to its hash.
    let approved = lyra_k(&cluster, &["approve", "gated", "-n", "default"]);
    approved.expect_ok();
    assert!(
        approved.stdout.contains("vm (Foobernetes::Instance) will be created"),
        "{approved}"
    );
    assert!(approved.stdout.contains("cpus = 2"), "{approved}");
    assert!(approved.stdout.contains(&second), "{approved}");
    cluster.wait_for("gated", "condition=Ready", "90s");
    let wf = cluster.workflow("gated");
    assert_eq!(wf["metadata"]["annotations"]["lyra.dev/approve-plan"], second.as_str());
    assert_eq!(wf["status"]["appliedPlan"], second.as_str(), "{wf:#}");
    assert!(wf["status"]["plan"].is_null(), "{wf:#}");
    assert!(
        condition(&wf, "AwaitingApproval").is_some_and(|c| c["status"] == "False"),
        "{wf:#}"
    );
    let ids = instances(&cluster);
    assert_eq!(ids.len(), 1, "{:#}", cluster.cloud());
    assert_eq!(
        cluster.cloud()["Instances"][&ids[0]]["Cpus"],
        2,
        "{:#}",
        cluster.cloud()
    );

    // Applied: nothing waits, so there is nothing to approve.
    let again = lyra_k(&cluster, &["approve", "gated", "-o", "json"]);
    again.expect_code(1);
    let doc: Value = serde_json::from_str(&again.stdout).expect("one JSON document");
    assert_eq!(doc["error"]["kind"], "not_awaiting", "{again}");
    assert!(super::json_output::schema_errors(&doc, "error").is_empty(), "{doc:#}");

    // A change of the applied object waits again; `-o json` approves without asking.
    cluster.apply(&object(3));
    let wf = cluster.wait_until_status("gated", Duration::from_secs(90), |wf| {
        wf["status"]["plan"]["generation"] == 3 && awaiting(wf, "PlanReady")
    });
    assert_eq!(wf["status"]["plan"]["update"], 1, "{wf:#}");
    let run = lyra_k(&cluster, &["approve", "gated", "-o", "json"]);
    run.expect_ok();
    let doc: Value = serde_json::from_str(&run.stdout).expect("one JSON document");
    let errors = super::json_output::schema_errors(&doc, "approve");
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
    assert_eq!(doc["hash"], wf["status"]["plan"]["hash"]);
    assert_eq!(doc["plan"]["changes"][0]["attributes"][0]["path"], "cpus", "{doc:#}");
    cluster.wait_until_status("gated", Duration::from_secs(90), |wf| {
        wf["status"]["observedGeneration"] == 3 && wf["status"]["phase"] == "Ready"
    });
    assert_eq!(
        cluster.cloud()["Instances"][&ids[0]]["Cpus"],
        3,
        "{:#}",
        cluster.cloud()
    );

    // Deleting is not gated: the finalizer's cleanup deletes the instance at once.
    cluster.kubectl.ok(&["delete", "wf", "gated", "--timeout=90s"]);
    assert!(instances(&cluster).is_empty(), "{:#}", cluster.cloud());
}

/// Waits until `check` holds for `kubectl get ARGS -o json`.
#[track_caller]
fn wait_json(cluster: &Cluster, args: &[&str], what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = integration_tests::wait_until(Duration::from_secs(90), || {
        let mut all = vec!["get"];
        all.extend(args);
        all.extend(["-o", "json"]);
        let out = cluster.kubectl.run(&all);
        last = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        out.success && check(&last)
    });
    assert!(ok, "{what}: never happened; last seen {last:#}\n{}", cluster.log("k1"));
    last
}

#[test]
fn an_object_of_a_registered_kind_waits_for_approval_too() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("vm", VM);
    let _controller = cluster.controller("k1", &[]);
    // A local package: the controller reads it from its own file system (no registry).
    cluster
        .lyra
        .ok(&["package", "vm", "--version", "1.0.0", "--out", "vm.tar"]);
    lyra_k(&cluster, &["register", "vm.tar", "--kind", "Vm"]).expect_ok();
    wait_json(&cluster, &["wfd", "vm"], "the definition Ready", |v| {
        v["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    });
    cluster.apply(
        "apiVersion: workflows.lyra.dev/v1alpha1\nkind: Vm\nmetadata:\n  name: box\n  namespace: default\n\
         spec:\n  cpus: 4\n  lyra: {approval: Manual}\n",
    );
    let vm = wait_json(&cluster, &["vm", "box"], "a plan awaiting approval", |v| {
        awaiting(v, "PlanReady")
    });
    let hash = vm["status"]["plan"]["hash"].as_str().unwrap().to_owned();
    let message = condition(&vm, "AwaitingApproval").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("--kind vms.workflows.lyra.dev"), "{message}");
    let row = cluster.kubectl.ok(&["get", "vm", "box"]);
    assert!(row.contains("PlanReady"), "{row}");
    assert!(instances(&cluster).is_empty(), "{:#}", cluster.cloud());

    let run = lyra_k(&cluster, &["approve", "box", "--kind", "Vm", "--yes"]);
    run.expect_ok();
    assert!(run.stdout.contains(&hash), "{run}");
    let vm = wait_json(&cluster, &["vm", "box"], "applied", |v| {
        v["status"]["phase"] == "Ready" && v["status"]["appliedPlan"] == hash.as_str()
    });
    assert!(vm["status"]["plan"].is_null(), "{vm:#}");
    assert_eq!(instances(&cluster).len(), 1, "{:#}", cluster.cloud());
}

/// `lyra approve ARGS` on a pseudo-terminal (util-linux `script`), typing `answer`: the exit
/// code and everything the terminal showed.
#[cfg(unix)]
fn approve_on_terminal(cluster: &Cluster, args: &str, answer: &str) -> (i32, String) {
    let kubeconfig = cluster.emulator.kubeconfig_path();
    let kubeconfig = kubeconfig.to_str().expect("utf-8");
    cluster
        .lyra
        .on_terminal(&format!("approve {args}"), answer, &[("KUBECONFIG", kubeconfig)])
}

#[cfg(unix)]
#[test]
fn approve_asks_on_a_terminal_and_only_yes_approves() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("vm", VM);
    let _controller = cluster.controller("t1", &[]);
    cluster.apply(&object(1));
    let wf = cluster.wait_until_status("gated", Duration::from_secs(90), |wf| awaiting(wf, "PlanReady"));
    let hash = wf["status"]["plan"]["hash"].as_str().unwrap().to_owned();

    let (code, shown) = approve_on_terminal(&cluster, "gated", "no\n");
    assert_eq!(code, 1, "{shown}");
    assert!(
        shown.contains("will be created") && shown.contains("Only 'yes' is accepted"),
        "{shown}"
    );
    assert!(shown.contains("approval cancelled"), "{shown}");
    let wf = cluster.workflow("gated");
    assert!(
        wf["metadata"]["annotations"]["lyra.dev/approve-plan"].is_null(),
        "{wf:#}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(instances(&cluster).is_empty(), "{:#}", cluster.cloud());

    let (code, shown) = approve_on_terminal(&cluster, "gated", "yes\n");
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains(&format!("approved plan {hash}")), "{shown}");
    cluster.wait_for("gated", "condition=Ready", "90s");
    assert_eq!(instances(&cluster).len(), 1, "{:#}", cluster.cloud());
}

const SECRET_VALUE: &str = "pl4n-s3cret-value";

const LOGIN: &str = "\
parameters:
  password: Sensitive[String]
steps:
  login:
    resource: Null::Resource
    value:
      input: $password
";

#[test]
fn a_published_plan_holds_no_secret() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("login", LOGIN);
    let _controller = cluster.controller("s1", &[]);
    cluster.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: login\n  namespace: default\n\
         spec:\n  workflowName: login\n  approval: Manual\n  data:\n    password: {SECRET_VALUE}\n"
    ));
    let wf = cluster.wait_until_status("login", Duration::from_secs(90), |wf| awaiting(wf, "PlanReady"));
    let plan = &wf["status"]["plan"];
    assert_eq!(plan["changes"][0]["attributes"][0]["new"], "(sensitive)", "{wf:#}");
    // What the controller wrote (the spec holds the value as the user wrote it).
    let status = wf["status"].to_string();
    assert!(!status.contains(SECRET_VALUE), "{status}");
    let events = cluster.kubectl.ok(&["get", "events", "-n", "default", "-o", "json"]);
    assert!(
        events.contains("awaits approval") && !events.contains(SECRET_VALUE),
        "{events}"
    );
    let run = lyra_k(&cluster, &["approve", "login", "-o", "json"]);
    run.expect_ok();
    assert!(
        !run.stdout.contains(SECRET_VALUE) && !run.stderr.contains(SECRET_VALUE),
        "{run}"
    );
    cluster.wait_for("login", "condition=Ready", "90s");
}

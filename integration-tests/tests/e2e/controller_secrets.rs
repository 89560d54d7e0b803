//! Secrets through the controller: a Workflow whose `spec.data` carries values for `Sensitive`
//! parameters is applied, updated (new secret) and deleted with kubectl; none of the secret
//! values may appear in what the controller writes: the status, the events (`kubectl
//! describe`, every Event object) and its logs at debug level. The object's own spec (and
//! kubectl's last-applied annotation) holds them, as the user wrote them; that is not the
//! controller's output and is left out of the search.

use std::time::Duration;

use integration_tests::cluster::Cluster;
use integration_tests::{Value, cluster_or_skip};

const VAULT: &str = "\
parameters:
  password: Sensitive[String]
  pin: Sensitive[Integer]
  size: String
returns: [secret_echo, pin_echo, plain]
steps:
  vm:
    returns: {ip: instanceIP}
    resource: Foobernetes::Instance
    value:
      location: eu1
      image: img
      cpus: 1
      memory: $size
  login:
    returns: {secret_echo: output}
    resource: Null::Resource
    value:
      input: $password
  lock:
    returns: {pin_echo: output}
    resource: Null::Resource
    value:
      input: {code: $pin, owner: $size}
  tag:
    returns: {plain: output}
    resource: Null::Resource
    value:
      input: $ip
";

const FIRST: &str = "hunter2-first-s3cret";
const SECOND: &str = "hunter2-second-s3cret";
const PIN: &str = "918273645";

fn object(password: &str, size: &str) -> String {
    object_of("vault", password, size)
}

fn object_of(workflow: &str, password: &str, size: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: vault\n  namespace: default\nspec:\n  workflowName: {workflow}\n  data:\n    password: {password}\n    pin: {PIN}\n    size: {size}\n"
    )
}

/// Everything the controller wrote about the object, as a user can read it.
fn controller_output(cluster: &Cluster) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let wf = cluster.kubectl.run(&["get", "wf", "vault", "-o", "json"]);
    if wf.success {
        let v: Value = serde_json::from_str(&wf.stdout).expect("JSON");
        out.push(("status".to_owned(), serde_json::to_string_pretty(&v["status"]).unwrap()));
        let described = cluster.kubectl.ok(&["describe", "wf", "vault"]);
        let events = described.split("Events:").nth(1).unwrap_or_default().to_owned();
        out.push(("kubectl describe (events)".to_owned(), events));
    }
    for resource in ["events", "events.events.k8s.io"] {
        out.push((
            format!("kubectl get {resource}"),
            cluster.kubectl.ok(&["get", resource, "-A", "-o", "json"]),
        ));
    }
    out.push(("controller log".to_owned(), cluster.log("c1")));
    out
}

#[track_caller]
fn assert_no_secret(cluster: &Cluster, stage: &str) {
    for (place, text) in controller_output(cluster) {
        for secret in [FIRST, SECOND, PIN] {
            if let Some(at) = text.find(secret) {
                let from = at.saturating_sub(300);
                let context = &text[from..(at + secret.len() + 100).min(text.len())];
                panic!("{stage}: the secret {secret:?} is in the {place}:\n...{context}...");
            }
        }
    }
}

#[test]
fn the_controller_never_writes_a_secret_to_status_events_or_logs() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("vault", VAULT);
    // The same, plus a step that fails with an error quoting the value it refused: the
    // password, which is no duration. The engine scrubs it from its report, which is all
    // the controller writes from.
    cluster.lyra.write_workflow(
        "bad",
        &format!("{VAULT}  wait:\n    resource: Time::Sleep\n    value:\n      create_duration: $password\n"),
    );
    let _controller = cluster.controller_logging("c1", &[], "debug");

    // Create.
    cluster.apply(&object(FIRST, "1G"));
    cluster.wait_for("vault", "condition=Ready", "90s");
    let wf = cluster.workflow("vault");
    assert_eq!(wf["status"]["returns"]["secret_echo"], "(sensitive)", "{wf:#}");
    assert_eq!(wf["status"]["returns"]["pin_echo"], "(sensitive)", "{wf:#}");
    assert!(wf["status"]["returns"]["plain"].is_string(), "{wf:#}");
    assert_no_secret(&cluster, "after the create");

    // Update: a new secret (and a plain change next to it).
    cluster.apply(&object(SECOND, "2G"));
    cluster.wait_until_status("vault", Duration::from_secs(90), |wf| {
        wf["status"]["observedGeneration"] == 2 && wf["status"]["phase"] == "Ready"
    });
    assert_no_secret(&cluster, "after the update");

    // A failing update, with the first secret back.
    cluster.apply(&object_of("bad", FIRST, "2G"));
    let failed = cluster.wait_until_status("vault", Duration::from_secs(90), |wf| {
        wf["status"]["observedGeneration"] == 3 && wf["status"]["phase"] == "Failed"
    });
    // The error is there, with the secret masked where it was quoted.
    assert!(
        failed["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("'(sensitive)' is not a duration")),
        "{failed:#}"
    );
    let wait = failed["status"]["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["name"] == "wait"))
        .unwrap_or_else(|| panic!("no row for the step 'wait': {failed:#}"));
    assert_eq!(wait["state"], "failed", "{failed:#}");
    assert!(
        wait["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("'(sensitive)' is not a duration")),
        "{failed:#}"
    );
    assert_no_secret(&cluster, "after a failed update");

    // Delete.
    cluster.kubectl.ok(&["delete", "wf", "vault", "--timeout=90s"]);
    assert_no_secret(&cluster, "after the delete");
    let log = cluster.log("c1");
    assert!(log.contains("\"level\":\"DEBUG\""), "the log is at debug level");
}

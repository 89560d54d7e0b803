//! Size limits (issue 9, item 16): the emulator refuses what a real API server refuses, with
//! its messages, as kubectl shows them; and the controller keeps a Workflow's status within a
//! budget whatever the workflow returns, saying what it left out.

use integration_tests::cluster_or_skip;

fn object_with_data(name: &str, bytes: usize) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflowName: echo\n  data:\n    blob: {}\n",
        "x".repeat(bytes)
    )
}

#[test]
fn oversized_objects_are_refused_with_the_api_servers_messages() {
    let cluster = cluster_or_skip!();
    let mb = 1024 * 1024;
    // A client-side apply copies the object into an annotation: 256 KiB is the limit.
    let applied = cluster
        .kubectl
        .run_with_stdin(&["apply", "-f", "-"], Some(&object_with_data("big", mb)));
    assert!(!applied.success, "{applied:?}");
    assert!(
        applied.stderr.contains("metadata.annotations: Too long")
            && applied.stderr.contains("262144 bytes")
            && applied.stderr.contains("The Workflow \"big\" is invalid"),
        "{}",
        applied.stderr
    );
    // Without the annotation the object itself is the limit: etcd's 1.5 MiB...
    let created = cluster
        .kubectl
        .run_with_stdin(&["create", "-f", "-"], Some(&object_with_data("big", 2 * mb)));
    assert!(!created.success, "{created:?}");
    assert!(
        created.stderr.contains("etcdserver: request is too large"),
        "{}",
        created.stderr
    );
    // ... and before that the request body's 3 MiB.
    let created = cluster
        .kubectl
        .run_with_stdin(&["create", "-f", "-"], Some(&object_with_data("big", 4 * mb)));
    assert!(!created.success, "{created:?}");
    assert!(
        created.stderr.contains("Request entity too large: limit is 3145728"),
        "{}",
        created.stderr
    );
    let gone = cluster.kubectl.run(&["get", "wf", "big"]);
    assert!(!gone.success && gone.stderr.contains("NotFound"), "{}", gone.stderr);
    // Server-side apply keeps no annotation: a 1 MiB spec fits.
    cluster
        .kubectl
        .ok_stdin(&["apply", "--server-side", "-f", "-"], &object_with_data("big", mb));
}

/// Sixteen returns of 100 KiB each: 1.6 MiB of returns, more than a whole object may hold.
fn echo_workflow() -> String {
    let mut y = String::from("parameters:\n  blob: {type: String, lookup: blob}\nreturns: [small");
    for i in 0..16 {
        y.push_str(&format!(", r{i:02}"));
    }
    y.push_str(
        "]\nsteps:\n  tiny:\n    returns: {small: output}\n    resource: Null::Resource\n    value: {input: hello}\n",
    );
    for i in 0..16 {
        y.push_str(&format!(
            "  s{i:02}:\n    returns: {{r{i:02}: output}}\n    resource: Null::Resource\n    value: {{input: $blob}}\n"
        ));
    }
    y
}

#[test]
fn huge_returns_are_left_out_of_the_status_and_named() {
    let cluster = cluster_or_skip!();
    cluster.lyra.write_workflow("echo", &echo_workflow());
    let _controller = cluster.controller("c1", &[]);
    cluster.apply(&object_with_data("echo", 100 * 1024));
    cluster.wait_for("echo", "condition=Ready", "120s");
    let wf = cluster.workflow("echo");
    let status = &wf["status"];
    assert_eq!(status["returns"], serde_json::json!({"small": "hello"}), "{status:#}");
    let omitted: Vec<&str> = status["returnsOmitted"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let expected: Vec<String> = (0..16).map(|i| format!("r{i:02}")).collect();
    assert_eq!(omitted, expected, "{status:#}");
    let ready = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .expect("a Ready condition");
    let message = ready["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("returns left out of the status (over its 64 KiB budget): r00, r01")
            && message.contains("lyra state show k8s/default/echo"),
        "{message}"
    );
    let size = serde_json::to_vec(status).unwrap().len();
    assert!(size < 64 * 1024, "the status is {size} bytes");
    // `kubectl get` shows the note too (the message column).
    let table = cluster.kubectl.ok(&["get", "wf", "echo"]);
    assert!(table.contains("returns left out"), "{table}");
    // Deleting it still works (the status is small enough to update).
    cluster.kubectl.ok(&["delete", "wf", "echo", "--timeout=60s"]);
    let gone = cluster.kubectl.run(&["get", "wf", "echo"]);
    assert!(!gone.success && gone.stderr.contains("NotFound"), "{}", gone.stderr);
}

//! Workflow names resolve strictly inside the load path: `..`, absolute paths and symbolic
//! links leading out are refused, for the CLI's WF argument, for `call:` targets and for a
//! Workflow object's `workflowName`, and the refused file is never read, so no message (stderr,
//! status, event) quotes it. The real `lyra`, `lyra-controller` and `kubectl`.

use std::time::Duration;

use integration_tests::{Lyra, Value, cluster_or_skip};

/// What a file outside the load path holds: a secret, and invalid YAML, so that a parse error
/// would quote it.
const OUTSIDE: &str = "password: hunter2-outside\nsteps: [unclosed\n";
const LEAK: &str = "hunter2-outside";

/// `secret.yaml` beside `workflows/` (outside the load path) and links inside the load path
/// that lead out of it: `evil.yaml` to the secret, `passwd.yaml` to `/etc/passwd`, `up` to the
/// working directory.
fn plant(lyra: &Lyra) {
    lyra.write("secret.yaml", OUTSIDE);
    lyra.write_workflow(
        "good",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: x}\n",
    );
    lyra.write(
        "workflows/team/web-v2_1.yaml",
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: y}\n",
    );
    let workflows = lyra.path("workflows");
    std::os::unix::fs::symlink(lyra.path("secret.yaml"), workflows.join("evil.yaml")).expect("link");
    std::os::unix::fs::symlink("/etc/passwd", workflows.join("passwd.yaml")).expect("link");
    std::os::unix::fs::symlink(lyra.dir(), workflows.join("up")).expect("link");
    // A link that stays inside is fine.
    std::os::unix::fs::symlink(workflows.join("team"), workflows.join("alias")).expect("link");
}

#[test]
fn cli_names_never_leave_the_load_path() {
    let lyra = Lyra::new();
    plant(&lyra);
    let absolute = lyra.path("secret");
    let absolute = absolute.to_str().expect("utf-8 path");
    let invalid = [
        "../secret",
        "..::secret",
        "team::..::..::secret",
        absolute,
        "a:b",
        "team::",
        "",
    ];
    for command in ["validate", "plan", "apply", "graph"] {
        for name in invalid {
            let run = lyra.run(&[command, name]);
            run.expect_code(2).expect_stderr(&["is not a workflow name"]);
            assert!(!run.stderr.contains(LEAK), "{run}");
        }
        for name in ["evil", "up::secret", "passwd"] {
            let run = lyra.run(&[command, name]);
            let path = format!("workflows/{}.yaml", name.replace("::", "/"));
            run.expect_code(2)
                .expect_stderr(&["leads outside the load path", &path]);
            assert!(!run.stderr.contains(LEAK) && !run.stderr.contains("root:"), "{run}");
        }
    }
    let run = lyra.run(&["validate", "../secret", "-o", "json"]);
    run.expect_code(2);
    assert!(!run.stdout.contains(LEAK) && !run.stderr.contains(LEAK), "{run}");
    // Names made of letters, digits, '_' and '-', links that stay inside, and files named as
    // files all work.
    lyra.ok(&["validate", "good"]);
    lyra.ok(&["validate", "team::web-v2_1"]);
    lyra.ok(&["validate", "alias::web-v2_1"]);
    lyra.ok(&["validate", "workflows/good.yaml"]);
    // Nothing was created or recorded by the refused runs.
    assert!(!lyra.path("deployment.json").exists());
}

#[test]
fn call_targets_never_leave_the_load_path() {
    let lyra = Lyra::new();
    plant(&lyra);
    for (target, message) in [
        ("../secret", "which is not a workflow name"),
        ("team::..::..::secret", "which is not a workflow name"),
        ("evil", "which cannot be loaded"),
        ("up::secret", "which cannot be loaded"),
    ] {
        lyra.write_workflow(
            "caller",
            &format!("steps:\n  x:\n    call: '{target}'\n  y:\n    call: good\n"),
        );
        for output in ["text", "json"] {
            let run = lyra.run(&["validate", "caller", "-o", output]);
            run.expect_code(1);
            let all = format!("{}{}", run.stdout, run.stderr);
            assert!(all.contains(message), "{target}: {run}");
            assert!(all.contains("workflows/caller.yaml"), "{target}: located: {run}");
            // A link out of the load path is named as such, not as an unknown workflow.
            if message.contains("cannot be loaded") {
                assert!(all.contains("leads outside the load path"), "{target}: why: {run}");
                assert!(!all.contains("not a known workflow"), "{target}: {run}");
            }
            assert!(!all.contains(LEAK), "{target}: {run}");
        }
    }
}

fn workflow_object(name: &str, workflow_name: &str) -> String {
    format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflowName: {}\n",
        serde_json::to_string(workflow_name).expect("a JSON string is a YAML string")
    )
}

fn stalled(wf: &Value) -> Option<&Value> {
    wf["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Stalled" && c["status"] == "True")
}

#[test]
fn workflow_names_on_kubernetes_never_leave_the_load_path() {
    let cluster = cluster_or_skip!();
    let lyra = &cluster.lyra;
    plant(lyra);
    let _controller = cluster.controller("c1", &[]);
    let absolute = lyra.path("secret");
    let cases = [
        (
            "dotdot",
            "../secret".to_owned(),
            "InvalidWorkflowName",
            "is not a workflow name",
        ),
        (
            "deep",
            "../../../../..".to_owned() + absolute.to_str().unwrap(),
            "InvalidWorkflowName",
            "is not a workflow name",
        ),
        (
            "absolute",
            absolute.display().to_string(),
            "InvalidWorkflowName",
            "is not a workflow name",
        ),
        (
            "segments",
            "team::..::..::secret".to_owned(),
            "InvalidWorkflowName",
            "is not a workflow name",
        ),
        (
            "link",
            "evil".to_owned(),
            "WorkflowOutsideLoadPath",
            "leads outside the load path",
        ),
        (
            "linkdir",
            "up::secret".to_owned(),
            "WorkflowOutsideLoadPath",
            "leads outside the load path",
        ),
        (
            "passwd",
            "passwd".to_owned(),
            "WorkflowOutsideLoadPath",
            "leads outside the load path",
        ),
    ];
    for (name, workflow_name, _, _) in &cases {
        cluster.apply(&workflow_object(name, workflow_name));
    }
    for (name, _, reason, needle) in &cases {
        let wf = cluster.wait_until_status(name, Duration::from_secs(60), |wf| stalled(wf).is_some());
        let condition = stalled(&wf).expect("stalled");
        assert_eq!(condition["reason"], *reason, "{name}: {wf:#}");
        let message = condition["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{name}: {message}");
        let status = wf["status"].to_string();
        assert!(!status.contains(LEAK) && !status.contains("root:"), "{name}: {wf:#}");
        assert!(
            wf["status"]["steps"].as_array().is_none_or(Vec::is_empty),
            "{name}: ran: {wf:#}"
        );
    }
    // Events and describe say the same, without the contents either.
    let events = cluster.kubectl.ok(&["get", "events.events.k8s.io", "-o", "json"]);
    assert!(events.contains("not a workflow name"), "{events}");
    assert!(events.contains("leads outside the load path"), "{events}");
    assert!(!events.contains(LEAK) && !events.contains("root:"), "{events}");
    let described = cluster.kubectl.ok(&["describe", "wf", "link"]);
    assert!(!described.contains(LEAK), "{described}");
    assert!(
        !cluster.log("c1").contains(LEAK),
        "the controller's log quotes the file:\n{}",
        cluster.log("c1")
    );

    // A name inside the load path still works, through a link that stays inside too.
    cluster.apply(&workflow_object("fine", "alias::web-v2_1"));
    cluster.wait_for("fine", "condition=Ready", "90s");
}

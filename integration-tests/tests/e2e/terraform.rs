//! Terraform providers through the bridge, from the binaries: HashiCorp's real
//! `terraform-provider-null` v2.1.2 (protocol 5, go-plugin with automatic mutual TLS; installed
//! by `.ci/tools`) and `lyra-terraform`'s protocol-6 test provider `terraform-provider-lyratest`
//! (a file per resource, with faults on demand), each in `plugins/` beside the load path.

use std::path::PathBuf;
use std::time::Duration;

use integration_tests::{Lyra, cluster_or_skip, tf_test_provider_bin, tools::tool_or_skip, wait_until};

const NULL: &str = "terraform-provider-null_v2.1.2_x4";

/// A chain of two null resources: the second's triggers hold the first's id.
const NULLS: &str = "\
parameters:
  rev: {type: String, lookup: rev, default: '1'}
returns: [firstID]
steps:
  first:
    resource: TfNull::Resource
    value:
      triggers: {rev: $rev}
    returns:
      firstID: id
  second:
    resource: TfNull::Resource
    value:
      triggers: {after: $firstID}
";

fn install(lyra: &Lyra, from: &std::path::Path, name: &str) {
    std::fs::create_dir_all(lyra.path("plugins")).expect("plugins dir");
    std::fs::copy(from, lyra.path("plugins").join(name)).expect("copy the provider");
}

fn null_or_skip(test: &str) -> Option<PathBuf> {
    tool_or_skip(test, NULL)
}

#[test]
fn the_null_provider_runs_a_workflow_from_the_cli() {
    let Some(null) = null_or_skip("the_null_provider_runs_a_workflow_from_the_cli") else {
        return;
    };
    let lyra = Lyra::new();
    install(&lyra, &null, NULL);
    lyra.write_workflow("nulls", NULLS);

    let listed = lyra.ok_json(&["providers", "TfNull"]);
    let text = listed.to_string();
    assert!(
        text.contains("TfNull::Resource") && text.contains("triggers"),
        "{listed:#}"
    );

    // Validation knows the provider's schema.
    lyra.write_workflow("typo", &NULLS.replace("triggers: {rev", "trigers: {rev"));
    lyra.run(&["validate", "typo"])
        .expect_code(1)
        .expect_stderr(&["unknown attribute 'trigers' for TfNull::Resource"]);

    let first = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(first["counts"]["created"], 2, "{first:#}");
    let ids = lyra.resources("nulls");
    assert!(ids["first"].chars().all(|c| c.is_ascii_digit()), "{ids:?}");
    assert_eq!(first["returns"]["firstID"], ids["first"].as_str());

    let again = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(again["counts"]["unchanged"], 2, "{again:#}");

    // A change of triggers: the provider's own plan says replace, for both (the second's
    // triggers hold the first's id, known only after the apply).
    let plan = lyra.ok(&["plan", "nulls", "--var", "rev=2"]);
    assert!(
        plan.stdout.contains("first (TfNull::Resource) will be replaced"),
        "{plan}"
    );
    assert!(plan.stdout.contains("forces replacement"), "{plan}");
    let replaced = lyra.ok_json(&["apply", "nulls", "--var", "rev=2"]);
    let new_ids = lyra.resources("nulls");
    assert_eq!(
        integration_tests::step(&replaced, "first")["action"],
        "replace",
        "{replaced:#}"
    );
    // null_resource ids are Go's math/rand from its fixed seed (provider v2.1.2): a fresh
    // process draws the same first id again. The second follows the first exactly: replaced
    // when the id it holds changed, untouched when it came out the same.
    if new_ids["first"] == ids["first"] {
        assert_eq!(replaced["counts"]["unchanged"], 1, "{replaced:#}");
        assert_eq!(new_ids["second"], ids["second"]);
    } else {
        assert_eq!(replaced["counts"]["replaced"], 2, "{replaced:#}");
        assert_ne!(new_ids["second"], ids["second"]);
    }

    let deleted = lyra.ok_json(&["delete", "nulls"]);
    assert_eq!(deleted["counts"]["deleted"], 2, "{deleted:#}");
}

/// The protocol-6 provider: files under `root`.
fn files_workflow(lyra: &Lyra, path: &str, content: &str) -> String {
    format!(
        "\
parameters:
  token: {{type: 'Sensitive[String]', lookup: token}}
providers:
  TfLyratest: {{root: '{root}', token: $token}}
returns: [length]
steps:
  file:
    resource: TfLyratest::File
    value:
      path: {path}
      content: '{content}'
      secret: $token
    returns:
      length: length
",
        root = lyra.path("files").display()
    )
}

const TOKEN: &str = "s3cret";

#[test]
fn the_protocol_6_provider_updates_replaces_and_corrects_drift() {
    let lyra = Lyra::new();
    install(&lyra, &tf_test_provider_bin(), "terraform-provider-lyratest");
    lyra.write("data.yaml", format!("token: {TOKEN}\n"));
    let mut outputs = Vec::new();

    lyra.write_workflow("files", &files_workflow(&lyra, "a.txt", "one"));
    let created = lyra.ok_json(&["apply", "files"]);
    assert_eq!(created["counts"]["created"], 1, "{created:#}");
    assert_eq!(created["returns"]["length"], 3, "known after apply: {created:#}");
    assert_eq!(lyra.read("files/a.txt"), "one");
    outputs.push(created.to_string());

    let again = lyra.ok_json(&["apply", "files"]);
    assert_eq!(again["counts"]["unchanged"], 1, "{again:#}");

    lyra.write_workflow("files", &files_workflow(&lyra, "a.txt", "two!"));
    let updated = lyra.ok_json(&["apply", "files"]);
    assert_eq!(updated["counts"]["updated"], 1, "in place: {updated:#}");
    assert_eq!(lyra.read("files/a.txt"), "two!");
    outputs.push(updated.to_string());

    lyra.write_workflow("files", &files_workflow(&lyra, "b.txt", "two!"));
    let plan = lyra.ok(&["plan", "files"]);
    assert!(plan.stdout.contains("forces replacement"), "{plan}");
    outputs.push(plan.stdout);
    let replaced = lyra.ok_json(&["apply", "files"]);
    assert_eq!(replaced["counts"]["replaced"], 1, "{replaced:#}");
    assert!(
        !lyra.path("files/a.txt").exists(),
        "the old file went with the old resource"
    );
    assert_eq!(lyra.read("files/b.txt"), "two!");

    // Drift: the provider reads the file back.
    std::fs::write(lyra.path("files/b.txt"), "edited by hand").expect("edit");
    let drift = lyra.ok(&["plan", "files"]);
    assert!(
        drift.stdout.contains("content") && drift.stdout.contains("edited by hand"),
        "{drift}"
    );
    outputs.push(drift.stdout);
    let corrected = lyra.ok_json(&["apply", "files"]);
    assert_eq!(corrected["counts"]["updated"], 1, "{corrected:#}");
    assert_eq!(lyra.read("files/b.txt"), "two!");

    outputs.push(lyra.ok(&["state", "show", "files", "-o", "json"]).stdout);
    outputs.push(lyra.ok(&["state", "show", "files"]).stdout);
    outputs.push(lyra.ok(&["history", "files", "-o", "json"]).stdout);
    let deleted = lyra.ok_json(&["delete", "files"]);
    assert_eq!(deleted["counts"]["deleted"], 1, "{deleted:#}");
    assert!(!lyra.path("files/b.txt").exists());
    outputs.push(deleted.to_string());
    for out in &outputs {
        assert!(
            !out.contains(TOKEN),
            "the sensitive setting and attribute are never shown: {out}"
        );
    }
    // The search would find it: the token is in the data file.
    assert!(lyra.read("data.yaml").contains(TOKEN));
}

#[test]
fn a_provider_that_dies_mid_call_fails_only_its_own_steps() {
    let lyra = Lyra::new();
    install(&lyra, &tf_test_provider_bin(), "terraform-provider-lyratest");
    lyra.write("data.yaml", format!("token: {TOKEN}\n"));
    let workflow = |content: &str| {
        files_workflow(&lyra, "a.txt", content).replace(
            "steps:\n",
            "steps:\n  other:\n    resource: Null::Resource\n    value: {}\n",
        )
    };
    lyra.write_workflow("files", &workflow("die:now"));
    let failed = lyra.run(&["apply", "files", "-o", "json"]);
    failed.expect_code(1);
    let report = failed.json();
    assert_eq!(report["counts"]["created"], 1, "the other step: {report:#}");
    let text = report.to_string();
    assert!(
        text.contains("terraform provider lyratest"),
        "names the provider: {report:#}"
    );
    assert!(text.contains("the provider exited"), "{report:#}");
    assert!(!lyra.path("files/a.txt").exists());

    // The next run starts the provider afresh.
    lyra.write_workflow("files", &workflow("fine"));
    let fixed = lyra.ok_json(&["apply", "files"]);
    assert_eq!(fixed["counts"]["created"], 1, "{fixed:#}");
    assert_eq!(fixed["counts"]["unchanged"], 1, "{fixed:#}");
    assert_eq!(lyra.read("files/a.txt"), "fine");
}

/// Whether process `pid` is gone (or a zombie).
fn dead(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

#[test]
fn a_crash_between_create_and_record_is_reported_and_leaves_no_provider_behind() {
    let lyra = Lyra::new();
    install(&lyra, &tf_test_provider_bin(), "terraform-provider-lyratest");
    lyra.write("data.yaml", format!("token: {TOKEN}\n"));
    // `hang:` makes the provider create the file, then never answer.
    lyra.write_workflow("files", &files_workflow(&lyra, "a.txt", "hang:here"));
    let mut child = lyra.spawn("hang", &["apply", "files"]);
    let marker = lyra.path("files/a.txt.applied");
    // The marker exists before its pid is written in it: waited for until it holds one.
    let pid = || -> Option<u32> { std::fs::read_to_string(&marker).ok()?.trim().parse().ok() };
    assert!(
        wait_until(Duration::from_secs(30), || pid().is_some()),
        "the provider created the file: {:?}",
        lyra.spawned_output("hang")
    );
    let provider_pid = pid().expect("a pid");
    child.kill().expect("kill -9 lyra");
    let _ = child.wait();
    assert!(
        wait_until(Duration::from_secs(10), || dead(provider_pid)),
        "the provider process {provider_pid} died with lyra"
    );

    // The resource was made but not recorded: the next run says so instead of making another.
    lyra.write_workflow("files", &files_workflow(&lyra, "a.txt", "fine"));
    // The killed run's lease is taken over (it ended on this machine); the timeout is only
    // a margin.
    let next = lyra.run(&["apply", "files", "--lock-timeout", "90s"]);
    next.expect_code(1)
        .expect_stderr(&["'file' was possibly created, unrecorded", "TfLyratest::File"]);
    assert_eq!(lyra.read("files/a.txt"), "hang:here", "nothing was made twice");
    // What it says to run, then the run converges.
    let forget = next
        .stderr
        .split("then run ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("a command to forget the record")
        .trim()
        .trim_end_matches('.')
        .trim_matches('`')
        .to_owned();
    let words: Vec<&str> = forget.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"lyra"), "{forget}");
    lyra.ok(&words[1..]);
    let converged = lyra.ok_json(&["apply", "files"]);
    assert_eq!(converged["counts"]["created"], 1, "{converged:#}");
    assert_eq!(lyra.read("files/a.txt"), "fine");
}

/// The CLI applies a deployment through both providers; the controller, on the same state,
/// takes it over with nothing to do, applies a data change, and deletes everything when the
/// Workflow object goes.
#[test]
fn terraform_providers_serve_the_cli_then_the_controller_on_the_same_state() {
    let Some(null) = null_or_skip("terraform_providers_serve_the_cli_then_the_controller") else {
        return;
    };
    let cluster = cluster_or_skip!();
    let lyra = &cluster.lyra;
    install(lyra, &null, NULL);
    install(lyra, &tf_test_provider_bin(), "terraform-provider-lyratest");
    let root = lyra.path("files");
    let workflow = format!(
        "{NULLS}  file:\n    resource: TfLyratest::File\n    value:\n      path: shared.txt\n      content: $firstID\nproviders:\n  TfLyratest: {{root: '{}'}}\n",
        root.display()
    );
    lyra.write_workflow("tf", &workflow);
    let deployment = "k8s/default/tf";
    let applied = lyra.ok_json(&["apply", "tf", "--name", deployment]);
    assert_eq!(applied["counts"]["created"], 3, "{applied:#}");
    let ids = lyra.resources(deployment);
    assert_eq!(lyra.read("files/shared.txt"), ids["first"]);

    let _controller = cluster.controller("c1", &[]);
    cluster.apply("apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: tf\n  namespace: default\nspec:\n  workflowName: tf\n");
    cluster.wait_for("tf", "condition=Ready", "60s");
    assert_eq!(lyra.resources(deployment), ids, "the controller changed nothing");
    let history = lyra.history(deployment);
    assert_eq!(history.len(), 2, "the CLI's run and the controller's: {history:#?}");
    let last = history
        .iter()
        .max_by_key(|r| r["id"].as_i64())
        .expect("the controller's run");
    assert_eq!(last["counts"]["created"], 0, "{last:#}");
    assert_eq!(last["counts"]["unchanged"], 3, "{last:#}");

    // A data change: the first is replaced (its id may come out the same: see
    // `the_null_provider_runs_a_workflow_from_the_cli`), and what holds its id follows.
    cluster.apply("apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: tf\n  namespace: default\nspec:\n  workflowName: tf\n  data:\n    rev: '2'\n");
    let replaced_first = |runs: &[serde_json::Value]| {
        runs.iter().any(|r| {
            r["changes"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["step"] == "first" && c["action"] == "replace"))
        })
    };
    let moved = wait_until(Duration::from_secs(120), || {
        let now = lyra.resources(deployment);
        replaced_first(&lyra.history(deployment))
            && std::fs::read_to_string(root.join("shared.txt")).is_ok_and(|t| t == now["first"])
    });
    assert!(
        moved,
        "the controller applied the change: {:?}\n{}",
        lyra.resources(deployment),
        cluster
            .kubectl
            .run(&["get", "workflow", "tf", "-n", "default", "-o", "yaml"])
            .stdout
    );

    cluster
        .kubectl
        .ok(&["delete", "workflow", "tf", "--wait=true", "--timeout=60s"]);
    let gone = wait_until(Duration::from_secs(30), || !root.join("shared.txt").exists());
    assert!(gone, "deleting the object deleted the file through the provider");
}

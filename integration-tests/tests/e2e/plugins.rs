//! Provider plugins from the binaries: `lyra-provider-<name>` executables in `plugins/` beside
//! the load path (or `--plugins`, `LYRA_PLUGIN_PATH`) serve their types to the CLI and the
//! controller like the built-in ones; one that cannot start is named in a warning and
//! affects nothing else. Against `lyra-plugin`'s example plugin, a real process.

use std::time::Duration;

use integration_tests::{Lyra, cluster_or_skip, example_plugin_bin};

const THINGS: &str = "\
providers:
  Example:
    file: things.json
returns: [thingID]
steps:
  one:
    resource: Example::Thing
    value:
      name: first
      value: {a: 1}
    returns:
      thingID: id
";

fn install_plugin(lyra: &Lyra, dir: &str) {
    let target = lyra.path(dir).join("lyra-provider-example");
    std::fs::create_dir_all(lyra.path(dir)).expect("plugin dir");
    std::fs::copy(example_plugin_bin(), &target).expect("copy the plugin");
}

#[test]
fn a_plugin_beside_the_load_path_serves_the_cli() {
    let lyra = Lyra::new();
    lyra.write_workflow("things", THINGS);
    install_plugin(&lyra, "plugins");
    // A broken plugin beside it: named in a warning, nothing else changes.
    lyra.write("plugins/lyra-provider-broken", "#!/bin/sh\necho not-a-handshake\n");
    std::process::Command::new("chmod")
        .args(["+x", lyra.path("plugins/lyra-provider-broken").to_str().unwrap()])
        .status()
        .expect("chmod");

    let listed = lyra.ok(&["providers", "Example"]);
    assert!(listed.stdout.contains("Example::Thing"), "{listed}");
    assert!(
        listed.stderr.contains("plugin broken") && listed.stderr.contains("not a handshake line"),
        "{listed}"
    );
    let first = lyra.ok_json(&["apply", "things"]);
    assert_eq!(first["counts"]["created"], 1, "{first:#}");
    let things: serde_json::Value = serde_json::from_str(&lyra.read("things.json")).expect("the plugin's file");
    assert_eq!(things[first["returns"]["thingID"].as_str().unwrap()]["name"], "first");
    let again = lyra.ok_json(&["apply", "things"]);
    assert_eq!(again["counts"]["unchanged"], 1, "{again:#}");
    // Validation knows the plugin's schema.
    lyra.write_workflow("bad", &THINGS.replace("name: first", "nmae: first"));
    let bad = lyra.run(&["validate", "bad"]);
    bad.expect_code(1);
    assert!(
        bad.stderr.contains("unknown attribute 'nmae' for Example::Thing"),
        "{bad}"
    );
    // Packaged like any workflow: the plugin's types validate there too.
    lyra.ok(&["package", "things", "--version", "1.0.0", "--out", "things.tar"]);
    // Deleted from the state alone, through the plugin.
    lyra.ok(&["delete", "things"]);
    assert_eq!(lyra.read("things.json").trim(), "{}");
}

#[test]
fn the_controller_runs_workflows_through_a_plugin() {
    let cluster = cluster_or_skip!();
    install_plugin(&cluster.lyra, "my-plugins");
    let dir = cluster.lyra.path("my-plugins");
    let _controller = cluster.controller("c1", &["--plugins", dir.to_str().expect("utf-8 path")]);
    let file = cluster.lyra.path("controller-things.json");
    cluster.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: things\n  namespace: default\nspec:\n  workflow:\n    providers:\n      Example:\n        file: {}\n    steps:\n      one:\n        resource: Example::Thing\n        value:\n          name: from-k8s\n",
        file.display()
    ));
    cluster.wait_for("things", "condition=Ready", "60s");
    let things: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("written")).expect("JSON");
    assert!(things.to_string().contains("from-k8s"), "{things}");
    cluster
        .kubectl
        .ok(&["delete", "workflow", "things", "--wait=true", "--timeout=60s"]);
    let emptied = integration_tests::wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&file).is_ok_and(|t| t.trim() == "{}")
    });
    assert!(emptied, "the cleanup deleted the thing through the plugin");
}

/// A plugin in another language: `integration-tests/plugins/lyra-provider-pynotes`, Python
/// with grpcio, its stubs made from the `.proto` by grpcio-tools' protoc (both installed by
/// `.ci/tools`). Applied, re-applied with no change, updated, validated against its schema and
/// deleted from the CLI; then a Workflow through the controller.
#[test]
fn a_python_plugin_serves_the_cli_and_the_controller() {
    let Some(python) = integration_tests::tools::tool_or_skip("a_python_plugin", "python-grpc") else {
        return;
    };
    let cluster = cluster_or_skip!();
    let lyra = &cluster.lyra;
    // The stubs, from the contract itself.
    let stubs = lyra.path("py-stubs");
    std::fs::create_dir_all(&stubs).expect("stubs dir");
    let proto = integration_tests::workspace_dir().join("crates/lyra-plugin/proto");
    let status = std::process::Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(&proto)
        .arg(format!("--python_out={}", stubs.display()))
        .arg(format!("--grpc_python_out={}", stubs.display()))
        .arg("lyra/plugin/v1/provider.proto")
        .status()
        .expect("run grpc_tools.protoc");
    assert!(status.success(), "protoc made the Python stubs");
    let script = integration_tests::workspace_dir().join("integration-tests/plugins/lyra-provider-pynotes");
    lyra.write(
        "plugins/lyra-provider-pynotes",
        format!(
            "#!/bin/sh\nLYRA_PY_STUBS='{}' exec '{}' '{}' \"$@\"\n",
            stubs.display(),
            python.display(),
            script.display()
        ),
    );
    std::process::Command::new("chmod")
        .args(["+x", lyra.path("plugins/lyra-provider-pynotes").to_str().unwrap()])
        .status()
        .expect("chmod");
    let notes = lyra.path("notes.json");
    let workflow = format!(
        "providers:\n  Pynotes: {{file: '{}'}}\nsteps:\n  hello:\n    resource: Pynotes::Note\n    value: {{title: hello, text: TEXT}}\n",
        notes.display()
    );
    lyra.write_workflow("notes", &workflow.replace("TEXT", "hi"));
    let first = lyra.ok_json(&["apply", "notes"]);
    assert_eq!(first["counts"]["created"], 1, "{first:#}");
    let again = lyra.ok_json(&["apply", "notes"]);
    assert_eq!(again["counts"]["unchanged"], 1, "{again:#}");
    lyra.write_workflow("notes", &workflow.replace("TEXT", "hello there"));
    let update = lyra.ok_json(&["apply", "notes"]);
    assert_eq!(update["counts"]["updated"], 1, "{update:#}");
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&notes).unwrap()).unwrap();
    assert_eq!(stored["note-hello"]["text"], "hello there", "{stored}");
    // Validation uses the plugin's schema.
    lyra.write_workflow("nonote", &workflow.replace("title: hello, ", ""));
    let bad = lyra.run(&["validate", "nonote"]);
    bad.expect_code(1);
    assert!(
        bad.stderr
            .contains("does not set 'title', which Pynotes::Note requires"),
        "{bad}"
    );
    lyra.ok(&["delete", "notes"]);
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&notes).unwrap()).unwrap();
    assert_eq!(stored, serde_json::json!({}));

    // The controller, with the same plugin directory.
    let dir = lyra.path("plugins");
    let _controller = cluster.controller("c1", &["--plugins", dir.to_str().expect("utf-8 path")]);
    cluster.apply(&format!(
        "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: notes\n  namespace: default\nspec:\n  workflow:\n    providers:\n      Pynotes:\n        file: {}\n    steps:\n      k8s:\n        resource: Pynotes::Note\n        value:\n          title: from-k8s\n",
        notes.display()
    ));
    cluster.wait_for("notes", "condition=Ready", "60s");
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&notes).unwrap()).unwrap();
    assert_eq!(stored["note-from-k8s"]["title"], "from-k8s", "{stored}");
}

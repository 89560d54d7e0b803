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

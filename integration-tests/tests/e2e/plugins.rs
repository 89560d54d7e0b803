//! Provider plugins from the binaries: `lyra-provider-<name>` executables in `plugins/` beside
//! the load path (or `--plugins`, `LYRA_PLUGIN_PATH`) serve their types to the CLI and the
//! controller like the built-in ones; one that cannot start is named in a warning and
//! affects nothing else. Against `lyra-plugin`'s example plugin, a real process.
//!
//! Faults (issue 14): a plugin that crashes, hangs past a step's `timeout:` or speaks another
//! protocol version fails only its own steps, with a message naming it; no plugin outlives a
//! killed `lyra`; the controller restarts a plugin that crashed. The example misbehaves on
//! demand through the `LYRA_EXAMPLE_*` variables its docs list, set by a wrapper script.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use integration_tests::{Lyra, cluster_or_skip, count, example_plugin_bin, step, wait_until};

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

/// Writes an executable script. Written by another process, so that no descriptor open for
/// writing leaks into a process forked meanwhile (exec would fail with ETXTBSY).
fn executable(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("plugin dir");
    let status = std::process::Command::new("sh")
        .args([
            "-c",
            r#"printf '%s\n' "$1" > "$2.tmp" && chmod +x "$2.tmp" && mv "$2.tmp" "$2""#,
            "sh",
        ])
        .arg(format!("#!/bin/sh\n{body}"))
        .arg(path)
        .status()
        .expect("sh runs");
    assert!(status.success());
}

/// `DIR/lyra-provider-NAME`: the example plugin run with `env` (`VAR=value ...`), appending
/// its pid to `DIR/NAME.starts` each time it starts. Returns the script's path.
fn install_wrapper(dir: &Path, name: &str, env: &str) -> PathBuf {
    let path = dir.join(format!("lyra-provider-{name}"));
    let starts = dir.join(format!("{name}.starts"));
    executable(
        &path,
        &format!(
            "echo $$ >> '{}'\n{env} exec '{}' \"$@\"",
            starts.display(),
            example_plugin_bin().display()
        ),
    );
    path
}

/// How many times the wrapper `name` in `dir` was started.
fn starts(dir: &Path, name: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("{name}.starts"))).map_or(0, |t| t.lines().count())
}

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Waits for a spawned `lyra` to end by itself, failing (after killing it) if it does not
/// within `limit`: a guard against hanging, not a measure of speed.
#[track_caller]
fn wait_ended(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let mut status = None;
    wait_until(limit, || {
        status = child.try_wait().expect("wait for lyra");
        status.is_some()
    });
    status.unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("lyra did not end within {limit:?}");
    })
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

    // `Example::Null`, the benchmark's plugin type: no settings, `output` echoes `input`
    // through the wire and back, and an edit is an update, not a replace.
    let nulls = "returns: [echo]\nsteps:\n  n:\n    resource: Example::Null\n    value:\n      input: {a: [1, 2]}\n    returns:\n      echo: output\n";
    lyra.write_workflow("nulls", nulls);
    let made = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(made["counts"]["created"], 1, "{made:#}");
    assert_eq!(made["returns"]["echo"], serde_json::json!({"a": [1, 2]}), "{made:#}");
    lyra.write_workflow("nulls", &nulls.replace("[1, 2]", "[3]"));
    let edited = lyra.ok_json(&["apply", "nulls"]);
    assert_eq!(edited["counts"]["updated"], 1, "{edited:#}");
    assert_eq!(edited["returns"]["echo"], serde_json::json!({"a": [3]}), "{edited:#}");
    lyra.ok(&["delete", "nulls"]);
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
    let emptied = wait_until(Duration::from_secs(30), || {
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

/// A thing on the example plugin beside a `Null::Resource`, independent of each other.
const THING_AND_NULL: &str = "\
providers:
  Example:
    file: things.json
steps:
  thing:
    resource: Example::Thing
    value:
      name: NAME
  null:
    resource: Null::Resource
    value:
      input: hello
";

#[test]
fn a_plugin_that_crashes_fails_only_its_own_steps() {
    let lyra = Lyra::new();
    let plugins = lyra.path("plugins");
    let plugin = install_wrapper(&plugins, "crashy", "LYRA_EXAMPLE_CRASH_ON=boom");
    lyra.write_workflow("w", &THING_AND_NULL.replace("NAME", "boom"));

    let run = lyra.run(&["apply", "w", "-o", "json"]);
    run.expect_code(1);
    let report = run.json();
    assert_eq!(report["outcome"], "failed", "{report:#}");
    assert_eq!(step(&report, "null")["status"], "done", "{report:#}");
    let thing = step(&report, "thing");
    assert_eq!(thing["status"], "failed", "{report:#}");
    let error = thing["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("plugins/lyra-provider-crashy"),
        "names the plugin: {error}"
    );
    assert!(
        error.contains("the plugin exited (signal: 6 (SIGABRT))"),
        "says it exited: {error}"
    );
    let recorded = lyra.resources("w");
    assert_eq!(
        recorded.keys().collect::<Vec<_>>(),
        ["null"],
        "the Null step is recorded, the failed one is not"
    );

    // Fixed: the next apply converges.
    install_wrapper(&plugins, "crashy", "");
    let fixed = lyra.ok_json(&["apply", "w"]);
    assert_eq!(
        (count(&fixed, "created"), count(&fixed, "unchanged")),
        (1, 1),
        "{fixed:#}"
    );
    let things: serde_json::Value = serde_json::from_str(&lyra.read("things.json")).expect("the plugin's file");
    assert!(things.to_string().contains("\"boom\""), "{things}");
    assert_eq!(lyra.resources("w").get("null"), recorded.get("null"));
    assert!(plugin.is_file());
}

#[test]
fn a_plugin_that_hangs_past_the_step_timeout_fails_only_that_step() {
    let lyra = Lyra::new();
    install_wrapper(&lyra.path("plugins"), "hangs", "LYRA_EXAMPLE_HANG_ON=stuck");
    lyra.write_workflow(
        "w",
        &format!(
            "{}  stuck:\n    resource: Example::Thing\n    value:\n      name: stuck\n    timeout: 2s\n",
            THING_AND_NULL.replace("NAME", "fine")
        ),
    );
    let mut child = lyra.spawn("apply", &["apply", "w", "-o", "json"]);
    let status = wait_ended(&mut child, Duration::from_secs(30));
    let (stdout, stderr) = lyra.spawned_output("apply");
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let stuck = step(&report, "stuck");
    assert_eq!(stuck["status"], "failed", "{report:#}");
    let error = stuck["error"].as_str().unwrap_or_default();
    assert!(error.contains("timed out after 2s"), "{error}");
    assert!(error.contains("w.yaml"), "names the step's place: {error}");
    // The same plugin served the other thing meanwhile.
    for other in ["thing", "null"] {
        assert_eq!(step(&report, other)["status"], "done", "{report:#}");
    }
    assert_eq!(count(&report, "created"), 2, "{report:#}");
}

#[test]
fn a_plugin_speaking_another_protocol_version_is_left_out_naming_it() {
    let lyra = Lyra::new();
    let plugins = lyra.path("plugins");
    executable(
        &plugins.join("lyra-provider-future"),
        "echo 'lyra-plugin|99|unix|/tmp/x'\nexec sleep 60",
    );
    install_wrapper(&plugins, "example", "");
    lyra.write_workflow("w", &THING_AND_NULL.replace("NAME", "first"));
    let run = lyra.ok(&["apply", "w", "-o", "json"]);
    run.expect_stderr(&[
        "plugin future",
        "plugins/lyra-provider-future",
        "speaks protocol version \"99\", this Lyra speaks 1",
    ]);
    assert_eq!(count(&run.json(), "created"), 2, "{run}");
}

#[test]
fn no_plugin_outlives_a_killed_lyra() {
    let lyra = Lyra::new();
    install_wrapper(&lyra.path("plugins"), "hangs", "LYRA_EXAMPLE_HANG_ON=stuck");
    lyra.write_workflow("w", &THING_AND_NULL.replace("NAME", "stuck"));
    // The state exists before the poller and the apply open it at once.
    lyra.init_state();
    let mut child = lyra.spawn("apply", &["apply", "w", "-o", "json"]);
    let lyra_pid = child.id();
    // The create is in flight (its intent recorded), the plugin hanging in it.
    let in_flight = wait_until(Duration::from_secs(60), || {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the apply ended: {:?}",
            lyra.spawned_output("apply")
        );
        let run = lyra.run(&["state", "show", "w", "-o", "json"]);
        run.code == Some(0)
            && run.json()["resources"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|r| r["step"] == "thing" && r["pending"] == true))
    });
    assert!(
        in_flight,
        "the create did not start: {:?}",
        lyra.spawned_output("apply")
    );
    let plugins = children(lyra_pid);
    assert_eq!(plugins.len(), 1, "lyra runs one plugin: {plugins:?}");
    let plugin = plugins[0];
    // Stopped, it cannot notice its stdin closing: only the kernel can end it.
    signal(plugin, "-STOP");
    child.kill().expect("SIGKILL lyra");
    child.wait().expect("wait");
    let gone = wait_until(Duration::from_secs(10), || dead(plugin));
    if !gone {
        signal(plugin, "-KILL");
    }
    assert!(gone, "plugin {plugin} outlived lyra");
}

#[test]
fn the_controller_restarts_a_crashed_plugin() {
    let cluster = cluster_or_skip!();
    let dir = cluster.lyra.path("my-plugins");
    let crashed = cluster.lyra.path("crashed");
    install_wrapper(
        &dir,
        "example",
        &format!(
            "LYRA_EXAMPLE_CRASH_ON=boom LYRA_EXAMPLE_CRASH_MARKER='{}'",
            crashed.display()
        ),
    );
    let _controller = cluster.controller("c1", &["--plugins", dir.to_str().expect("utf-8 path")]);
    let file = cluster.lyra.path("controller-things.json");
    let workflow = |name: &str, thing: &str| {
        format!(
            "apiVersion: lyra.dev/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  workflow:\n    providers:\n      Example:\n        file: {}\n    steps:\n      one:\n        resource: Example::Thing\n        value:\n          name: {thing}\n",
            file.display()
        )
    };
    assert_eq!(starts(&dir, "example"), 1);
    // Its first create crashes the plugin; the retry reaches Ready through a new process.
    cluster.apply(&workflow("boom", "boom"));
    cluster.wait_for("boom", "condition=Ready", "90s");
    assert!(crashed.exists(), "the plugin crashed");
    assert_eq!(starts(&dir, "example"), 2, "restarted once");
    let log = cluster.log("c1");
    assert!(
        log.contains("the plugin exited (signal: 6 (SIGABRT))"),
        "the controller said why the step failed:\n{log}"
    );
    // And it serves what comes next.
    cluster.apply(&workflow("after", "second"));
    cluster.wait_for("after", "condition=Ready", "60s");
    assert_eq!(starts(&dir, "example"), 2);
    let things = std::fs::read_to_string(&file).expect("written");
    assert!(things.contains("\"boom\"") && things.contains("\"second\""), "{things}");
}

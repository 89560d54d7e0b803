//! The host against real plugins: the example binary, and scripts that fail the handshake.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use lyra_core::provider::{Lookup, OpContext, Provider, ProviderError};
use lyra_core::value::{Map, Value};
use lyra_plugin::{PluginError, PluginProvider, discover};
use serde_json::json;

const EXAMPLE: &str = env!("CARGO_BIN_EXE_lyra-provider-example");
const TIMEOUT: Duration = Duration::from_secs(10);

fn map(v: Value) -> Map {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Writes an executable script. The file is written by another process, so no descriptor
/// open for writing leaks into a plugin spawned meanwhile (which would make exec fail with
/// ETXTBSY).
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let status = std::process::Command::new("sh")
        .args(["-c", r#"printf '%s\n' "$1" > "$2" && chmod +x "$2""#, "sh"])
        .arg(format!("#!/bin/sh\n{body}"))
        .arg(&path)
        .status()
        .expect("sh runs");
    assert!(status.success());
    path
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

async fn wait_dead(pid: u32) -> bool {
    for _ in 0..100 {
        if dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn kill9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();

    let schemas = plugin.schemas();
    let names: Vec<&str> = schemas.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Example::Thing", "Example::Null"]);
    let thing = &schemas[0];
    assert_eq!(thing.name, "Example::Thing");
    assert_eq!(thing.doc, "A record in a JSON file.");
    let name = thing.attribute("name").unwrap();
    assert_eq!(name.ty.to_string(), "String");
    assert!(name.required && name.immutable && !name.computed);
    assert_eq!(thing.attribute("value").unwrap().ty.to_string(), "Any");
    let id = thing.attribute("id").unwrap();
    assert!(id.computed && id.provided && !id.required);
    let configs = plugin.config_schemas();
    assert_eq!(configs.len(), 1);
    assert_eq!(configs[0].name, "Example");
    assert!(configs[0].attribute("file").unwrap().required);

    let file = dir.path().join("things.json");
    let config = map(json!({"file": file.to_str().unwrap()}));
    let cancel = AtomicBool::new(false);
    let cx = |key: Option<&'static str>| OpContext {
        deployment: "d",
        step_id: "things/0",
        type_name: "Example::Thing",
        idempotency_key: key,
        config: &config,
        cancel: &cancel,
    };

    let desired = map(json!({"name": "a", "value": {"x": [1, 2]}}));
    assert!(matches!(
        plugin.lookup(&cx(Some("k")), &desired).await.unwrap(),
        Lookup::Absent
    ));
    let created = plugin.create(&cx(Some("k")), &desired).await.unwrap();
    assert_eq!(created.external_id, "thing-1");
    assert_eq!(
        Value::Object(created.actual.clone()),
        json!({"name": "a", "value": {"x": [1, 2]}, "id": "thing-1"})
    );
    // The record is in the configured file.
    let on_disk: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(on_disk["thing-1"]["name"], "a");

    let Lookup::Found(found) = plugin.lookup(&cx(Some("k")), &desired).await.unwrap() else {
        panic!("lookup by name finds it");
    };
    assert_eq!(found.external_id, "thing-1");

    let read = plugin.read(&cx(None), "thing-1", Some(&created.actual)).await.unwrap();
    assert_eq!(read.as_ref(), Some(&created.actual));
    assert_eq!(plugin.read(&cx(None), "thing-9", None).await.unwrap(), None);

    let desired2 = map(json!({"name": "a", "value": 7}));
    assert_eq!(
        plugin.replace_reasons("Example::Thing", &desired2, &created.actual),
        vec!["value".to_owned()]
    );
    assert!(
        plugin
            .replace_reasons("Example::Thing", &desired, &created.actual)
            .is_empty()
    );
    let updated = plugin
        .update(&cx(None), "thing-1", &desired2, &created.actual)
        .await
        .unwrap();
    assert_eq!(
        Value::Object(updated),
        json!({"name": "a", "value": 7, "id": "thing-1"})
    );

    // Structured errors come back as the same variants.
    match plugin.update(&cx(None), "thing-9", &desired2, &Map::new()).await {
        Err(ProviderError::NotFound { type_name, external_id }) => {
            assert_eq!(type_name, "Example::Thing");
            assert_eq!(external_id, "thing-9");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    match plugin.create(&cx(Some("k2")), &map(json!({"value": 1}))).await {
        Err(ProviderError::InvalidValue { attribute, .. }) => assert_eq!(attribute, "name"),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    let no_config = Map::new();
    let bad = OpContext {
        config: &no_config,
        ..cx(None)
    };
    assert!(matches!(
        plugin.read(&bad, "thing-1", None).await,
        Err(ProviderError::Config(_))
    ));

    plugin.delete(&cx(None), "thing-1", &Map::new()).await.unwrap();
    assert_eq!(plugin.read(&cx(None), "thing-1", None).await.unwrap(), None);
    // Deleting what is gone is not an error.
    plugin.delete(&cx(None), "thing-1", &Map::new()).await.unwrap();

    // The plugin's stderr reached the host.
    assert!(
        plugin.stderr_tail().iter().any(|l| l.contains("created thing-1")),
        "{:?}",
        plugin.stderr_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_failures_are_distinct_errors() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = script(dir.path(), "lyra-provider-garbage", "echo hello world; exec sleep 30");
    let version = script(
        dir.path(),
        "lyra-provider-future",
        "echo 'lyra-plugin|2|unix|/tmp/x.sock'; exec sleep 30",
    );
    let exits = script(dir.path(), "lyra-provider-exits", "echo 'no such thing' >&2; exit 3");
    let slow = script(dir.path(), "lyra-provider-slow", "exec sleep 30");
    let mentions = |e: &PluginError, p: &Path| {
        let text = e.to_string();
        assert!(text.contains(p.to_str().unwrap()), "{text}");
        text
    };

    let e = PluginProvider::start(&garbage, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &garbage);
    assert!(
        matches!(e, PluginError::HandshakeGarbage { ref line, .. } if line == "hello world"),
        "{text}"
    );

    let e = PluginProvider::start(&version, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &version);
    assert!(
        matches!(e, PluginError::ProtocolVersion { ref version, .. } if version == "2"),
        "{text}"
    );

    let e = PluginProvider::start(&exits, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &exits);
    assert!(matches!(e, PluginError::HandshakeEof { .. }), "{text}");
    assert!(text.contains("no such thing"), "{text}");
    assert!(text.contains('3'), "{text}");

    let started = std::time::Instant::now();
    let e = PluginProvider::start(&slow, Duration::from_millis(500))
        .await
        .unwrap_err();
    let text = mentions(&e, &slow);
    assert!(matches!(e, PluginError::HandshakeTimeout { .. }), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let tcp = script(
        dir.path(),
        "lyra-provider-tcp",
        "echo 'lyra-plugin|1|tcp|127.0.0.1:1'; exec sleep 30",
    );
    let e = PluginProvider::start(&tcp, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &tcp);
    assert!(
        matches!(e, PluginError::Transport { ref transport, .. } if transport == "tcp"),
        "{text}"
    );

    let nosocket = script(
        dir.path(),
        "lyra-provider-nosocket",
        "echo 'lyra-plugin|1|unix|/nonexistent/provider.sock'; exec sleep 30",
    );
    let e = PluginProvider::start(&nosocket, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &nosocket);
    assert!(matches!(e, PluginError::Connect { .. }), "{text}");

    let missing = dir.path().join("lyra-provider-missing");
    let e = PluginProvider::start(&missing, TIMEOUT).await.unwrap_err();
    let text = mentions(&e, &missing);
    assert!(matches!(e, PluginError::Spawn { .. }), "{text}");
}

fn op<'a>(config: &'a Map, cancel: &'a AtomicBool) -> OpContext<'a> {
    OpContext {
        deployment: "d",
        step_id: "s",
        type_name: "Example::Thing",
        idempotency_key: None,
        config,
        cancel,
    }
}

/// A wrapper around the example that appends a line to `starts` each time it is started,
/// runs `before` (shell) first, and execs the example with `env` (`VAR=value ...`).
fn wrapper(dir: &Path, name: &str, before: &str, env: &str) -> (PathBuf, PathBuf) {
    let starts = dir.join(format!("{name}.starts"));
    let path = script(
        dir,
        name,
        &format!(
            "echo $$ >> '{}'\n{before}\n{env} exec '{EXAMPLE}' \"$@\"",
            starts.display()
        ),
    );
    (path, starts)
}

/// Waits until the host sees its killed plugin exit: a moment after its main thread shows as
/// a zombie, once its other threads are gone too.
async fn wait_exited(plugin: &PluginProvider) {
    for _ in 0..100 {
        if plugin.pid().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the host does not see its plugin exit");
}

fn starts(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |t| t.lines().count())
}

#[track_caller]
fn other(result: Result<impl std::fmt::Debug, ProviderError>) -> String {
    match result {
        Err(ProviderError::Other(message)) => message,
        other => panic!("expected Other, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_killed_between_operations_is_restarted_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (path, log) = wrapper(dir.path(), "lyra-provider-example", "", "");
    let plugin = PluginProvider::start(&path, TIMEOUT).await.unwrap();
    let pid = plugin.pid().unwrap();
    kill9(pid);
    wait_exited(&plugin).await;
    // Not an answer, not a panic: nothing forces a replace.
    assert!(
        plugin
            .replace_reasons("Example::Thing", &Map::new(), &Map::new())
            .is_empty()
    );
    let file = dir.path().join("things.json");
    let config = map(json!({"file": file.to_str().unwrap()}));
    let cancel = AtomicBool::new(false);
    // Operations that find it dead together restart it once, and all succeed.
    let reads = futures_reads(&plugin, &op(&config, &cancel)).await;
    assert!(reads.iter().all(|r| matches!(r, Ok(None))), "{reads:?}");
    assert_eq!(starts(&log), 2, "started, then restarted once");
    let again = plugin.pid().expect("restarted");
    assert_ne!(again, pid);
    // It serves as before, and still replies to replace_reasons.
    let created = plugin
        .create(&op(&config, &cancel), &map(json!({"name": "a"})))
        .await
        .unwrap();
    assert_eq!(created.external_id, "thing-1");
    assert_eq!(
        plugin.replace_reasons("Example::Thing", &map(json!({"value": {}})), &created.actual),
        vec!["value".to_owned()]
    );
}

/// Three reads of `thing-1` at once.
async fn futures_reads(plugin: &PluginProvider, cx: &OpContext<'_>) -> Vec<Result<Option<Map>, ProviderError>> {
    let (a, b, c) = tokio::join!(
        plugin.read(cx, "thing-1", None),
        plugin.read(cx, "thing-1", None),
        plugin.read(cx, "thing-1", None)
    );
    vec![a, b, c]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_crashes_mid_operation_fails_it_and_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, log) = wrapper(dir.path(), "lyra-provider-crashy", "", "LYRA_EXAMPLE_CRASH_ON=boom");
    let plugin = PluginProvider::start(&path, TIMEOUT).await.unwrap();
    let first = plugin.pid().unwrap();
    let file = dir.path().join("things.json");
    let config = map(json!({"file": file.to_str().unwrap()}));
    let cancel = AtomicBool::new(false);
    let cx = op(&config, &cancel);

    let message = other(plugin.create(&cx, &map(json!({"name": "boom"}))).await);
    assert!(message.contains(path.to_str().unwrap()), "names the plugin: {message}");
    assert!(
        message.contains("exited (signal: 6 (SIGABRT))"),
        "says how it exited: {message}"
    );
    assert!(message.contains("restarted for the next operation"), "{message}");
    assert!(message.contains("crashing on boom"), "quotes its stderr: {message}");
    assert!(dead(first));

    // The next operation runs on a new process.
    let created = plugin.create(&cx, &map(json!({"name": "fine"}))).await.unwrap();
    assert_eq!(created.actual["name"], "fine");
    let second = plugin.pid().expect("restarted");
    assert_ne!(second, first);
    assert_eq!(starts(&log), 2);
    let on_disk: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(on_disk[&created.external_id]["name"], "fine", "{on_disk}");
    assert!(
        !plugin.stderr_tail().iter().any(|l| l.contains("crashing")),
        "the tail is the new process's: {:?}",
        plugin.stderr_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_cannot_restart_is_retried_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken");
    let (path, log) = wrapper(
        dir.path(),
        "lyra-provider-flaky",
        &format!(
            "if [ -e '{}' ]; then echo 'cannot start now' >&2; exit 7; fi",
            broken.display()
        ),
        "",
    );
    let plugin = PluginProvider::start(&path, TIMEOUT).await.unwrap();
    std::fs::write(&broken, "").unwrap();
    let pid = plugin.pid().unwrap();
    kill9(pid);
    wait_exited(&plugin).await;
    let config = Map::new();
    let cancel = AtomicBool::new(false);
    let cx = op(&config, &cancel);

    // The first restart is at once, and fails.
    let message = other(plugin.read(&cx, "thing-1", None).await);
    assert!(message.contains(path.to_str().unwrap()), "{message}");
    assert!(message.contains("restarting it failed"), "{message}");
    assert!(
        message.contains("exit status: 7") && message.contains("cannot start now"),
        "{message}"
    );
    assert_eq!(starts(&log), 2);
    // The next waits: the operation fails at once, starting nothing.
    let message = other(plugin.read(&cx, "thing-1", None).await);
    assert!(message.contains("it is restarted in"), "{message}");
    assert_eq!(starts(&log), 2, "no start within the backoff");

    // Fixed: an operation after the backoff restarts it.
    std::fs::remove_file(&broken).unwrap();
    let mut tries = 0;
    let read = loop {
        match plugin.read(&cx, "thing-1", None).await {
            Err(ProviderError::Other(m)) if m.contains("it is restarted in") && tries < 200 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other,
        }
    };
    // The example needs its `file` setting: the error is the plugin's own answer.
    assert!(matches!(read, Err(ProviderError::Config(_))), "{read:?}");
    assert_eq!(starts(&log), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_plugin_must_serve_the_same_schema() {
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("changed");
    let (path, log) = wrapper(
        dir.path(),
        "lyra-provider-shifty",
        &format!(
            "if [ -e '{}' ]; then export LYRA_EXAMPLE_NAMESPACE=Other; fi",
            changed.display()
        ),
        "",
    );
    let plugin = PluginProvider::start(&path, TIMEOUT).await.unwrap();
    std::fs::write(&changed, "").unwrap();
    let pid = plugin.pid().unwrap();
    kill9(pid);
    wait_exited(&plugin).await;
    let config = Map::new();
    let cancel = AtomicBool::new(false);
    let cx = op(&config, &cancel);

    let message = other(plugin.read(&cx, "thing-1", None).await);
    assert!(message.contains(path.to_str().unwrap()), "{message}");
    assert!(message.contains("served another schema"), "{message}");
    assert_eq!(starts(&log), 2);
    // That process is stopped, and no other is started: every operation fails the same way.
    assert_eq!(plugin.pid(), None);
    let again = other(plugin.read(&cx, "thing-1", None).await);
    assert_eq!(again, message);
    assert_eq!(starts(&log), 2);
    assert_eq!(
        plugin.schemas()[0].name,
        "Example::Thing",
        "the types stay as registered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_provider_kills_the_plugin() {
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();
    let pid = plugin.pid().unwrap();
    assert!(!dead(pid));
    drop(plugin);
    assert!(wait_dead(pid).await, "plugin {pid} still runs");
}

#[tokio::test(flavor = "current_thread")]
async fn replace_reasons_works_on_a_current_thread_runtime() {
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();
    let desired = map(json!({"name": "a", "value": {}}));
    let actual = map(json!({"name": "a", "value": 1}));
    assert_eq!(
        plugin.replace_reasons("Example::Thing", &desired, &actual),
        vec!["value".to_owned()]
    );
}

#[test]
fn discover_finds_executables_by_prefix() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let one = script(a.path(), "lyra-provider-one", "exit 0");
    script(b.path(), "lyra-provider-one", "exit 0");
    let two = script(b.path(), "lyra-provider-two", "exit 0");
    script(a.path(), "other-tool", "exit 0");
    std::fs::write(a.path().join("lyra-provider-notexec"), "x").unwrap();
    std::fs::create_dir(a.path().join("lyra-provider-dir")).unwrap();
    let found = discover(&[a.path().to_path_buf(), b.path().join("missing"), b.path().to_path_buf()]);
    assert_eq!(found, vec![("one".to_owned(), one), ("two".to_owned(), two)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_drops_the_operation() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();
    let delay = plugin.config_schemas()[0].attribute("delay").unwrap().ty.to_string();
    assert_eq!(delay, "Optional[Integer]");
    let file = dir.path().join("things.json");
    let config = map(json!({"file": file.to_str().unwrap(), "delay": 2500}));
    let cancel = AtomicBool::new(false);
    let cx = OpContext {
        deployment: "d",
        step_id: "s",
        type_name: "Example::Thing",
        idempotency_key: Some("k"),
        config: &config,
        cancel: &cancel,
    };
    let started = std::time::Instant::now();
    let desired = map(json!({"name": "slow"}));
    let create = plugin.create(&cx, &desired);
    let cancel_soon = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let (result, ()) = tokio::join!(create, cancel_soon);
    assert!(matches!(result, Err(ProviderError::Cancelled)), "{result:?}");
    assert!(started.elapsed() < Duration::from_millis(2000));
    // The plugin dropped the operation: it never made the thing.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(!file.exists());
    // And it still serves.
    let quick = map(json!({"file": file.to_str().unwrap()}));
    let cx = OpContext {
        config: &quick,
        cancel: &AtomicBool::new(false),
        ..cx
    };
    assert_eq!(plugin.create(&cx, &desired).await.unwrap().external_id, "thing-1");
}

/// Runs the example directly: returns the child once its handshake is read.
fn spawn_example() -> (std::process::Child, String) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(EXAMPLE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

fn wait_exit(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    None
}

#[test]
fn the_plugin_exits_when_stdin_closes() {
    let (mut child, line) = spawn_example();
    assert!(line.starts_with("lyra-plugin|1|unix|/"), "{line}");
    let socket = PathBuf::from(line.trim_end().rsplit('|').next().unwrap());
    assert!(socket.exists());
    drop(child.stdin.take());
    let status = wait_exit(&mut child).expect("exits at EOF on stdin");
    assert!(status.success(), "{status}");
    // Its socket directory is removed.
    assert!(!socket.exists());
}

#[test]
fn the_plugin_exits_on_sigterm() {
    let (mut child, _) = spawn_example();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = wait_exit(&mut child).expect("exits on SIGTERM");
    assert!(status.success(), "{status}");
}

/// Set in the host process that [`the_kernel_kills_the_plugin_when_its_host_is_killed`] starts:
/// the directory to work in.
const HOST_DIR: &str = "LYRA_PLUGIN_TEST_HOST_DIR";

/// The host of [`the_kernel_kills_the_plugin_when_its_host_is_killed`]: this test binary run
/// again with [`HOST_DIR`] set. It starts a plugin, says its pid and waits to be killed.
/// Without the variable it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_that_starts_a_plugin() {
    let Some(dir) = std::env::var_os(HOST_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();
    let pid = plugin.pid().unwrap();
    std::fs::write(dir.join("pid.tmp"), pid.to_string()).unwrap();
    std::fs::rename(dir.join("pid.tmp"), dir.join("pid")).unwrap();
    std::future::pending::<()>().await;
}

#[test]
fn the_kernel_kills_the_plugin_when_its_host_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut host = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "host_that_starts_a_plugin", "--nocapture"])
        .env(HOST_DIR, dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = dir.path().join("pid");
    let mut pid = None;
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            pid = text.trim().parse::<u32>().ok();
            break;
        }
        assert!(host.try_wait().unwrap().is_none(), "the host ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = pid.expect("the host started its plugin");
    assert!(!dead(pid));
    // Stopped, the plugin cannot notice its stdin closing: only the kernel can end it.
    let status = std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    host.kill().unwrap();
    host.wait().unwrap();
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        dead(pid)
    });
    if !gone {
        kill9(pid);
    }
    assert!(gone, "plugin {pid} outlived its host");
}

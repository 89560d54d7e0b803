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
    assert_eq!(schemas.len(), 1);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_plugin_fails_its_calls_naming_it() {
    let plugin = PluginProvider::start(Path::new(EXAMPLE), TIMEOUT).await.unwrap();
    let pid = plugin.pid().unwrap();
    kill9(pid);
    assert!(wait_dead(pid).await);
    let config = Map::new();
    let cancel = AtomicBool::new(false);
    let cx = OpContext {
        deployment: "d",
        step_id: "s",
        type_name: "Example::Thing",
        idempotency_key: None,
        config: &config,
        cancel: &cancel,
    };
    match plugin.read(&cx, "thing-1", None).await {
        Err(ProviderError::Other(message)) => {
            assert!(message.contains(EXAMPLE), "{message}");
        }
        other => panic!("expected Other, got {other:?}"),
    }
    // Not an answer, not a panic: nothing forces a replace.
    assert!(
        plugin
            .replace_reasons("Example::Thing", &Map::new(), &Map::new())
            .is_empty()
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

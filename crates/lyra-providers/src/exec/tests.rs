use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::test_support::map;

fn cx() -> OpContext<'static> {
    crate::test_support::cx(COMMAND)
}

fn p() -> ExecProvider {
    ExecProvider::new(true)
}

/// A thing kept in a file `thing` of the working directory: what the commands manage.
fn thing(dir: &std::path::Path, v: &str) -> Map {
    map(json!({
        "create": r#"echo "$V" > thing; printf '{"id": "thing-1", "v": "%s"}' "$V""#,
        "read": r#"if test -f thing; then printf '{"id": "thing-1", "v": "%s"}' "$(cat thing)"; fi"#,
        "update": r#"prev=$(cat); echo "$V" > thing; printf '{"v": "%s", "prev": %s}' "$V" "$prev""#,
        "delete": "rm thing",
        "environment": {"V": v},
        "working_dir": dir.to_str().unwrap(),
    }))
}

#[tokio::test]
async fn lifecycle_create_read_update_drift_delete() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("thing");
    let desired = thing(dir.path(), "one");
    let created = p().create(&cx(), &desired).await.unwrap();
    assert_eq!(created.external_id, "thing-1");
    assert_eq!(created.actual["output"], json!({"id": "thing-1", "v": "one"}));
    assert_eq!(created.actual["interpreter"], json!(["/bin/sh", "-c"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "one\n");

    // No drift: every attribute the workflow set reads back as set.
    let read = p()
        .read(&cx(), "thing-1", Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, created.actual);

    // In place, with the previous output on stdin.
    let desired = thing(dir.path(), "two");
    assert!(p().replace_reasons(COMMAND, &desired, &read).is_empty());
    let updated = p().update(&cx(), "thing-1", &desired, &read).await.unwrap();
    assert_eq!(
        updated["output"],
        json!({"v": "two", "prev": {"id": "thing-1", "v": "one"}})
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "two\n");

    // Drift: changed out of band shows in output; removed is gone.
    std::fs::write(&file, "three").unwrap();
    let read = p().read(&cx(), "thing-1", Some(&updated)).await.unwrap().unwrap();
    assert_eq!(read["output"], json!({"id": "thing-1", "v": "three"}));

    p().delete(&cx(), "thing-1", &read).await.unwrap();
    assert!(!file.exists());
    assert_eq!(p().read(&cx(), "thing-1", Some(&read)).await.unwrap(), None);
    // A delete command that fails on a second delete is the command's business: rm -f is not.
    let mut forgiving = read.clone();
    forgiving.insert("delete".to_owned(), json!("rm -f thing"));
    p().delete(&cx(), "thing-1", &forgiving).await.unwrap();
    p().delete(&cx(), "thing-1", &forgiving).await.unwrap();
    let err = p().delete(&cx(), "thing-1", &read).await.unwrap_err();
    assert!(matches!(err, ProviderError::Other(_)), "{err:?}");
}

#[tokio::test]
async fn commands_get_the_previous_output_and_lyra_variables() {
    let script =
        r#"printf '%s %s %s %s %s' "$LYRA_OPERATION" "$LYRA_STEP" "$LYRA_DEPLOYMENT" "${LYRA_ID-unset}" "$(cat)""#;
    let desired = map(json!({"create": script, "update": script, "read": script, "delete": "exit 0"}));
    let cx = crate::test_support::cx_at(COMMAND, "s/1");
    let created = p().create(&cx, &desired).await.unwrap();
    assert_eq!(created.actual["output"], json!("create s/1 test unset null"));
    assert!(created.external_id.starts_with("exec-"), "{}", created.external_id);
    let updated = p()
        .update(&cx, &created.external_id, &desired, &created.actual)
        .await
        .unwrap();
    assert_eq!(
        updated["output"],
        json!(format!(
            "update s/1 test {} \"create s/1 test unset null\"",
            created.external_id
        ))
    );
    let read = p().read(&cx, "x-1", Some(&updated)).await.unwrap().unwrap();
    assert!(
        read["output"]
            .as_str()
            .unwrap()
            .starts_with("read s/1 test x-1 \"update"),
        "{read:?}"
    );
}

#[tokio::test]
async fn output_is_json_when_it_is_json_else_trimmed_text() {
    for (script, output) in [
        ("echo '  hello world  '", json!("hello world")),
        ("echo '[1, {\"a\": true}]'", json!([1, {"a": true}])),
        ("echo 42", json!(42)),
        ("true", Value::Null),
        ("echo '{not json'", json!("{not json")),
    ] {
        let created = p().create(&cx(), &map(json!({"create": script}))).await.unwrap();
        assert_eq!(created.actual["output"], output, "{script}");
    }
    // A custom interpreter.
    let created = p()
        .create(
            &cx(),
            &map(json!({"create": "print(6 * 7)", "interpreter": ["/bin/sh", "-c", "echo 42 # $0"]})),
        )
        .await
        .unwrap();
    assert_eq!(created.actual["output"], json!(42));
}

#[tokio::test]
async fn without_a_read_command_the_state_is_all_there_is() {
    let prior = map(json!({"create": "echo 1", "output": 1}));
    assert_eq!(
        p().read(&cx(), "exec-1", Some(&prior)).await.unwrap(),
        Some(prior.clone())
    );
    assert_eq!(p().read(&cx(), "exec-1", None).await.unwrap(), None);
    // Nothing to delete with: fine.
    p().delete(&cx(), "exec-1", &prior).await.unwrap();
}

#[test]
fn changes_replace_unless_there_is_an_update_command() {
    let actual = map(json!({"create": "a", "interpreter": ["/bin/sh", "-c"], "output": 1, "environment": {"A": "1"}}));
    // Only the output differs (it is computed) and the interpreter is the default: nothing.
    assert!(
        p().replace_reasons(
            COMMAND,
            &map(json!({"create": "a", "environment": {"A": "1"}})),
            &actual
        )
        .is_empty()
    );
    assert_eq!(
        p().replace_reasons(
            COMMAND,
            &map(json!({"create": "b", "environment": {"A": "2"}})),
            &actual
        ),
        ["create", "environment"]
    );
    assert_eq!(
        p().replace_reasons(
            COMMAND,
            &map(json!({"create": "a", "environment": {"A": "1"}, "interpreter": ["bash", "-c"]})),
            &actual
        ),
        ["interpreter"]
    );
    // With an update command, changed commands and settings update in place.
    assert!(
        p().replace_reasons(
            COMMAND,
            &map(json!({"create": "b", "update": "u", "environment": {"A": "2"}})),
            &actual
        )
        .is_empty()
    );
    let schema = &p().schemas()[0];
    assert!(schema.attribute("triggers").unwrap().immutable);
    assert!(schema.attribute("create").unwrap().required);
    assert!(schema.is_secret("sensitive_environment"));
    assert!(schema.attribute("output").unwrap().computed);
    assert!(schema.attributes.iter().all(|a| !a.doc.is_empty()));
}

#[tokio::test]
async fn failures_quote_the_tail_of_stderr_without_secrets() {
    let desired = map(json!({
        "create": r#"echo "token=$TOKEN" >&2; for i in $(seq 1 30); do echo "line$i" >&2; done; echo "last $TOKEN" >&2; echo out; exit 3"#,
        "sensitive_environment": {"TOKEN": "s3cr3t-value"},
    }));
    let err = p().create(&cx(), &desired).await.unwrap_err();
    assert!(err.is_retryable());
    let msg = err.to_string();
    assert!(msg.contains("exited with status 3"), "{msg}");
    assert!(
        msg.contains("line30") && msg.contains("line12") && !msg.contains("line11\n"),
        "{msg}"
    );
    assert!(msg.contains("last (sensitive)"), "{msg}");
    assert!(!msg.contains("s3cr3t"), "{msg}");

    let err = p()
        .create(&cx(), &map(json!({"create": "kill -9 $$"})))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("was killed"), "{err}");
    let err = p()
        .create(&cx(), &map(json!({"create": "x", "interpreter": []})))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == "interpreter"),
        "{err:?}"
    );
    let err = p()
        .create(
            &cx(),
            &map(json!({"create": "x", "sensitive_environment": {"T": ["s3cr3t"]}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains("s3cr3t") && !err.contains("\"T\""), "{err}");
    let err = p()
        .create(&cx(), &map(json!({"create": "x", "interpreter": ["/nonexistent/sh"]})))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Other(_)), "{err:?}");
}

#[tokio::test]
async fn disabled_refuses_every_operation() {
    let off = ExecProvider::new(false);
    assert_eq!(off.schemas()[0].name, COMMAND);
    let desired = map(json!({"create": "touch should-not-exist"}));
    let expect = |r: Result<(), ProviderError>| match r {
        Err(ProviderError::Config(m)) => assert_eq!(m, DISABLED),
        other => panic!("{other:?}"),
    };
    expect(off.create(&cx(), &desired).await.map(drop));
    expect(off.read(&cx(), "x", Some(&desired)).await.map(drop));
    expect(off.update(&cx(), "x", &desired, &desired).await.map(drop));
    expect(off.delete(&cx(), "x", &desired).await);
    expect(off.lookup(&cx(), &desired).await.map(drop));
    assert!(!std::path::Path::new("should-not-exist").exists());
}

/// Whether process `pid` is gone (or a zombie, dead but not yet reaped by its new parent).
fn dead(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

async fn wait_for_file(path: &std::path::Path) -> String {
    for _ in 0..200 {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.trim().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{} never written", path.display());
}

async fn assert_dies(pid: &str) {
    for _ in 0..100 {
        if dead(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("process {pid} survived");
}

#[tokio::test]
async fn cancel_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let desired = map(json!({
        // A grandchild: the shell starts another shell that sleeps.
        "create": "sh -c 'sleep 300' & echo $! > gpid; wait",
        "working_dir": dir.path().to_str().unwrap(),
    }));
    let cx = cx();
    let cancel = cx.cancel;
    let started = Instant::now();
    let create = p();
    let run = tokio::spawn(async move { create.create(&cx, &desired).await });
    let gpid = wait_for_file(&dir.path().join("gpid")).await;
    assert!(!dead(&gpid));
    cancel.store(true, Ordering::SeqCst);
    let err = run.await.unwrap().unwrap_err();
    assert!(matches!(err, ProviderError::Cancelled), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_dies(&gpid).await;
}

#[tokio::test]
async fn a_dropped_operation_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let desired = map(json!({
        "create": "echo 1",
        "delete": "sh -c 'sleep 300' & echo $! > gpid; wait",
        "working_dir": dir.path().to_str().unwrap(),
    }));
    // A step timeout: the engine drops the future.
    let timed_out = tokio::time::timeout(Duration::from_millis(500), p().delete(&cx(), "exec-1", &desired)).await;
    assert!(timed_out.is_err());
    let gpid = wait_for_file(&dir.path().join("gpid")).await;
    assert_dies(&gpid).await;
}

#[tokio::test]
async fn lookup_cannot_tell() {
    assert!(matches!(
        p().lookup(&cx(), &map(json!({"create": "true"}))).await.unwrap(),
        Lookup::Unsupported
    ));
}

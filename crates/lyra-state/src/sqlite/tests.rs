//! SQLite store tests: the shared conformance suite on real files, plus what only a file can
//! show (reopening, foreign files, two handles on one file, a writer killed mid-way).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lyra_core::state::{StateStore, StoreError, StoreErrorKind};
use sqlx::{Connection, SqliteConnection};
use tempfile::TempDir;

use super::{SqliteStore, Synchronous};
use crate::Error;
use crate::conformance as c;

struct Fixture {
    // Kept for its Drop: removes the directory after the test.
    _dir: TempDir,
    path: PathBuf,
    store: SqliteStore,
}

impl Fixture {
    async fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let store = SqliteStore::open(&path).await.expect("open");
        Fixture { _dir: dir, path, store }
    }
}

/// Runs a conformance check on a fresh store, then closes it cleanly.
macro_rules! conformance {
    ($($name:ident $(($arg:expr))?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let f = Fixture::new().await;
            c::$name(&f.store $(, $arg)?).await;
            f.store.close().await.expect("close");
        }
    )*};
}

conformance! {
    load_unknown_is_none;
    begin_run_creates_deployment;
    workflow_follows_applies;
    resource_round_trip;
    replace_resource;
    remove_resource;
    resources_sorted_by_step_id;
    deployments_are_isolated;
    list_sorted_with_counts_and_last_run;
    history_newest_first;
    finish_run_records_end;
    unfinished_run_has_no_outcome;
    finish_run_misuse_is_rejected;
    history_survives_resource_removal;
    concurrent_puts_all_land(1000);
    concurrent_mixed_writes;
}

/// Raw access to the file, bypassing the store, for checks and for planting bad data.
async fn raw(path: &Path) -> SqliteConnection {
    SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .expect("raw connect")
}

#[tokio::test]
async fn reopen_keeps_everything() {
    let f = Fixture::new().await;
    c::seed(&f.store).await;
    f.store.close().await.expect("close");
    let store = SqliteStore::open(&f.path).await.expect("reopen");
    c::check_seeded(&store).await;
}

#[tokio::test]
async fn dropping_without_close_keeps_acknowledged_writes() {
    let f = Fixture::new().await;
    c::seed(&f.store).await;
    drop(f.store);
    let store = SqliteStore::open(&f.path).await.expect("reopen");
    c::check_seeded(&store).await;
}

#[tokio::test]
async fn open_url_forms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let abs = dir.path().join("a.db");
    for url in [
        format!("sqlite://{}", abs.display()),
        format!("sqlite:{}", abs.display()),
        abs.display().to_string(),
        format!("sqlite:{}?synchronous=full", abs.display()),
    ] {
        let store = crate::open(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    }
    let store = SqliteStore::open(&abs).await.expect("open");
    assert_eq!(store.history("d").await.expect("history").len(), 4);
}

#[tokio::test]
async fn open_postgres_is_unsupported() {
    for url in ["postgres://x", "postgresql://u@h/db"] {
        let err = crate::open(url).await.err().expect("postgres must fail");
        assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
        assert_eq!(err.to_string(), "Postgres state is not available yet");
        assert_eq!(StoreError::from(err).kind, StoreErrorKind::Unavailable);
    }
    let err = crate::open("mysql://x").await.err().expect("mysql must fail");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
}

#[tokio::test]
async fn open_creates_parent_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a/b/c/state.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    assert!(path.is_file());
    assert_eq!(store.path(), path);
}

#[tokio::test]
async fn pragmas_are_set() {
    let f = Fixture::new().await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&f.store.reads)
        .await
        .expect("mode");
    assert_eq!(mode, "wal");
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(&f.store.reads)
        .await
        .expect("fk");
    assert_eq!(fk, 1);
    // 1 = NORMAL.
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&f.store.reads)
        .await
        .expect("sync");
    assert_eq!(sync, 1);
    let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&f.store.reads)
        .await
        .expect("busy");
    assert_eq!(timeout, 10_000);
}

#[tokio::test]
async fn synchronous_full_is_applied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = super::SqliteOptions {
        synchronous: Synchronous::Full,
        ..Default::default()
    };
    let store = SqliteStore::open_with(&dir.path().join("s.db"), &options)
        .await
        .expect("open");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&store.reads)
        .await
        .expect("sync");
    assert_eq!(sync, 2);
}

#[tokio::test]
async fn not_a_database_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are not the pages you are looking for\n".repeat(200)).expect("write");
    let err = SqliteStore::open(&path).await.expect_err("must not open");
    assert!(matches!(&err, Error::NotADatabase { path: p } if *p == path), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert_eq!(StoreError::from(err).kind, StoreErrorKind::Corrupt);
    // The file is left alone.
    assert!(
        std::fs::read_to_string(&path)
            .expect("read")
            .starts_with("these are not")
    );
}

#[tokio::test]
async fn directory_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = SqliteStore::open(dir.path()).await.expect_err("must not open");
    assert!(matches!(&err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains(&dir.path().display().to_string()), "{err}");
    assert_eq!(StoreError::from(err).kind, StoreErrorKind::Unavailable);

    // A parent that is a file cannot be created.
    let file = dir.path().join("file");
    std::fs::write(&file, "x").expect("write");
    let err = SqliteStore::open(&file.join("state.db"))
        .await
        .expect_err("must not open");
    assert!(matches!(&err, Error::Io { .. }), "{err:?}");
}

#[tokio::test]
async fn newer_schema_is_refused_as_corrupt() {
    let f = Fixture::new().await;
    f.store.close().await.expect("close");
    let mut conn = raw(&f.path).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', TRUE, X'00', 0)",
    )
    .execute(&mut conn)
    .await
    .expect("plant migration");
    conn.close().await.expect("close raw");

    let err = SqliteStore::open(&f.path).await.expect_err("must refuse");
    assert!(matches!(&err, Error::Migrate { .. }), "{err:?}");
    assert_eq!(StoreError::from(err).kind, StoreErrorKind::Corrupt);
}

#[tokio::test]
async fn undecodable_row_is_corrupt() {
    let f = Fixture::new().await;
    f.store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    f.store.put_resource("d", &c::resource("a")).await.expect("put");
    let mut conn = raw(&f.path).await;
    sqlx::query("UPDATE resources SET desired = '{not json' WHERE step_id = 'a'")
        .execute(&mut conn)
        .await
        .expect("plant bad json");
    let err = f.store.load("d").await.expect_err("must fail");
    assert_eq!(err.kind, StoreErrorKind::Corrupt);
    assert!(err.message.contains("resources.desired"), "{}", err.message);
    assert!(err.message.contains("\"a\""), "{}", err.message);
}

/// Two stores on one file (as two processes would be) both write without "database is
/// locked": each waits for the other's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file() {
    let f = Fixture::new().await;
    let other: Arc<dyn StateStore> = Arc::new(SqliteStore::open(&f.path).await.expect("second open"));
    let mine: Arc<dyn StateStore> = Arc::new(f.store);
    // `chunk` puts at a time: 1 is a chain of lone writes (autocommit), 30 gives batches.
    let write = |store: Arc<dyn StateStore>, deployment: &'static str, chunk: usize| {
        tokio::spawn(async move {
            store.begin_run(&c::apply(deployment, "wf")).await.expect("begin_run");
            let records: Vec<_> = (0..300).map(|i| c::resource(&format!("r{i:03}"))).collect();
            for chunk in records.chunks(chunk) {
                let puts = chunk.iter().map(|r| store.put_resource(deployment, r));
                for result in futures::future::join_all(puts).await {
                    result.expect("put");
                }
            }
        })
    };
    let (a, b) = tokio::join!(write(mine.clone(), "one", 1), write(other.clone(), "two", 30));
    a.expect("writer one");
    b.expect("writer two");
    for (store, deployment) in [(&mine, "two"), (&other, "one")] {
        let state = store.load(deployment).await.expect("load").expect("exists");
        assert_eq!(state.resources.len(), 300);
    }
}

// --- Crash test -----------------------------------------------------------------------------

/// Set (to the database path) in the child process of [`killed_writer_loses_no_acknowledged_write`].
const CRASH_CHILD_ENV: &str = "LYRA_STATE_CRASH_CHILD_DB";

/// The child: writes forever from several concurrent "steps", printing `ACK <step>` after each
/// write is acknowledged, until the parent kills it. A no-op in normal test runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&path)).await.expect("child open");
    store.begin_run(&c::apply("crash", "wf")).await.expect("begin_run");
    let store = &store;
    let lanes = (0..8).map(|lane| async move {
        // Bounded so a child whose parent died does not write forever.
        for i in 0..200_000 {
            let step = format!("lane{lane}/{i:06}");
            let mut record = c::resource(&step);
            record.desired.insert("payload".into(), "x".repeat(i % 4096).into());
            store.put_resource("crash", &record).await.expect("put");
            println!("ACK {step}");
        }
    });
    futures::future::join_all(lanes).await;
}

#[test]
fn killed_writer_loses_no_acknowledged_write() {
    const KILL_AFTER: usize = 2000;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crash.db");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "sqlite::tests::crash_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CRASH_CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");

    // Read on a thread so a stuck child cannot hang the test.
    let stdout = child.stdout.take().expect("stdout");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut acked = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.len() < KILL_AFTER {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => acked.extend(line.strip_prefix("ACK ").map(str::to_owned)),
            Err(_) => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("child output");
                panic!(
                    "child stopped after {} acks: {}",
                    acked.len(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    child.kill().expect("SIGKILL child"); // std sends SIGKILL on Unix
    let status = child.wait().expect("wait child");
    assert!(!status.success(), "child was killed, not finished");
    // Everything the child printed before dying is still in the pipe.
    reader.join().expect("reader thread");
    acked.extend(
        lines
            .try_iter()
            .filter_map(|l| l.strip_prefix("ACK ").map(str::to_owned)),
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut conn = raw(&path).await;
        let check: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut conn)
            .await
            .expect("check");
        assert_eq!(check, "ok");
        conn.close().await.expect("close raw");

        let store = SqliteStore::open(&path).await.expect("reopen after kill");
        let state = store.load("crash").await.expect("load").expect("deployment");
        let stored: std::collections::HashMap<&str, _> =
            state.resources.iter().map(|r| (r.step_id.as_str(), r)).collect();
        for step in &acked {
            let record = stored.get(step.as_str()).unwrap_or_else(|| {
                panic!(
                    "acknowledged {step} lost ({} acked, {} stored)",
                    acked.len(),
                    stored.len()
                )
            });
            assert_eq!(record.external_id, format!("ext-{step}"));
        }
        // The run never finished.
        let history = store.history("crash").await.expect("history");
        assert_eq!(history.len(), 1);
        assert_eq!(history[0].outcome, None);
        // The file is still writable.
        store
            .put_resource("crash", &c::resource("after"))
            .await
            .expect("put after crash");
        store.close().await.expect("close");
    });
}

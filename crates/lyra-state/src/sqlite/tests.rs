//! SQLite store tests: the shared conformance suite on real files, plus what only a file can
//! show (reopening, foreign files, two handles on one file, a writer killed mid-way).

// Child processes of these tests talk to the parent over stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::prelude::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{LeaseGrant, Store};
use lyra_core::state::{StoreError, StoreErrorKind};
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

// The conformance suite runs from `src/tests.rs`, on both backends.

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
async fn open_rejects_unknown_schemes() {
    let err = crate::open("mysql://x").await.err().expect("mysql must fail");
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert_eq!(StoreError::from(err).kind, StoreErrorKind::Unavailable);
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

/// The write connection's settings, as SQLite reports them.
fn writer_pragma(store: &SqliteStore, name: &str) -> i64 {
    store
        .writer
        .with_connection(|conn| conn.pragma_query_value(None, name, |row| row.get(0)))
        .expect("open")
        .expect(name)
}

#[tokio::test]
async fn pragmas_are_set() {
    let f = Fixture::new().await;
    let mode: String = f
        .store
        .read(|conn| Ok(conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?))
        .await
        .expect("mode");
    assert_eq!(mode, "wal");
    assert_eq!(writer_pragma(&f.store, "foreign_keys"), 1);
    // 1 = NORMAL.
    assert_eq!(writer_pragma(&f.store, "synchronous"), 1);
    assert_eq!(writer_pragma(&f.store, "busy_timeout"), 10_000);
    // Readers cannot write.
    let refused = f
        .store
        .read(|conn| Ok(conn.execute("DELETE FROM deployments", [])?))
        .await;
    assert!(refused.is_err(), "a read connection wrote");
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
    assert_eq!(writer_pragma(&store, "synchronous"), 2);
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

/// What `current_identity` says of the file at `path`, on a connection of its own.
fn current(path: &Path) -> Option<String> {
    let conn = rusqlite::Connection::open(path).expect("open raw");
    super::current_identity(&conn).unwrap_or(None)
}

/// A state already up to date is opened on one connection, without sqlx; anything sqlx's
/// migrator would change or refuse is left to it. Each refusal is checked to reach the full
/// open, which does what it did before: migrates, switches to WAL, or reports.
#[tokio::test]
async fn only_an_up_to_date_state_skips_the_migrator() {
    let f = Fixture::new().await;
    let id = f.store.store_id().to_owned();
    f.store.close().await.expect("close");
    assert_eq!(current(&f.path).as_deref(), Some(id.as_str()));
    let store = SqliteStore::open_existing(&f.path, &Default::default())
        .await
        .expect("open");
    assert_eq!(store.store_id(), id, "the same store, opened the short way");
    store.close().await.expect("close");

    // Not in WAL mode: the full open switches it back.
    let conn = rusqlite::Connection::open(&f.path).expect("open raw");
    let mode: String = conn
        .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "delete");
    drop(conn);
    assert_eq!(current(&f.path), None);
    SqliteStore::open(&f.path)
        .await
        .expect("open")
        .close()
        .await
        .expect("close");
    assert_eq!(current(&f.path).as_deref(), Some(id.as_str()));

    // A migration recorded as failed, or changed since it ran: sqlx refuses both.
    for (planted, undo) in [
        (
            "UPDATE _sqlx_migrations SET success = FALSE WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
            "UPDATE _sqlx_migrations SET success = TRUE",
        ),
        (
            "UPDATE _sqlx_migrations SET checksum = X'00' WHERE version = (SELECT min(version) FROM _sqlx_migrations)",
            "",
        ),
    ] {
        let conn = rusqlite::Connection::open(&f.path).expect("open raw");
        let checksum: Vec<u8> = conn
            .query_row(
                "SELECT checksum FROM _sqlx_migrations ORDER BY version LIMIT 1",
                [],
                |r| r.get(0),
            )
            .expect("checksum");
        conn.execute(planted, []).expect("plant");
        assert_eq!(current(&f.path), None, "{planted}");
        let err = SqliteStore::open_existing(&f.path, &Default::default())
            .await
            .expect_err("sqlx refuses it");
        assert!(matches!(&err, Error::Migrate { .. }), "{planted}: {err:?}");
        if undo.is_empty() {
            conn.execute(
                "UPDATE _sqlx_migrations SET checksum = ?1 WHERE version = (SELECT min(version) FROM _sqlx_migrations)",
                [checksum],
            )
            .expect("undo");
        } else {
            conn.execute(undo, []).expect("undo");
        }
        assert_eq!(current(&f.path).as_deref(), Some(id.as_str()), "{planted} undone");
    }

    // Another program's database, an empty file, no file: never a state this way.
    let other = f.path.with_file_name("other.db");
    let conn = rusqlite::Connection::open(&other).expect("create other");
    conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE notes (body TEXT);")
        .expect("other schema");
    drop(conn);
    assert_eq!(current(&other), None);
    let err = SqliteStore::open_existing(&other, &Default::default())
        .await
        .expect_err("not a state");
    assert!(matches!(&err, Error::NoState { .. }), "{err:?}");
    let empty = f.path.with_file_name("empty.db");
    std::fs::write(&empty, "").expect("empty file");
    assert_eq!(current(&empty), None);
    assert!(
        SqliteStore::open_current(&f.path.with_file_name("none.db"), &Default::default())
            .await
            .is_none()
    );
    assert!(
        !f.path.with_file_name("none.db").exists(),
        "the short way creates nothing"
    );
}

/// A record that does not decode (bad JSON, or JSON nested deeper than can be read, as older
/// versions could write) is listed as unreadable; the rest of the deployment stays readable.
#[tokio::test]
async fn undecodable_rows_are_listed_not_fatal() {
    for bad in ["{not json".to_owned(), format!("{{\"x\": {}}}", c::nested(200))] {
        let f = Fixture::new().await;
        c::seed_for_damage(&f.store).await;
        let mut conn = raw(&f.path).await;
        sqlx::query("UPDATE resources SET actual = ?1 WHERE step_id = 'a'")
            .bind(&bad)
            .execute(&mut conn)
            .await
            .expect("plant bad json");
        let state = f.store.load("d").await.expect("load").expect("d");
        assert!(state.unreadable[0].error.contains("resources.actual"), "{state:?}");
        c::damaged_record_is_listed(&f.store).await;
    }
}

/// Two stores on one file (as two processes would be) both write without "database is
/// locked": each waits for the other's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_file() {
    let f = Fixture::new().await;
    let other: Arc<dyn Store> = Arc::new(SqliteStore::open(&f.path).await.expect("second open"));
    let mine: Arc<dyn Store> = Arc::new(f.store);
    // `chunk` puts at a time: 1 is a chain of lone writes (autocommit), 30 gives batches.
    let write = |store: Arc<dyn Store>, deployment: &'static str, chunk: usize| {
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
/// How many steps the child runs at once.
const CRASH_LANES_ENV: &str = "LYRA_STATE_CRASH_CHILD_LANES";

/// The child: writes forever from several concurrent "steps", printing `ACK <step>` after each
/// write is acknowledged, until the parent kills it. A no-op in normal test runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Some(path) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let lanes: usize = std::env::var(CRASH_LANES_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    let store = SqliteStore::open(Path::new(&path)).await.expect("child open");
    store.begin_run(&c::apply("crash", "wf")).await.expect("begin_run");
    let store = &store;
    let lanes = (0..lanes).map(|lane| async move {
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
    killed_writer_loses_nothing_it_acknowledged(8, 2000);
}

/// As above with many more steps writing at once than [`super::writer::OFFLOAD_AT`], so the
/// child is killed while a blocking thread commits its crowds.
#[test]
fn killed_writer_in_a_crowd_loses_no_acknowledged_write() {
    killed_writer_loses_nothing_it_acknowledged(8 * super::writer::OFFLOAD_AT, 6000);
}

fn killed_writer_loses_nothing_it_acknowledged(lanes: usize, kill_after: usize) {
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
        .env(CRASH_LANES_ENV, lanes.to_string())
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
    while acked.len() < kill_after {
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

// --- Leases across handles and processes -----------------------------------------------------

/// Two stores on one file (as two CLIs would be) race for one lease: exactly one gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_across_two_handles() {
    let f = Fixture::new().await;
    let other = SqliteStore::open(&f.path).await.expect("second open");
    for round in 0..20 {
        let deployment = format!("d{round}");
        let a = c::lease_request(&deployment, "one@host", "token-one", 60_000);
        let b = c::lease_request(&deployment, "two@host", "token-two", 60_000);
        let (x, y) = tokio::join!(f.store.acquire_lease(&a), other.acquire_lease(&b));
        let acquired = [x.expect("acquire"), y.expect("acquire")]
            .iter()
            .filter(|g| matches!(g, LeaseGrant::Acquired(_)))
            .count();
        assert_eq!(acquired, 1, "round {round}");
    }
}

/// Set (to the database path) in the children of [`lease_across_processes`].
const LEASE_CHILD_ENV: &str = "LYRA_STATE_LEASE_CHILD_DB";

/// The child: tries once for the lease and prints the answer. A no-op in normal test runs.
#[tokio::test]
async fn lease_child() {
    let Some(path) = std::env::var_os(LEASE_CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&path)).await.expect("child open");
    let me = format!("pid{}", std::process::id());
    match store
        .acquire_lease(&c::lease_request("shared", &me, &me, 60_000))
        .await
        .expect("acquire")
    {
        LeaseGrant::Acquired(_) => println!("LEASE ACQUIRED {me}"),
        LeaseGrant::Held(holder) => println!("LEASE HELD {}", holder.owner),
    }
    store.close().await.expect("close");
}

/// Real processes on one file, started together: exactly one gets the lease and the others
/// are told who.
#[test]
fn lease_across_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lease.db");
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "sqlite::tests::lease_child",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(LEASE_CHILD_ENV, &path)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let mut winners = Vec::new();
    let mut told = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("child output");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // The harness prints "test … ... " on the same line, before the child's output.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((_, me)) = line.split_once("LEASE ACQUIRED ") {
                winners.push(me.to_owned());
            } else if let Some((_, holder)) = line.split_once("LEASE HELD ") {
                told.push(holder.to_owned());
            }
        }
    }
    assert_eq!(winners.len(), 1, "winners {winners:?}, told {told:?}");
    assert_eq!(told.len(), 3);
    assert!(told.iter().all(|h| *h == winners[0]), "{told:?} vs {winners:?}");
}

// --- Upgrades ---------------------------------------------------------------------------------

/// A state file at `path` as an older Lyra left it: made by the first `version` embedded
/// migrations (run from a copy in `dir`), the schema of that version. The connection fills it
/// with that version's rows.
async fn schema_at(dir: &Path, path: &Path, version: usize) -> SqliteConnection {
    let old = dir.join("old-migrations");
    std::fs::create_dir(&old).expect("mkdir");
    let all = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&all)
        .expect("the migrations")
        .map(|e| e.expect("an entry").path())
        .collect();
    files.sort();
    assert!(files.len() > version, "schema v{version} is not older than this one");
    for file in &files[..version] {
        std::fs::copy(file, old.join(file.file_name().expect("a name"))).expect("copy a migration");
    }
    let mut conn = SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .expect("create the old file");
    sqlx::migrate::Migrator::new(old.as_path())
        .await
        .expect("old migrator")
        .run(&mut conn)
        .await
        .expect("migrate to the old schema");
    conn
}

/// A file written by the first schema (before leases) upgrades in place: rows, run ids and
/// the id sequence are kept, and the new columns have their defaults.
#[tokio::test]
async fn upgrade_from_schema_v1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.db");
    let mut conn = schema_at(dir.path(), &path, 1).await;
    sqlx::raw_sql(
        "INSERT INTO deployments VALUES ('d', 'wf', 1, 1);
         INSERT INTO resources VALUES ('d', 'a', 'T::T', 'x', '{}', '{}', '[]', 1, 1);
         INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes)
             VALUES ('d', 'wf', 'apply', 'me', 1, '{}', '[]'), ('d', 'wf', 'delete', 'me', 2, '{}', '[]');
         DELETE FROM runs WHERE id = 2;",
    )
    .execute(&mut conn)
    .await
    .expect("v1 rows");
    conn.close().await.expect("close v1");

    let store = SqliteStore::open(&path).await.expect("upgrade");
    let state = store.load("d").await.expect("load").expect("kept");
    assert_eq!(state.resources.len(), 1);
    assert!(!state.resources[0].pending);
    let history = store.history("d").await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!((history[0].id, history[0].note.as_deref()), (1, None));
    // AUTOINCREMENT still never reuses the deleted id 2.
    let next = store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    assert_eq!(next, 3);
    let mut unlock = c::apply("d", "wf");
    unlock.operation = lyra_core::state::Operation::Unlock;
    store.begin_run(&unlock).await.expect("the wider CHECK accepts unlock");
    let mut raw = raw(&path).await;
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'")
            .fetch_all(&mut raw)
            .await
            .expect("indexes");
    assert!(indexes.contains(&"runs_by_deployment".to_owned()), "{indexes:?}");
    let check: String = sqlx::query_scalar("PRAGMA foreign_key_check")
        .fetch_optional(&mut raw)
        .await
        .expect("fk check")
        .unwrap_or_else(|| "ok".to_owned());
    assert_eq!(check, "ok");
}

/// A file written by schema v2 (before store ids and create keys) upgrades in place: the store
/// gets an id, pending records the key their create was asked with then
/// (`<deployment>/<step id>`), and notes lose the URLs that could hold a password.
#[tokio::test]
async fn upgrade_from_schema_v2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.db");
    let mut conn = schema_at(dir.path(), &path, 2).await;
    sqlx::raw_sql(
        "INSERT INTO deployments VALUES ('d', 'wf', 1, 1);
         INSERT INTO resources (deployment, step_id, type_name, external_id, desired, actual, depends_on,
                                managed, pending, updated_at)
             VALUES ('d', 'done', 'T::T', 'x', '{}', '{}', '[]', 1, 0, 1),
                    ('d', 'vm/0', 'T::T', '', '{}', '{}', '[]', 1, 1, 1);
         INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes, note)
             VALUES ('d', 'wf', 'import', 'me', 1, '{}', '[]',
                     'migrated from postgres://u:***@db/state?password=hunter2&schema=s'),
                    ('d', 'wf', 'unlock', 'me', 2, '{}', '[]', 'broke alice''s lease');",
    )
    .execute(&mut conn)
    .await
    .expect("v2 rows");
    conn.close().await.expect("close v2");

    let store = SqliteStore::open(&path).await.expect("upgrade");
    let id = store.store_id().to_owned();
    assert!(is_uuid(&id), "{id}");
    let state = store.load("d").await.expect("load").expect("kept");
    let key = |step: &str| state.resource(step).expect(step).create_key.clone();
    assert_eq!(key("done"), None);
    assert_eq!(key("vm/0").as_deref(), Some("d/vm/0"), "the key the old create used");
    let notes: Vec<Option<String>> = sqlx::query_scalar("SELECT note FROM runs ORDER BY id")
        .fetch_all(&mut raw(&path).await)
        .await
        .expect("notes");
    assert_eq!(
        notes,
        [
            Some("migrated from postgres://(address removed: it could hold a password)".to_owned()),
            Some("broke alice's lease".to_owned()),
        ]
    );
    store.close().await.expect("close");
    let again = SqliteStore::open(&path).await.expect("reopen");
    assert_eq!(again.store_id(), id, "made once, with the store");
}

/// A file written by schema v3 (before `refresh` runs) upgrades in place: runs keep their
/// rows, notes and ids, the id sequence is kept, the index is rebuilt, and the wider CHECK
/// takes `refresh`.
#[tokio::test]
async fn upgrade_from_schema_v3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v3.db");
    let mut conn = schema_at(dir.path(), &path, 3).await;
    sqlx::raw_sql(
        "INSERT INTO deployments VALUES ('d', 'wf', 1, 1);
         INSERT INTO runs (deployment, workflow, operation, actor, started_at, finished_at, outcome, counts,
                           changes, note)
             VALUES ('d', 'wf', 'apply', 'me', 1, 2, 'succeeded', '{}', '[{\"step_id\":\"a\",\"action\":\"create\"}]', NULL),
                    ('d', 'wf', 'forget', 'me', 3, 4, 'succeeded', '{}', '[]', 'forgot 1 resource(s)'),
                    ('d', 'wf', 'apply', 'me', 5, NULL, NULL, '{}', '[]', NULL);
         DELETE FROM runs WHERE id = 3;",
    )
    .execute(&mut conn)
    .await
    .expect("v3 rows");
    conn.close().await.expect("close v3");

    let store = SqliteStore::open(&path).await.expect("upgrade");
    let history = store.history("d").await.expect("history");
    let kept: Vec<(i64, Option<&str>)> = history.iter().map(|r| (r.id, r.note.as_deref())).collect();
    assert_eq!(kept, [(2, Some("forgot 1 resource(s)")), (1, None)]);
    assert_eq!(history[1].changes[0].step_id, "a");
    let mut refresh = c::apply("d", "wf");
    refresh.operation = lyra_core::state::Operation::Refresh;
    let next = store
        .begin_run(&refresh)
        .await
        .expect("the wider CHECK accepts refresh");
    assert_eq!(next, 4, "the deleted id 3 is never reused");
    assert_eq!(
        store.history("d").await.expect("history")[0].operation,
        lyra_core::state::Operation::Refresh
    );
    let mut raw = raw(&path).await;
    let indexes: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'")
            .fetch_all(&mut raw)
            .await
            .expect("indexes");
    assert!(indexes.contains(&"runs_by_deployment".to_owned()), "{indexes:?}");
    let check: Option<String> = sqlx::query_scalar("PRAGMA foreign_key_check")
        .fetch_optional(&mut raw)
        .await
        .expect("fk check");
    assert_eq!(check, None, "no dangling foreign key");
    let refused = sqlx::query("INSERT INTO runs (deployment, operation, actor, started_at, counts, changes) VALUES ('d', 'nonsense', 'me', 1, '{}', '[]')")
        .execute(&mut raw)
        .await;
    assert!(refused.is_err(), "the CHECK is still there");
}

/// A file written by schema v5 (resources with a row id) upgrades in place: every record is
/// kept as it was, and `resources` becomes one b-tree keyed by (deployment, step_id).
#[tokio::test]
async fn upgrade_from_schema_v5() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v5.db");
    let mut conn = schema_at(dir.path(), &path, 5).await;
    sqlx::raw_sql(
        "INSERT INTO deployments VALUES ('d', 'wf', 1, 1), ('e', NULL, 1, 1);
         INSERT INTO resources (deployment, step_id, type_name, external_id, desired, actual, depends_on,
                                managed, updated_at, pending, sensitive, create_key)
             VALUES ('d', 'b', 'T::T', 'x', '{\"k\":1}', '{\"k\":2}', '[\"a\"]', 1, 7, 0, '[\"k\"]', NULL),
                    ('d', 'a', 'T::T', '', '{}', '{}', '[]', 1, 8, 1, '[]', 'key-a'),
                    ('e', 'a', 'U::U', 'y', '{}', '{}', '[]', 0, 9, 0, '[]', NULL);",
    )
    .execute(&mut conn)
    .await
    .expect("v5 rows");
    conn.close().await.expect("close v5");

    let store = SqliteStore::open(&path).await.expect("upgrade");
    let state = store.load("d").await.expect("load").expect("kept");
    let ids: Vec<&str> = state.resources.iter().map(|r| r.step_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"], "in step order");
    let (a, b) = (&state.resources[0], &state.resources[1]);
    assert!(a.pending && a.managed);
    assert_eq!(a.create_key.as_deref(), Some("key-a"));
    assert_eq!(b.desired["k"], 1);
    assert_eq!(b.actual["k"], 2);
    assert_eq!(
        (b.depends_on.as_slice(), b.sensitive.as_slice()),
        (&["a".to_owned()][..], &["k".to_owned()][..])
    );
    let other = store.load("e").await.expect("load").expect("kept");
    assert!(!other.resources[0].managed);
    store
        .put_resource("d", &c::resource("c"))
        .await
        .expect("writes after the upgrade");
    store.drop_deployment("e").await.expect("drop");

    let mut raw = raw(&path).await;
    let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_master WHERE name = 'resources'")
        .fetch_one(&mut raw)
        .await
        .expect("schema");
    assert!(sql.contains("WITHOUT ROWID"), "{sql}");
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM resources WHERE deployment = 'e'")
        .fetch_one(&mut raw)
        .await
        .expect("count");
    assert_eq!(left, 0, "dropping a deployment still drops its resources");
    let check: Option<String> = sqlx::query_scalar("PRAGMA foreign_key_check")
        .fetch_optional(&mut raw)
        .await
        .expect("fk check");
    assert_eq!(check, None, "no dangling foreign key");
}

/// Every store has an id of its own, kept across opens.
#[tokio::test]
async fn store_ids_are_random_and_stable() {
    let one = Fixture::new().await;
    let two = Fixture::new().await;
    assert!(is_uuid(one.store.store_id()), "{}", one.store.store_id());
    assert_ne!(one.store.store_id(), two.store.store_id());
    let id = one.store.store_id().to_owned();
    let again = SqliteStore::open(&one.path).await.expect("reopen");
    assert_eq!(again.store_id(), id);
}

/// A note written with a credential is stored without it, not only shown without it.
#[tokio::test]
async fn credentials_never_reach_the_file() {
    let f = Fixture::new().await;
    c::history_keeps_no_credentials(&f.store).await;
    f.store.close().await.expect("close");
    let bytes = std::fs::read(&f.path).expect("read db");
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("password=***"), "the notes are in the file");
    assert!(!text.contains("hunter2"), "a credential reached the file");
}

/// `xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx`, lowercase.
pub(crate) fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && s.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        && groups[2].starts_with('4')
        && groups[3].starts_with(['8', '9', 'a', 'b'])
}

/// Callers that give up while their write is queued or being committed (their future dropped
/// after one poll, possibly while leading a batch that holds other callers' writes) cut no one
/// else short: every write that was waited for lands, and the store goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_giving_up_cut_no_one_else_short() {
    let f = Fixture::new().await;
    f.store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    let mut waited = Vec::new();
    let mut queued = Vec::new();
    for round in 0..20 {
        // Crowds past the hand-off to a blocking thread, and smaller ones that stay inline.
        let n = if round % 2 == 0 {
            60
        } else {
            5 * super::writer::OFFLOAD_AT
        };
        let records: Vec<_> = (0..n).map(|i| c::resource(&format!("r{round:02}-{i:03}"))).collect();
        queued.extend(records.iter().cloned());
        let calls = records.iter().enumerate().map(|(i, r)| {
            let store = &f.store;
            async move {
                let put = store.put_resource("d", r);
                if i % 3 == 0 {
                    // One poll: queued, perhaps leading; then dropped.
                    let _ = tokio::time::timeout(Duration::ZERO, put).await;
                    None
                } else {
                    Some((r.clone(), put.await))
                }
            }
        });
        for (record, result) in futures::future::join_all(calls).await.into_iter().flatten() {
            result.expect("a put that was waited for lands");
            waited.push(record);
        }
    }
    assert!(f.store.writer.offloaded_batches() > 0, "no crowd was handed over");
    let state = f.store.load("d").await.expect("load").expect("deployment");
    for record in &waited {
        assert!(state.resources.contains(record), "{} is missing", record.step_id);
    }
    f.store
        .put_resource("d", &c::resource("last"))
        .await
        .expect("the store still writes");
    f.store.close().await.expect("close");
    // Those given up on were queued all the same: committed by the time the store closed.
    let store = SqliteStore::open(&f.path).await.expect("reopen");
    let state = store.load("d").await.expect("load").expect("deployment");
    for record in &queued {
        assert!(
            state.resources.contains(record),
            "{} (given up on) is missing",
            record.step_id
        );
    }
    store.close().await.expect("close");
}

/// The load decodes each record from the column text SQLite lends it: text holding
/// separators, digits, multi-byte characters or nothing at all reads back exactly, with and
/// without a create key.
#[tokio::test]
async fn awkward_text_reads_back_exactly() {
    let f = Fixture::new().await;
    let mut odd = c::resource("a:1;-/é");
    odd.type_name = "Ns::Type".into();
    odd.external_id = String::new();
    odd.desired = serde_json::json!({"k": "12:3;-", "ü": "日本", "n": 7})
        .as_object()
        .unwrap()
        .clone();
    odd.actual = serde_json::Map::new();
    odd.sensitive = vec!["k".into()];
    odd.depends_on = vec!["b".into(), "-".into()];
    let mut pending = c::resource("-9:");
    pending.pending = true;
    pending.managed = false;
    pending.external_id = String::new();
    pending.create_key = Some("k:;-".into());
    for r in [&odd, &pending] {
        f.store.put_resource("d", r).await.expect("put");
    }
    let state = f.store.load("d").await.expect("load").expect("recorded");
    let mut expected = vec![pending, odd];
    expected.sort_by(|a, b| a.step_id.cmp(&b.step_id));
    assert_eq!(state.resources, expected);
    assert!(state.unreadable.is_empty());
}

/// Text that is not UTF-8 (another program wrote the file) makes the load fail as corrupt,
/// not panic.
#[tokio::test]
async fn a_column_of_the_wrong_type_is_corrupt() {
    let f = Fixture::new().await;
    f.store.put_resource("d", &c::resource("a")).await.expect("put");
    let mut conn = raw(&f.path).await;
    sqlx::query("UPDATE resources SET external_id = CAST(X'FF00' AS TEXT)")
        .execute(&mut conn)
        .await
        .expect("plant bytes that are not UTF-8");
    let err = f.store.load("d").await.expect_err("not UTF-8");
    assert_eq!(err.kind, StoreErrorKind::Corrupt, "{err}");
}

/// Reads at once are bounded by `read_connections`: a read waits while that many streams are
/// still reading (more records than they read ahead), and goes on once one is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_wait_for_a_free_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = super::SqliteOptions {
        read_connections: 2,
        ..Default::default()
    };
    let store = SqliteStore::open_with(&dir.path().join("s.db"), &options)
        .await
        .expect("open");
    for i in 0..200 {
        store
            .put_resource("d", &c::resource(&format!("r{i:03}")))
            .await
            .expect("put");
    }
    let one = store.records("d").await.expect("records").expect("d");
    let two = store.records("d").await.expect("records").expect("d");
    let waiting = tokio::time::timeout(Duration::from_millis(300), store.load("d")).await;
    assert!(waiting.is_err(), "a third read ran with two streams open");
    drop(one);
    let state = tokio::time::timeout(Duration::from_secs(30), store.load("d"))
        .await
        .expect("the read goes on once a stream is dropped")
        .expect("load")
        .expect("d");
    assert_eq!(state.resources.len(), 200);
    drop(two);
    store.close().await.expect("close");
}

// --- Crowds of writes: the queue handed to a blocking thread ----------------------------------

/// `n` puts of one record, queued in order by callers that do not wait for each other: the
/// last queued must be what is stored, whoever committed each batch.
async fn queued_in_order_land_in_order(store: &SqliteStore, deployment: &str, n: usize) {
    let versions: Vec<_> = (0..n)
        .map(|i| {
            let mut record = c::resource("same");
            record.desired.insert("version".into(), i.into());
            record
        })
        .collect();
    // `join_all` polls in order, so each put is queued before the next.
    let puts = versions.iter().map(|r| store.put_resource(deployment, r));
    for result in futures::future::join_all(puts).await {
        result.expect("put");
    }
    let state = store.load(deployment).await.expect("load").expect("deployment");
    let stored = state.resources.iter().find(|r| r.step_id == "same").expect("stored");
    assert_eq!(
        stored.desired["version"],
        serde_json::json!(n - 1),
        "an earlier write won"
    );
}

/// The CLI's case: one runtime thread, thousands of independent steps writing at once.
#[test]
fn a_crowd_on_one_thread_lands_whole_and_in_order() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let f = Fixture::new().await;
        f.store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
        let n = 5 * super::writer::OFFLOAD_AT * 16;
        let records: Vec<_> = (0..n).map(|i| c::resource(&format!("r{i:05}"))).collect();
        let puts = records.iter().map(|r| f.store.put_resource("d", r));
        for result in futures::future::join_all(puts).await {
            result.expect("put");
        }
        assert!(
            f.store.writer.offloaded_batches() > 0,
            "the crowd stayed on the runtime thread"
        );
        let state = f.store.load("d").await.expect("load").expect("deployment");
        assert_eq!(state.resources.len(), n);
        for record in &records {
            assert!(state.resources.contains(record), "{} is missing", record.step_id);
        }
        // Crowds, then lone writes, then crowds again: each change of committer keeps order.
        for round in 0..4 {
            let before = f.store.writer.offloaded_batches();
            queued_in_order_land_in_order(&f.store, "d", 3 * super::writer::OFFLOAD_AT + round).await;
            assert!(
                f.store.writer.offloaded_batches() > before,
                "round {round} stayed inline"
            );
            queued_in_order_land_in_order(&f.store, "d", 1 + round).await;
        }
        f.store.close().await.expect("close");
        let store = SqliteStore::open(&f.path).await.expect("reopen");
        let state = store.load("d").await.expect("load").expect("deployment");
        assert_eq!(state.resources.len(), n + 1);
        store.close().await.expect("close");
    });
}

/// Several runtime threads writing crowds and lone writes at once: inline leaders and the
/// blocking committer take turns on one queue, and nothing is lost, reordered or stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crowds_from_several_threads_keep_their_order() {
    let f = Fixture::new().await;
    let store = Arc::new(f.store);
    let mut tasks = Vec::new();
    for lane in 0..4 {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let deployment = format!("lane{lane}");
            store.begin_run(&c::apply(&deployment, "wf")).await.expect("begin_run");
            for round in 0..6 {
                let n = if (lane + round) % 2 == 0 {
                    4 * super::writer::OFFLOAD_AT
                } else {
                    3
                };
                queued_in_order_land_in_order(&store, &deployment, n).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("lane");
    }
    let store = Arc::into_inner(store).expect("sole owner");
    assert!(store.writer.offloaded_batches() > 0, "no crowd was handed over");
    store.close().await.expect("close");
}

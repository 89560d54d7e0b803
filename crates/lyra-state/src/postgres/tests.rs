//! Postgres-only tests: URLs and schemas, connection faults. The conformance suite runs from
//! `src/tests.rs`.

// Tests report what they measured on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use crate::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::Store;
use lyra_core::state::{StoreError, StoreErrorKind};
use sqlx::{Connection, PgConnection};

use super::PostgresStore;
use crate::Error;
use crate::conformance as c;
use crate::testing::PgTestDb;

#[tokio::test]
async fn unreachable_server_is_unavailable_without_the_password() {
    let err = PostgresStore::connect("postgres://lyra:s3cret-pw@127.0.0.1:1/state?schema=x")
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, Error::PgConnect { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("127.0.0.1:1/state"), "{message}");
    assert!(!format!("{err:?}").contains("s3cret-pw"), "{err:?}");
    assert_eq!(StoreError::from(err).kind, StoreErrorKind::Unavailable);

    let err = crate::open("postgres://lyra:s3cret-pw@127.0.0.1/state?schema=Bad")
        .await
        .err()
        .expect("bad schema");
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");
}

/// `open` picks Postgres from the URL, schemas keep states apart, and several processes
/// opening one new schema at once migrate it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_are_separate_states() {
    let (Some(one), Some(two)) = (
        PgTestDb::create("schemas_one").await,
        PgTestDb::create("schemas_two").await,
    ) else {
        return;
    };
    let opens = (0..4).map(|_| crate::open(one.url()));
    let stores: Vec<Arc<dyn Store>> = futures::future::join_all(opens)
        .await
        .into_iter()
        .map(|s| s.expect("concurrent open"))
        .collect();
    let other = crate::open(&format!("postgresql{}", two.url().trim_start_matches("postgres")))
        .await
        .expect("postgresql:// form");
    stores[0].begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    stores[1].put_resource("d", &c::resource("a")).await.expect("put");
    assert_eq!(stores[3].load("d").await.expect("load").expect("d").resources.len(), 1);
    assert_eq!(other.load("d").await.expect("load"), None);
    assert!(other.list().await.expect("list").is_empty());

    // The tables are in the schema, not in `public`.
    let mut raw = PgConnection::connect(one.server_url()).await.expect("raw");
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1")
            .bind(one.schema())
            .fetch_all(&mut raw)
            .await
            .expect("tables");
    assert_eq!(
        tables,
        [
            "_sqlx_migrations",
            "deployments",
            "leases",
            "resources",
            "runs",
            "store_identity"
        ]
    );
    // Each schema is a store of its own, with its own id, the same for every opener.
    let ids: Vec<&str> = stores.iter().map(|s| s.store_id()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert!(crate::sqlite::tests::is_uuid(ids[0]), "{ids:?}");
    assert_ne!(other.store_id(), ids[0]);
}

async fn applied(raw: &mut PgConnection) -> Vec<crate::rows::AppliedMigration> {
    sqlx::query_as(crate::rows::APPLIED_MIGRATIONS)
        .fetch_all(raw)
        .await
        .expect("applied")
}

/// A state already up to date skips sqlx's migrator; one it would change or refuse does not:
/// a migration recorded as failed, or altered since it ran, is still refused on open.
#[tokio::test]
async fn only_an_up_to_date_state_skips_the_migrator() {
    let Some(db) = PgTestDb::create("skips_migrator").await else {
        return;
    };
    let store = PostgresStore::connect(db.url()).await.expect("create");
    let id = store.store_id().to_owned();
    store.close().await;
    let mut raw = PgConnection::connect(db.server_url()).await.expect("raw");
    // `schema` is our own generated identifier.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET search_path TO {}", db.schema())))
        .execute(&mut raw)
        .await
        .expect("search path");
    assert!(crate::rows::applied_as_embedded(
        &super::MIGRATOR,
        &applied(&mut raw).await
    ));
    let reopened = PostgresStore::connect_existing(db.url(), &Default::default())
        .await
        .expect("reopen");
    assert_eq!(reopened.store_id(), id);
    reopened.close().await;

    for (planted, undo) in [
        (
            "UPDATE _sqlx_migrations SET success = FALSE WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
            "UPDATE _sqlx_migrations SET success = TRUE",
        ),
        (
            "UPDATE _sqlx_migrations SET checksum = checksum || '\\x00'::bytea \
             WHERE version = (SELECT min(version) FROM _sqlx_migrations)",
            "UPDATE _sqlx_migrations SET checksum = substring(checksum FROM 1 FOR length(checksum) - 1) \
             WHERE version = (SELECT min(version) FROM _sqlx_migrations)",
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(planted))
            .execute(&mut raw)
            .await
            .expect("plant");
        assert!(
            !crate::rows::applied_as_embedded(&super::MIGRATOR, &applied(&mut raw).await),
            "{planted}"
        );
        let err = PostgresStore::connect_existing(db.url(), &Default::default())
            .await
            .expect_err("sqlx refuses it");
        assert!(matches!(&err, Error::PgMigrate { .. }), "{planted}: {err:?}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(undo))
            .execute(&mut raw)
            .await
            .expect("undo");
        assert!(
            crate::rows::applied_as_embedded(&super::MIGRATOR, &applied(&mut raw).await),
            "{undo}"
        );
    }
    raw.close().await.expect("close raw");
}

/// A schema written by v1 (before store ids and create keys) upgrades in place, as SQLite's
/// v2 does: an id for the store, the old key for pending records, notes without URLs that
/// could hold a password.
#[tokio::test]
async fn upgrade_from_schema_v1() {
    let Some(db) = PgTestDb::create("upgrade_v1").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres/0001_initial.sql"),
        dir.path().join("0001_initial.sql"),
    )
    .expect("copy v1");
    let mut raw = PgConnection::connect(db.server_url()).await.expect("raw");
    // `schema` is our own generated identifier.
    let schema = db.schema();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema}"
    )))
    .execute(&mut raw)
    .await
    .expect("schema");
    sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("v1 migrator")
        .run(&mut raw)
        .await
        .expect("migrate to v1");
    sqlx::raw_sql(
        "INSERT INTO deployments VALUES ('d', 'wf', 1, 1);
         INSERT INTO resources (deployment, step_id, type_name, external_id, desired, actual, depends_on,
                                managed, pending, updated_at)
             VALUES ('d', 'done', 'T::T', 'x', '{}', '{}', '[]', TRUE, FALSE, 1),
                    ('d', 'vm/0', 'T::T', '', '{}', '{}', '[]', TRUE, TRUE, 1);
         INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes, note)
             VALUES ('d', 'wf', 'import', 'me', 1, '{}', '[]',
                     'migrated from postgres://u:***@db/state?password=hunter2&schema=s');",
    )
    .execute(&mut raw)
    .await
    .expect("v1 rows");

    let store = PostgresStore::connect(db.url()).await.expect("upgrade");
    assert!(crate::sqlite::tests::is_uuid(store.store_id()), "{}", store.store_id());
    let state = store.load("d").await.expect("load").expect("kept");
    let key = |step: &str| state.resource(step).expect(step).create_key.clone();
    assert_eq!(key("done"), None);
    assert_eq!(key("vm/0").as_deref(), Some("d/vm/0"), "the key the old create used");
    let note: Option<String> = sqlx::query_scalar("SELECT note FROM runs")
        .fetch_one(&mut raw)
        .await
        .expect("note");
    assert_eq!(
        note.as_deref(),
        Some("migrated from postgres://(address removed: it could hold a password)")
    );
    let mut refresh = c::apply("d", "wf");
    refresh.operation = lyra_core::state::Operation::Refresh;
    store
        .begin_run(&refresh)
        .await
        .expect("the widened CHECK accepts refresh");
    let id = store.store_id().to_owned();
    store.close().await;
    let again = PostgresStore::connect(db.url()).await.expect("reopen");
    assert_eq!(again.store_id(), id, "made once, with the store");
}

/// Backends are killed (`pg_terminate_backend`) again and again while many steps record their
/// outcomes: every put either succeeds, and is then stored, or fails as Unavailable. Nothing
/// reported as written is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_lose_nothing() {
    const LANES: usize = 8;
    const PUTS: usize = 150;
    let Some(db) = PgTestDb::create("terminated_connections").await else {
        return;
    };
    let app = format!("lyra-fault-{:08x}", rand::random::<u32>());
    let store = Arc::new(
        PostgresStore::connect(&format!("{}&application_name={app}", db.url()))
            .await
            .expect("connect"),
    );
    store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");

    let done = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (done, killed, base) = (done.clone(), killed.clone(), db.server_url().to_owned());
        tokio::spawn(async move {
            let mut conn = PgConnection::connect(&base).await.expect("killer connect");
            while !done.load(Ordering::SeqCst) {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                       AND application_name = $1",
                )
                .bind(&app)
                .fetch_one(&mut conn)
                .await
                .expect("terminate");
                killed.fetch_add(usize::try_from(n).unwrap_or(0), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    let lanes = (0..LANES).map(|lane| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut results = Vec::new();
            for i in 0..PUTS {
                let record = c::resource(&format!("lane{lane}/{i:04}"));
                let result = store.put_resource("d", &record).await;
                results.push((record, result));
            }
            results
        })
    });
    let results: Vec<_> = futures::future::join_all(lanes)
        .await
        .into_iter()
        .flat_map(|r| r.expect("lane"))
        .collect();
    done.store(true, Ordering::SeqCst);
    killer.await.expect("killer");

    let stored = store.load("d").await.expect("load after faults").expect("d");
    let mut written = 0;
    for (record, result) in &results {
        match result {
            Ok(()) => {
                written += 1;
                assert_eq!(stored.resource(&record.step_id), Some(record), "acknowledged put lost");
            }
            Err(e) => assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}"),
        }
    }
    let killed = killed.load(Ordering::SeqCst);
    eprintln!(
        "{written}/{} puts acknowledged with {killed} backends terminated meanwhile",
        results.len()
    );
    assert!(killed > 0, "the test never terminated a backend");
    // Retries make faults invisible here: the server stays up.
    assert_eq!(written, results.len());
}

/// After retrying for `retry_for`, a call fails as Unavailable, naming the server.
#[tokio::test]
async fn exhausted_retries_are_unavailable() {
    let Some(db) = PgTestDb::create("exhausted_retries").await else {
        return;
    };
    let store = PostgresStore::connect(db.url()).await.expect("connect");
    store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    // The same server through a port nothing listens on: every connection attempt fails.
    let mut broken = PostgresStore::connect(db.url()).await.expect("connect");
    broken.pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(200))
        .connect_lazy_with(sqlx::postgres::PgConnectOptions::new().host("127.0.0.1").port(1));
    broken.retry_for = Duration::from_millis(600);
    let started = std::time::Instant::now();
    let err = broken
        .put_resource("d", &c::resource("a"))
        .await
        .expect_err("cannot connect");
    assert_eq!(err.kind, StoreErrorKind::Unavailable);
    assert!(
        err.message
            .starts_with("lost the connection to the Postgres state at 127.0.0.1:"),
        "{}",
        err.message
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let err = broken
        .begin_run(&c::apply("d", "wf"))
        .await
        .expect_err("cannot connect");
    assert_eq!(err.kind, StoreErrorKind::Unavailable);
}

/// A record that does not decode is listed as unreadable; the rest stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_rows_are_listed_not_fatal() {
    let Some(db) = PgTestDb::create("undecodable_rows").await else {
        return;
    };
    let store = PostgresStore::connect(db.url()).await.expect("connect");
    c::seed_for_damage(&store).await;
    let mut raw = PgConnection::connect(db.server_url()).await.expect("raw");
    let deep = format!("{{\"x\": {}}}", c::nested(200));
    // The schema name is the test's own (letters, digits, underscores).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.resources SET actual = $1 WHERE step_id = 'a'",
        db.schema()
    )))
    .bind(&deep)
    .execute(&mut raw)
    .await
    .expect("plant deep json");
    c::damaged_record_is_listed(&store).await;
    store.close().await;
}

/// A store on `db` and a fence under the lease of deployment `d`.
async fn leased_store(db: &PgTestDb) -> (PostgresStore, crate::Fence) {
    let store = PostgresStore::connect(db.url()).await.expect("connect");
    let lease = c::acquired(&store, &c::lease_request("d", "alice@laptop", "token-t", 60_000)).await;
    (store, crate::Fence::from(&lease))
}

/// Concurrent fenced puts of one run are written together (fewer statements than puts), and
/// every one of them is committed when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_are_written_together() {
    let Some(db) = PgTestDb::create("puts_together").await else {
        return;
    };
    let (store, fence) = leased_store(&db).await;
    let records: Vec<_> = (0..200).map(|i| c::resource(&format!("r{i:03}"))).collect();
    let others = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(db.server_url())
        .await
        .expect("another pool");
    let puts = records.iter().map(|r| async {
        store.put_resource_fenced(&fence, r).await.expect("put");
        // Committed once it returns: another connection sees it.
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".resources WHERE step_id = $1",
            db.schema()
        )))
        .bind(&r.step_id)
        .fetch_one(&others)
        .await
        .expect("count");
        assert_eq!(n, 1, "{} not committed when its put returned", r.step_id);
    });
    futures::future::join_all(puts).await;
    assert!(
        store.groups.together.load(Ordering::Relaxed) > 0,
        "no puts were written together"
    );
    assert!(store.groups.is_idle());
    assert_eq!(store.load("d").await.expect("load").expect("d").resources, records);
    store.close().await;
}

/// Puts made at once, as by the steps a run makes ready together, are one group: the first
/// lets the others queue behind it before it writes, rather than writing alone and leaving
/// them to a second statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_made_at_once_are_one_statement() {
    let Some(db) = PgTestDb::create("puts_at_once").await else {
        return;
    };
    let (store, fence) = leased_store(&db).await;
    let records: Vec<_> = (0..10).map(|i| c::resource(&format!("r{i:02}"))).collect();
    // Polled in turn by one task, as the engine polls a scope's steps.
    futures::future::join_all(records.iter().map(|r| store.put_resource_fenced(&fence, r)))
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()
        .expect("puts");
    assert_eq!(store.groups.largest.load(Ordering::Relaxed), records.len());
    assert_eq!(store.groups.together.load(Ordering::Relaxed), 1);
    assert!(store.groups.is_idle());
    assert_eq!(store.load("d").await.expect("load").expect("d").resources, records);
    store.close().await;
}

/// A run under a lease taken with `release_at_finish`: its finish releases the lease in the
/// same statement (the lease is free before `run_under_lease` releases it), the release
/// afterwards says the lease was kept, and nothing marks it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_releases_the_lease_it_ran_under() {
    use lyra_core::state::{Outcome, Recorder as _};
    let Some(db) = PgTestDb::create("finish_releases").await else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(PostgresStore::connect(db.url()).await.expect("connect"));
    let options = crate::lease::LeaseOptions {
        release_at_finish: true,
        ..crate::lease::LeaseOptions::new("alice@laptop", "apply")
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&store);
    let ran = crate::lease::run_under_lease(
        &store,
        "d",
        &options,
        &cancel,
        |_| {},
        |leased| async move {
            let recorder = leased.recorder();
            let run = recorder.begin_run(&c::apply("d", "wf")).await.expect("begin");
            recorder.put_resource("d", &c::resource("a")).await.expect("put");
            assert!(seen.lease("d").await.expect("lease").is_some(), "held while it runs");
            recorder
                .finish_run(run, &c::end(Outcome::Succeeded))
                .await
                .expect("finish");
            let after = seen.lease("d").await.expect("lease");
            let late = recorder.put_resource("d", &c::resource("b")).await;
            (after, late)
        },
    )
    .await
    .expect("ran");
    let (after, late) = ran.value;
    assert_eq!(after, None, "the finish released the lease");
    let late = late.expect_err("a write after the finish");
    assert_eq!(late.kind, StoreErrorKind::LeaseLost, "{late}");
    assert_eq!(ran.released.as_ref().ok(), Some(&crate::lease::Released::Kept));
    assert!(!cancel.load(Ordering::SeqCst));
    assert_eq!(
        store.history("d").await.expect("history")[0].outcome,
        Some(Outcome::Succeeded)
    );
    assert_eq!(
        store.load("d").await.expect("load").expect("state").resources,
        vec![c::resource("a")]
    );
}

/// A finish whose answer is lost after the server committed it (the connection drops
/// between the commit and the reply) is tried again, and the retry recognises the first
/// attempt's work: the run finished with this end and the lease released, so the caller is
/// told "released", not "lease lost".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_whose_answer_is_lost_is_recognised_on_retry() {
    use lyra_core::state::Outcome;
    let Some(t) = LostAnswer::begin("finish_answer_lost", "DELETE FROM leases WHERE deployment = $9").await else {
        return;
    };
    let (store, fence, run) = (&t.store, &t.fence, t.run);
    store.put_resource_fenced(fence, &c::resource("a")).await.expect("put");
    let ended = c::end(Outcome::Succeeded);
    let released = store
        .finish_run_and_release(fence, run, &ended)
        .await
        .expect("the retry recognises the committed finish");
    assert!(
        t.proxy.dropped.load(Ordering::SeqCst),
        "no answer was dropped: the first attempt's answer arrived"
    );
    assert!(released, "the first attempt released the lease");
    assert_eq!(store.lease("d").await.expect("lease"), None);
    let history = store.history("d").await.expect("history");
    assert_eq!(history[0].outcome, Some(Outcome::Succeeded));
    let e = store
        .put_resource_fenced(fence, &c::resource("b"))
        .await
        .expect_err("a write after the release");
    assert_eq!(e.kind, StoreErrorKind::LeaseLost, "{e}");
}

/// The same for a finish that keeps its lease: the retry finds the run finished with this
/// very end and takes it for its own, rather than "already finished".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_run_whose_answer_is_lost_is_recognised_on_retry() {
    use lyra_core::state::Outcome;
    let Some(t) = LostAnswer::begin("finish_run_answer_lost", "UPDATE runs SET finished_at = $2").await else {
        return;
    };
    let (store, fence, run) = (&t.store, &t.fence, t.run);
    store
        .finish_run_fenced(fence, run, &c::end(Outcome::Failed))
        .await
        .expect("the retry recognises the committed finish");
    assert!(
        t.proxy.dropped.load(Ordering::SeqCst),
        "no answer was dropped: the first attempt's answer arrived"
    );
    assert_eq!(
        store.history("d").await.expect("history")[0].outcome,
        Some(Outcome::Failed)
    );
    assert_eq!(
        store.lease("d").await.expect("lease").map(|l| l.owner),
        Some("alice@laptop".to_owned()),
        "a finish alone keeps the lease"
    );
    let again = store
        .finish_run_fenced(fence, run, &c::end(Outcome::Succeeded))
        .await
        .expect_err("a second finish with another end");
    assert_eq!(again.kind, StoreErrorKind::Conflict, "{again}");
}

/// A run begun under a lease, by a store connected through an [`AnswerDropper`] armed with
/// `marker`.
struct LostAnswer {
    /// Held for the test's length: dropping it drops the schema.
    _db: PgTestDb,
    proxy: AnswerDropper,
    store: PostgresStore,
    fence: crate::store::Fence,
    run: lyra_core::state::RunId,
}

impl LostAnswer {
    async fn begin(name: &str, marker: &'static str) -> Option<LostAnswer> {
        let db = PgTestDb::create(name).await?;
        let proxy = AnswerDropper::start(db.server_url(), marker);
        let store = PostgresStore::connect(&proxy.url(db.url()))
            .await
            .expect("connect through the proxy");
        let lease = c::acquired(&store, &c::lease_request("d", "alice@laptop", "token-a", 60_000)).await;
        let fence = crate::store::Fence::from(&lease);
        let run = store
            .begin_run_fenced(&fence, &c::apply("d", "wf"))
            .await
            .expect("begin");
        Some(LostAnswer {
            _db: db,
            proxy,
            store,
            fence,
            run,
        })
    }
}

/// A TCP proxy to Postgres (plain, `sslmode=disable`) that, once, lets through the
/// statement whose text holds `marker` and drops the connection when the server is ready
/// again after it, swallowing the answer: the server committed, the client never hears.
struct AnswerDropper {
    port: u16,
    /// Whether the answer was dropped.
    dropped: Arc<AtomicBool>,
}

impl AnswerDropper {
    fn start(server_url: &str, marker: &'static str) -> AnswerDropper {
        let (listener, port, upstream) = proxy_listener(server_url);
        let dropped = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(true));
        let seen = Arc::clone(&dropped);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                proxy_connection(client, server, marker, Arc::clone(&armed), Arc::clone(&seen));
            }
        });
        AnswerDropper { port, dropped }
    }

    /// `store_url` (`postgres://…/db?schema=…`) through the proxy, without TLS (the proxy
    /// reads the statements).
    fn url(&self, store_url: &str) -> String {
        let mut url = url::Url::parse(store_url).expect("store URL");
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(self.port)).expect("port");
        url.query_pairs_mut().append_pair("sslmode", "disable");
        url.to_string()
    }
}

/// The messages complete in `buf` (each a type byte and a length that counts itself; the
/// client's first, the startup message, has no type byte): their types, and how many bytes
/// they take.
fn complete_messages(buf: &[u8], untyped_first: &mut bool) -> (Vec<(u8, std::ops::Range<usize>)>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let (kind, len_at) = if *untyped_first {
            (0, at)
        } else {
            (buf.get(at).copied().unwrap_or(0), at + 1)
        };
        let Some(len) = buf.get(len_at..len_at + 4) else { break };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let end = len_at + len;
        if end > buf.len() {
            break;
        }
        out.push((kind, at..end));
        *untyped_first = false;
        at = end;
    }
    (out, at)
}

fn proxy_connection(
    client: std::net::TcpStream,
    server: std::net::TcpStream,
    marker: &'static str,
    armed: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
) {
    use std::io::{Read, Write};
    let swallow = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
    let to_server_swallow = Arc::clone(&swallow);
    std::thread::spawn(move || {
        let (mut buf, mut chunk, mut startup, mut marked) = (Vec::new(), [0u8; 16384], true, false);
        while let Ok(n @ 1..) = c_in.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
            let (messages, used) = complete_messages(&buf, &mut startup);
            for (kind, range) in messages {
                let text = String::from_utf8_lossy(&buf[range]);
                if kind == b'P' && text.contains(marker) {
                    marked = true;
                }
                // Its Execute: from here the answers are swallowed (set before it is sent,
                // so none slips through).
                if kind == b'E' && marked && armed.swap(false, Ordering::SeqCst) {
                    to_server_swallow.store(true, Ordering::SeqCst);
                }
            }
            if s_out.write_all(&buf[..used]).is_err() {
                break;
            }
            buf.drain(..used);
        }
        let _ = s_out.shutdown(std::net::Shutdown::Write);
    });
    let (mut s_in, mut c_out) = (server, client);
    std::thread::spawn(move || {
        let (mut buf, mut chunk, mut untyped) = (Vec::new(), [0u8; 16384], false);
        while let Ok(n @ 1..) = s_in.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..n]);
            let (messages, used) = complete_messages(&buf, &mut untyped);
            if swallow.load(Ordering::SeqCst) {
                // ReadyForQuery: the statement's transaction is over, committed.
                if messages.iter().any(|(kind, _)| *kind == b'Z') {
                    dropped.store(true, Ordering::SeqCst);
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                    let _ = s_in.shutdown(std::net::Shutdown::Both);
                    return;
                }
            } else if c_out.write_all(&buf[..used]).is_err() {
                break;
            }
            buf.drain(..used);
        }
        let _ = c_out.shutdown(std::net::Shutdown::Write);
    });
}

#[test]
fn tls_is_unspecified_only_when_nothing_names_it() {
    let nothing = |_: &str| false;
    assert!(super::tls_unspecified("postgres://u@h/db", nothing));
    assert!(super::tls_unspecified("postgres://u@h/db?application_name=x", nothing));
    for param in [
        "sslmode=prefer",
        "ssl-mode=require",
        "sslrootcert=/ca.pem",
        "sslkey=/k",
        "ssl-ca=/c",
    ] {
        let url = format!("postgres://u@h/db?application_name=x&{param}");
        assert!(!super::tls_unspecified(&url, nothing), "{url}");
    }
    for variable in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        assert!(
            !super::tls_unspecified("postgres://u@h/db", |name| name == variable),
            "{variable}"
        );
    }
    // A password is not a parameter, whatever it spells.
    assert!(super::tls_unspecified("postgres://u:sslmode@h/db", nothing));
}

#[test]
fn local_servers_are_sockets_localhost_and_loopback() {
    use sqlx::postgres::PgConnectOptions;
    use std::str::FromStr;
    let local = |url: &str| super::is_local(&PgConnectOptions::from_str(url).expect(url));
    for url in [
        "postgres://u@localhost/db",
        "postgres://u@LOCALHOST:5433/db",
        "postgres://u@127.0.0.1/db",
        "postgres://u@127.3.2.1:6000/db",
        "postgres://u@[::1]:5432/db",
        "postgres://u@%2Fvar%2Frun%2Fpostgresql/db",
        "postgres://u@h/db?host=/var/run/postgresql",
    ] {
        assert!(local(url), "{url}");
    }
    for url in [
        "postgres://u@db.example.com/db",
        "postgres://u@10.0.0.5/db",
        "postgres://u@[2001:db8::1]/db",
        "postgres://u@localhost.example.com/db",
    ] {
        assert!(!local(url), "{url}");
    }
}

/// Whether the server offers TLS (`ssl = on`).
async fn server_offers_tls(server_url: &str) -> bool {
    let mut raw = PgConnection::connect(server_url).await.expect("raw");
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut raw)
        .await
        .expect("SHOW ssl");
    ssl == "on"
}

/// Whether each of the connections named `application_name` uses TLS.
async fn tls_of(server_url: &str, application_name: &str) -> Vec<bool> {
    let mut raw = PgConnection::connect(server_url).await.expect("raw");
    sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
    )
    .bind(application_name)
    .fetch_all(&mut raw)
    .await
    .expect("pg_stat_ssl")
}

/// On a server on this machine, the store's connections skip TLS unless the URL or the
/// environment asks for it: it protects nothing there and costs every connection.
#[tokio::test]
async fn loopback_connections_use_tls_only_when_asked() {
    let Some(db) = PgTestDb::create("loopback_tls").await else {
        return;
    };
    assert!(
        super::is_local(&std::str::FromStr::from_str(db.server_url()).expect("server URL")),
        "the test server is expected on this machine: {}",
        crate::redact_url(db.server_url())
    );
    let tls = server_offers_tls(db.server_url()).await;
    let tag = format!("{:x}", rand::random::<u32>());
    for (param, want) in [("", false), ("&sslmode=prefer", tls)] {
        let name = format!("lyra_t_tls_{tag}_{}", param.len());
        let store = PostgresStore::connect(&format!("{}&application_name={name}{param}", db.url()))
            .await
            .expect("connect");
        store.list().await.expect("list");
        let seen = tls_of(db.server_url(), &name).await;
        assert!(
            !seen.is_empty() && seen.iter().all(|&t| t == want),
            "{param:?}: {seen:?}"
        );
        store.close().await;
    }
    if !tls {
        eprintln!(
            "loopback_connections_use_tls_only_when_asked: the server has ssl=off, so only the plain case could be told apart"
        );
    }
}

/// A server that refuses connections without TLS (a `hostssl` rule) still gets one: the
/// store tries without, then with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refusing_plain_connections_gets_tls() {
    let Some(db) = PgTestDb::create("tls_only").await else {
        return;
    };
    let proxy = TlsOnly::start(db.server_url());
    let mut url = url::Url::parse(db.url()).expect("store URL");
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.port)).expect("port");
    let store = PostgresStore::connect(url.as_str())
        .await
        .expect("connect with TLS after a refusal");
    store.begin_run(&c::apply("d", "wf")).await.expect("begin_run");
    store.put_resource("d", &c::resource("a")).await.expect("put");
    assert_eq!(store.load("d").await.expect("load").expect("d").resources.len(), 1);
    // One refusal, for the first connection; from then on the pool asks for TLS at once.
    assert_eq!(proxy.refused.load(Ordering::SeqCst), 1);
    assert!(
        proxy.tls.load(Ordering::SeqCst) >= 2,
        "the first connection and the pool's"
    );
}

/// A TCP proxy to Postgres that, like a server whose `pg_hba.conf` has only `hostssl`
/// rules, refuses a connection that starts without asking for TLS.
struct TlsOnly {
    port: u16,
    /// Connections refused for starting without TLS.
    refused: Arc<AtomicUsize>,
    /// Connections that asked for TLS (passed through to the server).
    tls: Arc<AtomicUsize>,
}

impl TlsOnly {
    fn start(server_url: &str) -> TlsOnly {
        use std::io::{Read, Write};
        const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
        let (listener, port, upstream) = proxy_listener(server_url);
        let (refused, tls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (refused_, tls_) = (Arc::clone(&refused), Arc::clone(&tls));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let mut first = [0u8; 8];
                if client.read_exact(&mut first).is_err() {
                    continue;
                }
                if first != SSL_REQUEST {
                    refused_.fetch_add(1, Ordering::SeqCst);
                    let mut fields = Vec::new();
                    for (code, text) in [
                        (b'S', "FATAL"),
                        (b'V', "FATAL"),
                        (b'C', "28000"),
                        (b'M', "no pg_hba.conf entry for host \"127.0.0.1\", no encryption"),
                    ] {
                        fields.push(code);
                        fields.extend_from_slice(text.as_bytes());
                        fields.push(0);
                    }
                    fields.push(0);
                    let mut error = vec![b'E'];
                    error.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                    error.extend_from_slice(&fields);
                    let _ = client.write_all(&error);
                    continue;
                }
                tls_.fetch_add(1, Ordering::SeqCst);
                let Ok(mut server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                if server.write_all(&first).is_err() {
                    continue;
                }
                let (mut c_in, mut s_out) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut server, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        TlsOnly { port, refused, tls }
    }
}

/// A proxy's listener on a free loopback port, that port, and the server's `host:port` it
/// forwards to.
fn proxy_listener(server_url: &str) -> (std::net::TcpListener, u16, String) {
    let server = url::Url::parse(server_url).expect("server URL");
    let upstream = format!(
        "{}:{}",
        server.host_str().expect("server host"),
        server.port().unwrap_or(5432)
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    (listener, port, upstream)
}

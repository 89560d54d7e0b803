//! Cost of recording resources: `cargo bench -p lyra-state --bench record`.
//!
//! For SQLite and Postgres (skipped with a message if the server at `LYRA_TEST_POSTGRES_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`, is unreachable), compares
//! `put_resource` awaited one by one (a deep dependency chain), 64 in flight and all at once
//! (a wide graph), against a bare loop of single-row `INSERT` commits on one raw connection
//! to the same database: the floor for one commit per write. Also times a lease
//! acquire + release round trip.

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use lyra_core::state::{Operation, ResourceRecord, RunStart};
use lyra_state::{LeaseGrant, LeaseRequest, Store};
use lyra_state::{PostgresStore, SqliteStore};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, PgConnection, SqliteConnection};

const N: usize = 10_000;

fn record(i: usize) -> ResourceRecord {
    let json = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    ResourceRecord {
        step_id: format!("servers/{i}"),
        type_name: "Bench::Server".to_owned(),
        external_id: format!("i-{i:08x}"),
        desired: json(json!({ "name": format!("server-{i}"), "size": "small", "tags": { "env": "bench" } })),
        actual: json(json!({ "id": format!("i-{i:08x}"), "state": "running" })),
        depends_on: vec!["network".to_owned()],
        managed: true,
        pending: false,
        sensitive: vec![],
        create_key: None,
    }
}

async fn fresh_store(dir: &Path, name: &str) -> SqliteStore {
    let store = SqliteStore::open(&dir.join(name)).await.expect("open store");
    begin(&store).await;
    store
}

async fn begin(store: &dyn Store) {
    let run = RunStart {
        deployment: "bench".to_owned(),
        workflow: Some("bench".to_owned()),
        operation: Operation::Apply,
        actor: "bench".to_owned(),
    };
    store.begin_run(&run).await.expect("begin_run");
}

async fn sequential(store: &dyn Store, records: &[ResourceRecord]) -> Duration {
    let start = Instant::now();
    for r in records {
        store.put_resource("bench", r).await.expect("put");
    }
    start.elapsed()
}

/// `in_flight` puts at a time (`usize::MAX`: all at once).
async fn concurrent(store: &dyn Store, records: &[ResourceRecord], in_flight: usize) -> Duration {
    let start = Instant::now();
    if in_flight >= records.len() {
        for result in join_all(records.iter().map(|r| store.put_resource("bench", r))).await {
            result.expect("put");
        }
    } else {
        let mut puts =
            futures::stream::iter(records.iter().map(|r| store.put_resource("bench", r))).buffer_unordered(in_flight);
        while let Some(result) = puts.next().await {
            result.expect("put");
        }
    }
    start.elapsed()
}

/// Median and p99 of `n` acquire + release round trips.
async fn lease_round_trips(store: &dyn Store, n: usize) -> (Duration, Duration) {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let request = LeaseRequest {
            deployment: "bench".to_owned(),
            owner: "bench@host".to_owned(),
            operation: "apply".to_owned(),
            token: format!("token-{i}"),
            ttl_ms: 30_000,
        };
        let start = Instant::now();
        let LeaseGrant::Acquired(lease) = store.acquire_lease(&request).await.expect("acquire") else {
            panic!("lease held");
        };
        store.release_lease(&lease).await.expect("release");
        times.push(start.elapsed());
    }
    times.sort();
    (times[n / 2], times[n * 99 / 100])
}

/// One autocommit `INSERT` per row with the store's pragmas: the cost of a commit.
async fn raw(dir: &Path, records: &[ResourceRecord]) -> Duration {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let mut conn = SqliteConnection::connect_with(&options).await.expect("connect");
    sqlx::raw_sql(
        "CREATE TABLE resources (deployment TEXT NOT NULL, step_id TEXT NOT NULL, \
         type_name TEXT NOT NULL, external_id TEXT NOT NULL, desired TEXT NOT NULL, \
         actual TEXT NOT NULL, depends_on TEXT NOT NULL, managed INTEGER NOT NULL, \
         pending INTEGER NOT NULL, sensitive TEXT NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY (deployment, step_id)) STRICT",
    )
    .execute(&mut conn)
    .await
    .expect("create table");
    let rows = encode(records);
    let start = Instant::now();
    for (r, desired, actual, depends_on) in &rows {
        sqlx::query("INSERT INTO resources VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")
            .bind("bench")
            .bind(&r.step_id)
            .bind(&r.type_name)
            .bind(&r.external_id)
            .bind(desired)
            .bind(actual)
            .bind(depends_on)
            .bind(r.managed)
            .bind(r.pending)
            .bind("[]")
            .bind(0_i64)
            .execute(&mut conn)
            .await
            .expect("insert");
    }
    let elapsed = start.elapsed();
    conn.close().await.expect("close");
    elapsed
}

/// One autocommit `INSERT` per row on one connection: the floor for one commit per write.
async fn raw_postgres(base: &str, schema: &str, records: &[ResourceRecord]) -> Duration {
    let mut conn = PgConnection::connect(base).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET search_path TO {schema}; \
         CREATE TABLE raw_resources (deployment TEXT NOT NULL, step_id TEXT NOT NULL, \
         type_name TEXT NOT NULL, external_id TEXT NOT NULL, desired TEXT NOT NULL, \
         actual TEXT NOT NULL, depends_on TEXT NOT NULL, managed BOOLEAN NOT NULL, \
         pending BOOLEAN NOT NULL, sensitive TEXT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (deployment, step_id))"
    )))
    .execute(&mut conn)
    .await
    .expect("create table");
    let rows = encode(records);
    let start = Instant::now();
    for (r, desired, actual, depends_on) in &rows {
        sqlx::query("INSERT INTO raw_resources VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
            .bind("bench")
            .bind(&r.step_id)
            .bind(&r.type_name)
            .bind(&r.external_id)
            .bind(desired)
            .bind(actual)
            .bind(depends_on)
            .bind(r.managed)
            .bind(r.pending)
            .bind("[]")
            .bind(0_i64)
            .execute(&mut conn)
            .await
            .expect("insert");
    }
    let elapsed = start.elapsed();
    conn.close().await.expect("close");
    elapsed
}

fn encode(records: &[ResourceRecord]) -> Vec<(&ResourceRecord, String, String, String)> {
    // Encoded up front, as the stores' callers do before writing.
    records
        .iter()
        .map(|r| {
            let desired = serde_json::to_string(&r.desired).expect("encode");
            let actual = serde_json::to_string(&r.actual).expect("encode");
            let depends_on = serde_json::to_string(&r.depends_on).expect("encode");
            (r, desired, actual, depends_on)
        })
        .collect()
}

fn per_op_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / N as f64
}

fn report(backend: &str, raw: Duration, runs: &[(&str, Duration)], lease: (Duration, Duration)) {
    println!("{backend}: {N} step outcomes");
    println!(
        "  bare INSERT loop, 1 commit each:  {:>8.1} ms total, {:>7.1} µs/op",
        raw.as_secs_f64() * 1e3,
        per_op_us(raw)
    );
    for (name, d) in runs {
        println!(
            "  {name:<32} {:>8.1} ms total, {:>7.1} µs/op, {:.2}x the bare loop",
            d.as_secs_f64() * 1e3,
            per_op_us(*d),
            d.as_secs_f64() / raw.as_secs_f64()
        );
    }
    println!(
        "  lease acquire+release round trip: median {:.1} µs, p99 {:.1} µs ({LEASE_ROUNDS} rounds)",
        lease.0.as_secs_f64() * 1e6,
        lease.1.as_secs_f64() * 1e6
    );
}

const LEASE_ROUNDS: usize = 1000;

async fn bench_sqlite(dir: &Path, records: &[ResourceRecord]) {
    let raw = raw(dir, records).await;
    let mut runs = Vec::new();
    for (name, file, in_flight) in [
        ("put_resource sequential:", "seq.db", 1),
        ("put_resource 64 in flight:", "c64.db", 64),
        ("put_resource all at once:", "all.db", usize::MAX),
    ] {
        let store = fresh_store(dir, file).await;
        let d = if in_flight == 1 {
            sequential(&store, records).await
        } else {
            concurrent(&store, records, in_flight).await
        };
        store.close().await.expect("close");
        runs.push((name, d));
    }
    let store = fresh_store(dir, "lease.db").await;
    let lease = lease_round_trips(&store, LEASE_ROUNDS).await;
    store.close().await.expect("close");
    report("SQLite (WAL, synchronous=NORMAL)", raw, &runs, lease);
}

async fn bench_postgres(records: &[ResourceRecord]) {
    let base = std::env::var("LYRA_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let mut admin = match PgConnection::connect(&base).await {
        Ok(conn) => conn,
        Err(e) => {
            eprintln!("skipping the Postgres benchmark: cannot connect to the test server ({e})");
            return;
        }
    };
    let schema = format!("lyra_bench_{:08x}", rand_suffix());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut admin)
        .await
        .expect("create schema");
    let separator = if base.contains('?') { '&' } else { '?' };

    let raw = raw_postgres(&base, &schema, records).await;
    let mut runs = Vec::new();
    for (i, (name, in_flight)) in [
        ("put_resource sequential:", 1),
        ("put_resource 64 in flight:", 64),
        ("put_resource all at once:", usize::MAX),
    ]
    .into_iter()
    .enumerate()
    {
        let url = format!("{base}{separator}schema={schema}_{i}");
        let store = PostgresStore::connect(&url).await.expect("connect");
        begin(&store).await;
        let d = if in_flight == 1 {
            sequential(&store, records).await
        } else {
            concurrent(&store, records, in_flight).await
        };
        store.close().await;
        runs.push((name, d));
    }
    let store = PostgresStore::connect(&format!("{base}{separator}schema={schema}_lease"))
        .await
        .expect("connect");
    let lease = lease_round_trips(&store, LEASE_ROUNDS).await;
    store.close().await;
    report(
        "Postgres (localhost, synchronous_commit=on, pool of 10)",
        raw,
        &runs,
        lease,
    );

    for suffix in ["", "_0", "_1", "_2", "_lease"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {schema}{suffix} CASCADE"
        )))
        .execute(&mut admin)
        .await
        .expect("drop schema");
    }
}

fn rand_suffix() -> u32 {
    std::process::id() ^ Instant::now().elapsed().subsec_nanos()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<ResourceRecord> = (0..N).map(record).collect();
    runtime.block_on(async {
        bench_sqlite(dir.path(), &records).await;
        bench_postgres(&records).await;
    });
}

//! Cost of recording resources: `cargo bench -p lyra-state --bench record`.
//!
//! Compares `SqliteStore::put_resource` awaited one by one (a deep dependency chain) and all at
//! once (a wide graph, where group commit batches them), against a bare loop of single-row
//! transactions on a raw connection with the same pragmas: the floor for one commit per write.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::future::join_all;
use lyra_core::state::{Operation, ResourceRecord, RunStart, StateStore};
use lyra_state::SqliteStore;
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};

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
    }
}

async fn fresh_store(dir: &Path, name: &str) -> SqliteStore {
    let store = SqliteStore::open(&dir.join(name)).await.expect("open store");
    let run = RunStart {
        deployment: "bench".to_owned(),
        workflow: Some("bench".to_owned()),
        operation: Operation::Apply,
        actor: "bench".to_owned(),
    };
    store.begin_run(&run).await.expect("begin_run");
    store
}

async fn sequential(dir: &Path, records: &[ResourceRecord]) -> Duration {
    let store = fresh_store(dir, "sequential.db").await;
    let start = Instant::now();
    for r in records {
        store.put_resource("bench", r).await.expect("put");
    }
    let elapsed = start.elapsed();
    store.close().await.expect("close");
    elapsed
}

async fn concurrent(dir: &Path, records: &[ResourceRecord]) -> Duration {
    let store = fresh_store(dir, "concurrent.db").await;
    let start = Instant::now();
    for result in join_all(records.iter().map(|r| store.put_resource("bench", r))).await {
        result.expect("put");
    }
    let elapsed = start.elapsed();
    store.close().await.expect("close");
    elapsed
}

/// One `BEGIN; INSERT; COMMIT` per row with the store's pragmas: the cost of a commit.
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
         updated_at INTEGER NOT NULL, PRIMARY KEY (deployment, step_id)) STRICT",
    )
    .execute(&mut conn)
    .await
    .expect("create table");
    // Encode up front, as the store's callers do before queueing.
    let rows: Vec<_> = records
        .iter()
        .map(|r| {
            let desired = serde_json::to_string(&r.desired).expect("encode");
            let actual = serde_json::to_string(&r.actual).expect("encode");
            let depends_on = serde_json::to_string(&r.depends_on).expect("encode");
            (r, desired, actual, depends_on)
        })
        .collect();
    let start = Instant::now();
    for (r, desired, actual, depends_on) in &rows {
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("INSERT INTO resources VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")
            .bind("bench")
            .bind(&r.step_id)
            .bind(&r.type_name)
            .bind(&r.external_id)
            .bind(desired)
            .bind(actual)
            .bind(depends_on)
            .bind(r.managed)
            .bind(0_i64)
            .execute(&mut *tx)
            .await
            .expect("insert");
        tx.commit().await.expect("commit");
    }
    let elapsed = start.elapsed();
    conn.close().await.expect("close");
    elapsed
}

fn per_op_us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6 / N as f64
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let records: Vec<ResourceRecord> = (0..N).map(record).collect();
    runtime.block_on(async {
        let raw = raw(dir.path(), &records).await;
        let seq = sequential(dir.path(), &records).await;
        let conc = concurrent(dir.path(), &records).await;
        println!("{N} writes, SQLite WAL, synchronous=NORMAL");
        println!(
            "raw loop, 1 txn per INSERT: {:>8.1} ms total, {:>7.1} µs/op",
            raw.as_secs_f64() * 1e3,
            per_op_us(raw)
        );
        for (name, d) in [("put_resource sequential", seq), ("put_resource concurrent", conc)] {
            println!(
                "{name}:    {:>8.1} ms total, {:>7.1} µs/op, {:.2}x the raw loop's time",
                d.as_secs_f64() * 1e3,
                per_op_us(d),
                d.as_secs_f64() / raw.as_secs_f64()
            );
        }
    });
}

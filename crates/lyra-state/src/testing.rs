//! Test helpers for this crate's tests and other crates' (feature `testing`): a throw-away
//! Postgres schema per test, the workspace's one such helper. The end-to-end tests use it too
//! (through `integration_tests::pg_or_skip!`), synchronously.
//!
//! ```text
//! let Some(db) = lyra_state::testing::PgTestDb::create("my_test").await else { return };
//! let store = lyra_state::open(db.url()).await?;
//! // ... the schema is dropped when `db` goes out of scope, panics included.
//! ```

// A test helper: says on the terminal why a Postgres test is skipped.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// The server tests use unless `LYRA_TEST_POSTGRES_URL` names another one.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The Postgres server for tests: `LYRA_TEST_POSTGRES_URL`, or [`DEFAULT_POSTGRES_URL`].
pub fn postgres_url() -> String {
    std::env::var("LYRA_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// Whether tests run in CI (`CI=true` or `CI=1`), where a test that would skip for want of a
/// service (Postgres, kubectl) or data fails instead.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A fresh, uniquely named schema in the test database, dropped (with everything in it) when
/// this value is dropped.
#[derive(Debug)]
pub struct PgTestDb {
    base: String,
    schema: String,
    url: String,
}

impl PgTestDb {
    /// A new schema for the test `name`. If the server cannot be reached: in CI (`CI=true`)
    /// this panics; elsewhere it prints a skip message to stderr and returns `None`, and the
    /// test should return.
    pub async fn create(name: &str) -> Option<PgTestDb> {
        let base = postgres_url();
        match reachable(&base).await {
            Ok(()) => Some(PgTestDb::new(name, base)),
            Err(e) => unreachable_server(name, &e),
        }
    }

    /// [`PgTestDb::create`] for tests without a runtime.
    pub fn create_blocking(name: &str) -> Option<PgTestDb> {
        let base = postgres_url();
        let probe = base.clone();
        match on_own_runtime(async move { reachable(&probe).await }) {
            Ok(()) => Some(PgTestDb::new(name, base)),
            Err(e) => unreachable_server(name, &e),
        }
    }

    fn new(name: &str, base: String) -> PgTestDb {
        let tag: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(32)
            .collect();
        let schema = format!("lyra_t_{tag}_{:012x}", rand::random::<u64>() >> 16);
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}schema={schema}");
        PgTestDb { base, schema, url }
    }

    /// The store URL (`…?schema=NAME`); the store creates the schema when it first connects.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The server URL without the schema, for raw connections.
    pub fn server_url(&self) -> &str {
        &self.base
    }
}

/// Whether the server accepts a connection (within 5 s).
async fn reachable(base: &str) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(base)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out connecting".to_owned()),
    }
}

fn unreachable_server(name: &str, error: &str) -> Option<PgTestDb> {
    let url = crate::redact_url(&postgres_url());
    if in_ci() {
        panic!("{name}: Postgres at {url} is unreachable ({error}), and CI=true forbids skipping");
    }
    eprintln!("skipping {name}: Postgres at {url} is unreachable ({error}); set CI=true to make this fail");
    None
}

/// Runs `task` on a thread and runtime of its own: the caller may be inside a runtime (where
/// blocking on another would panic), outside any, or unwinding from a panic.
fn on_own_runtime(task: impl Future<Output = Result<(), String>> + Send + 'static) -> Result<(), String> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(task)
    })
    .join()
    .unwrap_or_else(|_| Err("its thread panicked".to_owned()))
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        let base = self.base.clone();
        let schema = self.schema.clone();
        let dropped = on_own_runtime(async move {
            let mut conn = PgConnection::connect(&base).await.map_err(|e| e.to_string())?;
            // `schema` is our own generated identifier.
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            conn.close().await.map_err(|e| e.to_string())
        });
        if let Err(e) = dropped {
            eprintln!("could not drop test schema {}: {e}", self.schema);
        }
    }
}

//! Test helpers for other crates (feature `conformance`): a throw-away Postgres schema.
//!
//! ```ignore
//! let Some(db) = lyra_state::testing::PgTestDb::create("my_test").await else { return };
//! let store = lyra_state::open(db.url()).await?;
//! // ... the schema is dropped when `db` goes out of scope, panics included.
//! ```

use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// The server tests use unless `LYRA_TEST_POSTGRES_URL` names another one.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The Postgres server for tests: `LYRA_TEST_POSTGRES_URL`, or [`DEFAULT_POSTGRES_URL`].
pub fn postgres_url() -> String {
    std::env::var("LYRA_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned())
}

/// Whether tests run in CI (`CI=true`), where skipping the Postgres tests is a failure.
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
        let conn = match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&base)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return unreachable_server(name, &e.to_string()),
            Err(_) => return unreachable_server(name, "timed out connecting"),
        };
        let _ = conn.close().await;
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
        Some(PgTestDb { base, schema, url })
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

fn unreachable_server(name: &str, error: &str) -> Option<PgTestDb> {
    let url = crate::redact_url(&postgres_url());
    if in_ci() {
        panic!("{name}: Postgres at {url} is unreachable ({error}), and CI=true forbids skipping");
    }
    eprintln!("skipping {name}: Postgres at {url} is unreachable ({error}); set CI=true to make this fail");
    None
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        // On its own thread and runtime: this may run inside (or after) the test's runtime,
        // during a panic too.
        let base = self.base.clone();
        let schema = self.schema.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&base).await?;
                // `schema` is our own generated identifier.
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            })?;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test schema {}: {e}", self.schema),
            Err(_) => eprintln!(
                "could not drop test schema {}: the dropping thread panicked",
                self.schema
            ),
        }
    }
}

//! Postgres for the end-to-end tests: a schema of its own per test ([`PgTestDb`], the
//! workspace's one helper, from `lyra_state::testing`: `$LYRA_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`, dropped when the test ends; skipped with a
//! message when the server is unreachable, except under `CI=true`, where the test fails).
//!
//! The tests reach the server only through `lyra` itself (which creates the schema named by
//! `?schema=`) and `psql` (fault injection and probes).

use std::process::{Command, Output};

pub use lyra_state::testing::{PgTestDb, postgres_url};

/// `let pg = pg_or_skip!();`: a fresh schema named after the test, or return from the test
/// (skip).
#[macro_export]
macro_rules! pg_or_skip {
    () => {{
        fn here() {}
        match $crate::postgres::PgTestDb::create_blocking($crate::postgres::test_name(::std::any::type_name_of_val(
            &here,
        ))) {
            Some(db) => db,
            None => return,
        }
    }};
}

/// The test's function name, from the path of a function declared inside it
/// (`e2e::e2e::leases::a_test::here`).
#[doc(hidden)]
pub fn test_name(path: &str) -> &str {
    let path = path.strip_suffix("::here").unwrap_or(path);
    path.rsplit("::").next().unwrap_or(path)
}

/// Runs SQL on the test server with `psql`.
pub fn psql(sql: &str) -> Output {
    Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &postgres_url(), "-c", sql])
        .output()
        .expect("run psql (is the PostgreSQL client installed?)")
}

/// Runs one query on the test server with `psql` and returns its value, unaligned; a failed
/// query fails the test.
#[track_caller]
pub fn psql_value(sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-X",
            "-q",
            "-t",
            "-A",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &postgres_url(),
            "-c",
            sql,
        ])
        .output()
        .expect("run psql (is the PostgreSQL client installed?)");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// How many resources `db`'s state records for `deployment` (0 before its tables exist): a
/// cheap progress probe for a running apply.
pub fn recorded(db: &PgTestDb, deployment: &str) -> u64 {
    let out = Command::new("psql")
        .args(["-X", "-q", "-t", "-A", "-d", &postgres_url(), "-c"])
        .arg(format!(
            "SELECT count(*) FROM \"{}\".resources WHERE deployment = '{}'",
            db.schema(),
            deployment.replace('\'', "''")
        ))
        .output()
        .expect("run psql");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_schema_is_named_after_its_test() {
        assert_eq!(
            super::test_name("e2e::e2e::leases::postgres_lease::here"),
            "postgres_lease"
        );
    }
}

//! A Postgres state for one test: a schema of its own in the test database, dropped when the
//! test ends. The server is the real one (`$LYRA_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); the tests reach it only through `lyra` itself
//! (which creates the schema named by `?schema=`) and `psql` (which drops it).
//!
//! When the server is unreachable the tests are skipped with a message, except under `CI=true`,
//! where they fail: CI must run them.

use std::net::{TcpStream, ToSocketAddrs};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The server URL the tests use.
pub fn server_url() -> String {
    std::env::var("LYRA_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn host_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(5432)),
        None => (hostport.to_owned(), 5432),
    }
}

/// Whether the server accepts connections; under `CI=true` an unreachable server panics.
pub fn available() -> bool {
    let url = server_url();
    let (host, port) = host_port(&url);
    let up = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok());
    if up {
        return true;
    }
    let ci = crate::in_ci();
    assert!(
        !ci,
        "CI=true but Postgres is not reachable at {host}:{port} (set LYRA_TEST_POSTGRES_URL, or start it: \
         pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)"
    );
    eprintln!("skipped: Postgres is not reachable at {host}:{port} (set LYRA_TEST_POSTGRES_URL to run this test)");
    false
}

/// `let pg = pg_or_skip!();`: a fresh schema, or return from the test (skip).
#[macro_export]
macro_rules! pg_or_skip {
    () => {
        match $crate::postgres::Schema::new() {
            Some(s) => s,
            None => return,
        }
    };
}

/// A schema of its own for one test; dropped (with everything in it) on drop.
pub struct Schema {
    name: String,
    /// The state URL selecting this schema.
    pub url: String,
}

impl Schema {
    /// `None` when Postgres is unreachable outside CI (see [`available`]).
    pub fn new() -> Option<Schema> {
        if !available() {
            return None;
        }
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "lyra_e2e_{}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        );
        let base = server_url();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}schema={name}");
        Some(Schema { name, url })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs SQL on the server with `psql` (for fault injection and cleanup).
    pub fn psql(&self, sql: &str) -> std::process::Output {
        psql(sql)
    }

    /// How many resources this schema's state records for `deployment` (0 before its tables
    /// exist): a cheap progress probe for a running apply.
    pub fn recorded(&self, deployment: &str) -> u64 {
        let out = Command::new("psql")
            .args(["-X", "-q", "-t", "-A", "-d", &server_url(), "-c"])
            .arg(format!(
                "SELECT count(*) FROM \"{}\".resources WHERE deployment = '{}'",
                self.name,
                deployment.replace('\'', "''")
            ))
            .output()
            .expect("run psql");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0)
    }
}

/// Runs SQL on the test server with `psql`.
pub fn psql(sql: &str) -> std::process::Output {
    Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &server_url(), "-c", sql])
        .output()
        .expect("run psql (is the PostgreSQL client installed?)")
}

impl Drop for Schema {
    fn drop(&mut self) {
        let out = psql(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name));
        if !out.status.success() {
            eprintln!(
                "warning: could not drop test schema {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

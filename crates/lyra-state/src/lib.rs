//! `lyra-state`: the state stores, where Lyra records what it manages. Each backend implements
//! the engine's [`Recorder`] and this crate's own traits ([`Leases`], [`FencedWrites`],
//! [`Admin`]); [`Store`] is all of them.
//!
//! - [`SqliteStore`]: one SQLite file, the embedded default.
//! - [`PostgresStore`]: a Postgres database shared by every CLI and controller that manage the
//!   same deployments.
//!
//! [`open`] picks the backend from a URL, so the CLI and the controller need not know which
//! one they talk to. Both backends share the row types of `rows.rs` (JSON stored as text, so
//! both give back exactly the bytes written) and are held to one behavioural suite,
//! `conformance` (feature `conformance`), run against each.
//!
//! Writes are durable when their call returns. On SQLite concurrent writes share one commit
//! (see [`SqliteStore`]); on Postgres each call commits on its own pooled connection and
//! connection faults are retried where that is safe (see [`PostgresStore`]).
//!
//! [`lease`] keeps a deployment's lease for the length of a run: the state's single-writer
//! rule for apply, delete and state edits, across processes and machines.
//! [`lease::run_under_lease`] is the one way to run under a lease: the CLI and the controller
//! both call it. Every write of such a run is fenced by the lease's token (see
//! [`FencedWrites`]), so a holder that lost its lease cannot write any more.
//!
//! [`admin`] holds the rules of state administration (migrate, forget, unlock) that the CLI
//! and the controller share.

pub mod admin;
mod empty;
mod error;
pub mod lease;
mod postgres;
mod redact;
mod rows;
mod sqlite;
mod store;
mod url;

#[cfg(any(test, feature = "conformance"))]
#[doc(hidden)]
pub mod conformance;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use crate::empty::EmptyState;
pub use crate::error::Error;
pub use crate::postgres::{APPLICATION_NAME, PostgresOptions, PostgresStore, RETRY_FOR};
pub use crate::redact::{redact_text, redact_url};
pub use crate::sqlite::{SqliteOptions, SqliteStore, Synchronous};
pub use crate::store::{
    Admin, DeploymentExport, DeploymentSummary, Fence, FencedWrites, Lease, LeaseGrant, LeaseRequest, Leases,
    ReadRecord, RecordStream, RunRecord, Store,
};
pub use lyra_core::state::Recorder;

/// The store traits, to call their methods on a [`Store`]: `use lyra_state::prelude::*;`.
pub mod prelude {
    pub use crate::store::{Admin as _, FencedWrites as _, Leases as _};
    pub use lyra_core::state::Recorder as _;
}

use crate::url::StoreUrl;

/// Opens the state store named by `url`:
///
/// - `sqlite://PATH`, `sqlite:PATH` or a bare `PATH`: a SQLite file, created if missing.
///   `?synchronous=full` (or `extra`) trades speed for durability against power loss; the
///   default, `normal`, is durable against the process dying. The path is used as written
///   (no percent-decoding); `sqlite:///abs/path` and `sqlite://rel/path` both work.
/// - `postgres://[user[:password]@]host[:port]/database[?…]` (or `postgresql://`): a Postgres
///   database; sqlx's parameters (`sslmode`, `application_name`, …) apply. Lyra adds
///   `schema=NAME` (lowercase letters, digits, `_`): the tables live in that schema, created
///   if missing, so several states can share one database. Other parameters are refused.
///   The password is best left out of the URL: sqlx reads `PGPASSWORD` and `~/.pgpass`.
///   Postgres 13 or newer (the store's id comes from `gen_random_uuid()`).
///   Messages never show credentials (see [`redact_url`]).
pub async fn open(url: &str) -> Result<Arc<dyn Store>, Error> {
    match StoreUrl::parse(url)? {
        StoreUrl::Sqlite { path, options } => Ok(Arc::new(SqliteStore::open_with(&path, &options).await?)),
        StoreUrl::Postgres { .. } => Ok(Arc::new(PostgresStore::connect(url).await?)),
    }
}

/// Opens the state store named by `url` (as [`open`] does) only if it exists: never creates a
/// SQLite file or its directories, a Postgres schema or tables. Without a state there,
/// [`Error::NoState`]. For commands that read, or that only change what is already recorded.
/// An existing state written by an older Lyra is still brought up to date.
pub async fn open_existing(url: &str) -> Result<Arc<dyn Store>, Error> {
    match StoreUrl::parse(url)? {
        StoreUrl::Sqlite { path, options } => Ok(Arc::new(SqliteStore::open_existing(&path, &options).await?)),
        StoreUrl::Postgres { .. } => Ok(Arc::new(
            PostgresStore::connect_existing(url, &PostgresOptions::default()).await?,
        )),
    }
}

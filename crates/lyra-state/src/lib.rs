//! `lyra-state`: the [`StateStore`] implementations, where Lyra records what it manages.
//!
//! Today that is [`SqliteStore`], one SQLite file. [`open`] picks the backend from a URL, so
//! the CLI and the controller need not know which one they talk to; Postgres will sit beside
//! SQLite with its own module and migrations (`migrations/postgres/`), sharing the row types
//! of `rows.rs` and the behavioural suite of `conformance` (feature `conformance`).
//!
//! Writes are durable when their call returns and concurrent writes share one commit; see the
//! [`SqliteStore`] docs for the durability level and how to raise it.

mod error;
mod rows;
mod sqlite;
mod url;

#[cfg(any(test, feature = "conformance"))]
#[doc(hidden)]
pub mod conformance;

use std::sync::Arc;

use lyra_core::state::StateStore;

pub use crate::error::Error;
pub use crate::sqlite::{SqliteOptions, SqliteStore, Synchronous};

use crate::url::StoreUrl;

/// Opens the state store named by `url`:
///
/// - `sqlite://PATH`, `sqlite:PATH` or a bare `PATH`: a SQLite file, created if missing.
///   `?synchronous=full` (or `extra`) trades speed for durability against power loss; the
///   default, `normal`, is durable against the process dying. The path is used as written
///   (no percent-decoding); `sqlite:///abs/path` and `sqlite://rel/path` both work.
/// - `postgres://…` / `postgresql://…`: not available yet ([`Error::Unsupported`]).
pub async fn open(url: &str) -> Result<Arc<dyn StateStore>, Error> {
    match StoreUrl::parse(url)? {
        StoreUrl::Sqlite { path, options } => Ok(Arc::new(SqliteStore::open_with(&path, &options).await?)),
        StoreUrl::Postgres => Err(Error::Unsupported("Postgres state is not available yet")),
    }
}

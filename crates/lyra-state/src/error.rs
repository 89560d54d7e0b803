//! The typed error of `lyra-state`, and its mapping onto the engine's [`StoreError`].

use std::path::PathBuf;
use std::sync::Arc;

use lyra_core::state::{RunId, StoreError, StoreErrorKind};
use sqlx::error::{DatabaseError, ErrorKind as DbErrorKind};
use sqlx::migrate::MigrateError;

/// A state store failure, as precise as the backend can tell.
///
/// The engine sees these through `From<Error> for StoreError`; [`Error::kind`] says how.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store URL is not one `lyra-state` understands. `url` is redacted
    /// ([`crate::redact_url`]).
    #[error("invalid state store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A backend that is known but not available in this build.
    #[error("{0}")]
    Unsupported(&'static str),

    /// The database file's location cannot be used (a directory, an uncreatable parent, ...).
    #[error("cannot open state database {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A command that must not create a store found none: no SQLite file (or one holding no
    /// Lyra state), no Postgres schema or tables. `location` is a path or a redacted URL.
    #[error("no state at {location}")]
    NoState { location: String },

    /// The database could not be opened.
    #[error("cannot open state database {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: sqlx::Error,
    },

    /// The database file could not be opened by the store's own connections.
    #[error("cannot open state database {}: {source}", path.display())]
    OpenFile {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },

    /// The file exists but is not a SQLite database.
    #[error("{} is not a SQLite database (is it the right file?)", path.display())]
    NotADatabase { path: PathBuf },

    /// The schema could not be brought up to date, or was written by a newer Lyra.
    #[error("cannot migrate state database {}: {source}", path.display())]
    Migrate {
        path: PathBuf,
        #[source]
        source: MigrateError,
    },

    /// The Postgres server could not be reached when opening the store. `target` is
    /// `host:port/database`: never the URL, which may hold a password.
    #[error("cannot connect to the Postgres state at {target}: {source}")]
    PgConnect {
        target: String,
        #[source]
        source: sqlx::Error,
    },

    /// The Postgres schema could not be created or brought up to date.
    #[error("cannot migrate the Postgres state at {target}: {source}")]
    PgMigrate {
        target: String,
        #[source]
        source: MigrateError,
    },

    /// The connection to Postgres failed and retrying did not help (or was not safe).
    #[error("lost the connection to the Postgres state at {target}: {source}")]
    PgUnavailable {
        target: String,
        #[source]
        source: sqlx::Error,
    },

    /// A query failed.
    #[error("state database error: {0}")]
    Sqlx(#[from] sqlx::Error),

    /// A SQLite statement failed.
    #[error("state database error: {0}")]
    Sqlite(#[from] rusqlite::Error),

    /// A stored value could not be decoded.
    #[error("corrupt state: cannot decode {what}: {source}")]
    Corrupt {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A stored column holds a value this version does not know.
    #[error("corrupt state: unknown {what} {value:?}")]
    UnknownValue { what: &'static str, value: String },

    /// A value nests too deeply to be read back: it is not written.
    #[error("cannot record {what}: {}", lyra_core::value::too_deep_message("a value"))]
    TooDeep { what: String },

    /// A value could not be encoded for storage.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// `finish_run` named a run that does not exist.
    #[error("run {0} does not exist")]
    UnknownRun(RunId),

    /// `finish_run` was called twice for one run.
    #[error("run {0} has already finished")]
    RunAlreadyFinished(RunId),

    /// A write made under a lease that is no longer current (it expired and was taken, or
    /// was broken): refused in the transaction that would have written it.
    #[error(
        "the lease on deployment {0:?} is no longer held by this run (it expired and was taken over, \
         or was broken): the write was refused"
    )]
    LeaseLost(String),

    /// A lease kept being taken and released faster than it could be read.
    #[error("the lease on deployment {0:?} keeps changing hands")]
    LeaseContended(String),

    /// The store's writer has stopped (the store was closed, or its runtime shut down).
    #[error("the state store is closed")]
    Closed,

    /// One failure shared by every write of a batch that failed as a whole.
    #[error(transparent)]
    Batch(Arc<Error>),
}

impl Error {
    /// An [`Error::InvalidUrl`] naming `url` without its credentials.
    pub(crate) fn invalid_url(url: &str, reason: &str) -> Error {
        Error::InvalidUrl {
            url: crate::redact_url(url),
            reason: reason.to_owned(),
        }
    }

    /// How the engine should see this error.
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            Error::Unsupported(_)
            | Error::Io { .. }
            | Error::Closed
            | Error::InvalidUrl { .. }
            | Error::NoState { .. }
            | Error::PgConnect { .. }
            | Error::PgUnavailable { .. } => StoreErrorKind::Unavailable,
            Error::Open { source, .. } => match sqlx_kind(source) {
                StoreErrorKind::Corrupt => StoreErrorKind::Corrupt,
                _ => StoreErrorKind::Unavailable,
            },
            Error::OpenFile { source, .. } => match sqlite_kind(source) {
                StoreErrorKind::Corrupt => StoreErrorKind::Corrupt,
                _ => StoreErrorKind::Unavailable,
            },
            Error::NotADatabase { .. } | Error::Corrupt { .. } | Error::UnknownValue { .. } => StoreErrorKind::Corrupt,
            Error::Migrate { source, .. } | Error::PgMigrate { source, .. } => migrate_kind(source),
            Error::Sqlx(e) => sqlx_kind(e),
            Error::Sqlite(e) => sqlite_kind(e),
            Error::RunAlreadyFinished(_) | Error::LeaseContended(_) => StoreErrorKind::Conflict,
            Error::LeaseLost(_) => StoreErrorKind::LeaseLost,
            Error::Encode { .. } | Error::TooDeep { .. } | Error::UnknownRun(_) => StoreErrorKind::Other,
            Error::Batch(e) => e.kind(),
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        let kind = e.kind();
        StoreError::with_source(kind, e.to_string(), e)
    }
}

fn migrate_kind(e: &MigrateError) -> StoreErrorKind {
    match e {
        // The file holds migrations this build does not know (a newer Lyra wrote it), or
        // different ones under the same number: not a schema this version understands.
        MigrateError::VersionMissing(_)
        | MigrateError::VersionMismatch(_)
        | MigrateError::VersionTooOld(..)
        | MigrateError::Dirty(_) => StoreErrorKind::Corrupt,
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => sqlx_kind(e),
        _ => StoreErrorKind::Other,
    }
}

pub(crate) fn sqlx_kind(e: &sqlx::Error) -> StoreErrorKind {
    match e {
        sqlx::Error::Database(db) => database_kind(db.as_ref()),
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            StoreErrorKind::Unavailable
        }
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreErrorKind::Corrupt,
        sqlx::Error::Migrate(m) => migrate_kind(m),
        _ => StoreErrorKind::Other,
    }
}

/// How the engine should see a failure of the SQLite store's own connections.
fn sqlite_kind(e: &rusqlite::Error) -> StoreErrorKind {
    use rusqlite::ErrorCode as Code;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            Code::DatabaseCorrupt | Code::NotADatabase => StoreErrorKind::Corrupt,
            Code::PermissionDenied
            | Code::DatabaseBusy
            | Code::DatabaseLocked
            | Code::ReadOnly
            | Code::SystemIoFailure
            | Code::DiskFull
            | Code::CannotOpen => StoreErrorKind::Unavailable,
            Code::ConstraintViolation
                if matches!(
                    f.extended_code,
                    rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                ) =>
            {
                StoreErrorKind::Conflict
            }
            _ => StoreErrorKind::Other,
        },
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::Utf8Error(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreErrorKind::Corrupt,
        _ => StoreErrorKind::Other,
    }
}

fn database_kind(db: &dyn DatabaseError) -> StoreErrorKind {
    if db.kind() == DbErrorKind::UniqueViolation {
        return StoreErrorKind::Conflict;
    }
    if db.code().as_deref().is_some_and(is_pg_connection_code) {
        return StoreErrorKind::Unavailable;
    }
    if let Some(code) = sqlite_primary_code(db) {
        return match code {
            SQLITE_CORRUPT | SQLITE_NOTADB => StoreErrorKind::Corrupt,
            SQLITE_PERM | SQLITE_BUSY | SQLITE_LOCKED | SQLITE_READONLY | SQLITE_IOERR | SQLITE_FULL
            | SQLITE_CANTOPEN => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Other,
        };
    }
    StoreErrorKind::Other
}

/// SQLSTATEs that mean the connection is gone or unusable, not that the statement was wrong:
/// class 08 (connection exception), 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot
/// connect now (starting up or shutting down).
pub(crate) fn is_pg_connection_code(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Whether `e` is a connection fault: the server or the network, not the statement. Used to
/// decide what is worth retrying on a fresh connection.
pub(crate) fn is_connection_fault(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().as_deref().is_some_and(is_pg_connection_code),
        _ => false,
    }
}

// Primary SQLite result codes (https://www.sqlite.org/rescode.html).
pub(crate) const SQLITE_PERM: i32 = 3;
pub(crate) const SQLITE_BUSY: i32 = 5;
pub(crate) const SQLITE_LOCKED: i32 = 6;
pub(crate) const SQLITE_READONLY: i32 = 8;
pub(crate) const SQLITE_IOERR: i32 = 10;
pub(crate) const SQLITE_CORRUPT: i32 = 11;
pub(crate) const SQLITE_FULL: i32 = 13;
pub(crate) const SQLITE_CANTOPEN: i32 = 14;
pub(crate) const SQLITE_NOTADB: i32 = 26;

/// The primary result code of a SQLite error (sqlx reports the extended code, whose low byte
/// is the primary one).
pub(crate) fn sqlite_primary_code(db: &dyn DatabaseError) -> Option<i32> {
    let sqlite = db.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    let code: i32 = sqlite.code()?.parse().ok()?;
    Some(code & 0xff)
}

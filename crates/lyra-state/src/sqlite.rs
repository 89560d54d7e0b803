//! The SQLite state store.
//!
//! One file holds everything. Writes go through a single writer connection that the callers
//! take turns on, each turn committing everything queued at once (group commit, see [`writer`]);
//! reads use a small pool and run in read transactions, so each sees one consistent snapshot.
//! WAL mode lets the readers and the writer run side by side.
//!
//! Leases are rows of `leases`, taken and renewed through the writer with conditional upserts
//! under SQLite's write lock, so two processes on one file agree on who holds one. Their times
//! are this machine's clock: every process sharing a file runs on the same machine.

mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::{Admin, Fence, Leases};
use crate::{DeploymentExport, DeploymentSummary, Lease, LeaseGrant, LeaseRequest, RunRecord};
use async_trait::async_trait;
use lyra_core::state::{DeploymentState, ResourceRecord, RunEnd, RunId, RunStart, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};

use crate::error::{Error, SQLITE_NOTADB, sqlite_primary_code};
use crate::rows::{DeploymentSummaryRow, LeaseRow, ResourceRow, RunEndRow, RunRow, lease_columns, now_ms, run_columns};

use self::writer::{Done, ImportRows, Op, Writer};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// SQLite's `synchronous` setting: how hard a commit pushes data to the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// Commits survive a process crash; the last ones may be lost on power loss.
    #[default]
    Normal,
    /// Commits also survive power loss (one `fsync` per commit).
    Full,
    /// Like `Full`, and also syncs the directory after WAL resets.
    Extra,
}

impl Synchronous {
    fn to_sqlx(self) -> SqliteSynchronous {
        match self {
            Synchronous::Normal => SqliteSynchronous::Normal,
            Synchronous::Full => SqliteSynchronous::Full,
            Synchronous::Extra => SqliteSynchronous::Extra,
        }
    }
}

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteOptions {
    pub synchronous: Synchronous,
    /// How long a write waits for another process holding the database before failing.
    pub busy_timeout: Duration,
    /// Size of the read pool.
    pub read_connections: u32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(10),
            read_connections: 4,
        }
    }
}

/// A state store ([`crate::Store`]) in one SQLite file.
///
/// Every write is committed when its call returns; concurrent writes share one commit.
///
/// Durability: with the default `synchronous=NORMAL` a committed write survives the process
/// dying (even `kill -9`), which is what the engine needs; on a power loss or OS crash the last
/// commits can be lost (the database stays consistent). [`Synchronous::Full`] (URL
/// `sqlite:PATH?synchronous=full`) syncs the WAL on every commit and survives that too, at the
/// cost of one `fsync` per batch.
///
/// Several processes may open one file: writes wait for each other (up to
/// [`SqliteOptions::busy_timeout`]) instead of failing.
pub struct SqliteStore {
    path: PathBuf,
    /// See [`Recorder::store_id`].
    id: String,
    reads: SqlitePool,
    writer: Writer,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating it and its parent directories if needed) the database at `path`, with
    /// default options, and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<SqliteStore, Error> {
        Self::open_with(path, &SqliteOptions::default()).await
    }

    /// [`SqliteStore::open`] with explicit options.
    pub async fn open_with(path: &Path, options: &SqliteOptions) -> Result<SqliteStore, Error> {
        prepare_location(path)?;
        Self::connect(path, options, true).await
    }

    /// Opens the database at `path` only if it holds a Lyra state: creates no file or
    /// directory, and does not turn an empty file or another program's database into a state.
    /// Otherwise [`Error::NoState`]. An existing state's schema is brought up to date.
    pub async fn open_existing(path: &Path, options: &SqliteOptions) -> Result<SqliteStore, Error> {
        check_existing(path).await?;
        Self::connect(path, options, false).await
    }

    async fn connect(path: &Path, options: &SqliteOptions, create: bool) -> Result<SqliteStore, Error> {
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(options.synchronous.to_sqlx())
            .busy_timeout(options.busy_timeout)
            .foreign_keys(true);

        // Connecting sets the journal mode, which reads the header: a foreign file fails here.
        // Switching a new file to WAL needs the write lock, and SQLite may report it busy
        // before the busy timeout applies: another process is creating the same file.
        let started = std::time::Instant::now();
        let mut conn = loop {
            match SqliteConnection::connect_with(&connect).await {
                Ok(c) => break c,
                Err(e) if is_busy(&e) && started.elapsed() < options.busy_timeout => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(open_error(path, e)),
            }
        };
        migrate(path, &mut conn).await?;
        let id: String = sqlx::query_scalar("SELECT id FROM store_identity")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| open_error(path, e))?;

        // Readers never write; `query_only` makes sure of it.
        let reads = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .min_connections(0)
            .connect_with(connect.pragma("query_only", "ON"))
            .await
            .map_err(|e| open_error(path, e))?;

        Ok(SqliteStore {
            path: path.to_owned(),
            id,
            reads,
            writer: Writer::new(conn),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the store: waits for queued writes to commit, then closes every connection.
    ///
    /// Dropping the store is also safe (queued writes still commit in the background); this
    /// just lets the caller wait for it and see errors.
    pub async fn close(self) -> Result<(), Error> {
        self.reads.close().await;
        // The writer closes last, so its connection checkpoints the WAL into the database.
        self.writer.close().await
    }
}

/// Whether `path` is a SQLite file holding a Lyra state, looked at without changing it: a
/// read-only connection that sets no journal mode (switching to WAL would write).
async fn check_existing(path: &Path) -> Result<(), Error> {
    let no_state = || Error::NoState {
        location: path.display().to_string(),
    };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(no_state()),
        Err(source) => {
            return Err(Error::Io {
                path: path.to_owned(),
                source,
            });
        }
        Ok(m) if m.is_dir() => {
            return Err(Error::Io {
                path: path.to_owned(),
                source: std::io::ErrorKind::IsADirectory.into(),
            });
        }
        // SQLite reads an empty file as an empty database: no state in it yet.
        Ok(m) if m.len() == 0 => return Err(no_state()),
        Ok(_) => {}
    }
    let probe = SqliteConnectOptions::new().filename(path).read_only(true);
    let mut conn = SqliteConnection::connect_with(&probe)
        .await
        .map_err(|e| open_error(path, e))?;
    let migrated: Result<Option<String>, sqlx::Error> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
            .fetch_optional(&mut conn)
            .await;
    let _ = conn.close().await;
    match migrated.map_err(|e| open_error(path, e))? {
        Some(_) => Ok(()),
        None => Err(no_state()),
    }
}

/// Refuses a directory with a clear message and creates missing parent directories.
fn prepare_location(path: &Path) -> Result<(), Error> {
    let io_error = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    if path.as_os_str().is_empty() {
        return Err(io_error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty path",
        )));
    }
    if path.is_dir() {
        return Err(io_error(std::io::ErrorKind::IsADirectory.into()));
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => std::fs::create_dir_all(parent).map_err(io_error),
        _ => Ok(()),
    }
}

fn is_not_a_database(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(sqlite_primary_code) == Some(SQLITE_NOTADB)
}

fn open_error(path: &Path, source: sqlx::Error) -> Error {
    if is_not_a_database(&source) {
        Error::NotADatabase { path: path.to_owned() }
    } else {
        Error::Open {
            path: path.to_owned(),
            source,
        }
    }
}

/// Runs the embedded migrations under the write lock (`BEGIN IMMEDIATE`), so two processes
/// opening a new file at once do not both try to create the schema: the second waits, then
/// finds it done.
async fn migrate(path: &Path, conn: &mut SqliteConnection) -> Result<(), Error> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| open_error(path, e))?;
    let migrated = MIGRATOR.run(&mut *tx).await;
    let migrated = match migrated {
        Ok(()) => tx.commit().await.map_err(sqlx::migrate::MigrateError::from),
        Err(e) => Err(e),
    };
    migrated.map_err(|source| match &source {
        sqlx::migrate::MigrateError::Execute(e) if is_not_a_database(e) => {
            Error::NotADatabase { path: path.to_owned() }
        }
        _ => Error::Migrate {
            path: path.to_owned(),
            source,
        },
    })
}

crate::store::recorder_and_fenced_writes!(SqliteStore);

/// What the `Recorder` and `FencedWrites` impls delegate to: the load, and the writes of a run
/// (under `fence` when given).
impl SqliteStore {
    /// The recorded state of a deployment, in one read transaction.
    async fn load_state(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError> {
        let mut tx = self.reads.begin().await.map_err(Error::from)?;
        let state = load_in(&mut tx, deployment).await?;
        tx.commit().await.map_err(Error::from)?;
        Ok(state)
    }

    async fn begin_run_in(&self, fence: Option<&Fence>, run: &RunStart) -> Result<RunId, StoreError> {
        let row = RunRow::started(run, now_ms())?;
        match self.writer.submit_fenced(Op::BeginRun(row), fence.cloned()).await? {
            Done::Run(id) => Ok(id),
            other => unreachable!("begin_run answered {other:?}"),
        }
    }

    async fn put_resource_in(
        &self,
        fence: Option<&Fence>,
        deployment: &str,
        record: &ResourceRecord,
    ) -> Result<(), StoreError> {
        // Encoding happens here, in the caller's task, so the writer only runs SQL.
        let row = ResourceRow::new(deployment, record, now_ms())?;
        self.writer.submit_fenced(Op::Put(row), fence.cloned()).await?;
        Ok(())
    }

    async fn remove_resource_in(
        &self,
        fence: Option<&Fence>,
        deployment: &str,
        step_id: &str,
    ) -> Result<(), StoreError> {
        let op = Op::Remove {
            deployment: deployment.to_owned(),
            step_id: step_id.to_owned(),
        };
        self.writer.submit_fenced(op, fence.cloned()).await?;
        Ok(())
    }

    async fn finish_run_in(&self, fence: Option<&Fence>, run: RunId, end: &RunEnd) -> Result<(), StoreError> {
        let row = RunEndRow::new(run, end, now_ms())?;
        self.writer.submit_fenced(Op::FinishRun(row), fence.cloned()).await?;
        Ok(())
    }
}

#[async_trait]
impl Admin for SqliteStore {
    async fn list(&self) -> Result<Vec<DeploymentSummary>, StoreError> {
        Ok(self.list_inner().await?)
    }

    async fn history(&self, deployment: &str) -> Result<Vec<RunRecord>, StoreError> {
        let rows: Vec<RunRow> = sqlx::query_as(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE deployment = ?1 ORDER BY id DESC"
        ))
        .bind(deployment)
        .fetch_all(&self.reads)
        .await
        .map_err(Error::from)?;
        Ok(rows.into_iter().map(RunRow::into_record).collect::<Result<_, _>>()?)
    }

    async fn export(&self, deployment: &str) -> Result<Option<DeploymentExport>, StoreError> {
        // One read transaction: the resources and the history come from the same snapshot.
        let mut tx = self.reads.begin().await.map_err(Error::from)?;
        let Some(state) = load_in(&mut tx, deployment).await? else {
            return Ok(None);
        };
        let rows: Vec<RunRow> = sqlx::query_as(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE deployment = ?1 ORDER BY id"
        ))
        .bind(deployment)
        .fetch_all(&mut *tx)
        .await
        .map_err(Error::from)?;
        tx.commit().await.map_err(Error::from)?;
        let history = rows.into_iter().map(RunRow::into_record).collect::<Result<_, _>>()?;
        Ok(Some(DeploymentExport { state, history }))
    }

    async fn import(&self, export: &DeploymentExport) -> Result<(), StoreError> {
        let op = Op::Import(Box::new(ImportRows::new(export, now_ms())?));
        self.writer.submit(op).await?;
        Ok(())
    }

    async fn drop_deployment(&self, deployment: &str) -> Result<bool, StoreError> {
        let op = Op::Drop {
            deployment: deployment.to_owned(),
        };
        match self.writer.submit(op).await? {
            Done::Existed(existed) => Ok(existed),
            other => unreachable!("drop_deployment answered {other:?}"),
        }
    }
}

#[async_trait]
impl Leases for SqliteStore {
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        let op = Op::AcquireLease {
            lease: LeaseRow {
                deployment: request.deployment.clone(),
                owner: request.owner.clone(),
                operation: request.operation.clone(),
                token: request.token.clone(),
                since: 0,
                expires: 0,
            },
            ttl_ms: request.ttl_ms,
        };
        match self.writer.submit(op).await? {
            Done::Grant { acquired: true, lease } => Ok(LeaseGrant::Acquired(lease.into())),
            Done::Grant { acquired: false, lease } => Ok(LeaseGrant::Held(lease.public())),
            other => unreachable!("acquire_lease answered {other:?}"),
        }
    }

    async fn renew_lease(&self, lease: &Lease, ttl_ms: i64) -> Result<Option<Lease>, StoreError> {
        let op = Op::RenewLease {
            deployment: lease.deployment.clone(),
            token: lease.token.clone(),
            ttl_ms,
        };
        match self.writer.submit(op).await? {
            Done::Lease(lease) => Ok(lease.map(Lease::from)),
            other => unreachable!("renew_lease answered {other:?}"),
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        let op = Op::ReleaseLease {
            deployment: lease.deployment.clone(),
            token: lease.token.clone(),
        };
        match self.writer.submit(op).await? {
            Done::Existed(ours) => Ok(ours),
            other => unreachable!("release_lease answered {other:?}"),
        }
    }

    async fn lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError> {
        let row: Option<LeaseRow> = sqlx::query_as(concat!(
            "SELECT ",
            lease_columns!(),
            " FROM leases WHERE deployment = ?1 AND expires > ?2"
        ))
        .bind(deployment)
        .bind(now_ms())
        .fetch_optional(&self.reads)
        .await
        .map_err(Error::from)?;
        Ok(row.map(LeaseRow::public))
    }

    async fn break_lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError> {
        let op = Op::BreakLease {
            deployment: deployment.to_owned(),
        };
        match self.writer.submit(op).await? {
            Done::Lease(lease) => Ok(lease.map(Lease::from)),
            other => unreachable!("break_lease answered {other:?}"),
        }
    }
}

/// A resource row (its deployment aside) as one text value: each text column as
/// `<bytes>:<text>`, each integer as `<digits>;`, a null `create_key` as `-`. sqlx copies
/// every value of every row it reads (`sqlite3_value_dup`: an allocation, and a free, each
/// under SQLite's allocator mutex, from two threads); one value per row instead of eleven
/// made reading a large state several times cheaper. The tables are STRICT and the columns
/// NOT NULL, so the value is never null and its integers are integers.
macro_rules! packed_resource {
    () => {
        "octet_length(step_id) || ':' || step_id || \
         octet_length(type_name) || ':' || type_name || \
         octet_length(external_id) || ':' || external_id || \
         octet_length(desired) || ':' || desired || \
         octet_length(actual) || ':' || actual || \
         octet_length(depends_on) || ':' || depends_on || \
         managed || ';' || pending || ';' || \
         octet_length(sensitive) || ':' || sensitive || \
         updated_at || ';' || \
         ifnull(octet_length(create_key) || ':' || create_key, '-')"
    };
}

/// A deployment and its resources, read in the caller's transaction.
async fn load_in(conn: &mut SqliteConnection, deployment: &str) -> Result<Option<DeploymentState>, Error> {
    let workflow: Option<Option<String>> = sqlx::query_scalar("SELECT workflow FROM deployments WHERE name = ?1")
        .bind(deployment)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(workflow) = workflow else {
        return Ok(None);
    };
    let packed: Vec<String> = sqlx::query_scalar(concat!(
        "SELECT ",
        packed_resource!(),
        " FROM resources WHERE deployment = ?1 ORDER BY step_id"
    ))
    .bind(deployment)
    .fetch_all(&mut *conn)
    .await?;
    let rows = packed
        .iter()
        .map(|p| unpack_resource(deployment, p))
        .collect::<Result<Vec<_>, _>>()?;
    drop(packed);
    Ok(Some(crate::rows::deployment_state(deployment, workflow, rows)))
}

/// Reads a value of [`packed_resource!`].
fn unpack_resource(deployment: &str, packed: &str) -> Result<ResourceRow, Error> {
    struct Cursor<'a>(&'a str);
    impl<'a> Cursor<'a> {
        fn text(&mut self) -> Option<&'a str> {
            let (len, rest) = self.0.split_once(':')?;
            let len: usize = len.parse().ok()?;
            let text = rest.get(..len)?;
            self.0 = rest.get(len..)?;
            Some(text)
        }
        fn int(&mut self) -> Option<i64> {
            let (digits, rest) = self.0.split_once(';')?;
            self.0 = rest;
            digits.parse().ok()
        }
        fn row(&mut self, deployment: &str) -> Option<ResourceRow> {
            Some(ResourceRow {
                deployment: deployment.to_owned(),
                step_id: self.text()?.to_owned(),
                type_name: self.text()?.to_owned(),
                external_id: self.text()?.to_owned(),
                desired: self.text()?.to_owned(),
                actual: self.text()?.to_owned(),
                depends_on: self.text()?.to_owned(),
                managed: self.int()? != 0,
                pending: self.int()? != 0,
                sensitive: self.text()?.to_owned(),
                updated_at: self.int()?,
                create_key: match self.0.strip_prefix('-') {
                    Some(rest) => {
                        self.0 = rest;
                        None
                    }
                    None => Some(self.text()?.to_owned()),
                },
            })
        }
    }
    let mut cursor = Cursor(packed);
    match cursor.row(deployment) {
        Some(row) if cursor.0.is_empty() => Ok(row),
        _ => Err(Error::Sqlx(sqlx::Error::Decode(
            format!("a resource row of deployment {deployment:?} did not read back as written").into(),
        ))),
    }
}

impl ImportRows {
    fn new(export: &DeploymentExport, now: i64) -> Result<ImportRows, Error> {
        let deployment = &export.state.name;
        Ok(ImportRows {
            deployment: deployment.clone(),
            workflow: export.state.workflow.clone(),
            resources: export
                .state
                .resources
                .iter()
                .map(|r| ResourceRow::new(deployment, r, now))
                .collect::<Result<_, _>>()?,
            runs: export
                .history
                .iter()
                .map(|r| RunRow::imported(r, deployment))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl SqliteStore {
    async fn list_inner(&self) -> Result<Vec<DeploymentSummary>, Error> {
        let mut tx = self.reads.begin().await?;
        let deployments: Vec<DeploymentSummaryRow> = sqlx::query_as(
            "SELECT d.name, d.workflow, \
                    (SELECT COUNT(*) FROM resources r WHERE r.deployment = d.name) AS resources \
             FROM deployments d ORDER BY d.name",
        )
        .fetch_all(&mut *tx)
        .await?;
        let last_runs: Vec<RunRow> = sqlx::query_as(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY deployment)"
        ))
        .fetch_all(&mut *tx)
        .await?;
        let leases: Vec<LeaseRow> =
            sqlx::query_as(concat!("SELECT ", lease_columns!(), " FROM leases WHERE expires > ?1"))
                .bind(now_ms())
                .fetch_all(&mut *tx)
                .await?;
        tx.commit().await?;
        crate::rows::summaries(deployments, last_runs, leases)
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// `SQLITE_BUSY` / `SQLITE_LOCKED`: someone else holds the lock for now.
fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("5" | "6" | "261" | "517")),
        _ => false,
    }
}

//! The SQLite state store.
//!
//! One file holds everything. Writes go through a single writer connection that the callers
//! take turns on, each turn committing everything queued at once (group commit, see [`writer`]);
//! reads use a small pool of connections and run in read transactions, so each sees one
//! consistent snapshot. WAL mode lets the readers and the writer run side by side.
//!
//! The connections are rusqlite's: a statement runs on the thread that asks for it. Writes
//! run on the caller's own thread (see [`writer`]); reads, which can be long (a whole
//! deployment), run on Tokio's blocking threads. sqlx opens a file that is new or behind the
//! embedded migrations, to run them, which keeps the migration table files have had from the
//! start; a file already up to date is opened on the writer's connection alone.
//!
//! Leases are rows of `leases`, taken and renewed through the writer with conditional upserts
//! under SQLite's write lock, so two processes on one file agree on who holds one. Their times
//! are this machine's clock: every process sharing a file runs on the same machine.

mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::store::{Admin, Fence, Leases};
use crate::{DeploymentExport, DeploymentSummary, Lease, LeaseGrant, LeaseRequest, RecordStream, RunRecord};
use async_trait::async_trait;
use lyra_core::state::{DeploymentState, ResourceRecord, RunEnd, RunId, RunStart, StoreError};
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection as _, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, SQLITE_NOTADB, sqlite_primary_code};
use crate::rows::{
    APPLIED_MIGRATIONS, AppliedMigration, DeploymentSummaryRow, LeaseRow, ResourceColumns, ResourceRow, RunEndRow,
    RunRow, StateBuilder, applied_as_embedded, lease_columns, now_ms, run_columns,
};

use self::writer::{Done, ImportRows, Op, Writer, lease_row};

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

    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
            Synchronous::Extra => "EXTRA",
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
    /// Most read connections kept open between reads.
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
    reads: Arc<Reads>,
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
        if let Some(store) = Self::open_current(path, options).await {
            return Ok(store);
        }
        Self::connect(path, options, true).await
    }

    /// Opens the database at `path` only if it holds a Lyra state: creates no file or
    /// directory, and does not turn an empty file or another program's database into a state.
    /// Otherwise [`Error::NoState`]. An existing state's schema is brought up to date.
    pub async fn open_existing(path: &Path, options: &SqliteOptions) -> Result<SqliteStore, Error> {
        if let Some(store) = Self::open_current(path, options).await {
            return Ok(store);
        }
        check_existing(path).await?;
        Self::connect(path, options, false).await
    }

    /// The store at `path` when it is a Lyra state already up to date, opened on the writer's
    /// connection alone; None for anything else (no file, another database, a schema to
    /// migrate, a migration table sqlx would refuse), which the full open then handles and
    /// reports. It only reads, so it can try any file. Every command on a state opens it,
    /// and the full open (a probe, a sqlx connection, its migration check, then the writer's
    /// connection) costs more than the reads of a small plan: 1.2–1.5 ms of a 3.5–6 ms
    /// command here.
    async fn open_current(path: &Path, options: &SqliteOptions) -> Option<SqliteStore> {
        let reads = Reads::new(path, options);
        let opening = Arc::clone(&reads);
        let (writer, id) = tokio::task::spawn_blocking(move || -> Option<(Connection, String)> {
            let conn = opening.open(Role::Write).ok()?;
            let id = current_identity(&conn).ok()??;
            Some((conn, id))
        })
        .await
        .ok()??;
        Some(SqliteStore::assemble(id, reads, writer))
    }

    /// The store on `reads` (its path and options) with `writer` as its write connection.
    fn assemble(id: String, reads: Arc<Reads>, writer: Connection) -> SqliteStore {
        let busy_timeout = reads.options.busy_timeout;
        SqliteStore {
            path: reads.path.clone(),
            id,
            reads,
            writer: Writer::new(writer, busy_timeout),
        }
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

        // The store's own connections, opened before the migration's closes: the last
        // connection to close checkpoints the WAL away, and the next would start a new one.
        let reads = Reads::new(path, options);
        let writer = {
            let reads = Arc::clone(&reads);
            tokio::task::spawn_blocking(move || reads.open(Role::Write))
                .await
                .map_err(|_| Error::Closed)?
        };
        let writer = writer.map_err(|source| Error::OpenFile {
            path: path.to_owned(),
            source,
        })?;
        let _ = conn.close().await;

        Ok(SqliteStore::assemble(id, reads, writer))
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
        self.reads.close();
        // The writer closes last, so its connection checkpoints the WAL into the database.
        self.writer.close().await
    }

    /// Runs `f` in a read transaction (one snapshot) on a pooled connection, on a blocking
    /// thread.
    async fn read<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, Error> + Send + 'static,
    {
        let reads = Arc::clone(&self.reads);
        let permit = reads.permit().await?;
        let read = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let conn = reads.take()?;
            let result = conn.unchecked_transaction().map_err(Error::from).and_then(|tx| {
                let value = f(&tx)?;
                tx.commit()?;
                Ok(value)
            });
            // A failed transaction was rolled back (dropped): the connection is fine.
            reads.give_back(conn);
            result
        });
        match read.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::Closed),
        }
    }
}

/// Which connection [`Reads::open`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Read,
    Write,
}

/// The read connections, opened as needed and kept for the next read.
struct Reads {
    path: PathBuf,
    options: SqliteOptions,
    idle: Mutex<Vec<Connection>>,
    /// At most [`SqliteOptions::read_connections`] reads at once, so no more connections.
    permits: Arc<tokio::sync::Semaphore>,
}

impl Reads {
    /// No connection yet: each is opened when a read first needs it.
    fn new(path: &Path, options: &SqliteOptions) -> Arc<Reads> {
        Arc::new(Reads {
            path: path.to_owned(),
            options: options.clone(),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(tokio::sync::Semaphore::new(options.read_connections.max(1) as usize)),
        })
    }

    /// Waits for a read's turn.
    async fn permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Error::Closed)
    }

    /// A connection to the file (which exists: sqlx made it), set up for `role`.
    fn open(&self, role: Role) -> Result<Connection, rusqlite::Error> {
        // Not a URI: the path is used as written. No mutex: one thread uses it at a time.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags)?;
        // rusqlite's `busy_timeout` refuses more than i32::MAX milliseconds.
        let max = Duration::from_millis(i32::MAX as u64);
        conn.busy_timeout(self.options.busy_timeout.min(max))?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        match role {
            Role::Write => {
                conn.pragma_update(None, "synchronous", self.options.synchronous.pragma())?;
                // Every statement the writer makes, prepared once.
                conn.set_prepared_statement_cache_capacity(32);
            }
            // Readers never write; `query_only` makes sure of it.
            Role::Read => conn.pragma_update(None, "query_only", "ON")?,
        }
        Ok(conn)
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Result<Connection, Error> {
        let idle = self.idle().pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.open(Role::Read).map_err(Error::from),
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.idle();
        if idle.len() < self.options.read_connections.max(1) as usize {
            idle.push(conn);
        }
    }

    fn close(&self) {
        self.permits.close();
        self.idle().clear();
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
    let probe_path = path.to_owned();
    let probe = tokio::task::spawn_blocking(move || -> Result<bool, rusqlite::Error> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&probe_path, flags)?;
        conn.query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
            [],
            |_| Ok(()),
        )
        .optional()
        .map(|found| found.is_some())
    })
    .await
    .map_err(|_| Error::Closed)?;
    match probe {
        Ok(true) => Ok(()),
        Ok(false) => Err(no_state()),
        Err(source) => Err(open_file_error(path, source)),
    }
}

/// The store id of the database `conn` is open on, if it is a Lyra state in WAL mode with
/// exactly the embedded migrations applied, each successfully and as embedded: what sqlx's
/// migrator would leave as it is. Read in one snapshot: a migration running in another
/// process commits whole, so it is seen done or not at all. Reads only.
fn current_identity(conn: &Connection) -> Result<Option<String>, rusqlite::Error> {
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(None);
    }
    let tx = conn.unchecked_transaction()?;
    let applied: Vec<AppliedMigration> = tx
        .prepare(APPLIED_MIGRATIONS)?
        .query_map([], |r| {
            Ok(AppliedMigration {
                version: r.get(0)?,
                success: r.get(1)?,
                checksum: r.get(2)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    if !applied_as_embedded(&MIGRATOR, &applied) {
        return Ok(None);
    }
    let id = tx
        .query_row("SELECT id FROM store_identity", [], |r| r.get(0))
        .optional()?;
    tx.commit()?;
    Ok(id)
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

fn open_file_error(path: &Path, source: rusqlite::Error) -> Error {
    if source.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
        Error::NotADatabase { path: path.to_owned() }
    } else {
        Error::OpenFile {
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
        let deployment = deployment.to_owned();
        Ok(self.read(move |conn| load_in(conn, &deployment)).await?)
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

    /// No release of its own: a release is a write to the local file, which the writer
    /// commits with whatever else is queued, so there is no round trip to spare.
    async fn finish_run_and_release_in(&self, fence: &Fence, run: RunId, end: &RunEnd) -> Result<bool, StoreError> {
        self.finish_run_in(Some(fence), run, end).await?;
        Ok(false)
    }
}

/// The runs of a deployment, oldest or newest first.
fn runs_in(conn: &Connection, deployment: &str, newest_first: bool) -> Result<Vec<RunRecord>, Error> {
    let sql = if newest_first {
        concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE deployment = ?1 ORDER BY id DESC"
        )
    } else {
        concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE deployment = ?1 ORDER BY id"
        )
    };
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement
        .query_map(params![deployment], run_row)?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(RunRow::into_record).collect()
}

#[async_trait]
impl Admin for SqliteStore {
    async fn list(&self) -> Result<Vec<DeploymentSummary>, StoreError> {
        Ok(self.read(list_in).await?)
    }

    async fn history(&self, deployment: &str) -> Result<Vec<RunRecord>, StoreError> {
        let deployment = deployment.to_owned();
        Ok(self.read(move |conn| runs_in(conn, &deployment, true)).await?)
    }

    async fn records(&self, deployment: &str) -> Result<Option<RecordStream>, StoreError> {
        let (head, found) = oneshot::channel::<Result<Option<Option<String>>, Error>>();
        let (records, received) = mpsc::channel(RECORDS_AHEAD);
        let reads = Arc::clone(&self.reads);
        let permit = reads.permit().await?;
        let name = deployment.to_owned();
        let deployment = name.clone();
        // One read transaction on a blocking thread, which waits while the consumer is
        // behind: no more than `RECORDS_AHEAD` records are ever in memory.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut head = Some(head);
            let read = reads.take().and_then(|conn| {
                let read = conn.unchecked_transaction().map_err(Error::from).and_then(|tx| {
                    let workflow = deployment_in(&tx, &deployment)?;
                    let exists = workflow.is_some();
                    if let Some(head) = head.take() {
                        let _ = head.send(Ok(workflow));
                    }
                    if exists {
                        // Stops when the consumer has gone.
                        for_each_resource(&tx, &deployment, |columns| {
                            records.blocking_send(Ok(columns.read())).is_ok()
                        })?;
                    }
                    Ok(())
                });
                reads.give_back(conn);
                read
            });
            if let Err(e) = read {
                match head.take() {
                    Some(head) => {
                        let _ = head.send(Err(e));
                    }
                    None => {
                        let _ = records.blocking_send(Err(e.into()));
                    }
                }
            }
        });
        let workflow = found.await.map_err(|_| Error::Closed)??;
        Ok(workflow.map(|workflow| RecordStream::from_channel(name, workflow, received)))
    }

    async fn export(&self, deployment: &str) -> Result<Option<DeploymentExport>, StoreError> {
        let deployment = deployment.to_owned();
        // One read transaction: the resources and the history come from the same snapshot.
        Ok(self
            .read(move |conn| {
                let Some(state) = load_in(conn, &deployment)? else {
                    return Ok(None);
                };
                let history = runs_in(conn, &deployment, false)?;
                Ok(Some(DeploymentExport { state, history }))
            })
            .await?)
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
        let deployment = deployment.to_owned();
        let row = self
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(concat!(
                        "SELECT ",
                        lease_columns!(),
                        " FROM leases WHERE deployment = ?1 AND expires > ?2"
                    ))?
                    .query_row(params![deployment, now_ms()], lease_row)
                    .optional()?)
            })
            .await?;
        Ok(row.map(LeaseRow::public))
    }

    async fn break_lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError> {
        self.delete_lease(deployment, None).await
    }

    async fn break_lease_held_by(&self, deployment: &str, holder: &str) -> Result<Option<Lease>, StoreError> {
        if !crate::lease::holder::is_public_part(holder) {
            return Ok(None);
        }
        self.delete_lease(deployment, Some(holder)).await
    }
}

impl SqliteStore {
    /// Deletes the deployment's lease, if `held_by` is given only while its token ends so.
    async fn delete_lease(&self, deployment: &str, held_by: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let op = Op::BreakLease {
            deployment: deployment.to_owned(),
            held_by: held_by.map(str::to_owned),
        };
        match self.writer.submit(op).await? {
            Done::Lease(lease) => Ok(lease.map(Lease::from)),
            other => unreachable!("breaking a lease answered {other:?}"),
        }
    }
}

/// A column's text, borrowed from SQLite's buffer (valid until the next row).
fn text<'r>(row: &'r rusqlite::Row<'_>, i: usize) -> Result<&'r str, rusqlite::Error> {
    row.get_ref(i)?
        .as_str()
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
}

/// The workflow a deployment runs, read in the caller's transaction; `None`: no such
/// deployment.
fn deployment_in(conn: &Connection, deployment: &str) -> Result<Option<Option<String>>, Error> {
    Ok(conn
        .prepare_cached("SELECT workflow FROM deployments WHERE name = ?1")?
        .query_row(params![deployment], |row| row.get(0))
        .optional()?)
}

/// Calls `each` with the columns of every resource of `deployment`, in step order, read in
/// the caller's transaction, until it answers `false`. The columns are the text SQLite lends:
/// a record is decoded from them without copying them into a row first.
fn for_each_resource(
    conn: &Connection,
    deployment: &str,
    mut each: impl FnMut(&ResourceColumns<'_>) -> bool,
) -> Result<(), Error> {
    let mut statement = conn.prepare_cached(
        "SELECT step_id, type_name, external_id, desired, actual, depends_on, managed, pending, sensitive, \
                create_key \
         FROM resources WHERE deployment = ?1 ORDER BY step_id",
    )?;
    let mut rows = statement.query(params![deployment])?;
    while let Some(row) = rows.next()? {
        let create_key = row.get_ref(9)?;
        let columns = ResourceColumns {
            deployment,
            step_id: text(row, 0)?,
            type_name: text(row, 1)?,
            external_id: text(row, 2)?,
            desired: text(row, 3)?,
            actual: text(row, 4)?,
            depends_on: text(row, 5)?,
            managed: row.get(6)?,
            pending: row.get(7)?,
            sensitive: text(row, 8)?,
            create_key: match create_key {
                rusqlite::types::ValueRef::Null => None,
                _ => Some(text(row, 9)?),
            },
        };
        if !each(&columns) {
            break;
        }
    }
    Ok(())
}

/// A deployment and its resources, read in the caller's transaction.
fn load_in(conn: &Connection, deployment: &str) -> Result<Option<DeploymentState>, Error> {
    let Some(workflow) = deployment_in(conn, deployment)? else {
        return Ok(None);
    };
    let mut state = StateBuilder::new(deployment, workflow);
    for_each_resource(conn, deployment, |columns| {
        state.push(columns);
        true
    })?;
    Ok(Some(state.finish()))
}

/// How many records [`Admin::records`] reads ahead of its consumer.
const RECORDS_AHEAD: usize = 64;

/// A [`RunRow`] from the columns of [`run_columns!`], in order.
fn run_row(row: &rusqlite::Row<'_>) -> Result<RunRow, rusqlite::Error> {
    Ok(RunRow {
        id: row.get(0)?,
        deployment: row.get(1)?,
        workflow: row.get(2)?,
        operation: row.get(3)?,
        actor: row.get(4)?,
        started_at: row.get(5)?,
        finished_at: row.get(6)?,
        outcome: row.get(7)?,
        counts: row.get(8)?,
        changes: row.get(9)?,
        error: row.get(10)?,
        note: row.get(11)?,
        returns: row.get(12)?,
    })
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

/// Every deployment with its last run and lease, from one snapshot.
fn list_in(conn: &Connection) -> Result<Vec<DeploymentSummary>, Error> {
    let deployments = conn
        .prepare_cached(
            "SELECT d.name, d.workflow, \
                    (SELECT COUNT(*) FROM resources r WHERE r.deployment = d.name) AS resources \
             FROM deployments d ORDER BY d.name",
        )?
        .query_map([], |row| {
            Ok(DeploymentSummaryRow {
                name: row.get(0)?,
                workflow: row.get(1)?,
                resources: row.get(2)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let last_runs = conn
        .prepare_cached(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY deployment)"
        ))?
        .query_map([], run_row)?
        .collect::<Result<Vec<_>, _>>()?;
    let leases = conn
        .prepare_cached(concat!("SELECT ", lease_columns!(), " FROM leases WHERE expires > ?1"))?
        .query_map(params![now_ms()], lease_row)?
        .collect::<Result<Vec<_>, _>>()?;
    crate::rows::summaries(deployments, last_runs, leases)
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

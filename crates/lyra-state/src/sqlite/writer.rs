//! Group commit: the callers share the write connection, and one at a time commits what is
//! queued.
//!
//! The engine records each step's outcome and waits for it before starting the step's
//! dependents, often from many steps at once. A commit per call would serialise all of them
//! behind the disk; instead every call queues its write and waits for its answer. A caller
//! that finds nobody committing leads: it commits what is queued (its own write, often alone)
//! in its own task, with no hand-off to another task and back, and once answered leaves
//! whatever queued meanwhile to a drainer task, which commits batch after batch until the
//! queue is empty. Each batch is one `BEGIN IMMEDIATE` transaction, and its waiters are
//! answered only after the commit, so every write is durable when its call returns. While one
//! batch commits the next one queues up, so batches grow with the load by themselves. A batch
//! of one single-statement write skips `BEGIN`/`COMMIT` and runs as its own autocommit
//! transaction: in a deep chain of dependent steps that is every write.
//!
//! A leader's future may be dropped (its caller gave up): other callers' writes are therefore
//! committed in a task of their own, never inline in a future that can vanish, and a leader
//! that goes early hands the queue to a drainer task.
//!
//! Lease operations go through the same queue: a conditional upsert inside a `BEGIN IMMEDIATE`
//! transaction is atomic against every other process writing the file, which is what makes the
//! lease work for two CLIs on one file. Their times come from this process's clock when the
//! statement runs, not when it was queued.
//!
//! A run's writes carry its lease ([`Fence`]): each is made only if that lease is still the
//! deployment's. A record's put, its removal and a run's end check it inside their one
//! statement (`… WHERE EXISTS (SELECT 1 FROM leases …)`), so alone they still take the
//! single-statement path, and a chain of fenced writes costs one autocommit each; other
//! fenced writes check it first in their transaction. A refused one fails alone with
//! [`Error::LeaseLost`] and writes nothing.
//!
//! A write that is wrong on its own (finishing an unknown run) fails alone without touching
//! the database. A database failure fails the whole batch: it is rolled back and every waiter
//! gets the same error.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use lyra_core::state::RunId;
use sqlx::error::ErrorKind as DbErrorKind;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::oneshot;

use crate::error::Error;
use crate::rows::{LeaseRow, ResourceRow, RunEndRow, RunRow, lease_columns, now_ms};
use crate::store::Fence;

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 1024;

/// One write.
pub(crate) enum Op {
    BeginRun(RunRow),
    Put(ResourceRow),
    Remove {
        deployment: String,
        step_id: String,
    },
    FinishRun(RunEndRow),
    /// Takes the lease if free, expired or ours (same token); `since`/`expires` are ignored
    /// and set from the clock when the statement runs.
    AcquireLease {
        lease: LeaseRow,
        ttl_ms: i64,
    },
    RenewLease {
        deployment: String,
        token: String,
        ttl_ms: i64,
    },
    ReleaseLease {
        deployment: String,
        token: String,
    },
    BreakLease {
        deployment: String,
    },
    Import(Box<ImportRows>),
    Drop {
        deployment: String,
    },
}

/// An exported deployment, encoded for [`Op::Import`].
pub(crate) struct ImportRows {
    pub deployment: String,
    pub workflow: Option<String>,
    pub resources: Vec<ResourceRow>,
    /// Oldest first.
    pub runs: Vec<RunRow>,
}

impl Op {
    /// Whether the write is one statement, so that alone it can run as its own autocommit
    /// transaction.
    fn is_single_statement(&self) -> bool {
        match self {
            Op::Put(_)
            | Op::Remove { .. }
            | Op::FinishRun(_)
            | Op::RenewLease { .. }
            | Op::ReleaseLease { .. }
            | Op::BreakLease { .. } => true,
            // The acquire's upsert and its read of the holder must see one state.
            Op::BeginRun(_) | Op::AcquireLease { .. } | Op::Import(_) | Op::Drop { .. } => false,
        }
    }

    /// Whether the write checks its lease in its own statement (see [`apply`]).
    fn checks_fence(&self) -> bool {
        matches!(self, Op::Put(_) | Op::Remove { .. } | Op::FinishRun(_))
    }
}

/// What a write produced.
#[derive(Debug)]
pub(crate) enum Done {
    Unit,
    Run(RunId),
    /// `acquired` tells whether the caller holds `lease` now, or someone else does.
    Grant {
        acquired: bool,
        lease: LeaseRow,
    },
    Lease(Option<LeaseRow>),
    Existed(bool),
}

type Reply = Result<Done, Arc<Error>>;

struct Job {
    op: Op,
    /// The lease the write is made under, if any.
    fence: Option<Fence>,
    reply: oneshot::Sender<Reply>,
}

/// The shared write connection and its queue.
pub(crate) struct Writer {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<Queue>,
    /// The connection: whoever holds it commits. `None` once closed.
    task: Arc<tokio::sync::Mutex<Option<Task>>>,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// Someone is committing what is queued: a caller, or a drainer task it handed over to.
    /// Never set with the queue left empty for good: whoever clears it has seen it empty.
    leading: bool,
    closed: bool,
}

impl Inner {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next batch, or `None` (and no longer leading) when nothing is queued.
    fn next_batch(&self) -> Option<Vec<Job>> {
        let mut q = self.queue();
        if q.jobs.is_empty() {
            q.leading = false;
            return None;
        }
        let n = q.jobs.len().min(MAX_BATCH);
        Some(q.jobs.drain(..n).collect())
    }

    /// Commits `jobs`: here when `inline` (the caller's own job alone, or a drainer task),
    /// else in a task of their own, so that the caller giving up (its future dropped) cannot
    /// cut other callers' batch short.
    async fn commit(self: &Arc<Self>, jobs: Vec<Job>, inline: bool) {
        let mut task = Arc::clone(&self.task).lock_owned().await;
        if inline {
            if let Some(task) = task.as_mut() {
                task.commit(jobs).await;
            }
            return;
        }
        let batch = tokio::spawn(async move {
            // Closed meanwhile: the jobs are dropped, and their callers told so.
            if let Some(task) = task.as_mut() {
                task.commit(jobs).await;
            }
        });
        let _ = batch.await;
    }

    /// Commits until nothing is queued (a drainer task's whole life).
    async fn drain(self: Arc<Self>) {
        let mut lead = Lead::new(&self);
        while let Some(jobs) = self.next_batch() {
            self.commit(jobs, true).await;
        }
        lead.done();
    }

    /// Stops leading if nothing is queued; otherwise whoever asks keeps leading.
    fn stop_if_idle(&self) -> bool {
        let mut q = self.queue();
        if q.jobs.is_empty() {
            q.leading = false;
        }
        !q.leading
    }
}

/// Held while leading: if the leader goes before it is [`Lead::done`] (it handed over, or its
/// future was dropped), a drainer task takes over, so queued writes never lack a leader.
struct Lead {
    inner: Arc<Inner>,
    done: bool,
}

impl Lead {
    fn new(inner: &Arc<Inner>) -> Lead {
        Lead {
            inner: Arc::clone(inner),
            done: false,
        }
    }

    /// Nothing is left to lead (and `leading` was cleared).
    fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(Arc::clone(&self.inner).drain());
            }
            // No runtime left to drain on: the next caller leads.
            Err(_) => self.inner.queue().leading = false,
        }
    }
}

impl Writer {
    pub fn new(conn: SqliteConnection) -> Writer {
        Writer {
            inner: Arc::new(Inner {
                queue: Mutex::default(),
                task: Arc::new(tokio::sync::Mutex::new(Some(Task {
                    conn,
                    known: HashSet::new(),
                }))),
            }),
        }
    }

    /// Queues `op` and waits until it is committed.
    pub async fn submit(&self, op: Op) -> Result<Done, Error> {
        self.submit_fenced(op, None).await
    }

    /// Queues `op`, to be written only while `fence` is the deployment's lease, and waits
    /// until it is committed (or refused).
    pub async fn submit_fenced(&self, op: Op, fence: Option<Fence>) -> Result<Done, Error> {
        let (reply, mut answer) = oneshot::channel();
        let lead = {
            let mut q = self.inner.queue();
            if q.closed {
                return Err(Error::Closed);
            }
            q.jobs.push(Job { op, fence, reply });
            !std::mem::replace(&mut q.leading, true)
        };
        let mut answered = None;
        if lead {
            let mut guard = Lead::new(&self.inner);
            // Nobody was leading, so the queue held nothing before this job: a first batch of
            // one is this caller's own.
            let mut first = true;
            // Until answered: then whatever else is queued is left to a drainer task (the
            // guard's drop), and this caller goes on with its own work.
            loop {
                match answer.try_recv() {
                    Err(oneshot::error::TryRecvError::Empty) => {}
                    got => {
                        answered = Some(got.map_err(|_| ()));
                        break;
                    }
                }
                let Some(jobs) = self.inner.next_batch() else {
                    // Taken by `close`, which answers it.
                    guard.done();
                    break;
                };
                let own = first && jobs.len() == 1;
                first = false;
                self.inner.commit(jobs, own).await;
            }
            if self.inner.stop_if_idle() {
                guard.done();
            }
        }
        let answered = match answered {
            Some(got) => got,
            None => (&mut answer).await.map_err(|_| ()),
        };
        match answered {
            Ok(Ok(value)) => Ok(value),
            // Sole owner: the error was this write's own; otherwise the batch shares it.
            Ok(Err(e)) => Err(Arc::try_unwrap(e).unwrap_or_else(Error::Batch)),
            // Dropped unanswered: the store closed first.
            Err(_) => Err(Error::Closed),
        }
    }

    /// Stops accepting writes, commits the queued ones and closes the connection.
    pub async fn close(&self) -> Result<(), Error> {
        let mut left = {
            let mut q = self.inner.queue();
            q.closed = true;
            std::mem::take(&mut q.jobs)
        };
        // Waits for a batch being committed.
        let Some(mut task) = self.inner.task.lock().await.take() else {
            return Ok(());
        };
        // Queued by callers that gave up waiting: still committed, as they would have been.
        while !left.is_empty() {
            let rest = left.split_off(left.len().min(MAX_BATCH));
            task.commit(left).await;
            left = rest;
        }
        task.conn.close().await.map_err(Error::Sqlx)
    }
}

/// The leader's state: the connection, and the deployments known to exist.
struct Task {
    conn: SqliteConnection,
    /// Deployments seen committed, so puts into them need not make sure they exist again: a
    /// lone put is then a single autocommit statement. Another process may drop one
    /// meanwhile; the put then fails its foreign key, and the batch is retried without
    /// trusting this cache.
    known: HashSet<String>,
}

impl Task {
    /// Writes and commits `jobs`, and answers each.
    async fn commit(&mut self, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        let mut written = self.write_batch(&jobs).await;
        if matches!(&written, Err(e) if is_foreign_key_violation(e)) && !self.known.is_empty() {
            self.known.clear();
            written = self.write_batch(&jobs).await;
        }
        match written {
            Ok(results) => {
                for (job, result) in jobs.into_iter().zip(results) {
                    // A waiter that gave up is fine: its write is committed anyway.
                    let _ = job.reply.send(result.map_err(Arc::new));
                }
            }
            Err(e) => {
                let e = Arc::new(Error::Sqlx(e));
                for job in jobs {
                    let _ = job.reply.send(Err(Arc::clone(&e)));
                }
            }
        }
    }
}

fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|db| db.kind() == DbErrorKind::ForeignKeyViolation)
}

impl Task {
    /// Writes `jobs` and commits them. The outer error fails the whole batch (rolled back when
    /// the transaction is dropped); the inner ones belong to single jobs.
    async fn write_batch(&mut self, jobs: &[Job]) -> Result<Vec<Result<Done, Error>>, sqlx::Error> {
        // A lone single-statement write is its own transaction: no BEGIN/COMMIT round trips.
        // This is the deep-chain case, where each write waits for the previous one.
        if let [job] = jobs
            && job.op.is_single_statement()
            && (job.fence.is_none() || job.op.checks_fence())
            && !matches!(&job.op, Op::Put(row) if !self.known.contains(&row.deployment))
        {
            return Ok(vec![apply(&mut self.conn, &job.op, job.fence.as_ref()).await?]);
        }

        // IMMEDIATE takes the write lock up front, waiting (busy timeout) for another process
        // rather than failing half-way through the batch.
        let mut tx = self.conn.begin_with("BEGIN IMMEDIATE").await?;
        // Whether each deployment this batch touched exists now, where that differs from
        // what `known` says.
        let mut exists: HashMap<&str, bool> = HashMap::new();
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            // A put into a deployment not known to exist makes it first, which a refused put
            // must not do either: its lease is checked before.
            let makes_deployment = match &job.op {
                Op::Put(row) => !exists
                    .get(row.deployment.as_str())
                    .copied()
                    .unwrap_or_else(|| self.known.contains(&row.deployment)),
                _ => false,
            };
            if let Some(fence) = &job.fence
                && (!job.op.checks_fence() || makes_deployment)
                && !holds(&mut tx, fence).await?
            {
                results.push(Err(Error::LeaseLost(fence.deployment.clone())));
                continue;
            }
            match &job.op {
                Op::Put(row) => {
                    let deployment = row.deployment.as_str();
                    if makes_deployment {
                        sqlx::query(
                            "INSERT INTO deployments (name, workflow, created_at, updated_at) \
                             VALUES (?1, NULL, ?2, ?2) ON CONFLICT (name) DO NOTHING",
                        )
                        .bind(deployment)
                        .bind(now_ms())
                        .execute(&mut *tx)
                        .await?;
                        exists.insert(deployment, true);
                    }
                }
                Op::BeginRun(run) => {
                    exists.insert(&run.deployment, true);
                }
                Op::Import(import) => {
                    exists.insert(&import.deployment, true);
                }
                Op::Drop { deployment } => {
                    exists.insert(deployment, false);
                }
                _ => {}
            }
            results.push(apply(&mut tx, &job.op, job.fence.as_ref()).await?);
        }
        tx.commit().await?;

        // Only now, committed, is this what exists.
        for (deployment, present) in exists {
            if present {
                if !self.known.contains(deployment) {
                    self.known.insert(deployment.to_owned());
                }
            } else {
                self.known.remove(deployment);
            }
        }
        Ok(results)
    }
}

/// Whether `fence` is the deployment's lease now. Expiry is not checked: an expired lease
/// nobody took yet is still the holder's (its renewal would succeed), and whoever takes it
/// replaces the token under the same write lock.
async fn holds(conn: &mut SqliteConnection, fence: &Fence) -> Result<bool, sqlx::Error> {
    let held: Option<i64> = sqlx::query_scalar("SELECT 1 FROM leases WHERE deployment = ?1 AND token = ?2")
        .bind(&fence.deployment)
        .bind(&fence.token)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(held.is_some())
}

/// The lease condition of a write made in one statement: no token (`NULL`), or the
/// deployment's lease still has it.
macro_rules! fenced {
    ($deployment:literal, $token:literal) => {
        concat!(
            "(",
            $token,
            " IS NULL OR EXISTS (SELECT 1 FROM leases WHERE deployment = ",
            $deployment,
            " AND token = ",
            $token,
            "))"
        )
    };
}

/// An upsert that writes nothing unless the lease in `?13` (if any) is still the
/// deployment's. (`INSERT … SELECT` needs its `WHERE` before `ON CONFLICT` anyway.)
const PUT_RESOURCE: &str = concat!(
    "INSERT INTO resources (deployment, step_id, type_name, external_id, desired, actual, depends_on, \
                            managed, pending, sensitive, updated_at, create_key) \
     SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12 WHERE ",
    fenced!("?1", "?13"),
    " ON CONFLICT (deployment, step_id) DO UPDATE SET \
         type_name = excluded.type_name, external_id = excluded.external_id, \
         desired = excluded.desired, actual = excluded.actual, \
         depends_on = excluded.depends_on, managed = excluded.managed, \
         pending = excluded.pending, sensitive = excluded.sensitive, updated_at = excluded.updated_at, \
         create_key = excluded.create_key"
);

/// Writes `row`, if `token` (when given) is still its deployment's lease: whether it did.
async fn put(conn: &mut SqliteConnection, row: &ResourceRow, token: Option<&str>) -> Result<bool, sqlx::Error> {
    let written = sqlx::query(PUT_RESOURCE)
        .bind(&row.deployment)
        .bind(&row.step_id)
        .bind(&row.type_name)
        .bind(&row.external_id)
        .bind(&row.desired)
        .bind(&row.actual)
        .bind(&row.depends_on)
        .bind(row.managed)
        .bind(row.pending)
        .bind(&row.sensitive)
        .bind(row.updated_at)
        .bind(&row.create_key)
        .bind(token)
        .execute(&mut *conn)
        .await?;
    Ok(written.rows_affected() > 0)
}

/// Runs a statement returning at most one lease row. `fetch_all` rather than
/// `fetch_optional`: the statement is stepped to its end, so an autocommit write is committed
/// (and its lock released) before this returns.
async fn fetch_lease<'q>(
    conn: &mut SqliteConnection,
    query: sqlx::query::QueryAs<'q, sqlx::Sqlite, LeaseRow, sqlx::sqlite::SqliteArguments>,
) -> Result<Option<LeaseRow>, sqlx::Error> {
    Ok(query.fetch_all(&mut *conn).await?.pop())
}

/// Makes one write. Those that [`Op::checks_fence`] make it only under `fence`; the caller
/// has checked it for the others.
async fn apply(
    conn: &mut SqliteConnection,
    op: &Op,
    fence: Option<&Fence>,
) -> Result<Result<Done, Error>, sqlx::Error> {
    let token = fence.map(|f| f.token.as_str());
    let lost = || {
        Ok(Err(Error::LeaseLost(
            fence.map(|f| f.deployment.clone()).unwrap_or_default(),
        )))
    };
    match op {
        Op::BeginRun(run) => {
            // Only an apply changes which workflow the deployment runs.
            let applied_workflow = if run.operation == "apply" {
                run.workflow.as_deref()
            } else {
                None
            };
            sqlx::query(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (name) DO UPDATE \
                 SET workflow = COALESCE(?4, workflow), updated_at = excluded.updated_at",
            )
            .bind(&run.deployment)
            .bind(&run.workflow)
            .bind(run.started_at)
            .bind(applied_workflow)
            .execute(&mut *conn)
            .await?;
            let inserted = sqlx::query(
                "INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .bind(&run.deployment)
            .bind(&run.workflow)
            .bind(&run.operation)
            .bind(&run.actor)
            .bind(run.started_at)
            .bind(&run.counts)
            .bind(&run.changes)
            .execute(&mut *conn)
            .await?;
            Ok(Ok(Done::Run(inserted.last_insert_rowid())))
        }
        Op::Put(row) => {
            if !put(conn, row, token).await? {
                return lost();
            }
            Ok(Ok(Done::Unit))
        }
        Op::Remove { deployment, step_id } => {
            let removed = sqlx::query(concat!(
                "DELETE FROM resources WHERE deployment = ?1 AND step_id = ?2 AND ",
                fenced!("?1", "?3")
            ))
            .bind(deployment)
            .bind(step_id)
            .bind(token)
            .execute(&mut *conn)
            .await?;
            // Nothing removed: there was nothing to, or the lease is gone. Either way nothing
            // was written; only the answer differs.
            if removed.rows_affected() == 0
                && let Some(fence) = fence
                && !holds(conn, fence).await?
            {
                return lost();
            }
            Ok(Ok(Done::Unit))
        }
        Op::FinishRun(end) => {
            let updated = sqlx::query(concat!(
                "UPDATE runs SET finished_at = ?2, outcome = ?3, counts = ?4, changes = ?5, \
                                 error = ?6, note = ?7, returns = ?8 \
                 WHERE id = ?1 AND finished_at IS NULL AND ",
                fenced!("?9", "?10")
            ))
            .bind(end.id)
            .bind(end.finished_at)
            .bind(end.outcome)
            .bind(&end.counts)
            .bind(&end.changes)
            .bind(&end.error)
            .bind(&end.note)
            .bind(&end.returns)
            .bind(fence.map(|f| f.deployment.as_str()))
            .bind(token)
            .execute(&mut *conn)
            .await?;
            if updated.rows_affected() == 1 {
                return Ok(Ok(Done::Unit));
            }
            if let Some(fence) = fence
                && !holds(conn, fence).await?
            {
                return lost();
            }
            // Nothing was written, so this job fails alone and the batch goes on.
            let exists: Option<i64> = sqlx::query_scalar("SELECT 1 FROM runs WHERE id = ?1")
                .bind(end.id)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(Err(match exists {
                Some(_) => Error::RunAlreadyFinished(end.id),
                None => Error::UnknownRun(end.id),
            }))
        }
        Op::AcquireLease { lease, ttl_ms } => {
            let now = now_ms();
            // Taken when free, expired, or ours already (a renewal keeps `since`).
            let taken = fetch_lease(
                conn,
                sqlx::query_as(concat!(
                    "INSERT INTO leases (deployment, owner, operation, token, since, expires) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                     ON CONFLICT (deployment) DO UPDATE SET \
                         owner = excluded.owner, operation = excluded.operation, \
                         token = excluded.token, expires = excluded.expires, \
                         since = CASE WHEN leases.token = excluded.token \
                                      THEN leases.since ELSE excluded.since END \
                     WHERE leases.token = excluded.token OR leases.expires <= excluded.since \
                     RETURNING ",
                    lease_columns!()
                ))
                .bind(&lease.deployment)
                .bind(&lease.owner)
                .bind(&lease.operation)
                .bind(&lease.token)
                .bind(now)
                .bind(now.saturating_add(*ttl_ms)),
            )
            .await?;
            if let Some(lease) = taken {
                return Ok(Ok(Done::Grant { acquired: true, lease }));
            }
            // Inside this IMMEDIATE transaction, the holder cannot have gone meanwhile.
            let holder: LeaseRow = sqlx::query_as(concat!(
                "SELECT ",
                lease_columns!(),
                " FROM leases WHERE deployment = ?1"
            ))
            .bind(&lease.deployment)
            .fetch_one(&mut *conn)
            .await?;
            Ok(Ok(Done::Grant {
                acquired: false,
                lease: holder,
            }))
        }
        Op::RenewLease {
            deployment,
            token,
            ttl_ms,
        } => {
            let renewed = fetch_lease(
                conn,
                sqlx::query_as(concat!(
                    "UPDATE leases SET expires = ?3 WHERE deployment = ?1 AND token = ?2 RETURNING ",
                    lease_columns!()
                ))
                .bind(deployment)
                .bind(token)
                .bind(now_ms().saturating_add(*ttl_ms)),
            )
            .await?;
            Ok(Ok(Done::Lease(renewed)))
        }
        Op::ReleaseLease { deployment, token } => {
            let released = sqlx::query("DELETE FROM leases WHERE deployment = ?1 AND token = ?2")
                .bind(deployment)
                .bind(token)
                .execute(&mut *conn)
                .await?;
            Ok(Ok(Done::Existed(released.rows_affected() > 0)))
        }
        Op::BreakLease { deployment } => {
            let broken = fetch_lease(
                conn,
                sqlx::query_as(concat!(
                    "DELETE FROM leases WHERE deployment = ?1 RETURNING ",
                    lease_columns!()
                ))
                .bind(deployment),
            )
            .await?;
            Ok(Ok(Done::Lease(broken)))
        }
        Op::Import(import) => {
            let now = now_ms();
            sqlx::query(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, \
                                                  updated_at = excluded.updated_at",
            )
            .bind(&import.deployment)
            .bind(&import.workflow)
            .bind(now)
            .execute(&mut *conn)
            .await?;
            sqlx::query("DELETE FROM resources WHERE deployment = ?1")
                .bind(&import.deployment)
                .execute(&mut *conn)
                .await?;
            for row in &import.resources {
                put(conn, row, None).await?;
            }
            for run in &import.runs {
                sqlx::query(
                    "INSERT INTO runs (deployment, workflow, operation, actor, started_at, finished_at, \
                                       outcome, counts, changes, error, note, returns) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .bind(&run.deployment)
                .bind(&run.workflow)
                .bind(&run.operation)
                .bind(&run.actor)
                .bind(run.started_at)
                .bind(run.finished_at)
                .bind(&run.outcome)
                .bind(&run.counts)
                .bind(&run.changes)
                .bind(&run.error)
                .bind(&run.note)
                .bind(&run.returns)
                .execute(&mut *conn)
                .await?;
            }
            Ok(Ok(Done::Unit))
        }
        Op::Drop { deployment } => {
            sqlx::query("DELETE FROM leases WHERE deployment = ?1")
                .bind(deployment)
                .execute(&mut *conn)
                .await?;
            sqlx::query("DELETE FROM runs WHERE deployment = ?1")
                .bind(deployment)
                .execute(&mut *conn)
                .await?;
            // Resources go with it (ON DELETE CASCADE).
            let dropped = sqlx::query("DELETE FROM deployments WHERE name = ?1")
                .bind(deployment)
                .execute(&mut *conn)
                .await?;
            Ok(Ok(Done::Existed(dropped.rows_affected() > 0)))
        }
    }
}

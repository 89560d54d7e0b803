//! Group commit: the callers share the write connection, and one committer at a time commits
//! what is queued, on the caller's thread while writes come one by one, and on a second thread
//! once they come in crowds.
//!
//! The engine records each step's outcome and waits for it before starting the step's
//! dependents, often from many steps at once. A commit per call would serialise all of them
//! behind the disk; instead every call queues its write and waits for its answer. A caller
//! that finds nobody committing leads: it lets the callers that are ready at the same moment
//! queue theirs (one yield to the scheduler), then commits the whole queue itself, on its own
//! thread, as plain synchronous SQLite calls: no hand-off to a worker thread and back, which
//! was most of the cost of a commit when a driver thread ran the statements. Once answered it
//! leaves whatever queued meanwhile (from other threads) to a drainer task, which commits
//! batch after batch until the queue is empty. Each batch is one `BEGIN IMMEDIATE`
//! transaction, and its waiters are answered only after the commit, so every write is durable
//! when its call returns. A batch of one single-statement write skips `BEGIN`/`COMMIT` and
//! runs as its own autocommit transaction: in a deep chain of dependent steps that is every
//! write.
//!
//! When [`OFFLOAD_AT`] writes are queued at once (many independent steps finishing together),
//! committing on the caller's thread would hold up the work that produces the rest: on the
//! CLI's one runtime thread the engine and the disk took turns. The write that fills the queue
//! that far hands it to a blocking thread instead, which commits batch after batch while the
//! caller's thread goes on, and goes once the queue stays empty (after a crowd's batch it
//! waits [`LINGER`] for the next crowd). Whoever commits takes each batch while
//! holding the connection, so batches commit in the order they were queued, whoever commits
//! them.
//!
//! The inline commit never waits for a lock: the connection's busy handler is off for it. If
//! another process holds the database's write lock, the batch is committed again on a
//! blocking thread that waits for the lock (up to the busy timeout), so a runtime thread is
//! never parked on another process. A statement that met a busy database wrote nothing, so
//! doing it again is safe.
//!
//! A leader's future may be dropped (its caller gave up) while it yields: a leader that goes
//! before the queue is empty hands it to a drainer task (the [`Lead`] guard), so queued
//! writes never lack someone to commit them. A commit that has begun always ends: it is
//! synchronous, or runs on a blocking thread that nothing cancels.
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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

use lyra_core::state::RunId;
use rusqlite::{Connection, TransactionBehavior, params};
use tokio::sync::oneshot;

use crate::error::Error;
use crate::rows::{LeaseRow, ResourceRow, RunEndRow, RunRow, lease_columns, now_ms};
use crate::store::Fence;

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 1024;

/// Queued writes that make the queue's committing move to a blocking thread. Below it a
/// hand-off costs more than it frees; a deep chain queues one write at a time and never
/// reaches it.
pub(crate) const OFFLOAD_AT: usize = 64;

/// A batch this big is part of a crowd: the offloaded committer waits for the next one.
const LINGER_AFTER: usize = OFFLOAD_AT / 4;

/// How long the offloaded committer waits for more writes after a crowd's batch.
const LINGER: Duration = Duration::from_millis(2);

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
        /// Only while this process holds it (the end of its token).
        held_by: Option<String>,
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

/// A write's outcome, and the write itself: its caller drops that, on the thread that made
/// it. Freed on the committing thread instead, each write's memory went back to the other
/// thread's allocator, and the caller's thread, finding none of its own, allocated slowly.
struct Reply {
    result: Result<Done, Arc<Error>>,
    _spent: (Op, Option<Fence>),
}

struct Job {
    op: Op,
    /// The lease the write is made under, if any.
    fence: Option<Fence>,
    reply: oneshot::Sender<Reply>,
}

impl Job {
    fn answer(self, result: Result<Done, Arc<Error>>) {
        let Job { op, fence, reply } = self;
        // A waiter that gave up is fine: its write is committed (or refused) anyway.
        let _ = reply.send(Reply {
            result,
            _spent: (op, fence),
        });
    }
}

/// The shared write connection and its queue.
pub(crate) struct Writer {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Mutex<Queue>,
    /// Wakes the offloaded committer waiting for writes ([`Queue::parked`]).
    wake: Condvar,
    /// The connection: whoever holds it commits. `None` once closed.
    task: Mutex<Option<Task>>,
    /// Batches committed by a blocking thread the queue was handed to (tests check there
    /// were some).
    #[cfg(test)]
    offloaded: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// Who commits what is queued. Never left set with the queue empty for good: whoever
    /// clears it has seen it empty.
    committer: Committer,
    /// The offloaded committer waits for writes: the next one wakes it.
    parked: bool,
    closed: bool,
}

/// Who commits the queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Committer {
    /// Nobody: the next write leads.
    #[default]
    None,
    /// A caller on a runtime thread, or a drainer task it handed over to.
    Inline,
    /// A blocking thread, until the queue is empty.
    Offloaded,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    /// The next batch for `who`, taken while holding the connection (so batches commit in
    /// queue order); `None` once `who` no longer commits: the queue is empty (and nobody
    /// commits now) or someone else took over.
    fn next_batch(&self, who: Committer) -> Option<Vec<Job>> {
        let mut q = self.queue();
        if q.committer != who {
            return None;
        }
        if q.jobs.is_empty() {
            q.committer = Committer::None;
            return None;
        }
        let n = q.jobs.len().min(MAX_BATCH);
        Some(q.jobs.drain(..n).collect())
    }

    /// Commits the next inline batch: here, on this thread, unless that would wait (another
    /// process holds the write lock, or a blocking thread holds the connection); then on a
    /// blocking thread, which waits as long as the busy timeout allows. Whether to go on.
    async fn commit_next(self: &Arc<Self>) -> bool {
        match self.commit_here() {
            Here::Done(more) => more,
            Here::MustWait => {
                let inner = Arc::clone(self);
                let waited = tokio::task::spawn_blocking(move || inner.commit_waiting(Committer::Inline).is_some());
                // A caller that gives up leaves the commit running; it answers its waiters
                // itself. A blocking thread that never ran (the runtime is going) took nothing.
                waited.await.unwrap_or(false)
            }
        }
    }

    /// The inline half of [`Inner::commit_next`].
    fn commit_here(&self) -> Here {
        let mut task = match self.task.try_lock() {
            Ok(task) => task,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            // Handed to a blocking thread (which holds the connection): nothing to wait for.
            Err(TryLockError::WouldBlock) if self.queue().committer != Committer::Inline => {
                return Here::Done(false);
            }
            Err(TryLockError::WouldBlock) => return Here::MustWait,
        };
        let Some(jobs) = self.next_batch(Committer::Inline) else {
            return Here::Done(false);
        };
        // Closed meanwhile: the jobs are dropped, and their callers told so.
        let Some(task) = task.as_mut() else {
            return Here::Done(true);
        };
        match task.commit(jobs, Wait::No) {
            None => Here::Done(true),
            Some(busy) => {
                // Back to the front, to be taken again by the thread that may wait.
                self.queue().jobs.splice(0..0, busy);
                Here::MustWait
            }
        }
    }

    /// Commits the next batch of `who`, waiting for the connection and for the write lock
    /// (on a blocking thread): how many writes it had, or `None` if `who` is done.
    fn commit_waiting(&self, who: Committer) -> Option<usize> {
        let mut task = lock(&self.task);
        let jobs = self.next_batch(who)?;
        let n = jobs.len();
        if let Some(task) = task.as_mut() {
            task.commit(jobs, Wait::Yes);
        }
        Some(n)
    }

    /// Commits until nothing is queued (a drainer task's whole life).
    async fn drain(self: Arc<Self>) {
        let mut lead = Lead::new(&self);
        while self.commit_next().await {}
        lead.done();
    }

    /// A blocking thread's whole life once the queue is handed to it (see [`OFFLOAD_AT`]).
    /// After a batch of a crowd's size it waits a little for the next writes, which come in
    /// crowds too while the caller's thread finishes steps; had it gone, the first of them
    /// would lead inline and commit the rest on the caller's thread. After a smaller batch
    /// it goes once the queue is empty: single writes (a chain) commit best inline.
    fn offloaded(&self) {
        let mut guard = Offload {
            inner: self,
            unwinding: true,
        };
        let mut linger = true;
        while self.wait_for_writes(linger) {
            match self.commit_waiting(Committer::Offloaded) {
                Some(n) => {
                    #[cfg(test)]
                    self.offloaded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    linger = n >= LINGER_AFTER;
                }
                None => break,
            }
        }
        guard.unwinding = false;
    }

    /// Whether there are writes to commit: at once, or, if `linger`, within [`LINGER`]. If
    /// not, the offloaded committer is done (and nobody commits now).
    fn wait_for_writes(&self, linger: bool) -> bool {
        let mut q = self.queue();
        if q.jobs.is_empty() && linger && !q.closed {
            q.parked = true;
            q = self
                .wake
                .wait_timeout_while(q, LINGER, |q| q.jobs.is_empty() && !q.closed)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            q.parked = false;
        }
        if q.jobs.is_empty() {
            q.committer = Committer::None;
            return false;
        }
        true
    }

    /// Stops leading inline if nothing is queued (or another committer took over); otherwise
    /// whoever asks keeps leading.
    fn stop_if_idle(&self) -> bool {
        let mut q = self.queue();
        match q.committer {
            Committer::Inline if q.jobs.is_empty() => {
                q.committer = Committer::None;
                true
            }
            Committer::Inline => false,
            Committer::None | Committer::Offloaded => true,
        }
    }
}

/// What [`Inner::commit_here`] did.
enum Here {
    /// Committed a batch (`true`), or found nothing more to commit (`false`).
    Done(bool),
    /// The batch, if any, is still queued: it needs a thread that may wait.
    MustWait,
}

/// Held by the offloaded committer: should it unwind, the writes it left queued fail (their
/// callers are told the store closed) rather than wait for a committer that is gone.
struct Offload<'a> {
    inner: &'a Inner,
    unwinding: bool,
}

impl Drop for Offload<'_> {
    fn drop(&mut self) {
        if !self.unwinding {
            return;
        }
        // Still the committer: only this thread moves the queue on from `Offloaded`.
        let left = {
            let mut q = self.inner.queue();
            q.committer = Committer::None;
            std::mem::take(&mut q.jobs)
        };
        drop(left);
    }
}

/// Held while leading inline: if the leader goes before it is [`Lead::done`] (it handed
/// over, or its future was dropped), a drainer task takes over, so queued writes never lack
/// a leader.
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

    /// Nothing is left to lead (and the committer was cleared or taken over).
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
            Err(_) => {
                let mut q = self.inner.queue();
                if q.committer == Committer::Inline {
                    q.committer = Committer::None;
                }
            }
        }
    }
}

impl Writer {
    pub fn new(conn: Connection, busy_timeout: Duration) -> Writer {
        Writer {
            inner: Arc::new(Inner {
                queue: Mutex::default(),
                wake: Condvar::new(),
                task: Mutex::new(Some(Task {
                    conn,
                    busy_timeout,
                    waits: true,
                    known: HashSet::new(),
                })),
                #[cfg(test)]
                offloaded: std::sync::atomic::AtomicUsize::new(0),
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
        let (lead, offload) = {
            let mut q = self.inner.queue();
            if q.closed {
                return Err(Error::Closed);
            }
            q.jobs.push(Job { op, fence, reply });
            match q.committer {
                Committer::None => {
                    q.committer = Committer::Inline;
                    (true, false)
                }
                Committer::Inline if q.jobs.len() >= OFFLOAD_AT => {
                    q.committer = Committer::Offloaded;
                    (false, true)
                }
                Committer::Offloaded if q.parked => {
                    q.parked = false;
                    self.inner.wake.notify_one();
                    (false, false)
                }
                Committer::Inline | Committer::Offloaded => (false, false),
            }
        };
        if offload {
            let inner = Arc::clone(&self.inner);
            // Not awaited: it answers its waiters itself, this one among them.
            drop(tokio::task::spawn_blocking(move || inner.offloaded()));
        }
        let mut answered = None;
        if lead {
            let mut guard = Lead::new(&self.inner);
            // Whoever else is ready to write now (the engine's other steps, polled in the
            // same pass) queues behind this job and shares its commit.
            tokio::task::yield_now().await;
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
                if !self.inner.commit_next().await {
                    // Nothing left to lead: it was taken by `close` (which answers it) or by
                    // the offloaded committer (which will).
                    break;
                }
            }
            if self.inner.stop_if_idle() {
                guard.done();
            }
        }
        let answered = match answered {
            Some(got) => got,
            None => (&mut answer).await.map_err(|_| ()),
        };
        match answered.map(|reply| reply.result) {
            Ok(Ok(value)) => Ok(value),
            // Sole owner: the error was this write's own; otherwise the batch shares it.
            Ok(Err(e)) => Err(Arc::try_unwrap(e).unwrap_or_else(Error::Batch)),
            // Dropped unanswered: the store closed first.
            Err(_) => Err(Error::Closed),
        }
    }

    /// How many batches a blocking thread committed, having been handed the queue.
    #[cfg(test)]
    pub fn offloaded_batches(&self) -> usize {
        self.inner.offloaded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `f` on the write connection (tests look at its settings).
    #[cfg(test)]
    pub fn with_connection<T>(&self, f: impl FnOnce(&Connection) -> T) -> Option<T> {
        lock(&self.inner.task).as_ref().map(|task| f(&task.conn))
    }

    /// Stops accepting writes, commits the queued ones and closes the connection.
    pub async fn close(&self) -> Result<(), Error> {
        self.inner.queue().closed = true;
        // A committer waiting for writes goes now.
        self.inner.wake.notify_all();
        let inner = Arc::clone(&self.inner);
        // On a blocking thread: it waits for a batch being committed, and closing checkpoints
        // the WAL into the database.
        tokio::task::spawn_blocking(move || {
            let mut held = lock(&inner.task);
            let Some(mut task) = held.take() else {
                return Ok(());
            };
            // Queued by callers that gave up waiting: still committed, as they would have
            // been. Taken while holding the connection, as every batch is.
            let mut left = std::mem::take(&mut inner.queue().jobs);
            drop(held);
            while !left.is_empty() {
                let rest = left.split_off(left.len().min(MAX_BATCH));
                task.commit(left, Wait::Yes);
                left = rest;
            }
            task.conn.close().map_err(|(_, e)| Error::Sqlite(e))
        })
        .await
        .map_err(|_| Error::Closed)?
    }
}

/// Whether a commit may wait for another process's write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Busy: give the batch back untouched.
    No,
    /// Up to the busy timeout.
    Yes,
}

/// The leader's state: the connection, and the deployments known to exist.
struct Task {
    conn: Connection,
    busy_timeout: Duration,
    /// Whether the connection's busy handler is on now.
    waits: bool,
    /// Deployments seen committed, so puts into them need not make sure they exist again: a
    /// lone put is then a single autocommit statement. Another process may drop one
    /// meanwhile; the put then fails its foreign key, and the batch is retried without
    /// trusting this cache.
    known: HashSet<String>,
}

impl Task {
    /// Writes and commits `jobs`, and answers each; or, when `wait` is [`Wait::No`] and the
    /// database is busy, gives them back unanswered and unwritten.
    fn commit(&mut self, jobs: Vec<Job>, wait: Wait) -> Option<Vec<Job>> {
        if jobs.is_empty() {
            return None;
        }
        let waits = wait == Wait::Yes;
        if self.waits != waits {
            let timeout = if waits { self.busy_timeout } else { Duration::ZERO };
            if let Err(e) = self.conn.busy_timeout(timeout) {
                answer_all(jobs, e);
                return None;
            }
            self.waits = waits;
        }
        let mut written = self.write_batch(&jobs);
        if matches!(&written, Err(e) if is_foreign_key_violation(e)) && !self.known.is_empty() {
            self.known.clear();
            written = self.write_batch(&jobs);
        }
        match written {
            Err(e) if !waits && is_busy(&e) => Some(jobs),
            Ok(results) => {
                for (job, result) in jobs.into_iter().zip(results) {
                    job.answer(result.map_err(Arc::new));
                }
                None
            }
            Err(e) => {
                answer_all(jobs, e);
                None
            }
        }
    }
}

/// Fails every job of a batch with the one error.
fn answer_all(jobs: Vec<Job>, e: rusqlite::Error) {
    let e = Arc::new(Error::Sqlite(e));
    for job in jobs {
        job.answer(Err(Arc::clone(&e)));
    }
}

fn is_foreign_key_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY)
}

/// `SQLITE_BUSY` in any of its forms: another connection holds the lock; nothing was written.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
}

impl Task {
    /// Writes `jobs` and commits them. The outer error fails the whole batch (rolled back when
    /// the transaction is dropped); the inner ones belong to single jobs.
    fn write_batch(&mut self, jobs: &[Job]) -> Result<Vec<Result<Done, Error>>, rusqlite::Error> {
        // A lone single-statement write is its own transaction: no BEGIN/COMMIT.
        // This is the deep-chain case, where each write waits for the previous one.
        if let [job] = jobs
            && job.op.is_single_statement()
            && (job.fence.is_none() || job.op.checks_fence())
            && !matches!(&job.op, Op::Put(row) if !self.known.contains(&row.deployment))
        {
            return Ok(vec![apply(&self.conn, &job.op, job.fence.as_ref())?]);
        }

        // IMMEDIATE takes the write lock up front (or meets a busy database before writing
        // anything), rather than failing half-way through the batch.
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
                && !holds(&tx, fence)?
            {
                results.push(Err(Error::LeaseLost(fence.deployment.clone())));
                continue;
            }
            match &job.op {
                Op::Put(row) => {
                    let deployment = row.deployment.as_str();
                    if makes_deployment {
                        tx.prepare_cached(
                            "INSERT INTO deployments (name, workflow, created_at, updated_at) \
                             VALUES (?1, NULL, ?2, ?2) ON CONFLICT (name) DO NOTHING",
                        )?
                        .execute(params![deployment, now_ms()])?;
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
            results.push(apply(&tx, &job.op, job.fence.as_ref())?);
        }
        tx.commit()?;

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
fn holds(conn: &Connection, fence: &Fence) -> Result<bool, rusqlite::Error> {
    conn.prepare_cached("SELECT 1 FROM leases WHERE deployment = ?1 AND token = ?2")?
        .exists(params![fence.deployment, fence.token])
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
fn put(conn: &Connection, row: &ResourceRow, token: Option<&str>) -> Result<bool, rusqlite::Error> {
    let written = conn.prepare_cached(PUT_RESOURCE)?.execute(params![
        row.deployment,
        row.step_id,
        row.type_name,
        row.external_id,
        row.desired,
        row.actual,
        row.depends_on,
        row.managed,
        row.pending,
        row.sensitive,
        row.updated_at,
        row.create_key,
        token,
    ])?;
    Ok(written > 0)
}

/// Runs a statement returning at most one lease row, stepped to its end, so an autocommit
/// write is committed (and its lock released) before this returns.
fn fetch_lease(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Option<LeaseRow>, rusqlite::Error> {
    let mut statement = conn.prepare_cached(sql)?;
    let mut rows = statement.query_map(params, lease_row)?;
    let first = rows.next().transpose()?;
    // Drives the statement to completion (RETURNING rows come out one at a time).
    for row in rows {
        row?;
    }
    Ok(first)
}

/// A [`LeaseRow`] from the columns of [`lease_columns!`], in order.
pub(super) fn lease_row(row: &rusqlite::Row<'_>) -> Result<LeaseRow, rusqlite::Error> {
    Ok(LeaseRow {
        deployment: row.get(0)?,
        owner: row.get(1)?,
        operation: row.get(2)?,
        token: row.get(3)?,
        since: row.get(4)?,
        expires: row.get(5)?,
    })
}

/// Makes one write. Those that [`Op::checks_fence`] make it only under `fence`; the caller
/// has checked it for the others.
fn apply(conn: &Connection, op: &Op, fence: Option<&Fence>) -> Result<Result<Done, Error>, rusqlite::Error> {
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
            conn.prepare_cached(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (name) DO UPDATE \
                 SET workflow = COALESCE(?4, workflow), updated_at = excluded.updated_at",
            )?
            .execute(params![run.deployment, run.workflow, run.started_at, applied_workflow])?;
            conn.prepare_cached(
                "INSERT INTO runs (deployment, workflow, operation, actor, started_at, counts, changes) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                run.deployment,
                run.workflow,
                run.operation,
                run.actor,
                run.started_at,
                run.counts,
                run.changes
            ])?;
            Ok(Ok(Done::Run(conn.last_insert_rowid())))
        }
        Op::Put(row) => {
            if !put(conn, row, token)? {
                return lost();
            }
            Ok(Ok(Done::Unit))
        }
        Op::Remove { deployment, step_id } => {
            let removed = conn
                .prepare_cached(concat!(
                    "DELETE FROM resources WHERE deployment = ?1 AND step_id = ?2 AND ",
                    fenced!("?1", "?3")
                ))?
                .execute(params![deployment, step_id, token])?;
            // Nothing removed: there was nothing to, or the lease is gone. Either way nothing
            // was written; only the answer differs.
            if removed == 0
                && let Some(fence) = fence
                && !holds(conn, fence)?
            {
                return lost();
            }
            Ok(Ok(Done::Unit))
        }
        Op::FinishRun(end) => {
            let updated = conn
                .prepare_cached(concat!(
                    "UPDATE runs SET finished_at = ?2, outcome = ?3, counts = ?4, changes = ?5, \
                                     error = ?6, note = ?7, returns = ?8 \
                     WHERE id = ?1 AND finished_at IS NULL AND ",
                    fenced!("?9", "?10")
                ))?
                .execute(params![
                    end.id,
                    end.finished_at,
                    end.outcome,
                    end.counts,
                    end.changes,
                    end.error,
                    end.note,
                    end.returns,
                    fence.map(|f| f.deployment.as_str()),
                    token
                ])?;
            if updated == 1 {
                return Ok(Ok(Done::Unit));
            }
            if let Some(fence) = fence
                && !holds(conn, fence)?
            {
                return lost();
            }
            // Nothing was written, so this job fails alone and the batch goes on.
            let exists = conn
                .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")?
                .exists(params![end.id])?;
            Ok(Err(if exists {
                Error::RunAlreadyFinished(end.id)
            } else {
                Error::UnknownRun(end.id)
            }))
        }
        Op::AcquireLease { lease, ttl_ms } => {
            let now = now_ms();
            // Taken when free, expired, or ours already (a renewal keeps `since`).
            let taken = fetch_lease(
                conn,
                concat!(
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
                ),
                params![
                    lease.deployment,
                    lease.owner,
                    lease.operation,
                    lease.token,
                    now,
                    now.saturating_add(*ttl_ms)
                ],
            )?;
            if let Some(lease) = taken {
                return Ok(Ok(Done::Grant { acquired: true, lease }));
            }
            // Inside this IMMEDIATE transaction, the holder cannot have gone meanwhile.
            let holder = conn
                .prepare_cached(concat!(
                    "SELECT ",
                    lease_columns!(),
                    " FROM leases WHERE deployment = ?1"
                ))?
                .query_row(params![lease.deployment], lease_row)?;
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
                concat!(
                    "UPDATE leases SET expires = ?3 WHERE deployment = ?1 AND token = ?2 RETURNING ",
                    lease_columns!()
                ),
                params![deployment, token, now_ms().saturating_add(*ttl_ms)],
            )?;
            Ok(Ok(Done::Lease(renewed)))
        }
        Op::ReleaseLease { deployment, token } => {
            let released = conn
                .prepare_cached("DELETE FROM leases WHERE deployment = ?1 AND token = ?2")?
                .execute(params![deployment, token])?;
            Ok(Ok(Done::Existed(released > 0)))
        }
        Op::BreakLease { deployment, held_by } => {
            // A negative start counts from the end: the token's last `length(?2)` characters.
            let broken = fetch_lease(
                conn,
                concat!(
                    "DELETE FROM leases WHERE deployment = ?1 \
                     AND (?2 IS NULL OR substr(token, -length(?2)) = ?2) RETURNING ",
                    lease_columns!()
                ),
                params![deployment, held_by],
            )?;
            Ok(Ok(Done::Lease(broken)))
        }
        Op::Import(import) => {
            let now = now_ms();
            conn.prepare_cached(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) VALUES (?1, ?2, ?3, ?3) \
                 ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, \
                                                  updated_at = excluded.updated_at",
            )?
            .execute(params![import.deployment, import.workflow, now])?;
            conn.prepare_cached("DELETE FROM resources WHERE deployment = ?1")?
                .execute(params![import.deployment])?;
            for row in &import.resources {
                put(conn, row, None)?;
            }
            let mut insert = conn.prepare_cached(
                "INSERT INTO runs (deployment, workflow, operation, actor, started_at, finished_at, \
                                   outcome, counts, changes, error, note, returns) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?;
            for run in &import.runs {
                insert.execute(params![
                    run.deployment,
                    run.workflow,
                    run.operation,
                    run.actor,
                    run.started_at,
                    run.finished_at,
                    run.outcome,
                    run.counts,
                    run.changes,
                    run.error,
                    run.note,
                    run.returns
                ])?;
            }
            Ok(Ok(Done::Unit))
        }
        Op::Drop { deployment } => {
            conn.prepare_cached("DELETE FROM leases WHERE deployment = ?1")?
                .execute(params![deployment])?;
            conn.prepare_cached("DELETE FROM runs WHERE deployment = ?1")?
                .execute(params![deployment])?;
            // Resources go with it (ON DELETE CASCADE).
            let dropped = conn
                .prepare_cached("DELETE FROM deployments WHERE name = ?1")?
                .execute(params![deployment])?;
            Ok(Ok(Done::Existed(dropped > 0)))
        }
    }
}

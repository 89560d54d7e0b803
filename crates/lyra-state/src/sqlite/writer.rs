//! Group commit: one task owns the write connection and commits batches.
//!
//! The engine records each step's outcome and waits for it before starting the step's
//! dependents, often from many steps at once. A commit per call would serialise all of them
//! behind the disk; instead every call queues its write and waits on a oneshot. The task takes
//! everything queued, writes it in one `BEGIN IMMEDIATE` transaction, commits, and only then
//! answers each waiter, so every write is durable when its call returns. While one batch
//! commits, the next one queues up, so batches grow with the load by themselves. A batch of
//! one single-statement write skips `BEGIN`/`COMMIT` and runs as its own autocommit
//! transaction: in a deep chain of dependent steps that is every write.
//!
//! A write that is wrong on its own (finishing an unknown run) fails alone without touching
//! the database. A database failure fails the whole batch: it is rolled back and every waiter
//! gets the same error.

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::rows::{ResourceRow, RunEndRow, RunRow, now_ms};

/// Most writes committed in one transaction; also the queue length before callers wait.
const MAX_BATCH: usize = 1024;

/// One write.
pub(crate) enum Op {
    BeginRun(RunRow),
    Put(ResourceRow),
    Remove { deployment: String, step_id: String },
    FinishRun(RunEndRow),
}

/// What a waiter gets: the new run's id for [`Op::BeginRun`], 0 for the others.
type Reply = Result<i64, Arc<Error>>;

struct Job {
    op: Op,
    reply: oneshot::Sender<Reply>,
}

/// The handle to the writer task. Dropping it lets the task finish the queued writes and stop.
pub(crate) struct Writer {
    queue: mpsc::Sender<Job>,
    task: JoinHandle<Result<(), sqlx::Error>>,
}

impl Writer {
    pub fn spawn(conn: SqliteConnection) -> Writer {
        let (queue, jobs) = mpsc::channel(MAX_BATCH);
        Writer {
            queue,
            task: tokio::spawn(run(conn, jobs)),
        }
    }

    /// Queues `op` and waits until it is committed.
    pub async fn submit(&self, op: Op) -> Result<i64, Error> {
        let (reply, answer) = oneshot::channel();
        self.queue.send(Job { op, reply }).await.map_err(|_| Error::Closed)?;
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            // Sole owner: the error was this write's own; otherwise the batch shares it.
            Ok(Err(e)) => Err(Arc::try_unwrap(e).unwrap_or_else(Error::Batch)),
            // The task went away without answering: its runtime is shutting down.
            Err(_) => Err(Error::Closed),
        }
    }

    /// Stops accepting writes, waits for the queued ones and closes the connection.
    pub async fn close(self) -> Result<(), Error> {
        drop(self.queue);
        match self.task.await {
            Ok(closed) => closed.map_err(Error::Sqlx),
            Err(_) => Err(Error::Closed),
        }
    }
}

/// The task's state: the connection, and the deployments known to exist.
struct Task {
    conn: SqliteConnection,
    /// Deployments are never deleted, so once one is seen committed, puts into it need not
    /// make sure it exists again: a lone put is then a single autocommit statement.
    known: HashSet<String>,
}

async fn run(conn: SqliteConnection, mut queue: mpsc::Receiver<Job>) -> Result<(), sqlx::Error> {
    let mut task = Task {
        conn,
        known: HashSet::new(),
    };
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    // `recv_many` waits for one job, then takes whatever else is already queued; it returns
    // 0 once every sender is gone and the queue is empty.
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        match task.write_batch(&jobs).await {
            Ok(results) => {
                for (job, result) in jobs.drain(..).zip(results) {
                    // A waiter that gave up is fine: its write is committed anyway.
                    let _ = job.reply.send(result.map_err(Arc::new));
                }
            }
            Err(e) => {
                let e = Arc::new(Error::Sqlx(e));
                for job in jobs.drain(..) {
                    let _ = job.reply.send(Err(Arc::clone(&e)));
                }
            }
        }
    }
    task.conn.close().await
}

impl Task {
    /// Writes `jobs` and commits them. The outer error fails the whole batch (rolled back when
    /// the transaction is dropped); the inner ones belong to single jobs.
    async fn write_batch(&mut self, jobs: &[Job]) -> Result<Vec<Result<i64, Error>>, sqlx::Error> {
        // Deployments this batch's puts need that are not known to exist yet.
        let mut missing: Vec<&str> = Vec::new();
        for job in jobs {
            if let Op::Put(row) = &job.op
                && !self.known.contains(&row.deployment)
                && !missing.contains(&row.deployment.as_str())
            {
                missing.push(&row.deployment);
            }
        }

        // A lone single-statement write is its own transaction: no BEGIN/COMMIT round trips.
        // This is the deep-chain case, where each write waits for the previous one.
        if let [job] = jobs
            && missing.is_empty()
            && !matches!(job.op, Op::BeginRun(_))
        {
            return Ok(vec![apply(&mut self.conn, &job.op).await?]);
        }

        // IMMEDIATE takes the write lock up front, waiting (busy timeout) for another process
        // rather than failing half-way through the batch.
        let mut tx = self.conn.begin_with("BEGIN IMMEDIATE").await?;
        let now = now_ms();
        for deployment in &missing {
            sqlx::query(
                "INSERT INTO deployments (name, workflow, created_at, updated_at) VALUES (?1, NULL, ?2, ?2) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(deployment)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            results.push(apply(&mut tx, &job.op).await?);
        }
        tx.commit().await?;

        // Only now, committed, do these deployments surely exist.
        self.known.extend(missing.into_iter().map(str::to_owned));
        for job in jobs {
            if let Op::BeginRun(run) = &job.op
                && !self.known.contains(&run.deployment)
            {
                self.known.insert(run.deployment.clone());
            }
        }
        Ok(results)
    }
}

async fn apply(conn: &mut SqliteConnection, op: &Op) -> Result<Result<i64, Error>, sqlx::Error> {
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
            Ok(Ok(inserted.last_insert_rowid()))
        }
        Op::Put(row) => {
            sqlx::query(
                "INSERT INTO resources (deployment, step_id, type_name, external_id, desired, \
                                        actual, depends_on, managed, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (deployment, step_id) DO UPDATE SET \
                     type_name = excluded.type_name, external_id = excluded.external_id, \
                     desired = excluded.desired, actual = excluded.actual, \
                     depends_on = excluded.depends_on, managed = excluded.managed, \
                     updated_at = excluded.updated_at",
            )
            .bind(&row.deployment)
            .bind(&row.step_id)
            .bind(&row.type_name)
            .bind(&row.external_id)
            .bind(&row.desired)
            .bind(&row.actual)
            .bind(&row.depends_on)
            .bind(row.managed)
            .bind(row.updated_at)
            .execute(&mut *conn)
            .await?;
            Ok(Ok(0))
        }
        Op::Remove { deployment, step_id } => {
            sqlx::query("DELETE FROM resources WHERE deployment = ?1 AND step_id = ?2")
                .bind(deployment)
                .bind(step_id)
                .execute(&mut *conn)
                .await?;
            Ok(Ok(0))
        }
        Op::FinishRun(end) => {
            let updated = sqlx::query(
                "UPDATE runs SET finished_at = ?2, outcome = ?3, counts = ?4, changes = ?5, \
                                 error = ?6 \
                 WHERE id = ?1 AND finished_at IS NULL",
            )
            .bind(end.id)
            .bind(end.finished_at)
            .bind(end.outcome)
            .bind(&end.counts)
            .bind(&end.changes)
            .bind(&end.error)
            .execute(&mut *conn)
            .await?;
            if updated.rows_affected() == 1 {
                return Ok(Ok(0));
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
    }
}

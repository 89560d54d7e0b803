//! [`Admin::records`](crate::Admin::records) on Postgres: the load's statement, its rows
//! decoded and handed on as they arrive from the server.

use futures::TryStreamExt as _;
use sqlx::Row as _;
use tokio::sync::{mpsc, oneshot};

use super::{LOAD, PostgresStore};
use crate::error::{Error, is_connection_fault};
use crate::rows::ResourceRow;
use crate::{ReadRecord, RecordStream};

/// How many records are read ahead of the consumer.
const RECORDS_AHEAD: usize = 64;

impl PostgresStore {
    /// One try of [`Admin::records`](crate::Admin::records), safe to repeat until it answers
    /// (the caller retries): a task on its own pooled connection reads the rows and hands
    /// each record on once the consumer has room for it. The rows wait in the socket, where
    /// TCP holds the server back, so memory stays flat in the deployment's size. A fault once
    /// the stream has begun ends it with the error: what was handed on cannot be taken back.
    pub(super) async fn records_once(&self, deployment: &str) -> Result<Option<RecordStream>, Error> {
        let mut conn = self.pool.acquire().await?;
        let (head, found) = oneshot::channel::<Result<Option<Option<String>>, Error>>();
        let (records, received) = mpsc::channel(RECORDS_AHEAD);
        let name = deployment.to_owned();
        let deployment = name.clone();
        let target = self.target.clone();
        tokio::spawn(async move {
            let mut head = Some(head);
            let mut rows = sqlx::query(LOAD).bind(&deployment).fetch(&mut *conn);
            loop {
                let read = match rows.try_next().await {
                    Ok(Some(row)) => read_row(&row),
                    Ok(None) => {
                        // No row at all: no such deployment.
                        if let Some(head) = head.take() {
                            let _ = head.send(Ok(None));
                        }
                        return;
                    }
                    Err(e) => Err(Error::Sqlx(e)),
                };
                let record = match read {
                    Ok((workflow, record)) => {
                        if let Some(head) = head.take() {
                            let _ = head.send(Ok(Some(workflow)));
                        }
                        match record {
                            Some(record) => record,
                            // The row of a deployment without resources.
                            None => continue,
                        }
                    }
                    Err(e) => {
                        match head.take() {
                            Some(head) => {
                                let _ = head.send(Err(e));
                            }
                            None => {
                                let e = match e {
                                    Error::Sqlx(e) if is_connection_fault(&e) => Error::PgUnavailable {
                                        target: target.clone(),
                                        source: e,
                                    },
                                    other => other,
                                };
                                let _ = records.send(Err(e.into())).await;
                            }
                        }
                        return;
                    }
                };
                if records.send(Ok(record)).await.is_err() {
                    // The consumer has gone.
                    return;
                }
            }
        });
        let workflow = found.await.map_err(|_| Error::Closed)??;
        Ok(workflow.map(|workflow| RecordStream::from_channel(name, workflow, received)))
    }
}

/// The deployment's workflow from a row of [`LOAD`], and its record if it has one.
fn read_row(row: &sqlx::postgres::PgRow) -> Result<(Option<String>, Option<ReadRecord>), Error> {
    let workflow: Option<String> = row.try_get("deployment_workflow")?;
    if row.try_get::<Option<&str>, _>("step_id")?.is_none() {
        return Ok((workflow, None));
    }
    let resource = <ResourceRow as sqlx::FromRow<_>>::from_row(row)?;
    Ok((workflow, Some(resource.columns().read())))
}

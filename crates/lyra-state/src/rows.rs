//! Persisted rows and their conversion to and from the `lyra-core` records.
//!
//! The rows mirror the tables column for column and are shared by every SQL backend: JSON
//! columns are plain text here (backends may store them as `jsonb` and cast in their queries),
//! so the database never has to understand the payloads. Keeping these types apart from the
//! `lyra-core` ones means a change there cannot silently change the on-disk format.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{DeploymentSummary, Lease, ReadRecord, RunRecord};
use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, ResourceRecord, RunEnd, RunId, RunReturns,
    RunStart, UnreadableRecord,
};
use lyra_core::value::{Map, too_deep};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// Now, in Unix milliseconds: the unit of every timestamp column.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A row of `_sqlx_migrations`, as far as deciding whether the migrator has work to do.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct AppliedMigration {
    pub version: i64,
    pub success: bool,
    pub checksum: Vec<u8>,
}

/// The query that reads them, in the order [`applied_as_embedded`] compares them.
pub(crate) const APPLIED_MIGRATIONS: &str = "SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version";

/// Whether `applied` (by version) is exactly `migrator`'s migrations, each applied successfully
/// and as embedded: what sqlx's migrator leaves as it is. Anything else (one missing, failed,
/// altered, or from a newer Lyra) is the migrator's to apply or refuse.
pub(crate) fn applied_as_embedded(migrator: &sqlx::migrate::Migrator, applied: &[AppliedMigration]) -> bool {
    let mut embedded: Vec<_> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    embedded.sort_by_key(|m| m.version);
    applied.len() == embedded.len()
        && applied
            .iter()
            .zip(embedded)
            .all(|(a, m)| a.version == m.version && a.success && *a.checksum == *m.checksum)
}

/// A row of `resources`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct ResourceRow {
    pub deployment: String,
    pub step_id: String,
    pub type_name: String,
    pub external_id: String,
    /// JSON object.
    pub desired: String,
    /// JSON object.
    pub actual: String,
    /// JSON array of step ids.
    pub depends_on: String,
    pub managed: bool,
    /// The intent of a `create` whose result is not recorded yet.
    pub pending: bool,
    /// JSON array of attribute names.
    pub sensitive: String,
    pub updated_at: i64,
    /// The idempotency key of a pending create.
    pub create_key: Option<String>,
}

impl ResourceRow {
    pub fn new(deployment: &str, record: &ResourceRecord, updated_at: i64) -> Result<Self, Error> {
        // What could not be decoded again is not written: one such record would make the
        // whole deployment unreadable to older versions.
        for (column, map) in [("desired", &record.desired), ("actual", &record.actual)] {
            if let Some((attr, _)) = map.iter().find(|(_, v)| too_deep(v)) {
                return Err(Error::TooDeep {
                    what: format!(
                        "attribute '{attr}' ({column}) of step {:?} in deployment {deployment:?}",
                        record.step_id
                    ),
                });
            }
        }
        Ok(ResourceRow {
            deployment: deployment.to_owned(),
            step_id: record.step_id.clone(),
            type_name: record.type_name.clone(),
            external_id: record.external_id.clone(),
            desired: encode("resource desired state", &record.desired)?,
            actual: encode("resource actual state", &record.actual)?,
            depends_on: encode("resource dependencies", &record.depends_on)?,
            managed: record.managed,
            pending: record.pending,
            sensitive: encode("resource sensitive attributes", &record.sensitive)?,
            updated_at,
            create_key: record.create_key.clone(),
        })
    }

    /// The row's columns, borrowed.
    pub fn columns(&self) -> ResourceColumns<'_> {
        ResourceColumns {
            deployment: &self.deployment,
            step_id: &self.step_id,
            type_name: &self.type_name,
            external_id: &self.external_id,
            desired: &self.desired,
            actual: &self.actual,
            depends_on: &self.depends_on,
            managed: self.managed,
            pending: self.pending,
            sensitive: &self.sensitive,
            create_key: self.create_key.as_deref(),
        }
    }
}

/// The columns of a resource row as borrowed text: a backend that can lend its buffers (the
/// SQLite store) decodes records from them without copying each column into a
/// [`ResourceRow`] first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResourceColumns<'a> {
    pub deployment: &'a str,
    pub step_id: &'a str,
    pub type_name: &'a str,
    pub external_id: &'a str,
    pub desired: &'a str,
    pub actual: &'a str,
    pub depends_on: &'a str,
    pub managed: bool,
    pub pending: bool,
    pub sensitive: &'a str,
    pub create_key: Option<&'a str>,
}

impl ResourceColumns<'_> {
    /// The record these columns hold, or why it cannot be read.
    pub fn read(&self) -> ReadRecord {
        match self.record() {
            Ok(r) => ReadRecord::Readable(r),
            Err(e) => ReadRecord::Unreadable(UnreadableRecord {
                step_id: self.step_id.to_owned(),
                type_name: self.type_name.to_owned(),
                error: e.to_string(),
            }),
        }
    }

    /// The record these columns hold.
    pub fn record(&self) -> Result<ResourceRecord, Error> {
        let what = |column: &str| {
            format!(
                "resources.{column} of step {:?} in deployment {:?}",
                self.step_id, self.deployment
            )
        };
        let desired: Map = decode(self.desired, || what("desired"))?;
        let actual: Map = decode(self.actual, || what("actual"))?;
        let depends_on: Vec<String> = decode(self.depends_on, || what("depends_on"))?;
        let sensitive: Vec<String> = decode(self.sensitive, || what("sensitive"))?;
        Ok(ResourceRecord {
            step_id: self.step_id.to_owned(),
            type_name: self.type_name.to_owned(),
            external_id: self.external_id.to_owned(),
            desired,
            actual,
            depends_on,
            managed: self.managed,
            pending: self.pending,
            sensitive,
            create_key: self.create_key.map(str::to_owned),
        })
    }
}

/// A deployment's state built record by record: the records that decode, and the ones that
/// do not (listed, so that one bad record leaves the rest readable and can be removed).
pub(crate) struct StateBuilder(DeploymentState);

impl StateBuilder {
    pub fn new(name: &str, workflow: Option<String>) -> StateBuilder {
        StateBuilder(DeploymentState {
            name: name.to_owned(),
            workflow,
            ..DeploymentState::default()
        })
    }

    pub fn push(&mut self, columns: &ResourceColumns<'_>) {
        match columns.read() {
            ReadRecord::Readable(r) => self.0.resources.push(r),
            ReadRecord::Unreadable(u) => self.0.unreadable.push(u),
        }
    }

    pub fn finish(self) -> DeploymentState {
        self.0
    }
}

/// A deployment's state from its rows (see [`StateBuilder`]).
pub(crate) fn deployment_state(name: &str, workflow: Option<String>, rows: Vec<ResourceRow>) -> DeploymentState {
    let mut state = StateBuilder::new(name, workflow);
    for row in &rows {
        state.push(&row.columns());
    }
    state.finish()
}

/// A row of `runs`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct RunRow {
    /// Assigned by the database on insert; ignored when inserting.
    pub id: RunId,
    pub deployment: String,
    pub workflow: Option<String>,
    pub operation: String,
    pub actor: String,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub outcome: Option<String>,
    /// JSON object ([`StoredCounts`]).
    pub counts: String,
    /// JSON array of [`StoredChange`].
    pub changes: String,
    pub error: Option<String>,
    pub note: Option<String>,
    /// JSON object ([`RunReturns`]): a succeeded apply's returns.
    pub returns: Option<String>,
}

/// The columns `finish_run` sets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunEndRow {
    pub id: RunId,
    pub finished_at: i64,
    pub outcome: &'static str,
    pub counts: String,
    pub changes: String,
    pub error: Option<String>,
    pub note: Option<String>,
    pub returns: Option<String>,
}

impl RunRow {
    /// The row inserted when a run starts: no outcome, zero counts, no changes.
    pub fn started(run: &RunStart, started_at: i64) -> Result<Self, Error> {
        Ok(RunRow {
            id: 0,
            deployment: run.deployment.clone(),
            workflow: run.workflow.clone(),
            operation: run.operation.as_str().to_owned(),
            actor: run.actor.clone(),
            started_at,
            finished_at: None,
            outcome: None,
            counts: encode("run counts", &StoredCounts::default())?,
            changes: "[]".to_owned(),
            error: None,
            note: None,
            returns: None,
        })
    }

    /// The row of an imported run (its id is ignored: the store assigns a new one).
    pub fn imported(run: &RunRecord, deployment: &str) -> Result<Self, Error> {
        let changes: Vec<StoredChange> = run.changes.iter().map(StoredChange::from).collect();
        Ok(RunRow {
            id: 0,
            deployment: deployment.to_owned(),
            workflow: run.workflow.clone(),
            operation: run.operation.as_str().to_owned(),
            actor: run.actor.clone(),
            started_at: run.started_at,
            finished_at: run.finished_at,
            outcome: run.outcome.map(|o| o.as_str().to_owned()),
            counts: encode("run counts", &StoredCounts::from(&run.counts))?,
            changes: encode("run changes", &changes)?,
            error: scrub(run.error.as_deref()),
            note: scrub(run.note.as_deref()),
            returns: run
                .returns
                .as_ref()
                .map(|r| encode("run returns", &StoredReturns::from(r)))
                .transpose()?,
        })
    }

    pub fn into_record(self) -> Result<RunRecord, Error> {
        let what = |column: &str| format!("runs.{column} of run {}", self.id);
        let Some(operation) = Operation::parse(&self.operation) else {
            return Err(Error::UnknownValue {
                what: "run operation",
                value: self.operation,
            });
        };
        let outcome = match self.outcome.as_deref() {
            None => None,
            Some("succeeded") => Some(Outcome::Succeeded),
            Some("failed") => Some(Outcome::Failed),
            Some("cancelled") => Some(Outcome::Cancelled),
            Some(other) => {
                return Err(Error::UnknownValue {
                    what: "run outcome",
                    value: other.to_owned(),
                });
            }
        };
        // The counts and changes are details: a run whose details cannot be decoded is kept
        // (and says so) rather than making the whole history unreadable.
        let mut error = self.error;
        let mut unreadable = |e: Error| {
            let note = format!("(part of this run's record cannot be read: {e})");
            error = Some(error.take().map_or(note.clone(), |old| format!("{old} {note}")));
        };
        let counts: StoredCounts = decode(&self.counts, || what("counts")).unwrap_or_else(|e| {
            unreadable(e);
            StoredCounts::default()
        });
        let changes: Vec<StoredChange> = decode(&self.changes, || what("changes")).unwrap_or_else(|e| {
            unreadable(e);
            Vec::new()
        });
        let returns = self.returns.as_deref().and_then(|text| {
            decode::<StoredReturns>(text, || what("returns")).map_or_else(
                |e| {
                    unreadable(e);
                    None
                },
                |r| Some(r.into()),
            )
        });
        Ok(RunRecord {
            id: self.id,
            deployment: self.deployment,
            workflow: self.workflow,
            operation,
            actor: self.actor,
            started_at: self.started_at,
            finished_at: self.finished_at,
            outcome,
            counts: counts.into(),
            changes: changes.into_iter().map(Into::into).collect(),
            error: scrub(error.as_deref()),
            note: scrub(self.note.as_deref()),
            returns,
        })
    }
}

impl RunEndRow {
    pub fn new(id: RunId, end: &RunEnd, finished_at: i64) -> Result<Self, Error> {
        let changes: Vec<StoredChange> = end.changes.iter().map(StoredChange::from).collect();
        Ok(RunEndRow {
            id,
            finished_at,
            outcome: end.outcome.as_str(),
            counts: encode("run counts", &StoredCounts::from(&end.counts))?,
            changes: encode("run changes", &changes)?,
            error: scrub(end.error.as_deref()),
            note: scrub(end.note.as_deref()),
            returns: end
                .returns
                .as_ref()
                .map(|r| encode("run returns", &StoredReturns::from(r)))
                .transpose()?,
        })
    }
}

/// A row of `leases`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct LeaseRow {
    pub deployment: String,
    pub owner: String,
    pub operation: String,
    pub token: String,
    pub since: i64,
    pub expires: i64,
}

impl LeaseRow {
    /// The lease as shown to anyone but its holder: without the token's random part, which
    /// only the holder may know (it could otherwise release or renew a lease that is not its
    /// own). What is left names the holding process (see [`crate::lease`]), if anything.
    pub fn public(self) -> Lease {
        let holder = crate::lease::holder::public_part(&self.token).to_owned();
        Lease {
            token: holder,
            ..Lease::from(self)
        }
    }
}

impl From<LeaseRow> for Lease {
    fn from(row: LeaseRow) -> Self {
        Lease {
            deployment: row.deployment,
            owner: row.owner,
            operation: row.operation,
            since: row.since,
            expires: row.expires,
            token: row.token,
        }
    }
}

// Column lists shared by the backends' queries; macros rather than consts so `concat!` can
// build the `&'static str` queries sqlx requires.

/// The columns of [`LeaseRow`], for `SELECT` and `RETURNING`.
macro_rules! lease_columns {
    () => {
        "deployment, owner, operation, token, since, expires"
    };
}

/// The columns of [`ResourceRow`].
macro_rules! resource_columns {
    () => {
        "deployment, step_id, type_name, external_id, desired, actual, depends_on, managed, pending, sensitive, \
         updated_at, create_key"
    };
}

/// The columns of [`RunRow`].
macro_rules! run_columns {
    () => {
        "id, deployment, workflow, operation, actor, started_at, finished_at, outcome, counts, changes, error, note, \
         returns"
    };
}

pub(crate) use {lease_columns, resource_columns, run_columns};

/// `deployments` joined with its resource count, for `list`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub(crate) struct DeploymentSummaryRow {
    pub name: String,
    pub workflow: Option<String>,
    pub resources: i64,
}

/// The lines of `list`: deployments (sorted) with their last run and unexpired lease.
pub(crate) fn summaries(
    deployments: Vec<DeploymentSummaryRow>,
    last_runs: Vec<RunRow>,
    leases: Vec<LeaseRow>,
) -> Result<Vec<DeploymentSummary>, Error> {
    let mut last_runs: HashMap<String, RunRow> = last_runs.into_iter().map(|r| (r.deployment.clone(), r)).collect();
    let mut leases: HashMap<String, LeaseRow> = leases.into_iter().map(|l| (l.deployment.clone(), l)).collect();
    deployments
        .into_iter()
        .map(|d| {
            Ok(DeploymentSummary {
                last_run: last_runs.remove(&d.name).map(RunRow::into_record).transpose()?,
                lease: leases.remove(&d.name).map(LeaseRow::public),
                name: d.name,
                workflow: d.workflow,
                resources: usize::try_from(d.resources).unwrap_or(usize::MAX),
            })
        })
        .collect()
}

/// The stored form of [`RunReturns`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct StoredReturns {
    values: Map,
    #[serde(default)]
    sensitive: Vec<String>,
}

impl From<&RunReturns> for StoredReturns {
    fn from(r: &RunReturns) -> Self {
        StoredReturns {
            values: r.values.clone(),
            sensitive: r.sensitive.clone(),
        }
    }
}

impl From<StoredReturns> for RunReturns {
    fn from(r: StoredReturns) -> Self {
        RunReturns {
            values: r.values,
            sensitive: r.sensitive,
        }
    }
}

/// The stored form of [`ChangeCounts`]. Missing fields read as zero, so counts added later
/// still decode from old rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
struct StoredCounts {
    created: u32,
    updated: u32,
    replaced: u32,
    deleted: u32,
    unchanged: u32,
    failed: u32,
    skipped: u32,
}

impl From<&ChangeCounts> for StoredCounts {
    fn from(c: &ChangeCounts) -> Self {
        StoredCounts {
            created: c.created,
            updated: c.updated,
            replaced: c.replaced,
            deleted: c.deleted,
            unchanged: c.unchanged,
            failed: c.failed,
            skipped: c.skipped,
        }
    }
}

impl From<StoredCounts> for ChangeCounts {
    fn from(c: StoredCounts) -> Self {
        ChangeCounts {
            created: c.created,
            updated: c.updated,
            replaced: c.replaced,
            deleted: c.deleted,
            unchanged: c.unchanged,
            failed: c.failed,
            skipped: c.skipped,
        }
    }
}

/// The stored form of [`ChangeRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StoredChange {
    step_id: String,
    action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl From<&ChangeRecord> for StoredChange {
    fn from(c: &ChangeRecord) -> Self {
        StoredChange {
            step_id: c.step_id.clone(),
            action: c.action.clone(),
            error: scrub(c.error.as_deref()),
        }
    }
}

impl From<StoredChange> for ChangeRecord {
    fn from(c: StoredChange) -> Self {
        ChangeRecord {
            step_id: c.step_id,
            action: c.action,
            error: c.error,
        }
    }
}

/// Free text for the history without any credential a URL in it may carry: applied when
/// notes and errors are written (imports carry notes written elsewhere, older versions wrote
/// URLs with passwords into them) and again when they are read.
fn scrub(text: Option<&str>) -> Option<String> {
    text.map(crate::redact_text)
}

fn encode<T: Serialize + ?Sized>(what: &'static str, value: &T) -> Result<String, Error> {
    serde_json::to_string(value).map_err(|source| Error::Encode { what, source })
}

fn decode<T: for<'de> Deserialize<'de>>(text: &str, what: impl FnOnce() -> String) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|source| Error::Corrupt { what: what(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_missing_fields_read_as_zero() {
        let counts: StoredCounts = serde_json::from_str(r#"{"created":2}"#).unwrap();
        assert_eq!(
            ChangeCounts::from(counts),
            ChangeCounts {
                created: 2,
                ..Default::default()
            }
        );
    }

    #[test]
    fn undecodable_run_details_are_noted_not_fatal() {
        let mut row = RunRow::started(
            &RunStart {
                deployment: "d".into(),
                workflow: None,
                operation: Operation::Apply,
                actor: "me".into(),
            },
            1,
        )
        .unwrap();
        row.changes = format!("[{}]", "[".repeat(300));
        row.counts = "{oops".into();
        let run = row.into_record().expect("still a run");
        assert_eq!(run.counts, ChangeCounts::default());
        assert!(run.changes.is_empty());
        let error = run.error.unwrap();
        assert!(
            error.contains("runs.counts of run 0") && error.contains("runs.changes of run 0"),
            "{error}"
        );
    }

    #[test]
    fn unknown_operation_is_corrupt() {
        let mut row = RunRow::started(
            &RunStart {
                deployment: "d".into(),
                workflow: None,
                operation: Operation::Apply,
                actor: "me".into(),
            },
            1,
        )
        .unwrap();
        row.operation = "explode".into();
        let err = row.into_record().unwrap_err();
        assert!(matches!(err, Error::UnknownValue { .. }), "{err:?}");
        assert_eq!(err.kind(), lyra_core::state::StoreErrorKind::Corrupt);
    }
}

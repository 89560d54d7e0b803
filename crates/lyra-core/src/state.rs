//! The [`Recorder`] trait: where the engine records a run and what it manages. Implementations
//! live in `lyra-state` (SQLite, Postgres), which also owns everything a run does not need:
//! leases, listing, history, export/import. The engine only sees these types.
//!
//! State is keyed by *deployment* (a CLI deployment name, or `k8s/<namespace>/<name>`), never
//! by workflow name alone, so two deployments of one workflow never touch each other.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::Hints;
use crate::value::Map;

/// One resource the engine manages (or reads, for `external_id` steps).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRecord {
    /// Stable id within the deployment: step names joined by `/`, with iteration indices
    /// (`appServers/1`) and call targets.
    pub step_id: String,
    /// Canonical resource type, `Ns::Type`.
    pub type_name: String,
    pub external_id: String,
    /// The desired state the engine last applied.
    pub desired: Map,
    /// The actual state the provider last reported.
    pub actual: Map,
    /// Step ids of the recorded resources this one's desired state was built from: deletion
    /// runs in the reverse of this order without needing the workflow.
    pub depends_on: Vec<String>,
    /// `false` for read-only resources (`external_id:` steps), which are never deleted.
    pub managed: bool,
    /// The engine asked the provider to create this resource and has not yet recorded the
    /// result: written before `create` is called, so a crash in between leaves a trace. A
    /// pending record has no external id and an empty actual state.
    pub pending: bool,
    /// Attributes whose values are secret (typed `Sensitive`, marked so by the provider, or
    /// derived from a `Sensitive` parameter): shown as `(sensitive)`, never printed.
    pub sensitive: Vec<String>,
    /// The idempotency key `create` is asked with, while the record is pending (see
    /// [`crate::provider::idempotency_key`]); `None` once the result is recorded.
    pub create_key: Option<String>,
}

impl ResourceRecord {
    /// The record written just before `create`: the intent, with no result yet, and the key
    /// the create is asked with.
    pub fn intent(step_id: &str, type_name: &str, desired: Map, depends_on: Vec<String>, create_key: String) -> Self {
        ResourceRecord {
            step_id: step_id.to_owned(),
            type_name: type_name.to_owned(),
            external_id: String::new(),
            desired,
            actual: Map::new(),
            depends_on,
            managed: true,
            pending: true,
            sensitive: Vec::new(),
            create_key: Some(create_key),
        }
    }
}

/// Everything recorded about one deployment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeploymentState {
    pub name: String,
    /// The workflow last applied to it.
    pub workflow: Option<String>,
    pub resources: Vec<ResourceRecord>,
    /// Records the store holds but cannot decode (damaged, or written by a broken or newer
    /// Lyra). A store lists them rather than failing the whole load, so the rest of the
    /// deployment stays readable and they can be named and removed (`lyra state rm`). The
    /// engine refuses to plan, apply or delete a deployment that has any.
    pub unreadable: Vec<UnreadableRecord>,
}

impl DeploymentState {
    pub fn resource(&self, step_id: &str) -> Option<&ResourceRecord> {
        self.resources.iter().find(|r| r.step_id == step_id)
    }
}

/// A resource record the store could not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableRecord {
    pub step_id: String,
    pub type_name: String,
    /// Why it cannot be read.
    pub error: String,
}

/// Why a deployment with unreadable records cannot be planned, applied, deleted or moved, and
/// how to recover (in the caller's words: `hints`): the message the engine fails with, and
/// that the state commands print.
pub fn unreadable_message(deployment: &str, unreadable: &[UnreadableRecord], hints: &dyn Hints) -> String {
    let list: Vec<String> = unreadable
        .iter()
        .map(|u| format!("  step '{}' ({}): {}", u.step_id, u.type_name, u.error))
        .collect();
    let steps: Vec<&str> = unreadable.iter().map(|u| u.step_id.as_str()).collect();
    format!(
        "deployment '{deployment}' has {} record(s) Lyra cannot read:\n{}\n\
         Nothing was changed. Check the resources by hand, then forget the records with \
         {} (this does not delete the resources).",
        unreadable.len(),
        list.join("\n"),
        hints.forget_records(deployment, &steps)
    )
}

/// Everything recorded about a deployment as one value, records sorted by step and nothing
/// left to the store's order: what digests of "the state a plan read" are made of (saved plans,
/// Kubernetes approvals). Secret values are in it: digest it keyed, never show it.
pub fn fingerprint_value(state: Option<&DeploymentState>) -> Value {
    let Some(s) = state else { return Value::Null };
    let mut records: Vec<&ResourceRecord> = s.resources.iter().collect();
    records.sort_by(|a, b| a.step_id.cmp(&b.step_id));
    let records: Vec<Value> = records
        .into_iter()
        .map(|r| {
            json!({
                "step": r.step_id,
                "type": r.type_name,
                "external_id": r.external_id,
                "desired": r.desired,
                "actual": r.actual,
                "depends_on": r.depends_on,
                "managed": r.managed,
                "pending": r.pending,
                "sensitive": r.sensitive,
                "create_key": r.create_key,
            })
        })
        .collect();
    let mut unreadable: Vec<Value> = s
        .unreadable
        .iter()
        .map(|u| json!({"step": u.step_id, "type": u.type_name, "error": u.error}))
        .collect();
    unreadable.sort_by_key(crate::value::canonical_json);
    json!({
        "deployment": s.name,
        "workflow": s.workflow,
        "resources": records,
        "unreadable": unreadable,
    })
}

/// What a run does to its deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Apply,
    Delete,
    /// `lyra state unlock --force`: a lease was broken.
    Unlock,
    /// `lyra state rm`: resources were forgotten without being deleted.
    Forget,
    /// `lyra state import` / `migrate`: the deployment's state was written from elsewhere.
    Import,
    /// `lyra drift --refresh-state`: what the providers read was recorded as the resources'
    /// actual state; no resource was changed.
    Refresh,
}

impl Operation {
    pub const ALL: [Operation; 6] = [
        Operation::Apply,
        Operation::Delete,
        Operation::Unlock,
        Operation::Forget,
        Operation::Import,
        Operation::Refresh,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "apply",
            Operation::Delete => "delete",
            Operation::Unlock => "unlock",
            Operation::Forget => "forget",
            Operation::Import => "import",
            Operation::Refresh => "refresh",
        }
    }

    pub fn parse(s: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The start of a run, as recorded in the history.
#[derive(Debug, Clone)]
pub struct RunStart {
    pub deployment: String,
    pub workflow: Option<String>,
    pub operation: Operation,
    /// Who runs it: `user@host` for the CLI.
    pub actor: String,
}

/// Counts of what a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeCounts {
    pub created: u32,
    pub updated: u32,
    pub replaced: u32,
    pub deleted: u32,
    pub unchanged: u32,
    pub failed: u32,
    pub skipped: u32,
}

/// One resource a run changed (or failed to), kept in the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    pub step_id: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The end of a run.
#[derive(Debug, Clone)]
pub struct RunEnd {
    pub outcome: Outcome,
    pub counts: ChangeCounts,
    /// Only the steps that changed something or failed; no-ops are not listed.
    pub changes: Vec<ChangeRecord>,
    pub error: Option<String>,
    /// A human note kept in the history (e.g. whose lease an unlock broke).
    pub note: Option<String>,
    /// What a succeeded apply returned (`lyra output`); `None` for every other run.
    pub returns: Option<RunReturns>,
}

/// A workflow's returns as an apply recorded them, secret ones masked: the history keeps no
/// secret.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReturns {
    pub values: Map,
    /// The names of the returns whose values are secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensitive: Vec<String>,
}

/// Identifier of a run in the history.
pub type RunId = i64;

/// What kind of store failure this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The store cannot be reached or opened.
    Unavailable,
    /// The stored data is not what this version of Lyra understands.
    Corrupt,
    /// Someone else changed the data first.
    Conflict,
    /// The write was refused because the lease it was made under is no longer current: the
    /// run lost its lease (it expired and was taken, or was broken), and another run may own
    /// the deployment now. Nothing of the write was kept.
    LeaseLost,
    Other,
}

/// A state store failure. Backends keep their typed errors; the engine sees this.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(
        kind: StoreErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// A recorder whose first load of one deployment is answered with a state read before, so
/// that the read can overlap other work (a plan parses its workflow meanwhile); every other
/// call goes to the recorder it wraps.
pub struct Preloaded {
    inner: std::sync::Arc<dyn Recorder>,
    deployment: String,
    state: std::sync::Mutex<Option<Result<Option<DeploymentState>, StoreError>>>,
}

impl Preloaded {
    /// `state` is what `inner.load(deployment)` answered.
    pub fn new(
        inner: std::sync::Arc<dyn Recorder>,
        deployment: &str,
        state: Result<Option<DeploymentState>, StoreError>,
    ) -> Preloaded {
        Preloaded {
            inner,
            deployment: deployment.to_owned(),
            state: std::sync::Mutex::new(Some(state)),
        }
    }
}

#[async_trait]
impl Recorder for Preloaded {
    fn store_id(&self) -> &str {
        self.inner.store_id()
    }

    async fn load(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError> {
        let preloaded = (deployment == self.deployment)
            .then(|| self.state.lock().expect("preloaded state lock").take())
            .flatten();
        match preloaded {
            Some(state) => state,
            None => self.inner.load(deployment).await,
        }
    }

    async fn begin_run(&self, run: &RunStart) -> Result<RunId, StoreError> {
        self.inner.begin_run(run).await
    }

    async fn put_resource(&self, deployment: &str, record: &ResourceRecord) -> Result<(), StoreError> {
        self.inner.put_resource(deployment, record).await
    }

    async fn remove_resource(&self, deployment: &str, step_id: &str) -> Result<(), StoreError> {
        self.inner.remove_resource(deployment, step_id).await
    }

    async fn finish_run(&self, run: RunId, end: &RunEnd) -> Result<(), StoreError> {
        self.inner.finish_run(run, end).await
    }
}

/// Where the engine records a run and what it manages: what it reads before the run and the
/// writes of the run, nothing else.
///
/// Every write must be durable when the returned future resolves: the engine starts the
/// dependents of a step only after its outcome is recorded, so a crash loses nothing.
/// Implementations may batch concurrent writes into one commit. A recorder bound to a lease
/// refuses every write once the lease is no longer current ([`StoreErrorKind::LeaseLost`]).
#[async_trait]
pub trait Recorder: Send + Sync {
    /// The store's identity: random, made with the store, never changed. Idempotency keys
    /// begin with it (see [`crate::provider::idempotency_key`]); it is not exported.
    fn store_id(&self) -> &str;

    /// The recorded state of a deployment, `None` if it was never applied.
    async fn load(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError>;

    /// Records the start of a run, creating the deployment if needed.
    async fn begin_run(&self, run: &RunStart) -> Result<RunId, StoreError>;

    /// Inserts or replaces one resource record. One holding a value nested deeper than
    /// [`crate::value::MAX_DEPTH`] is refused, and nothing written: what is recorded can be
    /// read back.
    async fn put_resource(&self, deployment: &str, record: &ResourceRecord) -> Result<(), StoreError>;

    /// Forgets one resource (after it was deleted).
    async fn remove_resource(&self, deployment: &str, step_id: &str) -> Result<(), StoreError>;

    /// Records the end of a run.
    async fn finish_run(&self, run: RunId, end: &RunEnd) -> Result<(), StoreError>;
}

//! What a state store offers beyond the engine's [`Recorder`]: leases, the writes of a run
//! fenced by its lease, and administration (listing, history, export/import, drop). Each
//! backend implements every trait once; [`Store`] is all of them, what [`crate::open`] gives.

use async_trait::async_trait;
use futures::stream::BoxStream;
use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, Recorder, ResourceRecord, RunEnd, RunId,
    RunReturns, RunStart, StoreError, UnreadableRecord,
};

/// A run as kept in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub deployment: String,
    pub workflow: Option<String>,
    pub operation: Operation,
    pub actor: String,
    /// Unix time in milliseconds.
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// `None` while running, or when the run never finished (a crash).
    pub outcome: Option<Outcome>,
    pub counts: ChangeCounts,
    pub changes: Vec<ChangeRecord>,
    pub error: Option<String>,
    pub note: Option<String>,
    /// What a succeeded apply returned (`lyra output`).
    pub returns: Option<RunReturns>,
}

/// One line of `lyra state list`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSummary {
    pub name: String,
    pub workflow: Option<String>,
    pub resources: usize,
    pub last_run: Option<RunRecord>,
    /// The lease, while someone holds it (expired leases are not shown).
    pub lease: Option<Lease>,
}

/// A lease on one deployment: while it is held, only its holder applies, deletes or edits the
/// deployment's state. Leases live in the state store, so they work across processes and
/// machines; the holder renews it while it runs, and a crashed holder's lease expires.
///
/// Times are Unix milliseconds on the *store's* clock (the database server's for Postgres), so
/// holders on machines with skewed clocks still agree on expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub deployment: String,
    /// Who holds it: `user@host` for the CLI, `controller/<namespace>/<name>` for the controller.
    pub owner: String,
    /// What the holder is doing: `apply`, `delete`, `state rm`, …
    pub operation: String,
    /// When it was first acquired.
    pub since: i64,
    /// When it lapses unless renewed.
    pub expires: i64,
    /// A random value only the holder knows: renewing or releasing needs it, so a holder whose
    /// lease was broken and re-taken cannot release its successor's. Tokens made by
    /// [`crate::lease`] also name the holding process, so that one on the same machine can
    /// tell when the holder has ended. Stores only compare tokens.
    pub token: String,
}

/// A request to take (or renew) a lease.
#[derive(Debug, Clone)]
pub struct LeaseRequest {
    pub deployment: String,
    pub owner: String,
    pub operation: String,
    pub token: String,
    /// How long the lease lasts from now unless renewed.
    pub ttl_ms: i64,
}

/// The answer to a [`LeaseRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseGrant {
    /// The caller holds the lease now.
    Acquired(Lease),
    /// Someone else holds it.
    Held(Lease),
}

/// A deployment's state as moved by `lyra state export/import/migrate`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeploymentExport {
    pub state: DeploymentState,
    /// Oldest first.
    pub history: Vec<RunRecord>,
}

/// One record of a deployment as [`Admin::records`] reads it.
#[derive(Debug, Clone, PartialEq)]
// Handed on one at a time (a few dozen at most wait in a channel): boxing every readable
// record would cost an allocation each for nothing.
#[allow(clippy::large_enum_variant)]
pub enum ReadRecord {
    Readable(ResourceRecord),
    /// It does not decode; the rest of the deployment still reads.
    Unreadable(UnreadableRecord),
}

/// A deployment's records as [`Admin::records`] gives them: read one at a time, in step
/// order, from one snapshot.
pub struct RecordStream {
    pub name: String,
    pub workflow: Option<String>,
    /// Ends early with an error if the store fails part-way; stops being read when dropped.
    pub records: BoxStream<'static, Result<ReadRecord, StoreError>>,
}

impl RecordStream {
    /// The stream of what a backend's reader sends on `records`, as it arrives.
    pub(crate) fn from_channel(
        name: String,
        workflow: Option<String>,
        records: tokio::sync::mpsc::Receiver<Result<ReadRecord, StoreError>>,
    ) -> RecordStream {
        use futures::StreamExt as _;
        RecordStream {
            name,
            workflow,
            records: futures::stream::unfold(records, |mut records| async move {
                records.recv().await.map(|record| (record, records))
            })
            .boxed(),
        }
    }
}

impl std::fmt::Debug for RecordStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStream")
            .field("name", &self.name)
            .field("workflow", &self.workflow)
            .finish_non_exhaustive()
    }
}

/// A deployment's lease, kept in the store: the single-writer rule for runs and state edits,
/// across processes and machines. [`crate::lease`] holds one for the length of a run.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes the deployment's lease if it is free, expired, or already held with the same token
    /// (which renews it); otherwise reports the holder. Atomic across processes.
    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError>;

    /// Extends a held lease by `ttl_ms` from now. `None`: it is no longer ours (it expired and
    /// someone else took it, or it was broken).
    async fn renew_lease(&self, lease: &Lease, ttl_ms: i64) -> Result<Option<Lease>, StoreError>;

    /// Releases a lease if it is still ours, and says whether it was: `false` when it was lost
    /// meanwhile (releasing a lost lease is not an error).
    async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError>;

    /// The deployment's unexpired lease, if any.
    async fn lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError>;

    /// Removes the deployment's lease whoever holds it (expired or not) and returns it.
    async fn break_lease(&self, deployment: &str) -> Result<Option<Lease>, StoreError>;

    /// Removes the deployment's lease only while `holder` holds it, and returns it. `holder`
    /// is the process part of a token (from its `~`), as others see it in
    /// [`LeaseGrant::Held`]; anything else breaks nothing.
    async fn break_lease_held_by(&self, deployment: &str, holder: &str) -> Result<Option<Lease>, StoreError>;
}

/// The writes of [`Recorder`], each made only while `fence` is the deployment's current lease:
/// the check and the write are one transaction, so a holder that lost its lease (paused past
/// its time to live, then resumed) can never write over the run that took it. A refused write
/// fails with [`lyra_core::state::StoreErrorKind::LeaseLost`] and changes nothing.
/// [`crate::lease::Fenced`] is the [`Recorder`] a run under a lease records through.
#[async_trait]
pub trait FencedWrites: Send + Sync {
    async fn begin_run_fenced(&self, fence: &Fence, run: &RunStart) -> Result<RunId, StoreError>;
    async fn put_resource_fenced(&self, fence: &Fence, record: &ResourceRecord) -> Result<(), StoreError>;
    async fn remove_resource_fenced(&self, fence: &Fence, step_id: &str) -> Result<(), StoreError>;
    async fn finish_run_fenced(&self, fence: &Fence, run: RunId, end: &RunEnd) -> Result<(), StoreError>;

    /// [`FencedWrites::finish_run_fenced`] for a run that is the last thing done under its
    /// lease: where the backend can, the lease is released by the same write (one round trip
    /// fewer per run). `Ok(true)`: finished and released; `Ok(false)`: finished, the lease
    /// still held (to be released as usual). A refused or failed finish releases nothing.
    async fn finish_run_and_release(&self, fence: &Fence, run: RunId, end: &RunEnd) -> Result<bool, StoreError>;
}

/// The lease a write is made under: its deployment and its holder's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub deployment: String,
    pub token: String,
}

impl From<&Lease> for Fence {
    fn from(lease: &Lease) -> Fence {
        Fence {
            deployment: lease.deployment.clone(),
            token: lease.token.clone(),
        }
    }
}

/// Reading and moving whole deployments: `lyra state`, `lyra history`, the controller's
/// orphaning cleanup.
#[async_trait]
pub trait Admin: Send + Sync {
    /// Every deployment, sorted by name.
    async fn list(&self) -> Result<Vec<DeploymentSummary>, StoreError>;

    /// A deployment's runs, newest first.
    async fn history(&self, deployment: &str) -> Result<Vec<RunRecord>, StoreError>;

    /// A deployment's records one at a time, in step order, from one snapshot: for output
    /// written as it is read, whose memory does not grow with the deployment. `None`: no
    /// such deployment. A failure before the first record (a dropped connection) is retried
    /// where the backend retries reads; a failure after it ends the stream with the error.
    /// While it reads (until its consumer is within a few dozen records of the end, or drops
    /// it), the stream holds one of the store's read connections.
    async fn records(&self, deployment: &str) -> Result<Option<RecordStream>, StoreError>;

    /// Everything recorded about a deployment, history included, for export.
    async fn export(&self, deployment: &str) -> Result<Option<DeploymentExport>, StoreError>;

    /// Writes an exported deployment in one transaction: its resources replace any recorded
    /// ones, its history is appended (with new run ids, in order).
    async fn import(&self, export: &DeploymentExport) -> Result<(), StoreError>;

    /// Drops a deployment with its resources, history and lease. `false` if it did not exist.
    async fn drop_deployment(&self, deployment: &str) -> Result<bool, StoreError>;
}

/// A whole state store: what [`crate::open`] returns.
pub trait Store: Recorder + Leases + FencedWrites + Admin {}

impl<T: Recorder + Leases + FencedWrites + Admin + ?Sized> Store for T {}

/// The [`Recorder`] and [`FencedWrites`] of a backend, written once for both: they delegate to
/// the backend's inherent `load_state` and `*_in` writes, which take the fence as an
/// `Option` (`None`: an unfenced write, for tests and tools that hold no lease).
macro_rules! recorder_and_fenced_writes {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl lyra_core::state::Recorder for $store {
            fn store_id(&self) -> &str {
                &self.id
            }

            async fn load(
                &self,
                deployment: &str,
            ) -> Result<Option<lyra_core::state::DeploymentState>, lyra_core::state::StoreError> {
                self.load_state(deployment).await
            }

            async fn begin_run(
                &self,
                run: &lyra_core::state::RunStart,
            ) -> Result<lyra_core::state::RunId, lyra_core::state::StoreError> {
                self.begin_run_in(None, run).await
            }

            async fn put_resource(
                &self,
                deployment: &str,
                record: &lyra_core::state::ResourceRecord,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.put_resource_in(None, deployment, record).await
            }

            async fn remove_resource(
                &self,
                deployment: &str,
                step_id: &str,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.remove_resource_in(None, deployment, step_id).await
            }

            async fn finish_run(
                &self,
                run: lyra_core::state::RunId,
                end: &lyra_core::state::RunEnd,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.finish_run_in(None, run, end).await
            }
        }

        #[async_trait::async_trait]
        impl $crate::store::FencedWrites for $store {
            async fn begin_run_fenced(
                &self,
                fence: &$crate::store::Fence,
                run: &lyra_core::state::RunStart,
            ) -> Result<lyra_core::state::RunId, lyra_core::state::StoreError> {
                self.begin_run_in(Some(fence), run).await
            }

            async fn put_resource_fenced(
                &self,
                fence: &$crate::store::Fence,
                record: &lyra_core::state::ResourceRecord,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.put_resource_in(Some(fence), &fence.deployment, record).await
            }

            async fn remove_resource_fenced(
                &self,
                fence: &$crate::store::Fence,
                step_id: &str,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.remove_resource_in(Some(fence), &fence.deployment, step_id)
                    .await
            }

            async fn finish_run_fenced(
                &self,
                fence: &$crate::store::Fence,
                run: lyra_core::state::RunId,
                end: &lyra_core::state::RunEnd,
            ) -> Result<(), lyra_core::state::StoreError> {
                self.finish_run_in(Some(fence), run, end).await
            }

            async fn finish_run_and_release(
                &self,
                fence: &$crate::store::Fence,
                run: lyra_core::state::RunId,
                end: &lyra_core::state::RunEnd,
            ) -> Result<bool, lyra_core::state::StoreError> {
                self.finish_run_and_release_in(fence, run, end).await
            }
        }
    };
}
pub(crate) use recorder_and_fenced_writes;

//! The reconcile core: everything a reconcile does except talking to the API server.
//!
//! It takes *what to run* (a [`Job`]: deployment key, workflow, data, policies, generation)
//! and *where to report* (a [`Reporter`]: status writes and events), so it is tested with an
//! in-memory reporter and a real SQLite store, and so other kinds (per-workflow CRDs, later)
//! can build a `Job` from their own spec and reuse it unchanged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use lyra_core::diag::{Diagnostics, Sources};
use lyra_core::engine::{Engine, EngineError, Quiet};
use lyra_core::model::ParamSource;
use lyra_core::program::Program;
use lyra_core::provider::Providers;
use lyra_core::report::{Action, Report, Status, StepReport};
use lyra_core::secret::Secrets;
use lyra_core::state::{Outcome, Recorder, StoreError, StoreErrorKind};
use lyra_core::value::{Map, Value};
use lyra_host::LoadPath;
use lyra_state::lease::{self, LeaseError, LeaseOptions, Leased};
use lyra_state::{Lease, Store};
use tokio::sync::watch;

use crate::approval::{self, PlanInputs};
use crate::crd::{Approval, DeletionPolicy, DriftPolicy, Phase, RunSummary, Workflow, WorkflowStatus};
use crate::inline;
use crate::metrics::Metrics;
use crate::reason::{Failure, Reason, engine_reason, lookup_reason};
use crate::retry::{Backoff, ErrorClass};
use crate::status::{self, Verdict, judge};

/// A Kubernetes object's place: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
    /// `<plural>.<group>` for an object of a registered kind; `None` for a `Workflow`.
    pub kind: Option<String>,
}

/// The engine's timer (a step's `retry:` and `timeout:`) on the controller's runtime.
struct TokioTimer;

impl lyra_core::engine::Timer for TokioTimer {
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
            kind: None,
        }
    }

    /// An object of a registered kind (`kind` is `<plural>.<group>`).
    pub fn of_kind(kind: impl Into<String>, namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            kind: Some(kind.into()),
            ..ObjectKey::new(namespace, name)
        }
    }

    /// The object's path: `<namespace>/<name>`, or `<namespace>/<plural>.<group>/<name>`
    /// for a registered kind (kinds never clash with each other or with `Workflow`s).
    fn path(&self) -> String {
        match &self.kind {
            None => format!("{}/{}", self.namespace, self.name),
            Some(kind) => format!("{}/{kind}/{}", self.namespace, self.name),
        }
    }

    /// The state key of the object's deployment, shared with the CLI (`lyra plan --name`).
    pub fn deployment(&self) -> String {
        format!("k8s/{}", self.path())
    }

    /// Who holds the deployment's lease while the controller runs it.
    pub fn owner(&self) -> String {
        format!("controller/{}", self.path())
    }
}

/// The labels that point from an object a workflow made (`Kubernetes::Object`) back to the
/// Kubernetes object whose deployment `deployment` is (`k8s/<ns>/<name>`, or
/// `k8s/<ns>/<plural>.<group>/<name>`): `lyra.dev/owner-namespace`, `lyra.dev/owner-name`,
/// `lyra.dev/owner-kind` (`Workflow`, or `<plural>.<group>`), each only when it fits a
/// label value (63 characters; the provider's `lyra.dev/deployment` annotation always names
/// the deployment). Nothing for other deployments (the CLI's).
pub fn owner_labels(deployment: &str) -> Vec<(String, String)> {
    let Some(path) = deployment.strip_prefix("k8s/") else {
        return Vec::new();
    };
    let parts: Vec<&str> = path.split('/').collect();
    let (ns, kind, name) = match parts.as_slice() {
        [ns, name] => (*ns, "Workflow", *name),
        [ns, kind, name] => (*ns, *kind, *name),
        _ => return Vec::new(),
    };
    [("owner-namespace", ns), ("owner-name", name), ("owner-kind", kind)]
        .into_iter()
        .filter(|(_, v)| !v.is_empty() && v.len() <= 63)
        .map(|(k, v)| (format!("lyra.dev/{k}"), v.to_owned()))
        .collect()
}

/// The namespace of the Kubernetes object whose deployment `deployment` is (`k8s/<ns>/...`):
/// where the objects its workflow applies with the controller's own access must stay. `None`
/// for other deployments.
pub fn owner_namespace(deployment: &str) -> Option<String> {
    let path = deployment.strip_prefix("k8s/")?;
    let (ns, rest) = path.split_once('/')?;
    (!ns.is_empty() && !rest.is_empty()).then(|| ns.to_owned())
}

/// Which workflow to run.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkflowRef {
    /// By name on the controller's load path.
    Named(String),
    /// Embedded in the object; `name` names it in diagnostics and the state.
    Inline { name: String, body: Value },
    /// A registered package's main workflow (objects of a generated kind).
    Package(PackageRef),
}

/// A package, compared by digest (the digest is its content).
#[derive(Debug, Clone)]
pub struct PackageRef(pub Arc<lyra_package::Package>);

impl PartialEq for PackageRef {
    fn eq(&self, other: &PackageRef) -> bool {
        self.0.digest == other.0.digest
    }
}

/// What to run for one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub key: ObjectKey,
    /// The object's `metadata.uid`: what is remembered of a run belongs to one incarnation
    /// of a name, so a deleted and re-created object starts afresh.
    pub uid: Option<String>,
    pub generation: Option<i64>,
    /// `Err`: the spec does not say which workflow, or a free-form field cannot be read (a
    /// terminal error).
    pub workflow: Result<WorkflowRef, String>,
    pub data: Option<Value>,
    pub refresh_interval: Option<String>,
    pub deletion_policy: DeletionPolicy,
    pub suspend: bool,
    /// `Manual`: a plan that changes something waits for approval (see [`crate::approval`]).
    pub approval: Approval,
    /// What a refresh does about drift.
    pub drift_policy: DriftPolicy,
    /// The `lyra.dev/approve-plan` annotation: the hash of the plan a person approved.
    pub approved: Option<String>,
    /// The `lyra.dev/reconcile-requested-at` annotation.
    pub requested_at: Option<String>,
    /// Input that cannot be read yet (a Secret that is not there): unlike a bad spec, it is
    /// retried with backoff, since creating the Secret fixes it without touching the object.
    pub unavailable: Option<String>,
}

impl Job {
    /// The package digest the job runs, if it runs a package: a new one is a change to
    /// apply even when the object itself did not change.
    pub fn digest(&self) -> Option<&str> {
        match &self.workflow {
            Ok(WorkflowRef::Package(p)) => Some(&p.0.digest),
            _ => None,
        }
    }
}

impl Job {
    /// The job a `Workflow` object asks for. `None` for an object without a namespace or name.
    pub fn from_workflow(wf: &Workflow) -> Option<Job> {
        let key = ObjectKey::new(wf.metadata.namespace.clone()?, wf.metadata.name.clone()?);
        let spec = &wf.spec;
        let data = spec.data.as_ref().map(|d| d.value("spec.data").cloned()).transpose();
        let workflow = match (&spec.workflow_name, &spec.workflow) {
            (Some(n), None) if !n.is_empty() => Ok(WorkflowRef::Named(n.clone())),
            (None, Some(body)) => body.value("spec.workflow").map(|body| WorkflowRef::Inline {
                name: key.name.clone(),
                body: body.clone(),
            }),
            (Some(_), Some(_)) => Err("set exactly one of spec.workflowName and spec.workflow, not both".to_owned()),
            _ => Err("set spec.workflowName (a workflow on the controller's load path) or spec.workflow".to_owned()),
        };
        // Data nested too deep to read makes the spec unusable, as a bad workflow does; so
        // would a name the state cannot take (the API server's names always make one).
        let (workflow, data) = match (data, lyra_core::names::check_deployment_name(&key.deployment())) {
            (Ok(data), Ok(())) => (workflow, data),
            (Err(m), _) => (Err(m), None),
            (_, Err(why)) => (Err(format!("deployment name {:?}: {why}", key.deployment())), None),
        };
        Some(Job {
            uid: wf.metadata.uid.clone(),
            generation: wf.metadata.generation,
            workflow,
            data,
            refresh_interval: spec.refresh_interval.clone(),
            deletion_policy: spec.deletion_policy,
            suspend: spec.suspend,
            approval: spec.approval,
            drift_policy: spec.drift_policy,
            approved: approved(&wf.metadata),
            requested_at: requested_at(&wf.metadata),
            unavailable: None,
            key,
        })
    }
}

/// The `lyra.dev/reconcile-requested-at` annotation of any object Lyra runs.
pub(crate) fn requested_at(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(crate::crd::RECONCILE_REQUESTED_AT))
        .cloned()
}

/// The `lyra.dev/approve-plan` annotation of any object Lyra runs.
pub(crate) fn approved(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(crate::crd::APPROVE_PLAN))
        .cloned()
}

/// An event about the object, for `kubectl describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: Reason,
    /// What was done: `Apply`, `Delete`, `Create`...
    pub action: String,
    pub message: String,
    /// The resource it is about (type, step id), when it is about one: events about different
    /// resources are then kept apart instead of folded into one series.
    pub resource: Option<(String, String)>,
}

pub type ReportError = Box<dyn std::error::Error + Send + Sync>;

/// Where a reconcile reports.
#[async_trait]
pub trait Reporter: Send + Sync {
    /// Writes the object's status. Called only when it differs from what was written (or
    /// read) last.
    async fn write_status(&self, old: &WorkflowStatus, new: &WorkflowStatus) -> Result<(), ReportError>;
    /// Publishes an event. Best effort: failures are the reporter's to log.
    async fn publish(&self, note: Note);
}

/// What the caller should do after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Reconcile again after this long (refresh interval, retry gate, periodic check).
    Requeue(Duration),
    /// Cleanup finished: release the finalizer.
    Done,
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The run failed in a way that may pass by itself; try again after `after`.
    #[error("{message}")]
    Retry { message: String, after: Duration },
    /// A retry is already scheduled; not a new failure.
    #[error("waiting to retry in {}", humantime::format_duration(*.0))]
    Wait(Duration),
    #[error("writing the status: {0}")]
    Report(#[source] ReportError),
}

impl ReconcileError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ReconcileError::Retry { .. } => "retry",
            ReconcileError::Wait(_) => "wait",
            ReconcileError::Report(_) => "status",
        }
    }
}

/// How the runtime runs jobs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where `workflowName`s are looked up.
    pub load_path: PathBuf,
    /// Provider operations at once within one run.
    pub concurrency: usize,
    /// The state lease's time to live (a crashed controller blocks others this long).
    pub lease_ttl: Duration,
    /// While another holder has a deployment's lease, try again this often (or at its
    /// expiry, if sooner): a holder that releases early (a CLI run that ends) is noticed
    /// soon, a crashed one as soon as its lease expires.
    pub lease_poll: Duration,
    pub backoff: Backoff,
    /// How often an idle object (applied, no refresh interval; or stalled) is looked at
    /// again. Looking is cheap: it runs nothing unless something changed.
    pub idle_requeue: Duration,
    /// At most this many per-resource events per run (the rest are summarised).
    pub max_step_events: usize,
    /// A run shows in the status (phase Applying or Deleting, the lease holder) and in a
    /// start event once it has taken this long; one that ends sooner goes straight from the
    /// status before it to its outcome, which spares a status write (and the watch event it
    /// makes) and an event per run. Zero: always shown, before the run starts.
    pub show_run_after: Duration,
    /// This replica's name (`--identity`), added to the lease owner so that a refusal
    /// names the replica holding the lease (`controller/<ns>/<name>@<instance>`).
    pub instance: Option<String>,
}

impl Settings {
    pub fn new(load_path: impl Into<PathBuf>) -> Settings {
        Settings {
            load_path: load_path.into(),
            concurrency: 16,
            lease_ttl: lease::DEFAULT_TTL,
            lease_poll: Duration::from_secs(5),
            backoff: Backoff::default(),
            idle_requeue: Duration::from_secs(3600),
            max_step_events: 50,
            show_run_after: Duration::from_millis(250),
            instance: None,
        }
    }
}

/// What the runtime remembers of an object's last run, keyed by deployment. It decides
/// whether a reconcile runs anything, so the reconciles that our own status writes trigger
/// (and a lagging cache) never cause a new run or defeat the backoff.
#[derive(Debug, Clone)]
struct Memo {
    uid: Option<String>,
    generation: Option<i64>,
    digest: Option<String>,
    requested_at: Option<String>,
    /// The approval annotation seen: a new one is a reason to plan again.
    approved: Option<String>,
    at: Instant,
    outcome: MemoOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum MemoOutcome {
    Applied,
    /// A plan waits for approval: planned again when the object (or its approval) changes,
    /// or at the refresh interval.
    Awaiting,
    Stalled,
    Failed {
        attempts: u32,
        next_at: Instant,
    },
    DeleteFailed {
        attempts: u32,
        next_at: Instant,
    },
    /// Refused the deployment's lease: try again when it expires. Not a failure, so the
    /// backoff's attempt count is only carried over, not increased.
    Locked {
        attempts: u32,
        next_at: Instant,
    },
    /// Cleanup finished. A reconcile queued before the finalizer went may still bring the
    /// object, as the watch cache last saw it; this tombstone makes it a no-op instead of a
    /// second (empty) delete run.
    Deleted,
}

/// How long a tombstone is kept: far longer than a watch cache lags.
const TOMBSTONE_TTL: Duration = Duration::from_secs(600);

impl Memo {
    /// Whether this memo is about the job's object: the same incarnation of the name.
    fn is_for(&self, job: &Job) -> bool {
        self.uid == job.uid
    }
}

/// Whether to run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Run,
    /// Not yet: a retry or refresh is due after this long.
    Wait(Duration),
    /// Nothing to do until something changes.
    Idle,
}

/// Runs jobs against the providers and the shared state.
pub struct Runtime {
    providers: Arc<Providers>,
    store: Arc<dyn Store>,
    settings: Settings,
    load_path: LoadPath,
    metrics: Arc<Metrics>,
    memo: Mutex<HashMap<String, Memo>>,
    /// When `memo` was last rid of old tombstones.
    swept: Mutex<Option<Instant>>,
    /// The last program loaded for each named workflow that calls no other, by name: parsing
    /// the same file again on each reconcile was 6% of the controller's CPU in a backlog.
    programs: Mutex<HashMap<String, Arc<Parsed>>>,
    shutdown: watch::Sender<bool>,
}

/// A workflow file as it was read (display path and text) and the program loaded from it,
/// with the sources its positions point into.
struct Parsed {
    main: (String, String),
    program: Program,
    sources: Sources,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The status as last written, and the reporter to write changes to.
struct Tracker<'r> {
    written: WorkflowStatus,
    status: WorkflowStatus,
    reporter: &'r dyn Reporter,
}

impl<'r> Tracker<'r> {
    /// Starts from the status as last written (none yet: empty).
    fn new(current: Option<&WorkflowStatus>, reporter: &'r dyn Reporter) -> Tracker<'r> {
        let written = current.cloned().unwrap_or_default();
        Tracker {
            status: written.clone(),
            written,
            reporter,
        }
    }

    async fn flush(&mut self) -> Result<(), ReconcileError> {
        if self.status != self.written {
            self.reporter
                .write_status(&self.written, &self.status)
                .await
                .map_err(ReconcileError::Report)?;
            self.written = self.status.clone();
        }
        Ok(())
    }
}

impl Runtime {
    pub fn new(providers: Arc<Providers>, store: Arc<dyn Store>, settings: Settings, metrics: Arc<Metrics>) -> Runtime {
        Runtime {
            providers,
            store,
            load_path: LoadPath::new(&settings.load_path),
            settings,
            metrics,
            memo: Mutex::new(HashMap::new()),
            swept: Mutex::new(None),
            programs: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The providers' resource schemas, to load workflows with.
    pub fn schemas(&self) -> &lyra_core::schema::SchemaRegistry {
        self.providers.schemas()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Stops runs in progress from starting further steps (running ones finish and are
    /// recorded, leases are released), and new runs from starting.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Remembers that the object's cleanup is done (see [`MemoOutcome::Deleted`]), and
    /// drops tombstones old enough that no reconcile can still be about them.
    fn forget(&self, job: &Job) {
        {
            // Swept now and then, not at every cleanup: that was quadratic in mass deletions.
            let mut swept = self.swept.lock().expect("sweep lock");
            if swept.is_none_or(|at| at.elapsed() >= TOMBSTONE_TTL / 4) {
                let mut memo = self.memo.lock().expect("memo lock");
                memo.retain(|_, m| !(m.outcome == MemoOutcome::Deleted && m.at.elapsed() > TOMBSTONE_TTL));
                *swept = Some(Instant::now());
            }
        }
        self.remember(job, MemoOutcome::Deleted);
        self.metrics.phase(&job.key.deployment(), None);
    }

    /// Brings the object's deployment to its workflow (or decides nothing needs doing).
    pub async fn apply(
        &self,
        job: &Job,
        current: Option<&WorkflowStatus>,
        reporter: &dyn Reporter,
    ) -> Result<Next, ReconcileError> {
        let mut t = Tracker::new(current, reporter);
        let result = self.apply_inner(job, &mut t).await;
        self.metrics.phase(&job.key.deployment(), t.written.phase);
        result
    }

    async fn apply_inner(&self, job: &Job, t: &mut Tracker<'_>) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        if job.suspend {
            judge(&mut t.status, &Verdict::Suspended, job.generation, &now);
            t.flush().await?;
            return Ok(Next::Requeue(self.settings.idle_requeue));
        }
        let refresh = match parse_interval(job.refresh_interval.as_deref()) {
            Ok(r) => r,
            Err(m) => {
                return self
                    .fail(job, t, Failure::new(Reason::InvalidSpec, m), Phase::Failed, false)
                    .await;
            }
        };
        let memo = self.memo.lock().expect("memo lock").get(&job.key.deployment()).cloned();
        match decide(
            job,
            Some(&t.status),
            memo.as_ref(),
            refresh,
            Instant::now(),
            Timestamp::now(),
        ) {
            Decision::Run => {}
            Decision::Wait(d) => return Ok(Next::Requeue(d)),
            Decision::Idle => return Ok(Next::Requeue(self.settings.idle_requeue)),
        }
        if self.shutting_down() {
            return Ok(Next::Requeue(Duration::from_secs(1)));
        }

        if let Some(m) = &job.unavailable {
            return self
                .fail(
                    job,
                    t,
                    Failure::new(Reason::InputUnavailable, m.clone()),
                    Phase::Failed,
                    false,
                )
                .await;
        }
        // A refresh of an applied spec: what to do about drift is the policy's to say.
        if job.drift_policy != DriftPolicy::Correct && refresh_only(job, &t.status) {
            return self.check_drift(job, t, refresh, &now).await;
        }
        // Load and validate before touching anything: bad input is terminal.
        let Prepared {
            name,
            program,
            data,
            sources,
            origin,
        } = match self.prepare(job).await {
            Ok(prepared) => prepared,
            Err(failure) => return self.fail(job, t, failure, Phase::Failed, false).await,
        };
        let deployment = job.key.deployment();
        let owner = job.key.owner();
        t.status.workflow = Some(name.clone());
        t.status.deployment = Some(deployment.clone());
        let cancel = Arc::new(AtomicBool::new(false));
        let (tr, cancel_ref, sources_ref, name_ref) = (&mut *t, &cancel, &sources, &name);
        // The run borrows these; they are used again after it.
        let (deployment, now) = (&deployment, &now);
        let ran = self
            .under_lease(job, "apply", &cancel, |leased| async move {
                // Planned under the lease, so the state the hash covers is the state the
                // apply starts from.
                let approved = match job.approval {
                    Approval::Automatic => None,
                    Approval::Manual => {
                        let inputs = Gate {
                            name: name_ref,
                            program: &program,
                            data: &data,
                            sources: sources_ref,
                        };
                        match self.gate(job, &leased, &inputs, cancel_ref).await {
                            Ok(approved) => approved,
                            Err(held) => return Ok(held),
                        }
                    }
                };
                let message = format!("applying workflow {name_ref} to deployment {deployment}");
                let forward = self.forward_shutdown(cancel_ref);
                let engine = self.engine(leased.recorder(), sources_ref, cancel_ref);
                let run = engine.apply(&program, deployment, &data, &owner);
                let result = self.running(tr, job, &leased, false, now, message, run).await?;
                forward.abort();
                Ok::<_, ReconcileError>(Gated::Ran(result, approved))
            })
            .await;
        let (gated, kept) = match ran {
            Ok(ran) => ran,
            Err(Refusal::Held(holder)) => return self.wait_for_lease(job, t, &holder, false).await,
            Err(Refusal::Store(message)) => {
                return self
                    .fail(
                        job,
                        t,
                        Failure::new(Reason::StateUnavailable, message),
                        Phase::Failed,
                        false,
                    )
                    .await;
            }
        };
        t.status.lease_holder = None;
        let (result, approved) = match gated? {
            Gated::Ran(result, approved) => (result, approved),
            Gated::Held(plan) => return self.hold(job, t, *plan, refresh).await,
            Gated::PlanFailed(Ok(report)) => {
                let message = status::first_failure(&report).unwrap_or_else(|| "the plan failed".to_owned());
                // As for an apply: refusals only wait for a change, anything else is retried.
                let failed: Vec<&StepReport> = report.steps.iter().filter(|s| s.status == Status::Failed).collect();
                let reason = if !failed.is_empty() && failed.iter().all(|s| s.refused) {
                    Reason::ProviderRefused
                } else {
                    Reason::PlanFailed
                };
                let message = format!("planning for approval: {}", origin.rewrite(&message));
                return self
                    .fail(job, t, Failure::new(reason, message), Phase::Failed, false)
                    .await;
            }
            Gated::PlanFailed(Err(e)) => (Err(e), None),
        };
        // A write refused because the lease was no longer ours is a lost lease, not a store
        // failure.
        let result = match result {
            Err(EngineError::Store(e)) if fenced(&e) => {
                tracing::warn!(deployment = %deployment, error = %e, "a write was refused: the lease was lost");
                return self
                    .fail(
                        job,
                        t,
                        Failure::new(Reason::Interrupted, LEASE_LOST.to_owned()),
                        Phase::Failed,
                        true,
                    )
                    .await;
            }
            other => other,
        };

        let mut report = match result {
            Ok(r) => r,
            Err(e) => {
                let failure = engine_failure(e, |d| origin.with_data_notes(diagnostics_text(d, &sources, &origin)));
                return self.fail(job, t, failure, Phase::Failed, true).await;
            }
        };
        // Step errors name the place in the workflow: for an inline one, its field path.
        for step in &mut report.steps {
            if let Some(e) = step.error.as_mut() {
                *e = origin.rewrite(e);
            }
        }
        self.record_run(t, &report, true);
        self.step_events(t.reporter, &report).await;
        if report.outcome == Outcome::Succeeded && kept {
            (t.status.returns, t.status.returns_omitted) = status::fit_returns(&report, status::RETURNS_BUDGET);
            t.status.last_handled_reconcile_at = job.requested_at.clone();
            t.status.digest = job.digest().map(str::to_owned);
            if approved.is_some() {
                t.status.applied_plan = approved;
            }
            status::drift_corrected(&mut t.status, job.generation, now);
            self.metrics.drift(deployment, 0);
            judge(&mut t.status, &Verdict::Applied, job.generation, now);
            self.remember(job, MemoOutcome::Applied);
            t.flush().await?;
            t.reporter
                .publish(note(
                    false,
                    Reason::Applied,
                    "Apply",
                    format!("applied: {}", status::changes_text(&report.counts)),
                ))
                .await;
            return Ok(Next::Requeue(refresh.unwrap_or(self.settings.idle_requeue)));
        }
        if report.outcome == Outcome::Cancelled || !kept {
            let why = if kept {
                "the run was interrupted (the controller is shutting down); it resumes on the next run"
            } else {
                LEASE_LOST
            };
            return self
                .fail(
                    job,
                    t,
                    Failure::new(Reason::Interrupted, why.to_owned()),
                    Phase::Failed,
                    true,
                )
                .await;
        }
        let message = status::first_failure(&report).unwrap_or_else(|| "the apply failed".to_owned());
        // Only refusals (bad settings, a disabled provider, a value it cannot take): the
        // same input fails the same way, so wait for a change instead of retrying.
        let failed: Vec<&StepReport> = report.steps.iter().filter(|s| s.status == Status::Failed).collect();
        let reason = if !failed.is_empty() && failed.iter().all(|s| s.refused) {
            Reason::ProviderRefused
        } else {
            Reason::ApplyFailed
        };
        self.fail(job, t, Failure::new(reason, message), Phase::Failed, true)
            .await
    }

    /// A refresh under `driftPolicy: Report` or `Ignore`. Report reads every resource and
    /// says in the `Drifted` condition (an event when it changes, and the metric) what
    /// changed outside Lyra, changing nothing and taking no lease; Ignore does nothing. Both
    /// wait for the next refresh.
    async fn check_drift(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        refresh: Option<Duration>,
        now: &Time,
    ) -> Result<Next, ReconcileError> {
        let next = Next::Requeue(refresh.unwrap_or(self.settings.idle_requeue));
        if job.drift_policy == DriftPolicy::Ignore {
            self.remember(job, MemoOutcome::Applied);
            return Ok(next);
        }
        let deployment = job.key.deployment();
        let (cancel, sources) = (AtomicBool::new(false), Sources::default());
        let checked = self
            .engine(self.store.as_ref(), &sources, &cancel)
            .drift(&deployment, false, &job.key.owner())
            .await;
        match checked {
            Ok(report) => {
                let before = status::condition(&t.status, status::DRIFTED).map(|c| c.message.clone());
                let drifted = status::drift(&mut t.status, &report, job.generation, now);
                self.metrics.drift(&deployment, drifted);
                let after = status::condition(&t.status, status::DRIFTED).map(|c| c.message.clone());
                t.flush().await?;
                if drifted > 0 && before != after {
                    let message = after.unwrap_or_default();
                    t.reporter
                        .publish(note(true, Reason::Drifted, "CheckDrift", message))
                        .await;
                }
            }
            Err(e) => {
                // The state could not be read: said, and tried again at the next refresh.
                tracing::warn!(deployment = %deployment, error = %e, "drift check failed");
                t.reporter
                    .publish(note(
                        true,
                        Reason::DriftCheckFailed,
                        "CheckDrift",
                        format!("drift check failed: {e}"),
                    ))
                    .await;
            }
        }
        self.remember(job, MemoOutcome::Applied);
        Ok(next)
    }

    /// `approval: Manual`, under the deployment's lease: plans, and says whether to apply.
    /// `Ok(None)`: the plan changes nothing, so needs no approval; `Ok(Some(hash))`: the
    /// object approves exactly this plan; `Err`: nothing is to be applied (the plan waits,
    /// or planning failed).
    async fn gate(
        &self,
        job: &Job,
        leased: &Leased,
        g: &Gate<'_>,
        cancel: &AtomicBool,
    ) -> Result<Option<String>, Gated> {
        let deployment = job.key.deployment();
        let recorder = leased.recorder();
        let state = recorder
            .load(&deployment)
            .await
            .map_err(|e| Gated::PlanFailed(Err(EngineError::Store(e))))?;
        let plan = self
            .engine(recorder, g.sources, cancel)
            .plan(g.program, &deployment, g.data)
            .await
            .map_err(|e| Gated::PlanFailed(Err(e)))?;
        if plan.failed() {
            return Err(Gated::PlanFailed(Ok(plan)));
        }
        if !approval::changes_anything(&plan) {
            return Ok(None);
        }
        let inputs = PlanInputs {
            deployment: &deployment,
            workflow: g.name,
            digest: job.digest(),
            sources: g.sources,
            data: g.data,
            state: state.as_ref(),
        };
        let hash = approval::plan_hash(recorder.store_id(), &plan, &inputs);
        if job.approved.as_deref() == Some(hash.as_str()) {
            return Ok(Some(hash));
        }
        Err(Gated::Held(Box::new(Held { report: plan, hash })))
    }

    /// A plan waits for approval: published in `status.plan`, with the `AwaitingApproval`
    /// condition and an event when it is new. Nothing was applied.
    async fn hold(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        held: Held,
        refresh: Option<Duration>,
    ) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        let Held { report, hash } = held;
        // An approval of the plan applied last is no approval of this one, but not stale
        // either: it simply predates this plan.
        let stale = job
            .approved
            .as_ref()
            .is_some_and(|a| *a != hash && t.status.applied_plan.as_ref() != Some(a));
        let short = approval::short_hash(&hash);
        let summary = approval::summary(&report);
        let kind = job
            .key
            .kind
            .as_ref()
            .map(|k| format!(" --kind {k}"))
            .unwrap_or_default();
        let how = format!(
            "approve it with `lyra approve {} -n {}{kind}` (sets the annotation {}={hash})",
            job.key.name,
            job.key.namespace,
            crate::crd::APPROVE_PLAN
        );
        let (reason, message) = if stale {
            (
                Reason::ApprovalStale,
                format!(
                    "the approval names another plan ({}), so nothing was applied; plan {short} awaits approval instead ({summary}): {how}",
                    approval::short_hash(job.approved.as_deref().unwrap_or_default())
                ),
            )
        } else {
            (
                Reason::PlanReady,
                format!("plan {short} awaits approval ({summary}): {how}"),
            )
        };
        let news = t.status.plan.as_ref().map(|p| &p.hash) != Some(&hash)
            || status::condition(&t.status, status::AWAITING_APPROVAL)
                .is_none_or(|c| c.status != "True" || c.reason != reason.as_str());
        t.status.plan = Some(approval::plan_status(&report, hash, job.generation));
        t.status.last_handled_reconcile_at = job.requested_at.clone();
        judge(
            &mut t.status,
            &Verdict::AwaitingApproval {
                reason,
                message: message.clone(),
            },
            job.generation,
            &now,
        );
        self.remember(job, MemoOutcome::Awaiting);
        t.flush().await?;
        if news {
            t.reporter.publish(note(stale, reason, "Plan", message)).await;
        }
        Ok(Next::Requeue(refresh.unwrap_or(self.settings.idle_requeue)))
    }

    /// Tears the deployment down (or forgets it, with `Orphan`). `Ok(Next::Done)` only when
    /// nothing is left in the state: then the finalizer may go.
    pub async fn cleanup(
        &self,
        job: &Job,
        current: Option<&WorkflowStatus>,
        reporter: &dyn Reporter,
    ) -> Result<Next, ReconcileError> {
        let mut t = Tracker::new(current, reporter);
        let result = self.cleanup_inner(job, &mut t).await;
        match &result {
            Ok(Next::Done) => self.forget(job),
            _ => self.metrics.phase(&job.key.deployment(), t.written.phase),
        }
        result
    }

    async fn cleanup_inner(&self, job: &Job, t: &mut Tracker<'_>) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        let deployment = job.key.deployment();
        let memo = self.memo.lock().expect("memo lock").get(&deployment).cloned();
        if let Some(m) = memo.filter(|m| m.is_for(job)) {
            match m.outcome {
                // Already cleaned up: this reconcile is about the object as a lagging
                // cache still holds it. Only the finalizer may be left to remove.
                MemoOutcome::Deleted => return Ok(Next::Done),
                MemoOutcome::DeleteFailed { next_at, .. } | MemoOutcome::Locked { next_at, .. }
                    if next_at > Instant::now() =>
                {
                    return Err(ReconcileError::Wait(next_at - Instant::now()));
                }
                _ => {}
            }
        }
        if self.shutting_down() {
            return Err(ReconcileError::Wait(Duration::from_secs(1)));
        }
        let owner = job.key.owner();
        let cancel = Arc::new(AtomicBool::new(false));
        let (tr, cancel_ref) = (&mut *t, &cancel);
        // The run borrows these; they are used again after it.
        let (deployment, now) = (&deployment, &now);
        let ran = self
            .under_lease(job, "delete", &cancel, |leased| async move {
                if job.deletion_policy == DeletionPolicy::Orphan {
                    // Dropping the deployment takes its lease with it: the release finds it gone.
                    return Ok(Cleanup::Orphaned(self.store.drop_deployment(deployment).await));
                }
                // Under the lease, the state says whether there is anything to delete. Nothing
                // (never applied, or cleaned up by a run whose finalizer removal did not happen):
                // no run, no history entry, only the finalizer to remove.
                match self.store.load(deployment).await {
                    Ok(state) if state.as_ref().is_none_or(|s| s.resources.is_empty()) => return Ok(Cleanup::Nothing),
                    Ok(_) => {}
                    Err(e) => return Ok(Cleanup::Unavailable(e)),
                }
                tr.status.deployment = Some(deployment.clone());
                let message = format!("deleting the resources of deployment {deployment}");
                let forward = self.forward_shutdown(cancel_ref);
                let sources = Sources::default();
                let engine = self.engine(leased.recorder(), &sources, cancel_ref);
                let run = engine.delete(deployment, &owner);
                let result = self.running(tr, job, &leased, true, now, message, run).await?;
                forward.abort();
                Ok::<_, ReconcileError>(Cleanup::Ran(result))
            })
            .await;
        let (cleanup, _kept) = match ran {
            Ok(ran) => ran,
            Err(Refusal::Held(holder)) => return self.wait_for_lease(job, t, &holder, true).await,
            Err(Refusal::Store(message)) => {
                return self
                    .fail(
                        job,
                        t,
                        Failure::new(Reason::StateUnavailable, message),
                        Phase::Deleting,
                        false,
                    )
                    .await;
            }
        };
        let result = match cleanup? {
            Cleanup::Orphaned(Ok(_)) => {
                t.reporter
                    .publish(note(
                        false,
                        Reason::Orphaned,
                        "Delete",
                        format!("deletionPolicy Orphan: resources left in place; deployment {deployment} forgotten"),
                    ))
                    .await;
                return Ok(Next::Done);
            }
            Cleanup::Nothing => return Ok(Next::Done),
            Cleanup::Orphaned(Err(e)) | Cleanup::Unavailable(e) => {
                return self.fail(job, t, Failure::store(&e), Phase::Deleting, true).await;
            }
            Cleanup::Ran(result) => result,
        };
        t.status.lease_holder = None;
        let report = match result {
            Ok(r) => r,
            Err(e) => {
                let failure = engine_failure(e, |d| diagnostics_text(d, &Sources::default(), &Origin::of(job)));
                return self.fail(job, t, failure, Phase::Deleting, true).await;
            }
        };
        self.record_run(t, &report, false);
        self.step_events(t.reporter, &report).await;
        // Only what the state says counts: the finalizer goes when nothing is recorded.
        let left = match self.store.load(deployment).await {
            // Records the store cannot read still stand for resources.
            Ok(state) => state.map_or(0, |s| s.resources.len() + s.unreadable.len()),
            Err(e) => {
                return self.fail(job, t, Failure::store(&e), Phase::Deleting, true).await;
            }
        };
        if left == 0 && !report.failed() {
            t.reporter
                .publish(note(
                    false,
                    Reason::Deleted,
                    "Delete",
                    format!("deleted: {}", status::changes_text(&report.counts)),
                ))
                .await;
            return Ok(Next::Done);
        }
        let message = status::first_failure(&report)
            .unwrap_or_else(|| format!("{left} resource(s) are still recorded for {deployment}"));
        self.fail(
            job,
            t,
            Failure::new(Reason::DeleteFailed, message),
            Phase::Deleting,
            true,
        )
        .await
    }

    /// A job's input, loaded and checked: the workflow found, read and valid, the data
    /// expanded and bound to the top-level parameters. The one judgement of input, shared by
    /// a run and by admission ([`crate::admission`]), so an object the webhook lets in is one
    /// the reconciler does not stall, and the other way round. `Err` is terminal.
    pub(crate) async fn prepare(&self, job: &Job) -> Result<Prepared, Failure> {
        let mut sources = Sources::default();
        let mut origin = Origin::of(job);
        let (name, program) = self.load(job, &mut sources, &mut origin)?;
        let data = crate::data::expand(job.data.as_ref())
            .map_err(|m| Failure::new(Reason::InvalidData, origin.with_data_notes(m)))?;
        self.bind_parameters(&program, &data, &sources, &origin)?;
        Ok(Prepared {
            name,
            program,
            data,
            sources,
            origin,
        })
    }

    /// Binds the data to the workflow's top-level parameters as a run does, by the engine's
    /// own code, so a data problem is found before the lease is taken (and without one, at
    /// admission). Sensitive values never reach the message.
    fn bind_parameters(
        &self,
        program: &Program,
        data: &Map,
        sources: &Sources,
        origin: &Origin,
    ) -> Result<(), Failure> {
        let cancel = AtomicBool::new(false);
        // The engine only binds: no state is read or written.
        let none = lyra_state::EmptyState {
            location: "(none: parameters only)".to_owned(),
        };
        let engine = self.engine(&none, sources, &cancel);
        match engine.check_parameters(program, data) {
            Err(EngineError::Input(d)) => {
                let text = origin.with_data_notes(diagnostics_text(&d, sources, origin));
                Err(Failure::new(
                    Reason::InvalidData,
                    sensitive_data(program, data).scrub(&text),
                ))
            }
            Err(EngineError::Store(e)) => Err(Failure::store(&e)),
            Ok(()) => Ok(()),
        }
    }

    /// Resolves and validates the workflow. `Err((reason, message))` is terminal.
    /// An inline workflow is rendered to YAML (see [`crate::inline`]); `origin` then says how
    /// its positions map back to the object.
    fn load(&self, job: &Job, sources: &mut Sources, origin: &mut Origin) -> Result<(String, Program), Failure> {
        let (name, main) = match &job.workflow {
            Err(m) => return Err(Failure::new(Reason::InvalidSpec, m.clone())),
            // The name is checked and resolved strictly inside the load path: a refused file
            // is never read, so nothing of it can reach the status or an event.
            Ok(WorkflowRef::Named(n)) => match self.load_path.read(n) {
                Ok(main) => return self.load_named(n, main, sources, origin),
                // Exists but is unreadable or not UTF-8: say so, at the offending byte.
                Err(e @ lyra_host::LookupError::Read { .. }) => {
                    let d = e.diagnostics(sources);
                    return Err(Failure::new(
                        Reason::InvalidWorkflow,
                        diagnostics_text(&d, sources, origin),
                    ));
                }
                Err(e @ lyra_host::LookupError::NotFound { .. }) => {
                    return Err(Failure::new(
                        lookup_reason(&e),
                        format!("workflow '{n}' not found on the controller's load path: {e}"),
                    ));
                }
                Err(e) => return Err(Failure::new(lookup_reason(&e), format!("spec.workflowName: {e}"))),
            },
            Ok(WorkflowRef::Inline { name, body }) => {
                if !body.is_object() {
                    return Err(Failure::new(
                        Reason::InvalidSpec,
                        "spec.workflow must be a mapping (a workflow)",
                    ));
                }
                let rendered = inline::render(body);
                let file = format!("{}/{} spec.workflow", job.key.namespace, job.key.name);
                let text = rendered.text.clone();
                origin.inline = Some((file.clone(), rendered));
                (name.clone(), (file, text))
            }
            // Calls resolve within the package only: it is the unit that was registered.
            Ok(WorkflowRef::Package(p)) => {
                let package = &p.0;
                let name = package.pinned_name();
                return lyra_core::program::load(
                    &package.manifest.name,
                    package.main(),
                    &mut package.source(),
                    sources,
                    self.providers.schemas(),
                )
                .map(|p| (name, p))
                .map_err(|d| Failure::new(Reason::InvalidWorkflow, diagnostics_text(&d, sources, origin)));
            }
        };
        lyra_host::load_program(&name, main, &self.load_path, self.providers.schemas(), sources)
            .map(|p| (name, p))
            .map_err(|d| Failure::new(Reason::InvalidWorkflow, diagnostics_text(&d, sources, origin)))
    }

    /// Loads the named workflow `name` from `main` (its file, as just read), or takes the
    /// program last loaded from exactly that file. Only a workflow that calls no other is
    /// kept: its program depends on nothing but its own text (and the providers' schemas,
    /// fixed for the runtime's life), so a kept one is what loading it again would give.
    fn load_named(
        &self,
        name: &str,
        main: (String, String),
        sources: &mut Sources,
        origin: &Origin,
    ) -> Result<(String, Program), Failure> {
        // Kept positions point into the kept sources, so those replace `sources`: only when
        // it is empty, as `prepare` passes it.
        let fresh = sources.files().is_empty();
        let kept = self.programs.lock().expect("programs lock").get(name).cloned();
        if let Some(kept) = kept.filter(|k| fresh && k.main == main) {
            *sources = kept.sources.clone();
            return Ok((name.to_owned(), kept.program.clone()));
        }
        let program = lyra_host::load_program(name, main.clone(), &self.load_path, self.providers.schemas(), sources)
            .map_err(|d| Failure::new(Reason::InvalidWorkflow, diagnostics_text(&d, sources, origin)))?;
        if fresh && sources.files().len() == 1 {
            let parsed = Parsed {
                main,
                program: program.clone(),
                sources: sources.clone(),
            };
            self.programs
                .lock()
                .expect("programs lock")
                .insert(name.to_owned(), Arc::new(parsed));
        }
        Ok((name.to_owned(), program))
    }

    /// Who holds a deployment's lease while this runtime runs it: the object's actor name,
    /// and this replica's, so a refusal says which replica holds it.
    fn lease_owner(&self, job: &Job) -> String {
        match &self.settings.instance {
            Some(instance) => format!("{}@{instance}", job.key.owner()),
            None => job.key.owner(),
        }
    }

    /// Runs `run`, an engine call under `leased`. The status and a start event show it (see
    /// [`Settings::show_run_after`]) before it starts, or once it has taken that long: then
    /// its write goes on while the run does, and a failed write is only logged, since the
    /// run's outcome is written next anyway. A quick run has no start event: the events of
    /// its outcome follow at once and say what it did.
    #[expect(clippy::too_many_arguments, reason = "the parts of a run's start, each needed")]
    async fn running<T>(
        &self,
        t: &mut Tracker<'_>,
        job: &Job,
        leased: &Leased,
        deleting: bool,
        now: &Time,
        message: String,
        run: impl Future<Output = T>,
    ) -> Result<T, ReconcileError> {
        let (reason, action) = if deleting {
            (Reason::Deleting, "Delete")
        } else {
            (Reason::Applying, "Apply")
        };
        let show = |t: &mut Tracker<'_>| {
            t.status.lease_holder = Some(leased.lease().owner.clone());
            judge(&mut t.status, &Verdict::Running { deleting }, job.generation, now);
        };
        if self.settings.show_run_after.is_zero() {
            show(t);
            t.flush().await?;
            t.reporter.publish(note(false, reason, action, message)).await;
            return Ok(run.await);
        }
        let mut run = std::pin::pin!(run);
        if let Ok(done) = tokio::time::timeout(self.settings.show_run_after, &mut run).await {
            return Ok(done);
        }
        show(t);
        t.reporter.publish(note(false, reason, action, message)).await;
        let (done, shown) = tokio::join!(run, t.flush());
        if let Err(e) = shown {
            tracing::warn!(deployment = %job.key.deployment(), error = %e, "could not show the run in the status");
        }
        Ok(done)
    }

    /// The engine of a run, recording through `recorder`.
    fn engine<'a>(&'a self, recorder: &'a dyn Recorder, sources: &'a Sources, cancel: &'a AtomicBool) -> Engine<'a> {
        Engine {
            providers: &self.providers,
            store: recorder,
            observer: &Quiet,
            sources,
            concurrency: self.settings.concurrency,
            cancel,
            hints: &lyra_host::Advice,
            timer: &TokioTimer,
            leave_to_exit: false,
        }
    }

    /// Runs `run` under the deployment's lease ([`lease::run_under_lease`]), taken as this
    /// replica and refused at once when held (the reconcile is then requeued for when it
    /// expires, see [`Runtime::wait_for_lease`]). Returns what `run` returned and whether the
    /// lease was still ours at the end, or why it was not taken.
    async fn under_lease<T, F, Fut>(
        &self,
        job: &Job,
        operation: &str,
        cancel: &Arc<AtomicBool>,
        run: F,
    ) -> Result<(T, bool), Refusal>
    where
        F: FnOnce(Leased) -> Fut,
        Fut: Future<Output = T>,
    {
        let options = LeaseOptions {
            owner: self.lease_owner(job),
            operation: operation.to_owned(),
            ttl: self.settings.lease_ttl,
            wait: None,
            // An apply or a delete records one run and writes nothing after it.
            release_at_finish: true,
            // A successor replica runs in another pod: it waits for the time to live.
            name_holder: false,
        };
        let ran = lease::run_under_lease(&self.store, &job.key.deployment(), &options, cancel, |_| {}, run)
            .await
            .map_err(|e| match e {
                LeaseError::Held(h) | LeaseError::TimedOut { holder: h, .. } => Refusal::Held(h),
                LeaseError::Store(_) | LeaseError::Cancelled(_) => Refusal::Store(format!("state store: {e}")),
            })?;
        if let Err(e) = &ran.released {
            tracing::warn!(error = %e, "could not release the lease; it expires by itself");
        }
        let kept = !ran.lost();
        Ok((ran.value, kept))
    }

    /// Someone else holds the deployment's lease (the CLI, or a crashed replica whose lease
    /// has not expired yet). Not an error to back off from: the run is tried again just after
    /// the lease expires (or sooner, every `lease_poll`, in case it is released), and
    /// meanwhile the status names the holder and the expiry.
    async fn wait_for_lease(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        holder: &Lease,
        deleting: bool,
    ) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        let after = until_expiry(holder.expires, now_ms()).min(self.settings.lease_poll);
        let message = format!(
            "waiting for the lease of deployment {}: {}; retrying then",
            holder.deployment,
            lease::describe(holder)
        );
        t.status.lease_holder = Some(holder.owner.clone());
        judge(
            &mut t.status,
            &Verdict::WaitingForLease {
                message: message.clone(),
                deleting,
            },
            job.generation,
            &now,
        );
        let previous = self.memo.lock().expect("memo lock").get(&job.key.deployment()).cloned();
        let (attempts, already_waiting) = match previous.filter(|m| m.is_for(job) && m.generation == job.generation) {
            Some(Memo {
                outcome: MemoOutcome::Failed { attempts, .. } | MemoOutcome::DeleteFailed { attempts, .. },
                ..
            }) => (attempts, false),
            Some(Memo {
                outcome: MemoOutcome::Locked { attempts, .. },
                ..
            }) => (attempts, true),
            _ => (0, false),
        };
        self.remember(
            job,
            MemoOutcome::Locked {
                attempts,
                next_at: Instant::now() + after,
            },
        );
        if already_waiting {
            tracing::debug!(deployment = %holder.deployment, holder = %holder.owner, "the deployment's lease is still held");
        } else {
            tracing::info!(
                deployment = %holder.deployment,
                holder = %holder.owner,
                expires = %lease::utc(holder.expires),
                "the deployment's lease is held; retrying when it expires"
            );
        }
        t.flush().await?;
        if !already_waiting {
            t.reporter
                .publish(note(
                    false,
                    Reason::Locked,
                    if deleting { "Delete" } else { "Apply" },
                    message,
                ))
                .await;
        }
        Ok(Next::Requeue(after))
    }

    /// Sets `cancel` when the runtime shuts down, until aborted.
    fn forward_shutdown(&self, cancel: &Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        let mut rx = self.shutdown.subscribe();
        let cancel = Arc::clone(cancel);
        tokio::spawn(async move {
            if rx.wait_for(|down| *down).await.is_ok() {
                cancel.store(true, Ordering::SeqCst);
            }
        })
    }

    /// Step rows, progress and the last run's summary from a report.
    fn record_run(&self, t: &mut Tracker<'_>, report: &Report, apply: bool) {
        if apply {
            let rows = status::step_rows(&t.status.steps, report);
            t.status.progress = Some(status::progress(&rows));
            let (rows, omitted) = status::fit_rows(rows, status::STEP_ROWS_BUDGET);
            t.status.steps = rows;
            t.status.steps_omitted = i32::try_from(omitted).unwrap_or(i32::MAX);
        }
        t.status.last_run = Some(RunSummary {
            id: report.run,
            operation: if apply { "apply" } else { "delete" }.to_owned(),
            outcome: report.outcome.as_str().to_owned(),
            time: Time(Timestamp::now()),
            changes: Some(status::changes_text(&report.counts)),
        });
        let c = &report.counts;
        for (action, n) in [
            ("create", c.created),
            ("update", c.updated),
            ("replace", c.replaced),
            ("delete", c.deleted),
        ] {
            self.metrics.steps(action, u64::from(n));
        }
    }

    /// The run's resource changes as events: one per kind of change (created, updated,
    /// replaced, deleted) naming its resources, as many as an event's note holds, and one
    /// warning per failed step, up to the configured cap. An event per changed resource made
    /// each run of ten steps ten API writes dearer, the slowest part of a reconcile.
    async fn step_events(&self, reporter: &dyn Reporter, report: &Report) {
        let resources = || report.steps.iter().filter(|s| s.type_name.is_some());
        for (action, reason) in [
            (Action::Create, Reason::Created),
            (Action::Update, Reason::Updated),
            (Action::Replace, Reason::Replaced),
            (Action::Delete, Reason::Deleted),
        ] {
            let done: Vec<String> = resources()
                .filter(|s| s.status == Status::Done && s.action == action)
                .map(resource_text)
                .collect();
            if !done.is_empty() {
                let message = listed(&done, crate::events::NOTE_LIMIT);
                reporter
                    .publish(note(false, reason, action_word(action), message))
                    .await;
            }
        }
        let failed: Vec<&StepReport> = resources().filter(|s| s.status == Status::Failed).collect();
        let extra = failed.len().saturating_sub(self.settings.max_step_events);
        for s in failed.into_iter().take(self.settings.max_step_events) {
            let message = format!("{}: {}", resource_text(s), s.error.as_deref().unwrap_or("failed"));
            reporter
                .publish(Note {
                    resource: Some((s.type_name.clone().unwrap_or_default(), s.id.clone())),
                    ..note(true, Reason::StepFailed, action_word(s.action), message)
                })
                .await;
        }
        if extra > 0 {
            reporter
                .publish(note(
                    true,
                    Reason::MoreChanges,
                    "Apply",
                    format!("and {extra} more failed steps"),
                ))
                .await;
        }
    }

    fn remember(&self, job: &Job, outcome: MemoOutcome) {
        self.memo.lock().expect("memo lock").insert(
            job.key.deployment(),
            Memo {
                uid: job.uid.clone(),
                generation: job.generation,
                digest: job.digest().map(str::to_owned),
                requested_at: job.requested_at.clone(),
                approved: job.approved.clone(),
                at: Instant::now(),
                outcome,
            },
        );
    }

    /// Handles a failure by its class (the one place that decides): bad input stalls the
    /// object until its spec changes; anything else is retried with backoff. A deletion is
    /// always retried, since its finalizer must go once the cause is fixed.
    async fn fail(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        failure: Failure,
        phase: Phase,
        ran: bool,
    ) -> Result<Next, ReconcileError> {
        if failure.class() == ErrorClass::Terminal && phase != Phase::Deleting {
            self.stall(job, t, failure).await
        } else {
            self.retry(job, t, failure, phase, ran).await
        }
    }

    /// A terminal failure: `Stalled`, and no run until the spec (or the request
    /// annotation) changes.
    async fn stall(&self, job: &Job, t: &mut Tracker<'_>, failure: Failure) -> Result<Next, ReconcileError> {
        let Failure { reason, message } = failure;
        let now = Time(Timestamp::now());
        t.status.lease_holder = None;
        t.status.last_handled_reconcile_at = job.requested_at.clone();
        if let Ok(WorkflowRef::Named(n)) = &job.workflow {
            t.status.workflow = Some(n.clone());
        }
        let verdict = Verdict::Stalled {
            reason,
            message: message.clone(),
            phase: Phase::Failed,
        };
        judge(&mut t.status, &verdict, job.generation, &now);
        self.remember(job, MemoOutcome::Stalled);
        self.metrics.failed(reason);
        t.flush().await?;
        t.reporter.publish(note(true, reason, "Validate", message)).await;
        Ok(Next::Requeue(self.settings.idle_requeue))
    }

    /// A retryable failure: recorded, and retried with backoff.
    async fn retry(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        failure: Failure,
        phase: Phase,
        ran: bool,
    ) -> Result<Next, ReconcileError> {
        let Failure { reason, message } = failure;
        let now = Time(Timestamp::now());
        let deleting = phase == Phase::Deleting;
        let previous = self.memo.lock().expect("memo lock").get(&job.key.deployment()).cloned();
        let attempts = match previous {
            Some(m) if m.is_for(job) && m.generation == job.generation => match m.outcome {
                MemoOutcome::Failed { attempts, .. }
                | MemoOutcome::DeleteFailed { attempts, .. }
                | MemoOutcome::Locked { attempts, .. } => attempts + 1,
                _ => 1,
            },
            _ => 1,
        };
        let after = self.settings.backoff.delay(attempts);
        let next_at = Instant::now() + after;
        let text = format!(
            "{message} (attempt {attempts}; retrying in {})",
            humantime::format_duration(Duration::from_secs(after.as_secs().max(1)))
        );
        let verdict = if deleting {
            // A delete that fails keeps the finalizer and needs attention: Stalled, although
            // it is retried too.
            Verdict::Stalled {
                reason,
                message: text.clone(),
                phase,
            }
        } else {
            Verdict::Retrying {
                reason,
                message: text.clone(),
                phase,
            }
        };
        judge(&mut t.status, &verdict, job.generation, &now);
        self.remember(
            job,
            if deleting {
                MemoOutcome::DeleteFailed { attempts, next_at }
            } else {
                MemoOutcome::Failed { attempts, next_at }
            },
        );
        self.metrics.failed(reason);
        t.flush().await?;
        if ran || attempts == 1 {
            t.reporter
                .publish(note(
                    true,
                    if deleting { Reason::DeleteFailed } else { reason },
                    if deleting { "Delete" } else { "Apply" },
                    text.clone(),
                ))
                .await;
        }
        Err(ReconcileError::Retry { message: text, after })
    }
}

/// Whether a reconcile should run the job now, from what this process remembers of the
/// object's last run or, after a restart, from its status.
fn decide(
    job: &Job,
    status: Option<&WorkflowStatus>,
    memo: Option<&Memo>,
    refresh: Option<Duration>,
    now: Instant,
    wall: Timestamp,
) -> Decision {
    let refreshed = |elapsed: Duration| match refresh {
        None => Decision::Idle,
        Some(r) if elapsed >= r => Decision::Run,
        Some(r) => Decision::Wait(r - elapsed),
    };
    if let Some(m) = memo.filter(|m| {
        m.is_for(job)
            && m.generation == job.generation
            && m.requested_at == job.requested_at
            && m.approved == job.approved
            && m.digest.as_deref() == job.digest()
    }) {
        return match m.outcome {
            MemoOutcome::Applied | MemoOutcome::Awaiting => refreshed(now.saturating_duration_since(m.at)),
            MemoOutcome::Stalled | MemoOutcome::Deleted => Decision::Idle,
            MemoOutcome::Failed { next_at, .. }
            | MemoOutcome::DeleteFailed { next_at, .. }
            | MemoOutcome::Locked { next_at, .. } => {
                if now >= next_at {
                    Decision::Run
                } else {
                    Decision::Wait(next_at - now)
                }
            }
        };
    }
    let Some(s) = status else { return Decision::Run };
    let handled = job.requested_at.is_none() || job.requested_at == s.last_handled_reconcile_at;
    // A package upgrade re-applies every object of the kind.
    let upgraded = job.digest().is_some() && s.digest.as_deref() != job.digest();
    if s.observed_generation != job.generation || job.generation.is_none() || !handled || upgraded {
        return Decision::Run;
    }
    if status::is_true(s, status::STALLED) && s.phase != Some(Phase::Deleting) {
        return Decision::Idle;
    }
    if s.phase == Some(Phase::Ready) && status::is_true(s, status::READY) {
        let elapsed = s
            .last_run
            .as_ref()
            .map_or(Duration::MAX, |r| wall.duration_since(r.time.0).unsigned_abs());
        return refreshed(elapsed);
    }
    // Pending, a run interrupted by a crash, or a failure from before a restart.
    Decision::Run
}

/// Whether this run is only a refresh: the spec (its package, any reconcile request) is
/// applied already and the object Ready, so all an apply could do is correct drift.
fn refresh_only(job: &Job, s: &WorkflowStatus) -> bool {
    let handled = job.requested_at.is_none() || job.requested_at == s.last_handled_reconcile_at;
    let upgraded = job.digest().is_some() && s.digest.as_deref() != job.digest();
    job.generation.is_some()
        && s.observed_generation == job.generation
        && handled
        && !upgraded
        && s.phase == Some(Phase::Ready)
        && status::is_true(s, status::READY)
}

/// The failure an engine error makes: its reason (see [`engine_reason`]), and the message,
/// with `input` saying what invalid input is (diagnostics are rendered per caller).
fn engine_failure(e: EngineError, input: impl FnOnce(&Diagnostics) -> String) -> Failure {
    let reason = engine_reason(&e);
    match e {
        EngineError::Input(d) => Failure::new(reason, input(&d)),
        EngineError::Store(e) => Failure::store(&e),
    }
}

/// `60s`, `5m`, `1h30m`.
pub fn parse_interval(s: Option<&str>) -> Result<Option<Duration>, String> {
    match s {
        None => Ok(None),
        Some(s) => match humantime::parse_duration(s) {
            Ok(d) if d >= Duration::from_secs(1) => Ok(Some(d)),
            Ok(_) => Err(format!("spec.refreshInterval '{s}' is shorter than one second")),
            Err(e) => Err(format!(
                "spec.refreshInterval '{s}' is not a duration like 60s or 5m: {e}"
            )),
        },
    }
}

/// Where a job's input came from, to say where a problem is: the inline workflow's rendering
/// (positions map to field paths), and the keys kubectl may have made from YAML 1.1 booleans.
#[derive(Debug, Default)]
pub struct Origin {
    /// The inline workflow's name in `Sources`, and its rendering.
    inline: Option<(String, inline::InlineSource)>,
    /// Boolean-looking keys in `spec.workflow` and in `spec.data`.
    workflow_booleans: Vec<inline::FieldPath>,
    data_booleans: Vec<inline::FieldPath>,
}

impl Origin {
    fn of(job: &Job) -> Origin {
        Origin {
            inline: None,
            workflow_booleans: match &job.workflow {
                Ok(WorkflowRef::Inline { body, .. }) => inline::boolean_keys(body),
                _ => Vec::new(),
            },
            data_booleans: job.data.as_ref().map(inline::boolean_keys).unwrap_or_default(),
        }
    }

    /// A diagnostic's place: a field path for the inline workflow, else `file:line:col`.
    fn locate(&self, span: lyra_core::diag::Span, sources: &Sources) -> (String, Option<inline::FieldPath>) {
        if let Some((file, rendered)) = &self.inline
            && sources.get(span.file).is_some_and(|f| &f.name == file)
        {
            let path = rendered.path_at(span.line).cloned().unwrap_or_default();
            return (path.display("spec.workflow"), Some(path));
        }
        (sources.location(span), None)
    }

    /// `text` with every `<inline file>:line:col` (the engine's step errors carry them)
    /// replaced by that line's field path.
    fn rewrite(&self, text: &str) -> String {
        let Some((file, rendered)) = &self.inline else {
            return text.to_owned();
        };
        let prefix = format!("{file}:");
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(&prefix) {
            out.push_str(&rest[..at]);
            let after = &rest[at + prefix.len()..];
            let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let line_len = digits(after);
            let col_len = after[line_len..].strip_prefix(':').map_or(0, |cols| digits(cols) + 1);
            match after[..line_len].parse::<u32>() {
                Ok(line) if line_len > 0 => {
                    let path = rendered.path_at(line).cloned().unwrap_or_default();
                    out.push_str(&path.display("spec.workflow"));
                    rest = &after[line_len + col_len..];
                }
                _ => {
                    out.push_str(&prefix);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }

    /// A data problem's message, with a note on `spec.data` keys kubectl may have made from
    /// YAML 1.1 booleans (a `lookup: y` then finds nothing under `y`).
    fn with_data_notes(&self, message: String) -> String {
        match booleans_note("spec.data", &self.data_booleans) {
            Some(note) => format!("{message}\n{note}"),
            None => message,
        }
    }
}

/// `note: ...` naming the boolean-looking keys under `root`, if any.
fn booleans_note(root: &str, keys: &[inline::FieldPath]) -> Option<String> {
    let first = keys.first()?.boolean_keys().last()?.to_owned();
    let mut paths: Vec<String> = keys.iter().take(5).map(|p| p.display(root)).collect();
    if keys.len() > 5 {
        paths.push(format!("and {} more", keys.len() - 5));
    }
    Some(format!("note: {}: {}", paths.join(", "), inline::yaml11_hint(&first)))
}

/// Every diagnostic as `place: message`, one per line: `file:line:col` in workflow files, the
/// field path (`spec.workflow.steps.web.value.port`) in an inline workflow.
pub fn diagnostics_text(d: &Diagnostics, sources: &Sources, origin: &Origin) -> String {
    let mut noted = false;
    let mut lines: Vec<String> = d
        .iter()
        .map(|d| {
            let (place, path) = origin.locate(d.span, sources);
            let mut s = format!("{place}: {}", d.message);
            if let Some(h) = &d.help {
                s.push_str(&format!(" (help: {h})"));
            }
            if let Some(key) = path.as_ref().and_then(|p| p.boolean_keys().last()) {
                s.push_str(&format!(" (note: {})", inline::yaml11_hint(key)));
                noted = true;
            }
            s
        })
        .collect();
    // A key turned into "true" may break something elsewhere (a `$y` that now names nothing).
    if !noted && let Some(note) = booleans_note("spec.workflow", &origin.workflow_booleans) {
        lines.push(note);
    }
    lines.join("\n")
}

/// What [`Runtime::prepare`] found: what a run needs.
pub(crate) struct Prepared {
    pub name: String,
    pub program: Program,
    pub data: Map,
    pub sources: Sources,
    pub origin: Origin,
}

/// The values the data gives the workflow's Sensitive parameters: a type error about one
/// would otherwise quote it.
fn sensitive_data(program: &Program, data: &Map) -> Secrets {
    let mut secrets = Secrets::default();
    for p in &program.main.root.params {
        if !p.ty.as_ref().is_some_and(lyra_core::types::Type::is_sensitive) {
            continue;
        }
        let key = match &p.source {
            ParamSource::Lookup(key) => key.as_str(),
            ParamSource::Implicit => p.name.as_str(),
            ParamSource::Value(_) => continue,
        };
        if let Some(v) = lyra_core::engine::lookup(data, key) {
            secrets.add(v);
        }
    }
    secrets
}

/// What a Manual object's plan is made from (see [`Runtime::gate`]).
struct Gate<'a> {
    name: &'a str,
    program: &'a Program,
    data: &'a Map,
    sources: &'a Sources,
}

/// A plan that waits for approval, and its hash.
struct Held {
    report: Report,
    hash: String,
}

/// What an apply under the lease came to.
enum Gated {
    /// The apply ran (and, with `approval: Manual`, the hash of the plan it was approved as).
    Ran(Result<Report, EngineError>, Option<String>),
    /// A plan waits for approval: nothing was applied.
    Held(Box<Held>),
    /// Planning for approval failed: nothing was applied.
    PlanFailed(Result<Report, EngineError>),
}

/// Why a lease was not taken.
enum Refusal {
    Held(Lease),
    Store(String),
}

/// The wall clock in Unix milliseconds (what lease expiries are measured in).
fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

/// How long to wait for a lease expiring at `expires`: until just after it, and never less
/// than a second (the store's clock may run behind ours; the retry then simply comes again).
fn until_expiry(expires: i64, now: i64) -> Duration {
    const SLACK: Duration = Duration::from_millis(250);
    let left = Duration::from_millis(u64::try_from(expires.saturating_sub(now)).unwrap_or(0));
    (left + SLACK).max(Duration::from_secs(1))
}

/// Whether a store error is a write refused because the run's lease was no longer current.
fn fenced(e: &StoreError) -> bool {
    e.kind == StoreErrorKind::LeaseLost
}

/// Why an apply that lost its lease stopped.
const LEASE_LOST: &str =
    "the deployment's lease was lost during the run (expired or broken); it resumes on the next run";

/// What a cleanup under the lease did.
enum Cleanup {
    /// `deletionPolicy: Orphan`: the deployment was dropped (or dropping it failed).
    Orphaned(Result<bool, StoreError>),
    /// Nothing is recorded: nothing to delete.
    Nothing,
    /// The state could not be read.
    Unavailable(StoreError),
    /// The delete ran.
    Ran(Result<Report, EngineError>),
}

fn note(warning: bool, reason: Reason, action: &str, message: String) -> Note {
    Note {
        warning,
        reason,
        action: action.to_owned(),
        message,
        resource: None,
    }
}

/// A resource of a run's report as events name it: type, step id and external id.
fn resource_text(s: &StepReport) -> String {
    let mut text = format!("{} {}", s.type_name.as_deref().unwrap_or_default(), s.id);
    if let Some(id) = &s.external_id {
        text.push_str(&format!(" ({id})"));
    }
    text
}

/// `items` counted and listed, as many as fit in `limit` bytes; the rest counted.
fn listed(items: &[String], limit: usize) -> String {
    let mut text = format!("{} resource{}: ", items.len(), if items.len() == 1 { "" } else { "s" });
    // Room kept for the longest tail, ", and 99999 more".
    let room = limit.saturating_sub(24);
    for (i, item) in items.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        if text.len() + sep.len() + item.len() > room {
            let left = items.len() - i;
            if i == 0 {
                return format!(
                    "{left} resource{}, named too long to list",
                    if left == 1 { "" } else { "s" }
                );
            }
            text.push_str(&format!(", and {left} more"));
            return text;
        }
        text.push_str(sep);
        text.push_str(item);
    }
    text
}

fn action_word(a: Action) -> &'static str {
    match a {
        Action::Create => "Create",
        Action::Update => "Update",
        Action::Replace => "Replace",
        Action::Delete => "Delete",
        Action::Read => "Read",
        _ => "Apply",
    }
}

#[cfg(test)]
mod tests;

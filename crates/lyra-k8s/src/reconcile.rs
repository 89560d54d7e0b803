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
use lyra_core::program::Program;
use lyra_core::provider::Providers;
use lyra_core::report::{Action, Report, Status};
use lyra_core::state::{Outcome, StateStore};
use lyra_core::value::Value;
use lyra_host::LoadPath;
use lyra_state::lease::{self, HeldLease, LeaseError, LeaseOptions};
use tokio::sync::watch;

use crate::crd::{DeletionPolicy, Phase, RunSummary, Workflow, WorkflowStatus};
use crate::metrics::Metrics;
use crate::retry::{Backoff, ErrorClass};
use crate::status::{self, Verdict, judge};

/// A Kubernetes object's place: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ObjectKey {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The state key of the object's deployment, shared with the CLI (`lyra plan --name`).
    pub fn deployment(&self) -> String {
        format!("k8s/{}/{}", self.namespace, self.name)
    }

    /// Who holds the deployment's lease while the controller runs it.
    pub fn owner(&self) -> String {
        format!("controller/{}/{}", self.namespace, self.name)
    }
}

/// Which workflow to run.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkflowRef {
    /// By name on the controller's load path.
    Named(String),
    /// Embedded in the object; `name` names it in diagnostics and the state.
    Inline { name: String, body: Value },
}

/// What to run for one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub key: ObjectKey,
    pub generation: Option<i64>,
    /// `Err`: the spec does not say which workflow (a terminal error).
    pub workflow: Result<WorkflowRef, String>,
    pub data: Option<Value>,
    pub refresh_interval: Option<String>,
    pub deletion_policy: DeletionPolicy,
    pub suspend: bool,
    /// The `lyra.dev/reconcile-requested-at` annotation.
    pub requested_at: Option<String>,
}

impl Job {
    /// The job a `Workflow` object asks for. `None` for an object without a namespace or name.
    pub fn from_workflow(wf: &Workflow) -> Option<Job> {
        let key = ObjectKey::new(wf.metadata.namespace.clone()?, wf.metadata.name.clone()?);
        let spec = &wf.spec;
        let workflow = match (&spec.workflow_name, &spec.workflow) {
            (Some(n), None) if !n.is_empty() => Ok(WorkflowRef::Named(n.clone())),
            (None, Some(body)) => Ok(WorkflowRef::Inline {
                name: key.name.clone(),
                body: body.clone(),
            }),
            (Some(_), Some(_)) => Err("set exactly one of spec.workflowName and spec.workflow, not both".to_owned()),
            _ => Err("set spec.workflowName (a workflow on the controller's load path) or spec.workflow".to_owned()),
        };
        Some(Job {
            generation: wf.metadata.generation,
            workflow,
            data: spec.data.clone(),
            refresh_interval: spec.refresh_interval.clone(),
            deletion_policy: spec.deletion_policy,
            suspend: spec.suspend,
            requested_at: wf
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::crd::RECONCILE_REQUESTED_AT))
                .cloned(),
            key,
        })
    }
}

/// An event about the object, for `kubectl describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    /// CamelCase: `Applying`, `Applied`, `Created`, `ApplyFailed`...
    pub reason: String,
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
    pub backoff: Backoff,
    /// How often an idle object (applied, no refresh interval; or stalled) is looked at
    /// again. Looking is cheap: it runs nothing unless something changed.
    pub idle_requeue: Duration,
    /// At most this many per-resource events per run (the rest are summarised).
    pub max_step_events: usize,
}

impl Settings {
    pub fn new(load_path: impl Into<PathBuf>) -> Settings {
        Settings {
            load_path: load_path.into(),
            concurrency: 16,
            lease_ttl: lease::DEFAULT_TTL,
            backoff: Backoff::default(),
            idle_requeue: Duration::from_secs(3600),
            max_step_events: 50,
        }
    }
}

/// What the runtime remembers of an object's last run, keyed by deployment. It decides
/// whether a reconcile runs anything, so the reconciles that our own status writes trigger
/// (and a lagging cache) never cause a new run or defeat the backoff.
#[derive(Debug, Clone)]
struct Memo {
    generation: Option<i64>,
    requested_at: Option<String>,
    at: Instant,
    outcome: MemoOutcome,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum MemoOutcome {
    Applied,
    Stalled,
    Failed { attempts: u32, next_at: Instant },
    DeleteFailed { attempts: u32, next_at: Instant },
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
    store: Arc<dyn StateStore>,
    settings: Settings,
    load_path: LoadPath,
    metrics: Arc<Metrics>,
    memo: Mutex<HashMap<String, Memo>>,
    shutdown: watch::Sender<bool>,
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
    pub fn new(
        providers: Arc<Providers>,
        store: Arc<dyn StateStore>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Runtime {
        Runtime {
            providers,
            store,
            load_path: LoadPath::new(&settings.load_path),
            settings,
            metrics,
            memo: Mutex::new(HashMap::new()),
            shutdown: watch::channel(false).0,
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
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

    /// Forgets what is remembered of a deleted object.
    pub fn forget(&self, key: &ObjectKey) {
        self.memo.lock().expect("memo lock").remove(&key.deployment());
        self.metrics.phase(&key.deployment(), None);
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
            Err(m) => return self.stall(job, t, "InvalidSpec", m).await,
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

        // Load and validate before touching anything: bad input is terminal.
        let mut sources = Sources::default();
        let (name, program) = match self.load(job, &mut sources) {
            Ok(loaded) => loaded,
            Err((reason, message)) => return self.stall(job, t, reason, message).await,
        };
        let data = match crate::data::expand(job.data.as_ref()) {
            Ok(d) => d,
            Err(m) => return self.stall(job, t, "InvalidData", m).await,
        };
        let deployment = job.key.deployment();
        let owner = job.key.owner();
        t.status.workflow = Some(name.clone());
        t.status.deployment = Some(deployment.clone());
        t.status.lease_holder = Some(owner.clone());
        judge(
            &mut t.status,
            &Verdict::Running { deleting: false },
            job.generation,
            &now,
        );
        t.flush().await?;
        t.reporter
            .publish(note(
                false,
                "Applying",
                "Apply",
                format!("applying workflow {name} to deployment {deployment}"),
            ))
            .await;

        let cancel = Arc::new(AtomicBool::new(false));
        let held = match self.take_lease(job, "apply", &cancel).await {
            Ok(held) => held,
            Err((holder, message)) => {
                t.status.lease_holder = holder;
                let phase = if t.written.last_run.is_some() {
                    Phase::Failed
                } else {
                    Phase::Pending
                };
                return self.retry(job, t, "Locked", message, phase, false).await;
            }
        };
        let forward = self.forward_shutdown(&cancel);
        let engine = Engine {
            providers: &self.providers,
            store: self.store.as_ref(),
            observer: &Quiet,
            sources: &sources,
            concurrency: self.settings.concurrency,
            cancel: &cancel,
        };
        let result = engine.apply(&program, &deployment, &data, &owner).await;
        forward.abort();
        let kept = release(&self.store, held).await;
        t.status.lease_holder = None;

        let report = match result {
            Ok(r) => r,
            Err(EngineError::Input(d)) => {
                return self.stall(job, t, "InvalidData", diagnostics_text(&d, &sources)).await;
            }
            Err(EngineError::Store(e)) => {
                return self
                    .retry(
                        job,
                        t,
                        "StateUnavailable",
                        format!("state store: {e}"),
                        Phase::Failed,
                        true,
                    )
                    .await;
            }
        };
        self.record_run(t, &report, true);
        self.step_events(t.reporter, &report).await;
        if report.outcome == Outcome::Succeeded && kept {
            t.status.returns = status::masked_returns(&report);
            t.status.last_handled_reconcile_at = job.requested_at.clone();
            judge(&mut t.status, &Verdict::Applied, job.generation, &now);
            self.remember(job, MemoOutcome::Applied);
            t.flush().await?;
            t.reporter
                .publish(note(
                    false,
                    "Applied",
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
                "the deployment's lease was lost during the run (expired or broken); it resumes on the next run"
            };
            return self
                .retry(job, t, "Interrupted", why.to_owned(), Phase::Failed, true)
                .await;
        }
        let message = status::first_failure(&report).unwrap_or_else(|| "the apply failed".to_owned());
        self.retry(job, t, "ApplyFailed", message, Phase::Failed, true).await
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
            Ok(_) => self.forget(&job.key),
            Err(_) => self.metrics.phase(&job.key.deployment(), t.written.phase),
        }
        result
    }

    async fn cleanup_inner(&self, job: &Job, t: &mut Tracker<'_>) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        let deployment = job.key.deployment();
        if let Some(m) = self.memo.lock().expect("memo lock").get(&deployment)
            && let MemoOutcome::DeleteFailed { next_at, .. } = m.outcome
            && next_at > Instant::now()
        {
            return Err(ReconcileError::Wait(next_at - Instant::now()));
        }
        if self.shutting_down() {
            return Err(ReconcileError::Wait(Duration::from_secs(1)));
        }
        let owner = job.key.owner();
        t.status.lease_holder = Some(owner.clone());
        t.status.deployment = Some(deployment.clone());
        judge(
            &mut t.status,
            &Verdict::Running { deleting: true },
            job.generation,
            &now,
        );
        t.flush().await?;
        let cancel = Arc::new(AtomicBool::new(false));
        let held = match self.take_lease(job, "delete", &cancel).await {
            Ok(held) => held,
            Err((holder, message)) => {
                t.status.lease_holder = holder;
                return self.retry(job, t, "Locked", message, Phase::Deleting, false).await;
            }
        };
        if job.deletion_policy == DeletionPolicy::Orphan {
            // Dropping the deployment takes its lease with it; the release below is a no-op.
            let dropped = self.store.drop_deployment(&deployment).await;
            let _ = release(&self.store, held).await;
            return match dropped {
                Ok(_) => {
                    t.reporter
                        .publish(note(
                            false,
                            "Orphaned",
                            "Delete",
                            format!(
                                "deletionPolicy Orphan: resources left in place; deployment {deployment} forgotten"
                            ),
                        ))
                        .await;
                    Ok(Next::Done)
                }
                Err(e) => {
                    t.status.lease_holder = None;
                    self.retry(
                        job,
                        t,
                        "StateUnavailable",
                        format!("state store: {e}"),
                        Phase::Deleting,
                        true,
                    )
                    .await
                }
            };
        }
        t.reporter
            .publish(note(
                false,
                "Deleting",
                "Delete",
                format!("deleting the resources of deployment {deployment}"),
            ))
            .await;
        let forward = self.forward_shutdown(&cancel);
        let sources = Sources::default();
        let engine = Engine {
            providers: &self.providers,
            store: self.store.as_ref(),
            observer: &Quiet,
            sources: &sources,
            concurrency: self.settings.concurrency,
            cancel: &cancel,
        };
        let result = engine.delete(&deployment, &owner).await;
        forward.abort();
        let _ = release(&self.store, held).await;
        t.status.lease_holder = None;
        let report = match result {
            Ok(r) => r,
            Err(e) => {
                return self
                    .retry(
                        job,
                        t,
                        "StateUnavailable",
                        format!("state store: {e}"),
                        Phase::Deleting,
                        true,
                    )
                    .await;
            }
        };
        self.record_run(t, &report, false);
        self.step_events(t.reporter, &report).await;
        // Only what the state says counts: the finalizer goes when nothing is recorded.
        let left = match self.store.load(&deployment).await {
            // Records the store cannot read still stand for resources.
            Ok(state) => state.map_or(0, |s| s.resources.len() + s.unreadable.len()),
            Err(e) => {
                return self
                    .retry(
                        job,
                        t,
                        "StateUnavailable",
                        format!("state store: {e}"),
                        Phase::Deleting,
                        true,
                    )
                    .await;
            }
        };
        if left == 0 && !report.failed() {
            t.reporter
                .publish(note(
                    false,
                    "Deleted",
                    "Delete",
                    format!("deleted: {}", status::changes_text(&report.counts)),
                ))
                .await;
            return Ok(Next::Done);
        }
        let message = status::first_failure(&report)
            .unwrap_or_else(|| format!("{left} resource(s) are still recorded for {deployment}"));
        self.retry(job, t, "DeleteFailed", message, Phase::Deleting, true).await
    }

    /// Resolves and validates the workflow. `Err((reason, message))` is terminal.
    fn load(&self, job: &Job, sources: &mut Sources) -> Result<(String, Program), (&'static str, String)> {
        let (name, main) = match &job.workflow {
            Err(m) => return Err(("InvalidSpec", m.clone())),
            Ok(WorkflowRef::Named(n)) => match self.load_path.read(n) {
                Some(main) => (n.clone(), main),
                None => {
                    return Err((
                        "WorkflowNotFound",
                        format!(
                            "workflow '{n}' not found on the controller's load path: {}",
                            self.load_path.not_found(n)
                        ),
                    ));
                }
            },
            Ok(WorkflowRef::Inline { name, body }) => {
                if !body.is_object() {
                    return Err(("InvalidSpec", "spec.workflow must be a mapping (a workflow)".to_owned()));
                }
                // Rendered back to YAML so diagnostics point at lines that look like the spec.
                let text = serde_saphyr::to_string(body)
                    .map_err(|e| ("InvalidSpec", format!("spec.workflow cannot be rendered: {e}")))?;
                let path = format!("{}/{} spec.workflow", job.key.namespace, job.key.name);
                (name.clone(), (path, text))
            }
        };
        lyra_host::load_program(&name, main, &self.load_path, self.providers.schemas(), sources)
            .map(|p| (name, p))
            .map_err(|d| ("InvalidWorkflow", diagnostics_text(&d, sources)))
    }

    /// Takes the deployment's lease. `Err((holder, message))` when refused.
    async fn take_lease(
        &self,
        job: &Job,
        operation: &str,
        cancel: &Arc<AtomicBool>,
    ) -> Result<HeldLease, (Option<String>, String)> {
        let options = LeaseOptions {
            owner: job.key.owner(),
            operation: operation.to_owned(),
            ttl: self.settings.lease_ttl,
            wait: None,
        };
        lease::acquire(
            Arc::clone(&self.store),
            &job.key.deployment(),
            &options,
            Arc::clone(cancel),
        )
        .await
        .map_err(|e| match &e {
            LeaseError::Held(h) | LeaseError::TimedOut { holder: h, .. } => (Some(h.owner.clone()), e.to_string()),
            LeaseError::Store(_) => (None, format!("state store: {e}")),
        })
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
            t.status.steps = status::step_rows(&t.status.steps, report);
            t.status.progress = Some(status::progress(&t.status.steps));
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

    /// An event per resource the run changed (or failed to), up to the configured cap.
    async fn step_events(&self, reporter: &dyn Reporter, report: &Report) {
        let mut notes: Vec<Note> = report
            .steps
            .iter()
            .filter(|s| s.type_name.is_some())
            .filter_map(|s| {
                let what = format!(
                    "{} {}{}",
                    s.type_name.as_deref().unwrap_or_default(),
                    s.id,
                    s.external_id
                        .as_deref()
                        .map(|id| format!(" ({id})"))
                        .unwrap_or_default()
                );
                let n = match (s.status, s.action) {
                    (Status::Failed, _) => note(
                        true,
                        "StepFailed",
                        action_word(s.action),
                        format!("{what}: {}", s.error.as_deref().unwrap_or("failed")),
                    ),
                    (Status::Done, Action::Create) => note(false, "Created", "Create", what),
                    (Status::Done, Action::Update) => note(false, "Updated", "Update", what),
                    (Status::Done, Action::Replace) => note(false, "Replaced", "Replace", what),
                    (Status::Done, Action::Delete) => note(false, "Deleted", "Delete", what),
                    _ => return None,
                };
                Some(Note {
                    resource: Some((s.type_name.clone().unwrap_or_default(), s.id.clone())),
                    ..n
                })
            })
            .collect();
        let extra = notes.len().saturating_sub(self.settings.max_step_events);
        notes.truncate(self.settings.max_step_events);
        for n in notes {
            reporter.publish(n).await;
        }
        if extra > 0 {
            reporter
                .publish(note(
                    false,
                    "MoreChanges",
                    "Apply",
                    format!("and {extra} more resource changes"),
                ))
                .await;
        }
    }

    fn remember(&self, job: &Job, outcome: MemoOutcome) {
        self.memo.lock().expect("memo lock").insert(
            job.key.deployment(),
            Memo {
                generation: job.generation,
                requested_at: job.requested_at.clone(),
                at: Instant::now(),
                outcome,
            },
        );
    }

    /// A terminal failure: `Stalled`, and no run until the spec (or the request
    /// annotation) changes.
    async fn stall(
        &self,
        job: &Job,
        t: &mut Tracker<'_>,
        reason: &str,
        message: String,
    ) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        t.status.lease_holder = None;
        t.status.last_handled_reconcile_at = job.requested_at.clone();
        if let Ok(WorkflowRef::Named(n)) = &job.workflow {
            t.status.workflow = Some(n.clone());
        }
        let verdict = Verdict::Stalled {
            reason: reason.to_owned(),
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
        reason: &str,
        message: String,
        phase: Phase,
        ran: bool,
    ) -> Result<Next, ReconcileError> {
        let now = Time(Timestamp::now());
        let deleting = phase == Phase::Deleting;
        let previous = self.memo.lock().expect("memo lock").get(&job.key.deployment()).cloned();
        let attempts = match previous {
            Some(m) if m.generation == job.generation => match m.outcome {
                MemoOutcome::Failed { attempts, .. } | MemoOutcome::DeleteFailed { attempts, .. } => attempts + 1,
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
                reason: reason.to_owned(),
                message: text.clone(),
                phase,
            }
        } else {
            Verdict::Retrying {
                reason: reason.to_owned(),
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
                    if deleting { "DeleteFailed" } else { reason },
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
    if let Some(m) = memo.filter(|m| m.generation == job.generation && m.requested_at == job.requested_at) {
        return match m.outcome {
            MemoOutcome::Applied => refreshed(now.saturating_duration_since(m.at)),
            MemoOutcome::Stalled => Decision::Idle,
            MemoOutcome::Failed { next_at, .. } | MemoOutcome::DeleteFailed { next_at, .. } => {
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
    if s.observed_generation != job.generation || job.generation.is_none() || !handled {
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

/// Bad input data cannot pass by itself; a state store failure may.
pub fn classify(e: &EngineError) -> ErrorClass {
    match e {
        EngineError::Input(_) => ErrorClass::Terminal,
        EngineError::Store(_) => ErrorClass::Retryable,
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

/// Every diagnostic as `file:line:col: message`, one per line.
pub fn diagnostics_text(d: &Diagnostics, sources: &Sources) -> String {
    d.iter()
        .map(|d| {
            let mut s = format!("{}: {}", sources.location(d.span), d.message);
            if let Some(h) = &d.help {
                s.push_str(&format!(" (help: {h})"));
            }
            s
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn release(store: &Arc<dyn StateStore>, held: HeldLease) -> bool {
    let ours = held.lease().clone();
    // Renewing answers "is it still ours?" atomically.
    let kept = match store.renew_lease(&ours, 1_000).await {
        Ok(renewed) => renewed.is_some(),
        Err(_) => true,
    };
    if let Err(e) = held.release().await {
        tracing::warn!(deployment = %ours.deployment, error = %e, "could not release the lease; it expires by itself");
    }
    kept
}

fn note(warning: bool, reason: &str, action: &str, message: String) -> Note {
    Note {
        warning,
        reason: reason.to_owned(),
        action: action.to_owned(),
        message,
        resource: None,
    }
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

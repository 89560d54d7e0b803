//! The planner and executor. One traversal serves both: in plan mode resource steps read and
//! diff but change nothing, and values that only an apply would produce are `Unknown`.
//!
//! Independent steps run concurrently; provider operations are bounded by a semaphore
//! (`concurrency`). A step's slot covers its provider calls and the intent recorded before a
//! create, not the record of its outcome: steps waiting for theirs to commit hold no slot, so
//! more of them share each commit (up to [`RECORDING_WINDOW`] steps between their first call
//! and their record). A step starts only when everything it reads is produced *and recorded*:
//! each resource outcome is written through the [`Recorder`] before its returns are
//! published, so a crash at any moment loses nothing. A failed step's dependents are skipped,
//! independent branches finish, and no resource of a failed or skipped step is ever deleted.
//!
//! The parts: this module is the entry points (plan, apply, delete) and the run's shared
//! state; `schedule` walks the steps (scopes, collections, calls); `bind` reads parameters
//! and returns; `resource` is a resource step's lifecycle; `delete` removes recorded
//! resources; `diff` compares desired and actual; `error` is why a step fails; `hints` is the
//! advice the caller words.

mod adopt;
mod bind;
mod config;
mod delete;
mod diff;
mod drift;
mod error;
mod hints;
mod prior;
mod resource;
mod schedule;
mod target;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::FastMap;
use crate::diag::{Diagnostic, Diagnostics, Sources, Span};
use crate::expr::Var;
use crate::model::{ParamSource, Step, StepKind};
use crate::program::Program;
use crate::provider::Providers;
use crate::report::{Action, Mode, Report, Status, StepReport};
use crate::schema::ResourceSchema;
use crate::secret::{Secrets, masked};
use crate::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, Recorder, ResourceRecord, RunEnd, RunId,
    RunReturns, RunStart, StoreError, StoreErrorKind,
};
use crate::types::Type;
use crate::value::{Map, Value, dig, too_deep, too_deep_message};

pub use adopt::{AdoptError, Adopted};
use bind::coerce_opt;
pub use config::RECORD_KEY as PROVIDER_CONFIG_KEY;
pub use diff::{PathChange, change_paths};
pub use drift::{DriftChange, DriftReport, DriftStatus, PENDING, ResourceDrift};
use error::{StepError, type_error_text};
pub use hints::Hints;
use prior::{Claims, Prior};
pub use target::{covers as target_covers, step_names as target_names};

/// Progress notifications, for live output.
pub trait Observer: Send + Sync {
    fn step_started(&self, _id: &str, _type_name: &str) {}
    fn step_finished(&self, _report: &StepReport) {}
}

/// How the engine waits, for a step's `retry:` backoff and `timeout:`: the core has no
/// runtime of its own, so the host gives its timer (`lyra_providers::TokioTimer`).
pub trait Timer: Send + Sync {
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()>;
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Quiet;
impl Observer for Quiet {}

/// Failures that stop a run before any step runs, or that leave the state unknown.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Bad input data for the workflow's parameters (missing lookup keys, wrong types).
    #[error("invalid input:\n{0}")]
    Input(Diagnostics),
    #[error("state store: {0}")]
    Store(#[from] StoreError),
}

/// Most resource steps that have begun their provider calls and not yet recorded the
/// outcome. Their records queue for commits shared by many (so the more the fewer commits),
/// while each holds its values until then (so not without bound).
const RECORDING_WINDOW: usize = 256;

/// Runs programs against providers and a state store.
pub struct Engine<'a> {
    pub providers: &'a Providers,
    pub store: &'a dyn Recorder,
    pub observer: &'a dyn Observer,
    /// Source files, to name workflow locations in run-time errors.
    pub sources: &'a Sources,
    /// At most this many provider operations at once.
    pub concurrency: usize,
    /// Set to stop scheduling new steps; running ones finish and are recorded, and providers
    /// see it ([`crate::provider::OpContext::cancel`]) so long operations stop early.
    pub cancel: &'a AtomicBool,
    /// The advice some messages end with, worded for the caller's users.
    pub hints: &'a dyn Hints,
    /// Waits for retries and timeouts.
    pub timer: &'a dyn Timer,
    /// The process ends soon after the run (a CLI command): what grows with the deployment
    /// (the records the run started from, the names its top scope produced) is left to the
    /// process's exit rather than freed piece by piece, which cost a no-change plan of
    /// 10,000 steps a fifth as much as planning them. A long-lived caller (the controller)
    /// frees them.
    pub leave_to_exit: bool,
}

/// A variable with the recorded resources its value came from (for deletion order).
#[derive(Debug, Clone)]
struct Val {
    var: Var,
    origins: Arc<Vec<String>>,
    /// Derived from something `Sensitive` (a parameter or return so typed, or an attribute
    /// the provider marks secret): whatever it flows into is masked in plans and reports.
    sensitive: bool,
}

impl Val {
    fn known(v: Value) -> Val {
        Val {
            var: Var::Known(v),
            origins: no_origins(),
            sensitive: false,
        }
    }
    fn unknown() -> Val {
        Val {
            var: Var::Unknown,
            origins: no_origins(),
            sensitive: false,
        }
    }
}

/// The origins of a value that comes from no recorded resource: one list, shared rather than
/// allocated for each such value (most are).
fn no_origins() -> Arc<Vec<String>> {
    static NONE: LazyLock<Arc<Vec<String>>> = LazyLock::new(|| Arc::new(Vec::new()));
    Arc::clone(&NONE)
}

type Env = FastMap<String, Val>;

/// How a step ended, as seen by its enclosing scope.
enum Done {
    /// The names it produces.
    Ok(Env),
    Failed,
    Skipped,
}

/// One plan, apply or delete: what every step of it shares.
struct Run<'e, 'a> {
    engine: &'e Engine<'a>,
    mode: Mode,
    program: &'e Program,
    deployment: &'e str,
    data: &'e Map,
    prior: Prior,
    /// The run in the history (`None` in plan mode): new creates' idempotency keys are scoped
    /// to it.
    run_id: Option<RunId>,
    sem: async_lock::Semaphore,
    /// Slots of the steps between their first provider call and their outcome's record:
    /// [`RECORDING_WINDOW`], or `concurrency` if more.
    window: async_lock::Semaphore,
    /// Most children of one scope, iterations of one collection or deletes started and not
    /// ended: twice the window. A started step holds its future (and its values) until it
    /// ends, and every step of a wide workflow is ready at once: 10,000 waiting held 10 MB.
    in_flight: usize,
    reports: Mutex<Vec<StepReport>>,
    claims: Mutex<Claims>,
    /// Step failures that are not tied to a single resource report (store errors).
    fatal: Mutex<Option<String>>,
    /// Every secret value met so far: masked and scrubbed from all the run reports.
    secrets: Mutex<Secrets>,
    /// The providers' settings (the main workflow's `providers:`).
    configs: config::Configs,
    /// `--target`: what the run was restricted to, noted in the history. A partial apply
    /// records no returns.
    partial: Option<String>,
}

/// The step being run: what its failure and its report need.
struct At<'s> {
    step: &'s Step,
    id: &'s str,
    started: Instant,
}

/// What a run returns: the values, and which of them are secret.
struct Returned {
    values: Map,
    sensitive: Vec<String>,
}

impl<'a> Engine<'a> {
    /// What `apply` would do, without changing anything.
    pub async fn plan(&self, program: &Program, deployment: &str, data: &Map) -> Result<Report, EngineError> {
        self.run(Mode::Plan, program, deployment, data, "", &[]).await
    }

    /// Converges the deployment to the workflow.
    pub async fn apply(
        &self,
        program: &Program,
        deployment: &str,
        data: &Map,
        actor: &str,
    ) -> Result<Report, EngineError> {
        self.run(Mode::Apply, program, deployment, data, actor, &[]).await
    }

    /// [`Engine::plan`] of only `targets` (top-level step names) and what they depend on;
    /// the rest of the deployment is left as recorded. No targets: the whole workflow.
    pub async fn plan_targets(
        &self,
        program: &Program,
        deployment: &str,
        data: &Map,
        targets: &[String],
    ) -> Result<Report, EngineError> {
        self.run(Mode::Plan, program, deployment, data, "", targets).await
    }

    /// [`Engine::apply`] of only `targets` and what they depend on (see [`Engine::plan_targets`]).
    /// A partial apply records no returns.
    pub async fn apply_targets(
        &self,
        program: &Program,
        deployment: &str,
        data: &Map,
        actor: &str,
        targets: &[String],
    ) -> Result<Report, EngineError> {
        self.run(Mode::Apply, program, deployment, data, actor, targets).await
    }

    async fn run(
        &self,
        mode: Mode,
        program: &Program,
        deployment: &str,
        data: &Map,
        actor: &str,
        targets: &[String],
    ) -> Result<Report, EngineError> {
        let started = Instant::now();
        let pruned;
        let program = if targets.is_empty() {
            program
        } else {
            pruned = target::prune(program, targets);
            &pruned
        };
        let root = &program.main.root;
        let env = self.top_params(root, data)?;
        let configs = self.provider_configs(&program.main, &env)?;
        let prior = Prior::new(
            self.readable(deployment, self.store.load(deployment).await?)?
                .map(|d| d.resources)
                .unwrap_or_default(),
        );
        let workflow = Some(program.main.name.clone());
        let run_id = self
            .begin(mode == Mode::Apply, Operation::Apply, deployment, &workflow, actor)
            .await?;
        let mut run = Run::new(self, mode, program, deployment, data, prior, run_id);
        run.configs = configs;
        if !targets.is_empty() {
            run.partial = Some(format!("only {} and what it depends on", targets.join(", ")));
        }
        run.remember_records(run.prior.iter());
        for v in config::secret_values(&run.configs) {
            run.remember(&v);
        }
        for v in env.values().filter(|v| v.sensitive) {
            run.remember(&v.var);
        }
        // A top-level workflow's children are named directly under the deployment; a
        // top-level resource is named after the workflow.
        let root_id = match root.kind {
            StepKind::Workflow { .. } => String::new(),
            _ => root.name.clone(),
        };
        let done = run.body(root, env, root_id).await;
        let mut returned = Returned {
            values: Map::new(),
            sensitive: Vec::new(),
        };
        let mut failed = false;
        match done {
            Done::Ok(vals) => {
                for r in &root.returns {
                    if let Some(Val {
                        var: Var::Known(v),
                        sensitive,
                        ..
                    }) = vals.get(&r.name)
                    {
                        returned.values.insert(r.name.clone(), v.clone());
                        if *sensitive {
                            returned.sensitive.push(r.name.clone());
                        }
                    }
                }
            }
            Done::Failed | Done::Skipped => failed = true,
        }
        let cancelled = self.cancel.load(Ordering::SeqCst);
        // Garbage: recorded resources this run did not account for. Never after a
        // cancellation (the unvisited steps would look removed), nor in a targeted run,
        // which accounts only for its targets.
        if !cancelled && run.partial.is_none() {
            let garbage: Vec<ResourceRecord> = {
                let claims = run.claims.lock().expect("claims lock");
                claims.unclaimed(&run.prior).cloned().collect()
            };
            if !run.delete_all(garbage).await {
                failed = true;
            }
        }
        run.conclude(started, workflow, returned, failed, cancelled).await
    }

    /// Binds `data` to the workflow's top-level parameters as a run begins, and nothing more:
    /// the input errors a plan or apply would stop at before reading the state (a missing
    /// key, a value of the wrong type), for callers that judge input ahead of a run (the
    /// controller's admission webhook). Reads and writes no state.
    pub fn check_parameters(&self, program: &Program, data: &Map) -> Result<(), EngineError> {
        let env = self.top_params(&program.main.root, data)?;
        self.provider_configs(&program.main, &env).map(|_| ())
    }

    /// Deletes every resource recorded for the deployment, in reverse dependency order.
    /// Needs no workflow: the state knows what depends on what.
    pub async fn delete(&self, deployment: &str, actor: &str) -> Result<Report, EngineError> {
        self.destroy(Mode::Delete, deployment, actor, &[]).await
    }

    /// Deletes only the resources of `targets` (recorded step ids, or the steps they are
    /// inside) and, first, every resource recorded as built from them.
    pub async fn delete_targets(
        &self,
        deployment: &str,
        actor: &str,
        targets: &[String],
    ) -> Result<Report, EngineError> {
        self.destroy(Mode::Delete, deployment, actor, targets).await
    }

    /// What [`Engine::delete_targets`] would do.
    pub async fn plan_delete_targets(&self, deployment: &str, targets: &[String]) -> Result<Report, EngineError> {
        self.destroy(Mode::Plan, deployment, "", targets).await
    }

    /// What `delete` would do.
    pub async fn plan_delete(&self, deployment: &str) -> Result<Report, EngineError> {
        self.destroy(Mode::Plan, deployment, "", &[]).await
    }

    async fn destroy(
        &self,
        mode: Mode,
        deployment: &str,
        actor: &str,
        targets: &[String],
    ) -> Result<Report, EngineError> {
        let started = Instant::now();
        // Deleting what was never recorded has nothing to do, and must not record it: a
        // history entry would create the deployment it deletes.
        let recorded = self.readable(deployment, self.store.load(deployment).await?)?;
        let exists = recorded.is_some();
        let state: DeploymentState = recorded.unwrap_or_default();
        let run_id = self
            .begin(
                mode == Mode::Delete && exists,
                Operation::Delete,
                deployment,
                &state.workflow,
                actor,
            )
            .await?;
        let program = Program {
            main: Arc::new(empty_workflow()),
            workflows: HashMap::new(),
        };
        let empty = Map::new();
        let mut run = Run::new(self, mode, &program, deployment, &empty, Prior::new(Vec::new()), run_id);
        run.remember_records(state.resources.iter());
        let records = if targets.is_empty() {
            state.resources
        } else {
            run.partial = Some(format!("only {} and what was built from it", targets.join(", ")));
            target::for_delete(state.resources, targets)
        };
        let ok = run.delete_all(records).await;
        let returned = Returned {
            values: Map::new(),
            sensitive: Vec::new(),
        };
        run.conclude(started, state.workflow, returned, !ok, false).await
    }

    /// Records the start of a run in the history, when the run writes (`record`).
    async fn begin(
        &self,
        record: bool,
        operation: Operation,
        deployment: &str,
        workflow: &Option<String>,
        actor: &str,
    ) -> Result<Option<RunId>, EngineError> {
        if !record {
            return Ok(None);
        }
        let start = RunStart {
            deployment: deployment.to_owned(),
            workflow: workflow.clone(),
            operation,
            actor: actor.to_owned(),
        };
        Ok(Some(self.store.begin_run(&start).await?))
    }

    /// Resolves the top-level parameters from the data; every missing key is reported.
    fn top_params(&self, root: &Step, data: &Map) -> Result<Env, EngineError> {
        let mut env = Env::default();
        let mut diags = Diagnostics::default();
        for p in &root.params {
            let value = match &p.source {
                ParamSource::Lookup(key) => lookup(data, key).or(p.default.as_ref()).cloned().ok_or_else(|| {
                    Diagnostic::new(
                        p.span,
                        format!("parameter '{}': lookup key '{key}' not found in the data", p.name),
                    )
                    .with_help(format!("add '{key}' to the data ({})", self.hints.add_data_key(key)))
                }),
                ParamSource::Implicit => lookup(data, &p.name).or(p.default.as_ref()).cloned().ok_or_else(|| {
                    Diagnostic::new(
                        p.span,
                        format!("parameter '{}' has no value: no data key '{}'", p.name, p.name),
                    )
                    .with_help(format!(
                        "give it a value in the data ({}), or a lookup or a value",
                        self.hints.set_data_key(&p.name)
                    ))
                }),
                ParamSource::Value(e) => e.resolve(&|_: &str| None).map_err(|_| {
                    Diagnostic::new(
                        p.span,
                        format!("parameter '{}': a top-level value cannot reference variables", p.name),
                    )
                }),
            };
            let value = value.and_then(|v| {
                if too_deep(&v) {
                    Err(Diagnostic::new(
                        p.span,
                        format!("parameter '{}': {}", p.name, too_deep_message("its value in the data")),
                    ))
                } else {
                    Ok(v)
                }
            });
            match value {
                Ok(v) => match coerce_opt(p.ty.as_ref(), &v) {
                    Ok(v) => {
                        let sensitive = p.ty.as_ref().is_some_and(Type::is_sensitive);
                        env.insert(
                            p.name.clone(),
                            Val {
                                sensitive,
                                ..Val::known(v)
                            },
                        );
                    }
                    Err(e) => diags.push(Diagnostic::new(
                        p.span,
                        format!("parameter '{}' {}", p.name, type_error_text(&e, false)),
                    )),
                },
                Err(d) => diags.push(d),
            }
        }
        if diags.is_empty() {
            Ok(env)
        } else {
            Err(EngineError::Input(diags.sorted()))
        }
    }

    /// The state as loaded, unless some of its records cannot be read: running on a partial
    /// state would recreate (or forget to delete) what those records stand for.
    fn readable(
        &self,
        deployment: &str,
        state: Option<DeploymentState>,
    ) -> Result<Option<DeploymentState>, EngineError> {
        match state {
            Some(s) if !s.unreadable.is_empty() => Err(EngineError::Store(StoreError::new(
                StoreErrorKind::Corrupt,
                crate::state::unreadable_message(deployment, &s.unreadable, self.hints),
            ))),
            other => Ok(other),
        }
    }
}

/// Looks a key up in the data: a flat dotted key first (`aws.tags.Name: x`, as the original's
/// Kubernetes data), then the nested path.
pub fn lookup<'d>(data: &'d Map, key: &str) -> Option<&'d Value> {
    if let Some(v) = data.get(key) {
        return Some(v);
    }
    let mut parts = key.split('.');
    let first = data.get(parts.next()?)?;
    let rest: Vec<String> = parts.map(str::to_owned).collect();
    dig(first, &rest)
}

fn empty_workflow() -> crate::model::Workflow {
    crate::model::Workflow {
        name: String::new(),
        file: Default::default(),
        root: Step {
            name: String::new(),
            span: Span::default(),
            params: vec![],
            returns: vec![],
            when: None,
            kind: StepKind::Workflow {
                steps: vec![],
                deps: vec![],
            },
            inputs: vec![],
        },
        providers: vec![],
    }
}

fn count(steps: &[StepReport]) -> ChangeCounts {
    let mut c = ChangeCounts::default();
    for s in steps {
        if s.type_name.is_none() && s.action == Action::Group {
            if s.status == Status::Skipped {
                c.skipped += 1;
            } else if s.status == Status::Failed {
                c.failed += 1;
            }
            continue;
        }
        match s.status {
            Status::Failed => c.failed += 1,
            Status::Skipped => c.skipped += 1,
            Status::GuardedOff => {}
            Status::Done | Status::Planned => match s.action {
                Action::Create => c.created += 1,
                Action::Update => c.updated += 1,
                Action::Replace => c.replaced += 1,
                Action::Delete | Action::Forget => c.deleted += 1,
                Action::Noop | Action::Read => c.unchanged += 1,
                Action::Group => {}
            },
        }
    }
    c
}

fn run_end(report: &Report, fatal: Option<String>) -> RunEnd {
    RunEnd {
        outcome: report.outcome,
        counts: report.counts.clone(),
        changes: report
            .steps
            .iter()
            .filter(|s| {
                s.status == Status::Failed
                    || (s.status == Status::Done && !matches!(s.action, Action::Noop | Action::Read | Action::Group))
            })
            .map(|s| ChangeRecord {
                step_id: s.id.clone(),
                action: s.action.as_str().to_owned(),
                error: s.error.clone(),
            })
            .collect(),
        error: fatal,
        note: None,
        returns: None,
    }
}

impl<'e, 'a> Run<'e, 'a> {
    fn new(
        engine: &'e Engine<'a>,
        mode: Mode,
        program: &'e Program,
        deployment: &'e str,
        data: &'e Map,
        prior: Prior,
        run_id: Option<RunId>,
    ) -> Self {
        // A report for each recorded resource, and usually each step: reserved, as growing
        // a vector of 10,000 reports moved them all several times.
        let top = match &program.main.root.kind {
            StepKind::Workflow { steps, .. } => steps.len(),
            _ => 1,
        };
        let reports = Vec::with_capacity(prior.len().max(top));
        Run {
            claims: Mutex::new(Claims::new(&prior)),
            engine,
            mode,
            program,
            deployment,
            data,
            prior,
            run_id,
            sem: async_lock::Semaphore::new(engine.concurrency.max(1)),
            window: async_lock::Semaphore::new(RECORDING_WINDOW.max(engine.concurrency)),
            in_flight: 2 * RECORDING_WINDOW.max(engine.concurrency),
            reports: Mutex::new(reports),
            fatal: Mutex::new(None),
            secrets: Mutex::new(Secrets::default()),
            configs: config::Configs::default(),
            partial: None,
        }
    }

    /// Up to how many started a scope (a collection, a delete) with `running` started may
    /// have now: it starts them in bursts, up to [`Run::in_flight`] once half have ended, and
    /// none before. Starting one as each ended left the steps' records to arrive one by one
    /// rather than in crowds that share a commit: a 10k apply took 1.7 times as long.
    fn start_until(&self, running: usize) -> usize {
        if running <= self.in_flight / 2 {
            self.in_flight
        } else {
            0
        }
    }

    /// Remembers a secret value, to mask and scrub it wherever it shows up.
    fn remember(&self, var: &Var) {
        if let Var::Known(v) = var {
            self.secrets.lock().expect("secrets lock").add(v);
        }
    }

    /// Remembers the secrets recorded in earlier runs: their old values may still show up
    /// (in a provider's echo, an attribute's old value, an error).
    fn remember_records<'r>(&self, records: impl Iterator<Item = &'r ResourceRecord>) {
        let schemas = self.engine.providers.schemas();
        let mut secrets = self.secrets.lock().expect("secrets lock");
        // Neighbours in step-id order are often of one type: its schema is looked up once.
        let mut last: Option<(&str, Option<&ResourceSchema>)> = None;
        for rec in records {
            let schema = match last {
                Some((name, schema)) if name == rec.type_name => schema,
                _ => {
                    let schema = schemas.get(&rec.type_name);
                    last = Some((&rec.type_name, schema));
                    schema
                }
            };
            secrets.add_record(rec, schema);
        }
    }

    /// Builds the report from what the steps reported, and records the end of the run.
    async fn conclude(
        self,
        started: Instant,
        workflow: Option<String>,
        returned: Returned,
        failed: bool,
        cancelled: bool,
    ) -> Result<Report, EngineError> {
        // Everything leaving the engine is redacted with every secret the run has met (a step
        // reported early may show a secret learnt later).
        let secrets = self.secrets.into_inner().expect("secrets lock");
        let fatal = self.fatal.lock().expect("fatal lock").take().map(|f| secrets.scrub(&f));
        let mut steps = self.reports.into_inner().expect("reports lock");
        for s in &mut steps {
            secrets.redact_step(s);
        }
        let mut sensitive_returns = returned.sensitive;
        let returns: Map = returned
            .values
            .into_iter()
            .map(|(k, v)| {
                if sensitive_returns.contains(&k) || secrets.reveals(&v) {
                    if !sensitive_returns.contains(&k) {
                        sensitive_returns.push(k.clone());
                    }
                    (k, masked())
                } else {
                    (k, v)
                }
            })
            .collect();
        let failed = failed || fatal.is_some() || steps.iter().any(|s| s.status == Status::Failed);
        let outcome = if cancelled {
            Outcome::Cancelled
        } else if failed {
            Outcome::Failed
        } else {
            Outcome::Succeeded
        };
        let report = Report {
            mode: self.mode,
            deployment: self.deployment.to_owned(),
            workflow,
            outcome,
            run: self.run_id,
            returns,
            sensitive_returns,
            counts: count(&steps),
            steps,
            duration: started.elapsed(),
        };
        if let Some(id) = self.run_id {
            let mut end = run_end(&report, fatal);
            end.note = self.partial.clone();
            // What `lyra output` reads: the returns as the report has them, secret ones
            // masked (the history keeps no secret). A partial apply returns nothing.
            if report.outcome == Outcome::Succeeded && self.mode == Mode::Apply && self.partial.is_none() {
                end.returns = Some(RunReturns {
                    values: report.returns.clone(),
                    sensitive: report.sensitive_returns.clone(),
                });
            }
            self.engine.store.finish_run(id, &end).await?;
        }
        if self.engine.leave_to_exit {
            std::mem::forget(self.prior);
        }
        Ok(report)
    }

    /// Where a workflow location is, for messages.
    fn at(&self, span: Span) -> error::Loc {
        error::Loc::at(self.engine.sources.location(span))
    }

    fn cancelled(&self) -> bool {
        self.engine.cancel.load(Ordering::SeqCst)
    }

    fn report(&self, mut r: StepReport) {
        self.secrets.lock().expect("secrets lock").redact_step(&mut r);
        self.engine.observer.step_finished(&r);
        self.reports.lock().expect("reports lock").push(r);
    }

    /// Accounts for step `id`; answers its record, if it has one.
    fn claim(&self, id: &str) -> Option<&ResourceRecord> {
        let at = self.prior.position(id)?;
        self.claims.lock().expect("claims lock").claim(at);
        self.prior.at(at)
    }

    /// Accounts for everything under a composite step that did not run to completion.
    fn claim_subtree(&self, id: &str) {
        self.claims.lock().expect("claims lock").claim_subtree(&self.prior, id);
    }

    fn group_report(&self, id: &str, status: Status, error: Option<String>, started: Instant) {
        self.report(StepReport {
            id: id.to_owned(),
            type_name: None,
            action: Action::Group,
            status,
            external_id: None,
            duration: started.elapsed(),
            error,
            changes: vec![],
            refused: false,
        });
    }

    fn fail_step(&self, at: &At<'_>, e: StepError) -> Done {
        let action = match &at.step.kind {
            // What was being attempted: creating it, or changing the recorded one.
            StepKind::Resource { .. } if self.prior.contains(at.id) => Action::Update,
            StepKind::Resource { .. } => Action::Create,
            _ => Action::Group,
        };
        let ext = self.prior.get(at.id).map(|r| r.external_id.clone());
        self.fail_as(at, action, ext, e)
    }

    fn fail_as(&self, at: &At<'_>, action: Action, external_id: Option<String>, e: StepError) -> Done {
        let type_name = resource_type(at.step);
        if type_name.is_some() {
            self.claim(at.id);
        } else {
            self.claim_subtree(at.id);
        }
        let refused = matches!(&e, StepError::Provider { source, .. } if source.is_refusal());
        self.report(StepReport {
            id: at.id.to_owned(),
            type_name,
            action,
            status: Status::Failed,
            external_id,
            duration: at.started.elapsed(),
            error: Some(e.to_string()),
            changes: vec![],
            refused,
        });
        Done::Failed
    }

    fn skip_step(&self, step: &Step, id: &str, why: &str) -> Done {
        let type_name = resource_type(step);
        self.claim_subtree(id);
        self.report(StepReport {
            id: id.to_owned(),
            action: if type_name.is_some() {
                Action::Noop
            } else {
                Action::Group
            },
            type_name,
            status: Status::Skipped,
            external_id: None,
            duration: Duration::ZERO,
            error: Some(why.to_owned()),
            changes: vec![],
            refused: false,
        });
        Done::Skipped
    }
}

/// The resource type of a resource step.
fn resource_type(step: &Step) -> Option<String> {
    match &step.kind {
        StepKind::Resource { type_name, .. } => Some(type_name.clone()),
        _ => None,
    }
}

/// Why a step is skipped when the run was cancelled before it started.
const CANCELLED: &str = "the run was cancelled";

#[cfg(test)]
mod tests;

//! The planner and executor. One traversal serves both: in plan mode resource steps read and
//! diff but change nothing, and values that only an apply would produce are `Unknown`.
//!
//! Independent steps run concurrently; provider operations are bounded by a semaphore
//! (`concurrency`). A step starts only when everything it reads is produced *and recorded*:
//! each resource outcome is written through the [`Recorder`] before its returns are
//! published, so a crash at any moment loses nothing. A failed step's dependents are skipped,
//! independent branches finish, and no resource of a failed or skipped step is ever deleted.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::diag::{Diagnostic, Diagnostics, Sources, Span};
use crate::expr::{Expr, ResolveError, Var};
use crate::model::{Over, Param, ParamSource, Return, ReturnSource, Step, StepKind};
use crate::program::Program;
use crate::provider::{Lookup, OpContext, Provider, ProviderError, Providers, idempotency_key, legacy_idempotency_key};
use crate::report::{Action, AttrChange, Mode, Report, Status, StepReport};
use crate::schema::ResourceSchema;
use crate::secret::{Secrets, masked};
use crate::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, Recorder, ResourceRecord, RunEnd, RunId, RunStart,
    StoreError, StoreErrorKind, unreadable_message,
};
use crate::types::{Type, TypeError};
use crate::value::{Map, Value, dig, too_deep, too_deep_message};

/// Progress notifications, for live output.
pub trait Observer: Send + Sync {
    fn step_started(&self, _id: &str, _type_name: &str) {}
    fn step_finished(&self, _report: &StepReport) {}
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

/// Runs programs against providers and a state store.
pub struct Engine<'a> {
    pub providers: &'a Providers,
    pub store: &'a dyn Recorder,
    pub observer: &'a dyn Observer,
    /// Source files, to name workflow locations in run-time errors.
    pub sources: &'a Sources,
    /// At most this many provider operations at once.
    pub concurrency: usize,
    /// Set to stop scheduling new steps; running ones finish and are recorded.
    pub cancel: &'a AtomicBool,
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
            origins: Arc::new(Vec::new()),
            sensitive: false,
        }
    }
    fn unknown() -> Val {
        Val {
            var: Var::Unknown,
            origins: Arc::new(Vec::new()),
            sensitive: false,
        }
    }
}

type Env = HashMap<String, Val>;

/// How a step ended, as seen by its enclosing scope.
enum Done {
    /// The names it produces.
    Ok(Env),
    Failed,
    Skipped,
}

/// Which recorded resources this run accounts for; the rest are garbage.
#[derive(Default)]
struct Claims {
    ids: HashSet<String>,
    prefixes: Vec<String>,
}

impl Claims {
    fn covers(&self, id: &str) -> bool {
        self.ids.contains(id) || self.prefixes.iter().any(|p| id.starts_with(p.as_str()))
    }
}

struct Run<'e, 'a> {
    engine: &'e Engine<'a>,
    mode: Mode,
    program: &'e Program,
    deployment: &'e str,
    data: &'e Map,
    prior: HashMap<String, ResourceRecord>,
    /// The run in the history (`None` in plan mode): new creates' idempotency keys are scoped
    /// to it.
    run_id: Option<RunId>,
    sem: async_lock::Semaphore,
    reports: Mutex<Vec<StepReport>>,
    claims: Mutex<Claims>,
    /// Step failures that are not tied to a single resource report (store errors).
    fatal: Mutex<Option<String>>,
    /// Every secret value met so far: masked and scrubbed from all the run reports.
    secrets: Mutex<Secrets>,
}

fn child_id(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

impl<'a> Engine<'a> {
    /// What `apply` would do, without changing anything.
    pub async fn plan(&self, program: &Program, deployment: &str, data: &Map) -> Result<Report, EngineError> {
        self.run(Mode::Plan, program, deployment, data, "").await
    }

    /// Converges the deployment to the workflow.
    pub async fn apply(
        &self,
        program: &Program,
        deployment: &str,
        data: &Map,
        actor: &str,
    ) -> Result<Report, EngineError> {
        self.run(Mode::Apply, program, deployment, data, actor).await
    }

    async fn run(
        &self,
        mode: Mode,
        program: &Program,
        deployment: &str,
        data: &Map,
        actor: &str,
    ) -> Result<Report, EngineError> {
        let started = Instant::now();
        let root = &program.main.root;
        let env = self.top_params(root, data)?;
        let prior: HashMap<String, ResourceRecord> = readable(deployment, self.store.load(deployment).await?)?
            .map(|d| d.resources.into_iter().map(|r| (r.step_id.clone(), r)).collect())
            .unwrap_or_default();
        let workflow = Some(program.main.name.clone());
        let run_id = self
            .begin(mode == Mode::Apply, Operation::Apply, deployment, &workflow, actor)
            .await?;
        let run = Run::new(self, mode, program, deployment, data, prior, run_id);
        run.remember_records(run.prior.values());
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
        let mut returns = Map::new();
        let mut sensitive_returns = Vec::new();
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
                        returns.insert(r.name.clone(), v.clone());
                        if *sensitive {
                            sensitive_returns.push(r.name.clone());
                        }
                    }
                }
            }
            Done::Failed | Done::Skipped => failed = true,
        }
        let cancelled = self.cancel.load(Ordering::SeqCst);
        // Garbage: recorded resources this run did not account for. Never after a
        // cancellation: the unvisited steps would look removed.
        if !cancelled {
            let garbage: Vec<ResourceRecord> = {
                let claims = run.claims.lock().expect("claims lock");
                let mut g: Vec<ResourceRecord> = run
                    .prior
                    .values()
                    .filter(|r| !claims.covers(&r.step_id))
                    .cloned()
                    .collect();
                g.sort_by(|a, b| a.step_id.cmp(&b.step_id));
                g
            };
            if !run.delete_all(garbage).await {
                failed = true;
            }
        }
        run.conclude(
            run_id,
            started,
            workflow,
            (returns, sensitive_returns),
            failed,
            cancelled,
        )
        .await
    }

    /// Deletes every resource recorded for the deployment, in reverse dependency order.
    /// Needs no workflow: the state knows what depends on what.
    pub async fn delete(&self, deployment: &str, actor: &str) -> Result<Report, EngineError> {
        self.destroy(Mode::Delete, deployment, actor).await
    }

    /// What `delete` would do.
    pub async fn plan_delete(&self, deployment: &str) -> Result<Report, EngineError> {
        self.destroy(Mode::Plan, deployment, "").await
    }

    async fn destroy(&self, mode: Mode, deployment: &str, actor: &str) -> Result<Report, EngineError> {
        let started = Instant::now();
        // Deleting what was never recorded has nothing to do, and must not record it: a
        // history entry would create the deployment it deletes.
        let recorded = readable(deployment, self.store.load(deployment).await?)?;
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
        let run = Run::new(self, mode, &program, deployment, &empty, HashMap::new(), run_id);
        run.remember_records(state.resources.iter());
        let ok = run.delete_all(state.resources).await;
        run.conclude(run_id, started, state.workflow, (Map::new(), Vec::new()), !ok, false)
            .await
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
        let mut env = Env::new();
        let mut diags = Diagnostics::default();
        for p in &root.params {
            let value = match &p.source {
                ParamSource::Lookup(key) => lookup(data, key).cloned().ok_or_else(|| {
                    Diagnostic::new(
                        p.span,
                        format!("parameter '{}': lookup key '{key}' not found in the data", p.name),
                    )
                    .with_help(format!("add '{key}' to the data (the data file or `--var {key}=VALUE`; `spec.data` on Kubernetes)"))
                }),
                ParamSource::Implicit => lookup(data, &p.name).cloned().ok_or_else(|| {
                    Diagnostic::new(
                        p.span,
                        format!("parameter '{}' has no value: no data key '{}'", p.name, p.name),
                    )
                    .with_help(format!(
                        "give it a value in the data (`--var {}=VALUE`; `spec.data` on Kubernetes), or a lookup or a value",
                        p.name
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

/// The state as loaded, unless some of its records cannot be read: running on a partial state
/// would recreate (or forget to delete) what those records stand for.
fn readable(deployment: &str, state: Option<DeploymentState>) -> Result<Option<DeploymentState>, EngineError> {
    match state {
        Some(s) if !s.unreadable.is_empty() => Err(EngineError::Store(StoreError::new(
            StoreErrorKind::Corrupt,
            unreadable_message(deployment, &s.unreadable),
        ))),
        other => Ok(other),
    }
}

/// A type error for a message. Of a secret value, neither the value nor where inside it
/// the problem is: only what was expected.
fn type_error_text(e: &TypeError, secret: bool) -> String {
    if secret {
        format!("expects {}, got a sensitive value (not shown)", e.expected)
    } else {
        e.to_string()
    }
}

fn coerce_opt(ty: Option<&Type>, v: &Value) -> Result<Value, TypeError> {
    match ty {
        Some(t) => t.coerce(v),
        None => Ok(v.clone()),
    }
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
    }
}

/// Whether two values are the same for diffing: numbers compare by value (8080 = 8080.0).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.iter().all(|(k, v)| same(v, y.get(k).unwrap_or(&Value::Null)))
                && y.iter().all(|(k, v)| x.contains_key(k) || v.is_null())
        }
        _ => a == b,
    }
}

/// The attribute-level difference between desired and actual. Provided attributes are only
/// compared when the workflow sets them; attributes the workflow does not mention are
/// the provider's business.
fn diff(schema: &ResourceSchema, desired: &Map, unknown: &[String], actual: &Map) -> Vec<AttrChange> {
    let mut out = Vec::new();
    for (name, want) in desired {
        let attr = schema.attribute(name);
        if attr.is_some_and(|a| a.provided) && want.is_null() {
            continue;
        }
        let have = actual.get(name).unwrap_or(&Value::Null);
        if !same(want, have) {
            out.push(AttrChange {
                attribute: name.clone(),
                old: Some(have.clone()),
                new: Some(want.clone()),
                forces_replace: attr.is_some_and(|a| a.immutable),
                sensitive: attr.is_some_and(|a| a.sensitive || a.ty.is_sensitive()),
            });
        }
    }
    for name in unknown {
        let attr = schema.attribute(name);
        out.push(AttrChange {
            attribute: name.clone(),
            old: actual.get(name).cloned(),
            new: None,
            forces_replace: attr.is_some_and(|a| a.immutable),
            sensitive: attr.is_some_and(|a| a.sensitive || a.ty.is_sensitive()),
        });
    }
    out
}

fn creation(schema: &ResourceSchema, desired: &Map, unknown: &[String]) -> Vec<AttrChange> {
    let sensitive = |n: &str| schema.attribute(n).is_some_and(|a| a.sensitive || a.ty.is_sensitive());
    desired
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| AttrChange {
            attribute: k.clone(),
            old: None,
            new: Some(v.clone()),
            forces_replace: false,
            sensitive: sensitive(k),
        })
        .chain(unknown.iter().map(|k| AttrChange {
            attribute: k.clone(),
            old: None,
            new: None,
            forces_replace: false,
            sensitive: sensitive(k),
        }))
        .collect()
}

impl<'e, 'a> Run<'e, 'a> {
    fn new(
        engine: &'e Engine<'a>,
        mode: Mode,
        program: &'e Program,
        deployment: &'e str,
        data: &'e Map,
        prior: HashMap<String, ResourceRecord>,
        run_id: Option<RunId>,
    ) -> Self {
        Run {
            engine,
            mode,
            program,
            deployment,
            data,
            prior,
            run_id,
            sem: async_lock::Semaphore::new(engine.concurrency.max(1)),
            reports: Mutex::new(Vec::new()),
            claims: Mutex::new(Claims::default()),
            fatal: Mutex::new(None),
            secrets: Mutex::new(Secrets::default()),
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
        for rec in records {
            secrets.add_record(rec, schemas.get(&rec.type_name));
        }
    }

    /// Builds the report from what the steps reported, and records the end of the run.
    async fn conclude(
        self,
        run_id: Option<RunId>,
        started: Instant,
        workflow: Option<String>,
        (returns, mut sensitive_returns): (Map, Vec<String>),
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
        let returns: Map = returns
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
            run: run_id,
            returns,
            sensitive_returns,
            counts: count(&steps),
            steps,
            duration: started.elapsed(),
        };
        if let Some(id) = run_id {
            self.engine.store.finish_run(id, &run_end(&report, fatal)).await?;
        }
        Ok(report)
    }

    fn loc(&self, span: Span) -> String {
        self.engine.sources.location(span)
    }

    fn report(&self, mut r: StepReport) {
        self.secrets.lock().expect("secrets lock").redact_step(&mut r);
        self.engine.observer.step_finished(&r);
        self.reports.lock().expect("reports lock").push(r);
    }

    fn claim(&self, id: &str) {
        self.claims.lock().expect("claims lock").ids.insert(id.to_owned());
    }

    /// Accounts for everything under a composite step that did not run to completion.
    fn claim_subtree(&self, id: &str) {
        let mut c = self.claims.lock().expect("claims lock");
        c.ids.insert(id.to_owned());
        c.prefixes
            .push(if id.is_empty() { String::new() } else { format!("{id}/") });
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
        });
    }

    fn fail_step(&self, step: &Step, id: &str, msg: String, started: Instant) -> Done {
        let action = match &step.kind {
            // What was being attempted: creating it, or changing the recorded one.
            StepKind::Resource { .. } if self.prior.contains_key(id) => Action::Update,
            StepKind::Resource { .. } => Action::Create,
            _ => Action::Group,
        };
        let ext = self.prior.get(id).map(|r| r.external_id.clone());
        self.fail_as(step, id, action, ext, msg, started)
    }

    fn fail_as(
        &self,
        step: &Step,
        id: &str,
        action: Action,
        external_id: Option<String>,
        msg: String,
        started: Instant,
    ) -> Done {
        let type_name = resource_type(step);
        if type_name.is_some() {
            self.claim(id);
        } else {
            self.claim_subtree(id);
        }
        self.report(StepReport {
            id: id.to_owned(),
            type_name,
            action,
            status: Status::Failed,
            external_id,
            duration: started.elapsed(),
            error: Some(msg),
            changes: vec![],
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
        });
        Done::Skipped
    }

    /// Runs a step in its enclosing scope: guard, own parameters, then the body.
    fn step<'s>(&'s self, step: &'s Step, env: Env, id: String) -> BoxFuture<'s, Done> {
        Box::pin(async move {
            let started = Instant::now();
            if let Some((guard, _)) = &step.when {
                let look = |n: &str| env.get(n).map(|v| &v.var);
                if guard.eval(&look) == Some(false) {
                    // The step is not wanted: its returns are undefined, and what it made
                    // before is garbage.
                    self.report(StepReport {
                        id: id.clone(),
                        type_name: resource_type(step),
                        action: Action::Noop,
                        status: Status::GuardedOff,
                        external_id: None,
                        duration: started.elapsed(),
                        error: None,
                        changes: vec![],
                    });
                    return Done::Ok(undefined_returns(step));
                }
            }
            // Every parameter is read in the enclosing scope (a parameter's value cannot see
            // the step's other parameters), then bound inside the step.
            let mut bound = Vec::with_capacity(step.params.len());
            for p in &step.params {
                match self.argument(p, &env, "") {
                    Ok(v) => bound.push((p.name.clone(), v)),
                    Err(msg) => return self.fail_step(step, &id, msg, started),
                }
            }
            let mut local = env;
            local.extend(bound);
            self.body(step, local, id).await
        })
    }

    /// A parameter's (or a call argument's) value, read from its source in `scope` (the
    /// enclosing one) and converted to its type; `of` says whose parameter it is in messages.
    fn argument(&self, p: &Param, scope: &Env, of: &str) -> Result<Val, String> {
        let v = match &p.source {
            ParamSource::Implicit => scope.get(&p.name).cloned().unwrap_or_else(|| Val::known(Value::Null)),
            ParamSource::Lookup(key) => self.lookup_param(key, p)?,
            ParamSource::Value(e) => self.resolve(e, scope)?,
        };
        self.typed(v, p, of)
    }

    fn lookup_param(&self, key: &str, p: &Param) -> Result<Val, String> {
        let v = lookup(self.data, key).ok_or_else(|| {
            format!(
                "{}: parameter '{}': lookup key '{key}' not found in the data",
                self.loc(p.span),
                p.name
            )
        })?;
        if too_deep(v) {
            return Err(format!(
                "{}: parameter '{}': {}",
                self.loc(p.span),
                p.name,
                too_deep_message(&format!("the data at '{key}'"))
            ));
        }
        Ok(Val::known(v.clone()))
    }

    /// Coerces a parameter's value to its declared type (`of` names a called workflow).
    fn typed(&self, v: Val, p: &Param, of: &str) -> Result<Val, String> {
        let sensitive = v.sensitive || p.ty.as_ref().is_some_and(Type::is_sensitive);
        let v = match (&v.var, &p.ty) {
            (Var::Known(x), Some(t)) => t
                .coerce(x)
                .map(|x| Val {
                    var: Var::Known(x),
                    origins: v.origins.clone(),
                    sensitive,
                })
                .map_err(|e| {
                    format!(
                        "{}: parameter '{}'{of} {}",
                        self.loc(p.span),
                        p.name,
                        type_error_text(&e, v.sensitive)
                    )
                })?,
            _ => Val { sensitive, ..v },
        };
        if sensitive {
            self.remember(&v.var);
        }
        Ok(v)
    }

    fn resolve(&self, e: &Expr, env: &Env) -> Result<Val, String> {
        let look = |n: &str| env.get(n).map(|v| &v.var);
        let mut origins: BTreeSet<String> = BTreeSet::new();
        let mut sensitive = false;
        for r in e.refs() {
            if let Some(v) = env.get(&r.name) {
                origins.extend(v.origins.iter().cloned());
                sensitive |= v.sensitive;
            }
        }
        let origins = Arc::new(origins.into_iter().collect());
        match e.resolve(&look) {
            // Templates nest values in values: a chain of steps could build values of any
            // depth. Only a template with references can go past the YAML limit, so the
            // first reference says where.
            Ok(v) if too_deep(&v) => {
                let at = e
                    .refs()
                    .first()
                    .map_or_else(String::new, |r| format!("{}: ", self.loc(r.span)));
                Err(format!("{at}{}", too_deep_message("the value built here")))
            }
            Ok(v) => Ok(Val {
                var: Var::Known(v),
                origins,
                sensitive,
            }),
            Err(ResolveError::Unknown) => Ok(Val {
                var: Var::Unknown,
                origins,
                sensitive,
            }),
            Err(ResolveError::NoSuchPath { reference, span }) => {
                Err(format!("{}: {reference} does not exist", self.loc(span)))
            }
            Err(ResolveError::Unbound { name, span }) => {
                Err(format!("{}: ${name} is not defined here", self.loc(span)))
            }
        }
    }

    /// Runs the body of a step whose parameters are bound in `env`.
    fn body<'s>(&'s self, step: &'s Step, env: Env, id: String) -> BoxFuture<'s, Done> {
        Box::pin(async move {
            match &step.kind {
                StepKind::Resource { .. } => self.resource(step, env, id).await,
                StepKind::Workflow { steps, deps } => {
                    let started = Instant::now();
                    let (scope, ok) = self.scope(steps, deps, env, &id).await;
                    if !ok {
                        // Children reported their own failures; account for the subtree.
                        self.claim_subtree(&id);
                        if !id.is_empty() {
                            self.group_report(&id, Status::Failed, Some("a step inside failed".to_owned()), started);
                        }
                        return Done::Failed;
                    }
                    match self.returns_from_scope(&step.returns, &scope) {
                        Ok(r) => Done::Ok(r),
                        Err(msg) => self.fail_step(step, &id, msg, started),
                    }
                }
                StepKind::Collection {
                    over,
                    over_span,
                    vars,
                    into,
                    step: inner,
                } => {
                    self.collection(step, over, *over_span, vars, into, inner, env, id)
                        .await
                }
                StepKind::Call { target, args, .. } => self.call(step, target, args, env, id).await,
            }
        })
    }

    fn returns_from_scope(&self, returns: &[Return], scope: &Env) -> Result<Env, String> {
        let mut out = Env::new();
        for r in returns {
            let v = match &r.source {
                ReturnSource::Same => scope.get(&r.name).cloned(),
                ReturnSource::Alias(a) => scope.get(a).cloned(),
                ReturnSource::Value(e) => Some(self.resolve(e, scope)?),
            }
            .unwrap_or_else(|| Val::known(Value::Null));
            out.insert(r.name.clone(), self.typed_return(r, v)?);
        }
        Ok(out)
    }

    /// A return's value coerced to its declared `type`, whatever the step (a `Sensitive`
    /// type makes it secret).
    fn typed_return(&self, r: &Return, v: Val) -> Result<Val, String> {
        let v = match (&v.var, &r.ty) {
            (Var::Known(x), Some(t)) => Val {
                var: Var::Known(t.coerce(x).map_err(|e| {
                    format!(
                        "{}: return '{}' {}",
                        self.loc(r.span),
                        r.name,
                        type_error_text(&e, v.sensitive)
                    )
                })?),
                origins: v.origins,
                sensitive: v.sensitive || t.is_sensitive(),
            },
            (_, Some(t)) => Val {
                sensitive: v.sensitive || t.is_sensitive(),
                ..v
            },
            _ => v,
        };
        if v.sensitive {
            self.remember(&v.var);
        }
        Ok(v)
    }

    /// Runs the children of a workflow as their inputs become available. Returns every
    /// name produced in the scope, and whether all children succeeded.
    async fn scope(&self, steps: &[Step], deps: &[Vec<usize>], mut vars: Env, prefix: &str) -> (Env, bool) {
        let n = steps.len();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                dependents[d].push(i);
            }
        }
        let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
        // Whether each child ended badly (failed or skipped).
        let mut bad = vec![false; n];
        let mut all_ok = true;
        let mut running = FuturesUnordered::new();
        let mut ready: Vec<usize> = (0..n).filter(|i| waiting[*i] == 0).collect();
        loop {
            while let Some(i) = ready.pop() {
                let step = &steps[i];
                let id = child_id(prefix, &step.name);
                let why = if self.engine.cancel.load(Ordering::SeqCst) {
                    Some("the run was cancelled".to_owned())
                } else {
                    let failed: Vec<&str> = deps[i]
                        .iter()
                        .filter(|d| bad[**d])
                        .map(|d| steps[*d].name.as_str())
                        .collect();
                    (!failed.is_empty())
                        .then(|| format!("it depends on '{}', which did not complete", failed.join("', '")))
                };
                if let Some(why) = why {
                    self.skip_step(step, &id, &why);
                    bad[i] = true;
                    all_ok = false;
                    for &j in &dependents[i] {
                        waiting[j] -= 1;
                        if waiting[j] == 0 {
                            ready.push(j);
                        }
                    }
                    continue;
                }
                let env: Env = step
                    .inputs
                    .iter()
                    .filter_map(|name| vars.get(name).map(|v| (name.clone(), v.clone())))
                    .collect();
                running.push(async move { (i, self.step(step, env, id).await) });
            }
            let Some((i, done)) = running.next().await else { break };
            match done {
                Done::Ok(produced) => vars.extend(produced),
                Done::Failed | Done::Skipped => {
                    bad[i] = true;
                    all_ok = false;
                }
            }
            for &j in &dependents[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.push(j);
                }
            }
        }
        (vars, all_ok)
    }

    #[allow(clippy::too_many_arguments)]
    async fn collection(
        &self,
        step: &Step,
        over: &Over,
        over_span: Span,
        vars: &[String],
        into: &str,
        inner: &Step,
        env: Env,
        id: String,
    ) -> Done {
        let started = Instant::now();
        let mut origins: BTreeSet<String> = BTreeSet::new();
        let mut sensitive = false;
        let mut values = Vec::new();
        for e in over.exprs() {
            match self.resolve(e, &env) {
                Ok(v) => {
                    origins.extend(v.origins.iter().cloned());
                    sensitive |= v.sensitive;
                    values.push(v.var);
                }
                Err(msg) => return self.fail_step(step, &id, msg, started),
            }
        }
        if values.contains(&Var::Unknown) {
            // Planning: how many iterations there will be is known only after apply.
            self.claim_subtree(&id);
            self.group_report(
                &id,
                Status::Planned,
                Some("iterations known after apply".to_owned()),
                started,
            );
            return self.collected(step, into, Val::unknown(), &id, started);
        }
        let known: Vec<Value> = values
            .into_iter()
            .map(|v| if let Var::Known(x) = v { x } else { Value::Null })
            .collect();
        let bad = |msg: String| format!("{}: {msg}", self.loc(over_span));
        // (segment of the id, bindings)
        let iterations: Vec<(String, Vec<Value>)> = match over {
            Over::Each(_) => match &known[0] {
                Value::Array(items) => items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let bound = if vars.len() <= 1 {
                            vec![item.clone()]
                        } else {
                            (0..vars.len())
                                .map(|k| match item {
                                    Value::Array(a) => a.get(k).cloned().unwrap_or(Value::Null),
                                    Value::Object(m) => m.get(&vars[k]).cloned().unwrap_or(Value::Null),
                                    _ => Value::Null,
                                })
                                .collect()
                        };
                        (i.to_string(), bound)
                    })
                    .collect(),
                Value::Null => vec![],
                other => {
                    return self.fail_step(
                        step,
                        &id,
                        bad(format!("'each' needs an array, got {}", crate::types::kind_of(other))),
                        started,
                    );
                }
            },
            Over::EachPair(_) => match &known[0] {
                Value::Object(m) => m
                    .iter()
                    .map(|(k, v)| (k.clone(), vec![Value::String(k.clone()), v.clone()]))
                    .collect(),
                Value::Null => vec![],
                other => {
                    return self.fail_step(
                        step,
                        &id,
                        bad(format!("'eachPair' needs a hash, got {}", crate::types::kind_of(other))),
                        started,
                    );
                }
            },
            Over::Times(_) | Over::Range(..) => {
                let ints: Option<Vec<i64>> = known
                    .iter()
                    .map(|v| Type::INTEGER.coerce(v).ok().and_then(|x| x.as_i64()))
                    .collect();
                let Some(ints) = ints else {
                    return self.fail_step(step, &id, bad("'times' and 'range' need integers".to_owned()), started);
                };
                let (from, to) = if ints.len() == 1 {
                    (0, ints[0])
                } else {
                    (ints[0], ints[1])
                };
                if to < from {
                    let msg = match (ints.len(), sensitive) {
                        (1, false) => format!("'times' must not be negative, got {to}"),
                        (1, true) => "'times' must not be negative".to_owned(),
                        (_, false) => format!("'range' ends ({to}) before it starts ({from})"),
                        (_, true) => "'range' ends before it starts".to_owned(),
                    };
                    return self.fail_step(step, &id, bad(msg), started);
                }
                (from..to).map(|i| (i.to_string(), vec![Value::from(i)])).collect()
            }
        };
        let origins = Arc::new(origins.into_iter().collect::<Vec<_>>());
        let mut futs = FuturesUnordered::new();
        for (idx, (seg, bound)) in iterations.into_iter().enumerate() {
            let mut e = env.clone();
            for (name, v) in vars.iter().zip(bound) {
                e.insert(
                    name.clone(),
                    Val {
                        var: Var::Known(v),
                        origins: origins.clone(),
                        sensitive,
                    },
                );
            }
            let iid = format!("{id}/{seg}");
            futs.push(async move { (idx, self.step(inner, e, iid).await) });
        }
        let mut results: Vec<(usize, Env)> = Vec::new();
        let mut ok = true;
        while let Some((idx, done)) = futs.next().await {
            match done {
                Done::Ok(r) => results.push((idx, r)),
                _ => ok = false,
            }
        }
        if !ok {
            self.claim_subtree(&id);
            self.group_report(&id, Status::Failed, Some("an iteration failed".to_owned()), started);
            return Done::Failed;
        }
        results.sort_by_key(|(i, _)| *i);
        let mut all_origins: BTreeSet<String> = BTreeSet::new();
        let mut any_sensitive = false;
        let mut unknown = false;
        let mut items = Vec::with_capacity(results.len());
        for (_, r) in results {
            let mut element = Map::new();
            for ret in &inner.returns {
                let v = r.get(&ret.name).cloned().unwrap_or_else(|| Val::known(Value::Null));
                all_origins.extend(v.origins.iter().cloned());
                any_sensitive |= v.sensitive;
                match v.var {
                    Var::Known(x) => {
                        element.insert(ret.name.clone(), x);
                    }
                    Var::Unknown => unknown = true,
                }
            }
            items.push(if inner.returns.len() == 1 {
                element.into_iter().next().map(|(_, v)| v).unwrap_or(Value::Null)
            } else {
                Value::Object(element)
            });
        }
        let items = Value::Array(items);
        if too_deep(&items) {
            let msg = format!(
                "{}: {}",
                self.loc(step.span),
                too_deep_message(&format!("the collected '{into}'"))
            );
            return self.fail_step(step, &id, msg, started);
        }
        let var = if unknown { Var::Unknown } else { Var::Known(items) };
        let val = Val {
            var,
            origins: Arc::new(all_origins.into_iter().collect()),
            sensitive: any_sensitive,
        };
        self.collected(step, into, val, &id, started)
    }

    /// What a collection produces: its `into` list, converted to the type its return (which
    /// can only be that list) declares.
    fn collected(&self, step: &Step, into: &str, val: Val, id: &str, started: Instant) -> Done {
        let val = match step.returns.iter().find(|r| r.name == into) {
            Some(r) => match self.typed_return(r, val) {
                Ok(v) => v,
                Err(msg) => return self.fail_step(step, id, msg, started),
            },
            None => val,
        };
        Done::Ok([(into.to_owned(), val)].into_iter().collect())
    }

    async fn call(&self, step: &Step, target: &str, args: &[Param], env: Env, id: String) -> Done {
        let started = Instant::now();
        let Some(wf) = self.program.workflows.get(target) else {
            return self.fail_step(
                step,
                &id,
                format!("{}: workflow '{target}' is not loaded", self.loc(step.span)),
                started,
            );
        };
        let root = &wf.root;
        let mut callee = Env::new();
        let passed_to = format!(" passed to '{target}'");
        for p in &root.params {
            let v = if let Some(a) = args.iter().find(|a| a.name == p.name) {
                self.argument(a, &env, &passed_to)
            } else {
                match &p.source {
                    ParamSource::Lookup(key) => self.lookup_param(key, p),
                    ParamSource::Value(e) => self.resolve(e, &Env::new()),
                    ParamSource::Implicit => Ok(env.get(&p.name).cloned().unwrap_or_else(|| Val::known(Value::Null))),
                }
            };
            let v = match v.and_then(|v| self.typed(v, p, &format!(" of '{target}'"))) {
                Ok(v) => v,
                Err(msg) => return self.fail_step(step, &id, msg, started),
            };
            callee.insert(p.name.clone(), v);
        }
        // The called workflow's steps live under the call step's id; a called top-level
        // resource is the call step itself.
        match self.body(root, callee, id.clone()).await {
            Done::Ok(returned) => {
                let mut out = Env::new();
                for r in &step.returns {
                    let src = r.source_name().unwrap_or(&r.name);
                    let v = returned.get(src).cloned().unwrap_or_else(|| Val::known(Value::Null));
                    match self.typed_return(r, v) {
                        Ok(v) => out.insert(r.name.clone(), v),
                        Err(msg) => return self.fail_step(step, &id, msg, started),
                    };
                }
                Done::Ok(out)
            }
            other => other,
        }
    }

    async fn resource(&self, step: &Step, env: Env, id: String) -> Done {
        let started = Instant::now();
        let StepKind::Resource {
            type_name,
            value,
            external_id,
            ..
        } = &step.kind
        else {
            unreachable!("resource step")
        };
        self.claim(&id);
        let providers = self.engine.providers;
        let (Some(schema), Some(provider)) = (providers.schemas().get(type_name), providers.get(type_name)) else {
            return self.fail_step(
                step,
                &id,
                format!("{}: no provider for '{type_name}'", self.loc(step.span)),
                started,
            );
        };
        // The desired state, with values not known yet (planning) set aside.
        let mut desired = Map::new();
        let mut unknown = Vec::new();
        // Attributes whose values derive from something sensitive.
        let mut tainted: BTreeSet<String> = BTreeSet::new();
        let mut origins: BTreeSet<String> = BTreeSet::new();
        for v in env.values() {
            origins.extend(v.origins.iter().cloned());
        }
        for a in value {
            let resolved = self.resolve(&a.expr, &env);
            let secret = matches!(resolved, Ok(Val { sensitive: true, .. }));
            if secret {
                tainted.insert(a.name.clone());
            }
            match resolved {
                Ok(Val { var: Var::Known(v), .. }) => {
                    let ty = schema.attribute(&a.name).map(|x| &x.ty);
                    match coerce_opt(ty, &v) {
                        Ok(v) => {
                            if secret {
                                self.remember(&Var::Known(v.clone()));
                            }
                            desired.insert(a.name.clone(), v);
                        }
                        Err(e) => {
                            let inner = if e.path.is_empty() || secret {
                                String::new()
                            } else {
                                format!(" at '{}'", e.path)
                            };
                            let found = if secret {
                                "a sensitive value (not shown)".to_owned()
                            } else {
                                e.found
                            };
                            let msg = format!(
                                "{}: attribute '{}'{inner} of {type_name} expects {}, got {found}",
                                self.loc(a.span),
                                a.name,
                                e.expected,
                            );
                            return self.fail_step(step, &id, msg, started);
                        }
                    }
                }
                Ok(Val { var: Var::Unknown, .. }) => unknown.push(a.name.clone()),
                Err(msg) => return self.fail_step(step, &id, msg, started),
            }
        }
        let ext = match external_id {
            None => None,
            Some((e, _)) => match self.resolve(e, &env) {
                Ok(Val {
                    var: Var::Known(Value::String(s)),
                    ..
                }) => Some(Some(s)),
                Ok(Val {
                    var: Var::Known(other), ..
                }) => Some(Some(other.to_string())),
                Ok(Val { var: Var::Unknown, .. }) => Some(None),
                Err(msg) => return self.fail_step(step, &id, msg, started),
            },
        };

        let _permit = self.sem.acquire().await;
        // Cancelled while waiting for a slot: do not start.
        if self.engine.cancel.load(Ordering::SeqCst) {
            return self.skip_step(step, &id, "the run was cancelled");
        }
        self.engine.observer.step_started(&id, type_name);
        let prior = self.prior.get(&id);
        // The key of this step's create: a pending record's own (its create may have
        // happened), else a new one of this run's, so nothing made for a forgotten record is
        // ever adopted. `None` only in plan mode, which creates nothing.
        let create_key = match prior {
            Some(rec) if rec.pending => Some(pending_key(self.deployment, rec)),
            _ => self
                .run_id
                .map(|run| idempotency_key(self.engine.store.store_id(), run, self.deployment, &id)),
        };
        let cx = OpContext {
            deployment: self.deployment,
            step_id: &id,
            type_name: &schema.name,
            idempotency_key: create_key.as_deref(),
        };
        let depends_on: Vec<String> = origins.into_iter().filter(|o| *o != id).collect();
        let err = |e: ProviderError| format!("{}: {type_name}: {e}", self.loc(step.span));

        // Read-only resources: read, never create, update or delete.
        if let Some(ext) = ext {
            let Some(ext) = ext else {
                return self.finish(step, &id, Action::Read, vec![], None, started, Env::new(), true);
            };
            let actual = match provider.read(&cx, &ext, prior.map(|p| &p.actual)).await {
                Ok(Some(a)) => match self.check_returned(step, &schema.name, &a) {
                    Ok(()) => a,
                    Err(msg) => return self.fail_step(step, &id, msg, started),
                },
                Ok(None) => {
                    return self.fail_step(
                        step,
                        &id,
                        format!("{}: {type_name} '{ext}' does not exist", self.loc(step.span)),
                        started,
                    );
                }
                Err(e) => return self.fail_step(step, &id, err(e), started),
            };
            let secret = self.secret_attributes(schema, &tainted, &desired, &actual, prior);
            if self.mode == Mode::Apply {
                let rec = ResourceRecord {
                    step_id: id.clone(),
                    type_name: schema.name.clone(),
                    external_id: ext.clone(),
                    desired: desired.clone(),
                    actual: actual.clone(),
                    depends_on,
                    managed: false,
                    pending: false,
                    sensitive: secret.iter().cloned().collect(),
                    create_key: None,
                };
                if prior != Some(&rec)
                    && let Err(e) = self.engine.store.put_resource(self.deployment, &rec).await
                {
                    return self.store_failed(step, &id, &e, started);
                }
            }
            return match self.resource_returns(step, schema, Action::Read, &desired, &unknown, &actual, &id, &secret) {
                Ok(returns) => self.finish(step, &id, Action::Read, vec![], Some(ext), started, returns, false),
                Err(msg) => self.fail_as(step, &id, Action::Read, Some(ext), msg, started),
            };
        }

        // What is there now? A resource deleted behind our back is created again. A pending
        // record means an earlier run died between `create` and recording its result: only
        // the provider can tell whether the resource was made.
        let current = match prior {
            Some(rec) if rec.pending => match provider.lookup(&cx).await {
                Ok(Lookup::Found(c)) => match self.check_returned(step, &schema.name, &c.actual) {
                    Ok(()) => Some((c.external_id, c.actual)),
                    Err(msg) => return self.fail_step(step, &id, msg, started),
                },
                Ok(Lookup::Absent) => None,
                Ok(Lookup::Unsupported) => {
                    let msg = unrecorded_message(self.deployment, &id, &schema.name);
                    return self.fail_step(step, &id, format!("{}: {msg}", self.loc(step.span)), started);
                }
                Err(e) => return self.fail_step(step, &id, err(e), started),
            },
            Some(rec) => match provider.read(&cx, &rec.external_id, Some(&rec.actual)).await {
                Ok(Some(a)) => match self.check_returned(step, &schema.name, &a) {
                    Ok(()) => Some((rec.external_id.clone(), a)),
                    Err(msg) => return self.fail_step(step, &id, msg, started),
                },
                Ok(None) => None,
                Err(e) => return self.fail_step(step, &id, err(e), started),
            },
            None => None,
        };
        let (action, mut changes) = match &current {
            None => (Action::Create, creation(schema, &desired, &unknown)),
            Some((_, actual)) => {
                let changes = diff(schema, &desired, &unknown, actual);
                let action = if changes.iter().any(|c| c.forces_replace) {
                    Action::Replace
                } else if changes.is_empty() {
                    Action::Noop
                } else {
                    Action::Update
                };
                (action, changes)
            }
        };
        let empty = Map::new();
        let secret = self.secret_attributes(
            schema,
            &tainted,
            &desired,
            current.as_ref().map_or(&empty, |(_, a)| a),
            prior,
        );
        for c in &mut changes {
            // The old value is secret if the attribute was: it may hold an old secret.
            c.sensitive |= secret.contains(&c.attribute) || prior.is_some_and(|p| p.sensitive.contains(&c.attribute));
        }
        if self.mode == Mode::Plan {
            let actual = current.as_ref().map_or(&empty, |(_, a)| a);
            let returns = self.resource_returns(step, schema, action, &desired, &unknown, actual, &id, &secret);
            let ext = current.map(|(e, _)| e);
            return match returns {
                Ok(returns) => self.finish(step, &id, action, changes, ext, started, returns, false),
                Err(msg) => self.fail_as(step, &id, action, ext, msg, started),
            };
        }

        // The intent is recorded before `create` so that a crash before the result is recorded
        // leaves a trace (see `Lookup`). For a replace it follows the delete: until then the
        // record keeps the old resource's id.
        let intent = ResourceRecord::intent(
            &id,
            &schema.name,
            desired.clone(),
            depends_on.clone(),
            create_key.clone().unwrap_or_default(),
        );
        let intent_recorded = AtomicBool::new(false);
        let record_intent = || async {
            self.engine
                .store
                .put_resource(self.deployment, &intent)
                .await
                .map_err(Failure::Store)?;
            intent_recorded.store(true, Ordering::SeqCst);
            Ok::<(), Failure>(())
        };
        let result: Result<(String, Map), Failure> = async {
            match (action, &current) {
                (Action::Create, _) => {
                    record_intent().await?;
                    Ok(provider
                        .create(&cx, &desired)
                        .await
                        .map(|c| (c.external_id, c.actual))?)
                }
                (Action::Replace, Some((ext, actual))) => {
                    provider.delete(&cx, ext, actual).await?;
                    record_intent().await?;
                    Ok(provider
                        .create(&cx, &desired)
                        .await
                        .map(|c| (c.external_id, c.actual))?)
                }
                (Action::Update, Some((ext, actual))) => Ok(provider
                    .update(&cx, ext, &desired, actual)
                    .await
                    .map(|a| (ext.clone(), a))?),
                (_, Some((ext, actual))) => Ok((ext.clone(), actual.clone())),
                (_, None) => unreachable!("no-op needs a current resource"),
            }
        }
        .await;
        // A value too deep to store is not stored: a created resource keeps its intent record
        // (the next run asks the provider for it, as after a crash), an updated one its old
        // record.
        let result = result.and_then(|(ext, actual)| match self.check_returned(step, &schema.name, &actual) {
            Ok(()) => Ok((ext, actual)),
            Err(msg) => Err(Failure::Unstorable(msg)),
        });
        let (ext, actual) = match result {
            Ok(r) => r,
            Err(Failure::Unstorable(msg)) => {
                let ext = current.map(|(e, _)| e);
                return self.fail_as(step, &id, action, ext, msg, started);
            }
            // After a failed replace the old resource may be gone: the next run reads it,
            // finds nothing and creates it.
            Err(Failure::Provider(e)) => {
                // A create that failed made nothing (providers that cannot be sure track keys
                // and are asked again): drop its intent so the next run simply tries again.
                if intent_recorded.load(Ordering::SeqCst)
                    && let Err(se) = self.engine.store.remove_resource(self.deployment, &id).await
                {
                    return self.store_failed(step, &id, &se, started);
                }
                let ext = current.map(|(e, _)| e);
                return self.fail_as(step, &id, action, ext, err(e), started);
            }
            Err(Failure::Store(e)) => return self.store_failed(step, &id, &e, started),
        };
        let rec = ResourceRecord {
            step_id: id.clone(),
            type_name: schema.name.clone(),
            external_id: ext.clone(),
            desired: desired.clone(),
            actual: actual.clone(),
            depends_on,
            managed: true,
            pending: false,
            sensitive: self
                .secret_attributes(schema, &tainted, &desired, &actual, prior)
                .into_iter()
                .collect(),
            create_key: None,
        };
        // No-ops write only when the recorded state is stale (drift, new dependencies).
        if (action != Action::Noop || prior != Some(&rec))
            && let Err(e) = self.engine.store.put_resource(self.deployment, &rec).await
        {
            return self.store_failed(step, &id, &e, started);
        }
        let secret: BTreeSet<String> = rec.sensitive.iter().cloned().collect();
        match self.resource_returns(step, schema, action, &desired, &unknown, &actual, &id, &secret) {
            Ok(returns) => self.finish(step, &id, action, changes, Some(ext), started, returns, false),
            // Recorded, but what it returns is not what the workflow says it is.
            Err(msg) => self.fail_as(step, &id, action, Some(ext), msg, started),
        }
    }

    /// The attributes of a resource whose values are secret: those set from something
    /// sensitive (`tainted`), those the provider marks secret, those holding a known secret
    /// (a provider echoing a secret input, now or from an earlier run, which it cannot know
    /// to mark), and those the prior record marked whose value has not changed since. Their
    /// values are remembered as secrets.
    fn secret_attributes(
        &self,
        schema: &ResourceSchema,
        tainted: &BTreeSet<String>,
        desired: &Map,
        actual: &Map,
        prior: Option<&ResourceRecord>,
    ) -> BTreeSet<String> {
        let mut out = tainted.clone();
        let marked = |k: &str| schema.attribute(k).is_some_and(|a| a.is_secret());
        out.extend(desired.keys().chain(actual.keys()).filter(|k| marked(k)).cloned());
        let mut secrets = self.secrets.lock().expect("secrets lock");
        for k in &out {
            for m in [desired, actual] {
                if let Some(v) = m.get(k) {
                    secrets.add(v);
                }
            }
        }
        let unchanged = |k: &String| prior.is_some_and(|p| p.sensitive.contains(k) && p.actual.get(k) == actual.get(k));
        let echoes: Vec<String> = desired
            .iter()
            .chain(actual.iter())
            .filter(|(k, v)| !out.contains(*k) && (secrets.reveals(v) || unchanged(k)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in echoes {
            for m in [desired, actual] {
                if let Some(v) = m.get(&k) {
                    secrets.add(v);
                }
            }
            out.insert(k);
        }
        out
    }

    /// Whether what a provider returned can be recorded and shown: values nested deeper than
    /// the limit could be written but never read back.
    fn check_returned(&self, step: &Step, type_name: &str, actual: &Map) -> Result<(), String> {
        match actual.iter().find(|(_, v)| too_deep(v)) {
            None => Ok(()),
            Some((k, _)) => Err(format!(
                "{}: {type_name} returned a value that cannot be recorded: {}",
                self.loc(step.span),
                too_deep_message(&format!("attribute '{k}'"))
            )),
        }
    }

    fn store_failed(&self, step: &Step, id: &str, e: &StoreError, started: Instant) -> Done {
        let msg = format!("recording '{id}' in the state failed: {e}");
        *self.fatal.lock().expect("fatal lock") = Some(msg.clone());
        self.fail_step(step, id, msg, started)
    }

    #[allow(clippy::too_many_arguments)]
    fn resource_returns(
        &self,
        step: &Step,
        schema: &ResourceSchema,
        action: Action,
        desired: &Map,
        unknown: &[String],
        actual: &Map,
        id: &str,
        secret: &BTreeSet<String>,
    ) -> Result<Env, String> {
        let origins = Arc::new(vec![id.to_owned()]);
        let mut out = Env::new();
        for r in &step.returns {
            let attr = r.source_name().unwrap_or(&r.name);
            let sensitive = secret.contains(attr)
                || schema
                    .attribute(attr)
                    .is_some_and(|a| a.sensitive || a.ty.is_sensitive());
            let var = if self.mode == Mode::Plan {
                let provided = schema.attribute(attr).is_some_and(|a| a.provided);
                if unknown.iter().any(|u| u == attr)
                    || (matches!(action, Action::Create | Action::Replace)
                        && provided
                        && desired.get(attr).is_none_or(Value::is_null))
                {
                    Var::Unknown
                } else {
                    Var::Known(
                        desired
                            .get(attr)
                            .or_else(|| actual.get(attr))
                            .cloned()
                            .unwrap_or(Value::Null),
                    )
                }
            } else {
                Var::Known(
                    actual
                        .get(attr)
                        .or_else(|| desired.get(attr))
                        .cloned()
                        .unwrap_or(Value::Null),
                )
            };
            let v = Val {
                var,
                origins: origins.clone(),
                sensitive,
            };
            out.insert(r.name.clone(), self.typed_return(r, v)?);
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        step: &Step,
        id: &str,
        action: Action,
        changes: Vec<AttrChange>,
        external_id: Option<String>,
        started: Instant,
        returns: Env,
        unknown_returns: bool,
    ) -> Done {
        let type_name = resource_type(step);
        self.report(StepReport {
            id: id.to_owned(),
            type_name,
            action,
            status: if self.mode == Mode::Plan {
                Status::Planned
            } else {
                Status::Done
            },
            external_id,
            duration: started.elapsed(),
            error: None,
            changes,
        });
        if unknown_returns {
            return Done::Ok(step.returns.iter().map(|r| (r.name.clone(), Val::unknown())).collect());
        }
        Done::Ok(returns)
    }

    /// Deletes `records` in reverse dependency order, concurrently where independent.
    /// Returns false if anything could not be deleted.
    async fn delete_all(&self, records: Vec<ResourceRecord>) -> bool {
        let n = records.len();
        let index: HashMap<&str, usize> = records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.step_id.as_str(), i))
            .collect();
        // blockers[i]: how many resources that depend on i are still to be deleted.
        let mut blockers = vec![0usize; n];
        let mut depends: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, r) in records.iter().enumerate() {
            for d in &r.depends_on {
                if let Some(&j) = index.get(d.as_str()) {
                    depends[i].push(j);
                    blockers[j] += 1;
                }
            }
        }
        let mut ready: Vec<usize> = (0..n).filter(|i| blockers[*i] == 0).collect();
        ready.sort_by(|a, b| records[*b].step_id.cmp(&records[*a].step_id));
        let mut failed = vec![false; n];
        let mut ok = true;
        let mut running = FuturesUnordered::new();
        let records = &records;
        loop {
            while let Some(i) = ready.pop() {
                running.push(async move { (i, self.delete_one(&records[i]).await) });
            }
            let Some((i, success)) = running.next().await else {
                break;
            };
            if !success {
                ok = false;
                failed[i] = true;
            }
            for &j in &depends[i] {
                blockers[j] -= 1;
                if failed[i] {
                    failed[j] = true;
                }
                if blockers[j] == 0 {
                    if failed[j] {
                        // Something that uses it could not be deleted: keep it, and
                        // everything it uses.
                        self.keep(j, &depends, &mut blockers, &mut failed, records);
                    } else {
                        ready.push(j);
                    }
                }
            }
        }
        ok
    }

    /// Reports `j` as kept and, once nothing else waits on them, everything it depends on.
    fn keep(
        &self,
        j: usize,
        depends: &[Vec<usize>],
        blockers: &mut [usize],
        failed: &mut [bool],
        records: &[ResourceRecord],
    ) {
        let mut stack = vec![j];
        while let Some(x) = stack.pop() {
            let why = Some("kept because a resource that depends on it was not deleted".to_owned());
            self.report(deletion_report(
                &records[x],
                Action::Delete,
                Status::Skipped,
                Duration::ZERO,
                why,
            ));
            for &k in &depends[x] {
                blockers[k] -= 1;
                failed[k] = true;
                if blockers[k] == 0 {
                    stack.push(k);
                }
            }
        }
    }

    async fn delete_one(&self, rec: &ResourceRecord) -> bool {
        let started = Instant::now();
        if self.engine.cancel.load(Ordering::SeqCst) {
            let why = Some("the run was cancelled".to_owned());
            self.report(deletion_report(
                rec,
                Action::Delete,
                Status::Skipped,
                Duration::ZERO,
                why,
            ));
            return false;
        }
        let action = if rec.managed { Action::Delete } else { Action::Forget };
        let finish =
            |status: Status, error: Option<String>| deletion_report(rec, action, status, started.elapsed(), error);
        if self.mode == Mode::Plan {
            self.report(finish(Status::Planned, None));
            return true;
        }
        let _permit = self.sem.acquire().await;
        self.engine.observer.step_started(&rec.step_id, &rec.type_name);
        if rec.managed {
            let Some(provider) = self.engine.providers.get(&rec.type_name) else {
                self.report(finish(
                    Status::Failed,
                    Some(format!("no provider for '{}': cannot delete it", rec.type_name)),
                ));
                return false;
            };
            let provider: &Arc<dyn Provider> = provider;
            let key = rec.pending.then(|| pending_key(self.deployment, rec));
            let cx = OpContext {
                deployment: self.deployment,
                step_id: &rec.step_id,
                type_name: &rec.type_name,
                idempotency_key: key.as_deref(),
            };
            // A pending record has no id: ask the provider what, if anything, was made.
            let target = if rec.pending {
                match provider.lookup(&cx).await {
                    Ok(Lookup::Found(c)) => Some((c.external_id, c.actual)),
                    Ok(Lookup::Absent) => None,
                    Ok(Lookup::Unsupported) => {
                        let msg = unrecorded_message(self.deployment, &rec.step_id, &rec.type_name);
                        self.report(finish(Status::Failed, Some(msg)));
                        return false;
                    }
                    Err(e) => {
                        self.report(finish(Status::Failed, Some(format!("{}: {e}", rec.type_name))));
                        return false;
                    }
                }
            } else {
                Some((rec.external_id.clone(), rec.actual.clone()))
            };
            if let Some((ext, actual)) = target
                && let Err(e) = provider.delete(&cx, &ext, &actual).await
            {
                self.report(finish(Status::Failed, Some(format!("{}: {e}", rec.type_name))));
                return false;
            }
        }
        if let Err(e) = self.engine.store.remove_resource(self.deployment, &rec.step_id).await {
            let msg = format!("forgetting '{}' in the state failed: {e}", rec.step_id);
            *self.fatal.lock().expect("fatal lock") = Some(msg.clone());
            self.report(finish(Status::Failed, Some(msg)));
            return false;
        }
        self.report(finish(Status::Done, None));
        true
    }
}

/// The key a pending record's create was asked with: its own, or for records written before
/// keys were recorded, the key those versions used.
fn pending_key(deployment: &str, rec: &ResourceRecord) -> String {
    rec.create_key
        .clone()
        .unwrap_or_else(|| legacy_idempotency_key(deployment, &rec.step_id))
}

/// Why a step stops at a record whose `create` may or may not have happened.
fn unrecorded_message(deployment: &str, step_id: &str, type_name: &str) -> String {
    format!(
        "'{step_id}' was possibly created, unrecorded: an earlier run stopped between creating this \
         {type_name} and recording it, and {type_name} cannot tell whether it exists. Check, delete it by \
         hand if it does, then run `lyra state rm {deployment} {step_id}`"
    )
}

/// Why a step's provider call or its intent record failed.
enum Failure {
    Provider(ProviderError),
    Store(StoreError),
    /// The provider's answer cannot be recorded (too deep).
    Unstorable(String),
}

impl From<ProviderError> for Failure {
    fn from(e: ProviderError) -> Self {
        Failure::Provider(e)
    }
}

/// The report of deleting (or keeping) a recorded resource.
fn deletion_report(
    rec: &ResourceRecord,
    action: Action,
    status: Status,
    duration: Duration,
    error: Option<String>,
) -> StepReport {
    StepReport {
        id: rec.step_id.clone(),
        type_name: Some(rec.type_name.clone()),
        action,
        status,
        external_id: Some(rec.external_id.clone()),
        duration,
        error,
        changes: vec![],
    }
}

/// The resource type of a resource step.
fn resource_type(step: &Step) -> Option<String> {
    match &step.kind {
        StepKind::Resource { type_name, .. } => Some(type_name.clone()),
        _ => None,
    }
}

/// Every return of a step, undefined (its guard was false).
fn undefined_returns(step: &Step) -> Env {
    match &step.kind {
        StepKind::Collection { into, .. } => [(into.clone(), Val::known(Value::Null))].into_iter().collect(),
        _ => step
            .returns
            .iter()
            .map(|r| (r.name.clone(), Val::known(Value::Null)))
            .collect(),
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

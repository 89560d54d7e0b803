//! Saved plans: `lyra plan --out FILE`, `lyra show FILE` and `lyra apply FILE`, and the
//! detailed exit code of plans (`--detailed-exitcode`).
//!
//! A plan file is a wire type of its own (docs/saved-plans.md), apart from the engine's: it
//! records where the plan's inputs came from (never the data itself) and keyed digests of
//! them, of the state the plan read and of the plan's changes; the changes themselves are
//! kept as `plan -o json` shows them, secrets masked. `apply FILE` reads everything again,
//! plans again under the deployment's lease, and applies only when every digest is the same.
//!
//! The digests are HMAC-SHA256 under a key derived from the state store's random id and a
//! random salt in the file: the id lives in the store and is not exported, so a low-entropy
//! secret in the data cannot be found by trying guesses against the plan file alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hmac::{KeyInit as _, Mac as _};
use lyra_core::diag::Sources;
use lyra_core::engine::{EngineError, Quiet};
use lyra_core::program::Program;
use lyra_core::report::{Action, Report, Status};
use lyra_core::state::fingerprint_value as state_value;
use lyra_core::state::{DeploymentState, Outcome, Recorder, ResourceRecord, RunEnd, RunId, RunStart, StoreError};
use lyra_core::value::canonical_json as canonical;
use lyra_core::value::{Map, Value};
use serde::{Deserialize, Serialize};

use crate::args::{self, Output, PlanArgs, RunArgs, ShowArgs, WorkflowArgs};
use crate::exit::{Exit, kind};
use crate::{load, output, signals};

/// The plan file format this Lyra writes and reads (`format`).
pub const FORMAT: &str = "lyra-plan/1";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A plan file as written: the wire type.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    pub format: String,
    pub lyra_version: String,
    pub created_at: String,
    pub deployment: String,
    /// The state's location as shown (no password).
    pub state: String,
    pub workflow: WorkflowOrigin,
    pub data: DataOrigin,
    /// The deployment's newest run when the plan was made, to name the runs since.
    pub last_run: Option<RunId>,
    pub key: KeyInfo,
    pub digests: Digests,
    /// The plan as `lyra plan -o json` prints it (secrets masked).
    pub plan: Value,
    /// The plan as `lyra plan` prints it.
    pub plan_text: String,
    /// HMAC of everything above: a plan file edited by hand is refused.
    pub mac: String,
}

/// Where the workflow came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkflowOrigin {
    /// A name on the load path or a file, as given.
    Files {
        argument: String,
        load_path: Option<String>,
    },
    /// A package, pinned by digest.
    Package { reference: String, digest: String },
}

/// Where the data came from: the data file and the names of the `--var`s (not their values).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataOrigin {
    pub file: Option<String>,
    pub vars: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyInfo {
    /// Random, hex: with the store's id, the key of every digest in the file.
    pub salt: String,
    /// A digest of nothing: tells "another state store" from "a file changed by hand".
    pub check: String,
}

/// Keyed digests (hex) of everything the plan depended on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Digests {
    /// Every workflow source file, by its name as shown.
    pub workflow: BTreeMap<String, String>,
    pub data_file: Option<String>,
    /// One per `--var`, in order.
    pub vars: Vec<String>,
    /// The data after `--var` overrides.
    pub data: String,
    /// The deployment's recorded state as the plan read it.
    pub state: String,
    /// The plan's changes.
    pub changes: String,
}

/// The key of a plan file's digests.
pub struct Keyed {
    key: [u8; 32],
}

impl Keyed {
    /// Derived from the store's id and the file's salt: without the id (which the store
    /// holds), guesses at a secret in the data cannot be checked against the digests;
    /// the salt makes every file's digests its own, so two plan files cannot be compared.
    pub fn new(store_id: &str, salt: &[u8]) -> Keyed {
        let mut mac = HmacSha256::new_from_slice(store_id.as_bytes()).expect("HMAC takes any key length");
        mac.update(FORMAT.as_bytes());
        mac.update(&[0]);
        mac.update(salt);
        Keyed {
            key: mac.finalize().into_bytes().into(),
        }
    }

    fn mac(&self, label: &str, bytes: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        // The label separates the digests, so no two inputs can be swapped.
        mac.update(label.as_bytes());
        mac.update(&[0]);
        mac.update(bytes);
        mac
    }

    /// The digest of `bytes` for the purpose `label`, hex.
    pub fn digest(&self, label: &str, bytes: &[u8]) -> String {
        hex::encode(self.mac(label, bytes).finalize().into_bytes())
    }

    /// Whether `digest` is that of `bytes`, compared in constant time.
    pub fn verify(&self, label: &str, bytes: &[u8], digest: &str) -> bool {
        hex::decode(digest).is_ok_and(|d| self.mac(label, bytes).verify_slice(&d).is_ok())
    }
}

/// A plan's steps (`-o json`'s `steps`) without what varies between two plans of the same
/// change (durations, the order steps finished in): what the changes digest covers.
pub fn plan_steps(plan: &Value) -> BTreeMap<String, Value> {
    let mut steps = BTreeMap::new();
    for s in plan["steps"].as_array().into_iter().flatten() {
        let mut s = s.clone();
        if let Some(o) = s.as_object_mut() {
            o.remove("duration_ms");
        }
        let id = s["step"].as_str().unwrap_or_default().to_owned();
        steps.insert(id, s);
    }
    steps
}

fn changes_bytes(plan: &Value) -> Vec<u8> {
    let steps: Vec<Value> = plan_steps(plan).into_values().collect();
    canonical(&Value::Array(steps)).into_bytes()
}

/// What a step would do, in a few words: `updates \`size\``, `creates it`.
fn step_words(s: &Value) -> String {
    let action = s["action"].as_str().unwrap_or("?");
    let status = s["status"].as_str().unwrap_or("?");
    if matches!(status, "failed" | "skipped") {
        return status.to_owned();
    }
    if status == "guarded-off" {
        return "is guarded off".to_owned();
    }
    let mut paths: Vec<String> = s["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["path"].as_str().map(|p| format!("`{p}`")))
        .collect();
    paths.dedup();
    let what = if paths.is_empty() {
        "it".to_owned()
    } else {
        paths.join(", ")
    };
    match action {
        "create" => "creates it".to_owned(),
        "update" => format!("updates {what}"),
        "replace" => format!("replaces it ({what})"),
        "delete" => "deletes it".to_owned(),
        "forget" => "forgets it".to_owned(),
        "read" => "reads it".to_owned(),
        "no-op" | "group" => "changes nothing".to_owned(),
        other => other.to_owned(),
    }
}

/// Each step whose plan differs between `then` and `now`, as a sentence.
pub fn changed_steps(then: &Value, now: &Value) -> Vec<String> {
    let (then, now) = (plan_steps(then), plan_steps(now));
    let mut ids: Vec<&String> = then.keys().chain(now.keys()).collect();
    ids.sort();
    ids.dedup();
    let mut out = Vec::new();
    for id in ids {
        match (then.get(id), now.get(id)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                let (was, is) = (step_words(a), step_words(b));
                if was == is {
                    out.push(format!("step {id}: the plan {is} with other values"));
                } else {
                    out.push(format!("step {id}: the plan now {is} (was: {was})"));
                }
            }
            (Some(a), None) => out.push(format!("step {id}: no longer in the plan (was: {})", step_words(a))),
            (None, Some(b)) => out.push(format!("step {id}: new in the plan, which {}", step_words(b))),
            (None, None) => {}
        }
    }
    out
}

impl PlanFile {
    /// The bytes the MAC covers: the file without its MAC, canonically.
    fn mac_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            o.remove("mac");
        }
        canonical(&v).into_bytes()
    }

    pub fn seal(&mut self, key: &Keyed) {
        self.mac = key.digest("file", &self.mac_bytes());
    }

    pub fn sealed_by(&self, key: &Keyed) -> bool {
        key.verify("file", &self.mac_bytes(), &self.mac)
    }

    /// Reads a plan file's text. `Ok(None)`: it is not a plan file at all (a workflow).
    pub fn parse(text: &str) -> Result<Option<PlanFile>, String> {
        let text = text.trim_start_matches('\u{feff}').trim_start();
        if !text.starts_with('{') {
            return Ok(None);
        }
        let value: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            // Truncated or otherwise broken JSON that says it is a plan: a damaged plan file.
            Err(e) if text.contains("\"lyra-plan/") => return Err(format!("it is not valid JSON: {e}")),
            Err(_) => return Ok(None),
        };
        let Some(format) = value.get("format").and_then(Value::as_str) else {
            return Ok(None);
        };
        if !format.starts_with("lyra-plan/") {
            return Ok(None);
        }
        if format != FORMAT {
            return Err(format!(
                "its format is {format:?}, which this Lyra does not read (it reads {FORMAT:?}); make the plan again"
            ));
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| format!("it is damaged: {e}"))
    }
}

/// A plan file found where a workflow was expected.
pub struct Loaded {
    pub path: PathBuf,
    pub file: PlanFile,
}

/// Whether `path` is a plan file (by its content): `None` when it is anything else.
pub fn detect(path: &Path) -> Result<Option<Loaded>, Exit> {
    if !path.is_file() {
        return Ok(None);
    }
    let Ok(text) = std::fs::read_to_string(path) else {
        // Not UTF-8: not a plan (a workflow's reader says what is wrong with it).
        return Ok(None);
    };
    match PlanFile::parse(&text) {
        Ok(file) => Ok(file.map(|file| Loaded {
            path: path.to_path_buf(),
            file,
        })),
        Err(why) => Err(damaged(path, &why)),
    }
}

fn damaged(path: &Path, why: &str) -> Exit {
    Exit::invalid_input(format!("{}: not a usable plan file: {why}", path.display()))
        .with("plan_file", path.display().to_string())
}

/// `--detailed-exitcode`: a plan that succeeded exits 4 when it would change something.
pub fn pending(r: &Report, detailed: bool) -> Result<(), Exit> {
    if detailed && changes(r) {
        return Err(Exit::reported(Exit::CHANGES));
    }
    Ok(())
}

/// Whether a plan would change anything.
pub fn changes(r: &Report) -> bool {
    r.steps.iter().any(|s| {
        s.status == Status::Planned
            && matches!(
                s.action,
                Action::Create | Action::Update | Action::Replace | Action::Delete | Action::Forget
            )
    })
}

/// A [`Recorder`] that keeps what the engine loaded: the state a plan was made from is
/// exactly the one digested, never a second read.
struct Capture<'a> {
    inner: &'a dyn Recorder,
    loaded: Mutex<Option<Option<DeploymentState>>>,
}

impl<'a> Capture<'a> {
    fn new(inner: &'a dyn Recorder) -> Self {
        Capture {
            inner,
            loaded: Mutex::new(None),
        }
    }

    fn state(&self) -> Value {
        let loaded = self.loaded.lock().expect("capture lock");
        state_value(loaded.as_ref().and_then(Option::as_ref))
    }
}

#[async_trait]
impl Recorder for Capture<'_> {
    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    async fn load(&self, deployment: &str) -> Result<Option<DeploymentState>, StoreError> {
        let state = self.inner.load(deployment).await?;
        *self.loaded.lock().expect("capture lock") = Some(state.clone());
        Ok(state)
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

/// A run's inputs, read as `plan_or_apply` reads them.
struct Inputs {
    target: load::Target,
    program: Program,
    sources: Sources,
    /// The first this many of `sources` are workflow files (the data file follows).
    workflow_files: usize,
    data: Map,
    deployment: String,
}

async fn providers(a: &RunArgs, workflows: Option<&Path>) -> lyra_core::provider::Providers {
    crate::providers_for(&a.exec.foobernetes_file, workflows).await
}

async fn read_inputs(
    workflow: &WorkflowArgs,
    data: Option<&Path>,
    vars: &[String],
    name: Option<&str>,
    providers: &lyra_core::provider::Providers,
) -> Result<Inputs, Exit> {
    let mut sources = Sources::default();
    let (target, program) = load::load_run(workflow, name.is_some(), providers.schemas(), &mut sources).await?;
    let workflow_files = sources.files().len();
    let data = load::load_data(data, vars, &mut sources)?;
    let deployment = name.map_or_else(|| target.name().to_owned(), str::to_owned);
    Ok(Inputs {
        target,
        program,
        sources,
        workflow_files,
        data,
        deployment,
    })
}

/// The data file a run reads: the one given, else ./data.yaml when there is one.
fn data_path(given: Option<&Path>) -> Option<PathBuf> {
    match given {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("data.yaml")).filter(|p| p.is_file()),
    }
}

fn var_name(v: &str) -> &str {
    v.split_once('=').or_else(|| v.split_once(':')).map_or(v, |(k, _)| k)
}

/// The digests of a run's inputs (all but the state and the changes).
fn input_digests(key: &Keyed, inputs: &Inputs, vars: &[String]) -> Digests {
    let files = inputs.sources.files();
    let workflow = files[..inputs.workflow_files]
        .iter()
        .map(|f| (f.name.clone(), key.digest("workflow", f.text.as_bytes())))
        .collect();
    let data_file = files
        .get(inputs.workflow_files)
        .map(|f| key.digest("data_file", f.text.as_bytes()));
    Digests {
        workflow,
        data_file,
        vars: vars.iter().map(|v| key.digest("var", v.as_bytes())).collect(),
        data: key.digest("data", canonical(&Value::Object(inputs.data.clone())).as_bytes()),
        state: String::new(),
        changes: String::new(),
    }
}

fn now_text() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// `lyra plan … --out FILE`.
pub async fn plan(a: &PlanArgs, file: &Path, out: Output) -> Result<(), Exit> {
    let r = &a.run;
    let providers = providers(r, r.workflow.workflows.as_deref()).await;
    let inputs = read_inputs(&r.workflow, r.data.as_deref(), &r.vars, r.name.as_deref(), &providers).await?;
    // The file is bound to the store's id, so the store must exist: made here if needed, as
    // the apply that follows would make it.
    let store = crate::open_state(r.state.as_deref()).await?;
    let last_run = store
        .history(&inputs.deployment)
        .await
        .map_err(Exit::state)?
        .first()
        .map(|run| run.id);
    let salt: [u8; 32] = rand::random();
    let key = Keyed::new(store.store_id(), &salt);
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let capture = Capture::new(store.as_ref());
    let report = crate::engine(
        r.exec.concurrency,
        &providers,
        &capture,
        &Quiet,
        &inputs.sources,
        &cancel,
    )
    .plan(&inputs.program, &inputs.deployment, &inputs.data)
    .await
    .map_err(|e| crate::engine_error(e, &inputs.sources))?;
    if report.outcome != Outcome::Succeeded {
        crate::warn(&format!(
            "the plan did not succeed: {} was not written\n",
            file.display()
        ));
        return crate::finish_report(&report, out, true, None);
    }
    let plan = serde_json::to_value(output::report_json(&report)).map_err(|e| Exit::failure(e.to_string()))?;
    let mut digests = input_digests(&key, &inputs, &r.vars);
    digests.state = key.digest("state", canonical(&capture.state()).as_bytes());
    digests.changes = key.digest("changes", &changes_bytes(&plan));
    let workflow = match &inputs.target {
        load::Target::Files(_) => WorkflowOrigin::Files {
            argument: r.workflow.workflow.clone(),
            load_path: r.workflow.workflows.as_ref().map(|p| p.display().to_string()),
        },
        load::Target::Package(p) => WorkflowOrigin::Package {
            reference: lyra_package::Reference::parse(&r.workflow.workflow)
                .map(|re| re.pinned(&p.digest).to_string())
                .unwrap_or_else(|_| r.workflow.workflow.clone()),
            digest: p.digest.clone(),
        },
    };
    let mut saved = PlanFile {
        format: FORMAT.to_owned(),
        lyra_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at: now_text(),
        deployment: inputs.deployment.clone(),
        state: crate::state_label(r.state.as_deref()),
        workflow,
        data: DataOrigin {
            file: data_path(r.data.as_deref()).map(|p| p.display().to_string()),
            vars: r.vars.iter().map(|v| var_name(v).to_owned()).collect(),
        },
        last_run,
        key: KeyInfo {
            salt: hex::encode(salt),
            check: key.digest("check", b""),
        },
        digests,
        plan,
        plan_text: output::plan_text(&report),
        mac: String::new(),
    };
    saved.seal(&key);
    let text = serde_json::to_string_pretty(&saved).map_err(|e| Exit::failure(e.to_string()))? + "\n";
    crate::files::replace(file, text.as_bytes(), crate::files::Mode::Private)
        .map_err(|e| Exit::failure(format!("cannot write the plan to {}: {e}", file.display())))?;
    crate::finish_report(&report, out, true, None)?;
    crate::warn(&format!(
        "Saved the plan to {0}; apply exactly it with `lyra apply {0}`.\n",
        file.display()
    ));
    pending(&report, a.detailed_exitcode)
}

/// What a plan file says it was made from, for people.
fn origin_text(f: &PlanFile) -> String {
    let workflow = match &f.workflow {
        WorkflowOrigin::Files { argument, load_path } => match load_path {
            Some(dir) => format!("{argument} (load path {dir})"),
            None => argument.clone(),
        },
        WorkflowOrigin::Package { reference, digest } if !reference.contains(digest.as_str()) => {
            format!("{reference} ({digest})")
        }
        WorkflowOrigin::Package { reference, .. } => reference.clone(),
    };
    let mut lines = vec![
        format!(
            "Saved plan ({}, made {} by lyra {})",
            f.format, f.created_at, f.lyra_version
        ),
        format!("  deployment: {}", f.deployment),
        format!("  state:      {}", f.state),
        format!("  workflow:   {workflow}"),
        format!("  data:       {}", f.data.file.as_deref().unwrap_or("(none)")),
    ];
    if !f.data.vars.is_empty() {
        lines.push(format!("  --var:      {}", f.data.vars.join(", ")));
    }
    lines.join("\n") + "\n\n"
}

/// `lyra show -o json`.
#[derive(Serialize)]
struct ShowJson<'a> {
    plan_file: String,
    format: &'a str,
    lyra_version: &'a str,
    created_at: &'a str,
    deployment: &'a str,
    state: &'a str,
    workflow: &'a WorkflowOrigin,
    data: &'a DataOrigin,
    plan: &'a Value,
}

/// `lyra show FILE`.
pub fn show(a: &ShowArgs, out: Output) -> Result<(), Exit> {
    if !a.file.is_file() {
        return Err(Exit::usage(format!("no plan file {}", a.file.display())));
    }
    let Some(Loaded { path, file: f }) = detect(&a.file)? else {
        return Err(damaged(&a.file, "it is not a plan file (see `lyra plan --out`)"));
    };
    match out {
        Output::Json => crate::json(&ShowJson {
            plan_file: path.display().to_string(),
            format: &f.format,
            lyra_version: &f.lyra_version,
            created_at: &f.created_at,
            deployment: &f.deployment,
            state: &f.state,
            workflow: &f.workflow,
            data: &f.data,
            plan: &f.plan,
        }),
        Output::Text => crate::print(&(origin_text(&f) + &f.plan_text)),
    }
}

/// How a check under the lease ended.
enum Checked {
    /// These moved: nothing was applied.
    Stale(Vec<String>),
    /// The plan could not be made again.
    Failed(EngineError),
    /// Everything matched, and this is the apply.
    Applied(Result<Report, EngineError>),
}

fn stale(loaded: &Loaded, moved: &[String]) -> Exit {
    let n = moved.len();
    let mut e = Exit::new(
        Exit::FAILURE,
        kind::STALE_PLAN,
        format!(
            "the plan in {} is stale, so nothing was changed: {n} thing{} moved since it was made",
            loaded.path.display(),
            if n == 1 { "" } else { "s" },
        ),
    )
    .with("plan_file", loaded.path.display().to_string())
    .with("deployment", &loaded.file.deployment)
    .with("stale", moved);
    for m in moved {
        e = e.hint(&format!("- {m}"));
    }
    e.hint("make the plan again (`lyra plan … --out FILE`), review it, and apply the new file")
}

/// What moved between the plan file and the inputs read now (all but the state and plan).
fn moved_inputs(f: &PlanFile, now: &Digests, vars: &[String], package: Option<&str>) -> Vec<String> {
    let mut moved = Vec::new();
    let then = &f.digests;
    let mut files = &then.workflow;
    let none = BTreeMap::new();
    if let (WorkflowOrigin::Package { reference, digest }, Some(now_digest)) = (&f.workflow, package)
        && digest != now_digest
    {
        moved.push(format!("the package {reference} is now {now_digest}"));
        // Its files are named by the digest: every one differs, which says nothing more.
        files = &none;
    }
    for (file, d) in files {
        match now.workflow.get(file) {
            None => moved.push(format!("the workflow file {file} is no longer read")),
            Some(n) if n != d => moved.push(format!("the workflow file {file} changed")),
            Some(_) => {}
        }
    }
    for file in now
        .workflow
        .keys()
        .filter(|k| !then.workflow.contains_key(*k) && !files.is_empty())
    {
        moved.push(format!("the workflow file {file} is read now, and was not"));
    }
    let data_shown = f.data.file.as_deref().unwrap_or("(none)");
    match (&then.data_file, &now.data_file) {
        (Some(a), Some(b)) if a != b => moved.push(format!("the data file {data_shown} changed")),
        (Some(_), None) => moved.push(format!("the data file {data_shown} is gone")),
        // Only ./data.yaml can appear: a plan that read none is applied with none given.
        (None, Some(_)) => moved.push("the data file data.yaml is read now, and the plan read none".to_owned()),
        _ => {}
    }
    let names: Vec<&str> = vars.iter().map(|v| var_name(v)).collect();
    if names != f.data.vars.iter().map(String::as_str).collect::<Vec<_>>() {
        moved.push(format!(
            "the --vars are not those of the plan (then: {}; now: {})",
            list_or_none(&f.data.vars),
            list_or_none(&names)
        ));
    } else {
        for (i, name) in names.iter().enumerate() {
            if then.vars.get(i) != now.vars.get(i) {
                moved.push(format!("--var {name} has another value"));
            }
        }
    }
    if moved.is_empty() && then.data != now.data {
        moved.push("the data changed".to_owned());
    }
    moved
}

fn list_or_none(names: &[impl AsRef<str>]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

/// The runs since the plan, for the state's line: `run 7: apply by a@b at …`.
async fn runs_since(store: &dyn lyra_state::Store, deployment: &str, last: Option<RunId>) -> String {
    let Ok(runs) = store.history(deployment).await else {
        return String::new();
    };
    let since: Vec<String> = runs
        .iter()
        .filter(|r| last.is_none_or(|l| r.id > l))
        .take(3)
        .map(|r| {
            format!(
                "run {}: {} by {} at {}",
                r.id,
                r.operation.as_str(),
                r.actor,
                output::instant(r.started_at)
            )
        })
        .collect();
    if since.is_empty() {
        String::new()
    } else {
        format!(" ({})", since.join(", "))
    }
}

/// `lyra apply FILE`.
pub async fn apply(a: &RunArgs, loaded: Loaded, out: Output) -> Result<(), Exit> {
    let f = &loaded.file;
    let path = loaded.path.display().to_string();
    if let Some(name) = &a.name
        && *name != f.deployment
    {
        return Err(Exit::new(
            Exit::FAILURE,
            kind::STALE_PLAN,
            format!("{path} is a plan for the deployment '{}', not '{name}'", f.deployment),
        )
        .with("plan_file", &path)
        .with("deployment", &f.deployment));
    }
    let recorded_data = f.data.file.as_deref().map(PathBuf::from);
    if let Some(given) = &a.data
        && Some(given) != recorded_data.as_ref()
    {
        return Err(Exit::usage(format!(
            "{path} was planned with the data file {}: apply reads it again from there (leave out --data)",
            f.data.file.as_deref().unwrap_or("(none)")
        )));
    }
    let (workflow, package_digest) = match &f.workflow {
        WorkflowOrigin::Files { argument, load_path } => (
            WorkflowArgs {
                workflow: argument.clone(),
                workflows: load_path.as_ref().map(PathBuf::from),
                registry: args::RegistryArgs {
                    insecure: a.workflow.registry.insecure.clone(),
                },
            },
            false,
        ),
        WorkflowOrigin::Package { reference, .. } => (
            WorkflowArgs {
                workflow: reference.clone(),
                workflows: None,
                registry: args::RegistryArgs {
                    insecure: a.workflow.registry.insecure.clone(),
                },
            },
            true,
        ),
    };
    let providers = providers(a, workflow.workflows.as_deref()).await;
    // The data is read again from where the plan read it; a plan that read none reads
    // ./data.yaml only if it appeared since, which is then named as moved.
    let inputs = read_inputs(
        &workflow,
        recorded_data.as_deref(),
        &a.vars,
        Some(&f.deployment),
        &providers,
    )
    .await?;
    let store = crate::open_existing(a.state.as_deref()).await?;
    let salt = hex::decode(&f.key.salt).map_err(|e| damaged(&loaded.path, &format!("its salt is not hex: {e}")))?;
    let key = Keyed::new(store.store_id(), &salt);
    if !key.verify("check", b"", &f.key.check) {
        return Err(Exit::new(
            Exit::FAILURE,
            kind::STALE_PLAN,
            format!(
                "{path} was made against another state store ({}), not {}",
                f.state,
                crate::state_label(a.state.as_deref())
            ),
        )
        .with("plan_file", &path)
        .with("state", crate::state_label(a.state.as_deref()))
        .hint("give the state it was made against with --state (or LYRA_STATE)"));
    }
    if !f.sealed_by(&key) {
        return Err(damaged(
            &loaded.path,
            "it was changed after it was written (its MAC does not match)",
        ));
    }
    let now = input_digests(&key, &inputs, &a.vars);
    let package = match (&inputs.target, package_digest) {
        (load::Target::Package(p), true) => Some(p.digest.as_str()),
        _ => None,
    };
    let mut moved = moved_inputs(f, &now, &a.vars, package);

    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let progress = crate::progress::Progress::new(a.exec.verbose);
    let deployment = f.deployment.clone();
    let (inputs_ref, providers_ref, cancel_ref, progress_ref, key_ref) =
        (&inputs, &providers, &cancel, &progress, &key);
    let store_ref = &store;
    let (checked, kept) = crate::locking::under_lease(
        &store,
        &deployment,
        "apply",
        &a.exec.lock,
        &cancel,
        |leased| async move {
            let capture = Capture::new(leased.recorder());
            let replanned = crate::engine(
                a.exec.concurrency,
                providers_ref,
                &capture,
                &Quiet,
                &inputs_ref.sources,
                cancel_ref,
            )
            .plan(&inputs_ref.program, &f.deployment, &inputs_ref.data)
            .await;
            let report = match replanned {
                Ok(r) => r,
                // A changed input explains why it cannot be planned (a `--var` left out).
                Err(_) if !moved.is_empty() => return Checked::Stale(moved),
                Err(e) => return Checked::Failed(e),
            };
            if !key_ref.verify("state", canonical(&capture.state()).as_bytes(), &f.digests.state) {
                let runs = runs_since(store_ref.as_ref(), &f.deployment, f.last_run).await;
                moved.push(format!("the deployment's state changed since the plan{runs}"));
            }
            let plan = serde_json::to_value(output::report_json(&report)).unwrap_or(Value::Null);
            if !key_ref.verify("changes", &changes_bytes(&plan), &f.digests.changes) {
                let steps = changed_steps(&f.plan, &plan);
                if steps.is_empty() {
                    moved.push("the plan's changes are not the same".to_owned());
                }
                moved.extend(steps);
            }
            if !moved.is_empty() {
                return Checked::Stale(moved);
            }
            Checked::Applied(
                crate::engine(
                    a.exec.concurrency,
                    providers_ref,
                    leased.recorder(),
                    progress_ref,
                    &inputs_ref.sources,
                    cancel_ref,
                )
                .apply(&inputs_ref.program, &f.deployment, &inputs_ref.data, &crate::actor())
                .await,
            )
        },
    )
    .await?;
    progress.finish();
    match checked {
        Checked::Stale(moved) => Err(stale(&loaded, &moved)),
        Checked::Failed(e) => Err(crate::engine_error(e, &inputs.sources)),
        Checked::Applied(result) => crate::finish_leased(result, kept, &deployment, &inputs.sources, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Keyed {
        Keyed::new("0b7c6f0e-store", &[7; 32])
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"d": [1, {"z": 0, "y": "é"}], "c": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a": {"c": null, "d": [1, {"y": "é", "z": 0}]}, "b": 1}"#).unwrap();
        assert_eq!(canonical(&a), r#"{"a":{"c":null,"d":[1,{"y":"é","z":0}]},"b":1}"#);
        assert_eq!(canonical(&a), canonical(&b));
    }

    #[test]
    fn digests_depend_on_the_store_the_salt_the_label_and_the_bytes() {
        let k = key();
        let d = k.digest("data", b"hunter2");
        assert_eq!(d.len(), 64);
        assert_eq!(d, key().digest("data", b"hunter2"), "stable");
        assert_ne!(d, k.digest("data", b"hunter3"));
        assert_ne!(d, k.digest("var", b"hunter2"), "labelled");
        assert_ne!(d, Keyed::new("another-store", &[7; 32]).digest("data", b"hunter2"));
        assert_ne!(d, Keyed::new("0b7c6f0e-store", &[8; 32]).digest("data", b"hunter2"));
        // An unkeyed hash of the secret is not what the file holds.
        use sha2::Digest as _;
        assert_ne!(d, hex::encode(sha2::Sha256::digest(b"hunter2")));
        assert!(k.verify("data", b"hunter2", &d));
        assert!(!k.verify("data", b"hunter2", "zz"));
        assert!(!k.verify("data", b"other", &d));
    }

    fn sample() -> PlanFile {
        PlanFile {
            format: FORMAT.to_owned(),
            lyra_version: "0.1.0".to_owned(),
            created_at: "2026-12-03T10:00:00.000Z".to_owned(),
            deployment: "web".to_owned(),
            state: ".lyra/state.db".to_owned(),
            workflow: WorkflowOrigin::Files {
                argument: "web".to_owned(),
                load_path: None,
            },
            data: DataOrigin {
                file: Some("data.yaml".to_owned()),
                vars: vec!["size".to_owned()],
            },
            last_run: Some(3),
            key: KeyInfo {
                salt: hex::encode([7; 32]),
                check: key().digest("check", b""),
            },
            digests: Digests {
                workflow: BTreeMap::from([("workflows/web.yaml".to_owned(), "ab".to_owned())]),
                data_file: None,
                vars: vec!["cd".to_owned()],
                data: "ef".to_owned(),
                state: "01".to_owned(),
                changes: "23".to_owned(),
            },
            plan: serde_json::json!({"steps": []}),
            plan_text: "No changes.\n".to_owned(),
            mac: String::new(),
        }
    }

    #[test]
    fn a_plan_file_round_trips_and_its_mac_catches_any_edit() {
        let mut f = sample();
        f.seal(&key());
        let text = serde_json::to_string_pretty(&f).unwrap();
        let back = PlanFile::parse(&text).unwrap().expect("a plan file");
        assert_eq!(back, f);
        assert!(back.sealed_by(&key()));
        assert!(!back.sealed_by(&Keyed::new("another-store", &[7; 32])));
        let mut edited = back.clone();
        edited.plan_text = "Plan: 0 to create.\n".to_owned();
        assert!(!edited.sealed_by(&key()));
        let mut edited = back;
        edited.deployment = "other".to_owned();
        assert!(!edited.sealed_by(&key()));
    }

    #[test]
    fn only_plan_files_are_plan_files() {
        assert_eq!(
            PlanFile::parse("steps:\n  a:\n    resource: Null::Resource\n"),
            Ok(None)
        );
        assert_eq!(PlanFile::parse(r#"{"steps": {}}"#), Ok(None));
        assert_eq!(PlanFile::parse(r#"{"format": "lyra-state"}"#), Ok(None));
        let newer = PlanFile::parse(r#"{"format": "lyra-plan/2"}"#).unwrap_err();
        assert!(newer.contains("lyra-plan/2") && newer.contains(FORMAT), "{newer}");
        let cut = PlanFile::parse(r#"{"format": "lyra-plan/1", "deploym"#).unwrap_err();
        assert!(cut.contains("not valid JSON"), "{cut}");
        let missing = PlanFile::parse(r#"{"format": "lyra-plan/1"}"#).unwrap_err();
        assert!(missing.contains("damaged"), "{missing}");
    }

    #[test]
    fn the_state_value_is_the_same_in_any_record_order() {
        let rec = output::tests::record;
        let state = |ids: &[&str]| DeploymentState {
            name: "web".to_owned(),
            workflow: Some("web".to_owned()),
            resources: ids.iter().map(|i| rec(i)).collect(),
            unreadable: vec![],
        };
        let (a, b) = (state(&["a", "b"]), state(&["b", "a"]));
        assert_eq!(canonical(&state_value(Some(&a))), canonical(&state_value(Some(&b))));
        assert_ne!(state_value(Some(&a)), state_value(None));
        let mut c = state(&["a", "b"]);
        c.resources[0].actual.insert("size".to_owned(), 2.into());
        assert_ne!(canonical(&state_value(Some(&a))), canonical(&state_value(Some(&c))));
    }

    #[test]
    fn moved_inputs_name_each_file_and_var() {
        let f = sample();
        let same = f.digests.clone();
        let vars = ["size=1".to_owned()];
        assert!(moved_inputs(&f, &same, &vars, None).is_empty());
        let mut now = same.clone();
        now.workflow.insert("workflows/web.yaml".to_owned(), "ff".to_owned());
        now.workflow.insert("workflows/db.yaml".to_owned(), "ee".to_owned());
        now.data_file = Some("01".to_owned());
        assert_eq!(
            moved_inputs(&f, &now, &vars, None),
            [
                "the workflow file workflows/web.yaml changed",
                "the workflow file workflows/db.yaml is read now, and was not",
                "the data file data.yaml is read now, and the plan read none",
            ]
        );
        let mut now = same.clone();
        now.vars = vec!["00".to_owned()];
        assert_eq!(moved_inputs(&f, &now, &vars, None), ["--var size has another value"]);
        let moved = moved_inputs(&f, &same, &["size=1".to_owned(), "zone=b".to_owned()], None);
        assert_eq!(
            moved,
            ["the --vars are not those of the plan (then: size; now: size, zone)"]
        );
        let mut now = same;
        now.data = "00".to_owned();
        assert_eq!(moved_inputs(&f, &now, &vars, None), ["the data changed"]);
    }

    #[test]
    fn changed_steps_say_what_the_plan_does_now() {
        let plan = |steps: Value| serde_json::json!({ "steps": steps });
        let then = plan(serde_json::json!([
            {"step": "web", "action": "no-op", "status": "planned", "changes": [], "duration_ms": 1},
            {"step": "db", "action": "create", "status": "planned", "changes": [], "duration_ms": 1},
        ]));
        let now = plan(serde_json::json!([
            {"step": "db", "action": "create", "status": "planned", "changes": [], "duration_ms": 9},
            {"step": "web", "action": "update", "status": "planned", "duration_ms": 2,
             "changes": [{"path": "size", "old": 1, "new": 2}]},
        ]));
        assert_eq!(
            changed_steps(&then, &now),
            ["step web: the plan now updates `size` (was: changes nothing)"]
        );
        assert!(changed_steps(&then, &then).is_empty());
        assert_eq!(
            changes_bytes(&then),
            changes_bytes(&plan(serde_json::json!([
                {"step": "db", "action": "create", "status": "planned", "changes": [], "duration_ms": 5},
                {"step": "web", "action": "no-op", "status": "planned", "changes": [], "duration_ms": 7},
            ]))),
            "order and durations do not count"
        );
        let gone = changed_steps(&then, &plan(serde_json::json!([])));
        assert_eq!(gone.len(), 2, "{gone:?}");
    }
}

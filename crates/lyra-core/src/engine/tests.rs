//! Engine semantics with an in-memory store and a scripted provider (the end-to-end tests use
//! the real ones).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use futures::executor::block_on;
use serde_json::json;

use super::*;
use crate::diag::Sources;
use crate::program;
use crate::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use crate::schema::{AttributeSchema, ResourceSchema};
use crate::state::{RunId, UnreadableRecord};
use crate::types::Type;

mod adopt;
mod controls;
mod drift;
mod target;

/// Waits on a thread of its own: these tests run on `block_on`, with no runtime.
struct ThreadTimer;

impl Timer for ThreadTimer {
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        let (tx, rx) = futures::channel::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            let _ = tx.send(());
        });
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

struct MemStore {
    id: String,
    deployments: Mutex<HashMap<String, DeploymentState>>,
    runs: Mutex<RunId>,
    /// What each run recorded as its end, for the history.
    ends: Mutex<Vec<RunEnd>>,
    /// Every put, in order: the step and whether it was an intent.
    puts: Mutex<Vec<(String, bool)>>,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::with_id("store-1")
    }
}

impl MemStore {
    fn with_id(id: &str) -> Self {
        MemStore {
            id: id.to_owned(),
            deployments: Mutex::default(),
            runs: Mutex::new(0),
            ends: Mutex::default(),
            puts: Mutex::default(),
        }
    }
}

#[async_trait]
impl crate::state::Recorder for MemStore {
    fn store_id(&self) -> &str {
        &self.id
    }
    async fn load(&self, d: &str) -> Result<Option<DeploymentState>, StoreError> {
        Ok(self.deployments.lock().unwrap().get(d).cloned())
    }
    async fn begin_run(&self, run: &RunStart) -> Result<RunId, StoreError> {
        let mut m = self.deployments.lock().unwrap();
        m.entry(run.deployment.clone()).or_insert_with(|| DeploymentState {
            name: run.deployment.clone(),
            ..Default::default()
        });
        let mut runs = self.runs.lock().unwrap();
        *runs += 1;
        Ok(*runs)
    }
    async fn put_resource(&self, d: &str, rec: &ResourceRecord) -> Result<(), StoreError> {
        self.puts.lock().unwrap().push((rec.step_id.clone(), rec.pending));
        let mut m = self.deployments.lock().unwrap();
        let dep = m.get_mut(d).unwrap();
        dep.resources.retain(|r| r.step_id != rec.step_id);
        dep.resources.push(rec.clone());
        Ok(())
    }
    async fn remove_resource(&self, d: &str, step_id: &str) -> Result<(), StoreError> {
        self.deployments
            .lock()
            .unwrap()
            .get_mut(d)
            .unwrap()
            .resources
            .retain(|r| r.step_id != step_id);
        Ok(())
    }
    async fn finish_run(&self, _: RunId, end: &RunEnd) -> Result<(), StoreError> {
        self.ends.lock().unwrap().push(end.clone());
        Ok(())
    }
}

/// The advice of Lyra's CLI and controller (`lyra_host::Advice`), which messages here pin.
struct Words;

impl Hints for Words {
    fn add_data_key(&self, key: &str) -> String {
        format!("the data file or `--var {key}=VALUE`; `spec.data` on Kubernetes")
    }
    fn set_data_key(&self, key: &str) -> String {
        format!("`--var {key}=VALUE`; `spec.data` on Kubernetes")
    }
    fn forget_records(&self, deployment: &str, step_ids: &[&str]) -> String {
        format!("`lyra state rm {deployment} {}`", step_ids.join(" "))
    }
}

/// `Test::Thing`: fails when `input` is "boom", and with a message quoting `input` when it
/// contains "fail" (or, on delete, "undeletable"); `echo` echoes `input`, as a provider may do
/// without knowing it is secret; `deep` returns `input` nested in lists `input` times when
/// `input` is a number; logs every call.
#[derive(Default)]
struct Scripted {
    log: Mutex<Vec<String>>,
    next: Mutex<u32>,
    /// When set, creates are tracked by idempotency key and `lookup` answers from them.
    idempotent: AtomicBool,
    made: Mutex<HashMap<String, Created>>,
    /// The key of each step's last create.
    keys: Mutex<HashMap<String, String>>,
}

impl Scripted {
    fn key_of(&self, step_id: &str) -> String {
        self.keys.lock().unwrap()[step_id].clone()
    }
}

#[async_trait]
impl Provider for Scripted {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let attributes = vec![
            AttributeSchema::new("input", Type::Any),
            AttributeSchema::new("zone", Type::optional(Type::String)).immutable(),
            AttributeSchema::new("id", Type::optional(Type::String)).provided(),
            AttributeSchema::new("echo", Type::Any).computed(),
            AttributeSchema::new("deep", Type::Any).computed(),
        ];
        // The same, existing only as its records; and again, read as its record is (its
        // `read` below would find nothing, were it asked).
        vec![
            ResourceSchema::new("Test::Thing", attributes.clone()),
            ResourceSchema::new("Test::Local", attributes.clone()).local(),
            ResourceSchema::new("Test::Recorded", attributes)
                .local()
                .read_is_record(),
        ]
    }
    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        self.log.lock().unwrap().push(format!("create {}", cx.step_id));
        let key = cx.idempotency_key.expect("create has a key").to_owned();
        self.keys.lock().unwrap().insert(cx.step_id.to_owned(), key.clone());
        if self.idempotent.load(Ordering::SeqCst)
            && let Some(made) = self.made.lock().unwrap().get(&key)
        {
            return Ok(made.clone());
        }
        if desired.get("input") == Some(&json!("boom")) {
            return Err(ProviderError::Other("boom".into()));
        }
        fails(desired)?;
        let mut n = self.next.lock().unwrap();
        *n += 1;
        let id = format!("t-{n}");
        let mut actual = echoed(desired);
        actual.insert("id".into(), json!(id));
        let created = Created {
            external_id: id,
            actual,
        };
        if self.idempotent.load(Ordering::SeqCst) {
            self.made.lock().unwrap().insert(key, created.clone());
        }
        Ok(created)
    }
    async fn lookup(&self, cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        self.log.lock().unwrap().push(format!("lookup {}", cx.step_id));
        if !self.idempotent.load(Ordering::SeqCst) {
            return Ok(Lookup::Unsupported);
        }
        let key = cx.idempotency_key.expect("lookup has a key");
        Ok(match self.made.lock().unwrap().get(key) {
            Some(c) => Lookup::Found(c.clone()),
            None => Lookup::Absent,
        })
    }
    async fn read(&self, cx: &OpContext<'_>, _: &str, prior: Option<&Map>) -> Result<Option<Map>, ProviderError> {
        if cx.type_name == "Test::Recorded" {
            return Ok(None);
        }
        Ok(prior.cloned())
    }
    async fn update(&self, cx: &OpContext<'_>, _: &str, desired: &Map, prior: &Map) -> Result<Map, ProviderError> {
        self.log.lock().unwrap().push(format!("update {}", cx.step_id));
        if desired.get("input") == Some(&json!("boom")) {
            return Err(ProviderError::Other("boom".into()));
        }
        fails(desired)?;
        let mut actual = echoed(desired);
        actual.insert("id".into(), prior["id"].clone());
        Ok(actual)
    }
    async fn delete(&self, cx: &OpContext<'_>, _: &str, prior: &Map) -> Result<(), ProviderError> {
        self.log.lock().unwrap().push(format!("delete {}", cx.step_id));
        match prior.get("input").and_then(Value::as_str) {
            Some(s) if s.contains("undeletable") => Err(ProviderError::Other(format!("cannot delete {s}"))),
            _ => Ok(()),
        }
    }
}

fn fails(desired: &Map) -> Result<(), ProviderError> {
    match desired.get("input") {
        Some(Value::String(s)) if s.contains("fail") => Err(ProviderError::InvalidValue {
            attribute: "input".into(),
            message: format!("'{s}' is not acceptable"),
        }),
        _ => Ok(()),
    }
}

/// The actual state: the desired one with `echo` (and `deep`, for numbers) added.
fn echoed(desired: &Map) -> Map {
    let mut actual = desired.clone();
    let input = desired.get("input").cloned().unwrap_or(Value::Null);
    if let Some(n) = input.as_u64() {
        let mut v = json!("leaf");
        for _ in 0..n {
            v = json!([v]);
        }
        actual.insert("deep".into(), v);
    }
    actual.insert("echo".into(), input);
    actual
}

/// Loads workflow `t` from `yaml`, panicking with its diagnostics.
fn load(yaml: &str, providers: &Providers, sources: &mut Sources) -> Program {
    let mut none = |_: &str| None;
    program::load(
        "t",
        ("t.yaml".into(), yaml.into()),
        &mut none,
        sources,
        providers.schemas(),
    )
    .unwrap_or_else(|d| panic!("{}", d.render(sources)))
}

/// An engine as the tests run one: 4 operations at once, the tests' hints and timer.
fn engine_for<'a>(
    providers: &'a Providers,
    store: &'a dyn crate::state::Recorder,
    observer: &'a dyn Observer,
    sources: &'a Sources,
    cancel: &'a AtomicBool,
) -> Engine<'a> {
    Engine {
        providers,
        store,
        observer,
        sources,
        concurrency: 4,
        cancel,
        hints: &Words,
        timer: &ThreadTimer,
        leave_to_exit: false,
    }
}

struct Fixture {
    providers: Providers,
    store: MemStore,
    cancel: AtomicBool,
    provider: Arc<Scripted>,
    observed: Recorder,
}

/// Keeps what observers see (live progress, `-v` output, controller logs).
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Observer for Recorder {
    fn step_finished(&self, r: &StepReport) {
        self.0.lock().unwrap().push(format!("{r:?}"));
    }
}

impl Fixture {
    fn new() -> Fixture {
        let provider = Arc::new(Scripted::default());
        let mut providers = Providers::new();
        let dynp: Arc<dyn Provider> = provider.clone();
        providers.register(&dynp);
        Fixture {
            providers,
            store: MemStore::default(),
            cancel: AtomicBool::new(false),
            provider,
            observed: Recorder::default(),
        }
    }

    fn run(&self, yaml: &str, data: Value, mode: Mode) -> Report {
        self.try_run(yaml, data, mode).unwrap()
    }

    fn try_run(&self, yaml: &str, data: Value, mode: Mode) -> Result<Report, EngineError> {
        let mut sources = Sources::default();
        let prog = load(yaml, &self.providers, &mut sources);
        let engine = engine_for(&self.providers, &self.store, &self.observed, &sources, &self.cancel);
        let data = data.as_object().cloned().unwrap_or_default();
        block_on(async {
            match mode {
                Mode::Plan => engine.plan(&prog, "d", &data).await,
                _ => engine.apply(&prog, "d", &data, "test").await,
            }
        })
    }

    fn ids(&self) -> Vec<String> {
        let m = self.store.deployments.lock().unwrap();
        let mut v: Vec<String> = m
            .get("d")
            .map(|d| d.resources.iter().map(|r| r.step_id.clone()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// `lyra delete d`.
    fn delete(&self) -> Report {
        let sources = Sources::default();
        let engine = engine_for(&self.providers, &self.store, &self.observed, &sources, &self.cancel);
        block_on(engine.delete("d", "test")).unwrap()
    }

    /// What a crash between `create` and recording it leaves: the intent only.
    fn crash_after_create(&self, step_id: &str) {
        let mut m = self.store.deployments.lock().unwrap();
        let rec = m
            .get_mut("d")
            .unwrap()
            .resources
            .iter_mut()
            .find(|r| r.step_id == step_id)
            .unwrap();
        *rec = ResourceRecord::intent(
            &rec.step_id,
            &rec.type_name,
            rec.desired.clone(),
            rec.depends_on.clone(),
            self.provider.key_of(step_id),
        );
    }

    fn record(&self, step_id: &str) -> ResourceRecord {
        let m = self.store.deployments.lock().unwrap();
        m["d"].resource(step_id).unwrap().clone()
    }

    fn log(&self) -> Vec<String> {
        std::mem::take(&mut *self.provider.log.lock().unwrap())
    }
}

fn step<'r>(r: &'r Report, id: &str) -> &'r StepReport {
    r.steps
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("no step {id} in {:?}", r.steps))
}

const CHAIN: &str = "
steps:
  a:
    returns: {aid: id}
    resource: Test::Thing
    value: {input: $x}
  b:
    returns: {bid: id}
    resource: Test::Thing
    value: {input: $aid}
  c:
    resource: Test::Thing
    value: {input: independent}
parameters: [x]
";

#[test]
fn failure_skips_dependents_finishes_other_branches_and_deletes_nothing() {
    let f = Fixture::new();
    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(f.ids(), ["a", "b", "c"]);
    f.log();

    let r = f.run(CHAIN, json!({"x": "boom"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(step(&r, "a").status, Status::Failed);
    assert_eq!(step(&r, "b").status, Status::Skipped);
    assert_eq!(step(&r, "c").status, Status::Done);
    assert!(
        f.log().iter().all(|l| !l.starts_with("delete")),
        "nothing is deleted after a failure"
    );
    assert_eq!(f.ids(), ["a", "b", "c"]);

    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.counts.unchanged, 3);
}

#[test]
fn plan_reports_update_replace_and_delete() {
    let f = Fixture::new();
    f.run(CHAIN, json!({"x": "v1"}), Mode::Apply);
    let changed = CHAIN.replace("value: {input: independent}", "value: {input: independent, zone: z2}");
    let r = f.run(&changed, json!({"x": "v2"}), Mode::Plan);
    assert_eq!(step(&r, "a").action, Action::Update);
    assert_eq!(step(&r, "a").changes[0].attribute, "input");
    // b reads a's id, which an update keeps: unchanged.
    assert_eq!(step(&r, "b").action, Action::Noop);
    assert_eq!(step(&r, "c").action, Action::Replace);
    assert!(step(&r, "c").changes.iter().any(|c| c.forces_replace));
    let without_c = CHAIN.replace("  c:\n    resource: Test::Thing\n    value: {input: independent}\n", "");
    let r = f.run(&without_c, json!({"x": "v1"}), Mode::Plan);
    assert_eq!(step(&r, "c").action, Action::Delete);
    assert!(
        f.log().iter().all(|l| l.starts_with("create")),
        "a plan changes nothing"
    );
}

#[test]
fn deleting_an_unknown_deployment_records_nothing() {
    let f = Fixture::new();
    let r = f.delete();
    assert_eq!((r.outcome, r.run, r.steps.len()), (Outcome::Succeeded, None, 0));
    assert!(
        f.store.deployments.lock().unwrap().is_empty(),
        "the delete created the deployment it deleted"
    );
}

#[test]
fn deletion_runs_dependents_first() {
    let f = Fixture::new();
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    f.log();
    let r = f.delete();
    assert_eq!(r.counts.deleted, 3);
    let log = f.log();
    let pos = |s: &str| log.iter().position(|l| l == s).unwrap();
    assert!(pos("delete b") < pos("delete a"), "{log:?}");
    assert!(f.ids().is_empty());
}

#[test]
fn guard_false_removes_the_resource_and_true_creates_it() {
    let f = Fixture::new();
    let wf = "parameters: [on]\nsteps:\n  g:\n    when: on\n    resource: Test::Thing\n    value: {input: 1}\n";
    f.run(wf, json!({"on": true}), Mode::Apply);
    assert_eq!(f.ids(), ["g"]);
    let r = f.run(wf, json!({"on": false}), Mode::Apply);
    assert_eq!(step(&r, "g").status, Status::GuardedOff);
    assert!(
        r.steps
            .iter()
            .any(|s| s.id == "g" && s.action == Action::Delete && s.status == Status::Done)
    );
    assert!(f.ids().is_empty(), "the old resource is deleted");
}

#[test]
fn a_cancelled_run_starts_nothing_and_collects_no_garbage() {
    let f = Fixture::new();
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    f.log();
    f.cancel.store(true, Ordering::SeqCst);
    let r = f.run(
        "steps:\n  other:\n    resource: Test::Thing\n    value: {input: 1}\n",
        json!({}),
        Mode::Apply,
    );
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(f.log().is_empty());
    assert_eq!(f.ids(), ["a", "b", "c"]);
}

#[test]
fn collections_call_and_returns() {
    let f = Fixture::new();
    let wf = "
returns: [all, total]
steps:
  each:
    each: [[p, 1], [q, 2]]
    as: [name, n]
    into: all
    step:
      returns: {r: id}
      resource: Test::Thing
      value: {input: {name: $name, n: $n}}
  sum:
    returns:
      total: {value: {ids: $all}}
    steps:
      inner:
        returns: {x: id}
        resource: Test::Thing
        value: {input: $all}
";
    let r = f.run(wf, json!({}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    let all = r.returns["all"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    assert_ne!(all[0], all[1]);
    assert_eq!(r.returns["total"], json!({"ids": all}));
    assert_eq!(f.ids(), ["each/0", "each/1", "sum/inner"]);
}

#[test]
fn call_renames_parameters_and_returns() {
    let f = Fixture::new();
    let callee = "parameters: [image]\nreturns: [made]\nsteps:\n  it:\n    returns: {made: id}\n    resource: Test::Thing\n    value: {input: $image}\n";
    let caller = "parameters: [img]\nreturns: [out]\nsteps:\n  use:\n    call: lib::make\n    parameters: {img: image}\n    returns: {out: made}\n";
    let mut sources = Sources::default();
    let mut fetch = |name: &str| (name == "lib::make").then(|| ("lib/make.yaml".to_owned(), callee.to_owned()));
    let prog = program::load(
        "main",
        ("main.yaml".into(), caller.into()),
        &mut fetch,
        &mut sources,
        f.providers.schemas(),
    )
    .unwrap_or_else(|d| panic!("{}", d.render(&sources)));
    let engine = engine_for(&f.providers, &f.store, &Quiet, &sources, &f.cancel);
    let data = json!({"img": "nginx"}).as_object().cloned().unwrap();
    let r = block_on(engine.apply(&prog, "d", &data, "t")).unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    assert_eq!(f.ids(), ["use/it"]);
    let rec = f.store.deployments.lock().unwrap()["d"].resources[0].clone();
    assert_eq!(rec.desired["input"], json!("nginx"));
    assert_eq!(r.returns["out"], json!(rec.external_id));

    // A call to a workflow that does not exist is a validation error at the call.
    let mut none = |_: &str| None;
    let err = program::load(
        "main",
        ("main.yaml".into(), caller.into()),
        &mut none,
        &mut Sources::default(),
        f.providers.schemas(),
    )
    .unwrap_err();
    assert!(
        err.0[0]
            .message
            .contains("calls 'lib::make', which is not a known workflow"),
        "{err}"
    );
}

#[test]
fn a_negative_count_fails_the_collection() {
    let f = Fixture::new();
    let r = f.run(
        "steps:\n  n:\n    times: -1\n    step:\n      resource: Test::Thing\n      value: {input: 1}\n",
        json!({}),
        Mode::Apply,
    );
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(
        step(&r, "n")
            .error
            .as_deref()
            .unwrap()
            .contains("'times' must not be negative")
    );
}

#[test]
fn a_pending_record_is_resolved_by_the_providers_key_lookup() {
    let f = Fixture::new();
    f.provider.idempotent.store(true, Ordering::SeqCst);
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    let made = f.record("a");
    f.crash_after_create("a");
    f.log();

    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Plan);
    assert_eq!(step(&r, "a").action, Action::Noop);
    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(f.log(), ["lookup a", "lookup a"], "found, not created again");
    let rec = f.record("a");
    assert!(!rec.pending);
    assert_eq!(rec.external_id, made.external_id);

    // The run died before the provider made anything: create it.
    f.crash_after_create("c");
    let key = f.provider.key_of("c");
    f.provider.made.lock().unwrap().remove(&key);
    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(step(&r, "c").action, Action::Create);
    assert_eq!(f.log(), ["lookup c", "create c"]);
    assert!(!f.record("c").pending);
}

/// `lyra state rm`, `deletionPolicy: Orphan`: a forgotten resource's key goes with its record,
/// so the next create makes a new resource instead of adopting the one the user chose to keep.
#[test]
fn a_forgotten_resource_is_never_adopted() {
    let f = Fixture::new();
    f.provider.idempotent.store(true, Ordering::SeqCst);
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    let (old, old_key) = (f.record("c"), f.provider.key_of("c"));
    assert!(old_key.starts_with("store-1/1/d/c"), "{old_key}");
    assert_eq!(old.create_key, None, "a recorded resource keeps no key");
    f.store
        .deployments
        .lock()
        .unwrap()
        .get_mut("d")
        .unwrap()
        .resources
        .retain(|r| r.step_id != "c");
    f.log();

    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(step(&r, "c").action, Action::Create);
    assert_eq!(f.log(), ["create c"], "created, not looked up");
    assert_ne!(f.record("c").external_id, old.external_id, "a new resource");
    assert_eq!(f.provider.key_of("c"), "store-1/2/d/c");
}

/// Two stores with the same deployment name, one provider: neither adopts the other's
/// resources.
#[test]
fn stores_never_share_create_keys() {
    let one = Fixture::new();
    one.provider.idempotent.store(true, Ordering::SeqCst);
    one.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    let two = Fixture {
        providers: one.providers.clone(),
        store: MemStore::with_id("store-2"),
        cancel: AtomicBool::new(false),
        provider: Arc::clone(&one.provider),
        observed: Recorder::default(),
    };
    let first = one.record("a").external_id;
    two.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_ne!(two.record("a").external_id, first);
    assert_eq!(two.provider.made.lock().unwrap().len(), 6, "three resources per store");
}

/// A pending record keeps its key until it is resolved: the lookup and the retried create
/// use it, whatever run they are in.
#[test]
fn a_pending_record_keeps_its_key_across_runs() {
    let f = Fixture::new();
    f.provider.idempotent.store(true, Ordering::SeqCst);
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    let key = f.provider.key_of("c");
    f.crash_after_create("c");
    assert_eq!(f.record("c").create_key.as_deref(), Some(key.as_str()));
    f.provider.made.lock().unwrap().remove(&key);
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(f.provider.key_of("c"), key, "the retried create is the same create");
    // Records written before keys were recorded carry none: the old key is asked.
    f.crash_after_create("a");
    let legacy = {
        let mut m = f.store.deployments.lock().unwrap();
        let rec = m
            .get_mut("d")
            .unwrap()
            .resources
            .iter_mut()
            .find(|r| r.step_id == "a")
            .unwrap();
        rec.create_key = None;
        rec.clone()
    };
    f.provider.made.lock().unwrap().insert(
        "d/a".to_owned(),
        Created {
            external_id: "legacy".into(),
            actual: legacy.desired,
        },
    );
    f.log();
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(f.log()[0], "lookup a");
    assert_eq!(f.record("a").external_id, "legacy", "adopted through the old key");
}

#[test]
fn a_pending_record_the_provider_cannot_check_is_reported_not_created_again() {
    let f = Fixture::new();
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    f.crash_after_create("a");
    f.log();

    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Failed);
    let a = step(&r, "a");
    assert_eq!(a.status, Status::Failed);
    assert!(
        a.error.as_deref().unwrap().contains("possibly created, unrecorded"),
        "{a:?}"
    );
    assert_eq!(step(&r, "b").status, Status::Skipped);
    assert_eq!(f.log(), ["lookup a"], "nothing is created blindly");
    assert!(f.record("a").pending, "the trace stays until someone decides");

    let r = f.delete();
    assert_eq!(step(&r, "a").status, Status::Failed);
    assert_eq!(f.ids(), ["a"], "the others are deleted, the unknown one is kept");
}

/// Among the steps ready to start, the one written first starts first: progress reads top to
/// bottom, whatever the concurrency.
#[test]
fn ready_steps_start_in_the_order_they_are_written() {
    let f = Fixture::new();
    let yaml = "
steps:
  zeta:
    returns: {zid: id}
    resource: Test::Thing
    value: {input: 1}
  alpha:
    resource: Test::Thing
    value: {input: 2}
  mid:
    resource: Test::Thing
    value: {input: $zid}
  beta:
    resource: Test::Thing
    value: {input: 3}
";
    let r = f.run(yaml, json!({}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    let intents: Vec<String> = (f.store.puts.lock().unwrap().iter())
        .filter(|(_, intent)| *intent)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(intents, ["zeta", "alpha", "mid", "beta"]);
}

#[test]
fn only_resources_that_exist_elsewhere_record_an_intent() {
    let f = Fixture::new();
    let yaml = "
steps:
  a:
    resource: Test::Thing
    value: {input: 1}
  b:
    resource: Test::Local
    value: {input: 2}
";
    let r = f.run(yaml, json!({}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    let mut puts = f.store.puts.lock().unwrap().clone();
    puts.sort();
    assert_eq!(
        puts,
        [("a".to_owned(), false), ("a".to_owned(), true), ("b".to_owned(), false)],
        "the local type's create is recorded once, with no intent before it"
    );
    // A replace of a local type: delete, create, one record.
    f.store.puts.lock().unwrap().clear();
    let r = f.run(&yaml.replace("input: 2}", "input: 2, zone: z}"), json!({}), Mode::Apply);
    assert_eq!(step(&r, "b").action, Action::Replace, "{r:#?}");
    assert_eq!(*f.store.puts.lock().unwrap(), [("b".to_owned(), false)]);
}

#[test]
fn a_type_read_as_its_record_is_not_asked() {
    let f = Fixture::new();
    let yaml = "
steps:
  a:
    returns: {out: echo}
    resource: Test::Recorded
    value: {input: 1}
  b:
    resource: Test::Thing
    value: {input: $out}
";
    let r = f.run(yaml, json!({}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:#?}");
    let recorded = f.record("a");
    f.log();
    // Asked, the provider would answer "gone", and `a` would be created again.
    for mode in [Mode::Plan, Mode::Apply] {
        let r = f.run(yaml, json!({}), mode);
        assert_eq!(r.outcome, Outcome::Succeeded, "{r:#?}");
        assert_eq!(step(&r, "a").action, Action::Noop, "{mode:?}");
        assert_eq!(
            step(&r, "b").action,
            Action::Noop,
            "{mode:?}: the record's values flow on"
        );
    }
    assert!(f.log().is_empty(), "nothing was created or updated");
    assert_eq!(f.record("a"), recorded);
    // Changed, it is converged as any other type.
    let r = f.run(&yaml.replace("input: 1}", "input: 2}"), json!({}), Mode::Apply);
    assert_eq!(step(&r, "a").action, Action::Update, "{r:#?}");
    assert_eq!(f.record("a").actual["echo"], json!(2));
}

#[test]
fn a_failed_create_leaves_no_intent_behind() {
    let f = Fixture::new();
    let r = f.run(CHAIN, json!({"x": "boom"}), Mode::Apply);
    assert_eq!(step(&r, "a").status, Status::Failed);
    assert_eq!(f.ids(), ["c"]);
    let r = f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(f.ids(), ["a", "b", "c"]);
}

#[test]
fn values_derived_from_a_sensitive_parameter_are_marked_sensitive() {
    let f = Fixture::new();
    let yaml = "
parameters:
  secret: Sensitive[String]
  plain: String
returns: [leaked, open]
steps:
  a:
    returns: {leaked: input}
    resource: Test::Thing
    value: {input: $secret, zone: $plain}
  b:
    returns: {open: input}
    resource: Test::Thing
    value: {input: $plain}
";
    let r = f.run(yaml, json!({"secret": "hunter2", "plain": "z"}), Mode::Plan);
    let a = step(&r, "a");
    let sensitive = |attr: &str| a.changes.iter().find(|c| c.attribute == attr).unwrap().sensitive;
    assert!(sensitive("input"));
    assert!(!sensitive("zone"));
    assert!(step(&r, "b").changes.iter().all(|c| !c.sensitive));
    let r = f.run(yaml, json!({"secret": "hunter2", "plain": "z"}), Mode::Apply);
    assert_eq!(
        r.sensitive_returns,
        ["leaked"],
        "a return read from a tainted attribute"
    );
    assert_eq!(r.returns["open"], json!("z"));
}

#[test]
fn a_sensitive_value_of_the_wrong_type_is_not_echoed() {
    let f = Fixture::new();
    let yaml = "
parameters:
  pin: Sensitive[Integer[0, 99]]
steps:
  a:
    resource: Test::Thing
    value: {input: $pin}
";
    let err = f
        .try_run(yaml, json!({"pin": 123456}), Mode::Apply)
        .unwrap_err()
        .to_string();
    assert!(!err.contains("123456"), "{err}");
    assert!(err.contains("sensitive value is not shown"), "{err}");
}

/// Everything a run let out that someone may read: the reports (text, JSON, status, events),
/// what observers saw (progress, logs) and what the history keeps.
fn everything_shown(f: &Fixture, r: &Result<Report, EngineError>) -> String {
    format!(
        "{r:?}\n{:?}\n{:?}",
        std::mem::take(&mut *f.observed.0.lock().unwrap()),
        std::mem::take(&mut *f.store.ends.lock().unwrap())
    )
}

#[track_caller]
fn assert_hidden(shown: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!shown.contains(s), "{s} leaked:\n{shown}");
    }
}

/// Secrets, old and new, never show, whatever the step does: create, update (a computed
/// attribute echoing the old value, the original bug), no-op, replace, a provider error
/// quoting the secret, delete and a failed delete quoting it.
#[test]
fn secrets_never_show_whatever_the_action() {
    let f = Fixture::new();
    let yaml = |zone: &str| {
        format!(
            "
parameters:
  secret: Sensitive[String]
returns: [echoed, copied]
steps:
  a:
    returns: {{echoed: echo}}
    resource: Test::Thing
    value: {{input: $secret, zone: {zone}}}
  b:
    returns: {{copied: echo}}
    resource: Test::Thing
    value: {{input: {{wrapped: [$echoed]}}}}
"
        )
    };
    let (s1, s2) = ("first-s3cret", "second-s3cret");
    let data = |s: &str| json!({ "secret": s });
    let all = [s1, s2, "undeletable-s3cret", "fail-s3cret"];

    let r = f.try_run(&yaml("z1"), data(s1), Mode::Apply);
    let shown = everything_shown(&f, &r);
    assert_hidden(&shown, &all);
    let r = r.unwrap();
    assert_eq!((r.outcome, r.counts.created), (Outcome::Succeeded, 2));
    assert_eq!(r.returns["echoed"], json!(crate::secret::MASK));
    assert_eq!(
        r.returns["copied"],
        json!(crate::secret::MASK),
        "derived through a provider"
    );
    assert_eq!(f.record("a").sensitive, ["echo", "input"]);
    assert_eq!(f.record("b").sensitive, ["echo", "input"]);

    for mode in [Mode::Plan, Mode::Apply] {
        let r = f.try_run(&yaml("z1"), data(s2), mode);
        assert_hidden(&everything_shown(&f, &r), &all);
        let r = r.unwrap();
        assert_eq!(step(&r, "a").action, Action::Update);
        assert!(step(&r, "a").changes.iter().all(|c| c.sensitive), "{r:?}");
        assert_eq!(r.returns["echoed"], json!(crate::secret::MASK), "{mode:?}");
    }
    let r = f.try_run(&yaml("z1"), data(s2), Mode::Apply);
    assert_hidden(&everything_shown(&f, &r), &all);
    assert_eq!(r.unwrap().counts.unchanged, 2);

    for mode in [Mode::Plan, Mode::Apply] {
        let r = f.try_run(&yaml("z2"), data("undeletable-s3cret"), mode);
        assert_hidden(&everything_shown(&f, &r), &all);
        assert_eq!(step(&r.unwrap(), "a").action, Action::Replace);
    }

    let r = f.try_run(&yaml("z2"), data("fail-s3cret"), Mode::Apply);
    let shown = everything_shown(&f, &r);
    assert_hidden(&shown, &all);
    let r = r.unwrap();
    assert_eq!(step(&r, "a").status, Status::Failed);
    assert!(
        shown.contains("invalid value for input: '(sensitive)' is not acceptable"),
        "{shown}"
    );

    // The delete of `a` fails quoting its secret input.
    let r = f.delete();
    assert_eq!(r.outcome, Outcome::Failed);
    let shown = everything_shown(&f, &Ok(r));
    assert_hidden(&shown, &all);
    assert!(shown.contains("cannot delete (sensitive)"), "{shown}");
}

/// A secret flowing into places whose errors would quote it: a typed parameter of a called
/// workflow, a typed return, a resource attribute of another type, a negative `times`.
#[test]
fn errors_about_secret_values_do_not_quote_them() {
    let cases = [
        (
            "parameters:\n  s: Sensitive\nsteps:\n  a:\n    parameters:\n      n: {type: Integer, value: $s}\n    resource: Test::Thing\n    value: {input: $n}\n",
            json!({"s": "not-a-number-s3cret"}),
            "not-a-number-s3cret",
        ),
        (
            "parameters:\n  s: Sensitive\nreturns:\n  r: {type: 'Enum[a]', value: $s}\nsteps: {}\n",
            json!({"s": "enum-s3cret"}),
            "enum-s3cret",
        ),
        (
            "parameters:\n  s: Sensitive\nsteps:\n  a:\n    resource: Test::Thing\n    value: {zone: {key: $s}}\n",
            json!({"s": "zone-s3cret"}),
            "zone-s3cret",
        ),
        (
            "parameters:\n  s: Sensitive\nsteps:\n  n:\n    times: $s\n    as: i\n    step:\n      resource: Test::Thing\n      value: {input: $i}\n",
            json!({"s": -98765}),
            "98765",
        ),
    ];
    for (yaml, data, secret) in cases {
        let f = Fixture::new();
        let r = f.try_run(yaml, data, Mode::Apply);
        let shown = everything_shown(&f, &r);
        assert!(shown.contains("Failed"), "{shown}");
        assert_hidden(&shown, &[secret]);
    }
}

/// A value a provider returns nested deeper than can be stored fails the step and is not
/// recorded; so does a value the workflow builds too deep. Nothing deep is ever stored.
#[test]
fn values_too_deep_to_store_fail_their_step() {
    let f = Fixture::new();
    let yaml = "parameters: [n]\nsteps:\n  a:\n    resource: Test::Thing\n    value: {input: $n}\n";
    let r = f.run(yaml, json!({"n": 64}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded, "at the limit: {r:?}");
    assert_eq!(crate::value::depth(&f.record("a").actual["deep"]), 64);
    let before = f.record("a");
    let r = f.run(yaml, json!({"n": 65}), Mode::Apply);
    let a = step(&r, "a");
    assert_eq!((a.status, a.action), (Status::Failed, Action::Update));
    let err = a.error.as_deref().unwrap();
    assert!(
        err.contains("t.yaml:3:3: Test::Thing returned a value that cannot be recorded"),
        "{err}"
    );
    assert!(err.contains("attribute 'deep' nests more than 64 levels"), "{err}");
    assert_eq!(f.record("a"), before, "the old record stays");

    // Created: the intent stays, for the next run to ask the provider about.
    let f = Fixture::new();
    let r = f.run(yaml, json!({"n": 1000}), Mode::Apply);
    assert_eq!(step(&r, "a").status, Status::Failed);
    assert!(f.record("a").pending);

    // Built by the workflow from a value at the limit.
    let f = Fixture::new();
    let mut deep = json!(1);
    for _ in 0..crate::value::MAX_DEPTH {
        deep = json!([deep]);
    }
    let wrap = "parameters: [d]\nsteps:\n  a:\n    resource: Test::Thing\n    value: {input: [$d]}\n";
    let r = f.run(wrap, json!({ "d": deep[0].clone() }), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded);
    let r = f.run(wrap, json!({ "d": deep }), Mode::Apply);
    let err = step(&r, "a").error.clone().unwrap();
    assert!(
        err.contains("t.yaml:5:21: the value built here nests more than 64 levels"),
        "{err}"
    );
    assert_eq!(f.record("a").desired["input"], json!([deep[0].clone()]), "unchanged");

    // Data deeper than the limit is refused before anything runs.
    let err = f
        .try_run(wrap, json!({ "d": [deep] }), Mode::Plan)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("parameter 'd': its value in the data nests more than 64 levels"),
        "{err}"
    );
}

/// A record holding a value too deep to store (a state edited by hand: no store writes one)
/// of a type read as its record fails its step in a plan as in the apply, which would record
/// it again.
#[test]
fn a_recorded_value_too_deep_fails_plan_and_apply_alike() {
    let f = Fixture::new();
    let yaml = "steps:\n  a:\n    resource: Test::Recorded\n    value: {input: 1}\n";
    assert_eq!(f.run(yaml, json!({}), Mode::Apply).outcome, Outcome::Succeeded);
    let mut deep = json!(1);
    for _ in 0..=crate::value::MAX_DEPTH {
        deep = json!([deep]);
    }
    for r in &mut f.store.deployments.lock().unwrap().get_mut("d").unwrap().resources {
        r.actual.insert("deep".to_owned(), deep.clone());
    }
    for mode in [Mode::Plan, Mode::Apply] {
        let r = f.run(yaml, json!({}), mode);
        let a = step(&r, "a");
        assert_eq!(a.status, Status::Failed, "{mode:?}: {r:?}");
        let err = a.error.as_deref().unwrap();
        assert!(
            err.contains("attribute 'deep' nests more than 64 levels"),
            "{mode:?}: {err}"
        );
    }
}

/// A deployment with a record the store cannot read is neither planned, applied nor
/// deleted: the error names the record and the way out.
#[test]
fn unreadable_records_stop_runs_and_name_the_way_out() {
    let f = Fixture::new();
    f.run(CHAIN, json!({"x": "ok"}), Mode::Apply);
    f.store
        .deployments
        .lock()
        .unwrap()
        .get_mut("d")
        .unwrap()
        .unreadable
        .push(UnreadableRecord {
            step_id: "old".into(),
            type_name: "Test::Thing".into(),
            error: "corrupt state: cannot decode resources.actual".into(),
        });
    f.log();
    for mode in [Mode::Plan, Mode::Apply] {
        let err = f.try_run(CHAIN, json!({"x": "ok"}), mode).unwrap_err().to_string();
        assert!(err.contains("step 'old' (Test::Thing): corrupt state"), "{err}");
        assert!(err.contains("lyra state rm d old"), "{err}");
    }
    let sources = Sources::default();
    let engine = engine_for(&f.providers, &f.store, &Quiet, &sources, &f.cancel);
    assert!(block_on(engine.delete("d", "test")).is_err());
    assert!(f.log().is_empty(), "no provider was called");
}

/// Steps nested as deep as validation allows (calls 64 levels deep) run on a 2 MiB stack, a
/// tokio worker's default.
#[test]
fn steps_nested_to_the_limit_run_on_a_small_stack() {
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let f = Fixture::new();
            // w0 to w62: the leaf resource is the 64th level.
            let n = crate::value::MAX_DEPTH - 1;
            let text = move |i: usize| {
                if i + 1 < n {
                    format!("parameters: [x]\nreturns: [y]\nsteps:\n  next:\n    call: w{}\n    returns: [y]\n", i + 1)
                } else {
                    "parameters: [x]\nreturns: [y]\nsteps:\n  a:\n    returns: {y: id}\n    resource: Test::Thing\n    value: {input: $x}\n".to_owned()
                }
            };
            let mut sources = Sources::default();
            let mut source = |name: &str| {
                let i: usize = name.strip_prefix('w')?.parse().ok()?;
                (i < n).then(|| (format!("{name}.yaml"), text(i)))
            };
            let prog = program::load("w0", ("w0.yaml".into(), text(0)), &mut source, &mut sources, f.providers.schemas())
                .unwrap_or_else(|d| panic!("{}", d.render(&sources)));
            let engine = engine_for(&f.providers, &f.store, &Quiet, &sources, &f.cancel);
            let data = json!({"x": 1}).as_object().cloned().unwrap();
            let r = block_on(engine.apply(&prog, "d", &data, "test")).unwrap();
            assert_eq!(r.outcome, Outcome::Succeeded);
            assert_eq!(r.returns["y"], json!("t-1"));
            assert_eq!(f.ids().len(), 1);
        })
        .unwrap();
    handle.join().expect("no stack overflow");
}

/// A `type` on a resource's or a call's return is applied like on a workflow's: `Sensitive`
/// makes the value secret (it used to be ignored, and the value printed), and a value of
/// the wrong type fails the step.
#[test]
fn types_on_resource_and_call_returns_are_applied() {
    let f = Fixture::new();
    let yaml = "
returns: [pw, n, called]
steps:
  a:
    returns:
      pw: {alias: echo, type: Sensitive}
      n: {alias: input, type: String}
    resource: Test::Thing
    value: {input: plain-but-secret}
  c:
    call: lib
    returns:
      called: {alias: out, type: 'Sensitive[String]'}
";
    let lib = "returns: [out]\nsteps:\n  x:\n    returns: {out: echo}\n    resource: Test::Thing\n    value: {input: also-secret}\n";
    let mut sources = Sources::default();
    let mut source = |name: &str| (name == "lib").then(|| ("lib.yaml".to_owned(), lib.to_owned()));
    let prog = program::load(
        "t",
        ("t.yaml".into(), yaml.into()),
        &mut source,
        &mut sources,
        f.providers.schemas(),
    )
    .unwrap_or_else(|d| panic!("{}", d.render(&sources)));
    let engine = engine_for(&f.providers, &f.store, &f.observed, &sources, &f.cancel);
    let r = block_on(engine.apply(&prog, "d", &Map::new(), "test"));
    // The report and the history. (Observers saw `c/x` finish before its caller declared
    // the value secret: a secret declared downstream cannot be recalled from a live stream.)
    let shown = format!("{r:?}\n{:?}", f.store.ends.lock().unwrap());
    assert_hidden(&shown, &["plain-but-secret", "also-secret"]);
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    let mut secret = r.sensitive_returns;
    secret.sort();
    // `n` is the same value as `pw`, so it is masked too.
    assert_eq!(secret, ["called", "n", "pw"]);

    // Checked though nothing reads it.
    let wrong = "steps:\n  a:\n    returns:\n      n: {alias: input, type: Integer}\n    resource: Test::Thing\n    value: {input: abc}\n";
    let r = f.run(wrong, json!({}), Mode::Apply);
    let a = step(&r, "a");
    assert_eq!(a.status, Status::Failed);
    assert!(
        a.error
            .as_deref()
            .unwrap()
            .contains("return 'n' expects Integer, got String"),
        "{a:?}"
    );
}

#[test]
fn only_returns_that_are_read_or_typed_are_made() {
    let yaml = "
returns: [out]
steps:
  a:
    returns: {x: echo, unused: input}
    resource: Test::Thing
    value: {input: one}
  b:
    returns: {out: echo, spare: echo}
    resource: Test::Thing
    value: {input: $x}
";
    let mut sources = Sources::default();
    let f = Fixture::new();
    let prog = load(yaml, &f.providers, &mut sources);
    let StepKind::Workflow { steps, .. } = &prog.main.root.kind else {
        panic!("a workflow")
    };
    let read = |s: &Step| s.returns.iter().map(|r| (r.name.clone(), r.read)).collect::<Vec<_>>();
    // `x` is read by `b`, `out` by the workflow's returns; nothing reads the others.
    assert_eq!(read(&steps[0]), [("x".into(), true), ("unused".into(), false)]);
    assert_eq!(read(&steps[1]), [("out".into(), true), ("spare".into(), false)]);
    // The workflow's own returns are taken whole by whoever runs it.
    assert!(prog.main.root.returns.iter().all(|r| r.read));
    for mode in [Mode::Apply, Mode::Plan] {
        let r = f.run(yaml, json!({}), mode);
        assert_eq!(r.outcome, Outcome::Succeeded, "{mode:?}: {r:?}");
        assert_eq!(r.returns.get("out"), Some(&json!("one")), "{mode:?}: {r:?}");
    }
}

/// `Slow::Thing` and `Slow::Kept`: each read or lookup takes a while, and the most under way
/// at once is kept.
#[derive(Default)]
struct Slow {
    reading: Mutex<(usize, usize)>,
}

impl Slow {
    /// Waits a while as one of the calls counted in `reading` (running now, most at once).
    async fn call(&self) {
        {
            let mut r = self.reading.lock().unwrap();
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        ThreadTimer.sleep(Duration::from_millis(20)).await;
        self.reading.lock().unwrap().0 -= 1;
    }

    fn most_at_once(&self) -> usize {
        self.reading.lock().unwrap().1
    }
}

#[async_trait]
impl Provider for Slow {
    fn schemas(&self) -> Vec<ResourceSchema> {
        // `Kept` is read from its record: only a create in doubt calls the provider.
        vec![
            ResourceSchema::new("Slow::Thing", vec![AttributeSchema::new("input", Type::Any)]),
            ResourceSchema::new("Slow::Kept", vec![AttributeSchema::new("input", Type::Any)]).read_is_record(),
        ]
    }
    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        Ok(Created {
            external_id: cx.step_id.to_owned(),
            actual: desired.clone(),
        })
    }
    async fn read(&self, _: &OpContext<'_>, _: &str, prior: Option<&Map>) -> Result<Option<Map>, ProviderError> {
        self.call().await;
        Ok(prior.cloned())
    }
    async fn lookup(&self, _: &OpContext<'_>, _: &Map) -> Result<Lookup, ProviderError> {
        self.call().await;
        Ok(Lookup::Absent)
    }
    async fn update(&self, _: &OpContext<'_>, _: &str, desired: &Map, _: &Map) -> Result<Map, ProviderError> {
        Ok(desired.clone())
    }
    async fn delete(&self, _: &OpContext<'_>, _: &str, _: &Map) -> Result<(), ProviderError> {
        Ok(())
    }
}

#[test]
fn a_plan_takes_a_slot_for_each_read_and_lookup() {
    let slow = Arc::new(Slow::default());
    let mut providers = Providers::new();
    let dynp: Arc<dyn Provider> = slow.clone();
    providers.register(&dynp);
    let f = Fixture::new();
    let twelve = |type_name: &str| -> String {
        std::iter::once("steps:\n".to_owned())
            .chain((0..12).map(|i| format!("  s{i}:\n    resource: {type_name}\n    value: {{input: {i}}}\n")))
            .collect()
    };
    let mut sources = Sources::default();
    let prog = load(&twelve("Slow::Thing"), &providers, &mut sources);
    let engine = engine_for(&providers, &f.store, &f.observed, &sources, &f.cancel);
    let applied = block_on(engine.apply(&prog, "d", &Map::new(), "test")).unwrap();
    assert_eq!(applied.outcome, Outcome::Succeeded, "{applied:?}");
    let planned = block_on(engine.plan(&prog, "d", &Map::new())).unwrap();
    assert_eq!(planned.counts.unchanged, 12, "{planned:?}");
    // Twelve reads, overlapping, but never more than the engine's 4 at once.
    let most = slow.most_at_once();
    assert!((2..=4).contains(&most), "{most} reads at once");

    // Twelve creates in doubt of a type read from its record: a plan asks the provider about
    // each, under the same bound.
    let mut sources = Sources::default();
    let prog = load(&twelve("Slow::Kept"), &providers, &mut sources);
    let engine = engine_for(&providers, &f.store, &f.observed, &sources, &f.cancel);
    let applied = block_on(engine.apply(&prog, "k", &Map::new(), "test")).unwrap();
    assert_eq!(applied.outcome, Outcome::Succeeded, "{applied:?}");
    for i in 0..12 {
        let desired: Map = [("input".to_owned(), json!(i))].into_iter().collect();
        let intent = ResourceRecord::intent(&format!("s{i}"), "Slow::Kept", desired, vec![], format!("key-{i}"));
        block_on(crate::state::Recorder::put_resource(&f.store, "k", &intent)).unwrap();
    }
    *slow.reading.lock().unwrap() = (0, 0);
    let planned = block_on(engine.plan(&prog, "k", &Map::new())).unwrap();
    assert_eq!(planned.counts.created, 12, "none was found: {planned:?}");
    let most = slow.most_at_once();
    assert!((2..=4).contains(&most), "{most} lookups at once");
}

/// Runs `main` (which may call `lib`, whose text is given) with `data`.
fn run_with_lib(f: &Fixture, main: &str, lib: &str, data: Value) -> Report {
    let mut sources = Sources::default();
    let mut fetch = |name: &str| (name == "lib").then(|| ("lib.yaml".to_owned(), lib.to_owned()));
    let prog = program::load(
        "main",
        ("main.yaml".into(), main.into()),
        &mut fetch,
        &mut sources,
        f.providers.schemas(),
    )
    .unwrap_or_else(|d| panic!("{}", d.render(&sources)));
    let engine = engine_for(&f.providers, &f.store, &f.observed, &sources, &f.cancel);
    let data = data.as_object().cloned().unwrap_or_default();
    block_on(engine.apply(&prog, "d", &data, "test")).unwrap()
}

/// A call's argument reads its `lookup` from the data (it used to pass the caller's variable
/// of that name) and is converted to its `type` (which used to be ignored), before the called
/// parameter's own type.
#[test]
fn call_arguments_take_their_lookup_and_type() {
    let lib = "parameters: [zone, size]\nreturns: [z, s]\nsteps:\n  it:\n    returns: {z: echo}\n    resource: Test::Thing\n    value: {input: $zone}\n  sz:\n    returns: {s: echo}\n    resource: Test::Thing\n    value: {input: $size}\n";
    let main = |size: &str| {
        format!(
            "parameters: [zone]\nreturns: [z, s]\nsteps:\n  c:\n    call: lib\n    parameters:\n      zone: {{lookup: zones.eu}}\n      size: {size}\n    returns: [z, s]\n"
        )
    };
    let data = json!({"zone": "the caller's", "zones": {"eu": "eu9"}, "sizes": {"eu": "4"}});
    let f = Fixture::new();
    let r = run_with_lib(&f, &main("{lookup: sizes.eu, type: Integer}"), lib, data.clone());
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    assert_eq!(r.returns["z"], json!("eu9"));
    assert_eq!(r.returns["s"], json!(4));

    let f = Fixture::new();
    let r = run_with_lib(&f, &main("{value: 'not-shown', type: Sensitive}"), lib, data.clone());
    assert_eq!(r.sensitive_returns, ["s"]);

    let f = Fixture::new();
    let r = run_with_lib(&f, &main("{value: large, type: Integer}"), lib, data.clone());
    let c = step(&r, "c");
    assert_eq!(c.status, Status::Failed);
    assert_eq!(
        c.error.as_deref(),
        Some("main.yaml:8:7: parameter 'size' passed to 'lib' expects Integer, got String")
    );
    assert!(f.ids().is_empty());

    let f = Fixture::new();
    let r = run_with_lib(&f, &main("{lookup: sizes.us}"), lib, data);
    assert_eq!(
        step(&r, "c").error.as_deref(),
        Some("main.yaml:8:7: parameter 'size': lookup key 'sizes.us' not found in the data")
    );
}

/// A step's parameters are read in the enclosing workflow, as validation says (a value
/// used to see the step's parameters declared before it), and an implicit one is converted
/// to its type (which used to be ignored).
#[test]
fn nested_parameters_read_the_enclosing_scope_and_keep_their_types() {
    let wf = |c: &str| {
        format!(
            "parameters: [a]\nreturns: [got]\nsteps:\n  s:\n    parameters:\n      a: {{value: inner}}\n      b: {{value: $a}}\n      c: Integer\n    returns: {{got: echo}}\n    resource: Test::Thing\n    value: {{input: [$a, $b, $c]}}\n  t:\n    returns: {{c: echo}}\n    resource: Test::Thing\n    value: {{input: {c}}}\n"
        )
    };
    let f = Fixture::new();
    let r = f.run(&wf("'5'"), json!({"a": "outer"}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    assert_eq!(r.returns["got"], json!(["inner", "outer", 5]));
    let f = Fixture::new();
    let r = f.run(&wf("five"), json!({"a": "outer"}), Mode::Apply);
    assert_eq!(
        step(&r, "s").error.as_deref(),
        Some("t.yaml:8:7: parameter 'c' expects Integer, got String")
    );
}

/// A collection's `returns` types its list (it used to be ignored): converted, made secret,
/// or the step fails; at the top level too, where it is the workflow's return.
#[test]
fn a_collections_return_types_its_list() {
    let wf = |ty: &str, items: &str| {
        format!(
            "returns: [names]\nsteps:\n  servers:\n    each: {items}\n    as: x\n    into: names\n    returns:\n      names: {{type: '{ty}'}}\n    step:\n      returns: echo\n      resource: Test::Thing\n      value: {{input: $x}}\n"
        )
    };
    let f = Fixture::new();
    let r = f.run(&wf("Array[Integer]", "['1', '2']"), json!({}), Mode::Apply);
    assert_eq!(r.returns["names"], json!([1, 2]), "{:?}", r.steps);
    let f = Fixture::new();
    let r = f.run(&wf("Sensitive[Array[String]]", "[kept-secret]"), json!({}), Mode::Apply);
    assert_eq!(r.sensitive_returns, ["names"]);
    assert_hidden(&format!("{r:?}"), &["kept-secret"]);
    let f = Fixture::new();
    let r = f.run(&wf("Array[Integer]", "[a]"), json!({}), Mode::Apply);
    assert_eq!(
        step(&r, "servers").error.as_deref(),
        Some("t.yaml:8:7: return 'names' '[0]' expects Integer, got String")
    );
    // Planned, the list is not known yet: its type waits for it.
    let f = Fixture::new();
    let r = f.run(&wf("Sensitive", "[a]"), json!({}), Mode::Plan);
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);

    // A top-level collection: its return is the workflow's.
    let top = "returns: {top: {type: 'Array[Integer]'}}\ntimes: 2\nas: i\ninto: top\nstep:\n  returns: echo\n  resource: Test::Thing\n  value: {input: $i}\n";
    let f = Fixture::new();
    let r = f.run(top, json!({}), Mode::Apply);
    assert_eq!(r.returns["top"], json!([0, 1]), "{:?}", r.steps);
    let top = top.replace("Array[Integer]", "Array[String]");
    let r = Fixture::new().run(&top, json!({}), Mode::Apply);
    assert_eq!(r.returns["top"], json!(["0", "1"]), "{:?}", r.steps);
}

/// Issue 9 F5: the keys of a secret hash are secret. Iterating over one names the iterations
/// by a digest of the key (step ids are recorded and shown everywhere), stable from run to
/// run; a plain hash keeps its keys.
#[test]
fn iterations_over_a_secret_hash_are_not_named_by_its_keys() {
    let f = Fixture::new();
    let yaml = |ty: &str| {
        format!(
            "
parameters:
  users: {ty}
steps:
  acc:
    eachPair: $users
    as: [name, role]
    step:
      resource: Test::Thing
      value: {{input: $role, zone: $name}}
"
        )
    };
    let keys = ["alice-k3y", "bob-k3y"];
    let data = json!({"users": {"alice-k3y": "admin", "bob-k3y": "dev"}});
    let r = f.try_run(&yaml("Sensitive"), data.clone(), Mode::Apply);
    let shown = everything_shown(&f, &r);
    assert_eq!(r.unwrap().outcome, Outcome::Succeeded);
    assert_hidden(&shown, &keys);
    let mut expected: Vec<String> = keys
        .iter()
        .map(|k| format!("acc/{}", schedule::secret_key_segment("acc", k)))
        .collect();
    expected.sort();
    assert_eq!(f.ids(), expected);
    assert!(expected.iter().all(|id| id.len() == "acc/".len() + 16), "{expected:?}");

    let again = f.run(&yaml("Sensitive"), data.clone(), Mode::Apply);
    assert_eq!(
        (again.counts.created, again.counts.unchanged),
        (0, 2),
        "{:?}",
        again.steps
    );

    // Not secret: the keys name the iterations (and the secret ones go as garbage).
    let plain = f.run(&yaml("Hash"), data, Mode::Apply);
    assert_eq!(
        (plain.counts.created, plain.counts.deleted),
        (2, 2),
        "{:?}",
        plain.steps
    );
    assert_eq!(f.ids(), ["acc/alice-k3y", "acc/bob-k3y"]);
}

/// A parameter's `default` is taken when the data has no key for it, at the top level (by
/// name or lookup) and in a call's lookup; the data wins when it has the key.
#[test]
fn defaults_fill_in_for_missing_data() {
    let wf = "parameters:\n  size: {type: Integer, default: 3, doc: How many.}\n  zone: {lookup: zones.eu, default: eu1}\nreturns: [got]\nsteps:\n  s:\n    returns: {got: echo}\n    resource: Test::Thing\n    value: {input: [$size, $zone]}\n";
    let f = Fixture::new();
    let r = f.run(wf, json!({}), Mode::Apply);
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    assert_eq!(r.returns["got"], json!([3, "eu1"]));

    let f = Fixture::new();
    let r = f.run(wf, json!({"size": "7", "zones": {"eu": "eu9"}}), Mode::Apply);
    assert_eq!(r.returns["got"], json!([7, "eu9"]));

    let lib = "parameters:\n  n: {lookup: missing.key, default: 5}\nreturns: [s]\nsteps:\n  sz:\n    returns: {s: echo}\n    resource: Test::Thing\n    value: {input: $n}\n";
    let main = "returns: [s]\nsteps:\n  c:\n    call: lib\n    returns: [s]\n";
    let f = Fixture::new();
    let r = run_with_lib(&f, main, lib, json!({}));
    assert_eq!(r.outcome, Outcome::Succeeded, "{:?}", r.steps);
    assert_eq!(r.returns["s"], json!(5));
}

#[test]
fn a_preloaded_state_answers_the_first_load_of_its_deployment_only() {
    let store = Arc::new(MemStore::default());
    let recorded = |name: &str, steps: &[&str]| DeploymentState {
        name: name.to_owned(),
        resources: steps
            .iter()
            .map(|s| ResourceRecord {
                step_id: (*s).to_owned(),
                type_name: "Test::Thing".to_owned(),
                external_id: format!("x-{s}"),
                desired: Map::new(),
                actual: Map::new(),
                depends_on: vec![],
                managed: true,
                pending: false,
                sensitive: vec![],
                create_key: None,
            })
            .collect(),
        ..DeploymentState::default()
    };
    store
        .deployments
        .lock()
        .unwrap()
        .insert("d".into(), recorded("d", &["now"]));
    store
        .deployments
        .lock()
        .unwrap()
        .insert("e".into(), recorded("e", &["other"]));
    let p = crate::state::Preloaded::new(store.clone(), "d", Ok(Some(recorded("d", &["earlier"]))));
    let steps =
        |s: Option<DeploymentState>| -> Vec<String> { s.unwrap().resources.into_iter().map(|r| r.step_id).collect() };
    use crate::state::Recorder as _;
    assert_eq!(p.store_id(), "store-1");
    let load = |d: &str| block_on(p.load(d)).unwrap();
    assert_eq!(steps(load("e")), ["other"], "another deployment is the store's");
    assert_eq!(steps(load("d")), ["earlier"], "the first load is the preloaded one");
    assert_eq!(steps(load("d")), ["now"], "later ones are the store's");
    // A preloaded failure is answered as the store's would have been.
    let down = StoreError::new(StoreErrorKind::Unavailable, "down");
    let failing = crate::state::Preloaded::new(store, "d", Err(down));
    assert!(block_on(failing.load("d")).is_err());
}

/// A store whose records of outcomes (not intents) wait at a gate, which opens for good once
/// no more arrive for a second (the run can go no further without it): how many waited then
/// is how many steps can wait for their records at once.
struct GatedStore {
    inner: MemStore,
    gate: Arc<Mutex<Gate>>,
}

struct Gate {
    waiting: usize,
    most: usize,
    open: bool,
    last_arrival: Instant,
    wakers: Vec<std::task::Waker>,
}

impl GatedStore {
    fn new() -> GatedStore {
        let gate = Arc::new(Mutex::new(Gate {
            waiting: 0,
            most: 0,
            open: false,
            last_arrival: Instant::now(),
            wakers: Vec::new(),
        }));
        let watched = Arc::clone(&gate);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(50));
                let mut g = watched.lock().unwrap();
                if g.waiting > 0 && g.last_arrival.elapsed() > Duration::from_secs(1) {
                    g.open = true;
                    g.wakers.drain(..).for_each(std::task::Waker::wake);
                    return;
                }
            }
        });
        GatedStore {
            inner: MemStore::default(),
            gate,
        }
    }
}

#[async_trait]
impl crate::state::Recorder for GatedStore {
    fn store_id(&self) -> &str {
        self.inner.store_id()
    }
    async fn load(&self, d: &str) -> Result<Option<DeploymentState>, StoreError> {
        self.inner.load(d).await
    }
    async fn begin_run(&self, run: &RunStart) -> Result<RunId, StoreError> {
        self.inner.begin_run(run).await
    }
    async fn put_resource(&self, d: &str, rec: &ResourceRecord) -> Result<(), StoreError> {
        if !rec.pending {
            {
                let mut g = self.gate.lock().unwrap();
                g.waiting += 1;
                g.most = g.most.max(g.waiting);
                g.last_arrival = Instant::now();
            }
            futures::future::poll_fn(|cx| {
                let mut g = self.gate.lock().unwrap();
                if g.open {
                    return std::task::Poll::Ready(());
                }
                g.wakers.push(cx.waker().clone());
                std::task::Poll::Pending
            })
            .await;
            self.gate.lock().unwrap().waiting -= 1;
        }
        self.inner.put_resource(d, rec).await
    }
    async fn remove_resource(&self, d: &str, step_id: &str) -> Result<(), StoreError> {
        self.inner.remove_resource(d, step_id).await
    }
    async fn finish_run(&self, run: RunId, end: &RunEnd) -> Result<(), StoreError> {
        self.inner.finish_run(run, end).await
    }
}

/// Steps waiting for their outcome's record hold no provider slot, so more of them than
/// `concurrency` wait together (and share a commit); but no more than the recording window,
/// however many steps are ready.
#[test]
fn steps_waiting_for_their_records_hold_no_provider_slot_within_a_window() {
    let f = Fixture::new();
    let n = RECORDING_WINDOW + 44;
    let mut yaml = String::from("steps:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  s{i}:\n    resource: Test::Thing\n    value: {{input: v{i}}}\n"
        ));
    }
    let mut sources = Sources::default();
    let prog = load(&yaml, &f.providers, &mut sources);
    let store = GatedStore::new();
    let engine = engine_for(&f.providers, &store, &Quiet, &sources, &f.cancel);
    let r = block_on(engine.apply(&prog, "d", &Map::new(), "test")).unwrap();
    assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
    assert_eq!(r.counts.created as usize, n);
    // Had the provider slot been held, 4 would have waited; with no window, all of them.
    let most = store.gate.lock().unwrap().most;
    assert_eq!(most, RECORDING_WINDOW, "steps waiting for their records at once");
    let d = store.inner.deployments.lock().unwrap();
    assert_eq!(d["d"].resources.iter().filter(|r| !r.pending).count(), n);
}

/// The most futures each deployment's runs had started and not ended at once in one scope,
/// collection or delete (see `Run::in_flight`).
static IN_FLIGHT: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());

pub(super) fn note_in_flight(deployment: &str, n: usize) {
    let mut seen = IN_FLIGHT.lock().unwrap();
    match seen.iter_mut().find(|(d, _)| d == deployment) {
        Some((_, most)) => *most = (*most).max(n),
        None => seen.push((deployment.to_owned(), n)),
    }
}

fn most_in_flight(deployment: &str) -> usize {
    let seen = IN_FLIGHT.lock().unwrap();
    seen.iter().find(|(d, _)| d == deployment).map_or(0, |(_, n)| *n)
}

/// However many steps are ready at once (the children of a scope, the iterations of a
/// collection, the resources to delete), no more are started than twice the recording window:
/// each started one holds its future until it ends. All of them are still done.
#[test]
fn ready_steps_start_only_while_there_is_room() {
    let f = Fixture::new();
    let room = 2 * RECORDING_WINDOW;
    let n = room + 100;
    let mut wide = String::from("steps:\n");
    for i in 0..n {
        wide.push_str(&format!(
            "  s{i}:\n    resource: Test::Thing\n    value: {{input: v{i}}}\n"
        ));
    }
    // (The test provider answers some numbers specially: one input for all.)
    let collection = format!(
        "steps:\n  many:\n    times: {n}\n    step:\n      resource: Test::Thing\n      value: {{input: one}}\n"
    );
    for (deployment, yaml) in [("wide-room", wide), ("times-room", collection)] {
        let mut sources = Sources::default();
        let prog = load(&yaml, &f.providers, &mut sources);
        // Outcomes wait at the gate: the steps started meanwhile stay started.
        let store = GatedStore::new();
        let engine = engine_for(&f.providers, &store, &Quiet, &sources, &f.cancel);
        let r = block_on(engine.apply(&prog, deployment, &Map::new(), "test")).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded, "{deployment}: {r:?}");
        assert_eq!(r.counts.created as usize, n, "{deployment}");
        assert_eq!(most_in_flight(deployment), room, "{deployment}: started at once");
        // Deleting them all: as many ready at once, as many started.
        let deleting = format!("{deployment}-deleted");
        let recorded = store.inner.deployments.lock().unwrap()[deployment].clone();
        store
            .inner
            .deployments
            .lock()
            .unwrap()
            .insert(deleting.clone(), recorded);
        let r = block_on(engine.delete(&deleting, "test")).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded, "{deleting}: {r:?}");
        assert_eq!(r.counts.deleted as usize, n, "{deleting}");
        assert_eq!(most_in_flight(&deleting), room, "{deleting}: started at once");
    }
}

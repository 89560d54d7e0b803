//! `Engine::drift`: resources read and compared with their records, written only when
//! refreshing.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU32;

use super::*;

/// `Live::Box`: a cloud in memory that tests change behind Lyra's back. `read` fails for the
/// ids in `broken`, and records the settings it was called with.
#[derive(Default)]
struct Cloud {
    live: Mutex<HashMap<String, Map>>,
    broken: Mutex<BTreeSet<String>>,
    next: AtomicU32,
    settings: Mutex<Vec<Map>>,
}

#[async_trait]
impl Provider for Cloud {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Live::Box",
            vec![
                AttributeSchema::new("size", Type::Any),
                AttributeSchema::new("config", Type::Any),
                AttributeSchema::new("password", Type::optional(Type::String)).sensitive(),
                AttributeSchema::new("id", Type::optional(Type::String)).provided(),
            ],
        )]
    }
    fn config_schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Live",
            vec![AttributeSchema::new("region", Type::String)],
        )]
    }
    async fn create(&self, _: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let id = format!("box-{}", self.next.fetch_add(1, Ordering::SeqCst));
        let mut actual = desired.clone();
        actual.insert("id".into(), json!(id));
        self.live.lock().unwrap().insert(id.clone(), actual.clone());
        Ok(Created {
            external_id: id,
            actual,
        })
    }
    async fn read(&self, cx: &OpContext<'_>, id: &str, _: Option<&Map>) -> Result<Option<Map>, ProviderError> {
        self.settings.lock().unwrap().push(cx.config.clone());
        if self.broken.lock().unwrap().contains(id) {
            return Err(ProviderError::Other(format!("{id} is unreachable")));
        }
        Ok(self.live.lock().unwrap().get(id).cloned())
    }
    async fn update(&self, _: &OpContext<'_>, id: &str, desired: &Map, _: &Map) -> Result<Map, ProviderError> {
        let mut actual = desired.clone();
        actual.insert("id".into(), json!(id));
        self.live.lock().unwrap().insert(id.to_owned(), actual.clone());
        Ok(actual)
    }
    async fn delete(&self, _: &OpContext<'_>, id: &str, _: &Map) -> Result<(), ProviderError> {
        self.live.lock().unwrap().remove(id);
        Ok(())
    }
}

struct Setup {
    providers: Providers,
    cloud: Arc<Cloud>,
    store: MemStore,
    cancel: AtomicBool,
}

const TWO: &str = "
providers:
  Live:
    region: r1
steps:
  a:
    returns: {aid: id}
    resource: Live::Box
    value: {size: 1, config: {name: beta, n: 1, tags: [x, y]}}
  b:
    resource: Live::Box
    value: {size: 2, config: {parent: $aid}}
";

impl Setup {
    fn new() -> Setup {
        let cloud = Arc::new(Cloud::default());
        let mut providers = Providers::new();
        let dynp: Arc<dyn Provider> = cloud.clone();
        providers.register(&dynp);
        Setup {
            providers,
            cloud,
            store: MemStore::default(),
            cancel: AtomicBool::new(false),
        }
    }

    fn engine<'a>(&'a self, sources: &'a Sources) -> Engine<'a> {
        Engine {
            concurrency: 2,
            ..engine_for(&self.providers, &self.store, &Quiet, sources, &self.cancel)
        }
    }

    fn apply(&self, yaml: &str, data: Value) -> Report {
        let mut sources = Sources::default();
        let prog = load(yaml, &self.providers, &mut sources);
        let data = data.as_object().cloned().unwrap_or_default();
        let r = block_on(self.engine(&sources).apply(&prog, "d", &data, "test")).unwrap();
        assert_eq!(r.outcome, Outcome::Succeeded, "{r:?}");
        r
    }

    fn try_drift(&self, refresh: bool) -> Result<DriftReport, EngineError> {
        let sources = Sources::default();
        block_on(self.engine(&sources).drift("d", refresh, "test"))
    }

    fn drift(&self, refresh: bool) -> DriftReport {
        self.try_drift(refresh).unwrap()
    }

    fn state(&self) -> DeploymentState {
        self.store.deployments.lock().unwrap()["d"].clone()
    }

    fn runs(&self) -> RunId {
        *self.store.runs.lock().unwrap()
    }

    /// Changes the live resource of step `id` behind Lyra's back.
    fn edit(&self, id: &str, change: impl FnOnce(&mut Map)) {
        let ext = self.state().resource(id).unwrap().external_id.clone();
        change(self.cloud.live.lock().unwrap().get_mut(&ext).unwrap());
    }

    fn remove(&self, id: &str) {
        let ext = self.state().resource(id).unwrap().external_id.clone();
        self.cloud.live.lock().unwrap().remove(&ext);
    }
}

fn resource<'r>(r: &'r DriftReport, id: &str) -> &'r ResourceDrift {
    r.resources
        .iter()
        .find(|x| x.step_id == id)
        .unwrap_or_else(|| panic!("no {id} in {r:?}"))
}

fn changes(r: &ResourceDrift) -> Vec<(&str, Option<&Value>, Option<&Value>)> {
    r.changes
        .iter()
        .map(|c| (c.path.as_str(), c.recorded.as_ref(), c.live.as_ref()))
        .collect()
}

#[test]
fn nothing_changed_is_no_drift_and_records_nothing() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    let (before, runs) = (s.state(), s.runs());
    let r = s.drift(false);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert!(!r.drifted(), "{r:?}");
    assert_eq!(r.count(DriftStatus::Unchanged), 2);
    assert_eq!(r.run, None);
    assert_eq!((s.state(), s.runs()), (before, runs), "a drift check writes nothing");
}

#[test]
fn drift_is_reported_as_paths_and_nothing_is_written() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    s.cloud.settings.lock().unwrap().clear();
    s.edit("a", |m| {
        m["config"]["name"] = json!("gamma");
        m["config"]["tags"][1] = json!("z");
        m.insert("size".into(), json!(3));
        m.insert("extra".into(), json!(true));
    });
    let (before, runs) = (s.state(), s.runs());
    let r = s.drift(false);
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert!(r.drifted());
    let a = resource(&r, "a");
    assert_eq!(a.status, DriftStatus::Drifted);
    assert_eq!(
        changes(a),
        vec![
            ("config.name", Some(&json!("beta")), Some(&json!("gamma"))),
            ("config.tags[1]", Some(&json!("y")), Some(&json!("z"))),
            ("extra", None, Some(&json!(true))),
            ("size", Some(&json!(1)), Some(&json!(3))),
        ]
    );
    assert!(!a.recorded);
    assert_eq!(resource(&r, "b").status, DriftStatus::Unchanged);
    assert_eq!((s.state(), s.runs()), (before, runs), "a drift check writes nothing");
    assert!(s.store.ends.lock().unwrap().len() == 1, "only the apply's run ended");
    // Each read had the settings its record was made with.
    let seen = s.cloud.settings.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|m| m.get("region") == Some(&json!("r1"))), "{seen:?}");
}

#[test]
fn secrets_are_reported_changed_but_never_shown() {
    let s = Setup::new();
    let yaml = "
parameters:
  pw: Sensitive[String]
steps:
  a:
    resource: Live::Box
    value: {size: 1, password: $pw, config: {user: admin, pass: $pw}}
";
    s.apply(yaml, json!({"pw": "old-s3cret"}));
    s.edit("a", |m| {
        m.insert("password".into(), json!("n3w-s3cret"));
        m["config"]["pass"] = json!("n3w-s3cret");
        // Not secret itself, but holding the new secret: masked too.
        m.insert("size".into(), json!("copy of n3w-s3cret"));
    });
    for refresh in [false, true] {
        let r = s.drift(refresh);
        let a = resource(&r, "a");
        let got: Vec<(&str, bool)> = a.changes.iter().map(|c| (c.path.as_str(), c.sensitive)).collect();
        assert_eq!(got, vec![("config", true), ("password", true), ("size", true)]);
        for c in &a.changes {
            assert_eq!(c.recorded, Some(json!(crate::secret::MASK)), "{c:?}");
            assert_eq!(c.live, Some(json!(crate::secret::MASK)), "{c:?}");
        }
        let shown = format!("{r:?} {:?}", s.store.ends.lock().unwrap());
        assert_hidden(&shown, &["old-s3cret", "n3w-s3cret"]);
    }
    // The record refreshed keeps its secret attributes marked.
    let rec = s.state().resource("a").unwrap().clone();
    assert_eq!(rec.actual["password"], json!("n3w-s3cret"));
    assert!(rec.sensitive.iter().any(|x| x == "password"), "{:?}", rec.sensitive);
}

#[test]
fn a_resource_gone_is_reported_and_keeps_its_record() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    s.remove("b");
    for refresh in [false, true] {
        let r = s.drift(refresh);
        assert!(r.drifted());
        assert_eq!(resource(&r, "b").status, DriftStatus::Gone);
        assert_eq!(resource(&r, "a").status, DriftStatus::Unchanged);
        assert_eq!(r.outcome, Outcome::Succeeded);
    }
    assert!(s.state().resource("b").is_some(), "a gone resource is never forgotten");
    let ends = s.store.ends.lock().unwrap();
    let end = ends.last().unwrap();
    assert_eq!(end.changes[0].step_id, "b");
    assert_eq!(end.changes[0].action, "gone");
    assert!(end.note.as_deref().unwrap().contains("1 gone"), "{:?}", end.note);
}

#[test]
fn refreshing_records_what_was_read_and_changes_no_resource() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    s.edit("a", |m| m["config"]["name"] = json!("gamma"));
    let live_before = s.cloud.live.lock().unwrap().clone();
    let record_before = s.state().resource("a").unwrap().clone();
    let runs = s.runs();
    let r = s.drift(true);
    assert!(r.refreshed);
    assert_eq!(r.run, Some(runs + 1), "a run of its own");
    let a = resource(&r, "a");
    assert_eq!((a.status, a.recorded), (DriftStatus::Drifted, true));
    assert!(!resource(&r, "b").recorded, "unchanged records are not written");
    let rec = s.state().resource("a").unwrap().clone();
    assert_eq!(rec.actual["config"]["name"], json!("gamma"));
    assert_eq!(
        ResourceRecord {
            actual: record_before.actual.clone(),
            ..rec
        },
        record_before,
        "only the actual state is refreshed"
    );
    assert_eq!(*s.cloud.live.lock().unwrap(), live_before, "no resource changed");
    let end = s.store.ends.lock().unwrap().last().unwrap().clone();
    assert_eq!(
        (end.outcome, end.counts.updated, end.counts.unchanged),
        (Outcome::Succeeded, 1, 1)
    );
    assert_eq!(end.changes.len(), 1);
    assert_eq!(
        (end.changes[0].step_id.as_str(), end.changes[0].action.as_str()),
        ("a", "refresh")
    );

    let again = s.drift(false);
    assert!(!again.drifted(), "{again:?}");
    // The next plan reverts the drift: the record now says what is there.
    let mut sources = Sources::default();
    let prog = load(TWO, &s.providers, &mut sources);
    let plan = block_on(s.engine(&sources).plan(&prog, "d", &Map::new())).unwrap();
    assert_eq!(step(&plan, "a").action, Action::Update);
    assert_eq!(step(&plan, "a").changes[0].path, "config.name");
}

#[test]
fn a_read_that_fails_is_reported_per_resource() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    let ext = s.state().resource("a").unwrap().external_id.clone();
    s.cloud.broken.lock().unwrap().insert(ext.clone());
    s.remove("b");
    let r = s.drift(true);
    assert_eq!(r.outcome, Outcome::Failed);
    let a = resource(&r, "a");
    assert_eq!(a.status, DriftStatus::Failed);
    assert_eq!(
        a.error.as_deref(),
        Some(format!("Live::Box: {ext} is unreachable").as_str())
    );
    assert_eq!(resource(&r, "b").status, DriftStatus::Gone, "the others are still read");
    let end = s.store.ends.lock().unwrap().last().unwrap().clone();
    assert_eq!(end.outcome, Outcome::Failed);
    assert_eq!(end.counts.failed, 1);
    assert!(
        end.changes.iter().any(|c| c.step_id == "a" && c.error.is_some()),
        "{end:?}"
    );
}

#[test]
fn pending_records_are_skipped_and_unreadable_ones_refused() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    {
        let mut m = s.store.deployments.lock().unwrap();
        let rec = m
            .get_mut("d")
            .unwrap()
            .resources
            .iter_mut()
            .find(|r| r.step_id == "b")
            .unwrap();
        *rec = ResourceRecord::intent("b", "Live::Box", rec.desired.clone(), vec![], "k".into());
    }
    let r = s.drift(false);
    let b = resource(&r, "b");
    assert_eq!((b.status, b.error.as_deref()), (DriftStatus::Skipped, Some(PENDING)));
    assert!(!r.drifted());

    s.store
        .deployments
        .lock()
        .unwrap()
        .get_mut("d")
        .unwrap()
        .unreadable
        .push(UnreadableRecord {
            step_id: "old".into(),
            type_name: "Live::Box".into(),
            error: "corrupt".into(),
        });
    let runs = s.runs();
    let err = s.try_drift(true).unwrap_err().to_string();
    assert!(err.contains("lyra state rm d old"), "{err}");
    assert_eq!(s.runs(), runs, "nothing recorded");
}

#[test]
fn a_cancelled_check_reads_nothing_more() {
    let s = Setup::new();
    s.apply(TWO, json!({}));
    s.cancel.store(true, Ordering::SeqCst);
    let r = s.drift(false);
    assert_eq!(r.outcome, Outcome::Cancelled);
    assert!(r.resources.iter().all(|x| x.status == DriftStatus::Skipped));
    assert!(s.cloud.settings.lock().unwrap().is_empty(), "nothing was read");
}

#[test]
fn an_unknown_deployment_has_nothing_to_report() {
    let s = Setup::new();
    let r = s.drift(true);
    assert!(r.resources.is_empty() && r.run.is_none());
    assert!(s.store.deployments.lock().unwrap().is_empty(), "nothing was created");
}

#[test]
fn read_only_resources_are_read_and_reported_too() {
    let s = Setup::new();
    let yaml = "
steps:
  a:
    returns: {aid: id}
    resource: Live::Box
    value: {size: 1}
  seen:
    resource: Live::Box
    external_id: $aid
";
    s.apply(yaml, json!({}));
    assert!(!s.state().resource("seen").unwrap().managed);
    s.edit("a", |m| {
        m.insert("size".into(), json!(2));
    });
    let r = s.drift(false);
    let seen = resource(&r, "seen");
    assert_eq!((seen.status, seen.managed), (DriftStatus::Drifted, false));
    assert_eq!(changes(seen), vec![("size", Some(&json!(1)), Some(&json!(2)))]);
    assert!(resource(&r, "a").managed);
}

//! Provider settings (`providers:`), `retry:`, `timeout:` and replaces a provider asks for.

use std::sync::atomic::AtomicU32;

use super::*;

/// `Cfg::Thing`: records the settings each call saw; its create fails with a retryable error
/// while `flaky` (in `input`) failures remain, sleeps `sleep_ms`, and a change of `name` can
/// only be made by a replace (`replace_reasons`).
#[derive(Default)]
struct Configured {
    seen: Mutex<Vec<(String, Map)>>,
    failures_left: AtomicU32,
    creates: AtomicU32,
}

#[async_trait]
impl Provider for Configured {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Cfg::Thing",
            vec![
                AttributeSchema::new("name", Type::String).required(),
                AttributeSchema::new("sleep_ms", Type::optional(Type::Any)),
            ],
        )]
    }
    fn config_schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Cfg",
            vec![
                AttributeSchema::new("url", Type::String).sensitive(),
                AttributeSchema::new("region", Type::String),
            ],
        )]
    }
    fn replace_reasons(&self, _: &str, desired: &Map, actual: &Map) -> Vec<String> {
        if desired.get("name") == actual.get("name") {
            vec![]
        } else {
            vec!["name".to_owned()]
        }
    }
    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        self.seen.lock().unwrap().push(("create".into(), cx.config.clone()));
        if let Some(ms) = desired.get("sleep_ms").and_then(Value::as_u64) {
            ThreadTimer.sleep(Duration::from_millis(ms)).await;
        }
        if self
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            let url = cx.config.get("url").cloned().unwrap_or_default();
            return Err(ProviderError::Other(format!("unavailable ({url})")));
        }
        let n = self.creates.fetch_add(1, Ordering::SeqCst);
        Ok(Created {
            external_id: format!("c-{n}"),
            actual: desired.clone(),
        })
    }
    async fn read(&self, _: &OpContext<'_>, _: &str, prior: Option<&Map>) -> Result<Option<Map>, ProviderError> {
        Ok(prior.cloned())
    }
    async fn update(&self, _: &OpContext<'_>, _: &str, desired: &Map, _: &Map) -> Result<Map, ProviderError> {
        Ok(desired.clone())
    }
    async fn delete(&self, cx: &OpContext<'_>, _: &str, _: &Map) -> Result<(), ProviderError> {
        self.seen.lock().unwrap().push(("delete".into(), cx.config.clone()));
        Ok(())
    }
}

struct Setup {
    providers: Providers,
    provider: Arc<Configured>,
    store: MemStore,
    cancel: AtomicBool,
}

impl Setup {
    fn new() -> Setup {
        let provider = Arc::new(Configured::default());
        let mut providers = Providers::new();
        let dynp: Arc<dyn Provider> = provider.clone();
        providers.register(&dynp);
        Setup {
            providers,
            provider,
            store: MemStore::default(),
            cancel: AtomicBool::new(false),
        }
    }

    fn load(&self, main: &str, lib: Option<&str>) -> Result<(Program, Sources), String> {
        let mut sources = Sources::default();
        let lib = lib.map(str::to_owned);
        let mut source = move |name: &str| match (name, &lib) {
            ("lib", Some(text)) => Some(("lib.yaml".to_owned(), text.clone())),
            _ => None,
        };
        program::load(
            "t",
            ("t.yaml".into(), main.into()),
            &mut source,
            &mut sources,
            self.providers.schemas(),
        )
        .map(|p| (p, Sources::default()))
        .map_err(|d| d.render(&sources))
    }

    fn engine<'a>(&'a self, sources: &'a Sources) -> Engine<'a> {
        engine_for(&self.providers, &self.store, &Quiet, sources, &self.cancel)
    }

    fn apply(&self, main: &str, data: Value) -> Report {
        let (prog, sources) = self.load(main, None).unwrap();
        let data = data.as_object().cloned().unwrap_or_default();
        block_on(self.engine(&sources).apply(&prog, "d", &data, "test")).unwrap()
    }

    fn seen(&self) -> Vec<(String, Map)> {
        std::mem::take(&mut *self.provider.seen.lock().unwrap())
    }

    fn record(&self, id: &str) -> ResourceRecord {
        self.store.deployments.lock().unwrap()["d"]
            .resource(id)
            .unwrap()
            .clone()
    }
}

const CONFIGURED: &str = "parameters:\n  url: {type: 'Sensitive[String]'}\n  region: {}\nproviders:\n  Cfg:\n    url: $url\n    region: $region\nsteps:\n  a:\n    resource: Cfg::Thing\n    value: {name: alpha}\n";

#[test]
fn settings_reach_the_provider_are_recorded_and_serve_a_delete_without_the_workflow() {
    let s = Setup::new();
    let r = s.apply(CONFIGURED, json!({"url": "pg://secret-pw@db", "region": "eu"}));
    assert!(!r.failed(), "{r:?}");
    let seen = s.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        Value::Object(seen[0].1.clone()),
        json!({"url": "pg://secret-pw@db", "region": "eu"})
    );
    let rec = s.record("a");
    assert_eq!(rec.desired[PROVIDER_CONFIG_KEY]["settings"]["region"], json!("eu"));
    assert!(rec.sensitive.iter().any(|k| k == PROVIDER_CONFIG_KEY), "{rec:?}");
    // A no-change apply writes nothing new and the settings stay out of the diff.
    let r = s.apply(CONFIGURED, json!({"url": "pg://secret-pw@db", "region": "eu"}));
    assert_eq!(r.steps[0].action, Action::Noop, "{r:?}");
    // `lyra delete` has no workflow: the recorded settings reach the provider.
    let sources = Sources::default();
    let r = block_on(s.engine(&sources).delete("d", "test")).unwrap();
    assert!(!r.failed(), "{r:?}");
    let seen = s.seen();
    let delete = seen.iter().find(|(op, _)| op == "delete").expect("deleted");
    assert_eq!(delete.1["url"], json!("pg://secret-pw@db"));
}

#[test]
fn secret_settings_are_scrubbed_from_errors() {
    let s = Setup::new();
    s.provider.failures_left.store(1, Ordering::SeqCst);
    let r = s.apply(CONFIGURED, json!({"url": "pg://hunter2@db", "region": "eu"}));
    assert!(r.failed());
    let text = format!("{r:?}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("unavailable"), "{text}");
}

#[test]
fn settings_are_validated() {
    let s = Setup::new();
    let cases = [
        ("providers:\n  Nope: {}\nsteps: {}\n", "unknown provider 'Nope'"),
        (
            "providers:\n  Cfg: {port: 1}\nsteps: {}\n",
            "unknown setting 'port' of provider Cfg",
        ),
        (
            "providers:\n  Cfg: {region: [1]}\nsteps: {}\n",
            "setting 'region' of provider Cfg expects",
        ),
        (
            "providers:\n  Cfg: {region: $r}\nsteps: {}\n",
            "read only the top-level parameters; '$r'",
        ),
        ("providers: [a]\nsteps: {}\n", "'providers' must be a mapping"),
        (
            "steps:\n  a:\n    resource: Cfg::Thing\n    value: {sleep_ms: 1}\n",
            "does not set 'name', which Cfg::Thing requires",
        ),
        (
            "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: a}\n    retry: {attempts: 0}\n",
            "'attempts' must be a whole number from 1 to 100",
        ),
        (
            "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: a}\n    timeout: soon\n",
            "'timeout' 'soon' is not a duration",
        ),
    ];
    for (text, want) in cases {
        let err = s.load(text, None).err().unwrap_or_else(|| panic!("accepted:\n{text}"));
        assert!(err.contains(want), "{text}\nwant {want:?} in:\n{err}");
    }
    let err = s
        .load(
            "steps:\n  l:\n    call: lib\n",
            Some("providers:\n  Cfg: {region: eu}\nsteps: {}\n"),
        )
        .unwrap_err();
    assert!(
        err.contains("'providers' belongs to the main workflow; 'lib' is called by 't'"),
        "{err}"
    );
}

#[test]
fn retry_retries_retryable_failures_with_backoff() {
    let s = Setup::new();
    s.provider.failures_left.store(2, Ordering::SeqCst);
    let wf = "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: a}\n    retry: {attempts: 3, backoff: 10ms}\n";
    let started = Instant::now();
    let r = s.apply(wf, json!({}));
    assert!(!r.failed(), "{r:?}");
    assert_eq!(s.seen().len(), 3, "two failures, then the create");
    assert!(
        started.elapsed() >= Duration::from_millis(30),
        "10 ms then 20 ms of backoff"
    );

    let s = Setup::new();
    s.provider.failures_left.store(5, Ordering::SeqCst);
    let r = s.apply(&wf.replace("attempts: 3", "attempts: 2"), json!({}));
    assert!(r.failed());
    let e = r.steps[0].error.clone().unwrap_or_default();
    assert!(e.contains("after 2 attempts"), "{e}");
    assert_eq!(s.seen().len(), 2);
    // A failed create leaves no intent: the next run simply creates.
    assert!(s.store.deployments.lock().unwrap()["d"].resources.is_empty());
}

#[test]
fn a_timed_out_create_keeps_its_intent_for_the_next_run() {
    let s = Setup::new();
    let wf = "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: a, sleep_ms: 2000}\n    timeout: 50ms\n";
    let started = Instant::now();
    let r = s.apply(wf, json!({}));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "given up at the timeout"
    );
    assert!(r.failed());
    let e = r.steps[0].error.clone().unwrap_or_default();
    assert!(e.contains("timed out after 50ms"), "{e}");
    // It may have made the resource: the intent stays, as after a crash.
    assert!(s.record("a").pending);
}

#[test]
fn a_provider_can_ask_for_a_replace() {
    let s = Setup::new();
    let wf = "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: NAME}\n";
    s.apply(&wf.replace("NAME", "one"), json!({}));
    let r = s.apply(&wf.replace("NAME", "two"), json!({}));
    assert_eq!(r.steps[0].action, Action::Replace, "{r:?}");
    assert!(r.steps[0].changes[0].forces_replace);
    assert_eq!(s.record("a").external_id, "c-1");
}

/// A hash built from a secret is masked where it is shown, but only the secret itself is
/// scrubbed from everything else: the words beside it in the hash (a kind, a namespace) are
/// not secrets, and other steps may show them.
#[test]
fn strings_beside_a_secret_in_a_hash_are_not_scrubbed_elsewhere() {
    let f = Fixture::new();
    let wf = "parameters:\n  pw: {type: 'Sensitive[String]'}\nsteps:\n  secret:\n    resource: Test::Thing\n    value:\n      input: {kind: Secret, namespace: default, password: $pw}\n  plain:\n    resource: Test::Thing\n    value:\n      input: default\n  loud:\n    resource: Test::Thing\n    value:\n      input: fail with $pw\n";
    let r = f.run(wf, json!({"pw": "hunter2-pw"}), Mode::Apply);
    let plain = step(&r, "plain");
    assert_eq!(plain.changes[0].new, Some(json!("default")), "{plain:?}");
    let secret = step(&r, "secret");
    assert!(secret.changes.iter().all(|c| c.sensitive), "{secret:?}");
    let text = format!("{r:?}");
    assert!(!text.contains("hunter2-pw"), "{text}");
    // Applied again (the record's derived hash is not a needle either).
    let r = f.run(
        &wf.replace("input: default", "input: default-2"),
        json!({"pw": "hunter2-pw"}),
        Mode::Plan,
    );
    let plain = step(&r, "plain");
    assert_eq!(plain.changes[0].new, Some(json!("default-2")), "{plain:?}");
}

#[test]
fn a_create_that_timed_out_on_every_attempt_keeps_its_intent() {
    let s = Setup::new();
    let wf = "steps:\n  a:\n    resource: Cfg::Thing\n    value: {name: a, sleep_ms: 2000}\n    timeout: 30ms\n    retry: {attempts: 2, backoff: 10ms}\n";
    let r = s.apply(wf, json!({}));
    assert!(r.failed());
    let e = r.steps[0].error.clone().unwrap_or_default();
    assert!(e.contains("timed out after 30ms"), "{e}");
    // The provider cannot tell (no key tracking) whether a create was made: no second guess.
    assert_eq!(
        s.seen().len(),
        1,
        "a create that may have worked is not repeated blindly"
    );
    assert!(s.record("a").pending);
}

/// A scope's children that finish at their first poll and children that wait (a create that
/// sleeps) are both settled, and each one's dependents start after it with its returns:
/// more children finishing at once than the scope runs before it lets others go.
#[test]
fn children_that_wait_and_children_done_at_once_settle_their_dependents() {
    let s = Setup::new();
    let mut yaml = String::from("steps:\n");
    for i in 0..300 {
        // Every tenth waits; each has a dependent reading its name.
        let sleep = if i % 10 == 0 { ", sleep_ms: 5" } else { "" };
        yaml.push_str(&format!(
            "  s{i}:\n    returns: {{n{i}: name}}\n    resource: Cfg::Thing\n    value: {{name: 'n{i}'{sleep}}}\n  \
             d{i}:\n    returns: {{m{i}: name}}\n    resource: Cfg::Thing\n    value: {{name: $n{i}}}\n"
        ));
    }
    let r = s.apply(&yaml, json!({}));
    assert!(!r.failed(), "{r:?}");
    assert_eq!(r.counts.created, 600, "{:?}", r.counts);
    for i in [0, 1, 10, 299] {
        assert_eq!(s.record(&format!("d{i}")).actual["name"], json!(format!("n{i}")));
    }
    // A dependent is reported after what it depends on.
    let at = |id: &str| r.steps.iter().position(|st| st.id == id).expect(id);
    for i in 0..300 {
        assert!(at(&format!("s{i}")) < at(&format!("d{i}")), "d{i} before s{i}");
    }
}

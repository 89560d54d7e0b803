//! `Engine::adopt`: a resource that exists recorded as a step's, with the settings it was
//! read with, as an `import` run; every refusal records nothing.

use super::*;

/// `Ext::Box`: boxes that exist before any workflow (`box-1`, secret `token`); reading
/// `box-broken` fails.
struct Existing {
    settings: Mutex<Vec<Map>>,
}

#[async_trait]
impl Provider for Existing {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Ext::Box",
            vec![
                AttributeSchema::new("size", Type::Any),
                AttributeSchema::new("token", Type::optional(Type::String)).sensitive(),
            ],
        )]
    }
    fn config_schemas(&self) -> Vec<ResourceSchema> {
        vec![ResourceSchema::new(
            "Ext",
            vec![AttributeSchema::new("region", Type::String)],
        )]
    }
    async fn create(&self, _: &OpContext<'_>, _: &Map) -> Result<Created, ProviderError> {
        panic!("adopting creates nothing")
    }
    async fn read(&self, cx: &OpContext<'_>, id: &str, _: Option<&Map>) -> Result<Option<Map>, ProviderError> {
        self.settings.lock().unwrap().push(cx.config.clone());
        match id {
            "box-1" => Ok(json!({"size": 3, "token": "t0k3n"}).as_object().cloned()),
            "box-broken" => Err(ProviderError::Other("unreachable".into())),
            _ => Ok(None),
        }
    }
    async fn update(&self, _: &OpContext<'_>, _: &str, _: &Map, _: &Map) -> Result<Map, ProviderError> {
        panic!("adopting updates nothing")
    }
    async fn delete(&self, _: &OpContext<'_>, _: &str, _: &Map) -> Result<(), ProviderError> {
        panic!("adopting deletes nothing")
    }
}

const WORKFLOW: &str = "
providers:
  Ext:
    region: r1
steps:
  b:
    resource: Ext::Box
    value:
      size: 1
  seen:
    resource: Ext::Box
    external_id: box-1
    value:
      size: 3
  many:
    times: 2
    as: i
    step:
      resource: Ext::Box
      value:
        size: $i
";

fn adopt(store: &MemStore, step: &str, id: &str) -> (Result<Adopted, AdoptError>, Arc<Existing>) {
    let existing = Arc::new(Existing {
        settings: Mutex::default(),
    });
    let mut providers = Providers::new();
    let dynp: Arc<dyn Provider> = existing.clone();
    providers.register(&dynp);
    let mut sources = Sources::default();
    let prog = load(WORKFLOW, &providers, &mut sources);
    let cancel = AtomicBool::new(false);
    let engine = engine_for(&providers, store, &Quiet, &sources, &cancel);
    let adopted = block_on(engine.adopt(&prog, "d", &Map::new(), step, id, "test"));
    (adopted, existing)
}

fn records(store: &MemStore) -> Vec<ResourceRecord> {
    store
        .deployments
        .lock()
        .unwrap()
        .get("d")
        .map(|d| d.resources.clone())
        .unwrap_or_default()
}

#[test]
fn an_existing_resource_is_recorded_with_its_settings_as_an_import() {
    let store = MemStore::default();
    let (adopted, existing) = adopt(&store, "b", "box-1");
    let adopted = adopted.expect("adopted");
    assert_eq!((adopted.step_id.as_str(), adopted.external_id.as_str()), ("b", "box-1"));
    assert_eq!(adopted.sensitive, ["token"]);
    assert_eq!(
        existing.settings.lock().unwrap()[0],
        *json!({"region": "r1"}).as_object().unwrap()
    );
    let recs = records(&store);
    assert_eq!(recs.len(), 1);
    let rec = &recs[0];
    assert!(rec.managed && !rec.pending, "{rec:?}");
    assert_eq!(rec.actual["size"], json!(3));
    assert_eq!(rec.sensitive, ["token"]);
    // No desired state of its own besides the settings, which a delete without the
    // workflow needs.
    assert_eq!(config::recorded(rec), json!({"region": "r1"}).as_object());
    assert_eq!(config::attributes(&rec.desired).len(), 0);
    let ends = store.ends.lock().unwrap();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].outcome, Outcome::Succeeded);
    assert!(
        ends[0].note.as_deref().is_some_and(|n| n.contains("box-1")),
        "{:?}",
        ends[0]
    );
}

#[test]
fn refusals_record_nothing() {
    let store = MemStore::default();
    let refused = |step: &str, id: &str| {
        let (r, _) = adopt(&store, step, id);
        r.expect_err("refused")
    };
    assert!(matches!(refused("b", "box-9"), AdoptError::Missing { .. }));
    assert!(matches!(refused("b", "box-broken"), AdoptError::Read { .. }));
    assert!(matches!(refused("seen", "box-1"), AdoptError::ReadOnly(_)));
    assert!(matches!(refused("many/0", "box-1"), AdoptError::Nested(_)));
    assert!(matches!(refused("many", "box-1"), AdoptError::NotResource(_)));
    match refused("bb", "box-1") {
        AdoptError::NoStep { candidates, .. } => assert_eq!(candidates, ["b"]),
        other => panic!("{other:?}"),
    }
    assert!(records(&store).is_empty());
    assert!(store.ends.lock().unwrap().is_empty(), "no run for a refusal");

    adopt(&store, "b", "box-1").0.expect("adopted");
    assert!(matches!(refused("b", "box-1"), AdoptError::Recorded { .. }));
    assert_eq!(records(&store).len(), 1);
}

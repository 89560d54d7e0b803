//! The bridge against real Terraform providers: HashiCorp's `terraform-provider-null` v2.1.2
//! (protocol 5, go-plugin with automatic mutual TLS; installed by `.ci/tools`) and this crate's protocol-6 test provider.

// A skipped test says so on stderr.
#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use lyra_core::provider::{OpContext, Provider, ProviderError};
use lyra_core::value::Map;
use lyra_terraform::{STATE_KEY, TerraformProvider};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(20);

/// The null provider binary: `$LYRA_TF_NULL_PROVIDER`, else where `.ci/tools` installs it
/// (`${LYRA_TOOLS:-~/.cache/lyra-ci}/bin`); `None` (skipping) outside CI when it is missing.
fn null_provider() -> Option<PathBuf> {
    const NAME: &str = "terraform-provider-null_v2.1.2_x4";
    if let Some(p) = std::env::var_os("LYRA_TF_NULL_PROVIDER") {
        return Some(PathBuf::from(p));
    }
    let tools = std::env::var_os("LYRA_TOOLS").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lyra-ci"),
        PathBuf::from,
    );
    let path = tools.join("bin").join(NAME);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but {} is missing: run .ci/tools",
        path.display()
    );
    eprintln!("skipped: {} is missing (run .ci/tools)", path.display());
    None
}

fn test_provider() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_terraform-provider-lyratest"))
}

fn map(v: serde_json::Value) -> Map {
    match v {
        serde_json::Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

struct Cx {
    config: Map,
    cancel: AtomicBool,
}

impl Cx {
    fn new(config: serde_json::Value) -> Cx {
        Cx {
            config: map(config),
            cancel: AtomicBool::new(false),
        }
    }
    fn op<'a>(&'a self, type_name: &'a str) -> OpContext<'a> {
        OpContext {
            deployment: "d",
            step_id: "s",
            type_name,
            idempotency_key: Some("k"),
            config: &self.config,
            cancel: &self.cancel,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_null_provider_creates_reads_replaces_and_deletes() {
    let Some(path) = null_provider() else { return };
    let p = TerraformProvider::start("null", &path, TIMEOUT)
        .await
        .expect("start the null provider");
    assert_eq!(p.protocol(), 5);
    let schema = p
        .schemas()
        .into_iter()
        .find(|s| s.name == "TfNull::Resource")
        .expect("TfNull::Resource");
    assert!(schema.attribute("triggers").is_some(), "{schema:?}");
    // SDK v1 declares `id` optional and computed.
    assert!(schema.attribute("id").unwrap().provided);

    let cx = Cx::new(json!({}));
    let op = cx.op("TfNull::Resource");
    let desired = map(json!({"triggers": {"a": "1"}}));
    let created = p.create(&op, &desired).await.expect("create");
    let id = created.external_id.clone();
    assert!(
        id.chars().all(|c| c.is_ascii_digit()),
        "null_resource ids are numbers: {id}"
    );
    assert_eq!(created.actual["triggers"], json!({"a": "1"}));
    assert_eq!(created.actual["id"], json!(id));
    assert!(created.actual[STATE_KEY]["private"].is_string(), "{:?}", created.actual);

    let read = p
        .read(&op, &id, Some(&created.actual))
        .await
        .expect("read")
        .expect("still there");
    assert_eq!(read["id"], json!(id));
    assert_eq!(read["triggers"], json!({"a": "1"}));

    // The provider's own plan: a change of triggers replaces; the same triggers change nothing.
    let changed = map(json!({"triggers": {"a": "2"}}));
    // (SDK v1 also lists `id`, which the engine ignores: it changes no attribute a workflow sets.)
    let reasons = p.replace_reasons("TfNull::Resource", &changed, &read);
    assert!(reasons.contains(&"triggers".to_owned()), "{reasons:?}");
    assert!(p.replace_reasons("TfNull::Resource", &desired, &read).is_empty());

    p.delete(&op, &id, &read).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_protocol_6_provider_round_trips_private_state_and_sees_drift() {
    let dir = tempfile::tempdir().unwrap();
    let p = TerraformProvider::start("lyratest", &test_provider(), TIMEOUT)
        .await
        .expect("start");
    assert_eq!(p.protocol(), 6);
    let names: Vec<String> = p.schemas().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["TfLyratest::File"]);
    let config = p.config_schemas();
    assert!(config[0].attribute("token").unwrap().sensitive);

    let cx = Cx::new(json!({"root": dir.path().to_str().unwrap()}));
    let op = cx.op("TfLyratest::File");
    let created = p
        .create(&op, &map(json!({"path": "a.txt", "content": "one"})))
        .await
        .expect("create");
    assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "one");
    assert_eq!(created.actual["length"], json!(3));
    // The provider checks that its private bytes come back on every later call.
    let updated = p
        .update(
            &op,
            &created.external_id,
            &map(json!({"path": "a.txt", "content": "three"})),
            &created.actual,
        )
        .await
        .expect("update in place");
    assert_eq!(updated["length"], json!(5));
    assert_eq!(
        p.replace_reasons(
            "TfLyratest::File",
            &map(json!({"path": "b.txt", "content": "three"})),
            &updated
        ),
        ["path"]
    );
    std::fs::write(dir.path().join("a.txt"), "edited").unwrap();
    let read = p
        .read(&op, &created.external_id, Some(&updated))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read["content"], json!("edited"));
    p.delete(&op, &created.external_id, &read).await.expect("delete");
    assert!(!dir.path().join("a.txt").exists());
    assert!(p.read(&op, &created.external_id, Some(&read)).await.unwrap().is_none());

    // Import by id (the path) when only the id is known.
    std::fs::write(dir.path().join("c.txt"), "adopted").unwrap();
    let imported = p.read(&op, "c.txt", None).await.unwrap().expect("imported");
    assert_eq!(imported["content"], json!("adopted"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_setting_is_a_configuration_error_and_a_dead_provider_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let p = TerraformProvider::start("lyratest", &test_provider(), TIMEOUT)
        .await
        .expect("start");
    let bad = Cx::new(json!({"root": dir.path().to_str().unwrap(), "token": "wrong"}));
    let e = p
        .create(&bad.op("TfLyratest::File"), &map(json!({"path": "a", "content": "x"})))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e}");
    assert!(e.to_string().contains("terraform provider lyratest"), "{e}");
    assert!(
        !e.to_string().contains("wrong"),
        "the setting's value is not in the message: {e}"
    );

    let cx = Cx::new(json!({"root": dir.path().to_str().unwrap()}));
    let op = cx.op("TfLyratest::File");
    // `die:` content makes the provider exit in the middle of the apply.
    let e = p
        .create(&op, &map(json!({"path": "a", "content": "die:now"})))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Other(_)), "{e}");
    assert!(e.to_string().contains("the provider exited"), "{e}");
    let again = p
        .create(&op, &map(json!({"path": "a", "content": "fine"})))
        .await
        .expect("a fresh process");
    assert_eq!(again.actual["content"], json!("fine"));
}

//! Admission decisions from AdmissionReview bodies as the API server sends them, against a
//! load path of real workflows and the built-in providers.

use std::sync::Arc;

use lyra_providers::{ProvidersConfig, builtin};
use serde_json::{Value, json};

use super::*;
use crate::metrics::Metrics;
use crate::reconcile::Settings;

const HELLO: &str = "\
steps:
  hello:
    resource: Null::Resource
    value: {input: hello}
";

const CYCLE: &str = "\
steps:
  a:
    returns: {aOut: output}
    resource: Null::Resource
    value: {input: $bOut}
  b:
    returns: {bOut: output}
    resource: Null::Resource
    value: {input: $aOut}
";

const TYPED: &str = "\
parameters:
  port: {type: Integer, lookup: port}
  password: {type: 'Sensitive[Integer]', lookup: password}
steps:
  web:
    resource: Null::Resource
    value: {input: $port}
";

struct Harness {
    _dir: tempfile::TempDir,
    admission: Admission,
}

async fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(workflows.join("team")).unwrap();
    std::fs::write(workflows.join("hello.yaml"), HELLO).unwrap();
    std::fs::write(workflows.join("team/cycle.yaml"), CYCLE).unwrap();
    std::fs::write(workflows.join("typed.yaml"), TYPED).unwrap();
    let store = lyra_state::open(&dir.path().join("state.db").display().to_string())
        .await
        .unwrap();
    let providers = Arc::new(builtin(&ProvidersConfig {
        foobernetes_file: dir.path().join("deployment.json"),
        ..ProvidersConfig::default()
    }));
    let runtime = Runtime::new(providers, store, Settings::new(&workflows), Arc::new(Metrics::new()));
    Harness {
        _dir: dir,
        admission: Admission::new(Arc::new(runtime)),
    }
}

fn workflow(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "lyra.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": "default", "uid": "u-1", "generation": 1},
        "spec": spec,
    })
}

fn review_text(operation: &str, object: Option<Value>, old: Option<Value>, extra: Value) -> String {
    let mut request = json!({
        "uid": "req-1",
        "kind": {"group": "lyra.dev", "version": "v1alpha1", "kind": "Workflow"},
        "resource": {"group": "lyra.dev", "version": "v1alpha1", "resource": "workflows"},
        "name": "x",
        "namespace": "default",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": object,
        "oldObject": old,
        "dryRun": false,
    });
    for (k, v) in extra.as_object().unwrap() {
        request[k] = v.clone();
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).to_string()
}

async fn decide_text(h: &Harness, body: &str) -> Verdict {
    let req = parse_review(body.as_bytes()).expect("a review");
    h.admission.review(&req).await
}

async fn decide(h: &Harness, operation: &str, object: Value, old: Option<Value>) -> Verdict {
    decide_text(h, &review_text(operation, Some(object), old, json!({}))).await
}

async fn create(h: &Harness, spec: Value) -> Verdict {
    decide(h, "CREATE", workflow("x", spec), None).await
}

#[track_caller]
fn denied(v: &Verdict) -> &str {
    match v {
        Verdict::Denied(m) => m,
        Verdict::Allowed { .. } => panic!("allowed, expected a denial"),
    }
}

#[tokio::test]
async fn valid_workflows_are_allowed() {
    let h = harness().await;
    assert_eq!(create(&h, json!({"workflowName": "hello"})).await, Verdict::allowed());
    let inline = json!({"workflow": {"steps": {"s": {"resource": "Null::Resource", "value": {"input": "x"}}}}});
    assert_eq!(create(&h, inline).await, Verdict::allowed());
    let typed = json!({"workflowName": "typed", "data": {"port": 80, "password": 1234}, "refreshInterval": "5m"});
    assert_eq!(create(&h, typed).await, Verdict::allowed());
    // A create by generateName: no name yet.
    let mut obj = workflow("x", json!({"workflowName": "hello"}));
    obj["metadata"] = json!({"generateName": "hello-", "namespace": "default"});
    let body = review_text("CREATE", Some(obj), None, json!({"name": ""}));
    assert!(decide_text(&h, &body).await.is_allowed());
}

#[tokio::test]
async fn a_missing_workflow_is_denied_by_name() {
    let h = harness().await;
    let v = create(&h, json!({"workflowName": "no::such"})).await;
    let m = denied(&v);
    assert!(m.starts_with("WorkflowNotFound: "), "{m}");
    assert!(m.contains("no::such"), "{m}");
    let m = denied(&create(&h, json!({"workflowName": "../etc/passwd"})).await).to_owned();
    assert!(m.starts_with("InvalidWorkflowName: "), "{m}");
}

#[tokio::test]
async fn both_or_neither_workflow_fields_are_denied() {
    let h = harness().await;
    let both = json!({"workflowName": "hello", "workflow": {"steps": {}}});
    let m = denied(&create(&h, both).await).to_owned();
    assert!(m.contains("exactly one of spec.workflowName and spec.workflow"), "{m}");
    let m = denied(&create(&h, json!({})).await).to_owned();
    assert!(m.starts_with("InvalidSpec: set spec.workflowName"), "{m}");
}

#[tokio::test]
async fn an_invalid_workflow_is_denied_with_the_validators_words() {
    let h = harness().await;
    let m = denied(&create(&h, json!({"workflowName": "team::cycle"})).await).to_owned();
    assert!(m.starts_with("InvalidWorkflow: "), "{m}");
    assert!(m.contains("dependency cycle"), "{m}");
    assert!(m.contains("a -> b -> a") || m.contains("b -> a -> b"), "{m}");
    assert!(m.contains("cycle.yaml:"), "names the file and line: {m}");

    // Inline: the field path, as the reconciler's Stalled message says it.
    let inline =
        json!({"workflow": {"steps": {"web": {"resource": "Null::Resource", "value": {"input": "$nothing"}}}}});
    let m = denied(&create(&h, inline).await).to_owned();
    assert!(m.contains("spec.workflow.steps.web"), "{m}");
    assert!(m.contains("nothing"), "{m}");
}

#[tokio::test]
async fn data_that_does_not_fit_the_parameters_is_denied_naming_the_parameter() {
    let h = harness().await;
    let wrong = json!({"workflowName": "typed", "data": {"port": "eighty", "password": 1}});
    let m = denied(&create(&h, wrong).await).to_owned();
    assert!(m.starts_with("InvalidData: "), "{m}");
    assert!(m.contains("parameter 'port'"), "{m}");
    assert!(m.contains("typed.yaml:2:3"), "{m}");

    let missing = json!({"workflowName": "typed", "data": {"port": 80}});
    let m = denied(&create(&h, missing).await).to_owned();
    assert!(m.contains("'password'"), "{m}");

    // Flat dotted keys are the original's data too.
    let dotted = json!({"workflowName": "typed", "data": {"port": 80, "password": 1, "a.b": 1}});
    assert!(create(&h, dotted).await.is_allowed());
}

#[tokio::test]
async fn a_sensitive_value_never_reaches_the_denial() {
    let h = harness().await;
    let secret = "hunter2-very-secret";
    let v = create(
        &h,
        json!({"workflowName": "typed", "data": {"port": 80, "password": secret}}),
    )
    .await;
    let m = denied(&v);
    assert!(m.contains("parameter 'password'"), "{m}");
    assert!(!m.contains(secret), "the secret leaked: {m}");
}

#[tokio::test]
async fn too_deep_a_spec_is_denied_naming_where_even_past_serde_jsons_limit() {
    let h = harness().await;
    let depth = 5_000;
    let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    // managedFields nest as deep as the spec: they are skipped, not parsed.
    let fields = format!("{}{}", "{\"f:a\":".repeat(depth), "{}".to_owned() + &"}".repeat(depth));
    let body = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"req-1","kind":{{"group":"lyra.dev","version":"v1alpha1","kind":"Workflow"}},"resource":{{"group":"lyra.dev","version":"v1alpha1","resource":"workflows"}},"name":"x","namespace":"default","operation":"CREATE","userInfo":{{}},"object":{{"metadata":{{"name":"x","namespace":"default","managedFields":[{{"fieldsV1":{fields}}}]}},"spec":{{"workflowName":"hello","data":{{"k":{deep}}}}}}},"oldObject":null}}}}"#
    );
    let v = decide_text(&h, &body).await;
    let m = denied(&v);
    assert!(m.contains("spec.data.k[0]"), "{m}");
    assert!(m.contains("more than 64 levels"), "{m}");
}

#[tokio::test]
async fn an_unparsable_refresh_interval_is_denied() {
    let h = harness().await;
    let m = denied(&create(&h, json!({"workflowName": "hello", "refreshInterval": "soon"})).await).to_owned();
    assert!(m.contains("spec.refreshInterval 'soon'"), "{m}");
}

#[tokio::test]
async fn deletes_metadata_only_updates_status_and_dying_objects_are_allowed() {
    let h = harness().await;
    // Invalid as it stands (the workflow went from the load path since it was stored).
    let stored = workflow("x", json!({"workflowName": "no::such"}));
    let body = review_text("DELETE", None, Some(stored.clone()), json!({}));
    assert_eq!(decide_text(&h, &body).await, Verdict::allowed());

    // The controller's finalizer patch: metadata only.
    let mut patched = stored.clone();
    patched["metadata"]["finalizers"] = json!(["lyra.dev/cleanup"]);
    patched["metadata"]["annotations"] = json!({"lyra.dev/reconcile-requested-at": "now"});
    assert_eq!(
        decide(&h, "UPDATE", patched.clone(), Some(stored.clone())).await,
        Verdict::allowed()
    );
    // The same spec written differently (key order) is no change either.
    let mut reordered = stored.clone();
    reordered["spec"] = serde_json::from_str(r#"{"deletionPolicy":"Delete","workflowName":"no::such"}"#).unwrap();
    let mut old = stored.clone();
    old["spec"] = serde_json::from_str(r#"{"workflowName":"no::such","deletionPolicy":"Delete"}"#).unwrap();
    assert!(decide(&h, "UPDATE", reordered, Some(old)).await.is_allowed());

    // The status subresource.
    let body = review_text(
        "UPDATE",
        Some(stored.clone()),
        Some(stored.clone()),
        json!({"subResource": "status"}),
    );
    assert!(decide_text(&h, &body).await.is_allowed());

    // Finalizer removal from an object being deleted, even with a spec change.
    let mut dying = workflow("x", json!({"workflowName": "no::such::either"}));
    dying["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    assert!(decide(&h, "UPDATE", dying, Some(stored.clone())).await.is_allowed());

    // A spec change is judged.
    let changed = workflow("x", json!({"workflowName": "still::missing"}));
    let m = denied(&decide(&h, "UPDATE", changed, Some(stored)).await).to_owned();
    assert!(m.contains("still::missing"), "{m}");
}

#[tokio::test]
async fn a_dry_run_is_judged_the_same() {
    let h = harness().await;
    let body = review_text(
        "CREATE",
        Some(workflow("x", json!({"workflowName": "no::such"}))),
        None,
        json!({"dryRun": true}),
    );
    assert!(denied(&decide_text(&h, &body).await).contains("no::such"));
}

#[tokio::test]
async fn the_response_answers_the_request() {
    let h = harness().await;
    let body = review_text(
        "CREATE",
        Some(workflow("x", json!({"workflowName": "no::such"}))),
        None,
        json!({}),
    );
    let req = parse_review(body.as_bytes()).unwrap();
    let verdict = h.admission.review(&req).await;
    let answer = serde_json::to_value(response(&req, verdict)).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "req-1");
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("no::such")
    );
    let allowed = serde_json::to_value(response(&req, Verdict::warn("careful".into()))).unwrap();
    assert_eq!(allowed["response"]["allowed"], true);
    assert_eq!(allowed["response"]["warnings"], json!(["careful"]));

    assert!(matches!(parse_review(b"{}"), Err(ReviewError::Malformed(_))));
    let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string();
    assert!(matches!(
        parse_review(no_request.as_bytes()),
        Err(ReviewError::NoRequest)
    ));
}

fn definition_review(spec: Value) -> String {
    definition_update(spec, None)
}

/// A review of a definition with `spec`: a CREATE, or an UPDATE from `old` (a spec).
fn definition_update(spec: Value, old: Option<Value>) -> String {
    let object = |spec: Value| {
        json!({
            "apiVersion": "lyra.dev/v1alpha1",
            "kind": "WorkflowDefinition",
            "metadata": {"name": "web"},
            "spec": spec,
        })
    };
    review_text(
        if old.is_some() { "UPDATE" } else { "CREATE" },
        Some(object(spec)),
        old.map(object),
        json!({
            "kind": {"group": "lyra.dev", "version": "v1alpha1", "kind": "WorkflowDefinition"},
            "resource": {"group": "lyra.dev", "version": "v1alpha1", "resource": "workflowdefinitions"},
            "namespace": null,
            "name": "web",
        }),
    )
}

/// A client that reaches nothing: the checks below never get as far as the API server.
fn unreachable_client() -> Client {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    Client::try_from(config).unwrap()
}

#[tokio::test]
async fn definitions_are_checked_only_where_asked_a_bad_reference_denied_an_unreachable_registry_allowed() {
    let mut h = harness().await;
    let bad = definition_review(json!({"package": "oci://", "kind": "Web", "plural": "webs"}));
    assert!(decide_text(&h, &bad).await.is_allowed(), "definitions off: not judged");

    let runtime = Arc::clone(&h.admission.runtime);
    h.admission = Admission::new(runtime)
        .with_definitions(
            unreachable_client(),
            Arc::new(Packages::new(lyra_package::RegistryOptions::default())),
        )
        .with_package_timeout(Duration::from_secs(3));
    let m = denied(&decide_text(&h, &bad).await).to_owned();
    assert!(m.starts_with("InvalidPackage: spec.package"), "{m}");

    // A changed definition is judged too (its spec is no Workflow's, however it reads).
    let changed = definition_update(
        json!({"package": "oci://", "kind": "Web", "plural": "webs"}),
        Some(json!({"package": "oci://127.0.0.1:9/web:1.0", "kind": "Web", "plural": "webs"})),
    );
    let m = denied(&decide_text(&h, &changed).await).to_owned();
    assert!(m.starts_with("InvalidPackage: spec.package"), "{m}");
    let unchanged = definition_update(
        json!({"package": "oci://", "kind": "Web", "plural": "webs"}),
        Some(json!({"plural": "webs", "kind": "Web", "package": "oci://"})),
    );
    assert!(
        decide_text(&h, &unchanged).await.is_allowed(),
        "an unchanged spec needs no judging"
    );

    // Port 9 on loopback: nothing listens, so the registry is unreachable.
    let away = definition_review(json!({"package": "oci://127.0.0.1:9/web:1.0", "kind": "Web", "plural": "webs"}));
    match decide_text(&h, &away).await {
        Verdict::Allowed { warnings } => {
            assert!(
                warnings.len() == 1 && warnings[0].contains("could not be checked"),
                "{warnings:?}"
            );
        }
        Verdict::Denied(m) => panic!("denied: {m}"),
    }
}

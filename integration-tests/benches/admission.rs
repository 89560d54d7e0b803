//! Admission benchmark: what the validating webhook costs a write. The real `lyra-controller`
//! serves its webhook (its own CA, injected into a `ValidatingWebhookConfiguration`) and the
//! emulator calls it over verified HTTPS, as an API server does. Prints the latency of a
//! server-side dry-run create of a Workflow through kube-rs, with and without the webhook:
//! valid Workflows (allowed: the engine loads and validates them) and invalid ones (denied).
//!
//! ```sh
//! cargo build --release -p lyra-controller -p lyra-cli
//! cargo bench -p integration-tests --bench admission
//! ```
//!
//! `LYRA_BENCH_REQUESTS` changes the number of requests of each sort (default 500).

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::bench::{count, kube_client, percentile};
use integration_tests::cluster::{free_port, http_get};
use integration_tests::{controller_bin, lyra_bin, wait_until};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube_emulator::KubeEmulator;
use serde_json::{Value, json};

// The emulator serves from this process: the allocator of its binary and of the controller,
// so that glibc's malloc does not take the CPU the controller is measured on.
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

fn workflow(name: &str, input: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "lyra.dev/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"workflow": {"steps": {
            "a": {"returns": {"out": "output"}, "resource": "Null::Resource", "value": {"input": input}},
            "b": {"resource": "Null::Resource", "value": {"input": "$out"}},
        }}},
    }))
    .expect("a Workflow")
}

/// `n` dry-run creates of what `make(i)` gives; their latencies, sorted, and how many passed.
async fn measure(api: &Api<DynamicObject>, n: usize, make: impl Fn(usize) -> DynamicObject) -> (Vec<Duration>, usize) {
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut times = Vec::with_capacity(n);
    let mut passed = 0;
    for i in 0..n {
        let object = make(i);
        let start = Instant::now();
        let result = api.create(&params, &object).await;
        times.push(start.elapsed());
        passed += usize::from(result.is_ok());
    }
    times.sort();
    (times, passed)
}

fn row(what: &str, (times, passed): &(Vec<Duration>, usize)) {
    println!(
        "{what:<34} {:>6} {:>9.2?} {:>9.2?} {:>9.2?} {passed:>7}",
        times.len(),
        percentile(times, 0.5),
        percentile(times, 0.9),
        percentile(times, 0.99),
    );
}

#[tokio::main]
async fn main() {
    let requests = count("LYRA_BENCH_REQUESTS", 500);
    let dir = tempfile::tempdir().expect("tempdir");
    let emulator = KubeEmulator::start().await.expect("emulator");
    let client = kube_client(emulator.kubeconfig_path()).await;
    let raw = |kind: &str, plural: &str, group: &str, version: &str| {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        ApiResource::from_gvk_with_plural(&gvk, plural)
    };

    // The CRDs as `lyra crd` prints them, the controller's namespace, the webhook's Service
    // routed to the controller's port, and its configuration (as the chart renders it).
    let crds = Command::new(lyra_bin())
        .args(["crd", "-o", "json"])
        .output()
        .expect("lyra crd");
    let crds: Value = serde_json::from_slice(&crds.stdout).expect("lyra crd -o json");
    let crd_api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &raw(
            "CustomResourceDefinition",
            "customresourcedefinitions",
            "apiextensions.k8s.io",
            "v1",
        ),
    );
    for crd in crds["items"].as_array().expect("items") {
        let crd: DynamicObject = serde_json::from_value(crd.clone()).expect("a CRD");
        crd_api
            .create(&PostParams::default(), &crd)
            .await
            .expect("create a CRD");
    }
    let create = |api: Api<DynamicObject>, object: Value| async move {
        let object: DynamicObject = serde_json::from_value(object).expect("an object");
        api.create(&PostParams::default(), &object).await.expect("create");
    };
    create(
        Api::all_with(client.clone(), &raw("Namespace", "namespaces", "", "v1")),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lyra-system"}}),
    )
    .await;
    let webhook_port = free_port();
    create(
        Api::namespaced_with(client.clone(), "lyra-system", &raw("Endpoints", "endpoints", "", "v1")),
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "lyra-webhook"},
               "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": webhook_port}]}]}),
    )
    .await;
    let vwc = raw(
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "v1",
    );
    let vwc_api: Api<DynamicObject> = Api::all_with(client.clone(), &vwc);
    let hook = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "lyra"},
        "webhooks": [{
            "name": "workflows.validate.lyra.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {"service": {"name": "lyra-webhook", "namespace": "lyra-system", "path": "/validate/workflows", "port": 443}},
            "rules": [{"apiGroups": ["lyra.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["workflows"], "scope": "Namespaced"}],
        }],
    });
    create(vwc_api.clone(), hook).await;

    let health = format!("127.0.0.1:{}", free_port());
    let mut controller = Command::new(controller_bin())
        .args([
            "--state",
            &dir.path().join("state.db").display().to_string(),
            "--health-addr",
            &health,
            "--webhook-addr",
            &format!("127.0.0.1:{webhook_port}"),
            "--webhook-secret",
            "lyra-webhook-tls",
            "--webhook-service",
            "lyra-webhook",
            "--webhook-configuration",
            "lyra",
            "--definitions",
            "false",
        ])
        .current_dir(dir.path())
        .env("KUBECONFIG", emulator.kubeconfig_path())
        .env("POD_NAMESPACE", "lyra-system")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("lyra-controller");
    let ready = wait_until(Duration::from_secs(60), || http_get(&health, "/readyz").is_some());
    assert!(ready, "the controller's webhook never became ready");

    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &raw("Workflow", "workflows", "lyra.dev", "v1alpha1"),
    );
    // Warm up connections and caches on both sides.
    measure(&api, 20, |i| workflow(&format!("warm-{i}"), "x")).await;
    let valid = measure(&api, requests, |i| workflow(&format!("ok-{i}"), "x")).await;
    // `$nobody` is produced by no step: the engine's validator refuses it.
    let invalid = measure(&api, requests, |i| workflow(&format!("bad-{i}"), "$nobody")).await;
    vwc_api
        .delete("lyra", &Default::default())
        .await
        .expect("delete the webhook");
    let bare = measure(&api, requests, |i| workflow(&format!("bare-{i}"), "x")).await;
    assert_eq!(valid.1, requests, "valid Workflows were refused");
    assert_eq!(invalid.1, 0, "invalid Workflows were let in");

    println!(
        "{:<34} {:>6} {:>9} {:>9} {:>9} {:>7}",
        "dry-run create of a Workflow", "n", "p50", "p90", "p99", "passed"
    );
    row("no webhook", &bare);
    row("webhook: valid (allowed)", &valid);
    row("webhook: invalid (denied)", &invalid);
    let _ = controller.kill();
    let _ = controller.wait();
}

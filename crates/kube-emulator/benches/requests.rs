//! Kubernetes API emulator benchmark: creates per second and watch event latency with 1,000
//! objects, through kube-rs over real HTTP on loopback (client and server share the process).
//!
//! `cargo bench -p kube-emulator --bench requests`

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use kube_emulator::KubeEmulator;
use serde_json::json;

// The server's allocator, as in its binary (main.rs).
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

const OBJECTS: usize = 1000;
const IN_FLIGHT: usize = 16;

/// The Workflow CRD; `Ruled` (plural `ruleds`) is the same schema with CEL rules on the spec,
/// on each step and a transition rule, to measure what CEL costs a create.
fn crd(kind: &str, rules: bool) -> CustomResourceDefinition {
    let plural = format!("{}s", kind.to_lowercase());
    let mut spec = json!({"type": "object", "required": ["image"], "properties": {
        "image": {"type": "string", "pattern": "^[a-z]+$"},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
        "steps": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "run": {"type": "string"}}}}}});
    if rules {
        spec["x-kubernetes-validations"] = json!([
            {"rule": "self.replicas <= 5 || self.image != 'nginx'", "message": "too many nginx"},
            {"rule": "self.steps.all(s, s.name != s.run)", "message": "a step runs its own name"}]);
        spec["properties"]["image"]["x-kubernetes-validations"] =
            json!([{"rule": "self == oldSelf", "message": "image is immutable"}]);
        spec["properties"]["steps"]["items"]["x-kubernetes-validations"] = json!([{"rule": "size(self.name) > 0"}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.lyra.example.com")},
        "spec": {
            "group": "lyra.example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": spec,
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}
            }]
        }
    }))
    .expect("valid CRD")
}

fn workflow(ar: &ApiResource, name: &str) -> DynamicObject {
    let mut obj = DynamicObject::new(name, ar);
    obj.data = json!({"spec": {"image": "nginx", "replicas": 3, "steps": [
        {"name": "build", "run": "make"}, {"name": "test", "run": "make test"}]}});
    obj
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn fmt(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

async fn sequential_creates(api: &Api<DynamicObject>, ar: &ApiResource, prefix: &str) -> f64 {
    let start = Instant::now();
    for i in 0..OBJECTS {
        api.create(&PostParams::default(), &workflow(ar, &format!("{prefix}-{i}")))
            .await
            .expect("create");
    }
    OBJECTS as f64 / start.elapsed().as_secs_f64()
}

async fn concurrent_creates(api: &Api<DynamicObject>, ar: &ApiResource, prefix: &str) -> f64 {
    let start = Instant::now();
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let (api, obj) = (api.clone(), workflow(ar, &format!("{prefix}-{i}")));
            async move { api.create(&PostParams::default(), &obj).await.expect("create") }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| futures::future::ready(()))
        .await;
    OBJECTS as f64 / start.elapsed().as_secs_f64()
}

/// Creates objects one by one while a watch follows; latency = event received - create sent.
async fn watch_latency(api: &Api<DynamicObject>, ar: &ApiResource) -> Vec<Duration> {
    let from = api
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut stream = api
        .watch(&WatchParams::default().timeout(120), &from)
        .await
        .unwrap()
        .boxed();
    let watcher = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(OBJECTS);
            while latencies.len() < OBJECTS {
                let event = stream.try_next().await.expect("watch").expect("watch ended early");
                let received = Instant::now();
                if let WatchEvent::Added(obj) = event {
                    let at = sent
                        .lock()
                        .unwrap()
                        .get(&obj.name_any())
                        .copied()
                        .expect("sent before seen");
                    latencies.push(received - at);
                }
            }
            latencies
        })
    };
    for i in 0..OBJECTS {
        let name = format!("lat-{i}");
        sent.lock().unwrap().insert(name.clone(), Instant::now());
        api.create(&PostParams::default(), &workflow(ar, &name))
            .await
            .expect("create");
    }
    let mut latencies = watcher.await.unwrap();
    latencies.sort();
    latencies
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let emu = KubeEmulator::start().await.expect("the emulator starts");
        let kubeconfig = Kubeconfig::read_from(emu.kubeconfig_path()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
        let client = Client::try_from(config).unwrap();
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        crds.create(&PostParams::default(), &crd("Workflow", false)).await.unwrap();
        crds.create(&PostParams::default(), &crd("Ruled", true)).await.unwrap();
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("lyra.example.com", "v1", "Workflow"), "workflows");
        let ruled = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("lyra.example.com", "v1", "Ruled"), "ruleds");

        println!("kube-emulator benchmark: {OBJECTS} Workflow custom objects (schema-validated), kube-rs client over loopback HTTP");
        let seq = sequential_creates(&Api::namespaced_with(client.clone(), "default", &ar), &ar, "seq").await;
        println!("  sequential creates:          {seq:>8.0} creates/s");
        let cel = sequential_creates(&Api::namespaced_with(client.clone(), "default", &ruled), &ruled, "cel").await;
        println!("  sequential creates, 4 CEL rules: {cel:>4.0} creates/s");
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "conc"}})).unwrap();
        Api::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        let conc = concurrent_creates(&Api::namespaced_with(client.clone(), "conc", &ar), &ar, "conc").await;
        println!("  concurrent creates ({IN_FLIGHT} in flight): {conc:>8.0} creates/s");

        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "lat"}})).unwrap();
        Api::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        let lat = watch_latency(&Api::namespaced_with(client.clone(), "lat", &ar), &ar).await;
        println!(
            "  watch event latency (create sent -> ADDED received, {OBJECTS} events): p50 {}, p95 {}, p99 {}, max {}",
            fmt(percentile(&lat, 0.5)),
            fmt(percentile(&lat, 0.95)),
            fmt(percentile(&lat, 0.99)),
            fmt(*lat.last().unwrap())
        );

        let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let start = Instant::now();
        let n = all.list(&ListParams::default()).await.unwrap().items.len();
        println!("  list all {n} objects:          {}", fmt(start.elapsed()));
        emu.shutdown().await;
    });
}

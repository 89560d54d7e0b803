//! A kube-rs `Controller` with the `finalizer` helper, `patch_status` and an event `Recorder`
//! against the emulator, driven by kubectl: create -> Ready -> delete (cleanup) -> gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration_tests::kube_emulator::KubeEmulator;
use integration_tests::kube_emulator::kubectl::{Kubectl, Output, kubectl_or_skip};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as Note, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const FINALIZER: &str = "lyra.example.com/cleanup";

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "lyra.example.com",
    version = "v1",
    kind = "Workflow",
    namespaced,
    status = "WorkflowStatus",
    shortname = "wf",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase")
)]
pub struct WorkflowSpec {
    image: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
pub struct WorkflowStatus {
    phase: Option<String>,
    #[serde(default)]
    conditions: Vec<Condition>,
}

struct Ctx {
    client: Client,
    recorder: Recorder,
    cleanups: AtomicUsize,
}

#[derive(Debug)]
struct ReconcileError(String);

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReconcileError {}

async fn mark_ready(api: &Api<Workflow>, ctx: &Ctx, wf: &Workflow) -> Result<Action, kube::Error> {
    let condition = Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Reconciled".into(),
        message: format!("image {} is running", wf.spec.image),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: wf.metadata.generation,
    };
    let status = json!({ "status": { "phase": "Ready", "conditions": [condition] } });
    api.patch_status(&wf.name_any(), &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let note = Note {
        type_: EventType::Normal,
        reason: "Reconciled".into(),
        note: Some("workflow is ready".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.recorder.publish(&note, &wf.object_ref(&())).await?;
    Ok(Action::await_change())
}

async fn reconcile(wf: Arc<Workflow>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let api: Api<Workflow> = Api::namespaced(ctx.client.clone(), &wf.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, wf, |event| async {
        match event {
            Finalizer::Apply(wf) => mark_ready(&api, &ctx, &wf).await,
            Finalizer::Cleanup(_) => {
                ctx.cleanups.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| ReconcileError(e.to_string()))
}

fn error_policy(_wf: Arc<Workflow>, err: &ReconcileError, _ctx: Arc<Ctx>) -> Action {
    eprintln!("reconcile failed: {err}");
    Action::requeue(Duration::from_millis(200))
}

/// kubectl is blocking: run it off the runtime.
async fn kubectl(k: &Arc<Kubectl>, args: &[&str], stdin: Option<&str>) -> Output {
    let (k, args, stdin) = (
        k.clone(),
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        stdin.map(str::to_string),
    );
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        k.run_with_stdin(&args, stdin.as_deref())
    })
    .await
    .expect("kubectl thread")
}

async fn kubectl_ok(k: &Arc<Kubectl>, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(k, args, stdin).await;
    assert!(out.success, "kubectl {args:?} failed: {out:?}");
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_with_finalizer_takes_a_workflow_from_create_to_ready_to_deleted() {
    let Some(bin) = kubectl_or_skip("controller_with_finalizer_takes_a_workflow_from_create_to_ready_to_deleted")
    else {
        return;
    };
    let emu = KubeEmulator::start().await.expect("the emulator starts");
    let k = Arc::new(Kubectl::new(bin, emu.kubeconfig_path()));

    let crd = serde_json::to_string(&Workflow::crd()).unwrap();
    let out = kubectl_ok(&k, &["apply", "-f", "-"], Some(&crd)).await;
    assert_eq!(
        out.trim(),
        "customresourcedefinition.apiextensions.k8s.io/workflows.lyra.example.com created"
    );
    kubectl_ok(
        &k,
        &[
            "wait",
            "--for=condition=Established",
            "crd/workflows.lyra.example.com",
            "--timeout=10s",
        ],
        None,
    )
    .await;

    // The client reads the kubeconfig the emulator wrote.
    let kubeconfig = Kubeconfig::read_from(emu.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "lyra-test".into(),
                instance: None,
            },
        ),
        cleanups: AtomicUsize::new(0),
    });
    let controller = Controller::new(Api::<Workflow>::all(client.clone()), watcher::Config::default())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let controller = tokio::spawn(controller);

    let started = Instant::now();
    let manifest = "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: demo\nspec:\n  image: nginx\n";
    assert_eq!(
        kubectl_ok(&k, &["apply", "-f", "-"], Some(manifest)).await.trim(),
        "workflow.lyra.example.com/demo created"
    );
    let out = kubectl_ok(&k, &["wait", "--for=condition=Ready", "wf/demo", "--timeout=20s"], None).await;
    assert_eq!(out.trim(), "workflow.lyra.example.com/demo condition met");
    let to_ready = started.elapsed();

    let obj: Value = serde_json::from_str(&kubectl_ok(&k, &["get", "wf", "demo", "-o", "json"], None).await).unwrap();
    assert_eq!(obj["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(obj["status"]["phase"], "Ready");
    assert_eq!(obj["status"]["conditions"][0]["reason"], "Reconciled");
    assert_eq!(obj["status"]["conditions"][0]["observedGeneration"], 1);
    assert_eq!(
        obj["metadata"]["generation"], 1,
        "finalizers and status do not bump the generation"
    );
    let table = kubectl_ok(&k, &["get", "wf"], None).await;
    let cells: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(cells, vec![vec!["NAME", "PHASE"], vec!["demo", "Ready"]]);

    // The Recorder wrote an events.k8s.io/v1 Event about the object.
    let events: Value =
        serde_json::from_str(&kubectl_ok(&k, &["get", "events.events.k8s.io", "-o", "json"], None).await).unwrap();
    let event = &events["items"][0];
    assert_eq!(event["reason"], "Reconciled", "{events:#}");
    assert_eq!(event["regarding"]["name"], "demo");
    assert_eq!(event["reportingController"], "lyra-test");

    // kubectl delete waits until the controller's cleanup has removed the finalizer.
    let deleting = Instant::now();
    let out = kubectl_ok(&k, &["delete", "wf", "demo", "--timeout=20s"], None).await;
    assert_eq!(out.trim(), "workflow.lyra.example.com \"demo\" deleted");
    let to_deleted = deleting.elapsed();
    assert_eq!(ctx.cleanups.load(Ordering::SeqCst), 1, "the cleanup ran once");
    let out = kubectl(&k, &["get", "wf"], None).await;
    assert!(
        out.success && out.stderr.contains("No resources found in default namespace."),
        "{out:?}"
    );
    eprintln!("create -> Ready in {to_ready:?}, delete -> gone in {to_deleted:?}");
    assert!(to_ready < Duration::from_secs(10) && to_deleted < Duration::from_secs(10));

    controller.abort();
    emu.shutdown().await;
}

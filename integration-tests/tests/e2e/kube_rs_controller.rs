//! A kube-rs `Controller` with the `finalizer` helper, `patch_status` and an event `Recorder`
//! against the emulator, driven by kubectl: create -> Ready -> delete (cleanup) -> gone. And
//! the Recorder's `events.k8s.io` Events as kubectl sees them, through core `v1` Events.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use integration_tests::kubectl::{Kubectl, Output, kubectl_or_skip};
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as Note, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Client, CustomResource, CustomResourceExt, Resource, ResourceExt};
use kube_emulator::KubeEmulator;
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
    // kubectl describe lists core v1 Events by involvedObject; the Recorder's shows there.
    let described = kubectl_ok(&k, &["describe", "wf", "demo"], None).await;
    let events_section = described.split_once("Events:").map_or("", |(_, e)| e);
    assert!(
        events_section.lines().any(|l| l.trim_start().starts_with("Normal")
            && l.contains("Reconciled")
            && l.contains("lyra-test")
            && l.trim_end().ends_with("workflow is ready")),
        "{described}"
    );
    let listed = kubectl_ok(&k, &["get", "events"], None).await;
    assert!(
        listed
            .lines()
            .any(|l| l.contains("Reconciled") && l.contains("workflow/demo") && l.ends_with("workflow is ready")),
        "{listed}"
    );

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

async fn workflow_crd(k: &Arc<Kubectl>) {
    let crd = serde_json::to_string(&Workflow::crd()).unwrap();
    kubectl_ok(k, &["apply", "-f", "-"], Some(&crd)).await;
    kubectl_ok(
        k,
        &[
            "wait",
            "--for=condition=Established",
            "crd/workflows.lyra.example.com",
            "--timeout=10s",
        ],
        None,
    )
    .await;
}

/// The next watch event within 10 s, as (type, object).
async fn next_event<K: Clone + serde::de::DeserializeOwned + std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> (&'static str, K) {
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("a watch event within 10 s")
        .expect("the watch works")
        .expect("the watch is open");
    match ev {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        other => panic!("unexpected watch event {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_events_are_core_events_too() {
    let Some(bin) = kubectl_or_skip("recorder_events_are_core_events_too") else {
        return;
    };
    let emu = KubeEmulator::start().await.expect("the emulator starts");
    let k = Arc::new(Kubectl::new(bin, emu.kubeconfig_path()));
    workflow_crd(&k).await;
    let manifest = "apiVersion: lyra.example.com/v1\nkind: Workflow\nmetadata:\n  name: demo\nspec:\n  image: nginx\n";
    kubectl_ok(&k, &["apply", "-f", "-"], Some(manifest)).await;

    let kubeconfig = Kubeconfig::read_from(emu.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let wf = Api::<Workflow>::namespaced(client.clone(), "default")
        .get("demo")
        .await
        .unwrap();

    // Watch both views, by each view's own field names, from before the Recorder writes.
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let v1: Api<EventsV1Event> = Api::namespaced(client.clone(), "default");
    let rv = core
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut core_watch = core
        .watch(
            &WatchParams::default().fields("involvedObject.name=demo,reason=Retried"),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    let mut v1_watch = v1
        .watch(
            &WatchParams::default().fields("regarding.name=demo,regarding.kind=Workflow"),
            &rv,
        )
        .await
        .unwrap()
        .boxed();

    // A repeated event: the Recorder creates it, then PATCHes its series.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "lyra-probe".into(),
            instance: Some("probe-0".into()),
        },
    );
    let note = Note {
        type_: EventType::Warning,
        reason: "Retried".into(),
        note: Some("image pull failed".into()),
        action: "Pull".into(),
        secondary: None,
    };
    let reference = wf.object_ref(&());
    recorder.publish(&note, &reference).await.unwrap();
    recorder.publish(&note, &reference).await.unwrap();

    let (t, added) = next_event(&mut core_watch).await;
    assert_eq!(t, "ADDED");
    assert_eq!(added.message.as_deref(), Some("image pull failed"));
    assert_eq!(added.involved_object.uid, wf.metadata.uid);
    assert_eq!(added.reporting_component.as_deref(), Some("lyra-probe"));
    assert_eq!(added.reporting_instance.as_deref(), Some("probe-0"));
    assert_eq!(added.action.as_deref(), Some("Pull"));
    assert!(added.event_time.is_some() && added.series.is_none());
    let (t, modified) = next_event(&mut core_watch).await;
    assert_eq!(t, "MODIFIED");
    assert_eq!(modified.series.as_ref().and_then(|s| s.count), Some(2));
    let (t, added) = next_event(&mut v1_watch).await;
    assert_eq!((t, added.note.as_deref()), ("ADDED", Some("image pull failed")));
    let (t, modified) = next_event(&mut v1_watch).await;
    assert_eq!(t, "MODIFIED");
    assert_eq!(modified.series.as_ref().map(|s| s.count), Some(2));

    // kubectl sees the same object through core v1: describe (with the repeat count) and get,
    // with core field selectors.
    let described = kubectl_ok(&k, &["describe", "wf", "demo"], None).await;
    let events_section = described.split_once("Events:").map_or("", |(_, e)| e);
    let line = events_section
        .lines()
        .find(|l| l.contains("Retried"))
        .unwrap_or_else(|| panic!("no Retried event:\n{described}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..2], ["Warning", "Retried"], "{line}");
    assert!(line.contains("(x2 over ") && line.contains("lyra-probe"), "{line}");
    assert!(line.trim_end().ends_with("image pull failed"), "{line}");
    let selector = format!(
        "involvedObject.kind=Workflow,involvedObject.uid={},type=Warning",
        wf.metadata.uid.as_deref().unwrap()
    );
    let listed = kubectl_ok(&k, &["get", "events", "--field-selector", &selector], None).await;
    // The apiserver's Event columns: NAME only with -o wide.
    let header: Vec<&str> = listed.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{listed}"
    );
    let rows: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{listed}");
    assert!(
        rows[0].contains("workflow/demo") && rows[0].ends_with("image pull failed"),
        "{listed}"
    );
    let none = kubectl(&k, &["get", "events", "--field-selector", "type=Normal"], None).await;
    assert!(none.stderr.contains("No resources found"), "{none:?}");
    let named = kubectl_ok(
        &k,
        &[
            "get",
            "events.events.k8s.io",
            "--field-selector",
            "regarding.name=demo",
            "-o",
            "name",
        ],
        None,
    )
    .await;
    assert_eq!(named.lines().count(), 1, "{named}");

    // Deleting through one view deletes from both, and both watches see it.
    let name = named.trim().rsplit('/').next().unwrap().to_string();
    core.delete(&name, &Default::default()).await.unwrap();
    assert_eq!(next_event(&mut core_watch).await.0, "DELETED");
    assert_eq!(next_event(&mut v1_watch).await.0, "DELETED");
    assert!(v1.get_opt(&name).await.unwrap().is_none());
    emu.shutdown().await;
}

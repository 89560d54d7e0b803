//! `Kubernetes::Object` against the project's Kubernetes API emulator (crates/kube-emulator):
//! a real API server over HTTP, with server-side apply, field ownership, discovery, CRDs,
//! the status subresource and finalizers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube_emulator::KubeEmulator;
use serde_json::json;

use super::*;
use crate::test_support::{cx, cx_at, map};

/// A running emulator, a client of it for the test's own moves, and the provider's
/// configuration pointing at it.
struct Cluster {
    emu: KubeEmulator,
    client: Client,
    config: &'static Map,
}

async fn cluster() -> Cluster {
    let emu = KubeEmulator::start().await.expect("the emulator starts");
    let client = Client::try_from(kube::Config::new(emu.url().parse().expect("a URL"))).expect("a client");
    let config = Box::leak(Box::new(map(json!({
        "config_path": emu.kubeconfig_path().to_str().expect("a UTF-8 path"),
    }))));
    Cluster { emu, client, config }
}

impl Cluster {
    /// A context of a step of its own, configured for this cluster.
    fn cx(&self) -> OpContext<'static> {
        OpContext {
            config: self.config,
            ..cx(OBJECT)
        }
    }

    fn cx_at(&self, step: &'static str) -> OpContext<'static> {
        OpContext {
            config: self.config,
            ..cx_at(OBJECT, step)
        }
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), "default")
    }
}

fn provider() -> KubernetesProvider {
    KubernetesProvider::new(None)
}

fn config_map(name: &str, data: Value) -> Map {
    map(json!({
        "manifest": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "web"}},
            "data": data,
        }
    }))
}

fn with_manifest(mut state: Map, f: impl FnOnce(&mut Value)) -> Map {
    let manifest = state.get_mut(MANIFEST).expect("a manifest");
    f(manifest);
    state
}

#[tokio::test]
async fn a_config_map_is_applied_read_updated_drifts_and_is_deleted() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let desired = config_map("app-config", json!({"a": "1"}));

    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "v1/ConfigMap/default/app-config");
    assert_eq!(
        created.actual[MANIFEST], desired[MANIFEST],
        "what was applied is what is there"
    );
    let object = &created.actual[LIVE];
    assert!(object["metadata"]["uid"].is_string(), "{object}");
    assert!(object["metadata"].get("managedFields").is_none(), "{object}");
    assert_eq!(object["metadata"]["annotations"][DEPLOYMENT_ANNOTATION], "test");
    assert_eq!(object["metadata"]["annotations"][STEP_ANNOTATION], cx.step_id);
    let live = k.config_maps().get("app-config").await.unwrap();
    assert_eq!(live.data.unwrap()["a"], "1");
    let managers: Vec<_> = live
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, ["lyra"], "applied server-side as lyra");

    // No drift: read shows the manifest as applied, though the server added uid, annotations...
    let read = p
        .read(&cx, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read[MANIFEST], desired[MANIFEST]);
    assert_eq!(read[LIVE]["metadata"]["uid"], object["metadata"]["uid"]);

    // Update in place: a key changed, one added, and the same object (uid) afterwards.
    let changed = config_map("app-config", json!({"a": "2", "b": "3"}));
    assert!(p.replace_reasons(OBJECT, &changed, &read).is_empty());
    let updated = p.update(&cx, &created.external_id, &changed, &read).await.unwrap();
    assert_eq!(updated[MANIFEST], changed[MANIFEST]);
    assert_eq!(updated[LIVE]["metadata"]["uid"], object["metadata"]["uid"]);
    let live = k.config_maps().get("app-config").await.unwrap().data.unwrap();
    assert_eq!((live["a"].as_str(), live["b"].as_str()), ("2", "3"));

    // A key the manifest drops is removed (it was lyra's alone).
    let fewer = config_map("app-config", json!({"b": "3"}));
    let updated = p.update(&cx, &created.external_id, &fewer, &updated).await.unwrap();
    let live = k.config_maps().get("app-config").await.unwrap().data.unwrap();
    assert!(!live.contains_key("a"), "{live:?}");

    // Drift: a value changed and a label added out of band; only the value shows.
    k.config_maps()
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": "changed"}, "metadata": {"labels": {"server-added": "x"}}})),
        )
        .await
        .unwrap();
    let drifted = p
        .read(&cx, &created.external_id, Some(&updated))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(drifted[MANIFEST]["data"], json!({"b": "changed"}));
    assert_eq!(
        drifted[MANIFEST]["metadata"]["labels"],
        json!({"app": "web"}),
        "not the server's label"
    );
    assert_eq!(
        drifted[LIVE]["metadata"]["labels"]["server-added"], "x",
        "object has it all"
    );
    // Applying again puts it back.
    let healed = p.update(&cx, &created.external_id, &fewer, &drifted).await.unwrap();
    assert_eq!(healed[MANIFEST], fewer[MANIFEST]);

    // Delete, and it is gone; read says so; deleting again is fine.
    p.delete(&cx, &created.external_id, &healed).await.unwrap();
    assert!(k.config_maps().get_opt("app-config").await.unwrap().is_none());
    assert!(
        p.read(&cx, &created.external_id, Some(&healed))
            .await
            .unwrap()
            .is_none()
    );
    p.delete(&cx, &created.external_id, &healed).await.unwrap();
}

#[test]
fn identity_changes_are_replaces_and_others_are_not() {
    let p = provider();
    let actual = config_map("a", json!({"k": "v"}));
    let reasons = |desired: &Map| p.replace_reasons(OBJECT, desired, &actual);
    assert!(reasons(&config_map("a", json!({"k": "other"}))).is_empty());
    assert_eq!(reasons(&config_map("b", json!({"k": "v"}))), ["manifest.metadata.name"]);
    let kind = with_manifest(config_map("a", json!({})), |m| m["kind"] = json!("Secret"));
    assert_eq!(reasons(&kind), ["manifest.kind"]);
    let ns = with_manifest(config_map("a", json!({})), |m| {
        m["metadata"]["namespace"] = json!("team")
    });
    let live_in_default = with_manifest(actual.clone(), |_| {});
    let mut live_in_default = live_in_default;
    live_in_default.insert(LIVE.to_owned(), json!({"metadata": {"namespace": "default"}}));
    assert_eq!(
        p.replace_reasons(OBJECT, &ns, &live_in_default),
        ["manifest.metadata.namespace"]
    );
    let same_ns = with_manifest(config_map("a", json!({})), |m| {
        m["metadata"]["namespace"] = json!("default")
    });
    assert!(
        p.replace_reasons(OBJECT, &same_ns, &live_in_default).is_empty(),
        "default made explicit"
    );

    // Another version of the same group is the same object; another group is not.
    let deploy = |api_version: &str| {
        map(json!({"manifest": {"apiVersion": api_version, "kind": "Deployment", "metadata": {"name": "web"}}}))
    };
    assert!(
        p.replace_reasons(OBJECT, &deploy("apps/v1beta2"), &deploy("apps/v1"))
            .is_empty()
    );
    assert_eq!(
        p.replace_reasons(OBJECT, &deploy("extensions/v1beta1"), &deploy("apps/v1")),
        ["manifest.apiVersion"]
    );
}

#[tokio::test]
async fn a_replace_deletes_the_old_name_and_creates_the_new_one() {
    // What the engine does when replace_reasons says metadata.name: delete, then create.
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let old = p.create(&cx, &config_map("before", json!({"k": "v"}))).await.unwrap();
    let renamed = config_map("after", json!({"k": "v"}));
    assert_eq!(
        p.replace_reasons(OBJECT, &renamed, &old.actual),
        ["manifest.metadata.name"]
    );
    // An update cannot rename: it refuses rather than make a second object.
    let err = p
        .update(&cx, &old.external_id, &renamed, &old.actual)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { message, .. } if message.contains("needs a replace")),
        "{err}"
    );
    assert!(k.config_maps().get_opt("after").await.unwrap().is_none());
    p.delete(&cx, &old.external_id, &old.actual).await.unwrap();
    let new = p.create(&cx, &renamed).await.unwrap();
    assert_eq!(new.external_id, "v1/ConfigMap/default/after");
    assert!(k.config_maps().get_opt("before").await.unwrap().is_none());
    assert!(k.config_maps().get_opt("after").await.unwrap().is_some());
}

#[tokio::test]
async fn lookup_adopts_an_object_whose_create_was_lost() {
    let k = cluster().await;
    let p = provider();
    let desired = config_map("lost", json!({"k": "v"}));
    // The create happened, then the run died before recording it.
    let created = p.create(&k.cx_at("lost/1"), &desired).await.unwrap();

    let Lookup::Found(found) = p.lookup(&k.cx_at("lost/1"), &desired).await.unwrap() else {
        panic!("the object is found by its namespace and name");
    };
    assert_eq!(found.external_id, created.external_id);
    assert_eq!(found.actual[MANIFEST], desired[MANIFEST]);
    assert_eq!(
        found.actual[LIVE]["metadata"]["uid"],
        created.actual[LIVE]["metadata"]["uid"]
    );

    let other = config_map("never-made", json!({}));
    assert!(matches!(p.lookup(&k.cx(), &other).await.unwrap(), Lookup::Absent));
    // A kind the server does not serve has no objects either.
    let unserved =
        map(json!({"manifest": {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}}));
    assert!(matches!(p.lookup(&k.cx(), &unserved).await.unwrap(), Lookup::Absent));
}

fn deployment(name: &str, wait: Value) -> Map {
    map(json!({
        "manifest": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1.27"}]},
                },
            },
        },
        "wait": wait,
    }))
}

/// Waits until the Deployment `name` exists (the provider applied it).
async fn until_applied(deployments: &Api<Deployment>, name: &str) {
    for _ in 0..200 {
        if deployments.get_opt(name).await.unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{name} was never applied");
}

#[tokio::test]
async fn a_deployment_waits_for_its_rollout() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let deployments: Api<Deployment> = Api::namespaced(k.client.clone(), "default");
    let desired = deployment("web", json!({"for": "Rollout", "timeout": "30s"}));

    // No controller runs in the emulator: the test rolls it out, late.
    let rolled_out_at = async {
        until_applied(&deployments, "web").await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let status = json!({"status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": 2, "availableReplicas": 2}});
        let at = Instant::now();
        deployments
            .patch_status("web", &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
        at
    };
    let create = async {
        let created = p.create(&cx, &desired).await;
        (created, Instant::now())
    };
    let ((created, done_at), rolled_out_at) = tokio::join!(create, rolled_out_at);
    let created = created.unwrap();
    assert!(done_at >= rolled_out_at, "the create waited for the rollout");
    assert_eq!(created.external_id, "apps/v1/Deployment/default/web");
    assert_eq!(
        created.actual[LIVE]["status"]["availableReplicas"], 2,
        "the object as rolled out"
    );
    // Server defaults (strategy) and status are not drift.
    let read = p
        .read(&cx, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read[MANIFEST], desired[MANIFEST]);
    assert!(
        read[LIVE]["spec"]["strategy"].is_object(),
        "the server's default is in object"
    );
}

#[tokio::test]
async fn a_wait_that_is_never_satisfied_times_out_saying_what_it_saw() {
    let k = cluster().await;
    let p = provider();
    let start = Instant::now();
    let err = p
        .create(
            &k.cx(),
            &deployment("stuck", json!({"for": "Rollout", "timeout": "1s"})),
        )
        .await
        .unwrap_err();
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(10),
        "{elapsed:?}"
    );
    let ProviderError::Other(message) = &err else {
        panic!("retryable: {err:?}")
    };
    assert_eq!(
        message,
        "timed out after 1s waiting for apps/v1 Deployment default/stuck to finish its rollout; \
         last seen: observedGeneration 0 of generation 1"
    );

    // Half rolled out: the message says how far.
    let deployments: Api<Deployment> = Api::namespaced(k.client.clone(), "default");
    let status =
        json!({"status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}});
    deployments
        .patch_status("stuck", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let desired = deployment("stuck", json!({"for": "Ready", "timeout": "500ms"}));
    let err = p
        .update(&k.cx(), "apps/v1/Deployment/default/stuck", &desired, &Map::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .ends_with("to be Ready; last seen: 1 of 2 replicas available"),
        "{err}"
    );
}

#[tokio::test]
async fn cancelling_the_run_stops_a_wait_promptly() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let start = Instant::now();
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        cx.cancel.store(true, Ordering::SeqCst);
    };
    let desired = deployment("forever", json!({"for": "Ready", "timeout": "10m"}));
    let (result, ()) = tokio::join!(p.create(&cx, &desired), cancel);
    assert!(matches!(result, Err(ProviderError::Cancelled)), "{result:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
}

#[tokio::test]
async fn delete_waits_for_finalizers_unless_told_not_to() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let desired = with_manifest(config_map("held", json!({})), |m| {
        m["metadata"]["finalizers"] = json!(["example.com/hold"]);
    });
    let mut desired = desired;
    desired.insert(WAIT.to_owned(), json!({"timeout": "600ms"}));
    let created = p.create(&cx, &desired).await.unwrap();

    let err = p.delete(&cx, &created.external_id, &created.actual).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "timed out after 600ms waiting for v1 ConfigMap default/held to be deleted; its finalizers: [\"example.com/hold\"]"
    );
    let mut no_wait = created.actual.clone();
    no_wait.insert(WAIT_FOR_DELETION.to_owned(), json!(false));
    p.delete(&cx, &created.external_id, &no_wait).await.unwrap();
    let live = k.config_maps().get("held").await.unwrap();
    assert!(live.metadata.deletion_timestamp.is_some(), "still there, being deleted");

    // A cancelled run stops waiting for the finalizer at once.
    let mut patient = created.actual.clone();
    patient.insert(WAIT.to_owned(), json!({"timeout": "20s"}));
    let cancelled = k.cx();
    let start = Instant::now();
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancelled.cancel.store(true, Ordering::SeqCst);
    };
    let (result, ()) = tokio::join!(p.delete(&cancelled, &created.external_id, &patient), cancel);
    assert!(matches!(result, Err(ProviderError::Cancelled)), "{result:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());

    // The finalizer's controller finishes while the provider waits: the delete returns then.
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        k.config_maps()
            .patch(
                "held",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
    };
    let (deleted, ()) = tokio::join!(p.delete(&cx, &created.external_id, &patient), release);
    deleted.unwrap();
    assert!(k.config_maps().get_opt("held").await.unwrap().is_none());
}

fn crd() -> Map {
    map(json!({
        "manifest": {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "required": ["size"], "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "color": {"type": "string", "default": "blue"}}},
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
                }],
            },
        },
        "wait": {"condition": {"type": "Established"}, "timeout": "10s"},
    }))
}

fn widget(size: Value, wait: Value) -> Map {
    map(json!({
        "manifest": {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "default"},
            "spec": {"size": size},
        },
        "wait": wait,
    }))
}

#[tokio::test]
async fn a_custom_resource_of_a_crd_it_made() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();

    // Before its CRD: the kind is not served (retryable, the CRD may be on its way).
    let err = p.create(&cx, &widget(json!(3), Value::Null)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "the API server does not serve kind Widget of apiVersion example.com/v1 (is its CRD installed?)"
    );
    assert!(err.is_retryable());

    // The CRD, cluster-scoped, made by the provider too and waited for.
    let crd = p.create(&cx, &crd()).await.unwrap();
    assert_eq!(
        crd.external_id,
        "apiextensions.k8s.io/v1/CustomResourceDefinition//widgets.example.com"
    );
    let namespaced_crd = with_manifest(self::crd(), |m| m["metadata"]["namespace"] = json!("default"));
    let err = p.create(&cx, &namespaced_crd).await.unwrap_err();
    assert!(err.to_string().contains("is cluster-scoped"), "{err}");

    // The custom resource; the schema's default (color) is no drift.
    let desired = widget(json!(3), Value::Null);
    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "example.com/v1/Widget/default/w1");
    assert_eq!(created.actual[LIVE]["spec"]["color"], "blue");
    let read = p
        .read(&cx, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read[MANIFEST], desired[MANIFEST]);

    // The schema refuses a size of 0: not retryable, the server's message on manifest.
    let err = p
        .update(&cx, &created.external_id, &widget(json!(0), Value::Null), &read)
        .await
        .unwrap_err();
    let ProviderError::InvalidValue { attribute, message } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(attribute, MANIFEST);
    assert!(message.contains("spec.size"), "{message}");

    // Waiting on a status field its controller (the test) sets.
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.com", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(k.client.clone(), "default", &ar);
    let ready = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        widgets
            .patch_status(
                "w1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready"}})),
            )
            .await
            .unwrap();
    };
    let bigger = widget(json!(5), json!({"fields": {"status.phase": "Ready"}, "timeout": "20s"}));
    let (updated, ()) = tokio::join!(p.update(&cx, &created.external_id, &bigger, &read), ready);
    let updated = updated.unwrap();
    assert_eq!(updated[LIVE]["status"]["phase"], "Ready");
    assert_eq!(updated[LIVE]["spec"]["size"], 5);

    // Deleting the CRD takes its objects: the widget reads as gone, and deletes fine.
    p.delete(&cx, &crd.external_id, &crd.actual).await.unwrap();
    assert!(
        p.read(&cx, &created.external_id, Some(&updated))
            .await
            .unwrap()
            .is_none()
    );
    p.delete(&cx, &created.external_id, &updated).await.unwrap();
}

fn secret(name: &str) -> Map {
    map(json!({
        "manifest": {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "type": "Opaque",
            "data": {"token": base64::engine::general_purpose::STANDARD.encode("tok-s3cr3t-value")},
            "stringData": {"password": "hunter2-p4ssw0rd"},
        }
    }))
}

const SECRETS: [&str; 2] = ["tok-s3cr3t-value", "hunter2-p4ssw0rd"];

fn assert_no_secret(text: &str) {
    let b64 = base64::engine::general_purpose::STANDARD;
    for s in SECRETS {
        assert!(!text.contains(s), "{s} in {text}");
        assert!(!text.contains(&b64.encode(s)), "{s} (base64) in {text}");
    }
}

#[tokio::test]
async fn a_secret_keeps_its_values_out_of_object_and_errors() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let desired = secret("creds");
    let created = p.create(&cx, &desired).await.unwrap();
    assert_no_secret(&created.actual[LIVE].to_string());
    assert!(created.actual[LIVE].get("data").is_none());
    // stringData is read back from data: no drift.
    assert_eq!(created.actual[MANIFEST], desired[MANIFEST]);
    let read = p
        .read(&cx, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read[MANIFEST], desired[MANIFEST]);
    let secrets: Api<Secret> = Api::namespaced(k.client.clone(), "default");
    let live = secrets.get("creds").await.unwrap().data.unwrap();
    assert_eq!(live["password"].0, b"hunter2-p4ssw0rd");

    // Another manager takes the token; our apply conflicts: the message names fields, not values.
    secrets
        .patch(
            "creds",
            &PatchParams::apply("vault-sync").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "data": {"token": base64::engine::general_purpose::STANDARD.encode("someone-elses")}}),
            ),
        )
        .await
        .unwrap();
    let err = p.update(&cx, &created.external_id, &desired, &read).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("\"vault-sync\""), "{message}");
    assert_no_secret(&message);

    // The server's messages are redacted too, whatever they quote.
    let manifest = desired[MANIFEST].as_object().unwrap();
    let status = kube::core::Status::failure(
        &format!(
            "Secret \"creds\" is invalid: data[token]: Invalid value: \"{}\"",
            SECRETS[0]
        ),
        "Invalid",
    )
    .with_code(422);
    let err = api_error(
        kube::Error::Api(status.boxed()),
        "apply v1 Secret default/creds",
        &secret_values(manifest),
    );
    assert_no_secret(&err.to_string());
    assert!(
        err.to_string().contains("data[token]: Invalid value: \"(sensitive)\""),
        "{err}"
    );

    // Invalid manifests say what is wrong, quoting nothing of it.
    let nameless = with_manifest(secret("x"), |m| m["metadata"] = json!({}));
    let err = p.create(&cx, &nameless).await.unwrap_err();
    assert_eq!(err.to_string(), "invalid value for manifest: has no metadata.name");
}

#[tokio::test]
async fn owner_labels_and_annotations_are_applied_and_never_drift() {
    fn owner(deployment: &str) -> Vec<(String, String)> {
        vec![("lyra.dev/workflow".to_owned(), format!("wf-{deployment}"))]
    }
    let k = cluster().await;
    let p = KubernetesProvider::new(Some(owner));
    let cx = k.cx();
    let desired = config_map("owned", json!({}));
    let created = p.create(&cx, &desired).await.unwrap();
    let live = k.config_maps().get("owned").await.unwrap().metadata;
    let labels = live.labels.unwrap();
    assert_eq!(labels["lyra.dev/workflow"], "wf-test");
    assert_eq!(labels["app"], "web");
    let annotations = live.annotations.unwrap();
    assert_eq!(annotations[DEPLOYMENT_ANNOTATION], "test");
    assert_eq!(annotations[STEP_ANNOTATION], cx.step_id);
    assert_eq!(
        created.actual[MANIFEST], desired[MANIFEST],
        "the added labels are not drift"
    );

    // A manifest naming an owner label itself: the owner's value wins, and is no drift.
    let claims = with_manifest(config_map("owned", json!({})), |m| {
        m["metadata"]["labels"]["lyra.dev/workflow"] = json!("mine");
        m["metadata"]["annotations"] = json!({STEP_ANNOTATION: "mine"});
    });
    let updated = p
        .update(&cx, &created.external_id, &claims, &created.actual)
        .await
        .unwrap();
    let live = k.config_maps().get("owned").await.unwrap().metadata;
    assert_eq!(live.labels.unwrap()["lyra.dev/workflow"], "wf-test");
    assert_eq!(live.annotations.unwrap()[STEP_ANNOTATION], cx.step_id);
    let read = p
        .read(&cx, &created.external_id, Some(&updated))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read[MANIFEST], claims[MANIFEST]);
}

#[tokio::test]
async fn invalid_manifests_are_refused_before_the_server_is_asked() {
    let k = cluster().await;
    let p = provider();
    let cases = [
        (json!({"apiVersion": "v1", "metadata": {"name": "x"}}), "has no kind"),
        (
            json!({"kind": "ConfigMap", "metadata": {"name": "x"}}),
            "has no apiVersion",
        ),
        (json!({"apiVersion": "v1", "kind": "ConfigMap"}), "has no metadata.name"),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ""}}),
            "has an empty metadata.name",
        ),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 3}}),
            "metadata.name must be a string, got Integer",
        ),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a/b"}}),
            "hold no '/'",
        ),
    ];
    for (manifest, want) in cases {
        let err = p
            .create(&k.cx(), &map(json!({"manifest": manifest})))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ProviderError::InvalidValue { attribute, message } if attribute == MANIFEST && message.contains(want)),
            "{manifest}: {err}"
        );
    }
    let err = p.create(&k.cx(), &map(json!({}))).await.unwrap_err();
    assert_eq!(err.to_string(), "invalid value for manifest: is required");
    let rollout = with_manifest(config_map("c", json!({})), |_| {});
    let mut rollout = rollout;
    rollout.insert(WAIT.to_owned(), json!({"for": "Rollout"}));
    let err = p.create(&k.cx(), &rollout).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::InvalidValue { attribute, .. } if attribute == WAIT),
        "{err}"
    );
    rollout.insert(WAIT.to_owned(), json!({"until": "Ready"}));
    assert!(
        p.create(&k.cx(), &rollout)
            .await
            .unwrap_err()
            .to_string()
            .contains("unknown key until")
    );
    rollout.insert(WAIT.to_owned(), json!({"timeout": "soon"}));
    assert!(
        p.create(&k.cx(), &rollout)
            .await
            .unwrap_err()
            .to_string()
            .contains("'soon' is not a duration")
    );
    rollout.remove(WAIT);
    rollout.insert(DELETE_PROPAGATION.to_owned(), json!("Eventually"));
    assert!(p.create(&k.cx(), &rollout).await.is_err());
    assert!(
        k.config_maps().get_opt("c").await.unwrap().is_none(),
        "nothing was applied"
    );
}

#[tokio::test]
async fn a_conflict_with_another_field_manager_names_it_and_force_takes_over() {
    let k = cluster().await;
    let p = provider();
    let cx = k.cx();
    let created = p
        .create(&cx, &config_map("shared", json!({"replicas": "1"})))
        .await
        .unwrap();
    k.config_maps()
        .patch(
            "shared",
            &PatchParams::apply("helm").force(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"},
                "data": {"replicas": "5"}}),
            ),
        )
        .await
        .unwrap();
    let mine = config_map("shared", json!({"replicas": "2"}));
    let err = p
        .update(&cx, &created.external_id, &mine, &created.actual)
        .await
        .unwrap_err();
    let ProviderError::Other(message) = &err else {
        panic!("{err:?}")
    };
    assert!(
        message.starts_with("apply v1 ConfigMap default/shared: Apply failed with 1 conflict"),
        "{message}"
    );
    assert!(
        message.contains("These fields belong to field manager \"helm\""),
        "{message}"
    );
    assert!(message.contains("force_conflicts: true"), "{message}");

    let mut forced = mine.clone();
    forced.insert(FORCE_CONFLICTS.to_owned(), json!(true));
    let updated = p
        .update(&cx, &created.external_id, &forced, &created.actual)
        .await
        .unwrap();
    assert_eq!(updated[MANIFEST]["data"]["replicas"], "2");
    assert_eq!(
        k.config_maps().get("shared").await.unwrap().data.unwrap()["replicas"],
        "2"
    );
}

#[tokio::test]
async fn configuration_selects_the_cluster_and_bad_configuration_says_so() {
    let k = cluster().await;
    let p = provider();
    let desired = config_map("configured", json!({}));

    // Inline, with the namespace for manifests that name none; one client per configuration.
    let yaml = std::fs::read_to_string(k.emu.kubeconfig_path()).unwrap();
    let team = Box::leak(Box::new(map(json!({"kubeconfig": yaml, "namespace": "team"}))));
    let cx = OpContext { config: team, ..k.cx() };
    let namespace = map(json!({"manifest": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}}));
    let ns = p.create(&cx, &namespace).await.unwrap();
    assert_eq!(ns.external_id, "v1/Namespace//team", "cluster-scoped: no namespace");
    let created = p.create(&cx, &desired).await.unwrap();
    assert_eq!(created.external_id, "v1/ConfigMap/team/configured");
    p.read(&cx, &created.external_id, Some(&created.actual))
        .await
        .unwrap()
        .unwrap();
    p.create(&k.cx(), &desired).await.unwrap();
    assert_eq!(p.clients.len(), 2);
    // The default namespace moved: the update refuses to move the object.
    let moved = OpContext {
        config: k.config,
        ..cx.clone()
    };
    let err = p
        .update(&moved, &created.external_id, &desired, &created.actual)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("would become v1 ConfigMap default/configured"),
        "{err}"
    );

    let bad = |config: Value| {
        let config: &'static Map = Box::leak(Box::new(map(config)));
        OpContext { config, ..k.cx() }
    };
    let err = p
        .create(&bad(json!({"config_path": "/nonexistent/kubeconfig"})), &desired)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("/nonexistent/kubeconfig")),
        "{err}"
    );
    let leaky = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: SECRET-TOKEN-123, [oops\n";
    let err = p
        .create(&bad(json!({"kubeconfig": leaky})), &desired)
        .await
        .unwrap_err();
    assert!(matches!(&err, ProviderError::Config(_)), "{err}");
    assert!(!err.to_string().contains("SECRET-TOKEN-123"), "{err}");
    let err = p
        .create(&bad(json!({"kubeconfig": yaml, "config_context": "nope"})), &desired)
        .await
        .unwrap_err();
    assert!(matches!(&err, ProviderError::Config(m) if m.contains("nope")), "{err}");
    let err = p
        .create(&bad(json!({"kubeconfig": yaml, "config_path": "/x"})), &desired)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "provider configuration: Kubernetes takes config_path or kubeconfig, not both"
    );
    let err = p.create(&bad(json!({"namespace": 3})), &desired).await.unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)));
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    // A port nothing listens on: the emulator's, after it stopped.
    let k = cluster().await;
    let url = k.emu.url().to_owned();
    assert!(k.emu.shutdown().await);
    let config: &'static Map = Box::leak(Box::new(map(
        json!({"kubeconfig": kube_emulator::kubeconfig_yaml(&url)}),
    )));
    let cx = OpContext { config, ..cx(OBJECT) };
    let p = provider();
    let err = p.create(&cx, &config_map("c", json!({}))).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().starts_with("discover v1 ConfigMap: "), "{err}");
    let err = p.read(&cx, "v1/ConfigMap/default/c", None).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

#[tokio::test]
async fn a_read_without_a_prior_manifest_returns_the_object_as_a_manifest() {
    let k = cluster().await;
    let p = provider();
    let created = p.create(&k.cx(), &config_map("bare", json!({"k": "v"}))).await.unwrap();
    let read = p.read(&k.cx(), &created.external_id, None).await.unwrap().unwrap();
    let manifest = &read[MANIFEST];
    assert_eq!(manifest["data"], json!({"k": "v"}));
    assert_eq!(manifest["metadata"]["name"], "bare");
    assert!(
        manifest["metadata"].get("uid").is_none() && manifest["metadata"].get("resourceVersion").is_none(),
        "{manifest}"
    );
}

#[test]
fn external_ids_round_trip() {
    for id in [
        "v1/ConfigMap/default/app",
        "apps/v1/Deployment/team/web",
        "v1/Namespace//team",
        "apiextensions.k8s.io/v1/CustomResourceDefinition//widgets.example.com",
    ] {
        assert_eq!(ObjectRef::parse(id).unwrap().id(), id);
    }
    let r = ObjectRef::parse("apps/v1/Deployment/team/web").unwrap();
    assert_eq!(
        (
            r.api_version.as_str(),
            r.kind.as_str(),
            r.namespace.as_deref(),
            r.name.as_str()
        ),
        ("apps/v1", "Deployment", Some("team"), "web")
    );
    assert_eq!(ObjectRef::parse("v1/Namespace//team").unwrap().namespace, None);
    for bad in ["", "web", "ConfigMap/default/web", "v1/ConfigMap/default/"] {
        assert!(ObjectRef::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn readiness_follows_kstatus() {
    let ready = Wait::parse(Some(&json!({"for": "Ready"})), "", "Anything")
        .unwrap()
        .unwrap();
    assert!(
        ready.check(&json!({"kind": "ConfigMap", "data": {}})).is_ok(),
        "no status: ready"
    );
    let with = |status: Value| json!({"kind": "Thing", "apiVersion": "example.com/v1", "metadata": {"generation": 2}, "status": status});
    assert!(
        ready
            .check(&with(json!({"conditions": [{"type": "Ready", "status": "True"}]})))
            .is_ok()
    );
    assert_eq!(
        ready.check(&with(
            json!({"conditions": [{"type": "Ready", "status": "False", "reason": "Pulling", "message": "image"}]})
        )),
        Err("condition Ready=False (Pulling: image)".to_owned())
    );
    assert!(
        ready
            .check(&with(
                json!({"conditions": [{"type": "Reconciling", "status": "True"}]})
            ))
            .is_err()
    );
    assert!(
        ready
            .check(&with(json!({"conditions": [{"type": "Synced", "status": "True"}]})))
            .is_ok()
    );
    assert_eq!(
        ready.check(&with(json!({"observedGeneration": 1, "conditions": []}))),
        Err("observedGeneration 1 of generation 2".to_owned())
    );
    let stateful = json!({"kind": "StatefulSet", "apiVersion": "apps/v1", "metadata": {"generation": 1},
        "spec": {"replicas": 3}, "status": {"observedGeneration": 1, "updatedReplicas": 3, "readyReplicas": 2}});
    assert_eq!(ready.check(&stateful), Err("2 of 3 replicas ready".to_owned()));
    let daemons = json!({"kind": "DaemonSet", "apiVersion": "apps/v1", "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2}});
    assert!(ready.check(&daemons).is_ok());

    let condition = Wait::parse(Some(&json!({"condition": {"type": "Synced"}})), "", "Thing")
        .unwrap()
        .unwrap();
    assert_eq!(condition.check(&with(json!({}))), Err("no condition Synced".to_owned()));
    let stale = with(json!({"conditions": [{"type": "Synced", "status": "True", "observedGeneration": 1}]}));
    assert!(condition.check(&stale).is_err(), "true, but for an older generation");
    let fields = Wait::parse(Some(&json!({"fields": {"status.replicas": "3"}})), "", "Thing")
        .unwrap()
        .unwrap();
    assert!(fields.check(&with(json!({"replicas": 3}))).is_ok(), "\"3\" means 3");
    assert_eq!(
        fields.check(&with(json!({}))),
        Err("status.replicas is not set".to_owned())
    );
}

#[tokio::test]
async fn a_confined_deployment_stays_in_its_namespace() {
    fn tenant(deployment: &str) -> Option<String> {
        deployment
            .strip_prefix("k8s/")
            .and_then(|p| p.split('/').next())
            .map(str::to_owned)
    }
    let k = cluster().await;
    let p = KubernetesProvider::new(None).confined(Some(tenant));
    let team = map(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}));
    KubernetesProvider::new(None)
        .create(&k.cx(), &map(json!({"manifest": team})))
        .await
        .expect("the namespace");
    let cx = OpContext {
        deployment: "k8s/team-a/app",
        ..k.cx()
    };
    // No namespace given: the Workflow's.
    let created = p.create(&cx, &config_map("mine", json!({"a": "1"}))).await.unwrap();
    assert!(created.external_id.contains("/team-a/"), "{}", created.external_id);
    let elsewhere = with_manifest(config_map("theirs", json!({})), |m| {
        m["metadata"]["namespace"] = json!("kube-system");
    });
    let e = p.create(&cx, &elsewhere).await.unwrap_err().to_string();
    assert!(
        e.contains("manages objects in 'team-a' only, not namespace 'kube-system'"),
        "{e}"
    );
    let cluster_scoped =
        map(json!({"manifest": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "grab"}}}));
    let e = p.create(&cx, &cluster_scoped).await.unwrap_err().to_string();
    assert!(e.contains("not Namespace objects, which are cluster-scoped"), "{e}");
    let mut other = k.config.clone();
    other.insert("namespace".into(), json!("default"));
    let other: &'static Map = Box::leak(Box::new(other));
    let e = p
        .create(
            &OpContext {
                config: other,
                ..cx.clone()
            },
            &config_map("x", json!({})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("manages objects in 'team-a' only"), "{e}");
    assert!(
        k.config_maps().get_opt("theirs").await.unwrap().is_none()
            && k.config_maps().get_opt("x").await.unwrap().is_none(),
        "nothing was made outside"
    );
    // A deployment the program does not confine (the CLI's) goes anywhere.
    let free = p.create(&k.cx(), &elsewhere).await;
    assert!(free.is_ok(), "{free:?}");
}

//! Under load the emulator loses no watch event: 50 concurrent writers (create, patch, delete
//! ConfigMaps) for 10 s while 10 watchers follow from the same resourceVersion. Every watcher
//! must see exactly the writes' resourceVersions, strictly increasing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use kube_emulator::KubeEmulator;
use serde_json::json;

const WRITERS: usize = 50;
const WATCHERS: usize = 10;
const WRITE_FOR: Duration = Duration::from_secs(10);

async fn client_for(emu: &KubeEmulator) -> Client {
    let kubeconfig = Kubeconfig::read_from(emu.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn rv_of<K: ResourceExt>(obj: &K) -> u64 {
    obj.resource_version()
        .expect("every object has a resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}

/// Follows the namespace from `from` until it has seen `target` (re-watching if a watch ends).
async fn watch_until(
    cms: Api<ConfigMap>,
    from: String,
    mut target: tokio::sync::watch::Receiver<Option<u64>>,
) -> Vec<(u64, String, String)> {
    let mut seen = Vec::new();
    let mut rv = from;
    loop {
        let mut stream = cms
            .watch(&WatchParams::default().timeout(60), &rv)
            .await
            .expect("watch starts")
            .boxed();
        loop {
            let done = target
                .borrow()
                .is_some_and(|t| seen.last().is_some_and(|(last, _, _)| *last >= t));
            if done {
                return seen;
            }
            let next = tokio::select! {
                next = stream.try_next() => next.expect("watch stream"),
                _ = target.changed() => continue,
            };
            let Some(event) = next else { break };
            let (kind, obj) = match event {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                WatchEvent::Bookmark(b) => {
                    rv = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) => panic!("watch error: {e:?}"),
            };
            let r = rv_of(&obj);
            rv = r.to_string();
            seen.push((r, kind.to_string(), obj.name_any()));
        }
    }
}

async fn write_until(cms: Api<ConfigMap>, writer: usize, deadline: Instant) -> Vec<u64> {
    let mut rvs = Vec::new();
    let mut n = 0;
    while Instant::now() < deadline {
        let name = format!("w{writer}-{n}");
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).unwrap();
        rvs.push(rv_of(&cms.create(&PostParams::default(), &cm).await.expect("create")));
        let patch = json!({"data": {"v": "1"}});
        rvs.push(rv_of(
            &cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("patch"),
        ));
        let deleted = cms.delete(&name, &DeleteParams::default()).await.expect("delete");
        rvs.push(rv_of(&deleted.left().expect("the deleted object is returned")));
        n += 1;
    }
    rvs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_writers_and_ten_watchers_lose_no_event() {
    let emu = KubeEmulator::start().await.expect("the emulator starts");
    let client = client_for(&emu).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "load"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "load");
    let start = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    let (target_tx, target_rx) = tokio::sync::watch::channel(None);
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|_| tokio::spawn(watch_until(cms.clone(), start.clone(), target_rx.clone())))
        .collect();
    let deadline = Instant::now() + WRITE_FOR;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(write_until(cms.clone(), w, deadline)))
        .collect();
    let mut written = BTreeSet::new();
    for w in writers {
        written.extend(w.await.unwrap());
    }
    let last = *written.last().expect("some writes");
    target_tx.send(Some(last)).unwrap();
    eprintln!(
        "{} writes in {WRITE_FOR:?} by {WRITERS} writers ({:.0}/s)",
        written.len(),
        written.len() as f64 / WRITE_FOR.as_secs_f64()
    );
    assert!(
        written.len() >= WRITERS * 3,
        "every writer completed at least one round"
    );

    for (i, w) in watchers.into_iter().enumerate() {
        let seen = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("watcher caught up in time")
            .unwrap();
        let rvs: Vec<u64> = seen.iter().map(|(rv, _, _)| *rv).collect();
        assert!(
            rvs.windows(2).all(|p| p[0] < p[1]),
            "watcher {i}: resourceVersions not strictly increasing"
        );
        let seen_set: BTreeSet<u64> = rvs.iter().copied().collect();
        let missing: Vec<&u64> = written.difference(&seen_set).take(5).collect();
        let extra: Vec<&u64> = seen_set.difference(&written).take(5).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "watcher {i}: missing {missing:?}, unexpected {extra:?}"
        );
        // Each object's own history reads ADDED, MODIFIED, DELETED.
        let mut per_object: std::collections::HashMap<&str, Vec<&str>> = std::collections::HashMap::new();
        for (_, kind, name) in &seen {
            per_object.entry(name).or_default().push(kind);
        }
        assert!(
            per_object.values().all(|k| *k == ["ADDED", "MODIFIED", "DELETED"]),
            "watcher {i}: bad event order"
        );
    }
    emu.shutdown().await;
}

/// Leader election (kube-lease-manager style): server-side apply creates the Lease, and a
/// takeover carrying a resourceVersion succeeds for exactly one of two racing candidates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_takeover_is_guarded_by_the_resource_version() {
    use k8s_openapi::api::coordination::v1::Lease;
    let emu = KubeEmulator::start().await.expect("the emulator starts");
    let leases: Api<Lease> = Api::namespaced(client_for(&emu).await, "default");
    let name = "lyra-controller";
    let claim = |who: &str, rv: Option<&str>| {
        let mut metadata = json!({"name": name});
        if let Some(rv) = rv {
            metadata["resourceVersion"] = json!(rv);
        }
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": {"holderIdentity": who, "leaseDurationSeconds": 15}})
    };
    let created = leases
        .patch(name, &PatchParams::apply("a").force(), &Patch::Apply(&claim("a", None)))
        .await
        .unwrap();
    let rv = created.resource_version().unwrap();
    let (pb, pc) = (PatchParams::apply("b").force(), PatchParams::apply("c").force());
    let (cb, cc) = (Patch::Apply(claim("b", Some(&rv))), Patch::Apply(claim("c", Some(&rv))));
    let (b, c) = tokio::join!(leases.patch(name, &pb, &cb), leases.patch(name, &pc, &cc));
    let winner = match (b, c) {
        (Ok(_), Err(kube::Error::Api(e))) if e.code == 409 => "b",
        (Err(kube::Error::Api(e)), Ok(_)) if e.code == 409 => "c",
        other => panic!("exactly one takeover must win: {other:?}"),
    };
    let lease = leases.get(name).await.unwrap();
    assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(winner));
    // A stale full update conflicts as well.
    let mut stale = created;
    stale.spec.as_mut().unwrap().holder_identity = Some("d".into());
    let err = leases.replace(name, &PostParams::default(), &stale).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 409 && e.reason == "Conflict"),
        "{err:?}"
    );
    emu.shutdown().await;
}

/// A watch from a resourceVersion the event log no longer holds gets `410 Expired` (kube-rs's
/// watcher then relists), and `timeoutSeconds` ends a watch on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_resource_versions_expire_and_watches_time_out() {
    use kube_emulator::Config;
    let emu = KubeEmulator::start_with(Config {
        event_log_capacity: 5,
        ..Config::default()
    })
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client_for(&emu).await, "default");
    for i in 0..10 {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let err = match cms.watch(&WatchParams::default(), "1").await {
        Ok(stream) => match stream.boxed().try_next().await {
            Ok(Some(WatchEvent::Error(e))) => e.code,
            other => panic!("expected an expiry, got {other:?}"),
        },
        Err(kube::Error::Api(e)) => e.code,
        Err(e) => panic!("unexpected error {e:?}"),
    };
    assert_eq!(err, 410);

    let now = emu.resource_version().to_string();
    let started = Instant::now();
    let stream = cms.watch(&WatchParams::default().timeout(1), &now).await.unwrap();
    let events: Vec<_> = stream.try_collect().await.unwrap();
    assert!(events.is_empty(), "{events:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "the watch ended after {took:?}"
    );
    assert_eq!(emu.active_watches(), 0);
    emu.shutdown().await;
}

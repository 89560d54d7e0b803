//! The behavioural contract of a [`Store`], written once for every backend.
//!
//! Each check takes an **empty** store, exercises one behaviour through the trait only and
//! panics on a violation. `src/tests.rs` runs every check against both backends (one test per
//! check per backend), so the Postgres store is held to exactly what the SQLite one is. Built
//! for this crate's tests and with the `conformance` feature.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{DeploymentExport, Fence, Lease, LeaseGrant, LeaseRequest, ReadRecord, RunRecord, Store};
use futures::StreamExt as _;
use futures::future::join_all;
use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, ResourceRecord, RunEnd, RunReturns, RunStart,
    StoreErrorKind,
};
use lyra_core::value::{MAX_DEPTH, Map, Value};
use serde_json::json;

/// A small resource record whose content depends on `step_id`.
pub fn resource(step_id: &str) -> ResourceRecord {
    ResourceRecord {
        step_id: step_id.to_owned(),
        type_name: "Test::Thing".to_owned(),
        external_id: format!("ext-{step_id}"),
        desired: map(json!({ "name": step_id, "size": 3 })),
        actual: map(json!({ "name": step_id, "size": 3, "id": format!("ext-{step_id}") })),
        depends_on: Vec::new(),
        managed: true,
        pending: false,
        sensitive: vec![],
        create_key: None,
    }
}

/// The start of an apply of workflow `wf` by `tester`.
pub fn apply(deployment: &str, wf: &str) -> RunStart {
    RunStart {
        deployment: deployment.to_owned(),
        workflow: Some(wf.to_owned()),
        operation: Operation::Apply,
        actor: "tester@host".to_owned(),
    }
}

fn map(value: Value) -> Map {
    match value {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("millis fit i64")
}

async fn load(store: &dyn Store, deployment: &str) -> DeploymentState {
    store
        .load(deployment)
        .await
        .expect("load")
        .unwrap_or_else(|| panic!("deployment {deployment} missing"))
}

/// Loading a deployment that was never applied gives `None`, and its history is empty.
pub async fn load_unknown_is_none(store: &dyn Store) {
    assert_eq!(store.load("nobody").await.expect("load"), None);
    assert!(store.history("nobody").await.expect("history").is_empty());
    assert!(store.list().await.expect("list").is_empty());
}

/// `begin_run` creates the deployment, recording the workflow, and a running history entry.
pub async fn begin_run_creates_deployment(store: &dyn Store) {
    let before = now_ms();
    let id = store.begin_run(&apply("web", "site")).await.expect("begin_run");
    let after = now_ms();

    let state = load(store, "web").await;
    assert_eq!(state.name, "web");
    assert_eq!(state.workflow.as_deref(), Some("site"));
    assert!(state.resources.is_empty());

    let history = store.history("web").await.expect("history");
    assert_eq!(history.len(), 1);
    let run = &history[0];
    assert_eq!(run.id, id);
    assert_eq!(run.deployment, "web");
    assert_eq!(run.workflow.as_deref(), Some("site"));
    assert_eq!(run.operation, Operation::Apply);
    assert_eq!(run.actor, "tester@host");
    assert!(
        (before..=after).contains(&run.started_at),
        "started_at {}",
        run.started_at
    );
    assert_eq!(run.finished_at, None);
    assert_eq!(run.outcome, None);
    assert_eq!(run.counts, ChangeCounts::default());
    assert!(run.changes.is_empty());
    assert_eq!(run.error, None);
}

/// The deployment's workflow is the one last *applied*: a delete run does not change it.
pub async fn workflow_follows_applies(store: &dyn Store) {
    store.begin_run(&apply("d", "one")).await.expect("begin_run");
    store.begin_run(&apply("d", "two")).await.expect("begin_run");
    assert_eq!(load(store, "d").await.workflow.as_deref(), Some("two"));
    let delete = RunStart {
        deployment: "d".to_owned(),
        workflow: None,
        operation: Operation::Delete,
        actor: "tester@host".to_owned(),
    };
    store.begin_run(&delete).await.expect("begin_run");
    assert_eq!(load(store, "d").await.workflow.as_deref(), Some("two"));
    assert_eq!(
        store.history("d").await.expect("history")[0].operation,
        Operation::Delete
    );
}

/// A record with awkward content: nested maps and arrays, unicode everywhere, extreme
/// numbers, a 1 MiB string and key order that is not alphabetical.
pub fn awkward_resource() -> ResourceRecord {
    let big = "λ".repeat(512 * 1024); // 1 MiB of UTF-8
    let mut deep = json!({ "leaf": true });
    for i in 0..60 {
        deep = json!({ format!("level{i}"): deep, "list": [i, null, "x"] });
    }
    ResourceRecord {
        step_id: "servers/0/磁盘 🚀".to_owned(),
        type_name: "Ns::Ünïcode".to_owned(),
        external_id: "arn:aws:x:y/ζ\"quoted\"\\slash\n".to_owned(),
        desired: map(json!({
            "zeta": 1,
            "alpha": { "nested": { "deeper": [1, 2, { "k": "v" }] }, "empty": {} },
            "emoji 😀": "e\u{301}tude \u{1F600} \t tab",
            "numbers": [0, -1, u64::MAX, i64::MIN, 0.5, -3.75e10, 1e300],
            "null": null,
            "bools": [true, false],
            "big": big,
            "deep": deep,
        })),
        actual: map(json!({ "id": "i-123", "tags": { "Name": "ça va", "": "empty key" } })),
        depends_on: vec!["network".to_owned(), "servers/0/ディスク".to_owned()],
        managed: false,
        pending: false,
        sensitive: vec!["zeta".to_owned(), "emoji 😀".to_owned()],
        create_key: None,
    }
}

/// Every field of a record comes back exactly, including key order.
pub async fn resource_round_trip(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let record = awkward_resource();
    store.put_resource("d", &record).await.expect("put_resource");

    let state = load(store, "d").await;
    assert_eq!(state.resources.len(), 1);
    let back = &state.resources[0];
    assert_eq!(back, &record);
    let keys = |m: &Map| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&back.desired), keys(&record.desired), "key order");
    assert_eq!(state.resource(&record.step_id), Some(&record));
}

/// A second put of the same step replaces every field; others are untouched.
pub async fn replace_resource(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    store.put_resource("d", &resource("a")).await.expect("put");
    store.put_resource("d", &resource("b")).await.expect("put");
    let replacement = ResourceRecord {
        step_id: "a".to_owned(),
        type_name: "Other::Type".to_owned(),
        external_id: "new-id".to_owned(),
        desired: map(json!({ "only": "this" })),
        actual: Map::new(),
        depends_on: vec!["b".to_owned()],
        managed: false,
        pending: false,
        sensitive: vec![],
        create_key: None,
    };
    store.put_resource("d", &replacement).await.expect("put");
    let state = load(store, "d").await;
    assert_eq!(state.resources, vec![replacement, resource("b")]);
}

/// Removing forgets one resource; removing an absent one is not an error.
pub async fn remove_resource(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    for id in ["a", "b", "c"] {
        store.put_resource("d", &resource(id)).await.expect("put");
    }
    store.remove_resource("d", "b").await.expect("remove");
    store.remove_resource("d", "b").await.expect("remove again");
    store.remove_resource("d", "never").await.expect("remove absent");
    let state = load(store, "d").await;
    assert_eq!(state.resources, vec![resource("a"), resource("c")]);
    // Removing in an unknown deployment does not create it.
    store
        .remove_resource("ghost", "a")
        .await
        .expect("remove in unknown deployment");
    assert_eq!(store.load("ghost").await.expect("load"), None);
}

/// `load` lists resources by step id, whatever the write order.
pub async fn resources_sorted_by_step_id(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let ids = ["m", "a/1", "z", "a/10", "a/2", "a", "B", "é"];
    for id in ids {
        store.put_resource("d", &resource(id)).await.expect("put");
    }
    let got: Vec<String> = load(store, "d")
        .await
        .resources
        .into_iter()
        .map(|r| r.step_id)
        .collect();
    let mut want: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(got, want);
}

/// Two deployments of one workflow with the same step ids never see each other's records.
pub async fn deployments_are_isolated(store: &dyn Store) {
    store.begin_run(&apply("blue", "wf")).await.expect("begin_run");
    store.begin_run(&apply("green", "wf")).await.expect("begin_run");
    let mut blue = resource("server");
    blue.external_id = "blue-id".to_owned();
    let mut green = resource("server");
    green.external_id = "green-id".to_owned();
    store.put_resource("blue", &blue).await.expect("put");
    store.put_resource("green", &green).await.expect("put");
    store.put_resource("green", &resource("only-green")).await.expect("put");

    assert_eq!(load(store, "blue").await.resources, vec![blue.clone()]);
    store.remove_resource("green", "server").await.expect("remove");
    assert_eq!(load(store, "blue").await.resources, vec![blue]);
    assert_eq!(load(store, "green").await.resources, vec![resource("only-green")]);
    assert_eq!(store.history("blue").await.expect("history").len(), 1);
}

/// `list` gives every deployment by name, with its resource count and last run.
pub async fn list_sorted_with_counts_and_last_run(store: &dyn Store) {
    for name in ["zeta", "alpha", "k8s/default/web"] {
        store
            .begin_run(&apply(name, &format!("wf-{name}")))
            .await
            .expect("begin_run");
    }
    let last = store.begin_run(&apply("alpha", "wf-alpha-2")).await.expect("begin_run");
    for id in ["x", "y"] {
        store.put_resource("alpha", &resource(id)).await.expect("put");
    }
    store.put_resource("zeta", &resource("x")).await.expect("put");
    store
        .finish_run(
            last,
            &RunEnd {
                outcome: Outcome::Succeeded,
                counts: ChangeCounts {
                    created: 2,
                    ..Default::default()
                },
                changes: vec![],
                error: None,
                note: None,
                returns: None,
            },
        )
        .await
        .expect("finish_run");

    let list = store.list().await.expect("list");
    let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["alpha", "k8s/default/web", "zeta"]);
    let counts: Vec<usize> = list.iter().map(|d| d.resources).collect();
    assert_eq!(counts, [2, 0, 1]);
    assert_eq!(list[0].workflow.as_deref(), Some("wf-alpha-2"));
    for summary in &list {
        let history = store.history(&summary.name).await.expect("history");
        assert_eq!(summary.last_run.as_ref(), history.first(), "{}", summary.name);
    }
    let alpha_last = list[0].last_run.as_ref().expect("alpha has runs");
    assert_eq!(alpha_last.id, last);
    assert_eq!(alpha_last.outcome, Some(Outcome::Succeeded));
}

/// History is per deployment, newest first, and run ids grow.
pub async fn history_newest_first(store: &dyn Store) {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            store
                .begin_run(&apply("d", &format!("wf{i}")))
                .await
                .expect("begin_run"),
        );
        store.begin_run(&apply("other", "wf")).await.expect("begin_run");
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    let history = store.history("d").await.expect("history");
    let got: Vec<_> = history.iter().map(|r| r.id).collect();
    ids.reverse();
    assert_eq!(got, ids);
    assert_eq!(history[0].workflow.as_deref(), Some("wf4"));
    assert!(history.iter().all(|r| r.deployment == "d"));
    assert!(history.windows(2).all(|w| w[0].started_at >= w[1].started_at));
}

/// `finish_run` records the outcome, counts, changes and error.
pub async fn finish_run_records_end(store: &dyn Store) {
    let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let end = RunEnd {
        outcome: Outcome::Failed,
        counts: ChangeCounts {
            created: 1,
            updated: 2,
            replaced: 3,
            deleted: 4,
            unchanged: 5,
            failed: 6,
            skipped: 7,
        },
        changes: vec![
            ChangeRecord {
                step_id: "a".to_owned(),
                action: "create".to_owned(),
                error: None,
            },
            ChangeRecord {
                step_id: "b/0".to_owned(),
                action: "update".to_owned(),
                error: Some("quota exceeded: ✗".to_owned()),
            },
        ],
        error: Some("1 step failed".to_owned()),
        note: None,
        returns: Some(RunReturns {
            values: map(json!({ "url": "https://x.example/✓", "ports": [80, {"tls": true}], "token": "s3cret" })),
            sensitive: vec!["token".to_owned()],
        }),
    };
    store.finish_run(id, &end).await.expect("finish_run");
    let after = now_ms();

    let run = store.history("d").await.expect("history").remove(0);
    assert_eq!(run.id, id);
    assert_eq!(run.outcome, Some(Outcome::Failed));
    assert_eq!(run.counts, end.counts);
    assert_eq!(run.changes, end.changes);
    assert_eq!(run.returns, end.returns);
    assert_eq!(run.error, end.error);
    let finished = run.finished_at.expect("finished_at set");
    assert!(run.started_at <= finished && finished <= after);

    for outcome in [Outcome::Succeeded, Outcome::Cancelled] {
        let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
        let end = RunEnd {
            outcome,
            counts: ChangeCounts::default(),
            changes: vec![],
            error: None,
            note: None,
            returns: None,
        };
        store.finish_run(id, &end).await.expect("finish_run");
        assert_eq!(store.history("d").await.expect("history")[0].outcome, Some(outcome));
    }
}

/// A run that never finishes (its process died) stays in the history with no outcome.
pub async fn unfinished_run_has_no_outcome(store: &dyn Store) {
    let crashed = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let later = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let end = RunEnd {
        outcome: Outcome::Succeeded,
        counts: ChangeCounts::default(),
        changes: vec![],
        error: None,
        note: None,
        returns: None,
    };
    store.finish_run(later, &end).await.expect("finish_run");
    let history = store.history("d").await.expect("history");
    assert_eq!(history[1].id, crashed);
    assert_eq!(history[1].outcome, None);
    assert_eq!(history[1].finished_at, None);
    assert_eq!(history[0].outcome, Some(Outcome::Succeeded));
}

/// Finishing a run twice is a conflict; finishing an unknown run is an error. Neither
/// changes what was recorded, nor disturbs other writes.
pub async fn finish_run_misuse_is_rejected(store: &dyn Store) {
    let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    store
        .finish_run(id, &end(Outcome::Succeeded))
        .await
        .expect("finish_run");

    let failed = end(Outcome::Failed);
    let record = resource("a");
    let (twice, unknown, put) = futures::join!(
        store.finish_run(id, &failed),
        store.finish_run(id + 1000, &failed),
        store.put_resource("d", &record),
    );
    assert_eq!(twice.expect_err("second finish").kind, StoreErrorKind::Conflict);
    let unknown = unknown.expect_err("unknown run");
    assert_ne!(unknown.kind, StoreErrorKind::Conflict);
    put.expect("a put batched with failing finishes still lands");
    assert_eq!(
        store.history("d").await.expect("history")[0].outcome,
        Some(Outcome::Succeeded)
    );
    assert_eq!(load(store, "d").await.resources, vec![resource("a")]);
}

/// Forgetting resources never forgets runs.
pub async fn history_survives_resource_removal(store: &dyn Store) {
    let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    store.put_resource("d", &resource("a")).await.expect("put");
    store.remove_resource("d", "a").await.expect("remove");
    let state = load(store, "d").await;
    assert!(state.resources.is_empty());
    let history = store.history("d").await.expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].id, id);
}

/// `n` concurrent puts (as from many in-flight steps) all land, with their content.
pub async fn concurrent_puts_all_land(store: &dyn Store, n: usize) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let records: Vec<ResourceRecord> = (0..n).map(|i| resource(&format!("r{i:05}"))).collect();
    let results = join_all(records.iter().map(|r| store.put_resource("d", r))).await;
    for result in results {
        result.expect("put_resource");
    }
    assert_eq!(load(store, "d").await.resources, records);
}

/// Concurrent fenced puts of records unlike each other (pending intents with their keys,
/// results, secrets named, dependencies, other types, awkward text) all read back exactly:
/// a backend that writes concurrent puts together must keep every column of each.
pub async fn concurrent_varied_puts_round_trip(store: &dyn Store) {
    let fence = Fence::from(&acquired(store, &lease_request("d", "alice@laptop", "token-v", 60_000)).await);
    store
        .begin_run_fenced(&fence, &apply("d", "wf"))
        .await
        .expect("begin_run");
    let records: Vec<ResourceRecord> = (0..120)
        .map(|i| {
            let id = format!("s{i:03}/x \u{e9}\"'");
            match i % 3 {
                0 => ResourceRecord::intent(
                    &id,
                    "Test::Pending",
                    map(json!({ "n": i, "text": "a\u{0}b" })),
                    vec![format!("s{:03}", i + 1)],
                    format!("store/7/d/{id} \u{2713}"),
                ),
                1 => {
                    let mut r = resource(&id);
                    r.sensitive = vec!["password".to_owned()];
                    r.managed = false;
                    r.depends_on = vec!["a".to_owned(), "b".to_owned()];
                    r
                }
                _ => {
                    let mut r = resource(&id);
                    r.type_name = format!("Other::Type{i}");
                    r.external_id = String::new();
                    r
                }
            }
        })
        .collect();
    let results = join_all(records.iter().map(|r| store.put_resource_fenced(&fence, r))).await;
    for result in results {
        result.expect("put under the lease");
    }
    let mut expected = records;
    expected.sort_by(|a, b| a.step_id.cmp(&b.step_id));
    assert_eq!(load(store, "d").await.resources, expected);
}

/// Concurrent writes of every kind to several deployments end as if run one by one.
pub async fn concurrent_mixed_writes(store: &dyn Store) {
    let deployments = ["a", "b", "c", "d"];
    for d in deployments {
        store.begin_run(&apply(d, "wf")).await.expect("begin_run");
        for i in 0..50 {
            store
                .put_resource(d, &resource(&format!("old{i:02}")))
                .await
                .expect("put");
        }
    }
    let work = deployments.iter().map(|d| async move {
        let run = store.begin_run(&apply(d, "wf2")).await.expect("begin_run");
        let puts = (0..50).map(|i| async move {
            store
                .put_resource(d, &resource(&format!("new{i:02}")))
                .await
                .expect("put");
        });
        let removes = (0..50).map(|i| async move {
            store.remove_resource(d, &format!("old{i:02}")).await.expect("remove");
        });
        futures::join!(join_all(puts), join_all(removes));
        let end = RunEnd {
            outcome: Outcome::Succeeded,
            counts: ChangeCounts {
                created: 50,
                deleted: 50,
                ..Default::default()
            },
            changes: vec![],
            error: None,
            note: None,
            returns: None,
        };
        store.finish_run(run, &end).await.expect("finish_run");
    });
    join_all(work).await;
    for d in deployments {
        let state = load(store, d).await;
        let want: Vec<_> = (0..50).map(|i| resource(&format!("new{i:02}"))).collect();
        assert_eq!(state.resources, want, "{d}");
        assert_eq!(state.workflow.as_deref(), Some("wf2"));
        let history = store.history(d).await.expect("history");
        assert_eq!(history.len(), 2);
        assert_eq!(history[0].counts.created, 50);
    }
}

/// Writes a known state for [`check_seeded`], to run across a reopen or reconnect.
pub async fn seed(store: &dyn Store) {
    let id = store.begin_run(&apply("kept", "wf")).await.expect("begin_run");
    store.put_resource("kept", &awkward_resource()).await.expect("put");
    store.put_resource("kept", &resource("plain")).await.expect("put");
    let end = RunEnd {
        outcome: Outcome::Succeeded,
        counts: ChangeCounts {
            created: 2,
            ..Default::default()
        },
        changes: vec![ChangeRecord {
            step_id: "plain".to_owned(),
            action: "create".to_owned(),
            error: None,
        }],
        error: None,
        note: None,
        returns: None,
    };
    store.finish_run(id, &end).await.expect("finish_run");
    store.begin_run(&apply("kept", "wf")).await.expect("begin_run");
}

/// Checks what [`seed`] wrote.
pub async fn check_seeded(store: &dyn Store) {
    let state = load(store, "kept").await;
    assert_eq!(state.workflow.as_deref(), Some("wf"));
    let mut want = vec![awkward_resource(), resource("plain")];
    want.sort_by(|a, b| a.step_id.cmp(&b.step_id));
    assert_eq!(state.resources, want);
    let history = store.history("kept").await.expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].outcome, None);
    assert_eq!(history[1].outcome, Some(Outcome::Succeeded));
    assert_eq!(history[1].counts.created, 2);
    assert_eq!(history[1].changes.len(), 1);
    let list = store.list().await.expect("list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].resources, 2);
    assert_eq!(list[0].last_run.as_ref(), history.first());
}

// --- Pending records, notes and operations ---------------------------------------------------

/// The intent written before a `create` (pending, no external id) comes back as written, and
/// the recorded result replaces it.
pub async fn pending_round_trip(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let intent = ResourceRecord::intent(
        "servers/0",
        "Test::Thing",
        map(json!({ "name": "s0", "size": 2 })),
        vec!["network".to_owned()],
        "store/7/d/servers/0 ✓".to_owned(),
    );
    store.put_resource("d", &intent).await.expect("put intent");
    let back = load(store, "d").await.resources;
    assert_eq!(back, vec![intent.clone()]);
    assert!(back[0].pending);
    assert_eq!(back[0].create_key.as_deref(), Some("store/7/d/servers/0 ✓"));

    let mut done = resource("servers/0");
    done.depends_on = intent.depends_on.clone();
    store.put_resource("d", &done).await.expect("put result");
    let back = load(store, "d").await.resources;
    assert_eq!(back, vec![done]);
    assert!(!back[0].pending);
    assert_eq!(back[0].create_key, None, "the result replaces the key too");
}

/// A run's note is kept; every operation round-trips; only applies change the workflow.
pub async fn notes_and_operations_round_trip(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    for operation in Operation::ALL {
        let run = RunStart {
            deployment: "d".to_owned(),
            workflow: Some(format!("wf-{}", operation.as_str())),
            operation,
            actor: "admin@host".to_owned(),
        };
        let id = store.begin_run(&run).await.expect("begin_run");
        let note = format!("{} by admin: broke alice@laptop's lease ✓", operation.as_str());
        let end = RunEnd {
            outcome: Outcome::Succeeded,
            counts: ChangeCounts::default(),
            changes: vec![],
            error: None,
            note: Some(note.clone()),
            returns: None,
        };
        store.finish_run(id, &end).await.expect("finish_run");
        let last = store.history("d").await.expect("history").remove(0);
        assert_eq!(last.id, id);
        assert_eq!(last.operation, operation);
        assert_eq!(last.note.as_deref(), Some(note.as_str()));
        // The first turn applies "wf-apply"; the other operations leave it.
        assert_eq!(load(store, "d").await.workflow.as_deref(), Some("wf-apply"));
    }
    // A run without a note has none.
    let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    assert_eq!(store.history("d").await.expect("history")[0].id, id);
    assert_eq!(store.history("d").await.expect("history")[0].note, None);
}

/// A URL in a note or an error keeps no credential, whether a run's end or an import wrote
/// it (an older Lyra wrote `state migrate`'s source URL into the note, query and all).
pub async fn history_keeps_no_credentials(store: &dyn Store) {
    let url = "postgres://lyra:hunter2@db:5432/state?password=hunter2&schema=s";
    let redacted = "postgres://lyra:***@db:5432/state?password=***&schema=s";
    let id = store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let end = RunEnd {
        outcome: Outcome::Failed,
        counts: ChangeCounts::default(),
        changes: vec![ChangeRecord {
            step_id: "a".to_owned(),
            action: "create".to_owned(),
            error: Some(format!("cannot reach {url}")),
        }],
        error: Some(format!("state {url}: down")),
        note: Some(format!("migrated from {url}")),
        returns: None,
    };
    store.finish_run(id, &end).await.expect("finish_run");
    let run = store.history("d").await.expect("history").remove(0);
    assert!(!format!("{run:?}").contains("hunter2"), "{run:?}");
    assert_eq!(run.note, Some(format!("migrated from {redacted}")));
    assert_eq!(run.error, Some(format!("state {redacted}: down")));
    assert_eq!(run.changes[0].error, Some(format!("cannot reach {redacted}")));

    let mut export = store.export("d").await.expect("export").expect("d");
    export.state.name = "e".to_owned();
    for run in &mut export.history {
        run.deployment = "e".to_owned();
        run.note = Some(format!("migrated from {url}"));
    }
    store.import(&export).await.expect("import");
    let imported = store.export("e").await.expect("export").expect("e");
    assert!(!format!("{imported:?}").contains("hunter2"), "{imported:?}");
    assert_eq!(imported.history[0].note, Some(format!("migrated from {redacted}")));
}

// --- Leases -----------------------------------------------------------------------------------

/// A lease request for `deployment` by `owner` with `token`.
pub fn lease_request(deployment: &str, owner: &str, token: &str, ttl_ms: i64) -> LeaseRequest {
    LeaseRequest {
        deployment: deployment.to_owned(),
        owner: owner.to_owned(),
        operation: "apply".to_owned(),
        token: token.to_owned(),
        ttl_ms,
    }
}

/// The lease `request` asks for, which must be free.
pub async fn acquired(store: &dyn Store, request: &LeaseRequest) -> Lease {
    match store.acquire_lease(request).await.expect("acquire_lease") {
        LeaseGrant::Acquired(lease) => lease,
        LeaseGrant::Held(holder) => panic!("{} expected the lease, {} holds it", request.owner, holder.owner),
    }
}

async fn held(store: &dyn Store, request: &LeaseRequest) -> Lease {
    match store.acquire_lease(request).await.expect("acquire_lease") {
        LeaseGrant::Held(holder) => holder,
        LeaseGrant::Acquired(lease) => panic!("{} took a lease that is held: {lease:?}", request.owner),
    }
}

/// The store's clock may be another machine's (Postgres): allow this much skew against ours.
const CLOCK_SLACK_MS: i64 = 2_000;

/// Acquire, refuse with the holder's details, renew (same token keeps `since`, moves
/// `expires`), refuse a renewal or release with the wrong token, release, re-acquire by
/// another; `lease` and `list` show the holder without its token.
pub async fn lease_lifecycle(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let alice = lease_request("d", "alice@laptop", "token-alice", 60_000);
    let bob = lease_request("d", "controller/default/web", "token-bob", 60_000);

    let before = now_ms();
    let first = acquired(store, &alice).await;
    let after = now_ms();
    assert_eq!(first.deployment, "d");
    assert_eq!(first.owner, "alice@laptop");
    assert_eq!(first.operation, "apply");
    assert_eq!(first.token, "token-alice");
    assert!(
        (before - CLOCK_SLACK_MS..=after + CLOCK_SLACK_MS).contains(&first.since),
        "since {} not near now {before}",
        first.since
    );
    assert_eq!(first.expires - first.since, 60_000);

    // Refused, naming the holder, what it does and since when; never its token.
    let holder = held(store, &bob).await;
    assert_eq!(
        (
            holder.deployment.as_str(),
            holder.owner.as_str(),
            holder.operation.as_str()
        ),
        ("d", "alice@laptop", "apply")
    );
    assert_eq!((holder.since, holder.expires), (first.since, first.expires));
    assert!(holder.token.is_empty(), "a refusal must not reveal the token");

    // Acquiring again with the same token renews, keeping `since`.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let again = acquired(store, &alice).await;
    assert_eq!(again.since, first.since);
    assert!(again.expires > first.expires, "{} > {}", again.expires, first.expires);

    let renewed = store
        .renew_lease(&first, 120_000)
        .await
        .expect("renew_lease")
        .expect("still ours");
    assert_eq!(renewed.since, first.since);
    assert_eq!(renewed.token, first.token);
    assert!(renewed.expires >= again.expires + 59_000, "{renewed:?}");

    let impostor = Lease {
        token: "guessed".to_owned(),
        ..first.clone()
    };
    assert_eq!(store.renew_lease(&impostor, 1_000).await.expect("renew_lease"), None);
    assert!(
        !store.release_lease(&impostor).await.expect("release_lease"),
        "a wrong token releases nothing"
    );

    let shown = store.lease("d").await.expect("lease").expect("held");
    assert_eq!(
        shown,
        Lease {
            token: String::new(),
            ..renewed.clone()
        }
    );
    let list = store.list().await.expect("list");
    assert_eq!(list[0].lease.as_ref(), Some(&shown));

    assert!(store.release_lease(&first).await.expect("release_lease"), "it was ours");
    assert_eq!(store.lease("d").await.expect("lease"), None);
    assert_eq!(store.list().await.expect("list")[0].lease, None);
    let taken = acquired(store, &bob).await;
    assert_eq!(taken.owner, "controller/default/web");
    assert!(taken.since >= first.since);

    // Alice's lease is gone: renewing it fails, releasing it again is harmless.
    assert_eq!(store.renew_lease(&first, 60_000).await.expect("renew_lease"), None);
    assert!(
        !store.release_lease(&first).await.expect("release of a lost lease"),
        "a lost lease is not ours"
    );
    assert_eq!(
        store.lease("d").await.expect("lease").map(|l| l.owner),
        Some("controller/default/web".to_owned())
    );
}

/// An unrenewed lease expires: it is hidden, and another holder may take it; the old holder
/// then cannot renew it.
pub async fn lease_expires(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    let short = acquired(store, &lease_request("d", "crashed@host", "token-short", 150)).await;
    assert!(store.lease("d").await.expect("lease").is_some());
    assert!(store.list().await.expect("list")[0].lease.is_some());
    held(store, &lease_request("d", "other@host", "token-other", 60_000)).await;

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        store.lease("d").await.expect("lease"),
        None,
        "expired leases are hidden"
    );
    assert_eq!(store.list().await.expect("list")[0].lease, None);

    let taken = acquired(store, &lease_request("d", "other@host", "token-other", 60_000)).await;
    assert!(taken.since > short.since, "a new holder starts a new `since`");
    assert_eq!(store.renew_lease(&short, 60_000).await.expect("renew_lease"), None);
    assert!(!store.release_lease(&short).await.expect("release_lease"));
    assert_eq!(
        store.lease("d").await.expect("lease").map(|l| l.owner),
        Some("other@host".to_owned())
    );
}

/// Breaking removes whatever lease there is (even an expired one) and returns it.
pub async fn break_lease_returns_holder(store: &dyn Store) {
    assert_eq!(store.break_lease("d").await.expect("break_lease"), None);
    let alice = acquired(store, &lease_request("d", "alice@laptop", "token-alice", 60_000)).await;
    let broken = store.break_lease("d").await.expect("break_lease").expect("was held");
    assert_eq!(broken, alice);
    assert_eq!(store.lease("d").await.expect("lease"), None);
    assert_eq!(store.renew_lease(&alice, 60_000).await.expect("renew_lease"), None);
    acquired(store, &lease_request("d", "bob@host", "token-bob", 60_000)).await;

    let stale = acquired(store, &lease_request("e", "gone@host", "token-gone", 50)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.break_lease("e").await.expect("break_lease"), Some(stale));
    assert_eq!(store.break_lease("e").await.expect("break_lease"), None);
}

/// Breaking a lease only while a given process holds it (the end of its token, what others
/// see of it): the lease of another holder, or a token that merely contains it, stays.
pub async fn break_lease_held_by_its_process_only(store: &dyn Store) {
    let alice = acquired(
        store,
        &lease_request("d", "alice@laptop", "secret-alice~b00.1.42.7", 60_000),
    )
    .await;
    let LeaseGrant::Held(seen) = store
        .acquire_lease(&lease_request("d", "bob@host", "secret-bob~b00.1.43.9", 60_000))
        .await
        .expect("acquire_lease")
    else {
        panic!("alice holds it")
    };
    assert_eq!(seen.token, "~b00.1.42.7", "others see the process, not the secret");
    assert_eq!(
        store.lease("d").await.expect("lease").expect("held").token,
        "~b00.1.42.7"
    );
    for not_alice in ["", "~b00.1.43.9", "~b00.1.42", "42.7", "x~b00.1.42.7x"] {
        assert_eq!(
            store.break_lease_held_by("d", not_alice).await.expect("break"),
            None,
            "{not_alice:?}"
        );
    }
    assert_eq!(
        store.break_lease_held_by("e", "~b00.1.42.7").await.expect("break"),
        None,
        "another deployment"
    );
    let broken = store
        .break_lease_held_by("d", &seen.token)
        .await
        .expect("break")
        .expect("alice's");
    assert_eq!(broken, alice);
    assert_eq!(store.lease("d").await.expect("lease"), None);
    // A token naming no process shows nothing of itself, and is broken by no process.
    acquired(store, &lease_request("d", "carol@host", "secret-carol", 60_000)).await;
    assert_eq!(store.lease("d").await.expect("lease").expect("held").token, "");
    assert_eq!(store.break_lease_held_by("d", "").await.expect("break"), None);
    assert!(store.lease("d").await.expect("lease").is_some());
}

/// The end of a run with no changes.
pub fn end(outcome: Outcome) -> RunEnd {
    RunEnd {
        outcome,
        counts: ChangeCounts::default(),
        changes: vec![],
        error: None,
        note: None,
        returns: None,
    }
}

/// Fencing: a run's writes under a lease land while the lease is current. Once it expired and
/// was taken over (the holder was paused past its time to live), or was broken, every write
/// under it is refused with `LeaseLost` and changes nothing, while the new holder's writes land.
pub async fn stale_lease_writes_are_refused(store: &dyn Store) {
    let old = acquired(store, &lease_request("d", "paused@host", "token-old", 100)).await;
    let old = Fence::from(&old);
    let run = store
        .begin_run_fenced(&old, &apply("d", "wf"))
        .await
        .expect("begin under the lease");
    store
        .put_resource_fenced(&old, &resource("a"))
        .await
        .expect("put under the lease");

    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = Fence::from(&acquired(store, &lease_request("d", "next@host", "token-new", 60_000)).await);
    let next_run = store
        .begin_run_fenced(&new, &apply("d", "wf2"))
        .await
        .expect("new holder begins");
    let mut mine = resource("a");
    mine.external_id = "ext-new".to_owned();
    store.put_resource_fenced(&new, &mine).await.expect("new holder puts");

    let refused = |what: &str, e: Option<lyra_core::state::StoreError>| {
        let e = e.unwrap_or_else(|| panic!("{what} under a lost lease was accepted"));
        assert_eq!(e.kind, StoreErrorKind::LeaseLost, "{what}: {e}");
    };
    refused("begin_run", store.begin_run_fenced(&old, &apply("d", "wf")).await.err());
    let mut stale = resource("a");
    stale.external_id = "ext-stale".to_owned();
    refused("put_resource", store.put_resource_fenced(&old, &stale).await.err());
    refused(
        "put of a new step",
        store.put_resource_fenced(&old, &resource("b")).await.err(),
    );
    refused("remove_resource", store.remove_resource_fenced(&old, "a").await.err());
    refused(
        "finish_run",
        store.finish_run_fenced(&old, run, &end(Outcome::Succeeded)).await.err(),
    );

    let state = load(store, "d").await;
    assert_eq!(state.workflow.as_deref(), Some("wf2"));
    assert_eq!(state.resources, vec![mine], "only the new holder's record");
    let history = store.history("d").await.expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[1].id, run);
    assert_eq!(history[1].outcome, None, "the stale run's end was not recorded");
    assert_eq!(history[0].id, next_run);
    store
        .finish_run_fenced(&new, next_run, &end(Outcome::Succeeded))
        .await
        .expect("new holder finishes");

    // A broken lease fences its holder the same way.
    let broken = Fence::from(&acquired(store, &lease_request("e", "alice@laptop", "token-e", 60_000)).await);
    store.put_resource_fenced(&broken, &resource("x")).await.expect("put");
    store.break_lease("e").await.expect("break_lease");
    refused(
        "put after a break",
        store.put_resource_fenced(&broken, &resource("y")).await.err(),
    );
    assert_eq!(load(store, "e").await.resources, vec![resource("x")]);
}

/// A finish that releases its lease ([`crate::FencedWrites::finish_run_and_release`]): a
/// refused or failed finish releases nothing; one that lands records the end and, where
/// the store says it released, frees the lease, after which writes under it are refused;
/// where it says not, the lease is still held.
pub async fn finish_and_release(store: &dyn Store) {
    let lease = acquired(store, &lease_request("d", "alice@laptop", "token-a", 60_000)).await;
    let fence = Fence::from(&lease);
    let run = store.begin_run_fenced(&fence, &apply("d", "wf")).await.expect("begin");
    store.put_resource_fenced(&fence, &resource("a")).await.expect("put");
    let ended = end(Outcome::Succeeded);
    let unknown = store
        .finish_run_and_release(&fence, run + 1000, &ended)
        .await
        .expect_err("an unknown run");
    assert_ne!(unknown.kind, StoreErrorKind::LeaseLost, "{unknown}");
    let stale = Fence {
        token: "token-stale".to_owned(),
        ..fence.clone()
    };
    let refused = store
        .finish_run_and_release(&stale, run, &ended)
        .await
        .expect_err("a fence that is not the lease's");
    assert_eq!(refused.kind, StoreErrorKind::LeaseLost, "{refused}");
    assert_eq!(
        store.lease("d").await.expect("lease").map(|l| l.owner),
        Some("alice@laptop".to_owned()),
        "a refused finish released the lease"
    );
    assert_eq!(store.history("d").await.expect("history")[0].outcome, None);

    let released = store.finish_run_and_release(&fence, run, &ended).await.expect("finish");
    assert_eq!(
        store.history("d").await.expect("history")[0].outcome,
        Some(Outcome::Succeeded)
    );
    let holder = store.lease("d").await.expect("lease").map(|l| l.owner);
    if released {
        assert_eq!(holder, None, "said released, still held");
        let e = store
            .put_resource_fenced(&fence, &resource("b"))
            .await
            .expect_err("a write after the release");
        assert_eq!(e.kind, StoreErrorKind::LeaseLost, "{e}");
        assert!(!store.release_lease(&lease).await.expect("release"), "released twice");
    } else {
        assert_eq!(holder, Some("alice@laptop".to_owned()), "said held, released");
        assert!(store.release_lease(&lease).await.expect("release"));
    }
    assert_eq!(load(store, "d").await.resources, vec![resource("a")]);
}

/// Fenced writes made at once (one batch on SQLite): under a lost lease each is refused alone,
/// writing nothing, while those under the current lease in the same moment all land, and a
/// refused put into a deployment that does not exist yet does not make it.
pub async fn stale_and_current_writes_at_once(store: &dyn Store) {
    let old = Fence::from(&acquired(store, &lease_request("d", "paused@host", "token-old", 100)).await);
    let run = store.begin_run_fenced(&old, &apply("d", "wf")).await.expect("begin");
    for i in 0..10 {
        store
            .put_resource_fenced(&old, &resource(&format!("keep{i}")))
            .await
            .expect("put under the lease");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new = Fence::from(&acquired(store, &lease_request("d", "next@host", "token-new", 60_000)).await);
    let gone = Fence::from(&acquired(store, &lease_request("nowhere", "x@host", "token-x", 60_000)).await);
    store.break_lease("nowhere").await.expect("break");

    let stale: Vec<ResourceRecord> = (0..20).map(|i| resource(&format!("stale{i:02}"))).collect();
    let fresh: Vec<ResourceRecord> = (0..20).map(|i| resource(&format!("fresh{i:02}"))).collect();
    let stale_puts = join_all(stale.iter().map(|r| store.put_resource_fenced(&old, r)));
    let fresh_puts = join_all(fresh.iter().map(|r| store.put_resource_fenced(&new, r)));
    let kept: Vec<String> = (0..10).map(|i| format!("keep{i}")).collect();
    let stale_removes = join_all(kept.iter().map(|id| store.remove_resource_fenced(&old, id)));
    let (ended, y) = (end(Outcome::Succeeded), resource("y"));
    let (stale_puts, fresh_puts, stale_removes, finish, elsewhere) = futures::join!(
        stale_puts,
        fresh_puts,
        stale_removes,
        store.finish_run_fenced(&old, run, &ended),
        store.put_resource_fenced(&gone, &y),
    );
    let refused = |what: &str, r: Result<(), lyra_core::state::StoreError>| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what} under a lost lease was accepted"));
        assert_eq!(e.kind, StoreErrorKind::LeaseLost, "{what}: {e}");
    };
    for r in stale_puts {
        refused("put", r);
    }
    for r in stale_removes {
        refused("remove", r);
    }
    refused("finish_run", finish);
    refused("put into a new deployment", elsewhere);
    for r in fresh_puts {
        r.expect("put under the current lease");
    }

    let mut expected: Vec<ResourceRecord> = fresh;
    expected.extend((0..10).map(|i| resource(&format!("keep{i}"))));
    expected.sort_by(|a, b| a.step_id.cmp(&b.step_id));
    assert_eq!(load(store, "d").await.resources, expected);
    assert_eq!(store.history("d").await.expect("history")[0].outcome, None);
    assert!(
        store.load("nowhere").await.expect("load").is_none(),
        "a refused put made a deployment"
    );
}

/// A lease on one deployment never blocks another.
pub async fn leases_are_per_deployment(store: &dyn Store) {
    acquired(store, &lease_request("blue", "alice@laptop", "token-a", 60_000)).await;
    acquired(store, &lease_request("green", "bob@host", "token-b", 60_000)).await;
    held(store, &lease_request("blue", "bob@host", "token-b", 60_000)).await;
    store.break_lease("blue").await.expect("break_lease");
    assert_eq!(
        store.lease("green").await.expect("lease").map(|l| l.owner),
        Some("bob@host".to_owned())
    );
}

/// `n` concurrent acquires with different tokens: exactly one wins, and every other one is
/// told who did.
pub async fn concurrent_acquires_one_winner(store: &dyn Store, n: usize) {
    let requests: Vec<_> = (0..n)
        .map(|i| lease_request("d", &format!("owner{i}"), &format!("token{i}"), 60_000))
        .collect();
    let grants = join_all(requests.iter().map(|r| store.acquire_lease(r))).await;
    let mut winners = Vec::new();
    let mut holders = Vec::new();
    for grant in grants {
        match grant.expect("acquire_lease") {
            LeaseGrant::Acquired(lease) => winners.push(lease),
            LeaseGrant::Held(holder) => holders.push(holder),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert!(holders.iter().all(|h| h.owner == winners[0].owner), "{holders:?}");
}

// --- Export, import, drop ---------------------------------------------------------------------

/// Writes a deployment with every kind of content for the export tests.
async fn seed_for_export(store: &dyn Store, deployment: &str) {
    let id = store.begin_run(&apply(deployment, "wf")).await.expect("begin_run");
    store.put_resource(deployment, &awkward_resource()).await.expect("put");
    store.put_resource(deployment, &resource("plain")).await.expect("put");
    let intent = ResourceRecord::intent(
        "pending",
        "Test::Thing",
        Map::new(),
        vec!["plain".to_owned()],
        format!("{}/1/{deployment}/pending", store.store_id()),
    );
    store.put_resource(deployment, &intent).await.expect("put");
    let end = RunEnd {
        outcome: Outcome::Failed,
        counts: ChangeCounts {
            created: 2,
            failed: 1,
            ..Default::default()
        },
        changes: vec![ChangeRecord {
            step_id: "pending".to_owned(),
            action: "create".to_owned(),
            error: Some("boom".to_owned()),
        }],
        error: Some("1 step failed".to_owned()),
        note: Some("first".to_owned()),
        returns: Some(RunReturns {
            values: map(json!({ "address": "10.0.0.1" })),
            sensitive: vec![],
        }),
    };
    store.finish_run(id, &end).await.expect("finish_run");
    let unlock = RunStart {
        deployment: deployment.to_owned(),
        workflow: None,
        operation: Operation::Unlock,
        actor: "admin@host".to_owned(),
    };
    store.begin_run(&unlock).await.expect("begin_run");
}

/// History without the run ids and deployment names, which an import changes.
fn portable(history: &[RunRecord]) -> Vec<RunRecord> {
    history
        .iter()
        .map(|r| RunRecord {
            id: 0,
            deployment: String::new(),
            ..r.clone()
        })
        .collect()
}

/// Export gives the state and the history (oldest first); importing it elsewhere gives the
/// same state and history, with new run ids in the same order.
pub async fn export_import_round_trip(store: &dyn Store) {
    assert_eq!(store.export("nobody").await.expect("export"), None);
    seed_for_export(store, "src").await;
    let export = store.export("src").await.expect("export").expect("exists");
    assert_eq!(export.state, load(store, "src").await);
    let mut newest_first = store.history("src").await.expect("history");
    newest_first.reverse();
    assert_eq!(export.history, newest_first, "history is oldest first");
    assert_eq!(export.history.len(), 2);
    assert!(export.history[0].returns.is_some(), "an apply's returns are exported");

    let mut moved = export.clone();
    moved.state.name = "dst".to_owned();
    store.import(&moved).await.expect("import");
    let back = store.export("dst").await.expect("export").expect("imported");
    assert_eq!(back.state, moved.state);
    assert_eq!(portable(&back.history), portable(&export.history));
    assert!(back.history.iter().all(|r| r.deployment == "dst"));
    assert!(back.history.windows(2).all(|w| w[0].id < w[1].id), "new ids, in order");
    // The source is untouched.
    assert_eq!(store.export("src").await.expect("export"), Some(export));
}

/// Import replaces the recorded resources and appends to the history.
pub async fn import_replaces_resources(store: &dyn Store) {
    store.begin_run(&apply("d", "old-wf")).await.expect("begin_run");
    for id in ["gone", "kept"] {
        store.put_resource("d", &resource(id)).await.expect("put");
    }
    let mut kept = resource("kept");
    kept.external_id = "imported-id".to_owned();
    let import = DeploymentExport {
        state: DeploymentState {
            name: "d".to_owned(),
            workflow: Some("new-wf".to_owned()),
            resources: vec![kept.clone(), resource("new")],
            unreadable: vec![],
        },
        history: vec![RunRecord {
            id: 12345,
            deployment: "elsewhere".to_owned(),
            workflow: Some("new-wf".to_owned()),
            operation: Operation::Import,
            actor: "migrate@host".to_owned(),
            started_at: 1_000,
            finished_at: Some(2_000),
            outcome: Some(Outcome::Succeeded),
            counts: ChangeCounts::default(),
            changes: vec![],
            error: None,
            note: Some("from sqlite".to_owned()),
            returns: None,
        }],
    };
    store.import(&import).await.expect("import");
    let state = load(store, "d").await;
    assert_eq!(state.workflow.as_deref(), Some("new-wf"));
    assert_eq!(state.resources, vec![kept, resource("new")]);
    let history = store.history("d").await.expect("history");
    assert_eq!(history.len(), 2);
    assert_eq!(history[0].operation, Operation::Import);
    assert_eq!(history[0].deployment, "d");
    assert_eq!((history[0].started_at, history[0].finished_at), (1_000, Some(2_000)));
    assert_eq!(history[0].note.as_deref(), Some("from sqlite"));
    assert_ne!(history[0].id, 12345);
    assert_eq!(history[1].operation, Operation::Apply);
}

/// Dropping removes the deployment, its resources, history and lease, and nothing else.
pub async fn drop_deployment_removes_everything(store: &dyn Store) {
    seed_for_export(store, "d").await;
    seed_for_export(store, "other").await;
    acquired(store, &lease_request("d", "alice@laptop", "token-a", 60_000)).await;
    acquired(store, &lease_request("other", "bob@host", "token-b", 60_000)).await;

    assert!(store.drop_deployment("d").await.expect("drop"));
    assert_eq!(store.load("d").await.expect("load"), None);
    assert!(store.history("d").await.expect("history").is_empty());
    assert_eq!(store.lease("d").await.expect("lease"), None);
    assert_eq!(store.export("d").await.expect("export"), None);
    let list = store.list().await.expect("list");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "other");
    assert_eq!(list[0].resources, 3);
    assert!(list[0].lease.is_some());
    assert!(!store.drop_deployment("d").await.expect("drop again"));

    // A lease alone (taken before the first run) goes too, and is not a deployment.
    acquired(store, &lease_request("new", "carol@host", "token-c", 60_000)).await;
    assert!(!store.drop_deployment("new").await.expect("drop"));
    assert_eq!(store.lease("new").await.expect("lease"), None);

    // The name can be used again, from scratch.
    store.begin_run(&apply("d", "wf2")).await.expect("begin_run");
    store.put_resource("d", &resource("a")).await.expect("put");
    assert_eq!(load(store, "d").await.resources, vec![resource("a")]);
    assert_eq!(store.history("d").await.expect("history").len(), 1);
}

/// `levels` lists deep, around a short string.
pub fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = Value::Array(vec![v]);
    }
    v
}

/// Values as deep as the limit allows, and wide ones, are stored and read back exactly,
/// through `load` and through export and import.
pub async fn values_at_the_limit_round_trip(store: &dyn Store) {
    store.begin_run(&apply("deep", "wf")).await.expect("begin_run");
    let mut rec = resource("a");
    rec.desired.insert("deep".to_owned(), nested(MAX_DEPTH));
    rec.actual
        .insert("deep".to_owned(), json!({ "k": nested(MAX_DEPTH - 1) }));
    rec.actual.insert(
        "wide".to_owned(),
        json!((0..5000).map(|i| json!({ "i": i })).collect::<Vec<_>>()),
    );
    store.put_resource("deep", &rec).await.expect("put at the limit");
    let state = load(store, "deep").await;
    assert_eq!(state.resources, vec![rec.clone()]);
    assert!(state.unreadable.is_empty());
    let mut export = store.export("deep").await.expect("export").expect("exists");
    export.state.name = "deep-copy".to_owned();
    store.import(&export).await.expect("import");
    assert_eq!(load(store, "deep-copy").await.resources, vec![rec]);
}

/// A record holding a value nested deeper than the limit is refused (it could not be read
/// back), naming the step and attribute, and nothing is written: not by `put_resource`, not
/// by `import`.
pub async fn too_deep_values_are_refused(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    store.put_resource("d", &resource("ok")).await.expect("put");
    for (column, rec) in [
        ("desired", {
            let mut r = resource("a");
            r.desired.insert("input".to_owned(), nested(MAX_DEPTH + 1));
            r
        }),
        ("actual", {
            let mut r = resource("a");
            r.actual.insert("output".to_owned(), nested(10_000));
            r
        }),
    ] {
        let err = store.put_resource("d", &rec).await.expect_err("too deep");
        assert_eq!(err.kind, StoreErrorKind::Other, "{err}");
        assert!(err.message.contains(&format!("({column}) of step \"a\"")), "{err}");
        assert!(err.message.contains("nests more than 64 levels"), "{err}");
        let mut export = store.export("d").await.expect("export").expect("d");
        export.state.name = "imported".to_owned();
        export.state.resources.push(rec);
        store.import(&export).await.expect_err("import too deep");
        assert_eq!(store.load("imported").await.expect("load"), None, "nothing imported");
    }
    assert_eq!(load(store, "d").await.resources, vec![resource("ok")]);
}

/// Every record [`crate::Admin::records`] gives for `deployment`, which must exist.
async fn streamed(store: &dyn Store, deployment: &str) -> Vec<ReadRecord> {
    let stream = store
        .records(deployment)
        .await
        .expect("records")
        .unwrap_or_else(|| panic!("deployment {deployment} missing"));
    assert_eq!(stream.name, deployment);
    stream.records.map(|r| r.expect("a record")).collect().await
}

/// A deployment's records read one at a time are what a load gives, in step order; an unknown
/// deployment has none, one without resources an empty stream.
pub async fn records_stream_in_step_order(store: &dyn Store) {
    assert!(store.records("nope").await.expect("records").is_none());
    store.begin_run(&apply("empty", "wf-e")).await.expect("begin_run");
    let empty = store.records("empty").await.expect("records").expect("exists");
    assert_eq!(empty.workflow.as_deref(), Some("wf-e"));
    assert_eq!(empty.records.count().await, 0);

    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    // More than are read ahead, written out of order.
    let mut ids: Vec<String> = (0..300).map(|i| format!("s{:03}", (i * 7) % 300)).collect();
    let records: Vec<ResourceRecord> = ids.iter().map(|id| resource(id)).collect();
    join_all(records.iter().map(|r| store.put_resource("d", r)))
        .await
        .into_iter()
        .for_each(|r| r.expect("put"));
    store.put_resource("other", &resource("s000-other")).await.expect("put");
    ids.sort();
    let read: Vec<ReadRecord> = streamed(store, "d").await;
    let expected: Vec<ReadRecord> = load(store, "d")
        .await
        .resources
        .into_iter()
        .map(ReadRecord::Readable)
        .collect();
    assert_eq!(read.len(), 300);
    assert_eq!(read, expected);
    let order: Vec<&str> = read
        .iter()
        .map(|r| match r {
            ReadRecord::Readable(r) => r.step_id.as_str(),
            ReadRecord::Unreadable(u) => u.step_id.as_str(),
        })
        .collect();
    assert_eq!(order, ids);
}

/// A consumer that stops reading part-way leaves the store as it was: it still reads and
/// writes, and the next stream is whole.
pub async fn records_dropped_part_way(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    for i in 0..200 {
        store
            .put_resource("d", &resource(&format!("r{i:03}")))
            .await
            .expect("put");
    }
    for _ in 0..3 {
        let mut stream = store.records("d").await.expect("records").expect("d");
        assert!(stream.records.next().await.is_some());
        drop(stream);
    }
    store.put_resource("d", &resource("r999")).await.expect("a write after");
    assert_eq!(streamed(store, "d").await.len(), 201);
    assert_eq!(load(store, "d").await.resources.len(), 201);
}

/// Sets up deployment `d` with records `a` and `b`, for a backend test to damage `a` behind
/// the store's back and then check [`damaged_record_is_listed`].
pub async fn seed_for_damage(store: &dyn Store) {
    store.begin_run(&apply("d", "wf")).await.expect("begin_run");
    for id in ["a", "b"] {
        store.put_resource("d", &resource(id)).await.expect("put");
    }
}

/// One record of `d` (`a`) cannot be decoded: the rest of the deployment still loads and
/// exports, the bad record is named, and it can be removed.
pub async fn damaged_record_is_listed(store: &dyn Store) {
    let state = load(store, "d").await;
    assert_eq!(state.resources, vec![resource("b")]);
    assert_eq!(state.unreadable.len(), 1, "{state:?}");
    let bad = &state.unreadable[0];
    assert_eq!((bad.step_id.as_str(), bad.type_name.as_str()), ("a", "Test::Thing"));
    assert!(bad.error.contains("corrupt state"), "{}", bad.error);
    // Where in the record, the same words on every backend (one decoder for all).
    assert!(bad.error.contains(" at line 1 column "), "{}", bad.error);
    let export = store
        .export("d")
        .await
        .expect("export despite the bad record")
        .expect("d");
    assert_eq!(export.state, state);
    // Read one by one, the bad record is in its place, named the same way.
    assert_eq!(
        streamed(store, "d").await,
        vec![ReadRecord::Unreadable(bad.clone()), ReadRecord::Readable(resource("b"))]
    );
    assert_eq!(store.list().await.expect("list")[0].resources, 2);
    store.remove_resource("d", "a").await.expect("remove the bad record");
    let state = load(store, "d").await;
    assert!(state.unreadable.is_empty());
    assert_eq!(state.resources, vec![resource("b")]);
}

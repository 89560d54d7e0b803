//! The reconcile flow against a real SQLite state, the built-in providers and a reporter that
//! records what it is told.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lyra_providers::{ProvidersConfig, builtin};
use lyra_state::LeaseGrant;
use serde_json::json;

use super::*;
use crate::reason::{Reason, classify};
use crate::status::{READY, RECONCILING, STALLED, condition, is_true};

#[derive(Default)]
struct Recorded {
    statuses: Mutex<Vec<WorkflowStatus>>,
    notes: Mutex<Vec<Note>>,
}

#[async_trait]
impl Reporter for Recorded {
    async fn write_status(&self, old: &WorkflowStatus, new: &WorkflowStatus) -> Result<(), ReportError> {
        assert_ne!(old, new, "status writes happen only on change");
        self.statuses.lock().unwrap().push(new.clone());
        Ok(())
    }
    async fn publish(&self, note: Note) {
        self.notes.lock().unwrap().push(note);
    }
}

impl Recorded {
    fn last(&self) -> WorkflowStatus {
        self.statuses
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a status was written")
    }
    fn writes(&self) -> usize {
        self.statuses.lock().unwrap().len()
    }
    fn reasons(&self) -> Vec<String> {
        self.notes
            .lock()
            .unwrap()
            .iter()
            .map(|n| n.reason.as_str().to_owned())
            .collect()
    }
}

const PAIR: &str = "\
parameters:
  greeting: {type: String, lookup: greeting}
returns: [echoed]
steps:
  first:
    returns: {firstOut: output}
    resource: Null::Resource
    value: {input: $greeting}
  second:
    returns: {echoed: output}
    resource: Null::Resource
    value: {input: $firstOut}
";

const CLOUD: &str = "\
steps:
  vm:
    resource: Foobernetes::Instance
    value: {location: eu1, image: x, cpus: 1, memory: 1G}
";

struct Harness {
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
}

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workflows")).unwrap();
        std::fs::write(dir.path().join("workflows/pair.yaml"), PAIR).unwrap();
        std::fs::write(dir.path().join("workflows/cloud.yaml"), CLOUD).unwrap();
        let store = lyra_state::open(&dir.path().join("state.db").display().to_string())
            .await
            .unwrap();
        Harness { dir, store }
    }

    fn runtime_with(&self, cloud: &Path) -> Runtime {
        let providers = Arc::new(builtin(&ProvidersConfig {
            foobernetes_file: cloud.to_path_buf(),
            ..ProvidersConfig::default()
        }));
        let mut settings = Settings::new(self.dir.path().join("workflows"));
        settings.backoff = Backoff {
            base: Duration::from_secs(60),
            max: Duration::from_secs(600),
        };
        // Every run shows in the status, so that the tests can see what it said meanwhile.
        settings.show_run_after = Duration::ZERO;
        Runtime::new(providers, Arc::clone(&self.store), settings, Arc::new(Metrics::new()))
    }

    fn runtime(&self) -> Runtime {
        self.runtime_with(&self.dir.path().join("deployment.json"))
    }

    /// A Foobernetes file that cannot be written: every create fails.
    fn broken_cloud(&self) -> PathBuf {
        self.dir.path().join("missing-dir/deployment.json")
    }
}

fn job(name: &str, workflow: &str, generation: i64, data: Value) -> Job {
    Job {
        key: ObjectKey::new("ns", name),
        uid: Some(format!("uid-{name}")),
        generation: Some(generation),
        workflow: Ok(WorkflowRef::Named(workflow.to_owned())),
        data: Some(data),
        refresh_interval: None,
        deletion_policy: DeletionPolicy::Delete,
        suspend: false,
        approval: Approval::Automatic,
        drift_policy: DriftPolicy::Correct,
        approved: None,
        requested_at: None,
        unavailable: None,
    }
}

#[tokio::test]
async fn applies_reports_and_then_leaves_an_applied_object_alone() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = job("x", "pair", 1, json!({"greeting": "hi"}));
    let next = rt.apply(&j, None, &r).await.unwrap();
    assert_eq!(next, Next::Requeue(rt.settings.idle_requeue));
    let s = r.last();
    assert_eq!(s.phase, Some(Phase::Ready));
    assert!(is_true(&s, READY) && !is_true(&s, RECONCILING) && !is_true(&s, STALLED));
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!(s.deployment.as_deref(), Some("k8s/ns/x"));
    assert_eq!(s.progress.as_deref(), Some("2/2"));
    assert_eq!(s.returns, Some(json!({"echoed": "hi"})));
    assert_eq!(s.lease_holder, None);
    let steps: Vec<(&str, &str, Option<&str>)> = s
        .steps
        .iter()
        .map(|st| (st.name.as_str(), st.state.as_str(), st.last_action.as_deref()))
        .collect();
    assert_eq!(
        steps,
        [("first", "done", Some("create")), ("second", "done", Some("create"))]
    );
    let run = s.last_run.as_ref().unwrap();
    assert_eq!((run.operation.as_str(), run.outcome.as_str()), ("apply", "succeeded"));
    assert!(run.id.is_some());
    // While it ran, the status said so and named the lease holder.
    let running = r.statuses.lock().unwrap()[0].clone();
    assert_eq!(running.phase, Some(Phase::Applying));
    assert_eq!(running.lease_holder.as_deref(), Some("controller/ns/x"));
    // One event for the resources it created, naming them; not one each.
    assert_eq!(r.reasons(), ["Applying", "Created", "Applied"]);
    let created = r.notes.lock().unwrap()[1].message.clone();
    assert!(
        created.starts_with("2 resources: ") && created.contains(" first") && created.contains(" second"),
        "{created}"
    );

    // The shared state has it, under the object's key, with its lease released.
    let state = h.store.load("k8s/ns/x").await.unwrap().unwrap();
    assert_eq!(state.resources.len(), 2);
    assert_eq!(h.store.lease("k8s/ns/x").await.unwrap(), None);

    // The reconciles its own status writes trigger run nothing, in this process or in a
    // restarted one (which only has the status to go by).
    let writes = r.writes();
    rt.apply(&j, Some(&s), &r).await.unwrap();
    h.runtime().apply(&j, Some(&s), &r).await.unwrap();
    assert_eq!(r.writes(), writes);
    assert_eq!(h.store.history("k8s/ns/x").await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_spec_change_applies_only_the_difference() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    rt.apply(&job("x", "pair", 1, json!({"greeting": "hi"})), None, &r)
        .await
        .unwrap();
    let s = r.last();
    rt.apply(&job("x", "pair", 2, json!({"greeting": "bye"})), Some(&s), &r)
        .await
        .unwrap();
    let s = r.last();
    assert_eq!(s.observed_generation, Some(2));
    assert!(is_true(&s, READY));
    assert_eq!(s.returns, Some(json!({"echoed": "bye"})));
    assert_eq!(s.last_run.unwrap().changes.as_deref(), Some("updated 2"));
}

#[tokio::test]
async fn bad_input_stalls_without_retrying_until_the_spec_changes() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();

    let missing = job("x", "nosuch", 1, json!({}));
    assert_eq!(
        rt.apply(&missing, None, &r).await.unwrap(),
        Next::Requeue(rt.settings.idle_requeue)
    );
    let s = r.last();
    assert!(is_true(&s, STALLED) && !is_true(&s, READY) && !is_true(&s, RECONCILING));
    assert_eq!(condition(&s, STALLED).unwrap().reason, "WorkflowNotFound");
    assert!(
        s.message.as_deref().unwrap().contains("workflow 'nosuch' not found"),
        "{s:?}"
    );
    assert_eq!(s.phase, Some(Phase::Failed));
    // Again, for the same generation: nothing runs, nothing is written.
    let writes = r.writes();
    rt.apply(&missing, Some(&s), &r).await.unwrap();
    h.runtime().apply(&missing, Some(&s), &r).await.unwrap();
    assert_eq!(r.writes(), writes);

    // Wrong data types: terminal, naming the parameter and its place in the workflow.
    let wrong = job("x", "pair", 2, json!({"greeting": {"not": "a string"}}));
    rt.apply(&wrong, Some(&s), &r).await.unwrap();
    let s = r.last();
    assert_eq!(condition(&s, STALLED).unwrap().reason, "InvalidData");
    assert!(
        s.message.as_deref().unwrap().contains("pair.yaml:2:3"),
        "{:?}",
        s.message
    );

    // The fix is a spec change, which runs at once.
    rt.apply(&job("x", "pair", 3, json!({"greeting": "hi"})), Some(&s), &r)
        .await
        .unwrap();
    let s = r.last();
    assert!(is_true(&s, READY) && !is_true(&s, STALLED));
}

#[tokio::test]
async fn an_invalid_inline_workflow_is_reported_with_positions() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("inline", "unused", 1, json!({}));
    j.workflow = Ok(WorkflowRef::Inline {
        name: "inline".into(),
        body: json!({"steps": {"a": {"resource": "Nope::Thing", "value": {}}}}),
    });
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();
    assert_eq!(condition(&s, STALLED).unwrap().reason, "InvalidWorkflow");
    let m = &condition(&s, STALLED).unwrap().message;
    assert!(
        m.starts_with("spec.workflow.steps.a.resource: ") && m.contains("Nope::Thing"),
        "the message names the field, not a line of a copy: {m}"
    );
}

#[tokio::test]
async fn keys_kubectl_made_from_yaml_booleans_are_pointed_out() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    // `y: ...` in the manifest, as kubectl sends it: the key is "true".
    let mut j = job("inline", "unused", 1, json!({}));
    j.workflow = Ok(WorkflowRef::Inline {
        name: "inline".into(),
        body: json!({"steps": {"a": {"resource": "Null::Resource", "value": {"input": 1}, "true": 2}}}),
    });
    rt.apply(&j, None, &r).await.unwrap();
    let m = condition(&r.last(), STALLED).unwrap().message.clone();
    assert!(
        m.starts_with("spec.workflow.steps.a.true: ") && m.contains("probably an unquoted y, yes or on"),
        "{m}"
    );

    // The key breaks something elsewhere: a parameter `n` became "false", `$n` names nothing.
    j.generation = Some(2);
    j.workflow = Ok(WorkflowRef::Inline {
        name: "inline".into(),
        body: json!({"parameters": {"false": {"type": "String", "value": "x"}},
            "steps": {"a": {"resource": "Null::Resource", "value": {"input": "$n"}}}}),
    });
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    let m = condition(&r.last(), STALLED).unwrap().message.clone();
    assert!(
        m.contains("spec.workflow.steps.a.value.input: ")
            && m.contains(
                "note: spec.workflow.parameters.false: the key \"false\" is probably an unquoted n, no or off"
            ),
        "{m}"
    );

    // In spec.data: a lookup of `y` finds nothing, and the message says why.
    j.generation = Some(3);
    j.workflow = Ok(WorkflowRef::Named("pair".into()));
    j.data = Some(json!({"true": "hi"}));
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    let m = condition(&r.last(), STALLED).unwrap().message.clone();
    assert!(m.contains("note: spec.data.true: the key \"true\""), "{m}");
}

#[tokio::test]
async fn an_inline_workflow_applies() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("inline", "unused", 1, json!({"greeting": "hey", "deep.key": 1}));
    j.workflow = Ok(WorkflowRef::Inline {
        name: "inline".into(),
        // What the API server hands back for the PAIR workflow written inline.
        body: json!({
            "parameters": {"greeting": {"type": "String", "lookup": "greeting"}},
            "returns": ["echoed"],
            "steps": {
                "first": {"returns": {"firstOut": "output"}, "resource": "Null::Resource", "value": {"input": "$greeting"}},
                "second": {"returns": {"echoed": "output"}, "resource": "Null::Resource", "value": {"input": "$firstOut"}},
            },
        }),
    });
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, READY), "{s:?}");
    assert_eq!(s.workflow.as_deref(), Some("inline"));
    assert_eq!(s.returns, Some(json!({"echoed": "hey"})));
}

#[tokio::test]
async fn a_held_lease_is_waited_out_until_its_expiry_naming_the_holder() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let request = lyra_state::LeaseRequest {
        deployment: "k8s/ns/x".into(),
        owner: "alice@laptop".into(),
        operation: "apply".into(),
        token: "t".into(),
        ttl_ms: 60_000,
    };
    let LeaseGrant::Acquired(lease) = h.store.acquire_lease(&request).await.unwrap() else {
        panic!("the lease is free")
    };
    let j = job("x", "pair", 1, json!({"greeting": "hi"}));
    // Not an error, and no backoff: the retry comes just after the lease expires (here, in a
    // minute), or sooner, polling in case it is released.
    let Next::Requeue(after) = rt.apply(&j, None, &r).await.unwrap() else {
        panic!("expected a requeue")
    };
    assert_eq!(after, rt.settings.lease_poll);
    let mut patient = h.runtime();
    patient.settings.lease_poll = Duration::from_secs(3600);
    let Next::Requeue(after) = patient.apply(&j, None, &Recorded::default()).await.unwrap() else {
        panic!("expected a requeue")
    };
    // Computed a moment apart (and from the expiry the store reports), so only close.
    let expected = until_expiry(lease.expires, now_ms());
    assert!(
        after.abs_diff(expected) <= Duration::from_secs(2) && after > Duration::from_secs(55),
        "{after:?} vs {expected:?}"
    );
    let s = r.last();
    assert_eq!(s.lease_holder.as_deref(), Some("alice@laptop"));
    assert!(is_true(&s, RECONCILING) && !is_true(&s, STALLED) && !is_true(&s, READY));
    assert_eq!(condition(&s, READY).unwrap().reason, "Locked");
    assert_eq!(s.phase, Some(Phase::Pending));
    let message = s.message.clone().unwrap();
    assert!(
        message.contains("alice@laptop is running apply since")
            && message.contains(&format!("lease expires {}", lease::utc(lease.expires))),
        "{message}"
    );
    assert_eq!(r.reasons(), ["Locked"], "one event, and no run started");
    // The reconcile its status write triggers waits too, and writes nothing.
    let writes = r.writes();
    match rt.apply(&j, Some(&s), &r).await {
        Ok(Next::Requeue(d)) => assert!(d <= rt.settings.lease_poll),
        other => panic!("expected a wait, got {other:?}"),
    }
    assert_eq!(r.writes(), writes);
    assert!(h.store.load("k8s/ns/x").await.unwrap().is_none(), "nothing ran");

    // Released (or expired): the next try (here by a restarted controller) applies.
    h.store.release_lease(&lease).await.unwrap();
    h.runtime().apply(&j, Some(&s), &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, READY) && s.lease_holder.is_none(), "{s:?}");

    // A refresh of an applied object that meets a held lease stays Ready meanwhile.
    let LeaseGrant::Acquired(_) = h.store.acquire_lease(&request).await.unwrap() else {
        panic!("the lease is free")
    };
    let refresh = Job {
        requested_at: Some("now".into()),
        ..j.clone()
    };
    rt.apply(&refresh, Some(&s), &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, READY) && is_true(&s, RECONCILING), "{s:?}");
    assert_eq!(s.phase, Some(Phase::Ready));
}

#[tokio::test]
async fn only_a_run_that_takes_a_while_shows_in_the_status() {
    let h = Harness::new().await;
    let mut rt = h.runtime();
    rt.settings.show_run_after = Duration::from_millis(300);
    // A quick run: one status write and the events of its outcome; no start event.
    let r = Recorded::default();
    rt.apply(&job("x", "pair", 1, json!({"greeting": "hi"})), None, &r)
        .await
        .unwrap();
    assert_eq!(r.writes(), 1, "{:?}", r.statuses.lock().unwrap());
    let s = r.last();
    assert!(s.phase == Some(Phase::Ready) && s.lease_holder.is_none(), "{s:?}");
    assert_eq!(r.reasons(), ["Created", "Applied"]);
    // A slow one shows while it runs.
    let mut slow = job("slow", "unused", 1, json!({}));
    slow.workflow = Ok(WorkflowRef::Inline {
        name: "slow".into(),
        body: json!({"steps": {"wait": {"resource": "Time::Sleep", "value": {"create_duration": "900ms"}}}}),
    });
    let r = Recorded::default();
    rt.apply(&slow, None, &r).await.unwrap();
    let statuses = r.statuses.lock().unwrap().clone();
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert_eq!(statuses[0].phase, Some(Phase::Applying));
    assert_eq!(statuses[0].lease_holder.as_deref(), Some("controller/ns/slow"));
    assert_eq!(statuses[1].phase, Some(Phase::Ready), "{:?}", statuses[1]);
    // And a start event, before the events of its outcome.
    assert_eq!(r.reasons(), ["Applying", "Created", "Applied"]);
}

#[tokio::test]
async fn the_lease_names_the_replica_and_the_history_the_object() {
    let h = Harness::new().await;
    let mut rt = h.runtime();
    rt.settings.instance = Some("replica-1".into());
    let r = Recorded::default();
    rt.apply(&job("x", "pair", 1, json!({"greeting": "hi"})), None, &r)
        .await
        .unwrap();
    let running = r.statuses.lock().unwrap()[0].clone();
    assert_eq!(running.lease_holder.as_deref(), Some("controller/ns/x@replica-1"));
    let history = h.store.history("k8s/ns/x").await.unwrap();
    assert_eq!(history[0].actor, "controller/ns/x");
}

#[test]
fn lease_waits_end_just_after_the_expiry() {
    assert_eq!(until_expiry(10_000, 4_000), Duration::from_millis(6_250));
    // Already expired by our clock but not by the store's: soon, not in a hot loop.
    assert_eq!(until_expiry(4_000, 10_000), Duration::from_secs(1));
}

#[tokio::test]
async fn a_provider_failure_is_retried_and_recovers() {
    let h = Harness::new().await;
    let r = Recorded::default();
    let j = job("c", "cloud", 1, json!({}));
    let broken = h.runtime_with(&h.broken_cloud());
    let err = broken.apply(&j, None, &r).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Retry { .. }), "{err:?}");
    let s = r.last();
    assert_eq!(s.phase, Some(Phase::Failed));
    assert_eq!(condition(&s, READY).unwrap().reason, "ApplyFailed");
    assert!(s.message.as_deref().unwrap().starts_with("step vm:"), "{:?}", s.message);
    assert_eq!(s.steps[0].state, "failed");
    assert_eq!(s.steps[0].attempts, 1);
    assert!(s.steps[0].last_error.is_some());
    assert!(r.reasons().contains(&"StepFailed".to_owned()));

    // The fault clears (a restarted controller with a working cloud): Ready.
    h.runtime().apply(&j, Some(&s), &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, READY));
    assert_eq!((s.steps[0].state.as_str(), s.steps[0].attempts), ("done", 2));
}

#[tokio::test]
async fn cleanup_deletes_everything_before_releasing() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = job("c", "cloud", 1, json!({}));
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();

    // A delete that fails keeps the finalizer: Stalled, with the error, and retried.
    let broken = h.runtime_with(&h.broken_cloud());
    let err = broken.cleanup(&j, Some(&s), &r).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Retry { .. }), "{err:?}");
    let s = r.last();
    assert_eq!(s.phase, Some(Phase::Deleting));
    assert!(is_true(&s, STALLED));
    assert_eq!(h.store.load("k8s/ns/c").await.unwrap().unwrap().resources.len(), 1);
    // ... and waits for its backoff rather than retrying on its own status write.
    assert!(matches!(
        broken.cleanup(&j, Some(&s), &r).await,
        Err(ReconcileError::Wait(_))
    ));

    assert_eq!(rt.cleanup(&j, Some(&s), &r).await.unwrap(), Next::Done);
    let state = h.store.load("k8s/ns/c").await.unwrap().unwrap_or_default();
    assert!(state.resources.is_empty());
    assert!(
        r.reasons()
            .ends_with(&["Deleting".to_owned(), "Deleted".to_owned(), "Deleted".to_owned()])
    );
    let cloud = std::fs::read_to_string(h.dir.path().join("deployment.json")).unwrap();
    assert!(!cloud.contains("\"i-"), "{cloud}");
}

#[tokio::test]
async fn orphan_forgets_without_deleting() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("c", "cloud", 1, json!({}));
    rt.apply(&j, None, &r).await.unwrap();
    j.deletion_policy = DeletionPolicy::Orphan;
    assert_eq!(rt.cleanup(&j, Some(&r.last()), &r).await.unwrap(), Next::Done);
    assert!(h.store.load("k8s/ns/c").await.unwrap().is_none());
    let cloud = std::fs::read_to_string(h.dir.path().join("deployment.json")).unwrap();
    assert!(cloud.contains("\"i-"), "the instance is still there: {cloud}");
    assert!(r.reasons().contains(&"Orphaned".to_owned()));
}

#[tokio::test]
async fn suspend_applies_nothing_but_cleanup_still_works() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("x", "pair", 1, json!({"greeting": "hi"}));
    j.suspend = true;
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();
    assert_eq!(condition(&s, RECONCILING).unwrap().reason, "Suspended");
    assert!(h.store.load("k8s/ns/x").await.unwrap().is_none());
    assert_eq!(rt.cleanup(&j, Some(&s), &r).await.unwrap(), Next::Done);
}

#[tokio::test]
async fn the_reconcile_annotation_triggers_a_run_and_is_acknowledged() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("x", "pair", 1, json!({"greeting": "hi"}));
    rt.apply(&j, None, &r).await.unwrap();
    j.requested_at = Some("2026-01-01T00:00:00Z".into());
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    assert_eq!(h.store.history("k8s/ns/x").await.unwrap().len(), 2);
    assert_eq!(r.last().last_handled_reconcile_at, j.requested_at);
}

#[test]
fn refresh_is_due_from_the_last_run_after_a_restart() {
    let j = Job {
        refresh_interval: Some("60s".into()),
        ..job("x", "pair", 1, json!({}))
    };
    let mut s = WorkflowStatus::default();
    let t0 = Time(Timestamp::from_second(1_800_000_000).unwrap());
    judge(&mut s, &Verdict::Applied, Some(1), &t0);
    s.last_run = Some(RunSummary {
        id: Some(1),
        operation: "apply".into(),
        outcome: "succeeded".into(),
        time: t0.clone(),
        changes: None,
    });
    let refresh = Some(Duration::from_secs(60));
    let now = Instant::now();
    let wall = |secs: i64| Timestamp::from_second(1_800_000_000 + secs).unwrap();
    assert_eq!(
        decide(&j, Some(&s), None, refresh, now, wall(20)),
        Decision::Wait(Duration::from_secs(40))
    );
    assert_eq!(decide(&j, Some(&s), None, refresh, now, wall(61)), Decision::Run);
    assert_eq!(decide(&j, Some(&s), None, None, now, wall(61)), Decision::Idle);
    // A run interrupted by a crash shows as Applying: it is resumed.
    s.phase = Some(Phase::Applying);
    assert_eq!(decide(&j, Some(&s), None, None, now, wall(1)), Decision::Run);
    // A newer generation always runs.
    assert_eq!(
        decide(&job("x", "pair", 2, json!({})), Some(&s), None, None, now, wall(1)),
        Decision::Run
    );
}

#[test]
fn engine_errors_are_classified() {
    use lyra_core::state::{StoreError, StoreErrorKind};
    let input = EngineError::Input(Diagnostics::default());
    let store = EngineError::Store(StoreError::new(StoreErrorKind::Unavailable, "down"));
    assert_eq!(classify(&input), ErrorClass::Terminal);
    assert_eq!(classify(&store), ErrorClass::Retryable);
}

#[test]
fn intervals_and_jobs_from_objects() {
    assert_eq!(parse_interval(Some("1h30m")), Ok(Some(Duration::from_secs(5400))));
    assert!(parse_interval(Some("soon")).is_err());
    assert!(parse_interval(Some("10ms")).is_err());
    let mut wf = Workflow::new("x", crate::crd::WorkflowSpec::default());
    wf.metadata.namespace = Some("ns".into());
    wf.metadata.generation = Some(4);
    wf.metadata.annotations = Some([(crate::crd::RECONCILE_REQUESTED_AT.to_owned(), "now".to_owned())].into());
    let j = Job::from_workflow(&wf).unwrap();
    assert!(j.workflow.unwrap_err().contains("set spec.workflowName"));
    assert_eq!(
        (j.key.deployment(), j.key.owner()),
        ("k8s/ns/x".into(), "controller/ns/x".into())
    );
    assert_eq!((j.generation, j.requested_at.as_deref()), (Some(4), Some("now")));
    wf.spec.workflow_name = Some("a".into());
    wf.spec.workflow = Some(json!({}).into());
    assert!(
        Job::from_workflow(&wf)
            .unwrap()
            .workflow
            .unwrap_err()
            .contains("not both")
    );
    wf.metadata.namespace = None;
    assert!(Job::from_workflow(&wf).is_none());
}

#[tokio::test]
async fn cleanup_runs_once_per_object_and_a_recreated_name_starts_afresh() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = job("c", "cloud", 1, json!({}));
    rt.apply(&j, None, &r).await.unwrap();
    let before_delete = r.last();
    assert_eq!(rt.cleanup(&j, Some(&before_delete), &r).await.unwrap(), Next::Done);
    assert_eq!(runs(&h, "k8s/ns/c").await, ["delete", "apply"]);
    let (writes, notes) = (r.writes(), r.notes.lock().unwrap().len());

    // A reconcile queued before the finalizer went brings the object as the cache last saw
    // it: nothing runs, nothing is written or published, the finalizer may go.
    assert_eq!(rt.cleanup(&j, Some(&before_delete), &r).await.unwrap(), Next::Done);
    // A restarted controller (no memory) finds nothing recorded: the same.
    assert_eq!(
        h.runtime().cleanup(&j, Some(&before_delete), &r).await.unwrap(),
        Next::Done
    );
    assert_eq!(
        runs(&h, "k8s/ns/c").await,
        ["delete", "apply"],
        "no second, empty delete run"
    );
    assert_eq!((r.writes(), r.notes.lock().unwrap().len()), (writes, notes));

    // The same name, a new object: applied, and deleted again, by the same runtime.
    let again = Job {
        uid: Some("uid-c-2".into()),
        ..j.clone()
    };
    rt.apply(&again, None, &r).await.unwrap();
    assert!(is_true(&r.last(), READY));
    assert_eq!(rt.cleanup(&again, Some(&r.last()), &r).await.unwrap(), Next::Done);
    assert_eq!(runs(&h, "k8s/ns/c").await, ["delete", "apply", "delete", "apply"]);
    assert!(
        h.store
            .load("k8s/ns/c")
            .await
            .unwrap()
            .unwrap_or_default()
            .resources
            .is_empty()
    );
}

/// The operations of a deployment's runs, newest first.
async fn runs(h: &Harness, deployment: &str) -> Vec<&'static str> {
    let history = h.store.history(deployment).await.unwrap();
    history.iter().map(|r| r.operation.as_str()).collect()
}

#[tokio::test]
async fn step_errors_in_an_inline_workflow_name_the_field() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let mut j = job("inline", "unused", 1, json!({}));
    j.workflow = Ok(WorkflowRef::Inline {
        name: "inline".into(),
        body: json!({"steps": {"wait": {"resource": "Time::Sleep", "value": {"create_duration": "soon"}}}}),
    });
    // The provider refuses the value: the same input would fail again, so it stalls.
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, STALLED), "{s:?}");
    assert!(r.reasons().contains(&"ProviderRefused".to_owned()), "{:?}", r.reasons());
    let error = s.steps[0].last_error.clone().unwrap();
    assert!(
        error.starts_with("spec.workflow.steps.wait: Time::Sleep: ") && !error.contains("ns/inline"),
        "{error}"
    );
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .starts_with("step wait: spec.workflow.steps.wait: "),
        "{:?}",
        s.message
    );
    let notes = r.notes.lock().unwrap();
    let failed = notes.iter().find(|n| n.reason == Reason::StepFailed).unwrap();
    assert!(
        failed.message.contains("spec.workflow.steps.wait: Time::Sleep"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_delete_waits_for_a_held_lease_too() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = job("c", "cloud", 1, json!({}));
    rt.apply(&j, None, &r).await.unwrap();
    let request = lyra_state::LeaseRequest {
        deployment: "k8s/ns/c".into(),
        owner: "alice@laptop".into(),
        operation: "state rm".into(),
        token: "t".into(),
        ttl_ms: 60_000,
    };
    let LeaseGrant::Acquired(lease) = h.store.acquire_lease(&request).await.unwrap() else {
        panic!("the lease is free")
    };
    assert_eq!(
        rt.cleanup(&j, Some(&r.last()), &r).await.unwrap(),
        Next::Requeue(rt.settings.lease_poll)
    );
    let s = r.last();
    assert_eq!(
        (s.phase, s.lease_holder.as_deref()),
        (Some(Phase::Deleting), Some("alice@laptop"))
    );
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("alice@laptop is running state rm since")
    );
    // Until the next try is due, reconciles wait (no run, nothing written).
    let writes = r.writes();
    assert!(matches!(
        rt.cleanup(&j, Some(&s), &r).await,
        Err(ReconcileError::Wait(_))
    ));
    assert_eq!(r.writes(), writes);
    h.store.release_lease(&lease).await.unwrap();
    assert_eq!(h.runtime().cleanup(&j, Some(&s), &r).await.unwrap(), Next::Done);
    assert!(
        h.store
            .load("k8s/ns/c")
            .await
            .unwrap()
            .unwrap_or_default()
            .resources
            .is_empty()
    );
}

/// A package holding `text` as its main workflow `pair`, named by `digest`.
fn package(digest: &str, text: &str) -> PackageRef {
    PackageRef(Arc::new(lyra_package::Package {
        digest: digest.to_owned(),
        manifest: serde_json::from_value(json!({"name": "pair", "version": "1.0.0"})).unwrap(),
        files: std::collections::BTreeMap::from([("pair".to_owned(), ("pair.yaml".to_owned(), text.to_owned()))]),
    }))
}

#[tokio::test]
async fn a_registered_kind_runs_its_package_and_a_new_digest_runs_again() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = Job {
        key: ObjectKey::of_kind("pairs.workflows.lyra.dev", "ns", "x"),
        workflow: Ok(WorkflowRef::Package(package("sha256:one", PAIR))),
        ..job("x", "pair", 1, json!({"greeting": "hi"}))
    };
    rt.apply(&j, None, &r).await.unwrap();
    let s = r.last();
    assert!(is_true(&s, READY), "{s:?}");
    // Kinds have deployments of their own, named by kind; the status names the digest run.
    assert_eq!(s.deployment.as_deref(), Some("k8s/ns/pairs.workflows.lyra.dev/x"));
    assert_eq!(s.digest.as_deref(), Some("sha256:one"));
    assert_eq!(s.workflow.as_deref(), Some("pair@sha256:one"));
    assert!(
        h.store
            .load("k8s/ns/pairs.workflows.lyra.dev/x")
            .await
            .unwrap()
            .is_some()
    );
    assert!(h.store.load("k8s/ns/x").await.unwrap().is_none());

    // The same digest again: nothing runs, here or in a restarted controller.
    let writes = r.writes();
    rt.apply(&j, Some(&s), &r).await.unwrap();
    h.runtime().apply(&j, Some(&s), &r).await.unwrap();
    assert_eq!(r.writes(), writes);

    // A new digest with the object unchanged (an upgrade of the kind): applied again.
    let upgraded = Job {
        workflow: Ok(WorkflowRef::Package(package("sha256:two", PAIR))),
        ..j.clone()
    };
    h.runtime().apply(&upgraded, Some(&s), &r).await.unwrap();
    let s2 = r.last();
    assert!(r.writes() > writes);
    assert_eq!(s2.digest.as_deref(), Some("sha256:two"));
    assert!(is_true(&s2, READY), "{s2:?}");
}

#[tokio::test]
async fn input_that_is_not_there_yet_is_retried_not_stalled() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = Job {
        unavailable: Some("spec.password.secretKeyRef: Secret db not found".to_owned()),
        ..job("x", "pair", 1, json!({}))
    };
    let err = rt.apply(&j, None, &r).await.unwrap_err();
    assert!(matches!(err, ReconcileError::Retry { .. }), "{err:?}");
    let s = r.last();
    assert!(!is_true(&s, STALLED) && !is_true(&s, READY), "{s:?}");
    assert!(s.message.unwrap().contains("Secret db not found"));
    assert_eq!(r.reasons(), ["InputUnavailable"]);
}

mod approval;
mod drift_policy;

#[test]
fn changed_resources_are_listed_as_far_as_the_note_holds() {
    let items: Vec<String> = (0..200).map(|i| format!("Null::Resource s{i} (id-{i})")).collect();
    let text = listed(&items, crate::events::NOTE_LIMIT);
    assert!(text.len() <= crate::events::NOTE_LIMIT, "{}", text.len());
    assert!(
        text.starts_with("200 resources: Null::Resource s0 (id-0), Null::Resource s1"),
        "{text}"
    );
    let shown = text.matches("Null::Resource").count();
    assert!(text.ends_with(&format!(", and {} more", 200 - shown)), "{text}");
    assert_eq!(listed(&items[..1], 1024), "1 resource: Null::Resource s0 (id-0)");
    assert_eq!(listed(&["x".repeat(2000)], 1024), "1 resource, named too long to list");
}

/// The step names of the workflow a job loads, or the failure's reason.
async fn loaded_steps(rt: &Runtime, job: &Job) -> Result<Vec<String>, Reason> {
    let prepared = rt.prepare(job).await.map_err(|f| f.reason)?;
    let lyra_core::model::StepKind::Workflow { steps, .. } = &prepared.program.main.root.kind else {
        panic!("a workflow's root holds its steps");
    };
    // Positions point into the sources handed back with the program.
    for s in steps {
        assert!(prepared.sources.get(s.span.file).is_some(), "{} points nowhere", s.name);
    }
    Ok(steps.iter().map(|s| s.name.clone()).collect())
}

/// A workflow file is parsed once while it stays the same, and again as soon as it changes.
#[tokio::test]
async fn a_kept_program_is_used_only_while_its_file_is_unchanged() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let file = h.dir.path().join("workflows/one.yaml");
    let step = |name: &str| format!("  {name}:\n    resource: Null::Resource\n    value: {{input: x}}\n");
    std::fs::write(&file, format!("steps:\n{}", step("a"))).unwrap();
    let j = job("one", "one", 1, json!({}));
    assert_eq!(loaded_steps(&rt, &j).await, Ok(vec!["a".to_owned()]));
    assert!(rt.programs.lock().unwrap().contains_key("one"), "kept");
    assert_eq!(loaded_steps(&rt, &j).await, Ok(vec!["a".to_owned()]));
    std::fs::write(&file, format!("steps:\n{}{}", step("a"), step("b"))).unwrap();
    assert_eq!(loaded_steps(&rt, &j).await, Ok(vec!["a".to_owned(), "b".to_owned()]));
    std::fs::write(&file, "steps: [not, a, mapping\n").unwrap();
    assert_eq!(loaded_steps(&rt, &j).await, Err(Reason::InvalidWorkflow));
    std::fs::write(&file, format!("steps:\n{}", step("c"))).unwrap();
    assert_eq!(loaded_steps(&rt, &j).await, Ok(vec!["c".to_owned()]));
}

/// A workflow that calls another is loaded afresh each time: the called file may change
/// without the caller's.
#[tokio::test]
async fn a_program_that_calls_another_workflow_is_not_kept() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let dir = h.dir.path().join("workflows");
    std::fs::write(dir.join("outer.yaml"), "steps:\n  inner:\n    call: inner\n").unwrap();
    std::fs::write(
        dir.join("inner.yaml"),
        "steps:\n  a:\n    resource: Null::Resource\n    value: {input: x}\n",
    )
    .unwrap();
    let j = job("outer", "outer", 1, json!({}));
    assert_eq!(loaded_steps(&rt, &j).await, Ok(vec!["inner".to_owned()]));
    assert!(!rt.programs.lock().unwrap().contains_key("outer"));
    std::fs::write(dir.join("inner.yaml"), "steps:\n  a:\n    resource: No::Such\n").unwrap();
    assert_eq!(loaded_steps(&rt, &j).await, Err(Reason::InvalidWorkflow));
}

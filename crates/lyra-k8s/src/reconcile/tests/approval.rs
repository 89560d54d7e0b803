//! `approval: Manual`: a plan that changes something waits for an approval of its hash.

use super::*;
use crate::crd::APPROVE_PLAN;
use crate::status::AWAITING_APPROVAL;

fn manual(name: &str, generation: i64, data: Value) -> Job {
    Job {
        approval: Approval::Manual,
        ..job(name, "pair", generation, data)
    }
}

fn approving(j: &Job, hash: &str) -> Job {
    Job {
        approved: Some(hash.to_owned()),
        ..j.clone()
    }
}

async fn resources(h: &Harness, deployment: &str) -> usize {
    h.store.load(deployment).await.unwrap().map_or(0, |s| s.resources.len())
}

fn awaiting(s: &WorkflowStatus) -> (&str, &str) {
    let c = condition(s, AWAITING_APPROVAL).expect("an AwaitingApproval condition");
    (c.status.as_str(), c.reason.as_str())
}

#[tokio::test]
async fn a_manual_plan_waits_and_its_approved_hash_is_applied() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = manual("m", 1, json!({"greeting": "hi"}));
    assert_eq!(
        rt.apply(&j, None, &r).await.unwrap(),
        Next::Requeue(rt.settings.idle_requeue)
    );
    let s = r.last();
    // Nothing applied, nothing recorded: a plan is not a run.
    assert_eq!(resources(&h, "k8s/ns/m").await, 0);
    assert!(h.store.history("k8s/ns/m").await.unwrap().is_empty());
    assert_eq!(h.store.lease("k8s/ns/m").await.unwrap(), None);
    assert_eq!(awaiting(&s), ("True", "PlanReady"));
    assert!(!is_true(&s, READY) && !is_true(&s, STALLED), "{s:?}");
    assert_eq!(s.phase, Some(Phase::Pending));
    let plan = s.plan.clone().expect("status.plan");
    assert!(
        plan.hash.starts_with("sha256:") && plan.hash.len() == 7 + 64,
        "{}",
        plan.hash
    );
    assert_eq!((plan.create, plan.update, plan.delete), (2, 0, 0));
    assert_eq!(plan.generation, Some(1));
    let steps: Vec<(&str, &str)> = plan
        .changes
        .iter()
        .map(|c| (c.step.as_str(), c.action.as_str()))
        .collect();
    assert_eq!(steps, [("first", "create"), ("second", "create")]);
    assert!(
        plan.changes[0]
            .attributes
            .iter()
            .any(|a| a.path == "input" && a.new.as_deref() == Some("\"hi\"")),
        "{plan:?}"
    );
    let message = &condition(&s, AWAITING_APPROVAL).unwrap().message;
    assert!(
        message.contains("2 to create") && message.contains(APPROVE_PLAN),
        "{message}"
    );
    assert_eq!(r.reasons(), ["PlanReady"]);

    // Looked at again, here or after a restart: the same plan, so nothing new is written.
    let writes = r.writes();
    rt.apply(&j, Some(&s), &r).await.unwrap();
    h.runtime().apply(&j, Some(&s), &r).await.unwrap();
    assert_eq!(r.writes(), writes);
    assert_eq!(r.reasons(), ["PlanReady"]);

    // An approval of another hash applies nothing.
    rt.apply(&approving(&j, "sha256:0000"), Some(&s), &r).await.unwrap();
    assert_eq!(resources(&h, "k8s/ns/m").await, 0);
    assert_eq!(awaiting(&r.last()), ("True", "ApprovalStale"));
    assert_eq!(r.last().plan.unwrap().hash, plan.hash, "the plan itself did not move");

    // The approval of this plan's hash applies it.
    let approved = approving(&j, &plan.hash);
    rt.apply(&approved, Some(&r.last()), &r).await.unwrap();
    let s = r.last();
    assert_eq!(resources(&h, "k8s/ns/m").await, 2);
    assert!(is_true(&s, READY), "{s:?}");
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(awaiting(&s), ("False", "Applied"));
    assert_eq!(s.plan, None);
    assert_eq!(s.applied_plan.as_deref(), Some(plan.hash.as_str()));
    assert_eq!(s.returns, Some(json!({"echoed": "hi"})));

    // Applied: the approval that stays on the object runs nothing more.
    let writes = r.writes();
    rt.apply(&approved, Some(&s), &r).await.unwrap();
    h.runtime().apply(&approved, Some(&s), &r).await.unwrap();
    assert_eq!(r.writes(), writes);
    assert_eq!(h.store.history("k8s/ns/m").await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_approval_goes_stale_when_the_spec_moves() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = manual("m", 1, json!({"greeting": "hi"}));
    rt.apply(&j, None, &r).await.unwrap();
    let old = r.last().plan.unwrap().hash;

    // The spec changed after the plan was shown: the approval names the old plan.
    let moved = approving(&manual("m", 2, json!({"greeting": "bye"})), &old);
    rt.apply(&moved, Some(&r.last()), &r).await.unwrap();
    let s = r.last();
    assert_eq!(resources(&h, "k8s/ns/m").await, 0);
    assert_eq!(awaiting(&s), ("True", "ApprovalStale"));
    let new = s.plan.clone().unwrap();
    assert_ne!(new.hash, old);
    assert_eq!(new.generation, Some(2));
    assert!(s.message.as_deref().unwrap().contains("another plan"), "{s:?}");
    assert_eq!(r.reasons(), ["PlanReady", "ApprovalStale"]);
    assert!(r.notes.lock().unwrap()[1].warning);

    // The new hash applies it.
    rt.apply(&approving(&moved, &new.hash), Some(&s), &r).await.unwrap();
    assert!(is_true(&r.last(), READY));
    assert_eq!(r.last().returns, Some(json!({"echoed": "bye"})));
}

#[tokio::test]
async fn an_approval_goes_stale_when_the_state_moves() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    let j = manual("m", 1, json!({"greeting": "hi"}));
    rt.apply(&j, None, &r).await.unwrap();
    let old = r.last().plan.unwrap().hash;

    // Meanwhile someone else applies to the deployment (as `lyra apply --name` would).
    let other = Recorded::default();
    let elsewhere = Job {
        uid: Some("someone-else".into()),
        ..job("m", "pair", 1, json!({"greeting": "other"}))
    };
    rt.apply(&elsewhere, None, &other).await.unwrap();
    assert!(is_true(&other.last(), READY));

    // The approval of the plan made before that applies nothing: the plan is another now.
    rt.apply(&approving(&j, &old), Some(&r.last()), &r).await.unwrap();
    let s = r.last();
    assert_eq!(awaiting(&s), ("True", "ApprovalStale"));
    let new = s.plan.unwrap();
    assert_ne!(new.hash, old);
    assert!(new.create == 0 && new.update > 0, "{new:?}");
    let state = h.store.load("k8s/ns/m").await.unwrap().unwrap();
    assert!(
        state.resources.iter().all(|r| r.desired["input"] != json!("hi")),
        "nothing of the stale plan was applied"
    );
}

#[tokio::test]
async fn a_plan_without_changes_needs_no_approval() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    rt.apply(&job("m", "pair", 1, json!({"greeting": "hi"})), None, &r)
        .await
        .unwrap();
    // Switched to Manual with nothing to change: applied (a no-op) and Ready as usual.
    rt.apply(&manual("m", 2, json!({"greeting": "hi"})), Some(&r.last()), &r)
        .await
        .unwrap();
    let s = r.last();
    assert!(is_true(&s, READY), "{s:?}");
    assert_eq!(s.observed_generation, Some(2));
    assert!(condition(&s, AWAITING_APPROVAL).is_none());
    assert_eq!(s.plan, None);
    assert!(!r.reasons().iter().any(|n| n == "PlanReady"));
}

#[tokio::test]
async fn cleanup_is_not_gated() {
    let h = Harness::new().await;
    let rt = h.runtime();
    let r = Recorded::default();
    rt.apply(&job("m", "pair", 1, json!({"greeting": "hi"})), None, &r)
        .await
        .unwrap();
    let j = manual("m", 2, json!({"greeting": "bye"}));
    rt.apply(&j, Some(&r.last()), &r).await.unwrap();
    assert_eq!(awaiting(&r.last()), ("True", "PlanReady"));
    assert_eq!(rt.cleanup(&j, Some(&r.last()), &r).await.unwrap(), Next::Done);
    assert_eq!(resources(&h, "k8s/ns/m").await, 0);
}

const SECRET: &str = "\
parameters:
  password: {type: 'Sensitive[String]', lookup: password}
steps:
  db:
    resource: Null::Resource
    value: {input: $password}
";

#[tokio::test]
async fn the_plan_in_the_status_holds_no_secret_and_its_hash_depends_on_it() {
    let h = Harness::new().await;
    std::fs::write(h.dir.path().join("workflows/secret.yaml"), SECRET).unwrap();
    let rt = h.runtime();
    let with = |name: &str, password: &str| Job {
        approval: Approval::Manual,
        ..job(name, "secret", 1, json!({"password": password}))
    };
    let r = Recorded::default();
    rt.apply(&with("a", "hunter2-first"), None, &r).await.unwrap();
    let first = r.last();
    // Another controller (no memo of the first plan) plans the same object with another
    // secret, against the same (empty) state.
    let r2 = Recorded::default();
    h.runtime()
        .apply(&with("a", "hunter2-second"), None, &r2)
        .await
        .unwrap();
    let second = r2.last();
    let (p1, p2) = (first.plan.clone().unwrap(), second.plan.clone().unwrap());
    // The same masked plan, yet another hash: the secret counts, through the keyed digest.
    assert_eq!(p1.changes, p2.changes);
    assert_eq!(p1.changes[0].attributes[0].new.as_deref(), Some("(sensitive)"));
    assert_ne!(p1.hash, p2.hash);
    for (s, r) in [(&first, &r), (&second, &r2)] {
        let text = serde_json::to_string(s).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        for n in r.notes.lock().unwrap().iter() {
            assert!(!n.message.contains("hunter2"), "{n:?}");
        }
    }
}

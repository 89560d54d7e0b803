use k8s_openapi::jiff::Timestamp;
use lyra_core::report::{Mode, StepReport};
use lyra_core::state::Outcome;
use serde_json::json;

use super::*;
use crate::reason::Reason;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + secs).unwrap())
}

fn cond<'a>(s: &'a WorkflowStatus, t: &str) -> &'a Condition {
    condition(s, t).unwrap_or_else(|| panic!("no {t} condition"))
}

#[test]
fn transition_time_moves_only_when_the_status_flips() {
    let mut s = WorkflowStatus::default();
    judge(&mut s, &Verdict::Running { deleting: false }, Some(1), &at(0));
    assert_eq!(s.phase, Some(Phase::Applying));
    assert_eq!(cond(&s, READY).status, "False");
    assert_eq!(cond(&s, RECONCILING).status, "True");
    judge(&mut s, &Verdict::Applied, Some(1), &at(10));
    assert_eq!(cond(&s, READY).status, "True");
    assert_eq!(cond(&s, READY).last_transition_time, at(10));
    // Stalled was False before and after: its time stays.
    assert_eq!(cond(&s, STALLED).last_transition_time, at(0));
    assert_eq!(cond(&s, STALLED).reason, "Applied");
    for c in &s.conditions {
        assert_eq!(c.observed_generation, Some(1), "{}", c.type_);
    }
    assert_eq!(s.observed_generation, Some(1));
}

#[test]
fn a_refresh_run_keeps_ready_but_a_new_generation_does_not() {
    let mut s = WorkflowStatus::default();
    judge(&mut s, &Verdict::Applied, Some(1), &at(0));
    judge(&mut s, &Verdict::Running { deleting: false }, Some(1), &at(5));
    assert_eq!(
        cond(&s, READY).status,
        "True",
        "same generation: still ready while re-applying"
    );
    judge(&mut s, &Verdict::Applied, Some(1), &at(6));
    judge(&mut s, &Verdict::Running { deleting: false }, Some(2), &at(7));
    assert_eq!(cond(&s, READY).status, "False", "a new spec is not ready until applied");
    assert_eq!(cond(&s, READY).observed_generation, Some(2));
}

#[test]
fn stalled_and_retrying_are_told_apart() {
    let mut s = WorkflowStatus::default();
    let stalled = Verdict::Stalled {
        reason: Reason::InvalidData,
        message: "wf.yaml:3:4: bad\nwf.yaml:5:1: worse (help: fix it)".into(),
        phase: Phase::Failed,
    };
    judge(&mut s, &stalled, Some(3), &at(0));
    assert_eq!(cond(&s, STALLED).status, "True");
    assert_eq!(cond(&s, RECONCILING).status, "False");
    assert_eq!(cond(&s, READY).reason, "InvalidData");
    assert!(cond(&s, STALLED).message.contains("worse"));
    assert_eq!(s.message.as_deref(), Some("wf.yaml:3:4: bad …"));
    let retrying = Verdict::Retrying {
        reason: Reason::ApplyFailed,
        message: "step db: boom".into(),
        phase: Phase::Failed,
    };
    judge(&mut s, &retrying, Some(3), &at(1));
    assert_eq!(cond(&s, STALLED).status, "False");
    assert_eq!(cond(&s, RECONCILING).status, "True");
    assert_eq!(cond(&s, READY).message, "step db: boom");
}

#[test]
fn suspended_keeps_phase_and_readiness() {
    let mut s = WorkflowStatus::default();
    judge(&mut s, &Verdict::Applied, Some(1), &at(0));
    judge(&mut s, &Verdict::Suspended, Some(2), &at(1));
    assert_eq!(s.phase, Some(Phase::Ready));
    assert_eq!(cond(&s, READY).status, "True");
    assert_eq!(cond(&s, RECONCILING).reason, "Suspended");
    let mut fresh = WorkflowStatus::default();
    judge(&mut fresh, &Verdict::Suspended, Some(1), &at(0));
    assert_eq!(fresh.phase, Some(Phase::Pending));
    assert_eq!(cond(&fresh, READY).status, "False");
}

fn step(id: &str, action: Action, status: Status, error: Option<&str>) -> StepReport {
    StepReport {
        id: id.into(),
        type_name: Some("Null::Resource".into()),
        action,
        status,
        external_id: (status == Status::Done).then(|| format!("null-{id}")),
        duration: std::time::Duration::ZERO,
        error: error.map(str::to_owned),
        changes: vec![],
        refused: false,
    }
}

fn report(steps: Vec<StepReport>) -> Report {
    Report {
        mode: Mode::Apply,
        deployment: "k8s/ns/x".into(),
        workflow: Some("x".into()),
        outcome: Outcome::Failed,
        run: Some(7),
        returns: serde_json::Map::new(),
        sensitive_returns: vec![],
        steps,
        counts: ChangeCounts::default(),
        duration: std::time::Duration::ZERO,
    }
}

#[test]
fn step_rows_are_sorted_count_attempts_and_drop_deleted_resources() {
    let r1 = report(vec![
        step("b", Action::Create, Status::Failed, Some("boom")),
        step("a", Action::Create, Status::Done, None),
        step("c", Action::Create, Status::Skipped, Some("depends on b")),
        step("gone", Action::Delete, Status::Done, None),
    ]);
    let rows = step_rows(&[], &r1);
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!((rows[1].state.as_str(), rows[1].attempts), ("failed", 1));
    assert_eq!(rows[1].last_error.as_deref(), Some("boom"));
    assert_eq!(rows[2].attempts, 0);
    assert_eq!(progress(&rows), "1/3");
    assert_eq!(first_failure(&r1).as_deref(), Some("step b: boom"));

    let r2 = report(vec![
        step("a", Action::Noop, Status::Done, None),
        step("b", Action::Create, Status::Done, None),
        step("c", Action::Create, Status::Done, None),
    ]);
    let rows = step_rows(&rows, &r2);
    assert_eq!(rows[0].attempts, 1, "a no-op after a success is still its first try");
    assert_eq!(rows[1].attempts, 2, "b succeeded on its second try");
    assert_eq!(rows[1].last_error, None);
    assert_eq!(progress(&rows), "3/3");
}

#[test]
fn guarded_off_steps_are_not_counted_as_work() {
    let r = report(vec![
        step("a", Action::Create, Status::Done, None),
        step("cache", Action::Noop, Status::GuardedOff, None),
    ]);
    assert_eq!(progress(&step_rows(&[], &r)), "1/1");
}

#[test]
fn sensitive_returns_are_masked() {
    let mut r = report(vec![]);
    r.returns.insert("password".into(), json!("hunter2"));
    r.returns.insert("host".into(), json!("db"));
    r.sensitive_returns = vec!["password".into()];
    assert_eq!(
        masked_returns(&r),
        Some(json!({"password": "(sensitive)", "host": "db"}))
    );
    assert_eq!(masked_returns(&report(vec![])), None);
}

#[test]
fn merge_patches_carry_only_changes_and_null_out_removed_fields() {
    let old = json!({"phase": "Applying", "leaseHolder": "controller/ns/x", "returns": {"a": 1, "b": 2}, "steps": [1]});
    let new = json!({"phase": "Ready", "returns": {"a": 1}, "steps": [1]});
    assert_eq!(
        merge_patch(&old, &new),
        Some(json!({"phase": "Ready", "leaseHolder": null, "returns": {"b": null}}))
    );
    assert_eq!(merge_patch(&new, &new), None);
    assert_eq!(merge_patch(&json!({}), &new), Some(new.clone()));
}

#[test]
fn changes_text_leaves_out_zeros() {
    let c = ChangeCounts {
        created: 2,
        deleted: 1,
        unchanged: 5,
        ..ChangeCounts::default()
    };
    assert_eq!(changes_text(&c), "created 2, deleted 1");
    assert_eq!(changes_text(&ChangeCounts::default()), "no changes");
}

#[test]
fn texts_are_clipped_to_a_byte_budget() {
    assert_eq!(clip("short", 10), "short");
    let clipped = clip(&"é".repeat(1000), 1024);
    assert!(clipped.len() <= 1024 && clipped.ends_with('…'), "{}", clipped.len());
    let many: String = (0..1000).map(|i| format!("wf.yaml:{i}:1: problem {i}\n")).collect();
    let clipped = clip_lines(&many, 4096);
    assert!(clipped.len() <= 4096, "{}", clipped.len());
    assert!(clipped.starts_with("wf.yaml:0:1: problem 0\nwf.yaml:1:1"), "{clipped}");
    assert!(clipped.ends_with("more line(s)"), "{clipped}");
    let one_long = "x".repeat(10_000);
    assert!(clip_lines(&one_long, 4096).len() <= 4096);
}

#[test]
fn returns_beyond_the_budget_are_named_not_stored() {
    let mut r = report(vec![]);
    r.returns.insert("a_small".into(), json!("x"));
    r.returns.insert("big".into(), json!("y".repeat(RETURNS_BUDGET)));
    r.returns.insert("password".into(), json!("z".repeat(RETURNS_BUDGET)));
    r.returns.insert("z_small".into(), json!(42));
    r.sensitive_returns = vec!["password".into()];
    let (kept, omitted) = fit_returns(&r, RETURNS_BUDGET);
    let kept = kept.unwrap();
    assert_eq!(
        kept,
        json!({"a_small": "x", "password": "(sensitive)", "z_small": 42}),
        "a masked secret is small"
    );
    assert!(serde_json::to_vec(&kept).unwrap().len() <= RETURNS_BUDGET);
    assert_eq!(omitted, ["big"]);

    let mut s = WorkflowStatus {
        deployment: Some("k8s/ns/x".into()),
        returns_omitted: omitted,
        ..WorkflowStatus::default()
    };
    judge(&mut s, &Verdict::Applied, Some(1), &at(0));
    let m = &cond(&s, READY).message;
    assert!(
        m.starts_with("applied; returns left out of the status (over its 64 KiB budget): big")
            && m.contains("lyra state show k8s/ns/x"),
        "{m}"
    );
    // Nothing left out: the plain message.
    s.returns_omitted.clear();
    judge(&mut s, &Verdict::Applied, Some(1), &at(1));
    assert_eq!(cond(&s, READY).message, "applied");
}

#[test]
fn step_rows_beyond_the_budget_keep_failures_first() {
    let error = "e".repeat(5000);
    let mut steps: Vec<StepReport> = (0..2000)
        .map(|i| step(&format!("s{i:04}"), Action::Create, Status::Done, None))
        .collect();
    steps.push(step("zz-failed", Action::Create, Status::Failed, Some(&error)));
    let rows = step_rows(&[], &report(steps));
    let failed = rows.iter().find(|r| r.name == "zz-failed").unwrap();
    assert!(failed.last_error.as_ref().unwrap().len() <= STEP_ERROR_LIMIT);
    assert_eq!(progress(&rows), "2000/2001");
    let (kept, omitted) = fit_rows(rows, STEP_ROWS_BUDGET);
    assert!(serde_json::to_vec(&kept).unwrap().len() <= STEP_ROWS_BUDGET);
    assert!(omitted > 0 && kept.len() + omitted == 2001);
    assert!(kept.iter().any(|r| r.name == "zz-failed"), "failures are kept");
    assert!(kept.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
    let (all, none) = fit_rows(kept.clone(), STEP_ROWS_BUDGET);
    assert_eq!((all, none), (kept, 0));
}

#[test]
fn awaiting_approval_is_not_ready_and_any_other_verdict_settles_it() {
    let mut s = WorkflowStatus::default();
    judge(&mut s, &Verdict::Applied, Some(1), &at(0));
    s.plan = Some(crate::crd::PlanStatus {
        hash: "sha256:ab".into(),
        ..Default::default()
    });
    let waiting = Verdict::AwaitingApproval {
        reason: Reason::PlanReady,
        message: "plan sha256:ab awaits approval".into(),
    };
    judge(&mut s, &waiting, Some(2), &at(5));
    assert_eq!(s.phase, Some(Phase::Pending));
    let c = cond(&s, AWAITING_APPROVAL);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "PlanReady"));
    assert_eq!(cond(&s, READY).status, "False");
    assert_eq!(cond(&s, RECONCILING).status, "True");
    assert_eq!(cond(&s, STALLED).status, "False");
    assert!(s.plan.is_some(), "the plan stays while it waits");
    // Waiting for the lease leaves the plan where it is.
    judge(
        &mut s,
        &Verdict::WaitingForLease {
            message: "held".into(),
            deleting: false,
        },
        Some(2),
        &at(6),
    );
    assert!(s.plan.is_some() && cond(&s, AWAITING_APPROVAL).status == "True");
    // The approved run, then the apply: no plan waits any more.
    judge(&mut s, &Verdict::Running { deleting: false }, Some(2), &at(7));
    assert_eq!(s.plan, None);
    assert_eq!(
        (
            cond(&s, AWAITING_APPROVAL).status.as_str(),
            cond(&s, AWAITING_APPROVAL).reason.as_str()
        ),
        ("False", "Approved")
    );
    judge(&mut s, &Verdict::Applied, Some(2), &at(9));
    assert_eq!(cond(&s, AWAITING_APPROVAL).reason, "Applied");
    assert_eq!(cond(&s, AWAITING_APPROVAL).last_transition_time, at(7));
    // An object that never waited has no such condition.
    let mut fresh = WorkflowStatus::default();
    judge(&mut fresh, &Verdict::Applied, Some(1), &at(0));
    assert!(condition(&fresh, AWAITING_APPROVAL).is_none());
}

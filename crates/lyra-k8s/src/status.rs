//! Computing a Workflow's status: kstatus conditions, phase, message, step rows. Pure
//! functions of the previous status and what happened, so they are tested without a cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use lyra_core::engine::{DriftReport, DriftStatus};
use lyra_core::report::{Action, Report, Status};
use lyra_core::state::ChangeCounts;
use serde_json::Value;

use crate::crd::{Phase, StepStatus, WorkflowStatus};
use crate::reason::Reason;

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
/// `driftPolicy: Report`: whether a resource changed outside Lyra (see [`drift`]).
pub const DRIFTED: &str = "Drifted";
pub use crate::crd::AWAITING_APPROVAL;

// What the status may hold. An object is limited to about 1.5 MiB (etcd's request limit), and
// the status shares it with the spec; these keep the status at a few hundred KiB whatever
// the workflow returns or however many steps it has. What is left out is said in the status.
/// The workflow's returns, serialized.
pub const RETURNS_BUDGET: usize = 64 * 1024;
/// The step rows, serialized.
pub const STEP_ROWS_BUDGET: usize = 128 * 1024;
/// One step's error.
pub const STEP_ERROR_LIMIT: usize = 1024;
/// One condition's message (all the diagnostics of an invalid workflow, say).
pub const CONDITION_MESSAGE_LIMIT: usize = 4 * 1024;

/// How a reconcile left the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A run (`apply` or `delete`) is in progress.
    Running { deleting: bool },
    /// The workflow is applied as specified.
    Applied,
    /// Failed; will be retried by itself.
    Retrying {
        reason: Reason,
        message: String,
        phase: Phase,
    },
    /// Failed in a way retrying cannot fix: waits for a spec change.
    Stalled {
        reason: Reason,
        message: String,
        phase: Phase,
    },
    /// Another holder has the deployment's lease; the run starts when it expires or is
    /// released. Not a failure: an applied object stays `Ready` meanwhile.
    WaitingForLease { message: String, deleting: bool },
    /// `spec.suspend` is true.
    Suspended,
    /// `approval: Manual` and the plan (in `status.plan`) changes something: nothing is
    /// applied until it is approved. `reason` is `PlanReady` or `ApprovalStale`.
    AwaitingApproval { reason: Reason, message: String },
}

/// Applies `verdict` to `status` for `generation`: conditions (with `lastTransitionTime`
/// moved only when a condition's status flips), phase, message and observed generation.
pub fn judge(status: &mut WorkflowStatus, verdict: &Verdict, generation: Option<i64>, now: &Time) {
    let ready_before = is_true(status, READY);
    let same_generation = status.observed_generation == generation && status.observed_generation.is_some();
    let left_out = omissions(status);
    let mut set = |type_: &str, value: bool, reason: Reason, message: &str| {
        set_condition(
            &mut status.conditions,
            type_,
            value,
            reason.as_str(),
            message,
            generation,
            now,
        );
    };
    let (phase, message) = match verdict {
        Verdict::Running { deleting: false } => {
            let message = "applying the workflow".to_owned();
            // A periodic re-apply of an unchanged, ready object keeps it Ready; a new spec is
            // not ready until applied (so `kubectl wait --for=condition=Ready` waits for it).
            if !(ready_before && same_generation) {
                set(READY, false, Reason::Progressing, &message);
            }
            set(RECONCILING, true, Reason::Applying, &message);
            set(STALLED, false, Reason::Applying, "");
            (Phase::Applying, message)
        }
        Verdict::Running { deleting: true } => {
            let message = "deleting the resources".to_owned();
            set(READY, false, Reason::Deleting, &message);
            set(RECONCILING, true, Reason::Deleting, &message);
            set(STALLED, false, Reason::Deleting, "");
            (Phase::Deleting, message)
        }
        Verdict::Applied => {
            let message = match &left_out {
                Some(left_out) => format!("applied; {left_out}"),
                None => "applied".to_owned(),
            };
            set(READY, true, Reason::Applied, &message);
            set(RECONCILING, false, Reason::Applied, "");
            set(STALLED, false, Reason::Applied, "");
            (Phase::Ready, message)
        }
        Verdict::Retrying { reason, message, phase } => {
            set(READY, false, *reason, message);
            set(RECONCILING, true, *reason, message);
            set(STALLED, false, *reason, "");
            (*phase, message.clone())
        }
        Verdict::Stalled { reason, message, phase } => {
            set(READY, false, *reason, message);
            set(RECONCILING, false, *reason, "");
            set(STALLED, true, *reason, message);
            (*phase, message.clone())
        }
        Verdict::WaitingForLease { message, deleting } => {
            let keeps_ready = ready_before && same_generation && !deleting;
            if !keeps_ready {
                set(READY, false, Reason::Locked, message);
            }
            set(RECONCILING, true, Reason::Locked, message);
            set(STALLED, false, Reason::Locked, "");
            let phase = match (deleting, keeps_ready) {
                (true, _) => Phase::Deleting,
                (false, true) => Phase::Ready,
                (false, false) => Phase::Pending,
            };
            (phase, message.clone())
        }
        Verdict::AwaitingApproval { reason, message } => {
            // Not ready (the spec is not applied) and still in progress: it moves once a
            // person approves, so `kubectl wait --for=condition=Ready` keeps waiting.
            set(READY, false, *reason, message);
            set(RECONCILING, true, *reason, message);
            set(STALLED, false, *reason, "");
            set(AWAITING_APPROVAL, true, *reason, message);
            (Phase::Pending, message.clone())
        }
        Verdict::Suspended => {
            let message = "suspended: nothing is applied while spec.suspend is true".to_owned();
            if !ready_before {
                set(READY, false, Reason::Suspended, &message);
            }
            set(RECONCILING, false, Reason::Suspended, &message);
            set(STALLED, false, Reason::Suspended, "");
            (status.phase.unwrap_or(Phase::Pending), message)
        }
    };
    settle_approval(status, verdict, generation, now);
    status.phase = Some(phase);
    status.message = Some(one_line(&message));
    status.observed_generation = generation;
}

/// Outside `AwaitingApproval`, no plan waits: the condition (if the object ever had one)
/// turns False and `status.plan` goes. Waiting for the lease changes neither: the plan is
/// looked at again once the lease is had.
fn settle_approval(status: &mut WorkflowStatus, verdict: &Verdict, generation: Option<i64>, now: &Time) {
    let reason = match verdict {
        Verdict::AwaitingApproval { .. } | Verdict::WaitingForLease { .. } => return,
        Verdict::Running { deleting: false } => Reason::Approved,
        Verdict::Running { deleting: true } => Reason::Deleting,
        Verdict::Applied => Reason::Applied,
        Verdict::Retrying { reason, .. } | Verdict::Stalled { reason, .. } => *reason,
        Verdict::Suspended => Reason::Suspended,
    };
    status.plan = None;
    if condition(status, AWAITING_APPROVAL).is_some() {
        set_condition(
            &mut status.conditions,
            AWAITING_APPROVAL,
            false,
            reason.as_str(),
            "",
            generation,
            now,
        );
    }
}

/// What a drift check found, as the `Drifted` condition: True naming each drifted step and
/// the paths that differ (never their values: some are secret) and each gone one, False
/// when everything matches, Unknown when a resource could not be read. Returns the number
/// of drifted resources (gone ones included).
pub fn drift(status: &mut WorkflowStatus, report: &DriftReport, generation: Option<i64>, now: &Time) -> usize {
    let mut lines = Vec::new();
    let mut drifted = 0;
    let mut unread = Vec::new();
    for r in &report.resources {
        match r.status {
            DriftStatus::Drifted => {
                drifted += 1;
                let paths: Vec<&str> = r.changes.iter().map(|c| c.path.as_str()).collect();
                lines.push(format!("{} ({}): {}", r.step_id, r.type_name, paths.join(", ")));
            }
            DriftStatus::Gone => {
                drifted += 1;
                lines.push(format!("{} ({}): gone", r.step_id, r.type_name));
            }
            DriftStatus::Failed => unread.push(r.step_id.as_str()),
            DriftStatus::Unchanged | DriftStatus::Skipped => {}
        }
    }
    let (value, reason, message) = if drifted > 0 {
        let head = format!(
            "{drifted} of {} resources changed outside Lyra; nothing was changed (driftPolicy Report):",
            report.resources.len()
        );
        (Some(true), Reason::Drifted, format!("{head}\n{}", lines.join("\n")))
    } else if !unread.is_empty() {
        let message = format!("could not read {}: drift unknown", unread.join(", "));
        (None, Reason::DriftCheckFailed, message)
    } else {
        let message = format!("all {} resources match what was recorded", report.resources.len());
        (Some(false), Reason::NoDrift, message)
    };
    set_condition_status(
        &mut status.conditions,
        DRIFTED,
        value,
        reason.as_str(),
        &message,
        generation,
        now,
    );
    drifted
}

/// After an apply of the spec, nothing is drifted any more: a `Drifted` condition left by
/// an earlier check turns False.
pub fn drift_corrected(status: &mut WorkflowStatus, generation: Option<i64>, now: &Time) {
    if condition(status, DRIFTED).is_some() {
        set_condition(
            &mut status.conditions,
            DRIFTED,
            false,
            Reason::Applied.as_str(),
            "the last apply converged every resource to the spec",
            generation,
            now,
        );
    }
}

/// Sets one condition; `lastTransitionTime` changes only when its status does.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    set_condition_status(conditions, type_, Some(value), reason, message, generation, now);
}

/// [`set_condition`] that can also say `Unknown` (`None`).
fn set_condition_status(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: Option<bool>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = match value {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
    .to_owned();
    let message = clip_lines(message, CONDITION_MESSAGE_LIMIT);
    let new = |last_transition_time: Time| Condition {
        type_: type_.to_owned(),
        status: status.clone(),
        reason: reason.to_owned(),
        message: message.clone(),
        observed_generation: generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == status => *c = new(c.last_transition_time.clone()),
        Some(c) => *c = new(now.clone()),
        None => conditions.push(new(now.clone())),
    }
}

pub fn condition<'a>(status: &'a WorkflowStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(status: &WorkflowStatus, type_: &str) -> bool {
    condition(status, type_).is_some_and(|c| c.status == "True")
}

/// The status's one-line message: the first line, shortened (the full text is in the
/// conditions).
pub fn one_line(message: &str) -> String {
    let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    // Help text stays in the conditions; the one-liner is for `kubectl get`.
    let first = first.split(" (help: ").next().unwrap_or(first);
    let more = message.lines().filter(|l| !l.trim().is_empty()).count() > 1;
    let mut s: String = first.chars().take(200).collect();
    if more || first.chars().count() > 200 {
        s.push_str(" …");
    }
    s
}

/// `s`, shortened to at most `max` bytes (on a character boundary, ending in `…` when cut):
/// the API server counts the bytes of what it limits.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    const MORE: &str = "…";
    let mut cut = max.saturating_sub(MORE.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{MORE}", &s[..cut])
}

/// `s` shortened to at most `max` bytes at a line end, saying how many lines were left out
/// (a single line too long is clipped).
pub fn clip_lines(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let lines: Vec<&str> = s.lines().collect();
    let mut kept = String::new();
    for (i, line) in lines.iter().enumerate() {
        let more = format!("\n… and {} more line(s)", lines.len() - i);
        let separator = if i == 0 { 0 } else { 1 };
        if kept.len() + separator + line.len() + more.len() > max {
            if i == 0 {
                return clip(line, max);
            }
            kept.push_str(&more);
            return kept;
        }
        if i > 0 {
            kept.push('\n');
        }
        kept.push_str(line);
    }
    kept
}

/// What the status leaves out to stay small, for the `Ready` message: `None` when nothing.
fn omissions(status: &WorkflowStatus) -> Option<String> {
    let mut parts = Vec::new();
    if !status.returns_omitted.is_empty() {
        parts.push(format!(
            "returns left out of the status (over its {} KiB budget): {}",
            RETURNS_BUDGET / 1024,
            status.returns_omitted.join(", ")
        ));
    }
    if status.steps_omitted > 0 {
        parts.push(format!(
            "{} step row(s) left out of the status (over its {} KiB budget)",
            status.steps_omitted,
            STEP_ROWS_BUDGET / 1024
        ));
    }
    if parts.is_empty() {
        return None;
    }
    let place = status
        .deployment
        .as_deref()
        .map(|d| format!("; every resource's values: lyra state show {d}"))
        .unwrap_or_default();
    Some(format!("{}{place}", parts.join("; ")))
}

/// The step rows after a run: one per resource step the run visited, sorted by name (the
/// report lists them in finishing order, which would change the status on every run).
/// Resources the run deleted are gone; `attempts` counts on from the previous rows.
pub fn step_rows(previous: &[StepStatus], report: &Report) -> Vec<StepStatus> {
    let mut rows: Vec<StepStatus> = report
        .steps
        .iter()
        .filter(|s| s.type_name.is_some() && s.action != Action::Group)
        .filter(|s| !(s.action == Action::Delete && s.status == Status::Done))
        .map(|s| {
            let before = previous.iter().find(|p| p.name == s.id);
            let attempts = match (s.status, before) {
                (Status::Done | Status::Failed, Some(b)) if b.state == "failed" => b.attempts.saturating_add(1),
                (Status::Done | Status::Failed, _) => 1,
                (_, Some(b)) => b.attempts,
                (_, None) => 0,
            };
            StepStatus {
                name: s.id.clone(),
                type_: s.type_name.clone(),
                external_id: s
                    .external_id
                    .clone()
                    .or_else(|| before.and_then(|b| b.external_id.clone())),
                last_action: Some(s.action.as_str().to_owned()),
                state: s.status.as_str().to_owned(),
                last_error: s.error.as_deref().map(|e| clip(e, STEP_ERROR_LIMIT)),
                attempts,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The rows that fit in `budget` bytes (serialized), failed ones first, the rest by name;
/// sorted by name, with how many were left out.
pub fn fit_rows(rows: Vec<StepStatus>, budget: usize) -> (Vec<StepStatus>, usize) {
    let size = |r: &StepStatus| serde_json::to_vec(r).map_or(0, |v| v.len() + 1);
    if rows.iter().map(size).sum::<usize>() <= budget {
        return (rows, 0);
    }
    let total = rows.len();
    let (failed, rest): (Vec<StepStatus>, Vec<StepStatus>) = rows.into_iter().partition(|r| r.state == "failed");
    let mut used = 0;
    let mut kept: Vec<StepStatus> = failed
        .into_iter()
        .chain(rest)
        .filter(|r| {
            let n = size(r);
            let fits = used + n <= budget;
            if fits {
                used += n;
            }
            fits
        })
        .collect();
    kept.sort_by(|a, b| a.name.cmp(&b.name));
    let omitted = total - kept.len();
    (kept, omitted)
}

/// `done/total` over the rows; steps whose `when` guard is off are not work to do.
pub fn progress(rows: &[StepStatus]) -> String {
    let total = rows.iter().filter(|r| r.state != "guarded-off").count();
    let done = rows.iter().filter(|r| r.state == "done").count();
    format!("{done}/{total}")
}

/// The workflow's returns with secrets masked, as many as fit in `budget` bytes (in name
/// order), and the names of those left out.
pub fn fit_returns(report: &Report, budget: usize) -> (Option<Value>, Vec<String>) {
    let Some(Value::Object(all)) = masked_returns(report) else {
        return (None, Vec::new());
    };
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    let mut used = 2;
    let mut kept = serde_json::Map::new();
    let mut omitted = Vec::new();
    for name in names {
        let n = serde_json::to_vec(&all[name.as_str()]).map_or(0, |v| v.len()) + name.len() + 4;
        if used + n <= budget {
            used += n;
            kept.insert(name.clone(), all[name.as_str()].clone());
        } else {
            omitted.push(name.clone());
        }
    }
    let kept = (!kept.is_empty()).then_some(Value::Object(kept));
    (kept, omitted)
}

/// The workflow's returns with secrets masked.
pub fn masked_returns(report: &Report) -> Option<Value> {
    if report.returns.is_empty() {
        return None;
    }
    let mut out = report.returns.clone();
    for name in &report.sensitive_returns {
        if let Some(v) = out.get_mut(name) {
            *v = Value::String("(sensitive)".to_owned());
        }
    }
    Some(Value::Object(out))
}

/// `created 2, updated 1, ...`, leaving out zeros (`no changes` when all are).
pub fn changes_text(c: &ChangeCounts) -> String {
    let parts: Vec<String> = [
        ("created", c.created),
        ("updated", c.updated),
        ("replaced", c.replaced),
        ("deleted", c.deleted),
        ("failed", c.failed),
        ("skipped", c.skipped),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(w, n)| format!("{w} {n}"))
    .collect();
    if parts.is_empty() {
        "no changes".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The first failed step's error, for the status message.
pub fn first_failure(report: &Report) -> Option<String> {
    let mut failed: Vec<_> = report
        .steps
        .iter()
        .filter(|s| s.status == Status::Failed && s.error.is_some())
        .collect();
    failed.sort_by(|a, b| a.id.cmp(&b.id));
    failed
        .first()
        .map(|s| format!("step {}: {}", s.id, s.error.as_deref().unwrap_or_default()))
}

/// A JSON merge patch (RFC 7386) turning `old` into `new`; `None` when they are equal.
///
/// Removed keys become `null`, so a merge patch clears them (on a real apiserver as on
/// emulators without server-side-apply field ownership). Lists are replaced whole.
pub fn merge_patch(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(p) = merge_patch(ov, nv) {
                            patch.insert(k.clone(), p);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Some(Value::Object(patch))
        }
        _ => Some(new.clone()),
    }
}

#[cfg(test)]
mod tests;

//! What a plan, an apply or a delete did (or would do), step by step. These are engine types;
//! the CLI and controller convert them to their own output shapes.

use std::time::Duration;

use crate::state::{ChangeCounts, Outcome};
use crate::value::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Plan,
    Apply,
    Delete,
}

/// What happens to one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Create,
    Update,
    /// Delete, then create: an immutable attribute changed.
    Replace,
    Delete,
    /// Read-only (`external_id`) resources.
    Read,
    /// Nothing to change.
    Noop,
    /// Dropped from the state without deleting (read-only resources).
    Forget,
    /// A collection, workflow or call step whose own action is its children's.
    Group,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Replace => "replace",
            Action::Delete => "delete",
            Action::Read => "read",
            Action::Noop => "no-op",
            Action::Forget => "forget",
            Action::Group => "group",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Planned, not run (plan mode).
    Planned,
    Done,
    Failed,
    /// Not run because something it depends on failed, or the run was cancelled.
    Skipped,
    /// Its `when` guard was false.
    GuardedOff,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Planned => "planned",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
            Status::GuardedOff => "guarded-off",
        }
    }
}

/// One attribute, or one value deep inside an attribute, that differs between the
/// recorded/actual and the desired state.
#[derive(Debug, Clone, PartialEq)]
pub struct AttrChange {
    /// The top-level attribute.
    pub attribute: String,
    /// Where inside it: `attribute` itself, or a path into it (`config.name`,
    /// `ports[0].port`, `labels["app.kubernetes.io/name"]`) when only part of an object or
    /// list changed. See [`crate::engine::change_paths`].
    pub path: String,
    /// `None`: the attribute is absent now.
    pub old: Option<Value>,
    /// `None`: known only after apply.
    pub new: Option<Value>,
    pub forces_replace: bool,
    pub sensitive: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Stable id within the deployment (`appServers/1`).
    pub id: String,
    /// Resource type, for resource steps.
    pub type_name: Option<String>,
    pub action: Action,
    pub status: Status,
    pub external_id: Option<String>,
    pub duration: Duration,
    /// Why it failed or was skipped, with the workflow location where there is one.
    pub error: Option<String>,
    pub changes: Vec<AttrChange>,
    /// The step failed because its provider refused it (bad provider settings, a provider
    /// disabled here, a value it cannot take): trying again unchanged cannot help.
    pub refused: bool,
}

/// The result of a plan, apply or delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub mode: Mode,
    pub deployment: String,
    pub workflow: Option<String>,
    pub outcome: Outcome,
    /// The run's id in the history; `None` for plans, which are not recorded.
    pub run: Option<crate::state::RunId>,
    /// The workflow's returns (apply; values not yet known in a plan are absent).
    pub returns: Map,
    /// The returns whose values are secret: printed as `(sensitive)`.
    pub sensitive_returns: Vec<String>,
    /// Every step, in the order they finished.
    pub steps: Vec<StepReport>,
    pub counts: ChangeCounts,
    pub duration: Duration,
}

impl Report {
    pub fn failed(&self) -> bool {
        self.outcome != Outcome::Succeeded
    }
}

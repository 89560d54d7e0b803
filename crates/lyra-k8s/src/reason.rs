//! Why a Workflow is where it is: the one list of reasons that its conditions, its events
//! and the failure metric use, and the one classification of failures into "retry" and
//! "wait for a change". Strings are made only at the edge ([`Reason::as_str`]), so status,
//! events and metrics cannot drift apart.

use std::fmt;

use lyra_core::engine::EngineError;
use lyra_host::LookupError;

use crate::retry::ErrorClass;

/// A condition's, an event's or a failure's reason (CamelCase on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // The life of a run.
    /// A new generation is being looked at (the `Ready` condition while a run goes on).
    Progressing,
    Applying,
    Applied,
    Deleting,
    Deleted,
    /// `deletionPolicy: Orphan`: the deployment was forgotten, its resources left in place.
    Orphaned,
    Suspended,
    /// Another holder has the deployment's lease: not a failure, the run waits for it.
    Locked,
    // Approval (`approval: Manual`).
    /// A plan that changes something waits for approval; nothing is applied.
    PlanReady,
    /// The approval names a plan that is no longer the plan: a new one waits instead.
    ApprovalStale,
    /// The approved plan is being (or was) applied.
    Approved,
    // Drift (`driftPolicy: Report`).
    /// A resource changed outside Lyra (or is gone); nothing was changed.
    Drifted,
    /// Every resource matches what was recorded.
    NoDrift,
    /// The drift check could not read every resource (retried at the next refresh).
    DriftCheckFailed,
    // What a run did to one resource (events).
    Created,
    Updated,
    Replaced,
    /// More resource changes than the per-run event cap.
    MoreChanges,
    // Failures. Each has a class: see [`Reason::class`].
    InvalidSpec,
    InvalidData,
    InvalidWorkflow,
    InvalidWorkflowName,
    WorkflowNotFound,
    WorkflowOutsideLoadPath,
    WorkflowUnreadable,
    StateUnavailable,
    /// The run stopped before its end: the controller shut down, or the lease was lost.
    Interrupted,
    ApplyFailed,
    /// Planning (for approval) failed: a provider read failed, say.
    PlanFailed,
    DeleteFailed,
    StepFailed,
    /// Every failed step was refused by its provider (bad provider settings, a provider this
    /// controller disables, a value it cannot take): stalled until the spec changes.
    ProviderRefused,
    // Registration (WorkflowDefinition).
    /// The generated kind is served.
    Registered,
    /// Deleting a definition waits for the objects of its kind to go.
    WaitingForInstances,
    /// The kind's CRD belongs to another definition (or is not Lyra's).
    KindTaken,
    /// The upgrade would break the kind's schema and is not allowed to.
    BreakingChange,
    /// The package cannot be read: a bad reference, not a package, an invalid workflow.
    InvalidPackage,
    /// The registry cannot be reached or refused (retried).
    PackageUnavailable,
    /// An object's input cannot be read yet: a Secret its spec names is missing (retried).
    InputUnavailable,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Progressing => "Progressing",
            Reason::Applying => "Applying",
            Reason::Applied => "Applied",
            Reason::Deleting => "Deleting",
            Reason::Deleted => "Deleted",
            Reason::Orphaned => "Orphaned",
            Reason::Suspended => "Suspended",
            Reason::Locked => "Locked",
            Reason::PlanReady => "PlanReady",
            Reason::ApprovalStale => "ApprovalStale",
            Reason::Approved => "Approved",
            Reason::Drifted => "Drifted",
            Reason::NoDrift => "NoDrift",
            Reason::DriftCheckFailed => "DriftCheckFailed",
            Reason::Created => "Created",
            Reason::Updated => "Updated",
            Reason::Replaced => "Replaced",
            Reason::MoreChanges => "MoreChanges",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidData => "InvalidData",
            Reason::InvalidWorkflow => "InvalidWorkflow",
            Reason::InvalidWorkflowName => "InvalidWorkflowName",
            Reason::WorkflowNotFound => "WorkflowNotFound",
            Reason::WorkflowOutsideLoadPath => "WorkflowOutsideLoadPath",
            Reason::WorkflowUnreadable => "WorkflowUnreadable",
            Reason::StateUnavailable => "StateUnavailable",
            Reason::Interrupted => "Interrupted",
            Reason::ApplyFailed => "ApplyFailed",
            Reason::PlanFailed => "PlanFailed",
            Reason::DeleteFailed => "DeleteFailed",
            Reason::StepFailed => "StepFailed",
            Reason::ProviderRefused => "ProviderRefused",
            Reason::Registered => "Registered",
            Reason::WaitingForInstances => "WaitingForInstances",
            Reason::KindTaken => "KindTaken",
            Reason::BreakingChange => "BreakingChange",
            Reason::InvalidPackage => "InvalidPackage",
            Reason::PackageUnavailable => "PackageUnavailable",
            Reason::InputUnavailable => "InputUnavailable",
        }
    }

    /// For a failure, whether trying again can help without anyone changing anything;
    /// `None` for the reasons that are not failures.
    pub const fn class(self) -> Option<ErrorClass> {
        match self {
            // Bad input stays bad until the spec (or a file on the load path) changes.
            Reason::InvalidSpec
            | Reason::InvalidData
            | Reason::InvalidWorkflow
            | Reason::InvalidWorkflowName
            | Reason::WorkflowNotFound
            | Reason::WorkflowOutsideLoadPath
            | Reason::WorkflowUnreadable
            | Reason::KindTaken
            | Reason::BreakingChange
            | Reason::ProviderRefused
            | Reason::InvalidPackage => Some(ErrorClass::Terminal),
            Reason::StateUnavailable
            | Reason::Interrupted
            | Reason::ApplyFailed
            | Reason::PlanFailed
            | Reason::DeleteFailed
            | Reason::StepFailed
            | Reason::PackageUnavailable
            | Reason::InputUnavailable => Some(ErrorClass::Retryable),
            Reason::Progressing
            | Reason::Applying
            | Reason::Applied
            | Reason::Deleting
            | Reason::Deleted
            | Reason::Orphaned
            | Reason::Suspended
            | Reason::Locked
            | Reason::PlanReady
            | Reason::ApprovalStale
            | Reason::Approved
            | Reason::Drifted
            | Reason::NoDrift
            | Reason::DriftCheckFailed
            | Reason::Created
            | Reason::Updated
            | Reason::Replaced
            | Reason::MoreChanges
            | Reason::Registered
            | Reason::WaitingForInstances => None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a reconcile did not get its workflow to where the spec asks, and what to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
}

impl Failure {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
        }
    }

    /// The state store failed (retried: it may come back).
    pub fn store(e: &impl fmt::Display) -> Self {
        Failure::new(Reason::StateUnavailable, format!("state store: {e}"))
    }

    /// A failure's class; a non-failure reason given here is treated as retryable, the
    /// cautious choice (it is retried rather than left alone).
    pub fn class(&self) -> ErrorClass {
        self.reason.class().unwrap_or(ErrorClass::Retryable)
    }
}

/// The reason of a workflow that could not be looked up on the load path.
pub fn lookup_reason(e: &LookupError) -> Reason {
    match e {
        LookupError::InvalidName { .. } => Reason::InvalidWorkflowName,
        LookupError::NotFound { .. } => Reason::WorkflowNotFound,
        LookupError::OutsideLoadPath { .. } => Reason::WorkflowOutsideLoadPath,
        LookupError::Read { .. } => Reason::WorkflowUnreadable,
    }
}

/// The reason of an engine error: bad input data cannot pass by itself; a state store
/// failure may.
pub fn engine_reason(e: &EngineError) -> Reason {
    match e {
        EngineError::Input(_) => Reason::InvalidData,
        EngineError::Store(_) => Reason::StateUnavailable,
    }
}

/// The class of an engine error (see [`engine_reason`]).
pub fn classify(e: &EngineError) -> ErrorClass {
    engine_reason(e).class().unwrap_or(ErrorClass::Retryable)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Reason; 32] = [
        Reason::Progressing,
        Reason::Applying,
        Reason::Applied,
        Reason::Deleting,
        Reason::Deleted,
        Reason::Orphaned,
        Reason::Suspended,
        Reason::Locked,
        Reason::Created,
        Reason::Updated,
        Reason::Replaced,
        Reason::MoreChanges,
        Reason::InvalidSpec,
        Reason::InvalidData,
        Reason::InvalidWorkflow,
        Reason::InvalidWorkflowName,
        Reason::WorkflowNotFound,
        Reason::WorkflowOutsideLoadPath,
        Reason::WorkflowUnreadable,
        Reason::StateUnavailable,
        Reason::Interrupted,
        Reason::ApplyFailed,
        Reason::DeleteFailed,
        Reason::StepFailed,
        Reason::ProviderRefused,
        Reason::PlanReady,
        Reason::ApprovalStale,
        Reason::Approved,
        Reason::PlanFailed,
        Reason::Drifted,
        Reason::NoDrift,
        Reason::DriftCheckFailed,
    ];

    #[test]
    fn wire_names_are_camel_case_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for r in ALL {
            let s = r.as_str();
            assert!(s.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{s}");
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert_eq!(format!("{r:?}"), s, "the wire name is the variant's name");
            assert!(seen.insert(s), "{s} twice");
        }
    }

    #[test]
    fn input_problems_are_terminal_and_progress_is_no_failure() {
        for r in ALL {
            let input =
                r.as_str().starts_with("Invalid") || r.as_str().starts_with("Workflow") || r == Reason::ProviderRefused;
            assert_eq!(r.class() == Some(ErrorClass::Terminal), input, "{r}");
        }
        for r in [
            Reason::Applied,
            Reason::Locked,
            Reason::Created,
            Reason::Suspended,
            Reason::PlanReady,
            Reason::ApprovalStale,
        ] {
            assert_eq!(r.class(), None, "{r}");
        }
        assert_eq!(Failure::new(Reason::Applied, "").class(), ErrorClass::Retryable);
    }
}

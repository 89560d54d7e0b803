//! State administration: the rules of repairing and moving recorded state, shared by the CLI
//! (`lyra state rm`, `unlock --force`, `import`, `migrate`) and whatever else edits a state.
//!
//! Every edit is kept in the deployment's history as a finished run with a note saying what
//! was done and by whom. Edits that change a deployment run under its lease (the caller takes
//! it, see [`crate::lease::run_under_lease`]) and write through the lease's recorder, so they
//! are fenced like any run.

use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, Recorder, RunEnd, RunStart, StoreError,
    UnreadableRecord,
};

use crate::{DeploymentExport, Lease, Store};

/// Why an administrative edit was not made.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The deployment is not recorded.
    #[error("no deployment {0:?}")]
    NotFound(String),
    /// A step to forget is not recorded (nor anything under it).
    #[error("deployment '{deployment}' has no step '{step}'")]
    NoSuchStep {
        deployment: String,
        step: String,
        /// Every recorded step id, readable or not.
        recorded: Vec<String>,
    },
    /// An import would overwrite a recorded deployment, and replacing was not asked for.
    #[error("deployment '{0}' already exists here")]
    Exists(String),
    /// The deployment has records that cannot be read: it cannot be moved whole. (The
    /// caller words the advice: `lyra_core::state::unreadable_message`.)
    #[error("deployment '{deployment}' has {} record(s) Lyra cannot read", unreadable.len())]
    Unreadable {
        deployment: String,
        unreadable: Vec<UnreadableRecord>,
    },
    /// A migrated copy does not match its source: the source is kept.
    #[error("deployment '{0}': the copy in the target differs from the source; the source is left as it was")]
    CopyDiffers(String),
}

/// Records a state edit in the history as a finished, succeeded run carrying `note`.
pub async fn record_edit(
    recorder: &dyn Recorder,
    deployment: &str,
    workflow: Option<String>,
    operation: Operation,
    actor: &str,
    changes: Vec<ChangeRecord>,
    note: String,
) -> Result<(), StoreError> {
    let run = recorder
        .begin_run(&RunStart {
            deployment: deployment.to_owned(),
            workflow,
            operation,
            actor: actor.to_owned(),
        })
        .await?;
    recorder
        .finish_run(
            run,
            &RunEnd {
                outcome: Outcome::Succeeded,
                counts: ChangeCounts::default(),
                changes,
                error: None,
                note: Some(note),
                returns: None,
            },
        )
        .await
}

/// The recorded step ids that `steps` name: each step, and every step under it
/// (`step/...`: iterations, calls), unreadable records included (forgetting is how they are
/// repaired). Sorted, without duplicates. Every named step must match something.
pub fn steps_to_forget(state: &DeploymentState, steps: &[String]) -> Result<Vec<String>, AdminError> {
    let recorded: Vec<&str> = state
        .resources
        .iter()
        .map(|r| r.step_id.as_str())
        .chain(state.unreadable.iter().map(|u| u.step_id.as_str()))
        .collect();
    let mut forget: Vec<String> = Vec::new();
    for step in steps {
        let under = format!("{step}/");
        let matched: Vec<&str> = recorded
            .iter()
            .copied()
            .filter(|id| id == step || id.starts_with(&under))
            .collect();
        if matched.is_empty() {
            return Err(AdminError::NoSuchStep {
                deployment: state.name.clone(),
                step: step.clone(),
                recorded: recorded.iter().map(|s| (*s).to_owned()).collect(),
            });
        }
        forget.extend(matched.into_iter().map(str::to_owned));
    }
    forget.sort();
    forget.dedup();
    Ok(forget)
}

/// Forgets the records of `steps` (as [`steps_to_forget`] finds them) without deleting their
/// resources, and notes it in the history. Returns what was forgotten. Run under the
/// deployment's lease, with its recorder; the state is read again under the lease.
pub async fn forget(
    recorder: &dyn Recorder,
    deployment: &str,
    steps: &[String],
    actor: &str,
) -> Result<Vec<String>, AdminError> {
    // It may have been dropped (migrated away) since the caller last looked.
    let Some(state) = recorder.load(deployment).await? else {
        return Err(AdminError::NotFound(deployment.to_owned()));
    };
    let forget = steps_to_forget(&state, steps)?;
    for step in &forget {
        recorder.remove_resource(deployment, step).await?;
    }
    let changes = forget
        .iter()
        .map(|s| ChangeRecord {
            step_id: s.clone(),
            action: "forget".to_owned(),
            error: None,
        })
        .collect();
    let note = format!("forgot {} resource(s) without deleting them", forget.len());
    record_edit(
        recorder,
        deployment,
        state.workflow.clone(),
        Operation::Forget,
        actor,
        changes,
        note,
    )
    .await?;
    Ok(forget)
}

/// What [`unlock`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlocked {
    /// The lease that was broken; `None` if there was none.
    pub lease: Option<Lease>,
    /// Whether the deployment is recorded; the broken lease is noted in its history only then
    /// (noting it would otherwise create the deployment: its first run never got that far).
    pub recorded: bool,
}

/// Breaks the deployment's lease, whoever holds it, and notes whose it was in the history.
pub async fn unlock(store: &dyn Store, deployment: &str, actor: &str) -> Result<Unlocked, StoreError> {
    let recorded = store.load(deployment).await?;
    let lease = store.break_lease(deployment).await?;
    if let (Some(lease), Some(state)) = (&lease, &recorded) {
        let note = format!("broke the lease: {}", crate::lease::describe(lease));
        record_edit(
            store,
            deployment,
            state.workflow.clone(),
            Operation::Unlock,
            actor,
            vec![],
            note,
        )
        .await?;
    }
    Ok(Unlocked {
        lease,
        recorded: recorded.is_some(),
    })
}

/// Notes in `deployment`'s history (when it has one) that `actor` took over the lease of
/// `ended`, a process that ended holding it, as [`unlock`] notes the leases it breaks.
pub async fn note_takeover(store: &dyn Store, deployment: &str, actor: &str, ended: &Lease) -> Result<(), StoreError> {
    // A deployment's first run takes the lease before anything is recorded: no history yet.
    let Some(last) = store.history(deployment).await?.into_iter().next() else {
        return Ok(());
    };
    let note = format!(
        "took over the lease of a process that ended on this machine: {}",
        crate::lease::describe(ended)
    );
    record_edit(store, deployment, last.workflow, Operation::Unlock, actor, vec![], note).await
}

/// A deployment's export, whole: refused when some of its records cannot be read (the copy
/// would lack them).
pub async fn export_whole(store: &dyn Store, deployment: &str) -> Result<DeploymentExport, AdminError> {
    let export = store
        .export(deployment)
        .await?
        .ok_or_else(|| AdminError::NotFound(deployment.to_owned()))?;
    if !export.state.unreadable.is_empty() {
        return Err(AdminError::Unreadable {
            deployment: deployment.to_owned(),
            unreadable: export.state.unreadable,
        });
    }
    Ok(export)
}

/// Writes an exported deployment into `store` (under its lease there, whose recorder is
/// `recorder`), refusing to overwrite a recorded one unless `replace`, and notes `source` in
/// its history.
pub async fn import(
    store: &dyn Store,
    recorder: &dyn Recorder,
    export: &DeploymentExport,
    replace: bool,
    actor: &str,
    source: &str,
) -> Result<(), AdminError> {
    let name = &export.state.name;
    if !replace && recorder.load(name).await?.is_some() {
        return Err(AdminError::Exists(name.clone()));
    }
    store.import(export).await?;
    record_edit(
        recorder,
        name,
        export.state.workflow.clone(),
        Operation::Import,
        actor,
        vec![],
        source.to_owned(),
    )
    .await?;
    Ok(())
}

/// The history note of a migration: where from, never the URL as given (it may hold a
/// password, and notes are exported and copied).
pub fn migration_note(from_url: &str, from: &dyn Store) -> String {
    format!(
        "migrated from {} (store {})",
        crate::redact_url(from_url),
        from.store_id()
    )
}

/// Checks a migrated copy against its source before the source is dropped: the same
/// resources, and at least the source's history.
pub async fn verify_copy(to: &dyn Store, source: &DeploymentExport) -> Result<(), AdminError> {
    let name = &source.state.name;
    let copy = to
        .export(name)
        .await?
        .ok_or_else(|| AdminError::NotFound(name.clone()))?;
    if copy.state.resources != source.state.resources || copy.history.len() < source.history.len() {
        return Err(AdminError::CopyDiffers(name.clone()));
    }
    Ok(())
}

//! `lyra state …` and `lyra history`: reading, repairing and moving the recorded state.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentExport, Operation, Outcome, ResourceRecord, RunEnd, RunStart, StateStore,
    StoreError, UnreadableRecord,
};
use lyra_providers::{ProvidersConfig, builtin};

use crate::args::{self, Output};
use crate::exit::Exit;
use crate::output::{self, lease_text, redact_url, time_text};
use crate::transfer::ExportFile;
use crate::{actor, json, locking, open_state, print, warn};

fn state_error(e: StoreError) -> Exit {
    Exit::failure(format!("state: {e}"))
}

pub async fn list(a: &args::StateArgs) -> Result<(), Exit> {
    let store = open_state(a.state.as_deref()).await?;
    let list = store.list().await.map_err(state_error)?;
    if a.output == Output::Json {
        return json(&list.iter().map(output::summary_json).collect::<Vec<_>>());
    }
    if list.is_empty() {
        warn("no deployments\n");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|d| {
            let (when, outcome) = d.last_run.as_ref().map_or(("-".to_owned(), "-".to_owned()), |r| {
                (
                    time_text(r.started_at),
                    format!(
                        "{} {}",
                        r.operation.as_str(),
                        r.outcome.map_or("unfinished", |o| o.as_str())
                    ),
                )
            });
            let lease = d
                .lease
                .as_ref()
                .map_or_else(|| "-".to_owned(), |l| format!("{} ({})", l.owner, l.operation));
            vec![
                d.name.clone(),
                d.workflow.clone().unwrap_or_default(),
                d.resources.to_string(),
                when,
                outcome,
                lease,
            ]
        })
        .collect();
    print(&output::table(
        &["DEPLOYMENT", "WORKFLOW", "RESOURCES", "LAST RUN", "OUTCOME", "LEASE"],
        &rows,
    ))
}

pub async fn show(a: &args::StateShowArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    let state = store
        .load(&a.deployment)
        .await
        .map_err(state_error)?
        .ok_or_else(|| Exit::failure(format!("no deployment '{}' in the state", a.deployment)))?;
    let lease = store.lease(&a.deployment).await.map_err(state_error)?;
    // Masking needs the provider schemas: which attributes are secret.
    let providers = builtin(&ProvidersConfig::default());
    let mask = |r: &ResourceRecord| lyra_core::secret::shown_state(r, providers.schemas().get(&r.type_name));
    let shown = output::state_json(&state, lease.as_ref(), &mask);
    // Records that cannot be read are shown for what they are: the rest is still usable.
    warn_unreadable(&state.name, &state.unreadable);
    if a.state.output == Output::Json {
        return json(&shown);
    }
    let rows: Vec<Vec<String>> = state
        .resources
        .iter()
        .map(|r| {
            let mode = match (r.pending, r.managed) {
                (true, _) => "pending",
                (false, true) => "managed",
                (false, false) => "read-only",
            };
            vec![
                r.step_id.clone(),
                r.type_name.clone(),
                r.external_id.clone(),
                mode.to_owned(),
                r.depends_on.join(","),
            ]
        })
        .collect();
    let lease_line = lease.map_or_else(String::new, |l| format!("locked: {}\n", lease_text(&l)));
    print(&format!(
        "deployment {} (workflow {})\n{lease_line}{}",
        state.name,
        state.workflow.as_deref().unwrap_or("-"),
        output::table(&["STEP", "TYPE", "EXTERNAL ID", "MODE", "DEPENDS ON"], &rows)
    ))
}

/// Names a deployment's unreadable records on stderr, with how to remove them.
fn warn_unreadable(deployment: &str, unreadable: &[UnreadableRecord]) {
    if !unreadable.is_empty() {
        warn(&format!(
            "warning: {}\n",
            lyra_core::state::unreadable_message(deployment, unreadable)
        ));
    }
}

pub async fn history(a: &args::HistoryArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    let runs = store.history(&a.deployment).await.map_err(state_error)?;
    if runs.is_empty() && store.load(&a.deployment).await.map_err(state_error)?.is_none() {
        return Err(Exit::failure(format!("no deployment '{}' in the state", a.deployment)));
    }
    if a.state.output == Output::Json {
        return json(&runs.iter().map(output::run_json).collect::<Vec<_>>());
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let c = &r.counts;
            let what = match (&r.note, &r.error) {
                (_, Some(e)) => e.clone(),
                (Some(n), None) => n.clone(),
                (None, None) => format!(
                    "+{} ~{} ±{} -{} !{}",
                    c.created, c.updated, c.replaced, c.deleted, c.failed
                ),
            };
            vec![
                r.id.to_string(),
                time_text(r.started_at),
                r.operation.as_str().to_owned(),
                r.outcome.map_or("unfinished", |o| o.as_str()).to_owned(),
                r.actor.clone(),
                what,
            ]
        })
        .collect();
    print(&output::table(
        &["RUN", "STARTED", "OPERATION", "OUTCOME", "ACTOR", "CHANGES"],
        &rows,
    ))
}

/// Records a state edit (rm, unlock, import) in the history as a finished run.
async fn record_edit(
    store: &dyn StateStore,
    deployment: &str,
    workflow: Option<String>,
    operation: Operation,
    changes: Vec<ChangeRecord>,
    note: String,
) -> Result<(), StoreError> {
    let run = store
        .begin_run(&RunStart {
            deployment: deployment.to_owned(),
            workflow,
            operation,
            actor: actor(),
        })
        .await?;
    store
        .finish_run(
            run,
            &RunEnd {
                outcome: Outcome::Succeeded,
                counts: ChangeCounts::default(),
                changes,
                error: None,
                note: Some(note),
            },
        )
        .await
}

pub async fn rm(a: &args::StateRmArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    let held = locking::take(
        &store,
        &a.deployment,
        "state rm",
        &a.lock,
        Arc::new(AtomicBool::new(false)),
    )
    .await?;
    let result = rm_locked(store.as_ref(), a).await;
    locking::release(&store, held).await;
    let forgotten = result?;
    if a.state.output == Output::Json {
        return json(&serde_json::json!({"deployment": a.deployment, "forgotten": forgotten}));
    }
    print(&forgotten.iter().map(|s| format!("forgot {s}\n")).collect::<String>())
}

async fn rm_locked(store: &dyn StateStore, a: &args::StateRmArgs) -> Result<Vec<String>, Exit> {
    let state = store
        .load(&a.deployment)
        .await
        .map_err(state_error)?
        .ok_or_else(|| Exit::failure(format!("no deployment '{}' in the state", a.deployment)))?;
    let mut forget: Vec<String> = Vec::new();
    // Unreadable records can be forgotten too: that is how they are repaired.
    let recorded: Vec<&str> = state
        .resources
        .iter()
        .map(|r| r.step_id.as_str())
        .chain(state.unreadable.iter().map(|u| u.step_id.as_str()))
        .collect();
    for step in &a.steps {
        let under = format!("{step}/");
        let matched: Vec<&str> = recorded
            .iter()
            .copied()
            .filter(|id| id == step || id.starts_with(&under))
            .collect();
        if matched.is_empty() {
            let known = &recorded;
            return Err(Exit::failure(format!(
                "deployment '{}' has no step '{step}' (recorded: {})",
                a.deployment,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        }
        forget.extend(matched.into_iter().map(str::to_owned));
    }
    forget.sort();
    forget.dedup();
    for step in &forget {
        store.remove_resource(&a.deployment, step).await.map_err(state_error)?;
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
        store,
        &a.deployment,
        state.workflow.clone(),
        Operation::Forget,
        changes,
        note,
    )
    .await
    .map_err(state_error)?;
    Ok(forget)
}

pub async fn unlock(a: &args::StateUnlockArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    if !a.force {
        let current = store.lease(&a.deployment).await.map_err(state_error)?;
        return match current {
            None => {
                warn(&format!("deployment '{}' is not locked\n", a.deployment));
                Ok(())
            }
            Some(l) => Err(Exit::usage(format!(
                "deployment '{}' is locked: {}\n  \
                 breaking the lease lets another run start while this one may still be running; \
                 if it is really gone, run again with --force",
                a.deployment,
                lease_text(&l)
            ))),
        };
    }
    let broken = store.break_lease(&a.deployment).await.map_err(state_error)?;
    let Some(broken) = broken else {
        warn(&format!("deployment '{}' was not locked\n", a.deployment));
        return Ok(());
    };
    let workflow = store
        .load(&a.deployment)
        .await
        .map_err(state_error)?
        .and_then(|d| d.workflow);
    let note = format!("broke the lease: {}", lease_text(&broken));
    record_edit(store.as_ref(), &a.deployment, workflow, Operation::Unlock, vec![], note)
        .await
        .map_err(state_error)?;
    if a.state.output == Output::Json {
        return json(&serde_json::json!({
            "deployment": a.deployment,
            "broken": output::lease_json(&broken),
        }));
    }
    print(&format!("unlocked '{}': {}\n", a.deployment, lease_text(&broken)))
}

/// The named deployments, or all of them.
async fn chosen(store: &dyn StateStore, names: &[String]) -> Result<Vec<String>, Exit> {
    if !names.is_empty() {
        return Ok(names.to_vec());
    }
    Ok(store
        .list()
        .await
        .map_err(state_error)?
        .into_iter()
        .map(|d| d.name)
        .collect())
}

async fn export_one(store: &dyn StateStore, deployment: &str) -> Result<DeploymentExport, Exit> {
    store
        .export(deployment)
        .await
        .map_err(state_error)?
        .ok_or_else(|| Exit::failure(format!("no deployment '{deployment}' in the state")))
}

pub async fn export(a: &args::StateExportArgs) -> Result<(), Exit> {
    let store = open_state(a.state.as_deref()).await?;
    let mut exports = Vec::new();
    // Unreadable records cannot be exported; the rest of the store can, and is.
    let mut incomplete = Vec::new();
    for d in chosen(store.as_ref(), &a.deployments).await? {
        let export = export_one(store.as_ref(), &d).await?;
        if !export.state.unreadable.is_empty() {
            warn_unreadable(&d, &export.state.unreadable);
            incomplete.push(d);
        }
        exports.push(export);
    }
    let done = if incomplete.is_empty() {
        Ok(())
    } else {
        Err(Exit::failure(format!(
            "exported everything else, but not the unreadable records of: {}",
            incomplete.join(", ")
        )))
    };
    let text = serde_json::to_string_pretty(&ExportFile::new(&exports)).map_err(|e| Exit::failure(e.to_string()))?;
    match &a.file {
        None => print(&(text + "\n"))?,
        Some(path) => {
            write_atomically(path, text.as_bytes())
                .map_err(|e| Exit::failure(format!("writing {}: {e}", path.display())))?;
            warn(&format!(
                "exported {} deployment(s) to {}\n",
                exports.len(),
                path.display()
            ));
        }
    }
    done
}

/// Writes a file so that a crash leaves either the old content or the new, never half.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.write_all(b"\n")?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

pub async fn import(a: &args::StateImportArgs) -> Result<(), Exit> {
    let text = if a.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| Exit::failure(format!("reading stdin: {e}")))?
    } else {
        std::fs::read_to_string(&a.file).map_err(|e| Exit::failure(format!("reading {}: {e}", a.file.display())))?
    };
    let file = ExportFile::parse(&text).map_err(|e| Exit::failure(format!("{}: {e}", a.file.display())))?;
    let exports: Vec<DeploymentExport> = file
        .deployments
        .into_iter()
        .map(|d| d.into_export())
        .collect::<Result<_, _>>()
        .map_err(|e| Exit::failure(format!("{}: {e}", a.file.display())))?;
    let store = open_state(a.state.state.as_deref()).await?;
    let source = format!("imported from {}", a.file.display());
    let mut imported = Vec::new();
    for export in &exports {
        write_deployment(&store, export, a.replace, &a.lock, &source).await?;
        imported.push(export.state.name.clone());
    }
    if a.state.output == Output::Json {
        return json(&serde_json::json!({ "imported": imported }));
    }
    print(&imported.iter().map(|d| format!("imported {d}\n")).collect::<String>())
}

/// Writes one exported deployment into `store` under its lease, refusing to overwrite unless
/// `replace`, and notes where it came from in its history.
async fn write_deployment(
    store: &Arc<dyn StateStore>,
    export: &DeploymentExport,
    replace: bool,
    lock: &args::LockArgs,
    source: &str,
) -> Result<(), Exit> {
    let name = &export.state.name;
    let held = locking::take(store, name, "import", lock, Arc::new(AtomicBool::new(false))).await?;
    let result = async {
        if !replace && store.load(name).await.map_err(state_error)?.is_some() {
            return Err(Exit::failure(format!(
                "deployment '{name}' already exists here; use --replace to overwrite it"
            )));
        }
        store.import(export).await.map_err(state_error)?;
        record_edit(
            store.as_ref(),
            name,
            export.state.workflow.clone(),
            Operation::Import,
            vec![],
            source.to_owned(),
        )
        .await
        .map_err(state_error)
    }
    .await;
    locking::release(store, held).await;
    result
}

pub async fn migrate(a: &args::StateMigrateArgs) -> Result<(), Exit> {
    if a.from == a.to {
        return Err(Exit::usage("--from and --to name the same state store"));
    }
    let from = open_state(Some(&a.from)).await?;
    let to = open_state(Some(&a.to)).await?;
    let source = format!("migrated from {}", redact_url(&a.from));
    let mut moved = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for name in chosen(from.as_ref(), &a.deployments).await? {
        // A deployment with unreadable records is not moved (its copy would lack them, and
        // the source would be dropped): it is named and left as it is, and the rest go on.
        let unreadable = from
            .load(&name)
            .await
            .map_err(state_error)?
            .map(|s| s.unreadable)
            .unwrap_or_default();
        if !unreadable.is_empty() {
            warn_unreadable(&name, &unreadable);
            warn(&format!("not migrated: {name} (left in the source)\n"));
            skipped.push(name);
            continue;
        }
        // The source stays locked until the copy is checked and the original dropped, so no
        // run changes it half-way through the move.
        let held = locking::take(&from, &name, "migrate", &a.lock, Arc::new(AtomicBool::new(false))).await?;
        let result = migrate_one(&from, &to, &name, a, &source).await;
        if a.keep_source || result.is_err() {
            locking::release(&from, held).await;
        } else {
            // Dropping the deployment removed its lease too.
            drop(held);
        }
        let count = result?;
        if a.output == Output::Text {
            print(&format!("moved {name} ({count} resources)\n"))?;
        }
        moved.push(serde_json::json!({"deployment": name, "resources": count}));
    }
    if a.output == Output::Json {
        json(&serde_json::json!({ "moved": moved, "skipped": skipped }))?;
    }
    if skipped.is_empty() {
        Ok(())
    } else {
        Err(Exit::failure(format!(
            "not migrated, because some of their records cannot be read: {}",
            skipped.join(", ")
        )))
    }
}

async fn migrate_one(
    from: &Arc<dyn StateStore>,
    to: &Arc<dyn StateStore>,
    name: &str,
    a: &args::StateMigrateArgs,
    source: &str,
) -> Result<usize, Exit> {
    let export = export_one(from.as_ref(), name).await?;
    // Checked again under the lease: a record may have gone bad since.
    if !export.state.unreadable.is_empty() {
        return Err(Exit::failure(lyra_core::state::unreadable_message(
            name,
            &export.state.unreadable,
        )));
    }
    write_deployment(to, &export, a.replace, &a.lock, source).await?;
    // Check the copy before dropping the original: same resources, same history.
    let copy = export_one(to.as_ref(), name).await?;
    if copy.state.resources != export.state.resources || copy.history.len() < export.history.len() {
        return Err(Exit::failure(format!(
            "deployment '{name}': the copy in the target differs from the source; the source is left as it was"
        )));
    }
    if !a.keep_source {
        from.drop_deployment(name).await.map_err(state_error)?;
    }
    Ok(export.state.resources.len())
}

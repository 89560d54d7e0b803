//! `lyra state …` and `lyra history`: reading, repairing and moving the recorded state.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::StreamExt as _;
use lyra_core::state::{ResourceRecord, StoreError, UnreadableRecord};
use lyra_providers::{ProvidersConfig, builtin};
use lyra_state::admin::{self, AdminError};
use lyra_state::{DeploymentExport, RecordStream, Store};

use crate::args::{self, Output};
use crate::exit::{Exit, kind};
use crate::output::{self, lease_text, time_text};
use crate::transfer::ExportFile;
use crate::{actor, json, locking, open_existing, open_state, print, signals, unknown_deployment, warn};

fn state_error(e: StoreError) -> Exit {
    Exit::state(e)
}

pub async fn list(a: &args::StateArgs, out: Output) -> Result<(), Exit> {
    let store = open_existing(a.state.as_deref()).await?;
    let list = store.list().await.map_err(state_error)?;
    if out == Output::Json {
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

pub async fn show(a: &args::StateShowArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    if out == Output::Json {
        return show_json(store, &a.deployment, url).await;
    }
    let Some(state) = store.load(&a.deployment).await.map_err(state_error)? else {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    };
    let lease = store.lease(&a.deployment).await.map_err(state_error)?;
    // Records that cannot be read are shown for what they are: the rest is still usable.
    warn_unreadable(&state.name, &state.unreadable);
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

/// `lyra state show -o json`: each record written as it is read from the store, so a
/// deployment of any size is shown in flat memory. If the store fails part-way, the document
/// is cut short and the command fails with the store's error.
async fn show_json(store: Arc<dyn Store>, deployment: &str, url: Option<&str>) -> Result<(), Exit> {
    // The lease first: the stream holds a read connection until it ends.
    let lease = store.lease(deployment).await.map_err(state_error)?;
    let Some(stream) = store.records(deployment).await.map_err(state_error)? else {
        return Err(unknown_deployment(store.as_ref(), deployment, url).await);
    };
    let runtime = tokio::runtime::Handle::current();
    // Serialising is synchronous: on a blocking thread, which waits for each record.
    let written = tokio::task::spawn_blocking(move || {
        // Masking needs the provider schemas: which attributes are secret.
        let providers = builtin(&ProvidersConfig::default());
        let mask = |r: &ResourceRecord| lyra_core::secret::shown_state(r, providers.schemas().get(&r.type_name));
        let RecordStream {
            name,
            workflow,
            mut records,
        } = stream;
        let doc = output::StreamedStateJson::new(&name, workflow.as_deref(), lease.as_ref(), &mask, || {
            runtime.block_on(records.next())
        });
        let printed = json(&doc);
        (printed, doc.failure(), doc.unreadable(), name)
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let (printed, failure, unreadable, name) = written;
    if let Some(e) = failure {
        return Err(state_error(e));
    }
    // Records that cannot be read are shown for what they are: the rest is still usable.
    warn_unreadable(&name, &unreadable);
    printed
}

/// Names a deployment's unreadable records on stderr, with how to remove them.
fn warn_unreadable(deployment: &str, unreadable: &[UnreadableRecord]) {
    if !unreadable.is_empty() {
        warn(&format!(
            "warning: {}\n",
            lyra_core::state::unreadable_message(deployment, unreadable, &lyra_host::Advice)
        ));
    }
}

pub async fn history(a: &args::HistoryArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    let runs = store.history(&a.deployment).await.map_err(state_error)?;
    if runs.is_empty() && store.load(&a.deployment).await.map_err(state_error)?.is_none() {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    }
    if out == Output::Json {
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
                r.workflow.as_deref().map_or_else(|| "-".to_owned(), short_workflow),
                r.outcome.map_or("unfinished", |o| o.as_str()).to_owned(),
                r.actor.clone(),
                what,
            ]
        })
        .collect();
    print(&output::table(
        &["RUN", "STARTED", "OPERATION", "WORKFLOW", "OUTCOME", "ACTOR", "CHANGES"],
        &rows,
    ))
}

/// A run's workflow for the history table: a package's digest (`web@sha256:…`) cut to 12 hex
/// digits, as registries show them; `-o json` has it whole.
fn short_workflow(w: &str) -> String {
    match w.split_once("@sha256:") {
        Some((name, hex)) if hex.len() > 12 => format!("{name}@sha256:{}", &hex[..12]),
        _ => w.to_owned(),
    }
}

/// An administrative edit that was not made, as the command's exit.
async fn admin_error(e: AdminError, store: &dyn Store, url: Option<&str>) -> Exit {
    match e {
        AdminError::Store(e) => state_error(e),
        AdminError::NotFound(deployment) => unknown_deployment(store, &deployment, url).await,
        AdminError::NoSuchStep {
            deployment,
            step,
            recorded,
        } => {
            let near = crate::near_names(&step, recorded.iter().map(String::as_str));
            Exit::new(
                Exit::FAILURE,
                kind::NOT_FOUND,
                format!(
                    "deployment '{deployment}' has no step '{step}' (recorded: {})",
                    if recorded.is_empty() {
                        "none".to_owned()
                    } else {
                        recorded.join(", ")
                    }
                ),
            )
            .with("deployment", &deployment)
            .with("step", &step)
            .with("did_you_mean", near)
        }
        AdminError::Exists(name) => Exit::new(
            Exit::FAILURE,
            kind::CONFLICT,
            format!("deployment '{name}' already exists here; use --replace to overwrite it"),
        )
        .with("deployment", &name),
        AdminError::Unreadable { deployment, unreadable } => Exit::failure(lyra_core::state::unreadable_message(
            &deployment,
            &unreadable,
            &lyra_host::Advice,
        )),
        e @ AdminError::CopyDiffers(_) => Exit::failure(e.to_string()),
    }
}

pub async fn rm(a: &args::StateRmArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    // Checked before taking the lease, so a typo writes nothing (not even a lease row).
    if store.load(&a.deployment).await.map_err(state_error)?.is_none() {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    }
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let actor = actor();
    let (result, _kept) = locking::under_lease(
        &store,
        &a.deployment,
        "state rm",
        &a.lock,
        &cancel,
        |leased| async move { admin::forget(leased.recorder(), &a.deployment, &a.steps, &actor).await },
    )
    .await?;
    let forgotten = match result {
        Ok(forgotten) => forgotten,
        Err(e) => return Err(admin_error(e, store.as_ref(), url).await),
    };
    if out == Output::Json {
        return json(&serde_json::json!({"deployment": a.deployment, "forgotten": forgotten}));
    }
    print(&forgotten.iter().map(|s| format!("forgot {s}\n")).collect::<String>())
}

/// `lyra state unlock D`: shows the holder; with `--force`, breaks the lease.
pub async fn unlock(a: &args::StateUnlockArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    // A deployment's first run takes the lease before it is recorded: a lease alone is enough
    // to know the name.
    let (lease, recorded) = if a.force {
        let unlocked = admin::unlock(store.as_ref(), &a.deployment, &actor())
            .await
            .map_err(state_error)?;
        (unlocked.lease, unlocked.recorded)
    } else {
        let recorded = store.load(&a.deployment).await.map_err(state_error)?.is_some();
        (store.lease(&a.deployment).await.map_err(state_error)?, recorded)
    };
    if !recorded && lease.is_none() {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    }
    let text = match (&lease, a.force) {
        (None, false) => format!("deployment '{}' is not locked\n", a.deployment),
        (None, true) => format!("deployment '{}' was not locked\n", a.deployment),
        (Some(l), false) => format!(
            "deployment '{}' is locked: {}\n  break the lease only if that run is gone for good: \
             `lyra state unlock {} --force`\n",
            a.deployment,
            lease_text(l),
            a.deployment
        ),
        (Some(l), true) if recorded => format!("unlocked '{}': {}\n", a.deployment, lease_text(l)),
        (Some(l), true) => format!(
            "unlocked '{}': {} (no run of it was recorded, so there is no history to keep this in)\n",
            a.deployment,
            lease_text(l)
        ),
    };
    if out == Output::Json {
        return json(&serde_json::json!({
            "deployment": a.deployment,
            "lease": lease.as_ref().map(output::lease_json),
            "broken": a.force && lease.is_some(),
        }));
    }
    print(&text)
}

/// The named deployments, or all of them. Every name must be recorded: checked before any
/// is exported or moved, so a typo in the last name does nothing half-way.
async fn chosen(store: &dyn Store, names: &[String], url: Option<&str>) -> Result<Vec<String>, Exit> {
    let all: Vec<String> = store
        .list()
        .await
        .map_err(state_error)?
        .into_iter()
        .map(|d| d.name)
        .collect();
    if names.is_empty() {
        return Ok(all);
    }
    if let Some(unknown) = names.iter().find(|n| !all.contains(n)) {
        return Err(crate::not_found(unknown, &all, url));
    }
    Ok(names.to_vec())
}

async fn export_one(store: &dyn Store, deployment: &str, url: Option<&str>) -> Result<DeploymentExport, Exit> {
    match store.export(deployment).await.map_err(state_error)? {
        Some(export) => Ok(export),
        None => Err(unknown_deployment(store, deployment, url).await),
    }
}

pub async fn export(a: &args::StateExportArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.as_deref();
    let store = open_existing(url).await?;
    let mut exports = Vec::new();
    // Unreadable records cannot be exported; the rest of the store can, and is.
    let mut incomplete = Vec::new();
    for d in chosen(store.as_ref(), &a.deployments, url).await? {
        let export = export_one(store.as_ref(), &d, url).await?;
        if !export.state.unreadable.is_empty() {
            warn_unreadable(&d, &export.state.unreadable);
            incomplete.push(d);
        }
        exports.push(export);
    }
    let incomplete = (!incomplete.is_empty()).then(|| {
        format!(
            "exported everything else, but not the unreadable records of: {}",
            incomplete.join(", ")
        )
    });
    let text = serde_json::to_string_pretty(&ExportFile::new(&exports)).map_err(|e| Exit::failure(e.to_string()))?;
    let exported = || exports.iter().map(moved_json).collect::<Vec<_>>();
    match &a.file {
        None => {
            // The export is itself the JSON document, with or without `-o json`; a failure is
            // then said on stderr only, so stdout stays one document.
            print(&(text + "\n"))?;
            if let Some(message) = incomplete {
                warn(&format!("error: {message}\n"));
                return Err(Exit::reported(Exit::FAILURE));
            }
            Ok(())
        }
        Some(path) => {
            write_atomically(path, text.as_bytes())
                .map_err(|e| Exit::failure(format!("writing {}: {e}", path.display())))?;
            let file = path.display().to_string();
            if let Some(message) = incomplete {
                return Err(Exit::failure(message).with("exported", exported()).with("file", file));
            }
            if out == Output::Json {
                return json(&serde_json::json!({ "exported": exported(), "file": file }));
            }
            warn(&format!("exported {} deployment(s) to {file}\n", exports.len()));
            Ok(())
        }
    }
}

/// One deployment exported, imported or moved: `{"deployment", "resources"}`.
fn moved_json(e: &DeploymentExport) -> serde_json::Value {
    serde_json::json!({"deployment": e.state.name, "resources": e.state.resources.len()})
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

pub async fn import(a: &args::StateImportArgs, out: Output) -> Result<(), Exit> {
    let shown = if a.file.as_os_str() == "-" {
        "<stdin>".to_owned()
    } else {
        a.file.display().to_string()
    };
    let bytes = if a.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| Exit::failure(format!("reading stdin: {e}")))?;
        buf
    } else {
        std::fs::read(&a.file).map_err(|e| Exit::usage(format!("cannot read {shown}: {e}")))?
    };
    let text = lyra_host::decode_text(bytes).map_err(|e| Exit::invalid_input(format!("{shown}: {e}")))?;
    let file = ExportFile::parse(&text).map_err(|e| {
        // `LINE:COL: …` when the JSON is at fault: file:line:col, as everywhere.
        let sep = if e.starts_with(|c: char| c.is_ascii_digit()) {
            ":"
        } else {
            ": "
        };
        Exit::invalid_input(format!("{shown}{sep}{e}"))
    })?;
    let exports: Vec<DeploymentExport> = file
        .deployments
        .into_iter()
        .map(|d| d.into_export())
        .collect::<Result<_, _>>()
        .map_err(|e| Exit::invalid_input(format!("{shown}: {e}")))?;
    let store = open_state(a.state.state.as_deref()).await?;
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let source = format!("imported from {shown}");
    let mut imported = Vec::new();
    for export in &exports {
        // Between deployments, a Ctrl-C stops the import: each one is whole or not there.
        if cancel.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(
                Exit::interrupted("interrupted: the deployments listed were imported").with("imported", imported)
            );
        }
        write_deployment(
            &store,
            export,
            a.replace,
            &a.lock,
            &source,
            a.state.state.as_deref(),
            &cancel,
        )
        .await
        .map_err(|e| e.with("imported", &imported))?;
        imported.push(moved_json(export));
    }
    if out == Output::Json {
        return json(&serde_json::json!({ "imported": imported }));
    }
    print(
        &exports
            .iter()
            .map(|d| format!("imported {}\n", d.state.name))
            .collect::<String>(),
    )
}

/// Writes one exported deployment into `store` under its lease, refusing to overwrite unless
/// `replace`, and notes where it came from in its history.
async fn write_deployment(
    store: &Arc<dyn Store>,
    export: &DeploymentExport,
    replace: bool,
    lock: &args::LockArgs,
    source: &str,
    url: Option<&str>,
    cancel: &Arc<AtomicBool>,
) -> Result<(), Exit> {
    let name = &export.state.name;
    let actor = actor();
    // A Ctrl-C ends a wait for the lease; once held, the write is whole or not there.
    let (result, _kept) = locking::under_lease(store, name, "import", lock, cancel, |leased| async move {
        admin::import(store.as_ref(), leased.recorder(), export, replace, &actor, source).await
    })
    .await?;
    match result {
        Ok(()) => Ok(()),
        Err(e) => Err(admin_error(e, store.as_ref(), url).await),
    }
}

pub async fn migrate(a: &args::StateMigrateArgs, out: Output) -> Result<(), Exit> {
    if a.from == a.to {
        return Err(Exit::usage("--from and --to name the same state store"));
    }
    // The source must exist (and is not created); the target is created if needed.
    let from = open_existing(Some(&a.from)).await?;
    let names = chosen(from.as_ref(), &a.deployments, Some(&a.from)).await?;
    let to = open_state(Some(&a.to)).await?;
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    // Two spellings of one store (`x.db` and `sqlite:./x.db`, URLs differing in a parameter):
    // moving onto itself would end by dropping what it just copied.
    if from.store_id() == to.store_id() {
        return Err(Exit::usage(format!(
            "--from and --to are the same state store (store {})",
            from.store_id()
        )));
    }
    let source = admin::migration_note(&a.from, from.as_ref());
    let mut moved = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for name in names {
        // Between deployments, a Ctrl-C stops the move: each one is moved whole or not at all.
        if cancel.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Exit::interrupted("interrupted: the deployments listed were moved")
                .with("moved", moved)
                .with("skipped", skipped));
        }
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
        let (result, _kept) = locking::under_lease(&from, &name, "migrate", &a.lock, &cancel, |_| {
            migrate_one(&from, &to, &name, a, &source, &cancel)
        })
        .await
        .map_err(|e| e.with("moved", &moved))?;
        let count = result.map_err(|e| e.with("moved", &moved))?;
        if out == Output::Text {
            print(&format!("moved {name} ({count} resources)\n"))?;
        }
        moved.push(serde_json::json!({"deployment": name, "resources": count}));
    }
    if !skipped.is_empty() {
        // One document under `-o json`: the error, with what was moved and what was not.
        return Err(Exit::failure(format!(
            "not migrated, because some of their records cannot be read: {}",
            skipped.join(", ")
        ))
        .with("moved", moved)
        .with("skipped", skipped));
    }
    if out == Output::Json {
        return json(&serde_json::json!({ "moved": moved, "skipped": skipped }));
    }
    Ok(())
}

/// Copies one deployment, checks the copy, and drops the source (unless `--keep-source`).
/// Run under the source's lease (dropping the deployment removes the lease too).
async fn migrate_one(
    from: &Arc<dyn Store>,
    to: &Arc<dyn Store>,
    name: &str,
    a: &args::StateMigrateArgs,
    source: &str,
    cancel: &Arc<AtomicBool>,
) -> Result<usize, Exit> {
    // Checked again under the lease: a record may have gone bad since.
    let export = match admin::export_whole(from.as_ref(), name).await {
        Ok(export) => export,
        Err(e) => return Err(admin_error(e, from.as_ref(), Some(&a.from)).await),
    };
    write_deployment(to, &export, a.replace, &a.lock, source, Some(&a.to), cancel).await?;
    // Check the copy before dropping the original: same resources, same history.
    if let Err(e) = admin::verify_copy(to.as_ref(), &export).await {
        return Err(admin_error(e, to.as_ref(), Some(&a.to)).await);
    }
    if !a.keep_source {
        from.drop_deployment(name).await.map_err(state_error)?;
    }
    Ok(export.state.resources.len())
}

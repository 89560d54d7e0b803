//! `lyra import DEPLOYMENT STEP EXTERNAL_ID`: adopts a resource that exists into a step
//! (`Engine::adopt`), under the deployment's lease, then shows the plan that converging it
//! to the workflow would apply. Nothing is created, changed or deleted.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::diag::Sources;
use lyra_core::engine::{AdoptError, EngineError, Quiet};
use serde_json::json;

use crate::args::{ImportArgs, Output, RegistryArgs, WorkflowArgs};
use crate::exit::{Exit, kind};
use crate::{
    actor, engine, engine_error, fenced, json, load, locking, near_names, open_state, output, print, print_styled,
    providers_for, signals,
};

pub async fn import(a: &ImportArgs, out: Output) -> Result<(), Exit> {
    let providers = providers_for(&a.exec.foobernetes_file, a.workflows.as_deref()).await;
    let store = open_state(a.state.as_deref()).await?;
    // The workflow the step belongs to: as given, else the one last applied, else the one
    // the deployment is named after (`lyra apply web` makes deployment `web`).
    let recorded = store
        .load(&a.deployment)
        .await
        .map_err(Exit::state)?
        .and_then(|d| d.workflow);
    let workflow = match (&a.workflow, recorded) {
        (Some(wf), _) => wf.clone(),
        // A package is recorded pinned (`web@sha256:…`): it must be named again.
        (None, Some(wf)) if !wf.contains('@') => wf,
        (None, Some(wf)) => {
            return Err(Exit::usage(format!(
                "deployment '{}' runs package {wf}: give it with --workflow",
                a.deployment
            )));
        }
        (None, None) => a.deployment.clone(),
    };
    let workflow_args = WorkflowArgs {
        workflow,
        workflows: a.workflows.clone(),
        registry: RegistryArgs {
            insecure: a.registry.insecure.clone(),
        },
    };
    let target = load::locate_target(&workflow_args).await?;
    let mut sources = Sources::default();
    let program = load::load_target(&target, providers.schemas(), &mut sources)?;
    let data = load::load_data(a.data.as_deref(), &a.vars, &mut sources)?;
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let (program_ref, data_ref, providers_ref, sources_ref, cancel_ref) =
        (&program, &data, &providers, &sources, &cancel);
    let (adopted, kept) = locking::under_lease(
        &store,
        &a.deployment,
        "import",
        &a.exec.lock,
        &cancel,
        |leased| async move {
            engine(
                a.exec.concurrency,
                providers_ref,
                leased.recorder(),
                &Quiet,
                sources_ref,
                cancel_ref,
            )
            .adopt(program_ref, &a.deployment, data_ref, &a.step, &a.external_id, &actor())
            .await
        },
    )
    .await?;
    let adopted = match adopted {
        Err(AdoptError::Engine(EngineError::Store(e))) if fenced(&e) => {
            return Err(locking::lease_lost(&a.deployment));
        }
        Err(e) => return Err(adopt_error(e, a, &sources)),
        Ok(_) if !kept => return Err(locking::lease_lost(&a.deployment)),
        Ok(adopted) => adopted,
    };
    // What the next apply would do to it (and to the rest of the deployment).
    let plan = engine(
        a.exec.concurrency,
        &providers,
        store.as_ref(),
        &Quiet,
        &sources,
        &cancel,
    )
    .plan(&program, &a.deployment, &data)
    .await
    .map_err(|e| engine_error(e, &sources))?;
    if out == Output::Json {
        return json(&json!({
            "deployment": a.deployment,
            "step": adopted.step_id,
            "type": adopted.type_name,
            "external_id": adopted.external_id,
            "run": adopted.run,
            "plan": output::report_json(&plan),
        }));
    }
    print(&format!(
        "Imported {} {:?} as step '{}' of deployment '{}' (run {}).\nThe next apply would do this:\n",
        adopted.type_name, adopted.external_id, adopted.step_id, a.deployment, adopted.run
    ))?;
    print_styled(&output::plan_coloured(&plan))
}

fn adopt_error(e: AdoptError, a: &ImportArgs, sources: &Sources) -> Exit {
    let message = e.to_string();
    match e {
        AdoptError::NoStep { candidates, .. } => {
            let near = near_names(&a.step, candidates.iter().map(String::as_str));
            let hint = if near.is_empty() {
                format!("the steps that can adopt a resource: {}", candidates.join(", "))
            } else {
                format!("did you mean: {}?", near.join(", "))
            };
            Exit::new(Exit::FAILURE, kind::NOT_FOUND, message)
                .with("step", &a.step)
                .with("did_you_mean", &near)
                .hint(&hint)
        }
        AdoptError::Recorded { .. } => Exit::new(Exit::FAILURE, kind::CONFLICT, message)
            .with("deployment", &a.deployment)
            .with("step", &a.step)
            .hint(&format!(
                "`lyra state rm {} {}` forgets the recorded one (without deleting it) first",
                a.deployment, a.step
            )),
        AdoptError::Missing { .. } => {
            Exit::new(Exit::FAILURE, kind::NOT_FOUND, message).with("external_id", &a.external_id)
        }
        AdoptError::Nested(_) | AdoptError::NotResource(_) | AdoptError::ReadOnly(_) | AdoptError::NoProvider(_) => {
            Exit::invalid_input(message)
        }
        AdoptError::Read { .. } => Exit::failure(message),
        AdoptError::Engine(e) => engine_error(e, sources),
    }
}

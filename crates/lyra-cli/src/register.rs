//! `lyra register`: a package becomes a Kubernetes kind (a `WorkflowDefinition`, which
//! lyra-controller turns into a CRD). Thin: the rules are in `lyra_k8s::register`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::diag::Sources;
use lyra_core::engine::{Engine, Quiet};
use lyra_core::state::Recorder;
use lyra_k8s::register::{self, Preview, Request};
use lyra_package::{Reference, RegistryOptions};
use serde_json::json;

use crate::args::{Output, RegisterArgs};
use crate::exit::{Exit, kind};
use crate::{json, open_existing, output, print};

pub async fn register(a: &RegisterArgs, out: Output) -> Result<(), Exit> {
    let reference = match Reference::parse(&a.package).map_err(|e| Exit::usage(e.to_string()))? {
        // The controller reads a local package from its own file system: name it absolutely.
        Reference::Layout(p) => Reference::Layout(absolute(&p)?),
        Reference::Tar(p) => Reference::Tar(absolute(&p)?),
        r => r,
    };
    let package = Arc::new(
        lyra_package::resolve(&reference, &RegistryOptions::from_env())
            .await
            .map_err(|e| Exit::failure(e.to_string()))?,
    );
    // A tag is resolved once, here: the definition names the digest.
    let pinned = reference.pinned(&package.digest).to_string();
    let providers = crate::providers_for(&a.foobernetes_file, None).await;
    let mut sources = Sources::default();
    let program = lyra_core::program::load(
        &package.manifest.name,
        package.main(),
        &mut package.source(),
        &mut sources,
        providers.schemas(),
    )
    .map_err(|d| Exit::invalid(&d, &sources))?;
    let client = kube::Client::try_default().await.map_err(|e| {
        Exit::failure(format!("connecting to Kubernetes: {e}")).hint("set KUBECONFIG (or run in a cluster)")
    })?;
    let request = Request {
        name: a.name.clone(),
        kind: a.kind.clone(),
        plural: a.plural.clone(),
        group: a.group.clone(),
        allow_breaking: a.allow_breaking,
    };
    let request = register::complete(&client, &package, request)
        .await
        .map_err(|e| match &e {
            kube::Error::Api(s) if s.is_not_found() => {
                Exit::failure("the WorkflowDefinition CRD (workflowdefinitions.lyra.dev) is not installed")
                    .hint("install Lyra's CRDs with `lyra crd | kubectl apply -f -`")
            }
            _ => Exit::failure(format!("reading the WorkflowDefinition: {e}")),
        })?;
    let def = register::definition(&package, &pinned, &request);
    let preview = register::preview(&client, &def, &package, &program.main)
        .await
        .map_err(|e| Exit::failure(e.to_string()))?;
    let def_name = def.metadata.name.clone().unwrap_or_default();
    if let Some(owner) = &preview.taken_by {
        return Err(Exit::new(
            Exit::FAILURE,
            kind::CONFLICT,
            format!(
                "kind {} ({}) is already registered by WorkflowDefinition {owner}",
                def.spec.kind, preview.crd_name
            ),
        )
        .hint("choose another --kind, --plural or --group, or delete that definition first"));
    }
    let breaking: Vec<String> = preview.breaking().map(ToString::to_string).collect();
    if a.dry_run {
        return dry_run(a, out, &def_name, &pinned, &preview, &program, &providers).await;
    }
    if !breaking.is_empty() && !a.allow_breaking {
        return Err(Exit::new(
            Exit::FAILURE,
            kind::CONFLICT,
            format!(
                "the upgrade breaks the schema of kind {} ({} change(s)):\n  {}",
                def.spec.kind,
                breaking.len(),
                breaking.join("\n  ")
            ),
        )
        .with("breaking_changes", &breaking)
        .hint("existing objects may no longer fit; to upgrade anyway, pass --allow-breaking (see `lyra register --dry-run`)"));
    }
    register::apply(&client, &def)
        .await
        .map_err(|e| Exit::failure(format!("creating WorkflowDefinition {def_name}: {e}")))?;
    match out {
        Output::Json => json(&json!({
            "definition": def_name,
            "kind": def.spec.kind,
            "crd": preview.crd_name,
            "package": pinned,
            "digest": package.digest,
            "version": package.manifest.version,
            "changes": preview.changes.iter().map(change_json).collect::<Vec<_>>(),
        })),
        Output::Text => print(&format!(
            "registered {} ({}) as WorkflowDefinition {def_name}\n  package {pinned}\n  version {}\n\
             lyra-controller serves the kind once `kubectl get wfd {def_name}` is Ready.\n",
            def.spec.kind, preview.crd_name, package.manifest.version
        )),
    }
}

fn change_json(c: &lyra_k8s::kind::SchemaChange) -> serde_json::Value {
    json!({"path": c.path, "description": c.description, "breaking": c.breaking})
}

/// The schema diff, and for every existing object the plan the new version would run.
async fn dry_run(
    a: &RegisterArgs,
    out: Output,
    def_name: &str,
    pinned: &str,
    preview: &Preview,
    program: &lyra_core::program::Program,
    providers: &lyra_core::provider::Providers,
) -> Result<(), Exit> {
    // A preview records nothing: with no state yet, every object plans against an empty one.
    let store: Arc<dyn Recorder> = match open_existing(a.state.as_deref()).await {
        Err(e) if e.kind == kind::NO_STATE => Arc::new(lyra_state::EmptyState {
            location: crate::state_label(a.state.as_deref()),
        }),
        other => other?,
    };
    let cancel = AtomicBool::new(false);
    let sources = Sources::default();
    let engine = Engine {
        providers,
        store: store.as_ref(),
        observer: &Quiet,
        sources: &sources,
        concurrency: 16,
        cancel: &cancel,
        hints: &lyra_host::Advice,
        timer: &lyra_providers::TokioTimer,
        leave_to_exit: true,
    };
    let mut text = format!(
        "would register WorkflowDefinition {def_name} ({}) from {pinned}\n",
        preview.crd_name
    );
    if !preview.exists {
        text.push_str("a new kind: no objects yet\n");
    } else if preview.changes.is_empty() {
        text.push_str("schema: unchanged\n");
    } else {
        text.push_str("schema changes:\n");
        for c in &preview.changes {
            text.push_str(&format!("  {c}\n"));
        }
    }
    let mut instances = Vec::new();
    for i in &preview.instances {
        text.push_str(&format!(
            "\n{}/{} (deployment {}):\n",
            i.namespace, i.name, i.deployment
        ));
        let plan = match &i.data {
            Err(m) => Err(m.clone()),
            Ok(data) => engine
                .plan(program, &i.deployment, data)
                .await
                .map_err(|e| e.to_string()),
        };
        match &plan {
            Ok(report) => {
                for line in output::plan_coloured(report).lines() {
                    text.push_str(&format!("  {line}\n"));
                }
            }
            Err(m) => text.push_str(&format!("  cannot plan: {m}\n")),
        }
        instances.push(json!({
            "namespace": i.namespace,
            "name": i.name,
            "deployment": i.deployment,
            "plan": plan.as_ref().ok().map(output::report_json),
            "error": plan.as_ref().err(),
        }));
    }
    match out {
        Output::Json => json(&json!({
            "definition": def_name,
            "crd": preview.crd_name,
            "package": pinned,
            "dry_run": true,
            "changes": preview.changes.iter().map(change_json).collect::<Vec<_>>(),
            "instances": instances,
        })),
        Output::Text => crate::print_styled(&text),
    }
}

fn absolute(p: &std::path::Path) -> Result<std::path::PathBuf, Exit> {
    std::path::absolute(p).map_err(|e| Exit::usage(format!("{}: {e}", p.display())))
}

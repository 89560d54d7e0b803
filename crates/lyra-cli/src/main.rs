//! `lyra`: the command line. Thin: it parses arguments, reads files, wires the engine to the
//! state store and providers, and prints. All semantics live in `lyra-core`.

mod args;
mod exit;
mod load;
mod locking;
mod output;
mod progress;
mod state_cmd;
mod transfer;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use lyra_core::diag::Sources;
use lyra_core::engine::{Engine, EngineError, Quiet};
use lyra_core::graph::Graph;
use lyra_core::report::Report;
use lyra_core::state::StateStore;
use lyra_providers::{ProvidersConfig, builtin};

use crate::args::{Cli, Command, GraphFormat, Output, StateCommand};
use crate::exit::Exit;

const DEFAULT_STATE: &str = ".lyra/state.db";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            warn(&format!("error: cannot start the async runtime: {e}\n"));
            return ExitCode::from(Exit::FAILURE);
        }
    };
    let code = match rt.block_on(run(cli)) {
        Ok(()) => Exit::SUCCESS,
        Err(Exit { code, message }) => {
            if let Some(m) = message {
                warn(&format!("{}\n", m.trim_end()));
            }
            code
        }
    };
    // Running provider calls of a cancelled run are not waited for.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

async fn run(cli: Cli) -> Result<(), Exit> {
    match cli.command {
        Command::Validate(a) => validate(&a),
        Command::Plan(a) => plan_or_apply(&a, false).await,
        Command::Apply(a) => plan_or_apply(&a, true).await,
        Command::Delete(a) => delete(&a).await,
        Command::Graph(a) => graph(&a),
        Command::State(c) => match c {
            StateCommand::List(a) => state_cmd::list(&a).await,
            StateCommand::Show(a) => state_cmd::show(&a).await,
            StateCommand::Rm(a) => state_cmd::rm(&a).await,
            StateCommand::Unlock(a) => state_cmd::unlock(&a).await,
            StateCommand::Export(a) => state_cmd::export(&a).await,
            StateCommand::Import(a) => state_cmd::import(&a).await,
            StateCommand::Migrate(a) => state_cmd::migrate(&a).await,
        },
        Command::History(a) => state_cmd::history(&a).await,
        Command::Crd => print(&lyra_k8s::crd_yaml()),
    }
}

/// Writes to stderr. Messages for people are not worth failing (or panicking) over: a closed
/// or full stderr must not stop an apply half-way.
pub fn warn(s: &str) {
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// Writes to stdout; a closed pipe (`lyra ... | head`) is not an error.
pub fn print(s: &str) -> Result<(), Exit> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Exit::failure(format!("writing output: {e}"))),
        _ => Ok(()),
    }
}

pub fn json(v: &impl serde::Serialize) -> Result<(), Exit> {
    let s = serde_json::to_string_pretty(v).map_err(|e| Exit::failure(e.to_string()))?;
    print(&(s + "\n"))
}

fn validate(a: &args::WorkflowArgs) -> Result<(), Exit> {
    let providers = builtin(&ProvidersConfig::default());
    let loc = load::locate(&a.workflow, a.workflows.as_deref())?;
    let mut sources = Sources::default();
    let result = load::parse_program(&loc, providers.schemas(), &mut sources)?;
    if a.output == Output::Json {
        let errors: Vec<serde_json::Value> = match &result {
            Ok(_) => vec![],
            Err(d) => d
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "file": sources.get(d.span.file).map(|f| f.name.clone()),
                        "line": d.span.line,
                        "column": d.span.col,
                        "message": d.message,
                        "help": d.help,
                    })
                })
                .collect(),
        };
        json(&serde_json::json!({"workflow": loc.name, "valid": errors.is_empty(), "errors": errors}))?;
        return if errors.is_empty() {
            Ok(())
        } else {
            Err(Exit::code(Exit::FAILURE))
        };
    }
    result.map_err(|d| Exit::invalid(&d, &sources))?;
    print(&format!("{}: valid\n", loc.name))
}

pub async fn open_state(url: Option<&str>) -> Result<Arc<dyn StateStore>, Exit> {
    let url = url.unwrap_or(DEFAULT_STATE);
    lyra_state::open(url)
        .await
        .map_err(|e| Exit::failure(format!("state {}: {e}", lyra_state::redact_url(url))))
}

/// Who runs this command, as recorded in leases and the history.
pub fn actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

/// Sets the flag on the first Ctrl-C (finish running steps, schedule no more); exits at once
/// on the second.
fn cancel_on_ctrl_c(flag: Arc<AtomicBool>) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::SeqCst);
            warn("\ninterrupted: waiting for running steps to finish and be recorded (Ctrl-C again to abort)\n");
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(i32::from(Exit::INTERRUPTED));
            }
        }
    });
}

fn finish_report(r: &Report, output: Output, plan: bool) -> Result<(), Exit> {
    if output == Output::Json {
        json(&output::report_json(r))?;
    } else if plan {
        print(&output::plan_text(r))?;
    } else {
        warn(&output::result_text(r));
        print(&output::returns_text(&output::masked_returns(r)))?;
    }
    match r.outcome {
        lyra_core::state::Outcome::Succeeded => Ok(()),
        lyra_core::state::Outcome::Cancelled => Err(Exit::code(Exit::INTERRUPTED)),
        lyra_core::state::Outcome::Failed => Err(Exit::code(Exit::FAILURE)),
    }
}

fn engine_error(e: EngineError, sources: &Sources) -> Exit {
    match e {
        EngineError::Input(d) => Exit::invalid(&d, sources),
        EngineError::Store(e) => Exit::failure(format!("state: {e}")),
    }
}

async fn plan_or_apply(a: &args::RunArgs, apply: bool) -> Result<(), Exit> {
    let providers = builtin(&ProvidersConfig {
        foobernetes_file: a.exec.foobernetes_file.clone(),
    });
    let loc = load::locate(&a.workflow.workflow, a.workflow.workflows.as_deref())?;
    let mut sources = Sources::default();
    let program = load::load_program(&loc, providers.schemas(), &mut sources)?;
    let data = load::load_data(a.data.as_deref(), &a.vars, &mut sources)?;
    let store = open_state(a.state.as_deref()).await?;
    let deployment = a.name.clone().unwrap_or_else(|| loc.name.clone());
    let cancel = Arc::new(AtomicBool::new(false));
    cancel_on_ctrl_c(Arc::clone(&cancel));
    // A plan changes nothing, so it never waits for (or blocks) a run that does.
    let lease = if apply {
        Some(locking::take(&store, &deployment, "apply", &a.exec.lock, Arc::clone(&cancel)).await?)
    } else {
        None
    };
    let progress = progress::Progress::new(a.exec.verbose);
    let quiet = Quiet;
    let engine = Engine {
        providers: &providers,
        store: store.as_ref(),
        observer: if apply { &progress } else { &quiet },
        sources: &sources,
        concurrency: a.exec.concurrency as usize,
        cancel: &cancel,
    };
    let result = if apply {
        engine.apply(&program, &deployment, &data, &actor()).await
    } else {
        engine.plan(&program, &deployment, &data).await
    };
    progress.finish();
    let kept = match lease {
        Some(held) => locking::release(&store, held).await,
        None => true,
    };
    let report = result.map_err(|e| engine_error(e, &sources))?;
    let reported = finish_report(&report, a.workflow.output, !apply);
    if !kept {
        return Err(lease_lost(&deployment));
    }
    reported
}

fn lease_lost(deployment: &str) -> Exit {
    Exit::failure(format!(
        "the lease on '{deployment}' was lost during the run (it expired or was broken), so the run \
         stopped early; another run may have changed the deployment since: check `lyra history {deployment}`"
    ))
}

async fn delete(a: &args::DeleteArgs) -> Result<(), Exit> {
    let providers = builtin(&ProvidersConfig {
        foobernetes_file: a.exec.foobernetes_file.clone(),
    });
    let store = open_state(a.state.state.as_deref()).await?;
    let cancel = Arc::new(AtomicBool::new(false));
    cancel_on_ctrl_c(Arc::clone(&cancel));
    let lease = if a.dry_run {
        None
    } else {
        Some(locking::take(&store, &a.deployment, "delete", &a.exec.lock, Arc::clone(&cancel)).await?)
    };
    let progress = progress::Progress::new(a.exec.verbose);
    let sources = Sources::default();
    let engine = Engine {
        providers: &providers,
        store: store.as_ref(),
        observer: &progress,
        sources: &sources,
        concurrency: a.exec.concurrency as usize,
        cancel: &cancel,
    };
    let result = if a.dry_run {
        engine.plan_delete(&a.deployment).await
    } else {
        engine.delete(&a.deployment, &actor()).await
    };
    progress.finish();
    let kept = match lease {
        Some(held) => locking::release(&store, held).await,
        None => true,
    };
    let report = result.map_err(|e| engine_error(e, &sources))?;
    let reported = finish_report(&report, a.state.output, a.dry_run);
    if !kept {
        return Err(lease_lost(&a.deployment));
    }
    reported
}

fn graph(a: &args::GraphArgs) -> Result<(), Exit> {
    let providers = builtin(&ProvidersConfig::default());
    let loc = load::locate(&a.workflow, a.workflows.as_deref())?;
    let mut sources = Sources::default();
    let program = load::load_program(&loc, providers.schemas(), &mut sources)?;
    let g = Graph::of(&program.main);
    print(&match a.format {
        GraphFormat::Dot => g.to_dot(&program.main.name),
        GraphFormat::Mermaid => g.to_mermaid(),
    })
}

//! `lyra`: the command line. Thin: it parses arguments, reads files, wires the engine to the
//! state store and providers, and prints. All semantics live in `lyra-core`.

mod args;
mod exit;
mod load;
mod output;
mod progress;

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
        Command::State(StateCommand::List(a)) => state_list(&a).await,
        Command::State(StateCommand::Show(a)) => state_show(&a).await,
        Command::History(a) => history(&a).await,
    }
}

/// Writes to stderr. Messages for people are not worth failing (or panicking) over: a closed
/// or full stderr must not stop an apply half-way.
pub fn warn(s: &str) {
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// Writes to stdout; a closed pipe (`lyra ... | head`) is not an error.
fn print(s: &str) -> Result<(), Exit> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Exit::failure(format!("writing output: {e}"))),
        _ => Ok(()),
    }
}

fn json(v: &impl serde::Serialize) -> Result<(), Exit> {
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

async fn open_state(url: Option<&str>) -> Result<Arc<dyn StateStore>, Exit> {
    let url = url.unwrap_or(DEFAULT_STATE);
    lyra_state::open(url)
        .await
        .map_err(|e| Exit::failure(format!("state {url}: {e}")))
}

fn actor() -> String {
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
fn cancel_on_ctrl_c(flag: &'static AtomicBool) {
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
        print(&output::returns_text(&r.returns))?;
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
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    cancel_on_ctrl_c(cancel);
    let progress = progress::Progress::new(a.exec.verbose);
    let quiet = Quiet;
    let engine = Engine {
        providers: &providers,
        store: store.as_ref(),
        observer: if apply { &progress } else { &quiet },
        sources: &sources,
        concurrency: a.exec.concurrency as usize,
        cancel,
    };
    let result = if apply {
        engine.apply(&program, &deployment, &data, &actor()).await
    } else {
        engine.plan(&program, &deployment, &data).await
    };
    progress.finish();
    let report = result.map_err(|e| engine_error(e, &sources))?;
    finish_report(&report, a.workflow.output, !apply)
}

async fn delete(a: &args::DeleteArgs) -> Result<(), Exit> {
    let providers = builtin(&ProvidersConfig {
        foobernetes_file: a.exec.foobernetes_file.clone(),
    });
    let store = open_state(a.state.state.as_deref()).await?;
    let cancel: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    cancel_on_ctrl_c(cancel);
    let progress = progress::Progress::new(a.exec.verbose);
    let sources = Sources::default();
    let engine = Engine {
        providers: &providers,
        store: store.as_ref(),
        observer: &progress,
        sources: &sources,
        concurrency: a.exec.concurrency as usize,
        cancel,
    };
    let result = if a.dry_run {
        engine.plan_delete(&a.deployment).await
    } else {
        engine.delete(&a.deployment, &actor()).await
    };
    progress.finish();
    let report = result.map_err(|e| engine_error(e, &sources))?;
    finish_report(&report, a.state.output, a.dry_run)
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

async fn state_list(a: &args::StateArgs) -> Result<(), Exit> {
    let store = open_state(a.state.as_deref()).await?;
    let list = store.list().await.map_err(|e| Exit::failure(format!("state: {e}")))?;
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
                    output::time_text(r.started_at),
                    format!(
                        "{} {}",
                        r.operation.as_str(),
                        r.outcome.map_or("unfinished", |o| o.as_str())
                    ),
                )
            });
            vec![
                d.name.clone(),
                d.workflow.clone().unwrap_or_default(),
                d.resources.to_string(),
                when,
                outcome,
            ]
        })
        .collect();
    print(&output::table(
        &["DEPLOYMENT", "WORKFLOW", "RESOURCES", "LAST RUN", "OUTCOME"],
        &rows,
    ))
}

async fn state_show(a: &args::StateShowArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    let state = store
        .load(&a.deployment)
        .await
        .map_err(|e| Exit::failure(format!("state: {e}")))?
        .ok_or_else(|| Exit::failure(format!("no deployment '{}' in the state", a.deployment)))?;
    if a.state.output == Output::Json {
        return json(&output::state_json(&state));
    }
    let rows: Vec<Vec<String>> = state
        .resources
        .iter()
        .map(|r| {
            vec![
                r.step_id.clone(),
                r.type_name.clone(),
                r.external_id.clone(),
                if r.managed { "managed" } else { "read-only" }.to_owned(),
                r.depends_on.join(","),
            ]
        })
        .collect();
    print(&format!(
        "deployment {} (workflow {})\n{}",
        state.name,
        state.workflow.as_deref().unwrap_or("-"),
        output::table(&["STEP", "TYPE", "EXTERNAL ID", "MODE", "DEPENDS ON"], &rows)
    ))
}

async fn history(a: &args::HistoryArgs) -> Result<(), Exit> {
    let store = open_state(a.state.state.as_deref()).await?;
    let runs = store
        .history(&a.deployment)
        .await
        .map_err(|e| Exit::failure(format!("state: {e}")))?;
    if a.state.output == Output::Json {
        return json(&runs.iter().map(output::run_json).collect::<Vec<_>>());
    }
    if runs.is_empty() {
        return Err(Exit::failure(format!(
            "no runs recorded for deployment '{}'",
            a.deployment
        )));
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let c = &r.counts;
            vec![
                r.id.to_string(),
                output::time_text(r.started_at),
                r.operation.as_str().to_owned(),
                r.outcome.map_or("unfinished", |o| o.as_str()).to_owned(),
                r.actor.clone(),
                format!(
                    "+{} ~{} ±{} -{} !{}",
                    c.created, c.updated, c.replaced, c.deleted, c.failed
                ),
            ]
        })
        .collect();
    print(&output::table(
        &["RUN", "STARTED", "OPERATION", "OUTCOME", "ACTOR", "CHANGES"],
        &rows,
    ))
}

//! `lyra`: the command line. Thin: it parses arguments, reads files, wires the engine to the
//! state store and providers, and prints. All semantics live in `lyra-core`.

mod approve_cmd;
mod args;
mod confirm;
mod drift_cmd;
mod exit;
mod files;
mod fmt_cmd;
mod import_cmd;
mod load;
mod locking;
mod output;
mod output_cmd;
mod package_cmd;
mod progress;
mod providers_cmd;
mod register;
mod saved_plan;
mod signals;
mod state_cmd;
mod transfer;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;
use lyra_core::diag::Sources;
use lyra_core::engine::{Engine, EngineError, Observer, Quiet};
use lyra_core::graph::Graph;
use lyra_core::provider::Providers;
use lyra_core::report::Report;
use lyra_core::state::{Recorder, StoreError, StoreErrorKind};
use lyra_providers::{ProvidersConfig, builtin};
use lyra_state::Store;

use crate::args::{Cli, Command, GraphFormat, Output, StateCommand};
use crate::exit::{Exit, kind};

// A command allocates and frees a model, records and reports of every step: with glibc's
// malloc the allocator was a third of `validate`'s samples at 50,000 steps, and grew faster
// than the workflow did. The controller runs mimalloc too (ARCHITECTURE.md, `lyra-cli`).
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

const DEFAULT_STATE: &str = ".lyra/state.db";

fn main() -> ExitCode {
    // Registry clients (packages) and kube share rustls with the ring provider; without one
    // installed, the first TLS connection panics.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(&e)),
    };
    let output = cli.output;
    if cli.no_color {
        anstream::ColorChoice::Never.write_global();
    }
    // One thread runs the command (blocking work goes to Tokio's blocking threads): the engine
    // is one task, and on one thread a step that yields to let others queue their state
    // writes into its commit really waits for all of them (group commit), with no worker
    // threads woken to steal the task and hand it back.
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            return ExitCode::from(fail(
                Exit::failure(format!("cannot start the async runtime: {e}")),
                output,
            ));
        }
    };
    let code = match rt.block_on(run(cli)) {
        Ok(()) => Exit::SUCCESS,
        Err(exit) => fail(exit, output),
    };
    // Running provider calls of a cancelled run are not waited for.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

/// Reports a failed command: its message on stderr, and under `-o json` its error document on
/// stdout (scripts read that; people watching still see the message). Returns the exit code.
fn fail(exit: Exit, output: Output) -> u8 {
    if !exit.reported {
        warn(&format!("{}\n", exit.human().trim_end()));
        if output == Output::Json {
            let _ = json(&exit.document());
        }
    }
    exit.code
}

/// A command line clap refused. Help and version go where clap puts them; errors too, unless
/// `-o json` was asked for, which gets the error document (kind `usage`, exit 2).
fn usage_error(e: &clap::Error) -> u8 {
    let code = u8::try_from(e.exit_code()).unwrap_or(Exit::USAGE);
    if !e.use_stderr() || !json_requested(std::env::args_os().skip(1)) {
        let _ = e.print();
        return code;
    }
    let rendered = e.render().to_string();
    let message = rendered
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    fail(
        Exit::new(code, kind::USAGE, message).with("usage", rendered.trim_end()),
        Output::Json,
    )
}

/// Whether the arguments ask for `-o json` in any of the forms clap accepts.
fn json_requested(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    let mut it = args.iter().take_while(|a| *a != "--").peekable();
    while let Some(a) = it.next() {
        let value = match a.as_str() {
            "-o" | "--output" => it.peek().map(|v| v.as_str()),
            _ => a
                .strip_prefix("--output=")
                .or_else(|| a.strip_prefix("-o="))
                .or_else(|| a.strip_prefix("-o")),
        };
        if value == Some("json") {
            return true;
        }
    }
    false
}

async fn run(cli: Cli) -> Result<(), Exit> {
    let out = cli.output;
    let _ = PLUGIN_DIRS.set(cli.plugins.clone());
    match cli.command {
        Command::Providers(a) => providers_cmd::providers(&a, out).await,
        Command::Validate(a) => validate(&a, out).await,
        Command::Fmt(a) => fmt_cmd::fmt(&a, out),
        Command::Plan(a) => match &a.out {
            Some(_) if !a.run.targets.is_empty() => Err(Exit::usage(
                "a saved plan (--out) cannot be --target-ed yet: plan it whole",
            )),
            Some(file) => saved_plan::plan(&a, file, out).await,
            None => plan_or_apply(&a.run, false, a.detailed_exitcode, out).await,
        },
        // A plan file where the workflow goes: told apart by its content, not its name.
        Command::Apply(a) => match saved_plan::detect(Path::new(&a.workflow.workflow))? {
            Some(_) if !a.targets.is_empty() => Err(Exit::usage(
                "a saved plan applies as it was made: --target does not apply to it",
            )),
            Some(plan) => saved_plan::apply(&a, plan, out).await,
            None => plan_or_apply(&a, true, false, out).await,
        },
        Command::Show(a) => saved_plan::show(&a, out),
        Command::Delete(a) => delete(&a, out).await,
        Command::Drift(a) => drift_cmd::drift(&a, out).await,
        Command::Graph(a) => graph(&a, out).await,
        Command::Package(a) => package_cmd::package(&a, out).await,
        Command::Push(a) => package_cmd::push(&a, out).await,
        Command::Pull(a) => package_cmd::pull(&a, out).await,
        Command::Inspect(a) => package_cmd::inspect(&a, out).await,
        Command::State(c) => match c {
            StateCommand::List(a) => state_cmd::list(&a, out).await,
            StateCommand::Show(a) => state_cmd::show(&a, out).await,
            StateCommand::Rm(a) => state_cmd::rm(&a, out).await,
            StateCommand::Unlock(a) => state_cmd::unlock(&a, out).await,
            StateCommand::Export(a) => state_cmd::export(&a, out).await,
            StateCommand::Import(a) => state_cmd::import(&a, out).await,
            StateCommand::Migrate(a) => state_cmd::migrate(&a, out).await,
        },
        Command::History(a) => state_cmd::history(&a, out).await,
        Command::Output(a) => output_cmd::output(&a, out).await,
        Command::Import(a) => import_cmd::import(&a, out).await,
        Command::Crd => match out {
            Output::Json => json(&lyra_k8s::crd::crd_json()),
            Output::Text => print(&lyra_k8s::crd_yaml()),
        },
        Command::Register(a) => register::register(&a, out).await,
        Command::Approve(a) => approve_cmd::approve(&a, out).await,
    }
}

/// `--plugins` / `LYRA_PLUGIN_PATH`, set once at start.
static PLUGIN_DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// The built-in providers (as `config` sets them) and the plugins on the plugin path, whose
/// `plugins` directory is beside the load path `workflows`: Lyra plugins
/// (`lyra-provider-<name>`) and Terraform providers (`terraform-provider-<name>`). Plugins
/// that cannot start are named in warnings on stderr.
pub async fn providers_with_plugins(config: &ProvidersConfig, workflows: Option<&Path>) -> Providers {
    let mut providers = builtin(config);
    let dirs = PLUGIN_DIRS.get().map_or(&[][..], Vec::as_slice);
    let path = lyra_providers::plugins::plugin_path(dirs, workflows);
    let mut warnings = lyra_providers::plugins::load_plugins(&mut providers, &path).await;
    warnings.extend(lyra_providers::terraform::load_terraform_providers(&mut providers, &path).await);
    for w in warnings {
        warn(&format!("warning: {w}\n"));
    }
    providers
}

/// [`providers_with_plugins`] with the Foobernetes cloud at `foobernetes_file`: what every
/// command that runs resources uses.
pub async fn providers_for(foobernetes_file: &Path, workflows: Option<&Path>) -> Providers {
    let config = ProvidersConfig {
        foobernetes_file: foobernetes_file.to_path_buf(),
        ..ProvidersConfig::default()
    };
    providers_with_plugins(&config, workflows).await
}

/// Writes to stderr. Messages for people are not worth failing (or panicking) over: a closed
/// or full stderr must not stop an apply half-way.
pub fn warn(s: &str) {
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// Whether anything was written to stdout yet: a second signal's abort must not add a second
/// JSON document after the first.
static PRINTED: AtomicBool = AtomicBool::new(false);

pub fn printed() -> bool {
    PRINTED.load(Ordering::SeqCst)
}

/// Writes to stdout; a closed pipe (`lyra ... | head`) is not an error.
pub fn print(s: &str) -> Result<(), Exit> {
    PRINTED.store(true, Ordering::SeqCst);
    write_out(&mut std::io::stdout().lock(), s)
}

/// [`print`] for text with colours in it (a plan): they stay only on a terminal, without
/// NO_COLOR or --no-color (CLICOLOR_FORCE=1 keeps them). Not for anything the user wrote or
/// a machine reads: stripping would change its bytes.
pub fn print_styled(s: &str) -> Result<(), Exit> {
    PRINTED.store(true, Ordering::SeqCst);
    write_out(&mut anstream::stdout().lock(), s)
}

fn write_out(out: &mut impl std::io::Write, s: &str) -> Result<(), Exit> {
    written(out.write_all(s.as_bytes()).and_then(|()| out.flush()))
}

/// The outcome of writing output: a closed pipe (`| head`) is not a failure.
fn written(result: std::io::Result<()>) -> Result<(), Exit> {
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Exit::failure(format!("writing output: {e}"))),
        _ => Ok(()),
    }
}

/// Prints `v` as pretty JSON, written as it is serialised: a large document (the state of
/// 50,000 resources) is never held whole as text.
pub fn json(v: &impl serde::Serialize) -> Result<(), Exit> {
    use std::io::Write as _;
    PRINTED.store(true, Ordering::SeqCst);
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    written(
        serde_json::to_writer_pretty(&mut out, v)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush()),
    )
}

async fn validate(a: &args::WorkflowArgs, out: Output) -> Result<(), Exit> {
    let providers = providers_with_plugins(&ProvidersConfig::default(), a.workflows.as_deref()).await;
    let target = load::locate_target(a).await?;
    let mut sources = Sources::default();
    let result = load::parse_target(&target, providers.schemas(), &mut sources)?;
    if out == Output::Json {
        let diagnostics = match &result {
            Ok(_) => vec![],
            Err(d) => output::diagnostics_json(d, &sources),
        };
        let valid = diagnostics.is_empty();
        json(&output::ValidationJson {
            workflow: target.name(),
            valid,
            diagnostics,
        })?;
        left_for_exit((result, sources));
        return if valid {
            Ok(())
        } else {
            Err(Exit::reported(Exit::FAILURE))
        };
    }
    let program = result.map_err(|d| Exit::invalid(&d, &sources))?;
    let printed = print(&format!("{}: valid\n", target.name()));
    left_for_exit((program, sources));
    printed
}

/// The state URL as given (or the default), fit for messages: without a password.
pub fn state_label(url: Option<&str>) -> String {
    lyra_state::redact_url(url.unwrap_or(DEFAULT_STATE))
}

/// Opens the state, creating it if needed: for commands that record something new (`apply`,
/// `state import`, the target of `state migrate`).
pub async fn open_state(url: Option<&str>) -> Result<Arc<dyn Store>, Exit> {
    lyra_state::open(url.unwrap_or(DEFAULT_STATE))
        .await
        .map_err(|e| Exit::state(format!("{}: {e}", state_label(url))))
}

/// The store a plan reads: where no state exists yet it plans against an empty one, and
/// creates none. A plan changes nothing, so it never waits for (or blocks) a run that does.
async fn open_for_plan(url: Option<&str>) -> Result<Arc<dyn Recorder>, Exit> {
    match open_existing(url).await {
        Err(e) if e.kind == kind::NO_STATE => Ok(Arc::new(lyra_state::EmptyState {
            location: state_label(url),
        })),
        other => Ok(other?),
    }
}

/// Opens the state only if it exists: every command that reads, or changes only what is
/// already recorded, must not leave a new store behind (a mistyped `--state` would otherwise
/// create one, and then find nothing in it).
pub async fn open_existing(url: Option<&str>) -> Result<Arc<dyn Store>, Exit> {
    match lyra_state::open_existing(url.unwrap_or(DEFAULT_STATE)).await {
        Ok(store) => Ok(store),
        Err(lyra_state::Error::NoState { .. }) => Err(no_state(url)),
        Err(e) => Err(Exit::state(format!("{}: {e}", state_label(url)))),
    }
}

fn no_state(url: Option<&str>) -> Exit {
    let label = state_label(url);
    Exit::new(Exit::FAILURE, kind::NO_STATE, format!("no state at {label}"))
        .with("state", &label)
        .hint("nothing was ever recorded there: check --state (or LYRA_STATE); `lyra apply` creates the state")
}

/// The deployment is not recorded: exit 1 naming it, with the recorded names closest to it.
pub async fn unknown_deployment(store: &dyn Store, deployment: &str, url: Option<&str>) -> Exit {
    let known: Vec<String> = store
        .list()
        .await
        .map(|l| l.into_iter().map(|d| d.name).collect())
        .unwrap_or_default();
    not_found(deployment, &known, url)
}

/// [`unknown_deployment`] when the recorded names are at hand.
pub fn not_found(deployment: &str, known: &[String], url: Option<&str>) -> Exit {
    let label = state_label(url);
    let near = near_names(deployment, known.iter().map(String::as_str));
    let hint = if !near.is_empty() {
        format!("did you mean: {}?", near.join(", "))
    } else if known.is_empty() {
        "no deployment is recorded there".to_owned()
    } else {
        "`lyra state list` shows the recorded ones".to_owned()
    };
    Exit::new(
        Exit::FAILURE,
        kind::NOT_FOUND,
        format!("no deployment '{deployment}' in {label}"),
    )
    .with("deployment", deployment)
    .with("state", &label)
    .with("did_you_mean", &near)
    .hint(&hint)
}

/// The names closest to `name` by edit distance (case-insensitively), closest first, at most
/// three: typos, and names that contain it.
pub fn near_names<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Vec<String> {
    let wanted = name.to_lowercase();
    let mut scored: Vec<(usize, &str)> = known
        .filter_map(|k| {
            let lower = k.to_lowercase();
            let distance = strsim::levenshtein(&wanted, &lower);
            let limit = (wanted.chars().count().max(lower.chars().count()) / 3).max(2);
            let contains = wanted.chars().count() >= 3 && lower.contains(&wanted);
            (distance <= limit || contains).then_some((distance, k))
        })
        .collect();
    scored.sort_unstable();
    scored.into_iter().take(3).map(|(_, k)| k.to_owned()).collect()
}

/// Who runs this command, as recorded in leases and the history.
pub fn actor() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

/// Prints a run's report, and ends the command by its outcome. When the lease was lost during
/// the run, the command fails: under `-o json` the error document then carries the report.
fn finish_report(r: &Report, out: Output, plan: bool, lost: Option<Exit>) -> Result<(), Exit> {
    match (out, lost) {
        (Output::Json, Some(lost)) => return Err(lost.with("report", output::report_json(r))),
        (Output::Json, None) => json(&output::report_json(r))?,
        (Output::Text, lost) => {
            if plan {
                print_styled(&output::plan_coloured(r))?;
            } else {
                warn(&output::result_text(r));
                print(&output::returns_text(&output::masked_returns(r)))?;
            }
            if let Some(lost) = lost {
                return Err(lost);
            }
        }
    }
    match r.outcome {
        lyra_core::state::Outcome::Succeeded => Ok(()),
        lyra_core::state::Outcome::Cancelled => Err(Exit::reported(Exit::INTERRUPTED)),
        lyra_core::state::Outcome::Failed => Err(Exit::reported(Exit::FAILURE)),
    }
}

fn engine_error(e: EngineError, sources: &Sources) -> Exit {
    match e {
        EngineError::Input(d) => Exit::invalid(&d, sources),
        EngineError::Store(e) => Exit::state(e),
    }
}

/// How a run under a lease ends the command: a lease lost during the run (seen by the
/// renewer, or a write the store refused because the lease was no longer ours) fails it with
/// `lease_lost`, after the report when there is one.
fn finish_leased(
    result: Result<Report, EngineError>,
    kept: bool,
    deployment: &str,
    sources: &Sources,
    out: Output,
) -> Result<(), Exit> {
    let report = match result {
        Err(EngineError::Store(e)) if fenced(&e) => return Err(locking::lease_lost(deployment)),
        other => other.map_err(|e| engine_error(e, sources))?,
    };
    finish_report(&report, out, false, (!kept).then(|| locking::lease_lost(deployment)))
}

/// The engine of a command, recording through `store`.
fn engine<'a>(
    concurrency: u32,
    providers: &'a Providers,
    store: &'a dyn Recorder,
    observer: &'a dyn Observer,
    sources: &'a Sources,
    cancel: &'a AtomicBool,
) -> Engine<'a> {
    Engine {
        providers,
        store,
        observer,
        sources,
        concurrency: concurrency as usize,
        cancel,
        hints: &lyra_host::Advice,
        timer: &lyra_providers::TokioTimer,
        leave_to_exit: true,
    }
}

/// `--target`s must name steps there are: a typo would otherwise run nothing, successfully.
fn check_targets(targets: &[String], program: &lyra_core::program::Program) -> Result<(), Exit> {
    // Listed only when asked for: every step's id, which a run without targets never needs.
    if targets.is_empty() {
        return Ok(());
    }
    let known = lyra_core::engine::target_names(program);
    for t in targets {
        if !known.contains(t) {
            let near = near_names(t, known.iter().map(String::as_str));
            let hint = if near.is_empty() {
                format!("the workflow's steps: {}", known.join(", "))
            } else {
                format!("did you mean: {}?", near.join(", "))
            };
            return Err(Exit::usage(format!("--target {t:?}: the workflow has no step {t:?}"))
                .with("did_you_mean", &near)
                .hint(&hint));
        }
    }
    Ok(())
}

/// The question before a run was not answered `yes`.
fn declined_exit(what: &str) -> Exit {
    Exit::new(
        Exit::FAILURE,
        kind::DECLINED,
        format!("{what} cancelled: nothing was changed"),
    )
}

fn fenced(e: &StoreError) -> bool {
    e.kind == StoreErrorKind::LeaseLost
}

async fn plan_or_apply(a: &args::RunArgs, apply: bool, detailed: bool, out: Output) -> Result<(), Exit> {
    let providers = providers_for(&a.exec.foobernetes_file, a.workflow.workflows.as_deref()).await;
    let mut sources = Sources::default();
    let target = load::locate_run(&a.workflow, a.name.is_some()).await?;
    let deployment = a.name.clone().unwrap_or_else(|| target.name().to_owned());
    let cancel = Arc::new(AtomicBool::new(false));
    // The state is read while the workflow is parsed on another thread: on a large deployment
    // each takes a while, and they need each other only once the run starts. A plan reads it
    // as it is; an apply reads it under the deployment's lease, taken now if it is free (if
    // not, the lease is waited for once the workflow is known good, as before). An apply with
    // no state yet parses here: nothing to read beside it, and the engine then reuses the
    // memory the parse freed (on another thread, a first apply of 10,000 steps took 3 ms and
    // 3 MB more). The state is made only once the workflow is known good.
    let schemas = providers.schemas().clone();
    let parse = move || {
        let parsed = load::parse_run(&target, &schemas, &mut sources);
        (parsed, sources)
    };
    let existing = if apply {
        // Installed first: a Ctrl-C while the lease is held must release it.
        signals::install(Arc::clone(&cancel), out);
        lyra_state::open_existing(a.state.as_deref().unwrap_or(DEFAULT_STATE))
            .await
            .ok()
    } else {
        None
    };
    let ((parsed, parsed_sources), preload, early) = if apply && existing.is_none() {
        (parse(), None, None)
    } else {
        let parse = tokio::task::spawn_blocking(parse);
        let (preload, early) = match &existing {
            Some(store) => (None, early_lease(a, store, &deployment, &cancel).await),
            None => {
                let store = open_for_plan(a.state.as_deref()).await;
                let state = match &store {
                    Ok(store) => Some(store.load(&deployment).await),
                    Err(_) => None,
                };
                (Some((store, state)), None)
            }
        };
        // Never cancelled: an error is its panic, passed on.
        let parsed = parse
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        (parsed, preload, early)
    };
    sources = parsed_sources;
    // Errors in the order they were found before: the workflow, its data and targets, an
    // interruption meanwhile, then the state.
    let ready = parsed.and_then(|program| {
        let data = load::load_data(a.data.as_deref(), &a.vars, &mut sources)?;
        check_targets(&a.targets, &program)?;
        if apply && cancel.load(Ordering::SeqCst) {
            return Err(Exit::interrupted(
                "interrupted before the apply started: nothing was changed".to_owned(),
            ));
        }
        Ok((program, data))
    });
    let (program, data) = match ready {
        Ok(ready) => ready,
        Err(e) => {
            if let Some((early, _)) = early {
                locking::give_back(early).await;
            }
            return Err(e);
        }
    };
    if !a.targets.is_empty() {
        warn(&format!(
            "warning: only {} and what {} depend{} on {}: the rest of the deployment is left as it is \
             (a run without --target converges it all)\n",
            a.targets.join(", "),
            if a.targets.len() == 1 { "it" } else { "they" },
            if a.targets.len() == 1 { "s" } else { "" },
            if apply { "is applied" } else { "is planned" },
        ));
    }
    let progress = progress::Progress::new(a.exec.verbose);
    let observer: &dyn Observer = if apply { &progress } else { &Quiet };
    if let Some((store, state)) = preload {
        // Where loading failed, the state's error comes after the workflow's.
        let store =
            store.map(|store| lyra_core::state::Preloaded::new(store, &deployment, state.unwrap_or(Ok(None))))?;
        signals::install(Arc::clone(&cancel), out);
        let result = engine(a.exec.concurrency, &providers, &store, observer, &sources, &cancel)
            .plan_targets(&program, &deployment, &data, &a.targets)
            .await;
        progress.finish();
        let report = result.map_err(|e| engine_error(e, &sources))?;
        finish_report(&report, out, true, None)?;
        let pending = saved_plan::pending(&report, detailed);
        left_for_exit((report, program, sources));
        return pending;
    }
    let run = ApplyRun {
        a,
        program: &program,
        data: &data,
        deployment: &deployment,
        providers: &providers,
        sources: &sources,
        cancel: &cancel,
        observer,
        ask: confirm::wanted(a.exec.yes, out),
        declined: AtomicBool::new(false),
    };
    let run = &run;
    let (result, kept) = match early {
        Some((early, state)) => {
            locking::under_early(early, &deployment, |leased| async move {
                let recorder: Arc<dyn Recorder> = Arc::new(leased.recorder().clone());
                run.apply(&lyra_core::state::Preloaded::new(recorder, run.deployment, state))
                    .await
            })
            .await
        }
        None => {
            // Held meanwhile, or no state yet (made now).
            let store = match existing {
                Some(store) => store,
                None => open_state(a.state.as_deref()).await?,
            };
            locking::under_lease(
                &store,
                &deployment,
                "apply",
                &a.exec.lock,
                &cancel,
                |leased| async move { run.apply(leased.recorder()).await },
            )
            .await?
        }
    };
    progress.finish();
    if run.declined.load(Ordering::SeqCst) {
        return Err(declined_exit("apply"));
    }
    let finished = finish_leased(result, kept, &deployment, &sources, out);
    left_for_exit((program, sources));
    finished
}

/// The lease of an existing state, when it is free now, and the state read under it: see
/// [`plan_or_apply`]. None otherwise, with nothing printed.
async fn early_lease(
    a: &args::RunArgs,
    store: &Arc<dyn Store>,
    deployment: &str,
    cancel: &Arc<AtomicBool>,
) -> Option<(
    locking::Early,
    Result<Option<lyra_core::state::DeploymentState>, StoreError>,
)> {
    let early = locking::take_if_free(store, deployment, "apply", &a.exec.lock, cancel).await?;
    let state = store.load(deployment).await;
    Some((early, state))
}

/// An apply's run under its lease: planned and confirmed first when asked, then applied.
struct ApplyRun<'a> {
    a: &'a args::RunArgs,
    program: &'a lyra_core::program::Program,
    data: &'a lyra_core::value::Map,
    deployment: &'a str,
    providers: &'a Providers,
    sources: &'a Sources,
    cancel: &'a Arc<AtomicBool>,
    observer: &'a dyn Observer,
    ask: bool,
    declined: AtomicBool,
}

impl ApplyRun<'_> {
    async fn apply(&self, recorder: &dyn Recorder) -> Result<Report, EngineError> {
        let (a, name) = (self.a, self.deployment);
        if self.ask {
            // Planned under the lease: what is shown is what the apply starts from.
            let plan = engine(
                a.exec.concurrency,
                self.providers,
                recorder,
                &Quiet,
                self.sources,
                self.cancel,
            )
            .plan_targets(self.program, name, self.data, &a.targets)
            .await?;
            if saved_plan::changes(&plan) {
                let _ = print_styled(&output::plan_coloured(&plan));
                if !confirm::ask(&format!("Apply these changes to deployment '{name}'?")).await {
                    self.declined.store(true, Ordering::SeqCst);
                    return Ok(plan);
                }
            }
        }
        engine(
            a.exec.concurrency,
            self.providers,
            recorder,
            self.observer,
            self.sources,
            self.cancel,
        )
        .apply_targets(self.program, name, self.data, &actor(), &a.targets)
        .await
    }
}

/// Leaves a large value (a workflow's model, a run's report) to the end of the process,
/// which comes right after the command: freeing a model of 10,000 steps piece by piece
/// costs as much as a good part of planning it, for memory the process is about to return.
fn left_for_exit<T>(value: T) {
    std::mem::forget(value);
}

async fn delete(a: &args::DeleteArgs, out: Output) -> Result<(), Exit> {
    let providers = providers_for(&a.exec.foobernetes_file, None).await;
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    // Deleting a deployment that is not recorded is a mistake to report (a typo), not a
    // success, and must not record anything.
    let Some(recorded) = store.load(&a.deployment).await.map_err(Exit::state)? else {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    };
    for t in &a.targets {
        if !recorded
            .resources
            .iter()
            .any(|r| lyra_core::engine::target_covers(t, &r.step_id))
        {
            let ids: Vec<&str> = recorded.resources.iter().map(|r| r.step_id.as_str()).collect();
            let near = near_names(t, ids.iter().copied());
            return Err(Exit::new(
                Exit::FAILURE,
                kind::NOT_FOUND,
                format!("--target {t:?}: deployment '{}' records no step {t:?}", a.deployment),
            )
            .with("deployment", &a.deployment)
            .with("step", t)
            .with("did_you_mean", &near)
            .hint("`lyra state show` lists the recorded steps"));
        }
    }
    if !a.targets.is_empty() {
        warn(&format!(
            "warning: only {} and what was built from {} {}: the rest of the deployment stays\n",
            a.targets.join(", "),
            if a.targets.len() == 1 { "it" } else { "them" },
            if a.dry_run { "would be deleted" } else { "is deleted" },
        ));
    }
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let progress = progress::Progress::new(a.exec.verbose);
    let sources = Sources::default();
    if a.dry_run {
        let result = engine(
            a.exec.concurrency,
            &providers,
            store.as_ref(),
            &progress,
            &sources,
            &cancel,
        )
        .plan_delete_targets(&a.deployment, &a.targets)
        .await;
        progress.finish();
        let report = result.map_err(|e| engine_error(e, &sources))?;
        finish_report(&report, out, true, None)?;
        return saved_plan::pending(&report, a.detailed_exitcode);
    }
    let (providers, progress_ref, sources_ref, cancel_ref) = (&providers, &progress, &sources, &cancel);
    let ask = confirm::wanted(a.exec.yes, out);
    let declined = AtomicBool::new(false);
    let declined_ref = &declined;
    let (result, kept) = locking::under_lease(
        &store,
        &a.deployment,
        "delete",
        &a.exec.lock,
        &cancel,
        |leased| async move {
            if ask {
                let plan = engine(
                    a.exec.concurrency,
                    providers,
                    leased.recorder(),
                    &Quiet,
                    sources_ref,
                    cancel_ref,
                )
                .plan_delete_targets(&a.deployment, &a.targets)
                .await?;
                if saved_plan::changes(&plan) {
                    let _ = print_styled(&output::plan_coloured(&plan));
                    let question = format!("Delete these resources of deployment '{}'?", a.deployment);
                    if !confirm::ask(&question).await {
                        declined_ref.store(true, Ordering::SeqCst);
                        return Ok(plan);
                    }
                }
            }
            engine(
                a.exec.concurrency,
                providers,
                leased.recorder(),
                progress_ref,
                sources_ref,
                cancel_ref,
            )
            .delete_targets(&a.deployment, &actor(), &a.targets)
            .await
        },
    )
    .await?;
    progress.finish();
    if declined.load(Ordering::SeqCst) {
        return Err(declined_exit("delete"));
    }
    finish_leased(result, kept, &a.deployment, &sources, out)
}

async fn graph(a: &args::GraphArgs, out: Output) -> Result<(), Exit> {
    let providers = providers_with_plugins(&ProvidersConfig::default(), a.workflow.workflows.as_deref()).await;
    let target = load::locate_target(&a.workflow).await?;
    let mut sources = Sources::default();
    let program = load::load_target(&target, providers.schemas(), &mut sources)?;
    let g = Graph::of(&program.main);
    if out == Output::Json {
        return json(&output::graph_json(&program.main.name, &g));
    }
    print(&match a.format {
        GraphFormat::Dot => g.to_dot(&program.main.name),
        GraphFormat::Mermaid => g.to_mermaid(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_json_in_every_spelling() {
        let yes = |args: &[&str]| json_requested(args.iter().map(std::ffi::OsString::from));
        for args in [
            &["state", "list", "-o", "json"][..],
            &["-ojson", "state"],
            &["--output=json"],
            &["-o=json"],
            &["--output", "json", "x"],
        ] {
            assert!(yes(args), "{args:?}");
        }
        for args in [&["-o", "text"][..], &["--", "-o", "json"], &["-o"], &["json"]] {
            assert!(!yes(args), "{args:?}");
        }
    }

    #[test]
    fn near_names_are_close_or_containing() {
        let known = ["webapp", "webapp-staging", "db", "shop"];
        let near = |n: &str| near_names(n, known.iter().copied());
        assert_eq!(near("wepapp"), ["webapp"]);
        assert_eq!(near("WEBAPP"), ["webapp", "webapp-staging"]);
        assert_eq!(near("staging"), ["webapp-staging"]);
        assert!(near("nosuch").is_empty());
        assert_eq!(near("dc"), ["db"]);
    }
}

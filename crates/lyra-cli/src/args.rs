//! Command-line arguments. Doc comments are the help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lyra_core::names::check_deployment_name;

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    a step failed, or the workflow or its input is invalid
  2    usage error (bad arguments, workflow not found)
  3    the deployment is locked by another run (see --lock-timeout)
  4    changes pending: `plan --detailed-exitcode`, `delete --dry-run --detailed-exitcode`
       or drift found: `drift`
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP)

The first Ctrl-C (or SIGTERM, SIGHUP) lets running steps finish and be recorded and starts no
more; a second one releases the deployment's lease and exits at once (what was running is
recorded as pending, and the next run resolves it).
With -o json every command prints exactly one JSON document on stdout, failures included
({\"error\": {...}}); see docs/json-output.md.";

/// Lyra: infrastructure workflows whose order is inferred from the data they exchange.
///
/// Write a workflow in YAML, check it with `lyra validate`, preview it with `lyra plan`, make it
/// so with `lyra apply`, and tear it down with `lyra delete`. State is kept in an embedded
/// SQLite file under ./.lyra/ unless --state says otherwise;
/// a Postgres state (`--state postgres://…`) is shared with teammates and `lyra-controller`.
#[derive(Debug, Parser)]
#[command(name = "lyra", version, propagate_version = true, max_term_width = 100, after_long_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Output format: `json` prints exactly one JSON document on stdout, errors included.
    #[arg(short, long, global = true, value_enum, default_value_t)]
    pub output: Output,
    /// Where provider plugins are found, besides the `plugins` directory next to the load path
    /// (`./plugins` for `./workflows`); repeatable, or `:`-separated in LYRA_PLUGIN_PATH.
    /// Lyra plugins are `lyra-provider-<name>` executables; Terraform providers are
    /// `terraform-provider-<name>[_v<version>]`, there or in Terraform's mirror layout beneath
    /// (their types are `Tf<Name>::<Type>`). Each is started and its types are served like the
    /// built-in ones; one that cannot start is named in a warning and left out.
    #[arg(
        long = "plugins",
        global = true,
        env = "LYRA_PLUGIN_PATH",
        value_delimiter = ':',
        value_name = "DIR"
    )]
    pub plugins: Vec<PathBuf>,
    /// No colour, even on a terminal (as NO_COLOR=1 does). Colour is only ever written to a
    /// terminal; CLICOLOR_FORCE=1 writes it to pipes too.
    #[arg(long, global = true)]
    pub no_color: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List every resource type with its attributes, and the settings each provider takes.
    ///
    /// Flags: required (the workflow must set it), provided (the provider fills it in unless
    /// set), computed (read-only: only the provider sets it), immutable (a change replaces the
    /// resource), sensitive (never shown). Validation checks workflows against these schemas.
    /// Provider settings go in the main workflow's `providers:` block.
    #[command(after_long_help = EXIT_CODES)]
    Providers(ProvidersArgs),
    /// Check a workflow and report every problem at once.
    #[command(after_long_help = EXIT_CODES)]
    Validate(WorkflowArgs),
    /// Rewrite workflow YAML in its canonical layout, keeping comments; `--check` for CI.
    ///
    /// Canonical: 2 spaces per level of block mappings and sequences (a sequence under a key is
    /// indented under it); one space after `key:` and `-`; full-line comments indented with the
    /// lines around them, one space before a trailing comment's `#`; no trailing whitespace, LF
    /// line endings, one final newline, runs of blank lines made one. Scalars (quotes, block
    /// scalars' text), flow collections (`{a: 1}`, `[x, y]`) and comments' text are kept as
    /// written. A file is rewritten only if the result parses to exactly the same data; a file
    /// that is not YAML is reported at file:line:column and left alone. See docs/fmt.md.
    #[command(after_long_help = EXIT_CODES)]
    Fmt(FmtArgs),
    /// Show what `apply` would change, without changing anything.
    ///
    /// With --out FILE the plan is saved, for `lyra show FILE` and `lyra apply FILE`, which
    /// applies exactly it or refuses when anything it was made from has changed (see
    /// docs/saved-plans.md).
    #[command(after_long_help = EXIT_CODES)]
    Plan(PlanArgs),
    /// Create, update and delete resources until the deployment matches the workflow.
    ///
    /// Given a plan file (`lyra plan --out FILE`) where the workflow goes, applies exactly that
    /// plan: the workflow, data and `--var`s are read again from where the plan read them (give
    /// the same `--var`s), the state and the plan are checked under the deployment's lease, and
    /// if anything moved since the plan was made nothing is changed (exit 1, `stale_plan`).
    #[command(after_long_help = EXIT_CODES)]
    Apply(RunArgs),
    /// Print a plan saved by `lyra plan --out FILE`, and what it was made from.
    #[command(after_long_help = EXIT_CODES)]
    Show(ShowArgs),
    /// Delete every resource of a deployment, in reverse dependency order.
    ///
    /// Needs only the state, not the workflow: the state records what depends on what.
    #[command(after_long_help = EXIT_CODES)]
    Delete(DeleteArgs),
    /// Report what changed behind Lyra's back: read every recorded resource and compare.
    ///
    /// Each resource the deployment records is read through its provider (with the settings it
    /// was recorded with; no workflow is needed) and every attribute whose value differs from
    /// the recorded one is listed, nested values as paths (`config.name`). Secret values are
    /// reported changed, never shown. Writes nothing, and so takes no lease, unless
    /// --refresh-state. Read-only (`external_id`) resources are read too; pending ones (an
    /// interrupted create) are listed as not checked.
    #[command(after_long_help = DRIFT_EXIT_CODES)]
    Drift(DriftArgs),
    /// Print the dependency graph of a workflow (DOT or Mermaid).
    Graph(GraphArgs),
    /// Inspect, repair and move the recorded state.
    #[command(subcommand)]
    State(StateCommand),
    /// Show the runs of a deployment, newest first.
    History(HistoryArgs),
    /// Print a deployment's returns, as its last succeeded apply recorded them.
    ///
    /// All of them as `name: value` lines, or one by NAME: a string as it is (for
    /// `$(lyra output web url)`), anything else as JSON. Secret (Sensitive) returns are
    /// recorded masked and shown as `(sensitive)`; asking for one by NAME fails. When
    /// the latest apply failed or was cancelled, the returns of the one before it are shown,
    /// with a note on stderr; after a delete there are none.
    #[command(after_long_help = EXIT_CODES)]
    Output(OutputArgs),
    /// Adopt a resource that exists into a step of a deployment, then show the plan.
    ///
    /// The resource is read by its id (what `lyra state show` lists as the external id, e.g.
    /// a Foobernetes instance's id, a Postgres role's name) and recorded as the step's, under
    /// the deployment's lease, as an `import` run in the history. Nothing is created, changed
    /// or deleted: the plan printed after is what the next apply would change to make it
    /// match the workflow. The step must be one of the workflow's own resource steps (not
    /// inside a collection or a call, and without `external_id:`) with no resource recorded.
    #[command(after_long_help = EXIT_CODES)]
    Import(ImportArgs),
    /// Package a workflow and everything it calls as an OCI artifact; print its digest.
    ///
    /// Writes an OCI image layout: a directory, or a `.tar` of one when --out ends in `.tar`
    /// (default: NAME-VERSION.tar). The same inputs give the same digest: `created` is
    /// SOURCE_DATE_EPOCH when set, else 1970-01-01T00:00:00Z. Invalid workflows are refused.
    // `--version` is the package's: lyra's own version is `lyra --version`.
    #[command(after_long_help = EXIT_CODES, disable_version_flag = true)]
    Package(PackageArgs),
    /// Push a package to a registry; print the reference pinned by digest.
    #[command(after_long_help = EXIT_CODES)]
    Push(PushArgs),
    /// Pull a package from a registry into a layout (verified against its digest).
    #[command(after_long_help = EXIT_CODES)]
    Pull(PullArgs),
    /// Show a package's name, version, digest, parameters, returns, resource types and files.
    #[command(after_long_help = EXIT_CODES)]
    Inspect(InspectArgs),
    /// Print Lyra's Kubernetes CustomResourceDefinitions: `Workflow` and `WorkflowDefinition` (YAML; JSON with -o json).
    ///
    /// Install it with `lyra crd | kubectl apply -f -`; then run `lyra-controller`.
    Crd,
    /// Register a package as a Kubernetes kind of its own (creates or updates a
    /// WorkflowDefinition; lyra-controller generates the CRD and runs every object of it).
    Register(RegisterArgs),
    /// Approve the plan a Kubernetes object with `approval: Manual` waits on.
    ///
    /// Reads the object's `status.plan` (what lyra-controller planned, secrets masked), shows
    /// it, asks on a terminal (unless --yes), and sets the annotation
    /// `lyra.dev/approve-plan` to the plan's hash. The controller applies only while that
    /// hash is the hash of the plan it computes then: if anything moved meanwhile, a new plan
    /// waits instead. Refused (exit 1) when no plan awaits approval. See docs/approval.md.
    #[command(after_long_help = EXIT_CODES)]
    Approve(ApproveArgs),
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The object's name (a `Workflow`, or an object of the kind --kind names).
    pub name: String,
    /// The object's namespace. Default: the kubeconfig context's.
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// A registered kind (its Kind, plural, or `plural.group`) instead of `Workflow`.
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// Approve without asking (it never asks when stdin is not a terminal, or under -o json).
    #[arg(short = 'y', long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The package: an OCI layout directory, a `.tar` of one, or `oci://HOST/REPO[:TAG][@DIGEST]`
    /// (a tag is resolved to its digest now, once).
    #[arg(value_name = "PKG|REF")]
    pub package: String,
    /// The kind. Default: the package's name in CamelCase (`web_app` → `WebApp`).
    #[arg(long)]
    pub kind: Option<String>,
    /// The kind's plural. Default: the kind in lower case, plus `s`.
    #[arg(long)]
    pub plural: Option<String>,
    /// The API group. Default: workflows.lyra.dev.
    #[arg(long)]
    pub group: Option<String>,
    /// The WorkflowDefinition's name. Default: the package's name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Change nothing: print the schema diff and, for every existing object of the kind,
    /// the plan the new version would run.
    #[arg(long)]
    pub dry_run: bool,
    /// Upgrade even when the new schema breaks existing objects (a parameter removed, a
    /// type changed, a required one added...); sets the lyra.dev/allow-breaking annotation.
    #[arg(long)]
    pub allow_breaking: bool,
    /// The state `--dry-run` plans against (shared with lyra-controller).
    #[arg(long, env = "LYRA_STATE", hide_env_values = true, value_name = "URL")]
    pub state: Option<String>,
    /// Where the Foobernetes provider keeps its imaginary cloud (for `--dry-run`).
    #[arg(
        long,
        env = "LYRA_FOOBERNETES_FILE",
        default_value = "deployment.json",
        value_name = "FILE"
    )]
    pub foobernetes_file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// List deployments with their resource counts, last run and lease holder.
    List(StateArgs),
    /// Show the resources recorded for a deployment (sensitive values masked).
    Show(StateShowArgs),
    /// Forget resources without deleting them, for recovery.
    ///
    /// The resources stay wherever they are; Lyra just stops managing them, so the next apply
    /// creates them anew (providers that track idempotency keys, like Foobernetes, hand back
    /// the one they already made if it still exists). A step name also forgets what lies under it (`servers` forgets
    /// `servers/0`, `servers/1`…). Takes the deployment's lease and is kept in the history.
    #[command(after_long_help = EXIT_CODES)]
    Rm(StateRmArgs),
    /// Show who holds a deployment's lease; with --force, break it (e.g. one left by a crash).
    ///
    /// Without --force this only shows the holder. Breaking is only needed when waiting for the
    /// lease to expire is not an option. Make sure the holder is really gone: two runs on one
    /// deployment can make duplicates. Kept in the history.
    #[command(after_long_help = EXIT_CODES)]
    Unlock(StateUnlockArgs),
    /// Write deployments' state and history as JSON (all deployments unless named).
    ///
    /// The export carries every recorded value as it is, secrets included (values typed
    /// `Sensitive` are not masked here, unlike everywhere else): it is what `lyra state
    /// import` restores. Keep the file as safe as the state itself. Records that cannot be
    /// read are named on stderr and left out, and the command then exits with 1.
    #[command(after_long_help = EXIT_CODES)]
    Export(StateExportArgs),
    /// Read deployments written by `lyra state export` into this state.
    #[command(after_long_help = EXIT_CODES)]
    Import(StateImportArgs),
    /// Move deployments from one state store to another (e.g. SQLite to Postgres).
    ///
    /// Each deployment is locked in both stores, copied with its history, checked, and then
    /// dropped from the source (unless --keep-source).
    #[command(after_long_help = EXIT_CODES)]
    Migrate(StateMigrateArgs),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable text.
    #[default]
    Text,
    /// One JSON document on stdout (logs and progress stay on stderr).
    Json,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    #[default]
    Dot,
    Mermaid,
}

#[derive(Debug, Args)]
pub struct WorkflowArgs {
    /// A workflow name found on the load path (`a::b` is `a/b.yaml`), a path to a file, or a
    /// package: a layout directory, a `.tar` of one, or `oci://HOST[:PORT]/REPO[:TAG][@DIGEST]`.
    pub workflow: String,
    /// Directory holding workflows (the load path). Default: ./workflows.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct FmtArgs {
    /// Workflow files, or directories to format every `*.yaml` and `*.yml` beneath (hidden
    /// ones left out); `-` formats stdin to stdout. Default: the load path (./workflows, or
    /// . when there is none).
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Write nothing: list the files that are not formatted, and exit 1 if there are any.
    #[arg(long)]
    pub check: bool,
    /// Write nothing: print a unified diff of what formatting would change.
    #[arg(long)]
    pub diff: bool,
    /// The load path, formatted when no PATH is given.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
}

/// How registries are reached (credentials: LYRA_REGISTRY_USERNAME and
/// LYRA_REGISTRY_PASSWORD, else the Docker config's `auths`).
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Reach this registry (HOST[:PORT]) over plain HTTP; repeatable. Loopback registries
    /// always are.
    #[arg(
        long = "insecure-registry",
        env = "LYRA_INSECURE_REGISTRIES",
        value_delimiter = ',',
        value_name = "HOST",
        hide_short_help = true
    )]
    pub insecure: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PackageArgs {
    /// The main workflow: a name on the load path or a path to a file.
    pub workflow: String,
    /// Directory holding workflows (the load path). Default: ./workflows.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// The package's version (SemVer). Default: 0.0.0.
    #[arg(long, value_name = "SEMVER")]
    pub version: Option<String>,
    /// Where to write the layout: a directory, or a `.tar` file. Default: NAME-VERSION.tar.
    /// (`-o` is the output format.)
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The package: a layout directory or a `.tar` of one.
    pub package: String,
    /// Where to: oci://HOST[:PORT]/REPO[:TAG]. The tag defaults to the package version.
    pub target: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// The package: oci://HOST[:PORT]/REPO[:TAG][@DIGEST] (or a layout or `.tar`, to copy).
    pub reference: String,
    /// Where to write it: a directory, or a `.tar` file. Default: NAME-VERSION.tar.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The package: a layout directory, a `.tar` of one, or an oci:// reference.
    pub reference: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct StateArgs {
    /// Where state is kept: a SQLite file (path or sqlite://PATH) or a Postgres database
    /// (postgres://USER@HOST/DB, optionally ?schema=NAME). Default: ./.lyra/state.db.
    #[arg(long, env = "LYRA_STATE", hide_env_values = true, value_name = "URL")]
    pub state: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub workflow: WorkflowArgs,
    /// Data for lookups (YAML). Default: ./data.yaml when it exists.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Set a data value, overriding the data file; repeatable. `a.b=x` sets a nested key.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Deployment name: the state is kept per deployment. Default: the workflow's name.
    #[arg(long, value_name = "DEPLOYMENT", value_parser = DeploymentName)]
    pub name: Option<String>,
    /// Where state is kept: a SQLite file (path or sqlite://PATH) or a Postgres database
    /// (postgres://USER@HOST/DB, optionally ?schema=NAME). Default: ./.lyra/state.db.
    #[arg(long, env = "LYRA_STATE", hide_env_values = true, value_name = "URL")]
    pub state: Option<String>,
    /// Only this step of the workflow (one of its own, as `lyra graph` names them) and the
    /// steps it depends on; repeatable. The rest of the deployment is left as recorded and
    /// nothing is deleted as garbage, so the deployment may be left partially applied: a run
    /// without --target converges it all. Not with saved plans.
    #[arg(long = "target", value_name = "STEP")]
    pub targets: Vec<String>,
    #[command(flatten)]
    pub exec: ExecArgs,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Save the plan to FILE (written atomically, readable by its owner only), for `lyra show
    /// FILE` and `lyra apply FILE`. Creates the state store if there is none: the file is
    /// bound to it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Exit 0 when nothing would change, 4 when something would, 1 on error (2 stays a usage
    /// error).
    #[arg(long)]
    pub detailed_exitcode: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A plan file written by `lyra plan --out FILE`.
    pub file: PathBuf,
}

/// How a run that changes things is executed.
#[derive(Debug, Args)]
pub struct ProvidersArgs {
    /// Only this resource type (`Postgres::Role`) or provider (`Postgres`).
    pub name: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// At most this many resource operations at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Where the Foobernetes provider keeps its imaginary cloud.
    #[arg(
        long,
        env = "LYRA_FOOBERNETES_FILE",
        default_value = "deployment.json",
        value_name = "FILE"
    )]
    pub foobernetes_file: PathBuf,
    /// Print a line per step even when stderr is not a terminal.
    #[arg(short, long)]
    pub verbose: bool,
    /// `apply` and `delete` on a terminal show the plan and ask before changing anything;
    /// this answers yes. They never ask when stdin is not a terminal, or under `-o json`.
    #[arg(short = 'y', long)]
    pub yes: bool,
    #[command(flatten)]
    pub lock: LockArgs,
}

/// How a command that changes a deployment takes its lease (`plan` takes none).
#[derive(Debug, Args)]
pub struct LockArgs {
    /// When another run holds the deployment, wait up to this long (e.g. `30s`, `5m`)
    /// instead of failing at once with exit code 3.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub lock_timeout: Option<std::time::Duration>,
    /// How long the lease outlives a holder that stops renewing it (a crash).
    #[arg(long, env = "LYRA_LEASE_TTL", value_name = "DURATION", default_value = "30s",
          value_parser = parse_ttl, hide_short_help = true)]
    pub lease_ttl: std::time::Duration,
}

/// A deployment name as every command takes it ([`check_deployment_name`]): a bad one is a
/// usage error before any store is opened. Its own error, because clap's would echo the value
/// as it is, and a name with a newline in it would forge lines of the message.
#[derive(Debug, Clone, Copy)]
struct DeploymentName;

impl clap::builder::TypedValueParser for DeploymentName {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let name = clap::builder::StringValueParser::new().parse_ref(cmd, arg, value)?;
        check_deployment_name(&name).map(|()| name.clone()).map_err(|why| {
            let arg = arg.map_or_else(|| "DEPLOYMENT".to_owned(), ToString::to_string);
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid deployment name {name:?} for '{arg}': {why}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < std::time::Duration::from_millis(300) {
        return Err("must be at least 300ms (the lease is renewed every third of it)".to_owned());
    }
    Ok(d)
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The deployment to delete (by default the workflow's name: `lyra delete foobernetes`).
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Show what would be deleted, without deleting.
    #[arg(long)]
    pub dry_run: bool,
    /// Only the resources of this step (a recorded step id, or a step they are inside, as
    /// `lyra state show` lists them) and, first, every resource recorded as built from them;
    /// repeatable. The rest of the deployment stays.
    #[arg(long = "target", value_name = "STEP")]
    pub targets: Vec<String>,
    /// With --dry-run: exit 0 when nothing would be deleted, 4 when something would.
    #[arg(long, requires = "dry_run")]
    pub detailed_exitcode: bool,
}

const DRIFT_EXIT_CODES: &str = "\
Exit codes:
  0    no drift: every resource is as recorded
  1    a resource could not be read (the report lists it), or another failure
  2    usage error
  3    --refresh-state: the deployment is locked by another run (see --lock-timeout)
  4    drift found: an attribute differs, or a resource is gone (also when --refresh-state
       recorded it)
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP)

A resource found gone keeps its record, with --refresh-state too: the next apply makes it
again, or `lyra state rm` forgets it. With -o json the report is one JSON document on stdout;
see docs/json-output.md.";

#[derive(Debug, Args)]
pub struct DriftArgs {
    /// The deployment to check.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    /// Record what was read as the resources' actual state, changing no resource: the next
    /// plan then shows the update that reverts the drift. Takes the deployment's lease and is
    /// kept in the history as a `refresh` run.
    #[arg(long)]
    pub refresh_state: bool,
    #[command(flatten)]
    pub state: StateArgs,
    /// At most this many resources read at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Where the Foobernetes provider keeps its imaginary cloud.
    #[arg(
        long,
        env = "LYRA_FOOBERNETES_FILE",
        default_value = "deployment.json",
        value_name = "FILE"
    )]
    pub foobernetes_file: PathBuf,
    /// The lease `--refresh-state` takes.
    #[command(flatten)]
    pub lock: LockArgs,
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    #[command(flatten)]
    pub workflow: WorkflowArgs,
    /// Graph language.
    #[arg(short, long, value_enum, default_value_t)]
    pub format: GraphFormat,
}

#[derive(Debug, Args)]
pub struct StateShowArgs {
    /// The deployment to show.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct StateRmArgs {
    /// The deployment.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    /// Steps to forget, as `lyra state show` lists them.
    #[arg(required = true)]
    pub steps: Vec<String>,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub lock: LockArgs,
}

#[derive(Debug, Args)]
pub struct StateUnlockArgs {
    /// The deployment whose lease to break.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    /// Really break it (without, only shows who holds it).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct StateExportArgs {
    /// Deployments to export. Default: all.
    #[arg(value_parser = DeploymentName)]
    pub deployments: Vec<String>,
    /// Write to this file instead of stdout (with -o json, stdout then gets a summary).
    #[arg(short, long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Where state is kept (see `lyra state list --help`).
    #[arg(long, env = "LYRA_STATE", hide_env_values = true, value_name = "URL")]
    pub state: Option<String>,
}

#[derive(Debug, Args)]
pub struct StateImportArgs {
    /// A file written by `lyra state export`; `-` reads stdin.
    pub file: PathBuf,
    /// Overwrite deployments that already exist here (otherwise they are refused).
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub lock: LockArgs,
}

#[derive(Debug, Args)]
pub struct StateMigrateArgs {
    /// The store to move from (a SQLite path or URL, or a postgres:// URL).
    #[arg(long, value_name = "URL")]
    pub from: String,
    /// The store to move to.
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// Deployments to move. Default: all.
    #[arg(value_parser = DeploymentName)]
    pub deployments: Vec<String>,
    /// Overwrite deployments that already exist in the target.
    #[arg(long)]
    pub replace: bool,
    /// Copy only: leave the deployments in the source too. Two stores then both claim the
    /// same resources; use it for backups, not to run from both.
    #[arg(long)]
    pub keep_source: bool,
    #[command(flatten)]
    pub lock: LockArgs,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The deployment to adopt the resource into (created if it is not recorded yet).
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    /// The workflow step that is to manage it.
    pub step: String,
    /// The resource's id, as its provider names it.
    pub external_id: String,
    /// The workflow the step is in. Default: the one last applied to the deployment, else
    /// the workflow named like the deployment.
    #[arg(long, value_name = "WF")]
    pub workflow: Option<String>,
    /// Directory holding workflows (the load path). Default: ./workflows.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// Data for lookups (YAML), for the provider settings and the plan. Default: ./data.yaml.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Set a data value, overriding the data file; repeatable.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Where state is kept (see `lyra apply --help`).
    #[arg(long, env = "LYRA_STATE", hide_env_values = true, value_name = "URL")]
    pub state: Option<String>,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// The deployment whose returns to print.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    /// Only this return.
    pub name: Option<String>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The deployment whose runs to show.
    #[arg(value_parser = DeploymentName)]
    pub deployment: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        super::Cli::command().debug_assert();
    }
}

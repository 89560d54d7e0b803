//! Command-line arguments. Doc comments are the help text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    a step failed, or the workflow or its input is invalid
  2    usage error (bad arguments, workflow not found)
  130  interrupted (Ctrl-C)";

/// Lyra: infrastructure workflows whose order is inferred from the data they exchange.
///
/// Write a workflow in YAML, check it with `lyra validate`, preview it with `lyra plan`, make it
/// so with `lyra apply`, and tear it down with `lyra delete`. State is kept in an embedded
/// SQLite file under ./.lyra/ unless --state says otherwise.
#[derive(Debug, Parser)]
#[command(name = "lyra", version, propagate_version = true, max_term_width = 100, after_long_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a workflow and report every problem at once.
    #[command(after_long_help = EXIT_CODES)]
    Validate(WorkflowArgs),
    /// Show what `apply` would change, without changing anything.
    #[command(after_long_help = EXIT_CODES)]
    Plan(RunArgs),
    /// Create, update and delete resources until the deployment matches the workflow.
    #[command(after_long_help = EXIT_CODES)]
    Apply(RunArgs),
    /// Delete every resource of a deployment, in reverse dependency order.
    ///
    /// Needs only the state, not the workflow: the state records what depends on what.
    #[command(after_long_help = EXIT_CODES)]
    Delete(DeleteArgs),
    /// Print the dependency graph of a workflow (DOT or Mermaid).
    Graph(GraphArgs),
    /// Inspect the recorded state.
    #[command(subcommand)]
    State(StateCommand),
    /// Show the runs of a deployment, newest first.
    History(HistoryArgs),
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// List deployments with their resource counts and last run.
    List(StateArgs),
    /// Show the resources recorded for a deployment.
    Show(StateShowArgs),
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
    /// A workflow name found on the load path (`a::b` is `a/b.yaml`), or a path to a file.
    pub workflow: String,
    /// Directory holding workflows (the load path). Default: ./workflows.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct StateArgs {
    /// Where state is kept: a SQLite file path or sqlite:// URL. Default: ./.lyra/state.db.
    #[arg(long, env = "LYRA_STATE", value_name = "URL")]
    pub state: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
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
    #[arg(long, value_name = "DEPLOYMENT")]
    pub name: Option<String>,
    /// Where state is kept: a SQLite file path or sqlite:// URL. Default: ./.lyra/state.db.
    #[arg(long, env = "LYRA_STATE", value_name = "URL")]
    pub state: Option<String>,
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// How a run that changes things is executed.
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
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The deployment to delete (by default the workflow's name: `lyra delete foobernetes`).
    pub deployment: String,
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Show what would be deleted, without deleting.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    /// A workflow name found on the load path, or a path to a file.
    pub workflow: String,
    /// Directory holding workflows. Default: ./workflows.
    #[arg(long, env = "LYRA_WORKFLOWS", value_name = "DIR")]
    pub workflows: Option<PathBuf>,
    /// Graph language.
    #[arg(short, long, value_enum, default_value_t)]
    pub format: GraphFormat,
}

#[derive(Debug, Args)]
pub struct StateShowArgs {
    /// The deployment to show.
    pub deployment: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The deployment whose runs to show.
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

//! `kube-emulator --port N --kubeconfig PATH`: runs the emulator until Ctrl-C or SIGTERM, for
//! pointing kubectl or a controller at it by hand (`KUBECONFIG=PATH kubectl get crd`). Its
//! warnings (CEL rules it cannot enforce) go to stderr; `RUST_LOG` picks others.

// A binary: the terminal is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::IsTerminal as _;
use std::path::PathBuf;

use clap::Parser;
use kube_emulator::{Config, KubeEmulator};

// Many small, short-lived JSON allocations across worker threads: under a controller's
// backlog, glibc's malloc took over a third of the server's CPU (ARCHITECTURE.md).
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(about = "A Kubernetes API server emulator for tests (plain HTTP, no auth)")]
struct Args {
    /// Port on 127.0.0.1 to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long, default_value = "kube-emulator.kubeconfig")]
    kubeconfig: PathBuf,
    /// How many events the watch log keeps.
    #[arg(long, default_value_t = 100_000)]
    event_log_capacity: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kube_emulator=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // Deep objects are walked recursively: the server's threads need deep stacks.
    tokio::runtime::Builder::new_multi_thread()
        .thread_stack_size(kube_emulator::THREAD_STACK)
        .enable_all()
        .build()?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let config = Config {
        port: args.port,
        kubeconfig: Some(args.kubeconfig),
        event_log_capacity: args.event_log_capacity,
        ..Config::default()
    };
    let emu = KubeEmulator::start_with(config).await?;
    eprintln!(
        "kube-emulator listening on {}; kubeconfig written to {}",
        emu.url(),
        emu.kubeconfig_path().display()
    );
    stopped().await?;
    eprintln!("kube-emulator: shutting down");
    if !emu.shutdown().await {
        eprintln!("kube-emulator: requests still open after 5 s at shutdown");
    }
    Ok(())
}

/// Ctrl-C, or SIGTERM (what `kill` and process supervisors send; background jobs of a
/// non-interactive shell ignore SIGINT).
async fn stopped() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await
}

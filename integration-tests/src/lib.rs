//! Shared helpers for the end-to-end tests (`tests/e2e.rs`).
//!
//! The tests run the real `lyra` binary against real files: the SQLite state under `.lyra/`,
//! the Foobernetes fake cloud in `deployment.json`, workflows under `workflows/`. Each test
//! gets a [`Lyra`]: a temporary directory of its own that is the binary's working directory,
//! so tests never share state and run in parallel.
//!
//! The binary is not built here: run `cargo build -p lyra-cli` (CI: `cargo build --workspace`)
//! before `cargo test -p integration-tests`. It is found through `$LYRA_BIN`, else in the
//! profile directory of the test executable (`target/debug/lyra`), else in
//! `<workspace>/target/debug/lyra`.
//!
//! The original Lyra's compatibility corpus is read from `$LYRA_COMPAT_DIR`, else from
//! `<workspace>/../shared/lyra-compat`; tests that need it are skipped when it is missing,
//! unless `CI=true`, where a missing corpus fails them.

// Test helpers report skips and child output on the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod bench;
pub mod cluster;
pub mod helm;
pub mod kubectl;
pub mod manifests;
pub mod pod;
pub mod postgres;
pub mod registry;
pub mod tools;
pub mod webhook;

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use serde_json::Value;

/// How long one `lyra` invocation may take before the test fails: a hang is a bug too.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The Cargo workspace holding this crate.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// The `lyra` binary under test (see the crate docs for where it is looked for).
pub fn lyra_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("lyra", "LYRA_BIN", "lyra-cli"))
        .clone()
}

/// The `lyra-controller` binary under test: `$LYRA_CONTROLLER_BIN`, else found like `lyra`.
pub fn controller_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("lyra-controller", "LYRA_CONTROLLER_BIN", "lyra-controller"))
        .clone()
}

/// The example provider plugin (`lyra-plugin`'s `lyra-provider-example`): `$LYRA_EXAMPLE_PLUGIN_BIN`,
/// else found like `lyra`.
pub fn example_plugin_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("lyra-provider-example", "LYRA_EXAMPLE_PLUGIN_BIN", "lyra-plugin"))
        .clone()
}

/// The protocol-6 Terraform test provider (`lyra-terraform`'s `terraform-provider-lyratest`):
/// `$LYRA_TF_TEST_PROVIDER_BIN`, else found like `lyra`.
pub fn tf_test_provider_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        workspace_bin(
            "terraform-provider-lyratest",
            "LYRA_TF_TEST_PROVIDER_BIN",
            "lyra-terraform",
        )
    })
    .clone()
}

/// A binary of this workspace, built beforehand: `$env` if set, else beside the test
/// executable's profile directory, else `<workspace>/target/debug/`.
fn workspace_bin(name: &str, env: &str, package: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env}={} is not a file", p.display());
        return p;
    }
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    // The test executable is <target>/<profile>/deps/e2e-<hash>: the binary built with the
    // same profile and target directory is <target>/<profile>/<name>.
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(|profile| profile.join(&name)));
    let fallback = workspace_dir().join("target").join("debug").join(&name);
    beside
        .into_iter()
        .chain([fallback.clone()])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} was not found (looked beside the test executable and at {}): \
                 run `cargo build -p {package}` before these tests, or set {env}",
                fallback.display()
            )
        })
}

/// Whether this is CI (`CI=true` or `CI=1`): there, a missing service or corpus fails the
/// tests that need it instead of skipping them.
pub use lyra_state::testing::in_ci;

/// The compatibility corpus, or `None` (after saying why) when it is missing outside CI.
pub fn compat_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("LYRA_COMPAT_DIR").map_or_else(
        || workspace_dir().join("..").join("shared").join("lyra-compat"),
        PathBuf::from,
    );
    if dir.join("workflows").join("foobernetes.yaml").is_file() {
        return Some(dir);
    }
    let ci = in_ci();
    assert!(
        !ci,
        "CI=true but the compat corpus is missing at {} (set LYRA_COMPAT_DIR)",
        dir.display()
    );
    eprintln!(
        "skipped: the compat corpus is missing at {} (set LYRA_COMPAT_DIR to run this test)",
        dir.display()
    );
    None
}

/// `let compat = compat_or_skip!();`: the corpus directory, or return from the test (skip).
#[macro_export]
macro_rules! compat_or_skip {
    () => {
        match $crate::compat_dir() {
            Some(dir) => dir,
            None => return,
        }
    };
}

/// One finished `lyra` invocation.
#[derive(Debug)]
pub struct Run {
    pub args: Vec<String>,
    pub status: ExitStatus,
    /// The exit code; `None` when the process died of a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

fn clip(s: &str) -> &str {
    const MAX: usize = 6000;
    if s.len() <= MAX {
        return s;
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "$ lyra {}", self.args.join(" "))?;
        writeln!(f, "exit: {:?}", self.code)?;
        writeln!(f, "--- stdout ---\n{}", clip(&self.stdout))?;
        write!(f, "--- stderr ---\n{}", clip(&self.stderr))
    }
}

impl Run {
    /// Asserts the exit code.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(self.code, Some(code), "unexpected exit code\n{self}");
        self
    }

    /// Asserts success.
    #[track_caller]
    pub fn expect_ok(&self) -> &Run {
        self.expect_code(0)
    }

    /// stdout parsed as one JSON document.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document: {e}\n{self}"))
    }

    /// Asserts that stderr contains every one of `needles`.
    #[track_caller]
    pub fn expect_stderr(&self, needles: &[&str]) -> &Run {
        for n in needles {
            assert!(self.stderr.contains(n), "stderr does not mention {n:?}\n{self}");
        }
        self
    }
}

/// A private working directory for `lyra`, and the means to run it there.
pub struct Lyra {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Environment for every invocation (e.g. `LYRA_STATE`).
    env: Vec<(String, String)>,
}

impl Default for Lyra {
    fn default() -> Self {
        Self::new()
    }
}

impl Lyra {
    pub fn new() -> Lyra {
        let dir = tempfile::Builder::new()
            .prefix("lyra-e2e-")
            .tempdir()
            .expect("create a temporary directory");
        Lyra {
            dir,
            bin: lyra_bin(),
            env: Vec::new(),
        }
    }

    /// Sets an environment variable for every invocation.
    pub fn with_env(mut self, key: &str, value: &str) -> Lyra {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Keeps the state at `url` (`LYRA_STATE`) instead of `.lyra/state.db`.
    pub fn with_state(self, url: &str) -> Lyra {
        self.with_env("LYRA_STATE", url)
    }

    /// The working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the working directory.
    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file (creating its directories) relative to the working directory.
    pub fn write(&self, rel: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create directories");
        }
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Creates the state (empty), as the first command that records something would: `lyra
    /// state import` of an export with no deployments. Commands that only read (`state list`,
    /// `plan`) never create it. Tests that start several processes at once on a fresh state
    /// call this first (see `sharing::concurrent_first_use_of_a_state_file`).
    #[track_caller]
    pub fn init_state(&self) {
        self.write(
            ".no-deployments.json",
            r#"{"format": "lyra-state", "version": 1, "deployments": []}"#,
        );
        self.ok(&["state", "import", ".no-deployments.json"]);
    }

    /// Writes `workflows/NAME.yaml`, found by `lyra apply NAME`.
    pub fn write_workflow(&self, name: &str, yaml: &str) -> PathBuf {
        self.write(Path::new("workflows").join(format!("{name}.yaml")), yaml)
    }

    /// Reads a file relative to the working directory.
    pub fn read(&self, rel: impl AsRef<Path>) -> String {
        let path = self.path(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// `lyra ARGS` in the working directory, with no `LYRA_*` settings inherited.
    pub fn command<S: AsRef<str>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args.iter().map(AsRef::as_ref));
        self.prepare(&mut cmd);
        cmd
    }

    /// Runs `lyra ARGS` (`args` one line, quoted as for a shell) on a pseudo-terminal
    /// (util-linux `script`), as `command` would run it plus the `extra` environment, typing
    /// `answer`: the exit code and everything the terminal showed.
    #[cfg(unix)]
    pub fn on_terminal(&self, args: &str, answer: &str, extra: &[(&str, &str)]) -> (i32, String) {
        use std::io::Write as _;
        let line = format!("'{}' {args}", self.bin.display());
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"]);
        self.prepare(&mut cmd);
        cmd.envs(extra.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("util-linux `script` runs (it gives lyra a terminal)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(answer.as_bytes())
            .expect("type the answer");
        let out = child.wait_with_output().expect("script");
        let shown = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), shown)
    }

    /// The working directory and environment every run gets.
    fn prepare(&self, cmd: &mut Command) {
        cmd.current_dir(self.dir()).stdin(Stdio::null());
        for var in [
            "LYRA_WORKFLOWS",
            "LYRA_STATE",
            "LYRA_FOOBERNETES_FILE",
            "LYRA_LEASE_TTL",
            "RUST_LOG",
            "LYRA_REGISTRY_USERNAME",
            "LYRA_REGISTRY_PASSWORD",
            "LYRA_INSECURE_REGISTRIES",
            "SOURCE_DATE_EPOCH",
            // Colour is decided by the test, not by the shell it runs in.
            "NO_COLOR",
            "CLICOLOR",
            "CLICOLOR_FORCE",
        ] {
            cmd.env_remove(var);
        }
        // Packages: a cache and a (missing) Docker config of the test's own, never the user's.
        cmd.env("LYRA_CACHE_DIR", self.path(".cache"))
            .env("DOCKER_CONFIG", self.path(".docker"));
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
    }

    /// Runs `lyra ARGS` to completion and checks what must hold for every invocation: it ends
    /// by itself (no signal), within [`RUN_TIMEOUT`], without a panic.
    #[track_caller]
    pub fn run<S: AsRef<str>>(&self, args: &[S]) -> Run {
        let run = run_command(self.command(args), args);
        assert_sane(&run);
        run
    }

    /// Runs `lyra ARGS` and asserts it succeeds.
    #[track_caller]
    pub fn ok<S: AsRef<str>>(&self, args: &[S]) -> Run {
        let run = self.run(args);
        run.expect_ok();
        run
    }

    /// Runs `lyra ARGS -o json`, asserts success, and returns the parsed stdout.
    #[track_caller]
    pub fn ok_json<S: AsRef<str>>(&self, args: &[S]) -> Value {
        let mut all: Vec<String> = args.iter().map(|a| a.as_ref().to_owned()).collect();
        all.extend(["-o".to_owned(), "json".to_owned()]);
        self.ok(&all).json()
    }

    /// Starts `lyra ARGS` in the background, its output going to files in the working
    /// directory (`.out-<tag>` and `.err-<tag>`): pipes could fill up and block it.
    pub fn spawn<S: AsRef<str>>(&self, tag: &str, args: &[S]) -> Child {
        let out = std::fs::File::create(self.path(format!(".out-{tag}"))).expect("create stdout file");
        let err = std::fs::File::create(self.path(format!(".err-{tag}"))).expect("create stderr file");
        self.command(args).stdout(out).stderr(err).spawn().expect("start lyra")
    }

    /// What a spawned run printed: (stdout, stderr).
    pub fn spawned_output(&self, tag: &str) -> (String, String) {
        (self.read(format!(".out-{tag}")), self.read(format!(".err-{tag}")))
    }

    /// `lyra state show DEPLOYMENT -o json`.
    #[track_caller]
    pub fn state(&self, deployment: &str) -> Value {
        self.ok_json(&["state", "show", deployment])
    }

    /// The recorded resources of a deployment: step id → external id.
    #[track_caller]
    pub fn resources(&self, deployment: &str) -> std::collections::BTreeMap<String, String> {
        resource_ids(&self.state(deployment))
    }

    /// `lyra history DEPLOYMENT -o json`.
    #[track_caller]
    pub fn history(&self, deployment: &str) -> Vec<Value> {
        match self.ok_json(&["history", deployment]) {
            Value::Array(runs) => runs,
            other => panic!("history is not an array: {other}"),
        }
    }

    /// The Foobernetes cloud file (`deployment.json`) parsed.
    #[track_caller]
    pub fn cloud(&self) -> Value {
        let text = self.read("deployment.json");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("deployment.json is not JSON: {e}\n{text}"))
    }
}

/// Runs a command to completion (or [`RUN_TIMEOUT`]), collecting its output.
#[track_caller]
pub fn run_command<S: AsRef<str>>(mut cmd: Command, args: &[S]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start lyra {}: {e}", args.join(" ")));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr piped")));
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for lyra") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lyra {} did not finish within {RUN_TIMEOUT:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        args,
        status,
        code: status.code(),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// What every invocation must satisfy, whatever its input: it exits by itself with one of the
/// documented codes, and never panics.
#[track_caller]
pub fn assert_sane(run: &Run) {
    assert!(!run.stderr.contains("panicked"), "lyra panicked\n{run}");
    assert!(!run.stderr.contains("RUST_BACKTRACE"), "lyra panicked\n{run}");
    assert!(
        // 4: drift found (`lyra drift`), or changes pending (`plan --detailed-exitcode`).
        matches!(run.code, Some(0 | 1 | 2 | 3 | 4 | 130)),
        "exit code is not one of 0, 1, 2, 3, 4, 130\n{run}"
    );
}

/// Step id → external id of the resources in a `state show -o json` document.
pub fn resource_ids(state: &Value) -> std::collections::BTreeMap<String, String> {
    state["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("no resources array in {state}"))
        .iter()
        .map(|r| {
            (
                r["step"].as_str().expect("step is a string").to_owned(),
                r["external_id"].as_str().expect("external_id is a string").to_owned(),
            )
        })
        .collect()
}

/// The steps of a plan/apply/delete report.
pub fn steps(report: &Value) -> &Vec<Value> {
    report["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("no steps array in {report}"))
}

/// The entries of a report for one step id (a step can appear twice, e.g. guarded off and then
/// deleted).
pub fn step_entries<'a>(report: &'a Value, id: &str) -> Vec<&'a Value> {
    steps(report).iter().filter(|s| s["step"] == id).collect()
}

/// The one entry of a report for a step id.
#[track_caller]
pub fn step<'a>(report: &'a Value, id: &str) -> &'a Value {
    match step_entries(report, id).as_slice() {
        [one] => one,
        other => panic!("expected one entry for step {id}, found {}: {report:#}", other.len()),
    }
}

/// The steps of a report whose action is `action`, by id (sorted).
pub fn steps_with_action(report: &Value, action: &str) -> Vec<String> {
    let mut ids: Vec<String> = steps(report)
        .iter()
        .filter(|s| s["action"] == action)
        .map(|s| s["step"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Whether a run of `lyra history -o json` has a note that contains `text`.
pub fn note_contains(run: &Value, text: &str) -> bool {
    run["note"].as_str().is_some_and(|n| n.contains(text))
}

/// A change count of a report (`created`, `updated`, `replaced`, `deleted`, `unchanged`,
/// `failed`, `skipped`).
#[track_caller]
pub fn count(report: &Value, key: &str) -> u64 {
    report["counts"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {key} in {report}"))
}

/// The attributes named in a step's `changes`, sorted.
pub fn changed_attributes(step: &Value) -> Vec<String> {
    let mut attrs: Vec<String> = step["changes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["attribute"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    attrs.sort();
    // Several paths into one attribute are one changed attribute.
    attrs.dedup();
    attrs
}

/// The original smoke test's comparison, `sort FILE | grep -v "[0-9]\{8,\}"`: the lines of
/// `text` that hold no run of 8 or more digits (the random ids), sorted bytewise. Comparing two
/// of these compares the files as multisets of lines.
pub fn lines_without_ids(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().filter(|l| !has_digit_run(l, 8)).collect();
    lines.sort_unstable();
    lines
}

fn has_digit_run(line: &str, n: usize) -> bool {
    let mut run = 0;
    for b in line.bytes() {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        if run >= n {
            return true;
        }
    }
    false
}

/// The ids of one table (`Instances`, `WebServers`, `LoadBalancers`) of the Foobernetes cloud.
pub fn cloud_ids(cloud: &Value, table: &str) -> Vec<String> {
    cloud[table]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// `n` independent Foobernetes instances, each behind a `Time::Sleep` of `delay`: a run takes
/// a while and many creates are in flight at once.
pub fn sleepy_fleet_workflow(n: usize, delay: &str) -> String {
    format!(
        "\
steps:
  pause:
    times: {n}
    into: delays
    step:
      returns: {{d: create_duration}}
      resource: Time::Sleep
      value:
        create_duration: {delay}
  vm:
    each: $delays
    as: d
    step:
      resource: Foobernetes::Instance
      value:
        location: eu1
        image: $d
        cpus: 1
        memory: 1G
"
    )
}

/// A workflow of `n` independent `Time::Sleep` steps `s000`, `s001`, ... each sleeping
/// `duration` when created.
pub fn sleeps_workflow(n: usize, duration: &str) -> String {
    let mut y = String::from("steps:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  s{i:03}:\n    resource: Time::Sleep\n    value:\n      create_duration: {duration}\n"
        ));
    }
    y
}

/// Waits until someone holds the lease on `deployment` and returns its JSON.
#[track_caller]
pub fn wait_for_lease(lyra: &Lyra, deployment: &str) -> Value {
    let mut lease = Value::Null;
    let held = wait_until(Duration::from_secs(30), || {
        let run = lyra.run(&["state", "list", "-o", "json"]);
        if run.code != Some(0) {
            return false;
        }
        let list = run.json();
        let found = list
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["deployment"] == deployment)
            .map(|d| d["lease"].clone());
        match found {
            Some(l) if !l.is_null() => {
                lease = l;
                true
            }
            _ => false,
        }
    });
    assert!(held, "no lease on {deployment} appeared");
    lease
}

/// Polls `cond` every 10ms until it holds (true) or `timeout` passes (false).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A deterministic generator of test inputs: `rand`'s `StdRng` from a seed, so the same seed
/// gives the same inputs (with one version of `rand`).
#[derive(Debug)]
pub struct Rng(rand::rngs::StdRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(rand::SeedableRng::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        rand::Rng::next_u64(&mut self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        rand::RngExt::random_range(&mut self.0, 0..n)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        rand::seq::IndexedRandom::choose(items, &mut self.0).expect("something to pick from")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_lines_with_long_digit_runs() {
        let text = "b\n  \"i-12345678\": {\na\n  \"Port\": 8080,\nb\n";
        assert_eq!(lines_without_ids(text), vec!["  \"Port\": 8080,", "a", "b", "b"]);
        assert!(!has_digit_run("1234567", 8));
        assert!(has_digit_run("x12345678", 8));
    }

    #[test]
    fn rng_is_deterministic() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert!(xs.windows(2).all(|w| w[0] != w[1]));
        assert!((0..100).all(|_| a.below(3) < 3));
    }

    #[test]
    fn sleeps_workflow_has_n_steps() {
        let y = sleeps_workflow(3, "1ms");
        assert_eq!(y.matches("resource: Time::Sleep").count(), 3);
        assert!(y.contains("  s002:\n"));
    }
}

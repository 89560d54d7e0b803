//! Running the real `kubectl` against an emulator from tests: each [`Kubectl`] has its own
//! discovery cache (`KUBECACHEDIR`), because kubectl caches discovery per host:port for hours
//! and a reused port would otherwise see another test's kinds.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one kubectl invocation may take before the test fails.
pub const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);

/// `$KUBECTL`, else `kubectl` on the PATH. When it is missing, `CI=true` fails the test;
/// elsewhere the test says why it is skipped and the caller returns.
pub fn kubectl_or_skip(test: &str) -> Option<PathBuf> {
    let candidate = std::env::var_os("KUBECTL").map(PathBuf::from).or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kubectl"))
                .find(|p| p.is_file())
        })
    });
    if let Some(p) = candidate.filter(|p| p.is_file()) {
        return Some(p);
    }
    let ci = crate::in_ci();
    assert!(
        !ci,
        "CI=true but kubectl was not found (set KUBECTL or put kubectl on the PATH)"
    );
    eprintln!("{test}: skipped: kubectl not found (set KUBECTL or put kubectl on the PATH)");
    None
}

/// The outcome of one kubectl run.
#[derive(Debug)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// kubectl bound to one kubeconfig, with a fresh discovery cache.
#[derive(Debug)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
    envs: Vec<(String, String)>,
}

impl Kubectl {
    pub fn new(bin: PathBuf, kubeconfig: &Path) -> Kubectl {
        let cache = tempfile::Builder::new()
            .prefix("kubecache")
            .tempdir()
            .expect("a temporary directory");
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
            cache,
            envs: Vec::new(),
        }
    }

    /// An environment variable for every later run (`KUBE_EDITOR`, say).
    pub fn env(&mut self, key: &str, value: &str) -> &mut Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Runs kubectl with `args` (and `stdin`, if any), failing the test if it hangs.
    pub fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache.path())
            .env("HOME", self.cache.path())
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        if let Some(input) = stdin {
            use std::io::Write;
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(input.as_bytes()).expect("write kubectl stdin");
        }
        let mut out_pipe = child.stdout.take().expect("piped stdout");
        let mut err_pipe = child.stderr.take().expect("piped stderr");
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out_pipe.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err_pipe.read_to_string(&mut s);
            s
        });
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for kubectl") {
                break status;
            }
            if start.elapsed() > KUBECTL_TIMEOUT {
                let _ = child.kill();
                panic!("kubectl {args:?} did not finish within {KUBECTL_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Output {
            success: status.success(),
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with_stdin(args, None)
    }

    /// Runs kubectl, expects success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(
            o.success,
            "kubectl {args:?} failed:\n--- stdout\n{}\n--- stderr\n{}",
            o.stdout, o.stderr
        );
        o.stdout
    }

    /// Runs kubectl with a manifest on stdin (`-f -`), expects success, returns stdout.
    pub fn ok_stdin(&self, args: &[&str], manifest: &str) -> String {
        let o = self.run_with_stdin(args, Some(manifest));
        assert!(
            o.success,
            "kubectl {args:?} failed:\n--- stdout\n{}\n--- stderr\n{}",
            o.stdout, o.stderr
        );
        o.stdout
    }

    /// Runs kubectl, expects failure, returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(!o.success, "kubectl {args:?} unexpectedly succeeded:\n{}", o.stdout);
        o.stderr
    }

    pub fn fails_stdin(&self, args: &[&str], manifest: &str) -> String {
        let o = self.run_with_stdin(args, Some(manifest));
        assert!(!o.success, "kubectl {args:?} unexpectedly succeeded:\n{}", o.stdout);
        o.stderr
    }
}

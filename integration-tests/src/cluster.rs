//! A whole Lyra installation for one test: the Kubernetes API emulator, the real `kubectl`,
//! the real `lyra-controller` binary (one or more replicas) and the real `lyra` CLI, all on one
//! state (Postgres when reachable, as in CI, else a SQLite file) and one Foobernetes cloud file
//! in the test's working directory.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::kubectl::{Kubectl, kubectl_or_skip};
use crate::postgres::PgTestDb;
use crate::{Lyra, Value, controller_bin, wait_until};
use kube_emulator::BlockingKubeEmulator;

/// `let cluster = cluster_or_skip!();`: a running installation, or return from the test (skip).
#[macro_export]
macro_rules! cluster_or_skip {
    () => {
        match $crate::cluster::Cluster::start(module_path!()) {
            Some(c) => c,
            None => return,
        }
    };
}

/// The emulator, kubectl bound to it, the CLI's working directory and its state.
pub struct Cluster {
    pub emulator: BlockingKubeEmulator,
    pub kubectl: Kubectl,
    /// The CLI, running in the directory the controllers run in, on the same state.
    pub lyra: Lyra,
    pub state_url: String,
    _schema: Option<PgTestDb>,
}

/// One `lyra-controller` process; killed when dropped.
pub struct ControllerProcess {
    child: Child,
    pub tag: String,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub health: String,
}

impl Cluster {
    /// `None` when kubectl is missing outside CI (said on stderr). The state is Postgres when
    /// a server is reachable (always in CI), else a SQLite file.
    pub fn start(test: &str) -> Option<Cluster> {
        let kubectl_bin = kubectl_or_skip(test)?;
        let emulator = BlockingKubeEmulator::start().expect("start the emulator");
        let kubectl = Kubectl::new(kubectl_bin, emulator.kubeconfig_path());
        let schema = PgTestDb::create_blocking(test);
        let state_url = schema
            .as_ref()
            .map_or_else(|| ".lyra/state.db".to_owned(), |s| s.url().to_owned());
        let lyra = Lyra::new().with_state(&state_url);
        // The CRD comes from `lyra crd`, as a user would install it.
        let crd = lyra.ok(&["crd"]).stdout;
        kubectl.ok_stdin(&["apply", "-f", "-"], &crd);
        kubectl.ok(&[
            "wait",
            "--for=condition=Established",
            "crd/workflows.lyra.dev",
            "--timeout=30s",
        ]);
        Some(Cluster {
            emulator,
            kubectl,
            lyra,
            state_url,
            _schema: schema,
        })
    }

    /// Starts a controller in the CLI's working directory with `extra` arguments.
    pub fn controller(&self, tag: &str, extra: &[&str]) -> ControllerProcess {
        self.controller_logging(tag, extra, "info")
    }

    /// [`Cluster::controller`] with `RUST_LOG=rust_log`.
    pub fn controller_logging(&self, tag: &str, extra: &[&str], rust_log: &str) -> ControllerProcess {
        let port = free_port();
        let health = format!("127.0.0.1:{port}");
        let out = std::fs::File::create(self.lyra.path(format!(".controller-{tag}.log"))).expect("log file");
        let mut cmd = Command::new(controller_bin());
        cmd.args([
            "--state",
            &self.state_url,
            "--workflows",
            "workflows",
            "--health-addr",
            &health,
            "--identity",
            tag,
        ]);
        // A short lease by default, so a killed controller does not hold tests up.
        if !extra.contains(&"--lease-ttl") {
            cmd.args(["--lease-ttl", "3s"]);
        }
        let child = cmd
            .args(extra)
            .current_dir(self.lyra.dir())
            .env("KUBECONFIG", self.emulator.kubeconfig_path())
            .env_remove("LYRA_STATE")
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start lyra-controller");
        let controller = ControllerProcess {
            child,
            tag: tag.to_owned(),
            health,
        };
        let up = wait_until(Duration::from_secs(30), || controller.get("/healthz").is_some());
        assert!(up, "the controller did not serve /healthz:\n{}", self.log(tag));
        controller
    }

    /// What a controller logged.
    pub fn log(&self, tag: &str) -> String {
        std::fs::read_to_string(self.lyra.path(format!(".controller-{tag}.log"))).unwrap_or_default()
    }

    /// `kubectl apply -f -` of a manifest.
    pub fn apply(&self, manifest: &str) -> String {
        self.kubectl.ok_stdin(&["apply", "-f", "-"], manifest)
    }

    /// The Workflow object as JSON.
    pub fn workflow(&self, name: &str) -> Value {
        let text = self.kubectl.ok(&["get", "wf", name, "-o", "json"]);
        serde_json::from_str(&text).expect("kubectl printed JSON")
    }

    /// Waits for `condition` on `wf/name` with kubectl, failing with the object and the
    /// controller logs.
    #[track_caller]
    pub fn wait_for(&self, name: &str, condition: &str, timeout: &str) {
        let out = self.kubectl.run(&[
            "wait",
            &format!("--for={condition}"),
            &format!("wf/{name}"),
            &format!("--timeout={timeout}"),
        ]);
        if !out.success {
            let object = self.kubectl.run(&["get", "wf", name, "-o", "yaml"]);
            panic!(
                "wf/{name} did not reach {condition} within {timeout}: {}\n{}\n--- controller logs ---\n{}",
                out.stderr,
                object.stdout,
                self.all_logs()
            );
        }
    }

    /// Polls the object until `check` holds, failing with it after `timeout`.
    #[track_caller]
    pub fn wait_until_status(&self, name: &str, timeout: Duration, check: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let ok = wait_until(timeout, || {
            let out = self.kubectl.run(&["get", "wf", name, "-o", "json"]);
            if !out.success {
                return false;
            }
            last = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
            check(&last)
        });
        assert!(
            ok,
            "wf/{name} never matched: {last:#}\n--- controller logs ---\n{}",
            self.all_logs()
        );
        last
    }

    fn all_logs(&self) -> String {
        let mut logs = String::new();
        if let Ok(entries) = std::fs::read_dir(self.lyra.dir()) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(tag) = name.strip_prefix(".controller-").and_then(|n| n.strip_suffix(".log")) {
                    let log = self.log(tag);
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    logs.push_str(&format!("[{tag}]\n"));
                    for l in tail.into_iter().rev() {
                        logs.push_str(l);
                        logs.push('\n');
                    }
                }
            }
        }
        logs
    }

    /// The Foobernetes cloud file the controllers write.
    pub fn cloud(&self) -> Value {
        if !self.lyra.path("deployment.json").exists() {
            return Value::Null;
        }
        self.lyra.cloud()
    }
}

impl ControllerProcess {
    /// GET on the health server: the body of a 200 answer.
    pub fn get(&self, path: &str) -> Option<String> {
        http_get(&self.health, path)
    }

    /// A counter or gauge from `/metrics`, summed over every series of that name.
    pub fn metric(&self, name: &str) -> f64 {
        metric_sum(&self.get("/metrics").unwrap_or_default(), name)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, as Kubernetes stops a pod; waits for the exit and returns its status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let mut code = None;
        let exited = wait_until(Duration::from_secs(30), || match self.child.try_wait() {
            Ok(Some(status)) => {
                code = status.code();
                true
            }
            _ => false,
        });
        assert!(exited, "{} did not stop within 30s of SIGTERM", self.tag);
        code
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter or gauge in a Prometheus text exposition, summed over every series of that name.
pub fn metric_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// A loopback port free right now (for a server started next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A minimal HTTP/1.0 GET: the health server is plain HTTP on loopback.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

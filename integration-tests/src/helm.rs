//! Real helm (3 or 4, from `.ci/tools`) against an emulator, and the controller's chart
//! installed the way an operator installs it: `helm install`, then one replica of the
//! Deployment helm created running as a local process ([`crate::pod::PodProcess`]) with its
//! webhook Service routed to it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::kubectl::Kubectl;
use crate::pod::PodProcess;
use crate::workspace_dir;

/// The token the controller's replicas present (a service account's, on a real cluster): the
/// emulator attributes their calls to this user.
pub const CONTROLLER_USER: &str = "system:serviceaccount:lyra-system:lyra";

/// helm bound to one kubeconfig, with homes of its own.
pub struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    pub fn new(bin: PathBuf, kubeconfig: &Path) -> Helm {
        Helm {
            bin,
            kubeconfig: kubeconfig.to_path_buf(),
            home: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    /// Runs helm; whether it succeeded, and what it printed on stdout and stderr.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.bin)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.home.path().join("cache"))
            .env("HELM_CONFIG_HOME", self.home.path().join("config"))
            .env("HELM_DATA_HOME", self.home.path().join("data"))
            .output()
            .expect("helm runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.run(args);
        assert!(ok, "{} {args:?} failed:\n{text}", self.bin.display());
        text
    }

    pub fn releases(&self, namespace: &str) -> Vec<Value> {
        let out = self.ok(&["list", "-n", namespace, "-o", "json"]);
        serde_json::from_str(out.trim()).expect("helm list -o json")
    }
}

/// A chart of the workspace, as helm takes it.
pub fn chart(path: &str) -> String {
    workspace_dir().join(path).to_str().expect("UTF-8 path").to_owned()
}

/// Points Service `service` in `namespace` at the local replica's webhook port, as the
/// endpoints controller would at the pod (the emulator reaches a webhook's Service through
/// its Endpoints).
pub fn route_webhook(kubectl: &Kubectl, namespace: &str, service: &str, pod: &PodProcess) {
    let port = pod.webhook.expect("the controller serves the webhook");
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Endpoints\nmetadata:\n  name: {service}\n  namespace: {namespace}\n\
             subsets:\n- addresses:\n  - ip: 127.0.0.1\n  ports:\n  - name: https-webhook\n    port: {port}\n"
        ),
    );
}

/// Starts replica `pod` of the release `lyra` in `lyra-system` (the chart's defaults), routes
/// its webhook and waits until it is ready (certificate loaded, CA injected).
pub fn start_replica(kubectl: &Kubectl, kubeconfig: &Path, pod: &str) -> PodProcess {
    let replica = PodProcess::start(
        kubectl,
        kubeconfig,
        CONTROLLER_USER,
        "lyra-system",
        "lyra",
        pod,
        &crate::controller_bin(),
    );
    route_webhook(kubectl, "lyra-system", "lyra-webhook", &replica);
    replica.wait_ready(Duration::from_secs(60));
    replica
}

/// An emulator with the controller's chart installed by helm 3 as release `lyra` in
/// `lyra-system`, and kubectl and helm bound to it.
pub struct ChartCluster {
    pub emulator: kube_emulator::BlockingKubeEmulator,
    pub kubectl: Kubectl,
    pub helm: Helm,
}

impl ChartCluster {
    /// Installs the chart with `args` added to `helm install` (`--set` and such). `None`,
    /// after saying why the test `test` is skipped, without helm 3 or kubectl (outside CI).
    pub fn install(test: &str, args: &[&str]) -> Option<ChartCluster> {
        let helm_bin = crate::tools::tool_or_skip(test, "helm3")?;
        let kubectl_bin = crate::kubectl::kubectl_or_skip(test)?;
        let emulator = kube_emulator::BlockingKubeEmulator::start().expect("start the emulator");
        let kubectl = Kubectl::new(kubectl_bin, emulator.kubeconfig_path());
        let helm = Helm::new(helm_bin, emulator.kubeconfig_path());
        let chart = chart("charts/lyra");
        let mut install = vec!["install", "lyra", &chart, "-n", "lyra-system", "--create-namespace"];
        install.extend(args);
        helm.ok(&install);
        Some(ChartCluster {
            emulator,
            kubectl,
            helm,
        })
    }

    /// Starts replica `pod` and waits until it is ready (see [`start_replica`]).
    pub fn replica(&self, pod: &str) -> PodProcess {
        start_replica(&self.kubectl, self.emulator.kubeconfig_path(), pod)
    }
}

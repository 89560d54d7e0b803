//! Running a Deployment's container as a local process. The emulator runs no pods, so a
//! test that installs the controller's chart starts `lyra-controller` with exactly the args
//! and env of the Deployment helm created, read back from the API: a chart whose flags drift
//! from the binary fails there. What a kubelet would provide is mapped onto the machine: every
//! volume mount becomes a directory of the test (ConfigMap and Secret volumes filled from the
//! API), and paths under a mount point in args and env are rewritten to it; `secretKeyRef`
//! and `configMapKeyRef` env are read from the API, `fieldRef` from the pod's metadata; the
//! in-cluster API config becomes a kubeconfig for the emulator, whose user presents
//! `token`. The ports the container listens on are moved to free loopback ports (two
//! processes could not share them): `--health-addr` and `--webhook-addr`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::Value;

use crate::cluster::{free_port, http_get};
use crate::kubectl::Kubectl;
use crate::wait_until;

/// One replica of a Deployment, running as a local process; killed when dropped.
pub struct PodProcess {
    child: Child,
    pub name: String,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub health: String,
    /// Where it serves the admission webhook, when it does.
    pub webhook: Option<u16>,
    /// The args it was started with, as rewritten.
    pub args: Vec<String>,
    pub log: PathBuf,
    _root: tempfile::TempDir,
}

impl PodProcess {
    /// Starts replica `pod` of Deployment `namespace/deployment` as `binary`, with a
    /// kubeconfig derived from `kubeconfig` whose user presents `token`.
    pub fn start(
        kubectl: &Kubectl,
        kubeconfig: &Path,
        token: &str,
        namespace: &str,
        deployment: &str,
        pod: &str,
        binary: &Path,
    ) -> PodProcess {
        let root = tempfile::Builder::new()
            .prefix("pod")
            .tempdir()
            .expect("a temporary directory");
        let d: Value =
            serde_json::from_str(&kubectl.ok(&["get", "deployment", "-n", namespace, deployment, "-o", "json"]))
                .expect("the Deployment as JSON");
        let spec = &d["spec"]["template"]["spec"];
        let container = &spec["containers"][0];
        let volumes: BTreeMap<String, Value> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| (v["name"].as_str().expect("a volume name").to_owned(), v.clone()))
            .collect();
        // mountPath -> local directory, longest first so nested mounts win.
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = m["name"].as_str().expect("a mount's volume");
            let dir = root.path().join("volumes").join(name);
            std::fs::create_dir_all(&dir).expect("a volume directory");
            let volume = volumes
                .get(name)
                .unwrap_or_else(|| panic!("mount of an undeclared volume {name}"));
            fill_volume(kubectl, namespace, volume, &dir);
            mounts.push((m["mountPath"].as_str().expect("a mountPath").to_owned(), dir));
        }
        mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        let local = |s: &str| local_paths(s, &mounts);
        let health = format!("127.0.0.1:{}", free_port());
        let mut webhook = None;
        let mut args = Vec::new();
        let mut command: Vec<String> = container["command"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().expect("string command").to_owned())
            .collect();
        command.extend(
            container["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().expect("string args").to_owned()),
        );
        for arg in command {
            if arg.starts_with("--health-addr=") {
                args.push(format!("--health-addr={health}"));
            } else if arg.starts_with("--webhook-addr=") {
                let port = free_port();
                webhook = Some(port);
                args.push(format!("--webhook-addr=127.0.0.1:{port}"));
            } else {
                args.push(local(&arg));
            }
        }
        let mut env: Vec<(String, String)> = Vec::new();
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().expect("an env name").to_owned();
            let value = if let Some(v) = e["value"].as_str() {
                v.to_owned()
            } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
                secret_data(kubectl, namespace, r["name"].as_str().expect("a Secret name"))
                    .remove(r["key"].as_str().expect("a key"))
                    .unwrap_or_else(|| panic!("Secret {} has no key {}", r["name"], r["key"]))
            } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
                config_map_data(kubectl, namespace, r["name"].as_str().expect("a ConfigMap name"))
                    .remove(r["key"].as_str().expect("a key"))
                    .unwrap_or_else(|| panic!("ConfigMap {} has no key {}", r["name"], r["key"]))
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match path {
                    "metadata.namespace" => namespace.to_owned(),
                    "metadata.name" => pod.to_owned(),
                    other => panic!("fieldRef {other} is not emulated"),
                }
            } else {
                panic!("env {name}: unsupported source {e}")
            };
            env.push((name, local(&value)));
        }
        let kubeconfig_path = root.path().join("kubeconfig");
        let config = std::fs::read_to_string(kubeconfig).expect("the emulator's kubeconfig");
        std::fs::write(&kubeconfig_path, with_token(&config, token)).expect("write the pod's kubeconfig");
        let log = root.path().join("log");
        let out = std::fs::File::create(&log).expect("a log file");
        let mut cmd = Command::new(binary);
        cmd.args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", root.path())
            .env("KUBECONFIG", &kubeconfig_path)
            .current_dir(root.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start the container's binary");
        let pod = PodProcess {
            child,
            name: pod.to_owned(),
            health,
            webhook,
            args,
            log,
            _root: root,
        };
        let up = wait_until(Duration::from_secs(30), || pod.get("/healthz").is_some());
        assert!(up, "{} did not serve /healthz:\n{}", pod.name, pod.log());
        pod
    }

    /// GET on the health server: the body of a 200 answer.
    pub fn get(&self, path: &str) -> Option<String> {
        http_get(&self.health, path)
    }

    /// Waits for `/readyz` to answer 200, as a readiness probe would.
    pub fn wait_ready(&self, timeout: Duration) {
        let ready = wait_until(timeout, || self.get("/readyz").is_some());
        assert!(ready, "{} never became ready:\n{}", self.name, self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s` with every mount path in it (a whole path or a prefix ending at `/`) replaced by its
/// local directory, in one pass: a replaced directory is never rewritten again (the local
/// directories live under `/tmp`, itself a mount point).
fn local_paths(s: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'scan: while let Some(c) = rest.chars().next() {
        for (path, dir) in mounts {
            if let Some(after) = rest.strip_prefix(path.as_str())
                && (after.is_empty() || after.starts_with('/'))
            {
                out.push_str(dir.to_str().expect("UTF-8 path"));
                rest = after;
                continue 'scan;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn fill_volume(kubectl: &Kubectl, namespace: &str, volume: &Value, dir: &Path) {
    let (data, items) = if let Some(cm) = volume["configMap"].as_object() {
        let name = cm["name"].as_str().expect("a ConfigMap name");
        (config_map_data(kubectl, namespace, name), cm.get("items"))
    } else if let Some(s) = volume["secret"].as_object() {
        let name = s["secretName"].as_str().expect("a Secret name");
        (secret_data(kubectl, namespace, name), s.get("items"))
    } else {
        // emptyDir and persistentVolumeClaim start empty here.
        return;
    };
    let files: Vec<(String, String)> = match items.and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .map(|i| {
                let key = i["key"].as_str().expect("an item key");
                (i["path"].as_str().expect("an item path").to_owned(), key.to_owned())
            })
            .collect(),
        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
    };
    for (path, key) in files {
        let target = dir.join(&path);
        assert!(!path.contains(".."), "a volume item escapes its directory: {path}");
        std::fs::create_dir_all(target.parent().expect("a parent")).expect("an item directory");
        let content = data
            .get(&key)
            .unwrap_or_else(|| panic!("no key {key} in the volume's source"));
        std::fs::write(target, content).expect("write a volume file");
    }
}

fn object(kubectl: &Kubectl, namespace: &str, kind: &str, name: &str) -> Value {
    serde_json::from_str(&kubectl.ok(&["get", kind, "-n", namespace, name, "-o", "json"])).expect("JSON")
}

/// A Secret's data, decoded.
pub fn secret_data(kubectl: &Kubectl, namespace: &str, name: &str) -> BTreeMap<String, String> {
    let s = object(kubectl, namespace, "secret", name);
    s["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("base64"))
                .expect("valid base64");
            (k.clone(), String::from_utf8(bytes).expect("UTF-8 secret"))
        })
        .collect()
}

fn config_map_data(kubectl: &Kubectl, namespace: &str, name: &str) -> BTreeMap<String, String> {
    let cm = object(kubectl, namespace, "configmap", name);
    cm["data"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().expect("string data").to_owned()))
        .collect()
}

/// The emulator's kubeconfig with `token` as the user's bearer token.
pub fn with_token(kubeconfig: &str, token: &str) -> String {
    assert!(
        kubeconfig.contains("\n  user: {}\n"),
        "an unexpected kubeconfig:\n{kubeconfig}"
    );
    kubeconfig.replace("\n  user: {}\n", &format!("\n  user:\n    token: {token}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_rewritten_once_and_only_whole() {
        let mounts = vec![
            (
                "/etc/lyra/workflows".to_owned(),
                PathBuf::from("/tmp/pod1/volumes/workflows"),
            ),
            ("/var/lib/lyra".to_owned(), PathBuf::from("/tmp/pod1/volumes/data")),
            ("/tmp".to_owned(), PathBuf::from("/tmp/pod1/volumes/tmp")),
        ];
        assert_eq!(
            local_paths("--workflows=/etc/lyra/workflows", &mounts),
            "--workflows=/tmp/pod1/volumes/workflows"
        );
        assert_eq!(
            local_paths("sqlite:///var/lib/lyra/state.db", &mounts),
            "sqlite:///tmp/pod1/volumes/data/state.db"
        );
        assert_eq!(local_paths("/tmp/x", &mounts), "/tmp/pod1/volumes/tmp/x");
        // Not a mount: a longer name that merely starts like one.
        assert_eq!(local_paths("/tmpfoo", &mounts), "/tmpfoo");
    }
}

//! A real OCI registry per test: Debian's `docker-registry` (the CNCF distribution server),
//! with a config of our own (the packaged one turns on htpasswd auth on :5000), filesystem
//! storage in a temporary directory and a free loopback port. Killed when dropped.
//!
//! `$DOCKER_REGISTRY`, else `/usr/bin/docker-registry`; when it is missing the test is
//! skipped with a message, except under `CI=true`, where it fails (`.ci/run` installs it).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::free_port;
use crate::{in_ci, wait_until};

/// `let registry = registry_or_skip!();`: a running registry, or return from the test (skip).
#[macro_export]
macro_rules! registry_or_skip {
    () => {
        match $crate::registry::Registry::start() {
            Some(r) => r,
            None => return,
        }
    };
}

pub struct Registry {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry and waits until `GET /v2/` answers. `None` (after saying why) when
    /// the binary is missing outside CI.
    pub fn start() -> Option<Registry> {
        Registry::start_with(None)
    }

    /// [`Registry::start`] with basic auth: `htpasswd` is an `htpasswd` file line
    /// (`user:$2y$…`, bcrypt: the only kind the registry takes).
    pub fn start_with_auth(htpasswd: &str) -> Option<Registry> {
        Registry::start_with(Some(htpasswd))
    }

    fn start_with(htpasswd: Option<&str>) -> Option<Registry> {
        let bin = std::env::var_os("DOCKER_REGISTRY")
            .map_or_else(|| PathBuf::from("/usr/bin/docker-registry"), PathBuf::from);
        if !bin.is_file() {
            assert!(
                !in_ci(),
                "CI=true but {} is missing (apt-get install docker-registry; .ci/run does)",
                bin.display()
            );
            eprintln!(
                "skipped: {} is missing (apt-get install docker-registry, or set DOCKER_REGISTRY)",
                bin.display()
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("lyra-registry-")
            .tempdir()
            .expect("create a temporary directory");
        let addr = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("config.yml");
        let mut text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("storage").display()
        );
        if let Some(line) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{line}\n")).expect("write the htpasswd file");
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: lyra-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, text).expect("write the registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("create the registry log");
        let child = Command::new(&bin)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let mut registry = Registry { child, addr, dir };
        let up = wait_until(Duration::from_secs(30), || {
            registry
                .request("GET", "/v2/", &[])
                .is_some_and(|(status, _)| status == 200 || status == 401)
                || registry.child.try_wait().ok().flatten().is_some()
        });
        let exited = registry.child.try_wait().ok().flatten();
        assert!(
            up && exited.is_none(),
            "the registry did not start ({exited:?}); its log:\n{}",
            std::fs::read_to_string(registry.dir.path().join("registry.log")).unwrap_or_default()
        );
        Some(registry)
    }

    /// Packages `workflow` as `name` VERSION with `lyra` and pushes it here; its
    /// `oci://…/NAME:VERSION` reference.
    pub fn publish(&self, lyra: &crate::Lyra, name: &str, workflow: &str, version: &str) -> String {
        lyra.write_workflow(name, workflow);
        let out = format!("{name}-{version}");
        lyra.ok(&["package", name, "--version", version, "--out", &out]);
        let reference = self.url(&format!("{name}:{version}"));
        lyra.ok(&["push", &out, &reference]);
        reference
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `oci://127.0.0.1:PORT/REPO_AND_TAG`.
    pub fn url(&self, repo_and_tag: &str) -> String {
        format!("oci://{}/{repo_and_tag}", self.addr)
    }

    /// What the registry says `repo:reference` is: the `Docker-Content-Digest` of `HEAD
    /// /v2/REPO/manifests/REFERENCE` (None when it is not there).
    pub fn manifest_digest(&self, repo: &str, reference: &str) -> Option<String> {
        let (status, headers) = self.request(
            "HEAD",
            &format!("/v2/{repo}/manifests/{reference}"),
            &["Accept: application/vnd.oci.image.manifest.v1+json"],
        )?;
        if status != 200 {
            return None;
        }
        headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("docker-content-digest")
                .then(|| v.trim().to_owned())
        })
    }

    /// Where the registry keeps the blob `sha256:…` (to tamper with it).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.storage()
            .join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }

    /// The registry's storage root.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// One HTTP/1.0 request: (status, response head).
    fn request(&self, method: &str, path: &str, headers: &[&str]) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let mut req = format!("{method} {path} HTTP/1.0\r\nHost: {}\r\n", self.addr);
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).ok()?;
        let mut response = Vec::new();
        s.read_to_end(&mut response).ok()?;
        let response = String::from_utf8_lossy(&response);
        let head = response.split("\r\n\r\n").next()?.to_owned();
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, head))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registry({})", self.addr)
    }
}

/// Where a layout directory keeps the blob `sha256:…`.
pub fn layout_blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").expect("a sha256 digest"))
}

//! The `kube-emulator` binary, as people run it: its flags, the kubeconfig it writes, the
//! server behind it, and a clean stop on SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kube-emulator");

/// How long the binary may take to come up before the test fails: a hang is a bug too.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn help_names_every_flag() {
    let out = Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run kube-emulator --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--port", "--kubeconfig", "--event-log-capacity"] {
        assert!(help.contains(flag), "{flag} is missing from:\n{help}");
    }
}

/// The server URL in the kubeconfig at `path`, once the binary has written it.
fn wait_for_server(path: &Path, child: &mut std::process::Child) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Some(url) = text.lines().find_map(|l| l.trim().strip_prefix("server: "))
        {
            return url.to_owned();
        }
        if let Some(status) = child.try_wait().expect("poll kube-emulator") {
            panic!("kube-emulator exited before writing its kubeconfig: {status}");
        }
        assert!(start.elapsed() < START_TIMEOUT, "no kubeconfig at {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A plain HTTP/1.1 GET (the emulator speaks nothing else), returning the whole response.
fn http_get(url: &str, path: &str) -> String {
    let host = url.strip_prefix("http://").expect("a plain-HTTP server");
    let mut stream = TcpStream::connect(host).expect("connect to the emulator");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    response
}

#[cfg(unix)]
#[test]
fn serves_what_its_kubeconfig_names_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kc");
    let mut child = Command::new(BIN)
        .args(["--port", "0", "--event-log-capacity", "10", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kube-emulator");
    let url = wait_for_server(&kubeconfig, &mut child);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let version = http_get(&url, "/version");
    assert!(version.starts_with("HTTP/1.1 200"), "{version}");
    assert!(
        version.contains("\"gitVersion\":\"v1.32.0-lyra-kube-emulator\""),
        "{version}"
    );
    let namespace = http_get(&url, "/api/v1/namespaces/default");
    assert!(namespace.contains("\"phase\":\"Active\""), "{namespace}");

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(term.success());
    let out = child.wait_with_output().expect("wait for kube-emulator");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains(&format!("kube-emulator listening on {url}")),
        "{stderr}"
    );
    assert!(stderr.contains("kube-emulator: shutting down"), "{stderr}");
}

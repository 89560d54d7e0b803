//! Starting a Terraform provider as HashiCorp's go-plugin starts it.
//!
//! The client sets the magic cookie (a provider started without it says it is a plugin and
//! exits), the protocol versions it speaks and its TLS certificate in the environment; the
//! provider listens on a Unix socket of its own and prints one line to stdout:
//!
//! ```text
//! 1|5|unix|/tmp/plugin123|grpc|MIIC...
//! ```
//!
//! (go-plugin's protocol version, the Terraform protocol it chose, the network and address,
//! `grpc`, and its certificate as unpadded base64 DER; empty when it serves without TLS).
//! Its stderr is its log, forwarded to `tracing` (target `lyra_plugin::stderr`, debug level).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::{TcpStream, UnixStream};
use tokio::process::Child;
use tonic::transport::{Channel, Endpoint, Uri};

use lyra_plugin::{StderrTail, drain_stdout, forward_stderr, stderr_lines};

use crate::TerraformError;
use crate::tls;

/// The environment variable and value that tell a Terraform provider it is run as a plugin
/// (Terraform's, not a secret).
pub const MAGIC_COOKIE_KEY: &str = "TF_PLUGIN_MAGIC_COOKIE";
pub const MAGIC_COOKIE_VALUE: &str = "d602bf8f470bc67ca7faa0386276bbdd4330efaf76d1a219cb4d6991ca9872b2";
/// The Terraform plugin protocols this bridge speaks.
pub const PROTOCOLS: &str = "5,6";

const HANDSHAKE_MAX: u64 = 16 * 1024;

/// Where a provider listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Address {
    Unix(PathBuf),
    Tcp(String),
}

/// What the handshake line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handshake {
    pub protocol: u32,
    pub address: Address,
    /// The provider's certificate (DER), when it serves TLS.
    pub cert: Option<Vec<u8>>,
}

/// Parses go-plugin's handshake line.
pub(crate) fn parse_handshake(path: &Path, line: &str) -> Result<Handshake, TerraformError> {
    let garbage = || TerraformError::Handshake {
        path: path.to_path_buf(),
        message: format!("not a go-plugin handshake line: {line:?}"),
    };
    let fields: Vec<&str> = line.trim_end_matches(['\r', '\n']).split('|').collect();
    if fields.len() < 4 {
        return Err(garbage());
    }
    if fields[0] != "1" {
        return Err(TerraformError::Handshake {
            path: path.to_path_buf(),
            message: format!("go-plugin core protocol {:?}, this bridge speaks 1", fields[0]),
        });
    }
    let protocol: u32 = fields[1].parse().map_err(|_| garbage())?;
    if protocol != 5 && protocol != 6 {
        return Err(TerraformError::Handshake {
            path: path.to_path_buf(),
            message: format!("Terraform plugin protocol {protocol}; this bridge speaks 5 and 6"),
        });
    }
    let address = match fields[2] {
        "unix" => Address::Unix(PathBuf::from(fields[3])),
        "tcp" => Address::Tcp(fields[3].to_owned()),
        other => {
            return Err(TerraformError::Handshake {
                path: path.to_path_buf(),
                message: format!("network {other:?} is not supported (unix or tcp)"),
            });
        }
    };
    match fields.get(4).copied() {
        Some("grpc") => {}
        Some(other) => {
            return Err(TerraformError::Handshake {
                path: path.to_path_buf(),
                message: format!(
                    "speaks {other:?}, not gRPC (a provider for Terraform 0.11 and older, protocol 4, cannot be bridged)"
                ),
            });
        }
        None => return Err(garbage()),
    }
    let cert = match fields.get(5).map(|c| c.trim()) {
        None | Some("") => None,
        Some(b64) => Some(
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(b64.trim_end_matches('='))
                .map_err(|e| TerraformError::Handshake {
                    path: path.to_path_buf(),
                    message: format!("its certificate is not base64: {e}"),
                })?,
        ),
    };
    Ok(Handshake {
        protocol,
        address,
        cert,
    })
}

/// A started provider process and how to reach it.
pub(crate) struct Launched {
    pub handshake: Handshake,
    pub channel: Channel,
    pub dialer: Dialer,
    pub child: Mutex<Child>,
    pub stderr: StderrTail,
}

impl Launched {
    /// How the process exited, if it did.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.child.lock().ok().and_then(|mut c| c.try_wait().ok().flatten())
    }

    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Dials a provider again (for a call made from another runtime).
#[derive(Clone)]
pub(crate) struct Dialer {
    address: Address,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Dialer {
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        let dialer = self.clone();
        // The URI is not used: the connector dials the provider's address.
        Endpoint::from_static("http://terraform-provider.invalid")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let d = dialer.clone();
                async move { d.dial().await }
            }))
            .await
    }

    async fn dial(&self) -> std::io::Result<TokioIo<Box<dyn Stream>>> {
        let stream: Box<dyn Stream> = match &self.address {
            Address::Unix(p) => Box::new(UnixStream::connect(p).await?),
            Address::Tcp(a) => Box::new(TcpStream::connect(a).await?),
        };
        let Some(tls) = &self.tls else {
            return Ok(TokioIo::new(stream));
        };
        let name = rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        let tls_stream = tls.connect(name, stream).await?;
        Ok(TokioIo::new(Box::new(tls_stream)))
    }
}

/// A byte stream to a provider, plain or TLS.
pub(crate) trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Starts the provider at `path`, reads its handshake and connects, within `timeout`.
pub(crate) async fn launch(path: &Path, timeout: Duration) -> Result<Launched, TerraformError> {
    let cert = tls::client_cert().map_err(|e| TerraformError::Tls {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut command = lyra_plugin::plugin_command(path);
    command
        .env(MAGIC_COOKIE_KEY, MAGIC_COOKIE_VALUE)
        .env("PLUGIN_PROTOCOL_VERSIONS", PROTOCOLS)
        .env("PLUGIN_CLIENT_CERT", &cert.pem)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = lyra_plugin::spawn_plugin(command).map_err(|source| TerraformError::Spawn {
        path: path.to_path_buf(),
        source,
    })?;
    let (Some(stdout), Some(stderr_pipe)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(TerraformError::Spawn {
            path: path.to_path_buf(),
            source: std::io::Error::other("no pipes to the provider"),
        });
    };
    // A provider's log is chatty (go-plugin's debug lines): below the info level.
    let (stderr, stderr_done) = forward_stderr(path, stderr_pipe, tracing::Level::DEBUG);
    let tail = stderr_lines;

    let mut stdout = BufReader::new(stdout);
    let mut line = Vec::new();
    let read = tokio::time::timeout(timeout, (&mut stdout).take(HANDSHAKE_MAX).read_until(b'\n', &mut line)).await;
    match read {
        Err(_) => {
            return Err(TerraformError::HandshakeTimeout {
                path: path.to_path_buf(),
                timeout,
                stderr: tail(&stderr),
            });
        }
        Ok(Ok(0) | Err(_)) => {
            let status = tokio::time::timeout(Duration::from_secs(2), child.wait())
                .await
                .ok()
                .and_then(Result::ok);
            let _ = tokio::time::timeout(Duration::from_secs(1), stderr_done).await;
            return Err(TerraformError::Exited {
                path: path.to_path_buf(),
                status,
                stderr: tail(&stderr),
            });
        }
        Ok(Ok(_)) => {}
    }
    let handshake = parse_handshake(path, &String::from_utf8_lossy(&line))?;
    drain_stdout(path, stdout, tracing::Level::DEBUG);

    let tls = match &handshake.cert {
        None => None,
        Some(der) => {
            let config = tls::client_config(&cert, der.clone()).map_err(|e| TerraformError::Tls {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
        }
    };
    let dialer = Dialer {
        address: handshake.address.clone(),
        tls,
    };
    let channel = tokio::time::timeout(timeout, dialer.connect())
        .await
        .map_err(|_| TerraformError::HandshakeTimeout {
            path: path.to_path_buf(),
            timeout,
            stderr: tail(&stderr),
        })?
        .map_err(|e| TerraformError::Connect {
            path: path.to_path_buf(),
            message: error_chain(&e),
        })?;
    Ok(Launched {
        handshake,
        channel,
        dialer,
        child: Mutex::new(child),
        stderr,
    })
}

/// An error and its sources, on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_lines_parse() {
        let p = Path::new("terraform-provider-x");
        let h = parse_handshake(p, "1|5|unix|/tmp/plugin1|grpc|\n").unwrap();
        assert_eq!(h.protocol, 5);
        assert_eq!(h.address, Address::Unix(PathBuf::from("/tmp/plugin1")));
        assert_eq!(h.cert, None);
        let h = parse_handshake(p, "1|6|tcp|127.0.0.1:1234|grpc|AQID").unwrap();
        assert_eq!(h.cert, Some(vec![1, 2, 3]));
        let e = |l: &str| parse_handshake(p, l).unwrap_err().to_string();
        assert!(e("hello").contains("not a go-plugin handshake line"), "{}", e("hello"));
        assert!(
            e("1|4|unix|/x|netrpc").contains("protocol 4"),
            "{}",
            e("1|4|unix|/x|netrpc")
        );
        assert!(
            e("1|5|unix|/x|netrpc").contains("not gRPC"),
            "{}",
            e("1|5|unix|/x|netrpc")
        );
        assert!(e("2|5|unix|/x|grpc").contains("core protocol"));
        assert!(e("1|5|pipe|/x|grpc").contains("network"));
        assert!(e("1|5|unix|/x|grpc|!!").contains("base64"));
    }
}

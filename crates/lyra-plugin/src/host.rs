//! The host side: starting a plugin and using it as a [`Provider`].

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::ResourceSchema;
use lyra_core::value::Map;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdin, Command};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::convert::{context_to_proto, error_from_proto, from_json, schema_from_proto, to_json};
use crate::proto;
use crate::proto::provider_client::ProviderClient;
use crate::{EXECUTABLE_PREFIX, HANDSHAKE_MAGIC, PROTOCOL_VERSION};

/// How many of a plugin's last stderr lines are kept for error messages.
const STDERR_TAIL: usize = 20;
/// The longest handshake line read.
const HANDSHAKE_MAX: u64 = 4096;

/// Why a plugin could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("provider plugin {}: cannot start it: {source}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("provider plugin {}: no handshake within {}{}", path.display(), fmt_duration(*timeout), tail(stderr))]
    HandshakeTimeout {
        path: PathBuf,
        timeout: Duration,
        stderr: Vec<String>,
    },
    #[error("provider plugin {}: exited before its handshake{}{}", path.display(), status.map(|s| format!(" ({s})")).unwrap_or_default(), tail(stderr))]
    HandshakeEof {
        path: PathBuf,
        status: Option<ExitStatus>,
        stderr: Vec<String>,
    },
    #[error("provider plugin {}: not a handshake line: {line:?} (expected `{HANDSHAKE_MAGIC}|{PROTOCOL_VERSION}|unix|<socket path>`)", path.display())]
    HandshakeGarbage { path: PathBuf, line: String },
    #[error("provider plugin {}: speaks protocol version {version:?}, this Lyra speaks {PROTOCOL_VERSION}", path.display())]
    ProtocolVersion { path: PathBuf, version: String },
    #[error("provider plugin {}: transport {transport:?} is not supported (only unix)", path.display())]
    Transport { path: PathBuf, transport: String },
    #[error("provider plugin {}: cannot connect to {}: {source}", path.display(), socket.display())]
    Connect {
        path: PathBuf,
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("provider plugin {}: no schema within {}", path.display(), fmt_duration(*timeout))]
    SchemaTimeout { path: PathBuf, timeout: Duration },
    #[error("provider plugin {}: cannot get its schema: {message}", path.display())]
    Schema { path: PathBuf, message: String },
}

fn fmt_duration(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

fn tail(lines: &[String]) -> String {
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its last stderr lines:\n{}", lines.join("\n"))
    }
}

/// A running provider plugin, used as a [`Provider`]. Dropping it kills the process.
///
/// Each operation is one RPC. A failure the plugin means comes back as the same
/// [`ProviderError`] variant; a transport failure (the plugin crashed or hung up) as
/// [`ProviderError::Other`] naming the plugin. When the operation's [`OpContext::cancel`] is
/// set, the request is dropped (the plugin drops the operation) and the operation returns
/// [`ProviderError::Cancelled`]. The engine's step `timeout:` works the same way, by dropping
/// the future.
pub struct PluginProvider {
    path: PathBuf,
    socket: PathBuf,
    client: ProviderClient<Channel>,
    resources: Vec<ResourceSchema>,
    configs: Vec<ResourceSchema>,
    child: Mutex<Child>,
    /// Kept open: the plugin exits when it closes.
    _stdin: ChildStdin,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl std::fmt::Debug for PluginProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginProvider")
            .field("path", &self.path)
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl PluginProvider {
    /// Starts the plugin at `path`, reads its handshake, connects and fetches its schema,
    /// each step within `timeout`.
    ///
    /// Its stderr is forwarded line by line to `tracing` (target `lyra_plugin::stderr`), and
    /// its last lines are kept for error messages. Call it inside a Tokio runtime.
    pub async fn start(path: &Path, timeout: Duration) -> Result<PluginProvider, PluginError> {
        let path = path.to_path_buf();
        let mut child = Command::new(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| PluginError::Spawn {
                path: path.clone(),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr_pipe = child.stderr.take();
        let (Some(stdin), Some(stdout), Some(stderr_pipe)) = (stdin, stdout, stderr_pipe) else {
            return Err(PluginError::Spawn {
                path,
                source: std::io::Error::other("no pipes to the plugin"),
            });
        };

        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_done = forward_stderr(&path, stderr_pipe, Arc::clone(&stderr));
        let stderr_lines = |s: &Arc<Mutex<VecDeque<String>>>| -> Vec<String> {
            s.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default()
        };

        let mut stdout = BufReader::new(stdout);
        let mut line = Vec::new();
        let read = tokio::time::timeout(timeout, (&mut stdout).take(HANDSHAKE_MAX).read_until(b'\n', &mut line)).await;
        match read {
            Err(_) => {
                return Err(PluginError::HandshakeTimeout {
                    path,
                    timeout,
                    stderr: stderr_lines(&stderr),
                });
            }
            Ok(Ok(0)) | Ok(Err(_)) => {
                // Gone: let its last stderr lines arrive, and its exit status.
                let status = tokio::time::timeout(Duration::from_secs(2), child.wait())
                    .await
                    .ok()
                    .and_then(Result::ok);
                let _ = tokio::time::timeout(Duration::from_secs(1), stderr_done).await;
                return Err(PluginError::HandshakeEof {
                    path,
                    status,
                    stderr: stderr_lines(&stderr),
                });
            }
            Ok(Ok(_)) => {}
        }
        let socket = parse_handshake(&path, &line)?;
        drain_stdout(&path, stdout);

        let connect = async {
            let channel = connect(&socket).await.map_err(|source| PluginError::Connect {
                path: path.clone(),
                socket: socket.clone(),
                source,
            })?;
            let mut client = ProviderClient::new(channel);
            let schema = client
                .get_schema(proto::GetSchemaRequest {})
                .await
                .map_err(|s| PluginError::Schema {
                    path: path.clone(),
                    message: status_text(&s),
                })?
                .into_inner();
            Ok::<_, PluginError>((client, schema))
        };
        let (client, schema) =
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| PluginError::SchemaTimeout {
                    path: path.clone(),
                    timeout,
                })??;
        let convert = |v: Vec<proto::ResourceSchema>| {
            v.into_iter()
                .map(schema_from_proto)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|message| PluginError::Schema {
                    path: path.clone(),
                    message,
                })
        };
        let resources = convert(schema.resources)?;
        let configs = convert(schema.configs)?;
        Ok(PluginProvider {
            path,
            socket,
            client,
            resources,
            configs,
            child: Mutex::new(child),
            _stdin: stdin,
            stderr,
        })
    }

    /// The executable's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok().and_then(|c| c.id())
    }

    /// The last lines the plugin wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A transport failure of an operation, naming the plugin (and how it exited, if it did).
    fn transport_error(&self, status: &tonic::Status) -> ProviderError {
        let exited = self
            .child
            .lock()
            .ok()
            .and_then(|mut c| c.try_wait().ok().flatten())
            .map(|s| format!(" (the plugin exited: {s})"))
            .unwrap_or_default();
        ProviderError::Other(format!(
            "provider plugin {}: {}{exited}",
            self.path.display(),
            status_text(status)
        ))
    }

    fn bad_reply(&self, what: &str, e: &serde_json::Error) -> ProviderError {
        ProviderError::Other(format!(
            "provider plugin {}: its {what} is not a JSON object: {e}",
            self.path.display()
        ))
    }

    /// Runs an RPC, giving it up (dropping the request) when `cx` is cancelled.
    async fn call<T>(
        &self,
        cx: &OpContext<'_>,
        rpc: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ProviderError> {
        let cancelled = async {
            while !cx.cancelled() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            r = rpc => r.map(tonic::Response::into_inner).map_err(|s| self.transport_error(&s)),
            () = cancelled => Err(ProviderError::Cancelled),
        }
    }

    fn created(&self, c: Option<proto::Created>) -> Result<Created, ProviderError> {
        let c = c.ok_or_else(|| {
            ProviderError::Other(format!(
                "provider plugin {}: a reply without its resource",
                self.path.display()
            ))
        })?;
        Ok(Created {
            external_id: c.external_id,
            actual: from_json(&c.actual).map_err(|e| self.bad_reply("actual state", &e))?,
        })
    }
}

fn status_text(s: &tonic::Status) -> String {
    if s.message().is_empty() {
        format!("{:?}", s.code())
    } else {
        format!("{:?}: {}", s.code(), s.message())
    }
}

fn parse_handshake(path: &Path, line: &[u8]) -> Result<PathBuf, PluginError> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\n', '\r']);
    let garbage = || PluginError::HandshakeGarbage {
        path: path.to_path_buf(),
        line: text.to_owned(),
    };
    let mut fields = text.splitn(4, '|');
    let (Some(magic), Some(version), Some(transport), Some(socket)) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(garbage());
    };
    if magic != HANDSHAKE_MAGIC || socket.is_empty() {
        return Err(garbage());
    }
    if version != PROTOCOL_VERSION {
        return Err(PluginError::ProtocolVersion {
            path: path.to_path_buf(),
            version: version.to_owned(),
        });
    }
    if transport != "unix" {
        return Err(PluginError::Transport {
            path: path.to_path_buf(),
            transport: transport.to_owned(),
        });
    }
    Ok(PathBuf::from(socket))
}

/// A channel to the gRPC server on a Unix socket.
async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is not used: the connector dials the socket.
    Endpoint::from_static("http://lyra-plugin.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
}

/// Forwards the plugin's stderr to `tracing`, keeping its last lines. The task ends at EOF.
fn forward_stderr(
    path: &Path,
    pipe: tokio::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> tokio::task::JoinHandle<()> {
    let plugin = path.display().to_string();
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "lyra_plugin::stderr", plugin = %plugin, "{line}");
            if let Ok(mut t) = tail.lock() {
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    })
}

/// Reads what the plugin writes to stdout after its handshake (so it never blocks on a full
/// pipe), logging it.
fn drain_stdout(path: &Path, stdout: BufReader<tokio::process::ChildStdout>) {
    let plugin = path.display().to_string();
    tokio::spawn(async move {
        let mut lines = stdout.lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "lyra_plugin::stdout", plugin = %plugin, "{line}");
        }
    });
}

#[async_trait]
impl Provider for PluginProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        self.resources.clone()
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        self.configs.clone()
    }

    /// The trait's method is synchronous: the call is made on a thread of its own (with a
    /// runtime and a connection of its own), so it works from any runtime. When the plugin
    /// cannot answer, nothing forces a replace (the warning is logged): the update that
    /// follows fails on the same plugin.
    fn replace_reasons(&self, type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        let request = proto::ReplaceReasonsRequest {
            type_name: type_name.to_owned(),
            desired: to_json(desired),
            actual: to_json(actual),
        };
        let socket = &self.socket;
        let result = std::thread::scope(|s| {
            s.spawn(move || -> Result<Vec<String>, String> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let channel = connect(socket).await.map_err(|e| e.to_string())?;
                    let reply = ProviderClient::new(channel)
                        .replace_reasons(request)
                        .await
                        .map_err(|s| status_text(&s))?;
                    Ok(reply.into_inner().reasons)
                })
            })
            .join()
            .unwrap_or_else(|_| Err("the call panicked".to_owned()))
        });
        result.unwrap_or_else(|e| {
            tracing::warn!(plugin = %self.path.display(), "replace_reasons: {e}");
            Vec::new()
        })
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let request = proto::CreateRequest {
            context: Some(context_to_proto(cx)),
            desired: to_json(desired),
        };
        let reply = self.call(cx, self.client.clone().create(request)).await?;
        if let Some(e) = reply.error {
            return Err(error_from_proto(e, cx.type_name));
        }
        self.created(reply.created)
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let request = proto::ReadRequest {
            context: Some(context_to_proto(cx)),
            external_id: external_id.to_owned(),
            prior: prior.map(to_json),
        };
        let reply = self.call(cx, self.client.clone().read(request)).await?;
        if let Some(e) = reply.error {
            return Err(error_from_proto(e, cx.type_name));
        }
        reply
            .actual
            .map(|a| from_json(&a).map_err(|e| self.bad_reply("actual state", &e)))
            .transpose()
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        let request = proto::UpdateRequest {
            context: Some(context_to_proto(cx)),
            external_id: external_id.to_owned(),
            desired: to_json(desired),
            prior: to_json(prior),
        };
        let reply = self.call(cx, self.client.clone().update(request)).await?;
        if let Some(e) = reply.error {
            return Err(error_from_proto(e, cx.type_name));
        }
        from_json(&reply.actual).map_err(|e| self.bad_reply("actual state", &e))
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        let request = proto::DeleteRequest {
            context: Some(context_to_proto(cx)),
            external_id: external_id.to_owned(),
            prior: to_json(prior),
        };
        let reply = self.call(cx, self.client.clone().delete(request)).await?;
        match reply.error {
            Some(e) => Err(error_from_proto(e, cx.type_name)),
            None => Ok(()),
        }
    }

    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        use proto::lookup_response::Outcome;
        let request = proto::LookupRequest {
            context: Some(context_to_proto(cx)),
            desired: to_json(desired),
        };
        let reply = self.call(cx, self.client.clone().lookup(request)).await?;
        if let Some(e) = reply.error {
            return Err(error_from_proto(e, cx.type_name));
        }
        Ok(match reply.outcome() {
            Outcome::Found => Lookup::Found(self.created(reply.created)?),
            Outcome::Absent => Lookup::Absent,
            Outcome::Unsupported => Lookup::Unsupported,
        })
    }
}

/// The provider plugins in `dirs`: executables named `lyra-provider-<name>`, as
/// `(name, path)`, sorted by name. A name found in several directories is taken from the
/// first that has it. Unreadable directories are skipped.
pub fn discover(dirs: &[PathBuf]) -> Vec<(String, PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let file_name = entry.file_name();
                let name = file_name.to_str()?.strip_prefix(EXECUTABLE_PREFIX)?;
                if name.is_empty() {
                    return None;
                }
                let path = entry.path();
                // Follows symbolic links.
                let meta = std::fs::metadata(&path).ok()?;
                (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then(|| (name.to_owned(), path))
            })
            .collect();
        here.sort();
        for (name, path) in here {
            if !found.iter().any(|(n, _)| *n == name) {
                found.push((name, path));
            }
        }
    }
    found.sort();
    found
}

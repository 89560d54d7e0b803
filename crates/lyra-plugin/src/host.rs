//! The host side: starting a plugin and using it as a [`Provider`].

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::ResourceSchema;
use lyra_core::value::Map;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdin};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::convert::{context_to_proto, error_from_proto, from_json, schema_from_proto, to_json};
use crate::proto;
use crate::proto::provider_client::ProviderClient;
use crate::{
    EXECUTABLE_PREFIX, HANDSHAKE_MAGIC, PROTOCOL_VERSION, StderrTail, block_on_own_thread, drain_stdout,
    forward_stderr, plugin_command, spawn_plugin, stderr_lines,
};

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
/// [`ProviderError::Other`] naming the plugin, and how it exited if it did. When the
/// operation's [`OpContext::cancel`] is set, the request is dropped (the plugin drops the
/// operation) and the operation returns [`ProviderError::Cancelled`]. The engine's step
/// `timeout:` works the same way, by dropping the future.
///
/// A plugin found dead (by an operation's transport failure, or before an operation starts)
/// is restarted for the next operation: the same executable, a fresh handshake and
/// connection. The first restart is at once; a plugin that dies again within 10 s of its
/// start, or cannot be restarted, waits 1 s, 2 s, ... up to 30 s before the next try, and the
/// operations meanwhile fail at once saying so (the engine retries them per the step's
/// `retry:`). A restarted plugin must serve the same schema as at the start (the types are
/// registered then): one that serves another is stopped, and every later operation fails
/// saying so.
pub struct PluginProvider {
    path: PathBuf,
    /// For starts and restarts.
    timeout: Duration,
    /// The schema as the plugin sent it at the start, which a restarted one must repeat.
    wire_schema: proto::GetSchemaResponse,
    resources: Vec<ResourceSchema>,
    configs: Vec<ResourceSchema>,
    /// The current process (or the last one, dead). Never held across an `.await`.
    process: Mutex<Process>,
    /// Held while restarting, so operations that find the plugin dead together start one
    /// process, not one each.
    restarts: tokio::sync::Mutex<Restarts>,
}

/// How long a plugin must have run for its death to restart it at once again.
const HEALTHY_RUN: Duration = Duration::from_secs(10);
/// The first and the longest wait before restarting a plugin that keeps dying.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(30));
/// How long a transport failure waits for the process's exit to show.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// How many stderr lines of a dead plugin an operation's error quotes.
const EXIT_TAIL: usize = 5;

/// One plugin process and the connection to it.
struct Process {
    /// Counts the processes started: which one an operation used.
    generation: u64,
    socket: PathBuf,
    client: ProviderClient<Channel>,
    child: Child,
    /// Kept open: the plugin exits when it closes.
    _stdin: ChildStdin,
    stderr: StderrTail,
    /// The stderr forwarder, awaited (briefly) for a dead plugin's last lines.
    stderr_done: Option<tokio::task::JoinHandle<()>>,
    started: Instant,
    /// How it exited, once seen.
    exited: Option<ExitStatus>,
}

impl Process {
    /// Whether it still runs (asking the OS), recording its exit.
    fn running(&mut self) -> bool {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status);
        }
        self.exited.is_none()
    }
}

/// The restart bookkeeping.
#[derive(Default)]
struct Restarts {
    /// The wait before the restart after the next quick death or failed restart.
    backoff: Duration,
    /// No restart before then.
    not_before: Option<Instant>,
    /// The generation whose death the backoff accounts for.
    counted: u64,
    /// Why no restart is made any more (the plugin's schema changed).
    refused: Option<String>,
}

impl Restarts {
    fn next_backoff(&mut self) -> Duration {
        let now = self.backoff;
        self.backoff = (self.backoff * 2).clamp(RESTART_BACKOFF.0, RESTART_BACKOFF.1);
        now
    }
}

/// What a start yields.
struct Started {
    process: Process,
    wire_schema: proto::GetSchemaResponse,
}

impl std::fmt::Debug for PluginProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginProvider")
            .field("path", &self.path)
            .field("socket", &self.lock().socket)
            .finish_non_exhaustive()
    }
}

/// Starts the plugin at `path` and reads its handshake, connects and fetches its schema, each
/// step within `timeout`. `generation` numbers the process.
async fn launch(path: &Path, timeout: Duration, generation: u64) -> Result<Started, PluginError> {
    let path = path.to_path_buf();
    let mut command = plugin_command(&path);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn_plugin(command).map_err(|source| PluginError::Spawn {
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

    let (stderr, stderr_done) = forward_stderr(&path, stderr_pipe, tracing::Level::INFO);

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
    drain_stdout(&path, stdout, tracing::Level::INFO);

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
    let (client, wire_schema) =
        tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| PluginError::SchemaTimeout {
                path: path.clone(),
                timeout,
            })??;
    Ok(Started {
        process: Process {
            generation,
            socket,
            client,
            child,
            _stdin: stdin,
            stderr,
            stderr_done: Some(stderr_done),
            started: Instant::now(),
            exited: None,
        },
        wire_schema,
    })
}

impl PluginProvider {
    /// Starts the plugin at `path`, reads its handshake, connects and fetches its schema,
    /// each step within `timeout` (restarts get the same).
    ///
    /// The process is started by [`plugin_command`] and [`spawn_plugin`], so it does not
    /// outlive this one. Its stderr is forwarded line by line to `tracing` (target
    /// `lyra_plugin::stderr`), and its last lines are kept for error messages. Call it inside
    /// a Tokio runtime.
    pub async fn start(path: &Path, timeout: Duration) -> Result<PluginProvider, PluginError> {
        let Started { process, wire_schema } = launch(path, timeout, 1).await?;
        let convert = |v: &[proto::ResourceSchema]| {
            v.iter()
                .cloned()
                .map(schema_from_proto)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|message| PluginError::Schema {
                    path: path.to_path_buf(),
                    message,
                })
        };
        let resources = convert(&wire_schema.resources)?;
        let configs = convert(&wire_schema.configs)?;
        Ok(PluginProvider {
            path: path.to_path_buf(),
            timeout,
            wire_schema,
            resources,
            configs,
            process: Mutex::new(process),
            restarts: tokio::sync::Mutex::new(Restarts::default()),
        })
    }

    /// The executable's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        let mut p = self.lock();
        if p.running() { p.child.id() } else { None }
    }

    /// The last lines the plugin (the current process, or the last one) wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        stderr_lines(&self.lock().stderr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Process> {
        // Nothing panics while holding it; a poisoned lock still holds a consistent process.
        self.process.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn other(&self, message: impl std::fmt::Display) -> ProviderError {
        ProviderError::Other(format!("provider plugin {}: {message}", self.path.display()))
    }

    /// A client of the running plugin and its generation, restarting a dead one first (see
    /// the type's docs for the backoff).
    async fn client(&self) -> Result<(ProviderClient<Channel>, u64), ProviderError> {
        let alive = || {
            let mut p = self.lock();
            p.running().then(|| (p.client.clone(), p.generation))
        };
        if let Some(c) = alive() {
            return Ok(c);
        }
        let mut restarts = self.restarts.lock().await;
        // Another operation may have restarted it meanwhile.
        if let Some(c) = alive() {
            return Ok(c);
        }
        if let Some(why) = &restarts.refused {
            return Err(self.other(why));
        }
        let (generation, lived, exited) = {
            let p = self.lock();
            (p.generation, p.started.elapsed(), exit_text(p.exited.as_ref()))
        };
        let now = Instant::now();
        if restarts.counted != generation {
            restarts.counted = generation;
            if lived >= HEALTHY_RUN {
                restarts.backoff = Duration::ZERO;
            }
            let wait = restarts.next_backoff();
            restarts.not_before = Some(now + wait);
        }
        if let Some(at) = restarts.not_before
            && at > now
        {
            return Err(self.other(format_args!(
                "the plugin {exited}; it is restarted in {}",
                fmt_duration(Duration::from_millis(
                    (at - now).as_millis().try_into().unwrap_or(u64::MAX)
                ))
            )));
        }
        tracing::warn!(plugin = %self.path.display(), "the plugin {exited}: restarting it");
        match launch(&self.path, self.timeout, generation + 1).await {
            Err(e) => {
                let wait = restarts.next_backoff();
                restarts.not_before = Some(Instant::now() + wait);
                Err(self.other(format_args!("the plugin {exited}; restarting it failed: {e}")))
            }
            Ok(started) if started.wire_schema != self.wire_schema => {
                // Its process is killed as `started` is dropped.
                let why = format!(
                    "the plugin {exited}, and when restarted it served another schema than at the start: \
                     restart Lyra to use it"
                );
                restarts.refused = Some(why.clone());
                Err(self.other(why))
            }
            Ok(started) => {
                let mut p = self.lock();
                *p = started.process;
                Ok((p.client.clone(), p.generation))
            }
        }
    }

    /// A transport failure of an operation on process `generation`, naming the plugin, and
    /// how it exited if it did (then it is restarted for the next operation).
    async fn transport_error(&self, generation: u64, status: &tonic::Status) -> ProviderError {
        let what = status_text(status);
        // A broken connection: the process may be dying, its exit not visible yet.
        let broken = matches!(status.code(), tonic::Code::Unknown | tonic::Code::Unavailable);
        let deadline = Instant::now() + EXIT_GRACE;
        let stderr_done = loop {
            {
                let mut p = self.lock();
                if p.generation != generation {
                    return self.other(format_args!("{what}: the plugin exited and was restarted"));
                }
                if !p.running() {
                    break p.stderr_done.take();
                }
            }
            if !broken || Instant::now() >= deadline {
                return self.other(what);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Its last stderr lines may say why.
        if let Some(done) = stderr_done {
            let _ = tokio::time::timeout(EXIT_GRACE, done).await;
        }
        let p = self.lock();
        let lines = stderr_lines(&p.stderr);
        let last = &lines[lines.len().saturating_sub(EXIT_TAIL)..];
        self.other(format_args!(
            "{what}: the plugin {}; it is restarted for the next operation{}",
            exit_text(p.exited.as_ref()),
            tail(last)
        ))
    }

    fn bad_reply(&self, what: &str, e: &serde_json::Error) -> ProviderError {
        self.other(format_args!("its {what} is not a JSON object: {e}"))
    }

    /// Runs an RPC on the running plugin (restarting a dead one first), giving it up
    /// (dropping the request) when `cx` is cancelled.
    async fn call<T, F, Fut>(&self, cx: &OpContext<'_>, rpc: F) -> Result<T, ProviderError>
    where
        F: FnOnce(ProviderClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let cancelled = crate::until_cancelled(cx);
        let op = async {
            let (client, generation) = self.client().await?;
            match rpc(client).await {
                Ok(r) => Ok(r.into_inner()),
                Err(s) => Err(self.transport_error(generation, &s).await),
            }
        };
        tokio::select! {
            r = op => r,
            () = cancelled => Err(ProviderError::Cancelled),
        }
    }

    fn created(&self, c: Option<proto::Created>) -> Result<Created, ProviderError> {
        let c = c.ok_or_else(|| self.other("a reply without its resource"))?;
        Ok(Created {
            external_id: c.external_id,
            actual: from_json(&c.actual).map_err(|e| self.bad_reply("actual state", &e))?,
        })
    }
}

/// "exited (exit status: 3)", "exited (signal: 6 (SIGABRT))", or "exited" when not seen.
fn exit_text(status: Option<&ExitStatus>) -> String {
    status.map_or_else(|| "exited".to_owned(), |s| format!("exited ({s})"))
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
        let socket = self.lock().socket.clone();
        let result = block_on_own_thread(async {
            let channel = connect(&socket).await.map_err(|e| e.to_string())?;
            let reply = ProviderClient::new(channel)
                .replace_reasons(request)
                .await
                .map_err(|s| status_text(&s))?;
            Ok(reply.into_inner().reasons)
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
        let reply = self.call(cx, |mut c| async move { c.create(request).await }).await?;
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
        let reply = self.call(cx, |mut c| async move { c.read(request).await }).await?;
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
        let reply = self.call(cx, |mut c| async move { c.update(request).await }).await?;
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
        let reply = self.call(cx, |mut c| async move { c.delete(request).await }).await?;
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
        let reply = self.call(cx, |mut c| async move { c.lookup(request).await }).await?;
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

//! The SDK for plugins written in Rust: [`serve`].

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::provider::{Lookup, OpContext, Provider};
use lyra_core::value::Map;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::convert::{error_to_proto, from_json, schema_to_proto, to_json};
use crate::proto;
use crate::proto::provider_server::{Provider as ProviderService, ProviderServer};
use crate::{HANDSHAKE_MAGIC, PROTOCOL_VERSION};

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot make the plugin's socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("cannot write the handshake to stdout: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("cannot watch for SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `provider` as a Lyra provider plugin, until stdin reaches end of file or SIGTERM.
///
/// Makes a Unix socket in a fresh temporary directory (private to the user), writes the
/// handshake line `lyra-plugin|1|unix|<socket path>` to stdout and flushes it, then serves
/// the `lyra.plugin.v1.Provider` service on the socket. Nothing else may write to stdout
/// before the handshake; logs belong on stderr (this function installs no `tracing`
/// subscriber: the plugin chooses its own, writing to stderr). The directory is removed when
/// it returns.
///
/// Cancellation: when the host gives an operation up (its run was cancelled, its step timed
/// out), it drops the gRPC request, and the server drops the operation's future: the provider
/// stops at its next `.await`. The [`OpContext::cancel`] flag the provider sees is never set.
///
/// Call it inside a Tokio runtime (`#[tokio::main]`).
pub async fn serve(provider: impl Provider + 'static) -> Result<(), ServeError> {
    let dir = tempfile::Builder::new()
        .prefix("lyra-plugin-")
        .tempdir()
        .map_err(ServeError::Socket)?;
    let socket = dir.path().join("provider.sock");
    let listener = UnixListener::bind(&socket).map_err(ServeError::Socket)?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{HANDSHAKE_MAGIC}|{PROTOCOL_VERSION}|unix|{}", socket.display())
            .and_then(|()| out.flush())
            .map_err(ServeError::Handshake)?;
    }

    let mut sigterm =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(ServeError::Signal)?;
    let stdin_closed = stdin_eof();
    let shutdown = async move {
        tokio::select! {
            _ = stdin_closed => tracing::debug!("stdin closed: stopping"),
            _ = sigterm.recv() => tracing::debug!("SIGTERM: stopping"),
        }
    };

    let service = Service {
        provider: Arc::new(provider),
    };
    tonic::transport::Server::builder()
        .add_service(ProviderServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    drop(dir);
    Ok(())
}

/// Resolves when stdin reaches end of file (or fails). Read on a thread of its own, not
/// Tokio's stdin: a blocking read there would hold up the runtime's shutdown.
fn stdin_eof() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 256];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        let _ = tx.send(());
    });
    rx
}

struct Service<P> {
    provider: Arc<P>,
}

/// An [`OpContext`]'s owned parts, from a request.
struct Cx {
    deployment: String,
    step_id: String,
    type_name: String,
    idempotency_key: Option<String>,
    config: Map,
    cancel: AtomicBool,
}

impl Cx {
    fn from_proto(cx: Option<proto::Context>) -> Result<Cx, Status> {
        let cx = cx.ok_or_else(|| Status::invalid_argument("no context"))?;
        let config = from_json(&cx.config).map_err(|e| bad_json("config", &e))?;
        Ok(Cx {
            deployment: cx.deployment,
            step_id: cx.step_id,
            type_name: cx.type_name,
            idempotency_key: cx.idempotency_key,
            config,
            cancel: AtomicBool::new(false),
        })
    }

    fn op(&self) -> OpContext<'_> {
        OpContext {
            deployment: &self.deployment,
            step_id: &self.step_id,
            type_name: &self.type_name,
            idempotency_key: self.idempotency_key.as_deref(),
            config: &self.config,
            cancel: &self.cancel,
        }
    }
}

fn bad_json(what: &str, e: &serde_json::Error) -> Status {
    Status::invalid_argument(format!("{what}: not a JSON object: {e}"))
}

fn json(what: &str, bytes: &[u8]) -> Result<Map, Status> {
    from_json(bytes).map_err(|e| bad_json(what, &e))
}

fn created(c: lyra_core::provider::Created) -> proto::Created {
    proto::Created {
        external_id: c.external_id,
        actual: to_json(&c.actual),
    }
}

#[tonic::async_trait]
impl<P: Provider + 'static> ProviderService for Service<P> {
    async fn get_schema(
        &self,
        _request: Request<proto::GetSchemaRequest>,
    ) -> Result<Response<proto::GetSchemaResponse>, Status> {
        Ok(Response::new(proto::GetSchemaResponse {
            resources: self.provider.schemas().iter().map(schema_to_proto).collect(),
            configs: self.provider.config_schemas().iter().map(schema_to_proto).collect(),
        }))
    }

    async fn create(&self, request: Request<proto::CreateRequest>) -> Result<Response<proto::CreateResponse>, Status> {
        let r = request.into_inner();
        let cx = Cx::from_proto(r.context)?;
        let desired = json("desired", &r.desired)?;
        let reply = match self.provider.create(&cx.op(), &desired).await {
            Ok(c) => proto::CreateResponse {
                created: Some(created(c)),
                error: None,
            },
            Err(e) => proto::CreateResponse {
                created: None,
                error: Some(error_to_proto(e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn read(&self, request: Request<proto::ReadRequest>) -> Result<Response<proto::ReadResponse>, Status> {
        let r = request.into_inner();
        let cx = Cx::from_proto(r.context)?;
        let prior = r.prior.as_deref().map(|p| json("prior", p)).transpose()?;
        let reply = match self.provider.read(&cx.op(), &r.external_id, prior.as_ref()).await {
            Ok(actual) => proto::ReadResponse {
                actual: actual.as_ref().map(to_json),
                error: None,
            },
            Err(e) => proto::ReadResponse {
                actual: None,
                error: Some(error_to_proto(e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn update(&self, request: Request<proto::UpdateRequest>) -> Result<Response<proto::UpdateResponse>, Status> {
        let r = request.into_inner();
        let cx = Cx::from_proto(r.context)?;
        let desired = json("desired", &r.desired)?;
        let prior = json("prior", &r.prior)?;
        let reply = match self.provider.update(&cx.op(), &r.external_id, &desired, &prior).await {
            Ok(actual) => proto::UpdateResponse {
                actual: to_json(&actual),
                error: None,
            },
            Err(e) => proto::UpdateResponse {
                actual: Vec::new(),
                error: Some(error_to_proto(e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn delete(&self, request: Request<proto::DeleteRequest>) -> Result<Response<proto::DeleteResponse>, Status> {
        let r = request.into_inner();
        let cx = Cx::from_proto(r.context)?;
        let prior = json("prior", &r.prior)?;
        let error = self
            .provider
            .delete(&cx.op(), &r.external_id, &prior)
            .await
            .err()
            .map(error_to_proto);
        Ok(Response::new(proto::DeleteResponse { error }))
    }

    async fn lookup(&self, request: Request<proto::LookupRequest>) -> Result<Response<proto::LookupResponse>, Status> {
        use proto::lookup_response::Outcome;
        let r = request.into_inner();
        let cx = Cx::from_proto(r.context)?;
        let desired = json("desired", &r.desired)?;
        let reply = match self.provider.lookup(&cx.op(), &desired).await {
            Ok(Lookup::Found(c)) => proto::LookupResponse {
                outcome: Outcome::Found as i32,
                created: Some(created(c)),
                error: None,
            },
            Ok(Lookup::Absent) => proto::LookupResponse {
                outcome: Outcome::Absent as i32,
                created: None,
                error: None,
            },
            Ok(Lookup::Unsupported) => proto::LookupResponse {
                outcome: Outcome::Unsupported as i32,
                created: None,
                error: None,
            },
            Err(e) => proto::LookupResponse {
                outcome: Outcome::Unsupported as i32,
                created: None,
                error: Some(error_to_proto(e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn replace_reasons(
        &self,
        request: Request<proto::ReplaceReasonsRequest>,
    ) -> Result<Response<proto::ReplaceReasonsResponse>, Status> {
        let r = request.into_inner();
        let desired = json("desired", &r.desired)?;
        let actual = json("actual", &r.actual)?;
        let reasons = self.provider.replace_reasons(&r.type_name, &desired, &actual);
        Ok(Response::new(proto::ReplaceReasonsResponse { reasons }))
    }
}

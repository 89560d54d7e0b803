//! The validating admission webhook's HTTPS server: `POST /validate/workflows` and
//! `POST /validate/workflowdefinitions`, each an `AdmissionReview` answered by
//! [`crate::admission`]. TLS is rustls on ring; the certificate is swapped in place when it
//! changes (files rewritten by cert-manager, or the self-managed Secret renewed), without a
//! restart or a dropped connection.
//!
//! Every replica serves it, a leader-election standby too (validation has no side effects).

pub mod certs;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::watch;

use crate::admission::{self, Admission, Verdict};
pub use certs::{Bundle, CertError, SelfManaged};

/// The largest review read: an object and its old version, each up to the API server's
/// ~3 MiB request limit, and the envelope.
pub const MAX_BODY: usize = 8 * 1024 * 1024;
/// A review's decision is given up after this long (the API server waits 10 s by default):
/// the object is then let in, with a warning, and the reconciler judges it.
pub const DECISION_TIMEOUT: Duration = Duration::from_secs(8);
/// The self-managed certificate and `caBundle` are looked at this often besides on every
/// change of the Secret (a `helm upgrade` resets `caBundle`; the configuration is not watched).
pub const RECHECK: Duration = Duration::from_secs(30);
/// Mounted certificate files are looked at this often (the kubelet swaps them in place).
pub const FILE_POLL: Duration = Duration::from_secs(10);

/// Where the certificate comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// `tls.crt` and `tls.key` in a directory (cert-manager's Secret, mounted).
    Dir(PathBuf),
    /// Made and kept by the controller.
    SelfManaged(SelfManaged),
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the webhook: {0}")]
    Serve(#[source] std::io::Error),
}

/// The routes, with the admission decisions behind them.
pub fn router(admission: Arc<Admission>) -> Router {
    Router::new()
        .route("/validate/workflows", post(validate))
        .route("/validate/workflowdefinitions", post(validate))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(admission)
}

async fn validate(State(admission): State<Arc<Admission>>, body: Bytes) -> Response {
    let req = match admission::parse_review(&body) {
        Ok(req) => req,
        Err(e) => {
            tracing::warn!(error = %e, "an unreadable admission review");
            return (StatusCode::BAD_REQUEST, axum::Json(admission::invalid(&e))).into_response();
        }
    };
    let verdict = match tokio::time::timeout(DECISION_TIMEOUT, admission.review(&req)).await {
        Ok(v) => v,
        Err(_) => Verdict::Allowed {
            warnings: vec![format!(
                "lyra-controller could not validate this in {}s; the controller checks it when it reconciles",
                DECISION_TIMEOUT.as_secs()
            )],
        },
    };
    match &verdict {
        Verdict::Denied(m) => tracing::info!(
            kind = %req.kind.kind, name = %req.name, namespace = req.namespace.as_deref().unwrap_or(""),
            operation = ?req.operation, dry_run = req.dry_run, message = %crate::status::one_line(m),
            "admission denied"
        ),
        Verdict::Allowed { .. } => tracing::debug!(kind = %req.kind.kind, name = %req.name, "admission allowed"),
    }
    axum::Json(admission::response(&req, verdict)).into_response()
}

/// The certificate being served, swappable while serving.
#[derive(Clone)]
pub struct Tls {
    config: RustlsConfig,
    current: Arc<std::sync::Mutex<Bundle>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    pub fn new(bundle: &Bundle) -> Result<Tls, CertError> {
        Ok(Tls {
            config: RustlsConfig::from_config(bundle.server_config()?),
            current: Arc::new(std::sync::Mutex::new(bundle.clone())),
        })
    }

    /// Serves `bundle` from the next handshake on, if it differs; says whether it did.
    pub fn swap(&self, bundle: &Bundle) -> Result<bool, CertError> {
        let mut current = self.current.lock().expect("tls lock");
        if *current == *bundle {
            return Ok(false);
        }
        self.config.reload_from_config(bundle.server_config()?);
        *current = bundle.clone();
        Ok(true)
    }
}

/// Serves `router` over TLS on `listener` until `shutdown`, then lets requests in flight
/// finish (up to 5 s).
pub async fn serve(
    listener: std::net::TcpListener,
    tls: Tls,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WebhookError> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|d| *d).await;
        stopper.graceful_shutdown(Some(Duration::from_secs(5)));
    });
    // TCP_NODELAY: a review's answer is a small write after the headers; with Nagle and the
    // client's delayed ACK each one waited ~40 ms.
    let mut server = axum_server::from_tcp_rustls(listener, tls.config.clone())
        .map_err(WebhookError::Serve)?
        .map(|tls| tls.acceptor(axum_server::accept::NoDelayAcceptor::new()))
        .handle(handle);
    // A connection that sends nothing is closed, so idle clients cannot pile up.
    server
        .http_builder()
        .http1()
        .timer(hyper_util_timer())
        .header_read_timeout(Duration::from_secs(10));
    server
        .serve(router.into_make_service())
        .await
        .map_err(WebhookError::Serve)
}

fn hyper_util_timer() -> hyper_util::rt::TokioTimer {
    hyper_util::rt::TokioTimer::new()
}

/// The webhook's listener. Bound by the caller before anything runs in the background, so a
/// port in use fails the start instead of leaving a replica that never becomes ready.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, WebhookError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| WebhookError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| WebhookError::Bind { addr, source })?;
    Ok(listener)
}

/// Runs the webhook on `listener` (see [`bind`]): gets the certificate (retrying until it
/// can), serves, and keeps the certificate (and, self-managed, the `caBundle`) current until
/// `shutdown`. `ready` turns true once the certificate is served (and the `caBundle` holds
/// its CA).
pub async fn run(
    listener: std::net::TcpListener,
    source: Source,
    admission: Arc<Admission>,
    ready: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), WebhookError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving the admission webhook");
    }
    let mut down = shutdown.clone();
    let first = tokio::select! {
        b = first_bundle(&source) => b,
        _ = down.wait_for(|d| *d) => return Ok(()),
    };
    let tls = match Tls::new(&first) {
        Ok(tls) => tls,
        // first_bundle only returns bundles rustls took.
        Err(e) => unreachable!("a checked bundle was refused: {e}"),
    };
    let keeper = tokio::spawn(keep_current(
        source,
        tls.clone(),
        first,
        Arc::clone(&ready),
        shutdown.clone(),
    ));
    let served = serve(listener, tls, router(admission), shutdown).await;
    ready.store(false, Ordering::SeqCst);
    keeper.abort();
    served
}

/// The first certificate to serve, tried every few seconds until there is one (a Secret
/// not mounted yet, an API server not reachable yet).
async fn first_bundle(source: &Source) -> Bundle {
    let mut delay = Duration::from_millis(200);
    loop {
        let got = match source {
            Source::Dir(dir) => certs::read_dir(dir),
            Source::SelfManaged(m) => m.ensure().await,
        };
        match got.and_then(|b| b.server_config().map(|_| b)) {
            Ok(b) => return b,
            Err(e) => tracing::warn!(error = %e, "the webhook's certificate is not available yet"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Keeps the served certificate current, and `ready` saying whether all is in place.
async fn keep_current(
    source: Source,
    tls: Tls,
    first: Bundle,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) {
    match source {
        Source::Dir(dir) => {
            ready.store(true, Ordering::SeqCst);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(FILE_POLL) => {}
                    _ = shutdown.wait_for(|d| *d) => return,
                }
                // A half-written pair (the kubelet swaps the directory at once, others may
                // not) fails to load and is tried again at the next poll.
                match certs::read_dir(&dir).and_then(|b| tls.swap(&b)) {
                    Ok(true) => tracing::info!(dir = %dir.display(), "reloaded the webhook's certificate"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "could not reload the webhook's certificate"),
                }
            }
        }
        Source::SelfManaged(m) => {
            let mut bundle = first;
            // Any change of the Secret (our renewal, another replica's, a deletion) is a
            // reason to look again; so is the timer.
            let secrets: Api<Secret> = Api::namespaced(m.client.clone(), &m.namespace);
            let config = watcher::Config::default().fields(&format!("metadata.name={}", m.secret));
            let mut changes = watcher(secrets, config).default_backoff().boxed();
            loop {
                match m.inject_ca(&bundle.ca).await {
                    Ok(_) => ready.store(true, Ordering::SeqCst),
                    Err(e) => tracing::warn!(error = %e, "could not put the webhook's CA into its configuration"),
                }
                let wait = tokio::time::sleep(RECHECK);
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = &mut wait => break,
                        _ = shutdown.wait_for(|d| *d) => return,
                        event = changes.next() => match event {
                            Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => break,
                            Some(Ok(_)) => {}
                            Some(Err(e)) => tracing::debug!(error = %e, "watching the webhook's Secret"),
                            None => break,
                        },
                    }
                }
                match m.ensure().await.and_then(|b| tls.swap(&b).map(|swapped| (b, swapped))) {
                    Ok((b, swapped)) => {
                        if swapped {
                            tracing::info!(secret = %m.secret, "serving the webhook's new certificate");
                        }
                        bundle = b;
                    }
                    Err(e) => tracing::warn!(error = %e, "could not check the webhook's certificate"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

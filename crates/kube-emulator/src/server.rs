//! The server: one [`State`] behind a lock, shared by the HTTP handlers and watch tasks, on a
//! loopback listener, with the kubeconfig that points at it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::serve::ListenerExt as _;
use tokio::sync::watch as signal;

use crate::api;
use crate::audit::AuditRecord;
use crate::errors::ApiError;
use crate::objects::State;

/// Where and how to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// 0 picks a free port.
    pub port: u16,
    /// Where to write the kubeconfig; `None` writes it into a temporary directory that lives
    /// as long as the emulator.
    pub kubeconfig: Option<PathBuf>,
    /// How many events the log keeps for watches to replay.
    pub event_log_capacity: usize,
    /// How many requests the audit keeps ([`KubeEmulator::requests`]); the oldest go first.
    pub audit_capacity: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 0,
            kubeconfig: None,
            event_log_capacity: 100_000,
            audit_capacity: 1_000_000,
        }
    }
}

/// What the HTTP handlers and watch tasks share.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The latest resourceVersion, published after every write to wake watches.
    pub(crate) notify: signal::Sender<u64>,
    pub(crate) shutdown: signal::Sender<bool>,
    /// Open watch streams, so tests can wait until a client is listening.
    pub(crate) active_watches: AtomicUsize,
    /// Every request, by user (apart from the state's lock: recording never waits for a write).
    pub(crate) audit: crate::audit::Log,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn requests_by(&self, user: &str) -> Vec<AuditRecord> {
        self.audit.all().into_iter().filter(|r| r.user == user).collect()
    }

    /// The state; a panic in another request must not wedge the server, so poison is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a write and wakes the watches.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (result, rv) = {
            let mut state = self.lock();
            let result = f(&mut state);
            (result, state.store.current_rv())
        };
        self.notify.send_if_modified(|current| {
            let changed = *current != rv;
            *current = rv;
            changed
        });
        result
    }
}

/// A running emulator. Dropping it stops the server (use [`KubeEmulator::shutdown`] to wait).
pub struct KubeEmulator {
    addr: SocketAddr,
    url: String,
    kubeconfig: PathBuf,
    pub(crate) shared: Arc<Shared>,
    server: Option<tokio::task::JoinHandle<io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for KubeEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEmulator")
            .field("url", &self.url)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

/// A kubeconfig for a plain-HTTP server without credentials.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-emulator
  cluster:
    server: {url}
contexts:
- name: kube-emulator
  context:
    cluster: kube-emulator
    user: kube-emulator
    namespace: default
current-context: kube-emulator
users:
- name: kube-emulator
  user: {{}}
preferences: {{}}
"
    )
}

impl KubeEmulator {
    /// Starts on a free port with a kubeconfig in a temporary directory.
    pub async fn start() -> io::Result<KubeEmulator> {
        KubeEmulator::start_with(Config::default()).await
    }

    pub async fn start_with(config: Config) -> io::Result<KubeEmulator> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, config.port)).await?;
        let addr = listener.local_addr()?;
        let url = format!("http://{addr}");
        let (dir, kubeconfig) = match config.kubeconfig {
            Some(p) => (None, p),
            None => {
                let dir = tempfile::Builder::new().prefix("kube-emulator").tempdir()?;
                let p = dir.path().join("kubeconfig");
                (Some(dir), p)
            }
        };
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(config.event_log_capacity)),
            notify: signal::channel(0).0,
            shutdown: signal::channel(false).0,
            active_watches: AtomicUsize::new(0),
            audit: crate::audit::Log::new(config.audit_capacity),
        });
        let app = Router::new()
            .fallback(api::handle)
            .layer(DefaultBodyLimit::max(api::REQUEST_BODY_READ_LIMIT))
            .with_state(shared.clone());
        let mut stop = shared.shutdown.subscribe();
        // Go's net/http (and so the real apiserver) disables Nagle; without that, small watch
        // chunks meet delayed ACKs and stall for 40 ms.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
        Ok(KubeEmulator {
            addr,
            url,
            kubeconfig,
            shared,
            server: Some(server),
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The current global resourceVersion (the number of writes so far).
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().store.current_rv()
    }

    /// How many watch streams are open now.
    pub fn active_watches(&self) -> usize {
        self.shared.active_watches.load(Ordering::SeqCst)
    }

    /// Every request served so far, oldest first (see [`AuditRecord`]).
    pub fn requests(&self) -> Vec<AuditRecord> {
        self.shared.audit.all()
    }

    /// The requests of one user: a bearer token, or [`crate::ANONYMOUS_ADMIN`].
    pub fn requests_by(&self, user: &str) -> Vec<AuditRecord> {
        self.shared.requests_by(user)
    }

    /// Forgets the requests recorded so far.
    pub fn clear_requests(&self) {
        self.shared.audit.clear();
    }

    /// Stops accepting connections, ends every watch, and waits (up to 5 s) for open requests.
    /// Returns `false` when requests were still open after the wait (the caller says so: a
    /// library does not print).
    pub async fn shutdown(mut self) -> bool {
        self.shared.shutdown.send_replace(true);
        match self.server.take() {
            Some(server) => tokio::time::timeout(Duration::from_secs(5), server).await.is_ok(),
            None => true,
        }
    }
}

impl Drop for KubeEmulator {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

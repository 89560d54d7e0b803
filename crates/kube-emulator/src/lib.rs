//! A stateful Kubernetes API server emulator for tests, driven by the real `kubectl` and by
//! kube-rs. No real apiserver (kube-apiserver, k3s, kind, envtest) can run on the project's
//! machines; `shared/docs/kube-api-emulator.md` records the client contract this serves:
//! every endpoint, header and content type kubectl 1.32 and kube-rs send.
//!
//! [`KubeEmulator::start`] serves plain HTTP on 127.0.0.1 (port 0 by default) and writes a
//! kubeconfig pointing at itself; [`BlockingKubeEmulator`] does the same for synchronous
//! tests. The `kube-emulator` binary runs one for people (`--port`, `--kubeconfig`,
//! `--event-log-capacity`) until Ctrl-C or SIGTERM.
//!
//! ```no_run
//! use std::process::Command;
//!
//! use kube_emulator::BlockingKubeEmulator;
//!
//! let emu = BlockingKubeEmulator::start()?;
//! // kubectl caches discovery per host:port for hours, and a port is reused by the next
//! // emulator: give each one a cache of its own.
//! let cache = tempfile::tempdir()?;
//! let out = Command::new("kubectl")
//!     .args(["get", "namespaces", "-o", "name"])
//!     .env("KUBECONFIG", emu.kubeconfig_path())
//!     .env("KUBECACHEDIR", cache.path())
//!     .output()?;
//! assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
//! // kube-rs: `kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, ..)`, or
//! // `KubeEmulator::start().await` inside a tokio test.
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The whole cluster lives in memory behind one lock. What a write means is decided in
//! [`objects`], independent of HTTP; the HTTP side (routing, discovery, watches) parses
//! requests and renders answers. The crate depends on no lyra crate.
//!
//! # What it does
//! - Discovery (`/api`, `/apis`, group and group-version documents, `/version`) and the tiny
//!   `/openapi/v3` documents that make kubectl trust server-side validation.
//! - Built-in `v1` Namespaces (with termination), ConfigMaps, Secrets (`stringData`),
//!   ServiceAccounts (a `default` one per namespace), Events, `coordination.k8s.io/v1` Leases,
//!   and `apiextensions.k8s.io/v1` CRDs, which register their kind at once (`Established`,
//!   `NamesAccepted`) and drop its objects when deleted.
//! - `events.k8s.io/v1` Events as a second view of the core Events, as on a real apiserver:
//!   one storage in the core form, renamed fields converted on every read and write. So what
//!   kube-rs's `Recorder` writes shows in `kubectl describe` and `kubectl get events`, and
//!   writes, field selectors (each view's own names) and watches work through either view.
//! - Create/get/list/update/patch (merge, JSON with `test`, apply, strategic-as-merge)/delete
//!   with uid, generation (bumped on spec changes only), resourceVersion conflicts, the status
//!   subresource split, finalizers and `deletionTimestamp`, `dryRun=All`, label and field
//!   selectors, `limit`/`continue`, Tables from printer columns, standard `Status` errors.
//! - Watches replayed from a bounded event log (`410 Expired` beyond it), with
//!   `timeoutSeconds`, `sendInitialEvents` and selector-aware ADDED/DELETED transitions.
//! - CRD schemas: pruning (`x-kubernetes-preserve-unknown-fields` respected; `fieldValidation=
//!   Strict` turns unknown fields into 400, `Warn` into `Warning` headers), defaults, and
//!   validation with field paths in `422 Invalid` errors: `type` (with `nullable` and
//!   `x-kubernetes-int-or-string`), `required`, `enum`, bounds, `pattern`, lengths, item and
//!   property counts, `allOf`/`anyOf`/`oneOf`/`not`.
//! - Background ownerReference garbage collection when an owner is deleted.
//! - The apiserver's size limits, with its errors: request bodies over 3 MiB (413
//!   `RequestEntityTooLarge`), annotations over 256 KiB in all (422 on `metadata.annotations`,
//!   which is what stops a `kubectl apply` of a large object: its last-applied annotation),
//!   and objects over etcd's 1.5 MiB (500 `etcdserver: request is too large`, counted on the
//!   object's JSON). `events.k8s.io/v1` writes are validated as the apiserver does (required
//!   fields, length limits, an immutable note).
//!
//! # What it does not do
//! - No authentication, authorization (RBAC), TLS, admission webhooks, ValidatingAdmission
//!   policies, CEL rules (`x-kubernetes-validations`), or schema validation of built-in kinds;
//!   CRD schemas ignore `format`, `uniqueItems` and list-type uniqueness.
//! - No conversion: versions of a CRD differ only in `apiVersion` (`conversion: None`); the
//!   status subresource is on for all versions if any version declares it.
//! - Server-side apply is create-or-merge: no `managedFields`, no field ownership or conflicts,
//!   and fields missing from a later apply are not removed. Strategic merge patch is a merge
//!   patch (lists are replaced), and CRs reject it with 415 as a real apiserver does.
//! - `propagationPolicy: Foreground` is treated as Background; deleting a CRD drops its
//!   objects at once, finalizers or not.
//! - Field selectors accept any dotted path (a real apiserver allows a per-kind list);
//!   list `resourceVersion`/`resourceVersionMatch` are ignored (lists are always current),
//!   continue tokens are not snapshots, bookmarks are sent only after `sendInitialEvents`.
//! - Protobuf only for what `kubectl create namespace|configmap|secret|serviceaccount` sends
//!   (responses are JSON); no `/openapi/v2` (kubectl asks for it only as protobuf), no aggregated
//!   discovery, no scale subresource, no YAML request bodies (kubectl and kube-rs send JSON).

mod api;
mod builtins;
mod crd;
mod discovery;
mod errors;
mod events;
mod jsonpath;
mod objects;
mod protobuf;
mod registry;
mod schema;
mod selectors;
mod store;
mod table;
mod watch;

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

use objects::State;

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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 0,
            kubeconfig: None,
            event_log_capacity: 100_000,
        }
    }
}

/// What the HTTP handlers and watch tasks share.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// The latest resourceVersion, published after every write to wake watches.
    notify: signal::Sender<u64>,
    shutdown: signal::Sender<bool>,
    /// Open watch streams, so tests can wait until a client is listening.
    active_watches: AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// The state; a panic in another request must not wedge the server, so poison is ignored.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a write and wakes the watches.
    fn write<T>(&self, f: impl FnOnce(&mut State) -> Result<T, errors::ApiError>) -> Result<T, errors::ApiError> {
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
    shared: Arc<Shared>,
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
        });
        let app = Router::new()
            .fallback(api::handle)
            .layer(DefaultBodyLimit::max(api::REQUEST_BODY_LIMIT))
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

    /// Stops accepting connections, ends every watch, and waits (up to 5 s) for open requests.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(server) = self.server.take()
            && tokio::time::timeout(Duration::from_secs(5), server).await.is_err()
        {
            eprintln!("kube-emulator: requests still open after 5 s at shutdown");
        }
    }
}

impl Drop for KubeEmulator {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// A [`KubeEmulator`] on a runtime thread of its own, for synchronous tests. Dropping it
/// shuts the server down and joins the thread.
#[derive(Debug)]
pub struct BlockingKubeEmulator {
    shared: Arc<Shared>,
    url: String,
    kubeconfig: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockingKubeEmulator {
    pub fn start() -> io::Result<BlockingKubeEmulator> {
        BlockingKubeEmulator::start_with(Config::default())
    }

    pub fn start_with(config: Config) -> io::Result<BlockingKubeEmulator> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kube-emulator".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    match KubeEmulator::start_with(config).await {
                        Ok(emu) => {
                            let info = (
                                emu.shared.clone(),
                                emu.url().to_string(),
                                emu.kubeconfig_path().to_path_buf(),
                            );
                            let _ = ready_tx.send(Ok(info));
                            let _ = stop_rx.await;
                            emu.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })?;
        let (shared, url, kubeconfig) = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the emulator thread died"))??;
        Ok(BlockingKubeEmulator {
            shared,
            url,
            kubeconfig,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// How many watch streams are open now.
    pub fn active_watches(&self) -> usize {
        self.shared.active_watches.load(Ordering::SeqCst)
    }

    /// Blocks until at least `n` watches are open (a kubectl `get -w` or `wait` is listening),
    /// panicking after `timeout`.
    pub fn wait_for_watches(&self, n: usize, timeout: Duration) {
        let start = std::time::Instant::now();
        while self.active_watches() < n {
            assert!(
                start.elapsed() < timeout,
                "{n} watches were not opened within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Note: with `Config::kubeconfig == None` the file lives in a temporary directory owned
    /// by the emulator thread, removed at drop.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }
}

impl Drop for BlockingKubeEmulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

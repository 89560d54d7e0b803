//! `lyra-controller`: reconciles `Workflow` objects, and the objects of the kinds that
//! `WorkflowDefinition`s register, with the same engine and state as the `lyra` CLI. Thin: it parses arguments, wires the state, providers, kube client, health
//! and metrics server and leader election, and hands over to `lyra_k8s::controller`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::{Parser, ValueEnum};
use lyra_k8s::admission::Admission;
use lyra_k8s::controller::{self, Context, ControllerConfig};
use lyra_k8s::metrics::Metrics;
use lyra_k8s::webhook;
use lyra_k8s::{Runtime, Settings};
use lyra_providers::{ProvidersConfig, builtin};
use tokio::sync::watch;

// Many small short-lived allocations across worker threads (JSON, YAML, requests): glibc's
// malloc spent a fifth of the controller's CPU on them in a backlog (ARCHITECTURE.md).
#[global_allocator]
static ALLOCATOR: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;

/// Reconciles Lyra `Workflow` objects: applies each one's workflow to the deployment
/// `k8s/<namespace>/<name>` in the shared state, and tears it down when the object is deleted.
/// Serves `WorkflowDefinition`s too: each registers a package as a kind of its own, whose
/// objects are applied the same way (`k8s/<namespace>/<plural>.<group>/<name>`).
#[derive(Debug, Parser)]
#[command(name = "lyra-controller", version, max_term_width = 100)]
#[command(group(clap::ArgGroup::new("webhook_tls").args(["webhook_cert_dir", "webhook_secret"]).multiple(false)))]
struct Args {
    /// Where state is kept: a SQLite file or postgres://USER@HOST/DB (optionally
    /// ?schema=NAME), shared with the `lyra` CLI.
    #[arg(
        long,
        env = "LYRA_STATE",
        hide_env_values = true,
        default_value = ".lyra/state.db",
        value_name = "URL"
    )]
    state: String,
    /// The load path: `workflowName: a::b` is DIR/a/b.yaml.
    #[arg(long, env = "LYRA_WORKFLOWS", default_value = "workflows", value_name = "DIR")]
    workflows: PathBuf,
    /// Where the Foobernetes provider keeps its imaginary cloud.
    #[arg(
        long,
        env = "LYRA_FOOBERNETES_FILE",
        default_value = "deployment.json",
        value_name = "FILE"
    )]
    foobernetes_file: PathBuf,
    /// The only directory `File::File` may write in: every path resolves inside it, and none
    /// may leave it (absolute paths, `..`, links out are refused), so a Workflow object
    /// cannot write the controller's own files.
    #[arg(long, env = "LYRA_FILES_ROOT", default_value = "files", value_name = "DIR")]
    files_root: PathBuf,
    /// Where provider plugins are found, besides the `plugins` directory next to --workflows;
    /// repeatable, or `:`-separated. Lyra plugins are `lyra-provider-<name>` executables,
    /// Terraform providers `terraform-provider-<name>[_v<version>]` (types `Tf<Name>::<Type>`).
    /// Each is started once and serves every run; one that cannot start is logged and left out.
    #[arg(
        long = "plugins",
        env = "LYRA_PLUGIN_PATH",
        value_delimiter = ':',
        value_name = "DIR"
    )]
    plugins: Vec<PathBuf>,
    /// Let `Exec::Command` run commands. Off by default: whoever can create a Workflow object
    /// would run any command as the controller.
    #[arg(long, env = "LYRA_ALLOW_EXEC")]
    allow_exec: bool,
    /// Let a workflow's `Kubernetes::Object` steps reach other namespaces and cluster-scoped
    /// kinds with the controller's own access. Off by default: a Workflow object's objects stay
    /// in its namespace unless the workflow brings its own credentials (an inline kubeconfig).
    #[arg(long, env = "LYRA_KUBERNETES_ANY_NAMESPACE")]
    kubernetes_any_namespace: bool,
    /// Watch only this namespace; repeatable. Default: every namespace.
    #[arg(long = "namespace", short = 'n', value_name = "NS")]
    namespaces: Vec<String>,
    /// Workflow objects reconciled at once (per watched namespace).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Resource operations at once within one run.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    step_concurrency: u32,
    /// How long a deployment's state lease outlives a crashed controller.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
    /// Where to serve /healthz, /readyz and /metrics (port 0: any free port, logged).
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    health_addr: SocketAddr,
    /// Run only while holding a coordination.k8s.io Lease, so that of several replicas
    /// exactly one reconciles.
    #[arg(long)]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "lyra-controller", value_name = "NAME")]
    leader_elect_lease: String,
    /// The controller's own namespace: the leader Lease's, and the webhook Secret's.
    /// Default: the namespace of the kube client's context.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    leader_elect_namespace: Option<String>,
    /// This replica's identity in the Lease and in events. Default: hostname and process id.
    #[arg(long, env = "POD_NAME", value_name = "ID")]
    identity: Option<String>,
    /// Reach this registry (`HOST[:PORT]`) over plain HTTP; repeatable. Loopback registries
    /// always are. Also `LYRA_INSECURE_REGISTRIES` (comma-separated).
    #[arg(long = "insecure-registry", value_name = "HOST")]
    insecure_registries: Vec<String>,
    /// Serve `WorkflowDefinition`s: register packages as kinds of their own. Needs the
    /// WorkflowDefinition CRD (`lyra crd`) and permission to manage CRDs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    definitions: bool,
    /// Serve the validating admission webhook over HTTPS here (`POST /validate/workflows`,
    /// `/validate/workflowdefinitions`), on every replica. Needs --webhook-cert-dir or
    /// --webhook-secret. /readyz waits for its certificate.
    #[arg(long, value_name = "ADDR", requires = "webhook_tls")]
    webhook_addr: Option<SocketAddr>,
    /// The webhook's certificate from files: DIR/tls.crt and DIR/tls.key (cert-manager's
    /// Secret, mounted), reloaded when they change.
    #[arg(long, value_name = "DIR", requires = "webhook_addr")]
    webhook_cert_dir: Option<PathBuf>,
    /// Self-managed certificate: keep a CA and serving certificate in this Secret (in the
    /// controller's namespace; made if absent, renewed 30 days before expiry) and put the
    /// CA into --webhook-configuration.
    #[arg(
        long,
        value_name = "NAME",
        requires_all = ["webhook_addr", "webhook_service", "webhook_configuration"]
    )]
    webhook_secret: Option<String>,
    /// The Service the API server reaches the webhook through (the certificate's names:
    /// NAME.NAMESPACE.svc...). With --webhook-secret.
    #[arg(long, value_name = "NAME", requires = "webhook_secret")]
    webhook_service: Option<String>,
    /// The ValidatingWebhookConfiguration whose webhooks' caBundle gets the CA. With
    /// --webhook-secret.
    #[arg(long, value_name = "NAME", requires = "webhook_secret")]
    webhook_configuration: Option<String>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "lyra-controller failed");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,kube_lease_manager=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // oci-client's reqwest needs a process-wide rustls provider; ring is kube's. An error
    // only says one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (shutdown_tx, shutdown) = watch::channel(false);
    tokio::spawn(signals(shutdown_tx));

    let store = lyra_state::open(&args.state)
        .await
        .with_context(|| format!("opening the state {}", lyra_state::redact_url(&args.state)))?;
    let mut providers = builtin(&ProvidersConfig {
        foobernetes_file: args.foobernetes_file.clone(),
        files_root: Some(args.files_root.clone()),
        allow_exec: args.allow_exec,
        kubernetes_owner_labels: Some(lyra_k8s::reconcile::owner_labels),
        kubernetes_tenancy: (!args.kubernetes_any_namespace).then_some(lyra_k8s::reconcile::owner_namespace as _),
    });
    let plugin_path = lyra_providers::plugins::plugin_path(&args.plugins, Some(&args.workflows));
    let mut warnings = lyra_providers::plugins::load_plugins(&mut providers, &plugin_path).await;
    warnings.extend(lyra_providers::terraform::load_terraform_providers(&mut providers, &plugin_path).await);
    for w in warnings {
        tracing::warn!("{w}");
    }
    let providers = Arc::new(providers);
    let metrics = Arc::new(Metrics::new());
    let mut settings = Settings::new(&args.workflows);
    settings.concurrency = args.step_concurrency as usize;
    settings.lease_ttl = args.lease_ttl;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    settings.instance = Some(identity.clone());
    let runtime = Arc::new(Runtime::new(providers, store, settings, Arc::clone(&metrics)));
    let mut registry = lyra_package::RegistryOptions::from_env();
    registry.insecure.extend(args.insecure_registries.iter().cloned());
    // One cache of pulled packages for the webhook and the registrar: each is pulled once.
    let packages = Arc::new(lyra_k8s::registrar::Packages::new(registry));

    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    let config = ControllerConfig {
        namespaces: args.namespaces.clone(),
        concurrency: args.concurrency,
    };
    controller::check_crd(&client, &config)
        .await
        .map_err(anyhow::Error::msg)?;

    let ready = Arc::new(AtomicBool::new(false));
    // Without a webhook there is nothing to wait for.
    let webhook_ready = Arc::new(AtomicBool::new(args.webhook_addr.is_none()));
    let listener = tokio::net::TcpListener::bind(args.health_addr)
        .await
        .with_context(|| format!("binding {}", args.health_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    let server = tokio::spawn(serve(
        listener,
        Arc::clone(&metrics),
        Readiness {
            controller: Arc::clone(&ready),
            webhook: Arc::clone(&webhook_ready),
        },
        shutdown.clone(),
    ));
    // Before leader election: a standby validates too.
    let webhook = match args.webhook_addr {
        Some(addr) => Some(start_webhook(
            addr,
            &args,
            &client,
            &runtime,
            Arc::clone(&packages),
            Arc::clone(&webhook_ready),
            shutdown.clone(),
        )?),
        None => None,
    };

    let ctx = Arc::new(Context::new(client.clone(), runtime, Some(identity.clone())));

    // `stop` ends the controller: on a signal, or when leadership is lost.
    let (stop_tx, stop) = watch::channel(false);
    let lost_leadership = Arc::new(AtomicBool::new(false));
    let mut election = None;
    if args.leader_elect {
        let namespace = args
            .leader_elect_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.leader_elect_lease)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(15)
            .with_grace(5)
            .with_field_manager(format!("{}-{identity}", controller::MANAGER))
            .build()
            .await
            .context("setting up leader election")?;
        let (mut leader, task) = manager.watch().await;
        tracing::info!(lease = %args.leader_elect_lease, %namespace, %identity, "waiting to be elected leader");
        ready.store(true, Ordering::SeqCst);
        let mut down = shutdown.clone();
        let elected = tokio::select! {
            r = leader.wait_for(|is_leader| *is_leader) => { r.context("leader election stopped")?; true }
            _ = down.wait_for(|d| *d) => false,
        };
        if !elected {
            drop(leader);
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
            stop_webhook(webhook).await;
            server.abort();
            return Ok(ExitCode::SUCCESS);
        }
        tracing::info!(%identity, "elected leader; starting");
        let lost = Arc::clone(&lost_leadership);
        let mut down = shutdown.clone();
        let mut watch_leader = leader.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = down.wait_for(|d| *d) => {}
                _ = watch_leader.wait_for(|is_leader| !*is_leader) => {
                    tracing::error!("lost the leader lease; stopping");
                    lost.store(true, Ordering::SeqCst);
                }
            }
            stop_tx.send_replace(true);
        });
        election = Some((leader, task));
    } else {
        let mut down = shutdown.clone();
        tokio::spawn(async move {
            let _ = down.wait_for(|d| *d).await;
            stop_tx.send_replace(true);
        });
    }

    ready.store(true, Ordering::SeqCst);
    tracing::info!(
        namespaces = ?args.namespaces,
        workflows = %args.workflows.display(),
        state = %lyra_state::redact_url(&args.state),
        "controller running"
    );
    let registrar = args.definitions.then(|| {
        let registrar = Arc::new(lyra_k8s::registrar::Registrar::new(
            Arc::clone(&ctx),
            packages,
            config.clone(),
            stop.clone(),
        ));
        tokio::spawn(registrar.run())
    });
    controller::run(Arc::clone(&ctx), config, stop).await;
    if let Some(registrar) = registrar {
        // It stops on the same signal; its kinds' runs finish like the Workflows' do.
        let _ = registrar.await;
    }
    // The runs' last events, published in the background, are not lost.
    ctx.events.flush().await;
    tracing::info!("controller stopped; runs in progress have finished and released their leases");

    if let Some((leader, task)) = election {
        // Closing the channel makes the manager release the Lease, so a standby takes over
        // at once instead of after the lease duration.
        drop(leader);
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    stop_webhook(webhook).await;
    server.abort();
    Ok(if lost_leadership.load(Ordering::SeqCst) {
        // Fail-stop: a controller that lost its lease must not keep going.
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Starts the admission webhook (its certificate from --webhook-cert-dir or self-managed);
/// it stops on `shutdown`.
fn start_webhook(
    addr: SocketAddr,
    args: &Args,
    client: &kube::Client,
    runtime: &Arc<Runtime>,
    packages: Arc<lyra_k8s::registrar::Packages>,
    ready: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let source = match (&args.webhook_cert_dir, &args.webhook_secret) {
        (Some(dir), _) => webhook::Source::Dir(dir.clone()),
        (None, Some(secret)) => webhook::Source::SelfManaged(webhook::SelfManaged {
            client: client.clone(),
            namespace: args
                .leader_elect_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned()),
            secret: secret.clone(),
            // clap requires both with --webhook-secret.
            service: args.webhook_service.clone().unwrap_or_default(),
            configuration: args.webhook_configuration.clone().unwrap_or_default(),
        }),
        (None, None) => anyhow::bail!("--webhook-addr needs --webhook-cert-dir or --webhook-secret"),
    };
    let mut admission = Admission::new(Arc::clone(runtime));
    if args.definitions {
        admission = admission.with_definitions(client.clone(), packages);
    }
    let admission = Arc::new(admission);
    let listener = webhook::bind(addr)?;
    Ok(tokio::spawn(async move {
        if let Err(e) = webhook::run(listener, source, admission, ready, shutdown).await {
            // Readiness stays false: the pod is taken out of the Service, and says why.
            tracing::error!(error = %e, "the admission webhook stopped");
        }
    }))
}

/// Waits (briefly) for the webhook to finish the requests in flight.
async fn stop_webhook(webhook: Option<tokio::task::JoinHandle<()>>) {
    if let Some(task) = webhook
        && tokio::time::timeout(Duration::from_secs(6), task).await.is_err()
    {
        tracing::warn!("the webhook did not stop in time");
    }
}

/// What /readyz reports: ready once the controller runs (or stands by) and the webhook, if
/// any, serves its certificate.
#[derive(Clone)]
struct Readiness {
    controller: Arc<AtomicBool>,
    webhook: Arc<AtomicBool>,
}

impl Readiness {
    fn ready(&self) -> bool {
        self.controller.load(Ordering::SeqCst) && self.webhook.load(Ordering::SeqCst)
    }
}

/// The first SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
async fn signals(tx: watch::Sender<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot listen for signals");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("shutting down: no new runs; runs in progress stop after their running steps");
    tx.send_replace(true);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal: exiting now");
    std::process::exit(130);
}

async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Readiness,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State((_, ready)): State<(Arc<Metrics>, Readiness)>| async move {
                if ready.ready() {
                    (StatusCode::OK, "ok\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State((metrics, _)): State<(Arc<Metrics>, Readiness)>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
                    .into_response()
            }),
        )
        .with_state((metrics, ready));
    let stopped = async move {
        let _ = shutdown.wait_for(|d| *d).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
        tracing::warn!(error = %e, "health server failed");
    }
}

fn default_identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["lyra-controller"].iter().chain(extra))
    }

    #[test]
    fn the_webhook_takes_exactly_one_certificate_source() {
        // As the chart passes them, in each mode.
        let managed = parse(&[
            "--webhook-addr=0.0.0.0:9443",
            "--webhook-secret=lyra-webhook-tls",
            "--webhook-service=lyra-webhook",
            "--webhook-configuration=lyra",
        ])
        .unwrap();
        assert_eq!(managed.webhook_secret.as_deref(), Some("lyra-webhook-tls"));
        let files = parse(&[
            "--webhook-addr=0.0.0.0:9443",
            "--webhook-cert-dir=/etc/lyra/webhook-tls",
        ])
        .unwrap();
        assert!(files.webhook_cert_dir.is_some());
        assert!(parse(&[]).unwrap().webhook_addr.is_none());

        for wrong in [
            &["--webhook-addr=0.0.0.0:9443"][..],
            &[
                "--webhook-addr=0.0.0.0:9443",
                "--webhook-cert-dir=/d",
                "--webhook-secret=s",
                "--webhook-service=x",
                "--webhook-configuration=c",
            ],
            &["--webhook-addr=0.0.0.0:9443", "--webhook-secret=s"],
            &[
                "--webhook-addr=0.0.0.0:9443",
                "--webhook-secret=s",
                "--webhook-service=x",
            ],
            &["--webhook-cert-dir=/d"],
            &[
                "--webhook-addr=0.0.0.0:9443",
                "--webhook-cert-dir=/d",
                "--webhook-service=x",
            ],
        ] {
            assert!(parse(wrong).is_err(), "{wrong:?} was taken");
        }
    }
}

//! The providers that ship with Lyra.
//!
//! - [`foobernetes`]: the original Lyra's imaginary cloud, kept in a JSON file whose format is
//!   byte-compatible with the original's `deployment.json`.
//! - [`http`]: `Http::Resource`, an object of a JSON REST API (like Mastercard/restapi's
//!   `restapi_object`).
//! - [`null`]: `Null::Resource`, a resource that exists only in the engine's state (like
//!   Terraform's `terraform_data`); cheap enough for large benchmarks.
//! - [`kubernetes`]: `Kubernetes::Object`, any Kubernetes object applied server-side from a
//!   manifest (like Terraform's `kubernetes_manifest`).
//! - [`postgres`]: `Postgres::Role`, `Postgres::Database` and `Postgres::Grant` (like the
//!   cyrilgdn/postgresql Terraform provider's).
//! - [`time`]: `Time::Sleep`, which waits on create and delete (like Terraform's `time_sleep`).
//! - [`file`]: `File::File`, a file on the local disk (like Terraform's `local_file`).
//! - [`exec`]: `Exec::Command`, shell commands that create, read, update and delete something
//!   (like the shell provider).
//! - [`random`]: `Random::Password` and `Random::Id`, random values made once and kept in the
//!   state (like Terraform's `random_password` and `random_id`).
//! - [`tls`]: `Tls::PrivateKey`, `Tls::SelfSignedCert`, `Tls::CertRequest` and
//!   `Tls::LocallySignedCert` (like Terraform's tls provider).
//!
//! [`builtin`] registers all of them.

use std::path::PathBuf;

use lyra_core::provider::{OpContext, ProviderError, Providers};

pub mod exec;
pub mod file;
pub mod foobernetes;
pub mod http;
pub mod kubernetes;
pub mod null;
pub mod plugins;
pub mod postgres;
pub mod random;
pub mod terraform;
pub mod time;
pub mod tls;

pub use exec::ExecProvider;
pub use file::FileProvider;
pub use foobernetes::FoobernetesProvider;
pub use http::HttpProvider;
pub use kubernetes::KubernetesProvider;
pub use null::NullProvider;
pub use postgres::PostgresProvider;
pub use random::RandomProvider;
pub use time::TimeProvider;
pub use tls::TlsProvider;

/// The labels that point from an object back to the deployment that made it.
pub type OwnerLabels = fn(&str) -> Vec<(String, String)>;

/// The namespace a deployment may manage Kubernetes objects in, if it is confined to one.
pub type TenantOf = fn(&str) -> Option<String>;

/// Settings of the built-in providers: what the program running them (the CLI, the
/// controller) decides, as opposed to what a workflow's `providers:` block says.
#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    /// Where the Foobernetes fake cloud lives; relative paths resolve against the working
    /// directory at the time of each operation, as in the original.
    pub foobernetes_file: PathBuf,
    /// `None` (the CLI): `File::File` paths are the user's, relative ones resolved against the
    /// working directory. `Some(dir)` (the controller): every path resolves inside `dir` and
    /// none may leave it (`..`, absolute paths, links out), since whoever can create a
    /// Workflow object could otherwise write any file the controller can.
    pub files_root: Option<PathBuf>,
    /// Whether `Exec::Command` may run commands. The controller refuses them unless told
    /// (`--allow-exec`): a Workflow object would otherwise run any command as the controller.
    pub allow_exec: bool,
    /// Labels `Kubernetes::Object` adds to every object it applies, from the deployment's
    /// name: the controller's point back to the object whose workflow made them.
    pub kubernetes_owner_labels: Option<OwnerLabels>,
    /// The controller's confinement of `Kubernetes::Object`: a Workflow's objects stay in its
    /// namespace (no other namespace, no cluster-scoped kind) when it uses the controller's own
    /// credentials. `None` (the CLI, `--kubernetes-any-namespace`): no confinement.
    pub kubernetes_tenancy: Option<TenantOf>,
}

impl Default for ProvidersConfig {
    fn default() -> Self {
        ProvidersConfig {
            foobernetes_file: PathBuf::from("deployment.json"),
            files_root: None,
            allow_exec: true,
            kubernetes_owner_labels: None,
            kubernetes_tenancy: None,
        }
    }
}

/// The engine's timer on tokio (`lyra_core::engine::Timer`), for the binaries and tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

impl lyra_core::engine::Timer for TokioTimer {
    fn sleep(&self, d: std::time::Duration) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// Runs `op` until it finishes or the run is cancelled ([`OpContext::cancel`], polled every
/// 50 ms), whichever comes first; a cancelled `op` is dropped (a child process spawned with
/// `kill_on_drop`, a request in flight, a wait) and the result is
/// [`ProviderError::Cancelled`]. For operations that may take long; short ones need not.
pub async fn cancellable<T>(
    cx: &OpContext<'_>,
    op: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let watch = lyra_plugin::until_cancelled(cx);
    tokio::select! {
        r = op => r,
        () = watch => Err(ProviderError::Cancelled),
    }
}

/// All built-in providers, configured by `config`.
pub fn builtin(config: &ProvidersConfig) -> Providers {
    Providers::new()
        .with(FoobernetesProvider::new(config.foobernetes_file.clone()))
        .with(HttpProvider::new())
        .with(NullProvider::new())
        .with(PostgresProvider::new())
        .with(TimeProvider::new())
        .with(FileProvider::new(config.files_root.clone()))
        .with(ExecProvider::new(config.allow_exec))
        .with(RandomProvider::new())
        .with(TlsProvider::new())
        .with(KubernetesProvider::new(config.kubernetes_owner_labels).confined(config.kubernetes_tenancy))
}

/// A value the provider cannot take, for attribute `attribute`.
pub(crate) fn invalid(attribute: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::InvalidValue {
        attribute: attribute.to_owned(),
        message: message.into(),
    }
}

/// The string in `attribute`, if set (null is unset); another kind of value is invalid.
pub(crate) fn opt_str<'a>(m: &'a lyra_core::value::Map, attribute: &str) -> Result<Option<&'a str>, ProviderError> {
    match m.get(attribute) {
        None | Some(lyra_core::value::Value::Null) => Ok(None),
        Some(lyra_core::value::Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(
            attribute,
            format!("expects a string, got {}", lyra_core::types::kind_of(other)),
        )),
    }
}

/// `prefix-` followed by 16 random hex digits: external ids of resources that live nowhere
/// but in the engine's state.
fn random_hex_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// Helpers shared by the providers' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lyra_core::provider::OpContext;
    use lyra_core::value::{Map, Value};

    /// A context with a step id of its own: providers that track idempotency keys would
    /// otherwise take every create of a test for a retry of the first.
    pub(crate) fn cx(type_name: &'static str) -> OpContext<'static> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Leaked so the context can be `'static`; a few bytes per call, in tests only.
        cx_at(type_name, String::leak(format!("step/{n}")))
    }

    /// A context for step `step_id` of deployment `test`, whose key is `test/<step_id>`.
    pub(crate) fn cx_at(type_name: &'static str, step_id: &'static str) -> OpContext<'static> {
        OpContext {
            deployment: "test",
            step_id,
            type_name,
            idempotency_key: Some(String::leak(format!("test/{step_id}"))),
            config: Box::leak(Box::new(Map::new())),
            cancel: Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false))),
        }
    }

    pub(crate) fn map(v: Value) -> Map {
        match v {
            Value::Object(m) => m,
            other => panic!("not a map: {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_registers_every_type_case_insensitively() {
        let providers = builtin(&ProvidersConfig::default());
        assert_eq!(
            providers.schemas().names(),
            [
                "Exec::Command",
                "File::File",
                "Foobernetes::Instance",
                "Foobernetes::LoadBalancer",
                "Foobernetes::WebServer",
                "Http::Resource",
                "Kubernetes::Object",
                "Null::Resource",
                "Postgres::Database",
                "Postgres::Grant",
                "Postgres::Role",
                "Random::Id",
                "Random::Password",
                "Time::Sleep",
                "Tls::CertRequest",
                "Tls::LocallySignedCert",
                "Tls::PrivateKey",
                "Tls::SelfSignedCert",
            ]
        );
        for name in [
            "Foobernetes::Webserver",
            "Foobernetes::Loadbalancer",
            "null::resource",
            "time::sleep",
            "file::file",
            "exec::command",
            "random::password",
            "tls::locallysignedcert",
            "kubernetes::object",
            "postgres::role",
            "POSTGRES::DATABASE",
            "postgres::grant",
            "http::resource",
        ] {
            assert!(providers.get(name).is_some(), "{name}");
        }
    }

    /// The attribute tables of `docs/language.md`, rendered from the schemas.
    fn types_reference(providers: &Providers) -> String {
        let mut out = String::new();
        let mark = |on: bool| if on { "yes" } else { "" };
        for name in providers.schemas().names() {
            let schema = providers.schemas().get(name).expect("a listed type");
            out.push_str(&format!(
                "### `{name}`\n\n| attribute | type | required | provided | computed | immutable | sensitive |\n| --- | --- | --- | --- | --- | --- | --- |\n"
            ));
            for a in &schema.attributes {
                let cells = [
                    format!("`{}`", a.name),
                    format!("`{}`", a.ty),
                    mark(a.required).to_owned(),
                    mark(a.provided).to_owned(),
                    mark(a.computed).to_owned(),
                    mark(a.immutable).to_owned(),
                    mark(a.sensitive || a.ty.is_sensitive()).to_owned(),
                ];
                let cells: Vec<String> = cells
                    .iter()
                    .map(|c| if c.is_empty() { " ".to_owned() } else { format!(" {c} ") })
                    .collect();
                out.push_str(&format!("|{}|\n", cells.join("|")));
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn the_language_reference_lists_the_builtin_types_as_they_are() {
        const BEGIN: &str = "<!-- builtin-types:begin -->\n";
        const END: &str = "<!-- builtin-types:end -->";
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/language.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let start = doc
            .find(BEGIN)
            .expect("docs/language.md marks the built-in types table")
            + BEGIN.len();
        let end = start + doc[start..].find(END).expect("the built-in types table ends");
        let current = format!("\n{}", types_reference(&builtin(&ProvidersConfig::default())));
        assert!(
            doc[start..end] == current,
            "the built-in types in docs/language.md are stale; put this between the builtin-types \
             markers:\n{current}"
        );
    }

    #[test]
    fn random_hex_ids_are_prefixed_and_distinct() {
        let a = random_hex_id("null");
        assert!(a.starts_with("null-") && a.len() == "null-".len() + 16, "{a}");
        assert_ne!(a, random_hex_id("null"));
    }
}

//! The provider's configuration (`providers: {Kubernetes: {...}}`) and the clients built from
//! it, one per distinct configuration.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use lyra_core::provider::ProviderError;
use lyra_core::types::kind_of;
use lyra_core::value::{Map, Value};
use sha2::{Digest, Sha256};

pub(super) const CONFIG_PATH: &str = "config_path";
pub(super) const CONFIG_CONTEXT: &str = "config_context";
pub(super) const KUBECONFIG: &str = "kubeconfig";
pub(super) const NAMESPACE: &str = "namespace";

/// The namespace of namespaced objects whose manifest names none, unless configured.
const DEFAULT_NAMESPACE: &str = "default";

/// What a workflow's `providers: {Kubernetes: ...}` entry says.
#[derive(Clone, Default)]
pub(super) struct Settings {
    config_path: Option<String>,
    config_context: Option<String>,
    /// An inline kubeconfig: a secret (it holds tokens or keys), never printed.
    kubeconfig: Option<String>,
    pub(super) namespace: String,
    /// Whether `namespace` was given (rather than the default).
    namespace_given: bool,
    /// The only namespace objects may be in, when the program confines this deployment to
    /// one (see [`Settings::confine`]).
    pub(super) confined: Option<String>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("config_path", &self.config_path)
            .field("config_context", &self.config_context)
            .field("kubeconfig", &self.kubeconfig.as_ref().map(|_| "(sensitive)"))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Settings {
    pub(super) fn from_config(config: &Map) -> Result<Settings, ProviderError> {
        let text = |name: &str| -> Result<Option<String>, ProviderError> {
            match config.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(ProviderError::Config(format!(
                    "Kubernetes {name} must be a string, got {}",
                    kind_of(other)
                ))),
            }
        };
        let settings = Settings {
            config_path: text(CONFIG_PATH)?,
            config_context: text(CONFIG_CONTEXT)?,
            kubeconfig: text(KUBECONFIG)?,
            namespace: text(NAMESPACE)?.unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            namespace_given: text(NAMESPACE)?.is_some(),
            confined: None,
        };
        if settings.config_path.is_some() && settings.kubeconfig.is_some() {
            return Err(ProviderError::Config(
                "Kubernetes takes config_path or kubeconfig, not both".to_owned(),
            ));
        }
        Ok(settings)
    }

    /// Confines the deployment to namespace `tenant` unless it brings its own credentials (an
    /// inline `kubeconfig`, from a Secret): the program's (the controller's, or a file of its,
    /// `config_path`) may reach every namespace, while whoever wrote the Workflow object may own
    /// only theirs. Objects then default to `tenant`, and another `namespace` is refused.
    pub(super) fn confine(&mut self, tenant: &str) -> Result<(), ProviderError> {
        if self.kubeconfig.is_some() {
            return Ok(());
        }
        if self.namespace_given && self.namespace != tenant {
            return Err(ProviderError::Config(format!(
                "namespace '{}': a workflow of namespace '{tenant}' manages objects in '{tenant}' only \
                 with the controller's access (bring your own: kubeconfig, from a Secret)",
                self.namespace
            )));
        }
        tenant.clone_into(&mut self.namespace);
        self.confined = Some(tenant.to_owned());
        Ok(())
    }

    /// A digest of what selects the cluster and credentials: the cache's key, which holds
    /// no secret itself.
    fn key(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [&self.config_path, &self.config_context, &self.kubeconfig] {
            match part {
                // Length-prefixed, so that no two configurations run together into one input.
                Some(s) => {
                    h.update([1]);
                    h.update((s.len() as u64).to_le_bytes());
                    h.update(s.as_bytes());
                }
                None => h.update([0]),
            }
        }
        h.finalize().into()
    }

    /// The client configuration: the inline kubeconfig, else the file `config_path`, else
    /// `$KUBECONFIG` or `~/.kube/config`, else the in-cluster service account (as
    /// `kube::Config::infer`, but with errors that quote nothing of a kubeconfig).
    async fn client_config(&self) -> Result<kube::Config, ProviderError> {
        let options = KubeConfigOptions {
            context: self.config_context.clone(),
            ..KubeConfigOptions::default()
        };
        if let Some(yaml) = &self.kubeconfig {
            let kc = Kubeconfig::from_yaml(yaml)
                .map_err(|e| ProviderError::Config(format!("the inline kubeconfig: {}", describe(&e))))?;
            return kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| ProviderError::Config(format!("the inline kubeconfig: {}", describe(&e))));
        }
        if let Some(path) = &self.config_path {
            let path = expand_home(path);
            let kc = Kubeconfig::read_from(&path)
                .map_err(|e| ProviderError::Config(format!("kubeconfig {path}: {}", describe(&e))))?;
            return kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| ProviderError::Config(format!("kubeconfig {path}: {}", describe(&e))));
        }
        match kube::Config::from_kubeconfig(&options).await {
            Ok(c) => Ok(c),
            // A context was asked for: only a kubeconfig has contexts.
            Err(e) if self.config_context.is_some() => Err(ProviderError::Config(format!(
                "the default kubeconfig: {}",
                describe(&e)
            ))),
            Err(kubeconfig) => kube::Config::incluster().map_err(|in_cluster| {
                ProviderError::Config(format!(
                    "no Kubernetes configuration: set config_path or kubeconfig, or $KUBECONFIG \
                     (the default kubeconfig: {}; in-cluster: {in_cluster})",
                    describe(&kubeconfig)
                ))
            }),
        }
    }
}

/// A kubeconfig error without what a parser quotes of the document (which may hold tokens).
fn describe(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => "not a valid kubeconfig YAML document".to_owned(),
        other => other.to_string(),
    }
}

/// `~/x` as the home directory's `x`, as shells (and kubectl's `--kubeconfig`) take it.
fn expand_home(path: &str) -> String {
    match (path.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => path.to_owned(),
    }
}

/// One client per distinct configuration, made on first use: each holds a connection pool
/// (and, for exec or OIDC credentials, a token cache) worth keeping between operations.
#[derive(Default)]
pub(super) struct Clients {
    by_key: Mutex<HashMap<[u8; 32], Client>>,
}

impl Clients {
    pub(super) async fn get(&self, settings: &Settings) -> Result<Client, ProviderError> {
        let key = settings.key();
        if let Some(c) = self.lock().get(&key) {
            return Ok(c.clone());
        }
        // Built outside the lock, which is never held across an await: two operations racing
        // here build two clients and the second insert wins; both work.
        let config = settings.client_config().await?;
        let client = Client::try_from(config)
            .map_err(|e| ProviderError::Config(format!("cannot build a Kubernetes client: {e}")))?;
        self.lock().insert(key, client.clone());
        Ok(client)
    }

    /// How many clients are cached.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Client>> {
        // A panic while holding it cannot leave the map half-written: poison is ignored.
        self.by_key.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

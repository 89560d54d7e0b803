//! The `Provider` trait: how the engine reaches the world to create, read, update and delete
//! resources. Implementations live outside the core (`lyra-providers`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use crate::schema::{ResourceSchema, SchemaRegistry, TypeIndex};
use crate::value::Map;

/// Who is asking, for a provider operation.
#[derive(Debug, Clone)]
pub struct OpContext<'a> {
    /// The deployment the resource belongs to.
    pub deployment: &'a str,
    /// The resource's stable step id within the deployment (e.g. `appServers/1`).
    pub step_id: &'a str,
    /// The canonical resource type name from the schema, e.g. `Foobernetes::Instance`.
    pub type_name: &'a str,
    /// For `create` and `lookup`: the same for every attempt to create this one resource, and
    /// for nothing else (see [`idempotency_key`]). Providers that can, use it to return an
    /// already-made resource instead of making a second one. `None` for other operations.
    pub idempotency_key: Option<&'a str>,
    /// The configuration of the resource's provider: the main workflow's `providers:` entry
    /// for the type's namespace (`Postgres: {url: $dbUrl}`) as the run resolved it, or, for a
    /// recorded resource deleted without its workflow, as it was when the resource was
    /// recorded. Empty when there is none. Secret values in it are the run's secrets.
    pub config: &'a Map,
    /// Set when the run is cancelled (Ctrl-C, SIGTERM, a lost lease). Operations that can take
    /// long (commands, waits, slow requests) stop early and return
    /// [`ProviderError::Cancelled`]; short ones may finish, and are recorded.
    pub cancel: &'a AtomicBool,
}

impl OpContext<'_> {
    /// Whether the run was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }
}

/// The idempotency key of a create the engine asks for in run `run` of store `store_id`:
/// `<store id>/<run id>/<deployment>/<step id>`.
///
/// The engine records it with the pending intent before calling `create`, and asks `lookup`
/// with it only for that pending record. So a key never outlives its record: a resource that
/// was forgotten (`lyra state rm`, `deletionPolicy: Orphan`) is never adopted by a later
/// create, which gets a new run's key, and two stores (distinct random ids) never share one,
/// even for the same deployment name. Run ids are never reused within a store.
pub fn idempotency_key(store_id: &str, run: i64, deployment: &str, step_id: &str) -> String {
    format!("{store_id}/{run}/{deployment}/{step_id}")
}

/// The key Lyra used before keys were scoped to stores and records: for pending records
/// written by those versions, which carry no key of their own.
pub fn legacy_idempotency_key(deployment: &str, step_id: &str) -> String {
    format!("{deployment}/{step_id}")
}

/// What `create` returns.
#[derive(Debug, Clone)]
pub struct Created {
    pub external_id: String,
    /// The actual state, including provided attributes.
    pub actual: Map,
}

/// What [`Provider::lookup`] found for an idempotency key.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A resource was made for this key: here it is.
    Found(Created),
    /// Nothing was made for this key.
    Absent,
    /// The provider does not track idempotency keys: it cannot tell.
    Unsupported,
}

/// A provider failure.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The resource does not exist (any more). On `read` prefer returning `Ok(None)`.
    #[error("{type_name} {external_id} not found")]
    NotFound { type_name: String, external_id: String },
    /// The desired state is not acceptable to the provider (a bad value).
    #[error("invalid value for {attribute}: {message}")]
    InvalidValue { attribute: String, message: String },
    /// The provider's configuration (the workflow's `providers:` entry) is wrong or
    /// incomplete: retrying cannot help.
    #[error("provider configuration: {0}")]
    Config(String),
    /// The operation stopped because the run was cancelled ([`OpContext::cancel`]).
    #[error("interrupted")]
    Cancelled,
    /// The engine gave the operation up at the step's `timeout:`.
    #[error("timed out after {}", humantime::format_duration(*.0))]
    TimedOut(std::time::Duration),
    /// Anything else: I/O, remote errors. A step's `retry:` retries these.
    #[error("{0}")]
    Other(String),
}

impl ProviderError {
    pub fn other(e: impl std::fmt::Display) -> Self {
        ProviderError::Other(e.to_string())
    }

    /// Whether trying again may succeed: what a step's `retry:` retries.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ProviderError::Other(_) | ProviderError::TimedOut(_))
    }

    /// Whether the provider refused the input (bad settings, a value it cannot take): the same
    /// input fails the same way, so only a change can help.
    pub fn is_refusal(&self) -> bool {
        matches!(self, ProviderError::Config(_) | ProviderError::InvalidValue { .. })
    }

    /// Whether the operation may have had its effect although it failed: it was cut short
    /// (a timeout, a cancellation) rather than refused.
    pub fn is_indefinite(&self) -> bool {
        matches!(self, ProviderError::Cancelled | ProviderError::TimedOut(_))
    }
}

/// A set of resource types and the handlers that manage them.
#[async_trait]
pub trait Provider: Send + Sync {
    /// The resource types this provider manages.
    fn schemas(&self) -> Vec<ResourceSchema>;

    /// The settings a workflow's `providers:` entry may give, one schema per namespace the
    /// provider serves, named by the namespace (`Postgres`). None by default: such a provider
    /// takes no configuration.
    fn config_schemas(&self) -> Vec<ResourceSchema> {
        Vec::new()
    }

    /// What forces a replace beyond the schema's immutable attributes: the attributes (or
    /// paths inside them, `manifest.metadata.name`) whose change from `actual` to `desired`
    /// the provider cannot make in place. The engine plans a replace instead of an update
    /// when this is not empty. Called only when an update is planned. The default: nothing.
    fn replace_reasons(&self, type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        let _ = (type_name, desired, actual);
        Vec::new()
    }

    /// Creates the resource described by `desired`. Providers that track
    /// [`OpContext::idempotency_key`] return the resource already made for the key instead of
    /// making a second one, and say so through [`Provider::lookup`].
    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError>;

    /// Reads the actual state. `prior` is the last recorded actual state, for providers whose
    /// resources live nowhere but in the state. `Ok(None)` means the resource is gone.
    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError>;

    /// Updates the resource in place and returns its new actual state.
    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError>;

    /// Deletes the resource. Deleting something already gone is not an error.
    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError>;

    /// The resource made for `cx`'s idempotency key, if any. The engine asks after a run died
    /// (or a create timed out) between calling `create` and recording the result; `desired`
    /// is what that create was asked to make, so a provider whose resources have a natural key
    /// (a role's name, an object's namespace and name, a file's path) can find it by that key
    /// and adopt it. The default cannot tell.
    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        let _ = (cx, desired);
        Ok(Lookup::Unsupported)
    }
}

/// All providers of an engine, indexed by resource type.
#[derive(Clone, Default)]
pub struct Providers {
    by_type: TypeIndex<Arc<dyn Provider>>,
    schemas: SchemaRegistry,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("types", &self.schemas.names())
            .finish()
    }
}

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every type of `provider`.
    pub fn register(&mut self, provider: &Arc<dyn Provider>) {
        for schema in provider.schemas() {
            self.by_type.insert(&schema.name, Arc::clone(provider));
            self.schemas.insert(schema);
        }
        for schema in provider.config_schemas() {
            self.schemas.insert_config(schema);
        }
    }

    pub fn with(mut self, provider: impl Provider + 'static) -> Self {
        let provider: Arc<dyn Provider> = Arc::new(provider);
        self.register(&provider);
        self
    }

    pub fn get(&self, type_name: &str) -> Option<&Arc<dyn Provider>> {
        self.by_type.get(type_name)
    }

    /// The schema and the provider of a type (case-insensitive): both or neither.
    pub fn resolve(&self, type_name: &str) -> Option<(&ResourceSchema, &Arc<dyn Provider>)> {
        Some((self.schemas.get(type_name)?, self.get(type_name)?))
    }

    pub fn schemas(&self) -> &SchemaRegistry {
        &self.schemas
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider of the given type names that is never called: only its registration counts.
    struct Named(&'static [&'static str]);

    #[async_trait]
    impl Provider for Named {
        fn schemas(&self) -> Vec<ResourceSchema> {
            self.0.iter().map(|n| ResourceSchema::new(n, vec![])).collect()
        }
        async fn create(&self, _: &OpContext<'_>, _: &Map) -> Result<Created, ProviderError> {
            unreachable!("not called")
        }
        async fn read(&self, _: &OpContext<'_>, _: &str, _: Option<&Map>) -> Result<Option<Map>, ProviderError> {
            unreachable!("not called")
        }
        async fn update(&self, _: &OpContext<'_>, _: &str, _: &Map, _: &Map) -> Result<Map, ProviderError> {
            unreachable!("not called")
        }
        async fn delete(&self, _: &OpContext<'_>, _: &str, _: &Map) -> Result<(), ProviderError> {
            unreachable!("not called")
        }
    }

    /// The provider `resolve` gives for `type_name`, by its types, and the schema's name.
    fn resolved(providers: &Providers, type_name: &str) -> Option<(String, Vec<String>)> {
        providers.resolve(type_name).map(|(schema, provider)| {
            let types = provider.schemas().into_iter().map(|s| s.name).collect();
            (schema.name.clone(), types)
        })
    }

    #[test]
    fn resolve_answers_as_get_does_in_any_case() {
        let providers = Providers::new().with(Named(&["Ns::Thing", "Ns::Other"]));
        for name in ["Ns::Thing", "ns::thing", "NS::THING"] {
            let (schema, types) = resolved(&providers, name).expect(name);
            assert_eq!((schema.as_str(), types.len()), ("Ns::Thing", 2), "{name}");
            assert_eq!(
                providers.schemas().get(name).map(|s| s.name.as_str()),
                Some("Ns::Thing")
            );
            assert!(providers.get(name).is_some());
        }
        assert!(resolved(&providers, "Ns::Gone").is_none());
        assert!(resolved(&providers, "").is_none());
    }

    #[test]
    fn a_type_registered_again_in_another_case_replaces_the_first_everywhere() {
        let providers = Providers::new()
            .with(Named(&["Ns::Thing"]))
            .with(Named(&["NS::thing", "Ns::New"]));
        for name in ["Ns::Thing", "NS::thing", "ns::thing"] {
            let (schema, types) = resolved(&providers, name).expect(name);
            assert_eq!(schema, "NS::thing", "{name}");
            assert_eq!(types, ["NS::thing", "Ns::New"], "{name}");
            assert_eq!(
                providers.schemas().get(name).map(|s| s.name.as_str()),
                Some("NS::thing")
            );
        }
    }
}

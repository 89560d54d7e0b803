//! Foobernetes, the original Lyra's imaginary cloud: instances, web servers and load balancers
//! that live in a JSON file (`deployment.json` by default) so users can watch what the engine
//! does.
//!
//! The file format is the original's, byte for byte: what Go's `json.MarshalIndent` wrote for
//! its structs (see the private `model` and `gojson` modules). Files written by either
//! implementation can be read by the other, and the original's smoke test applies unchanged.
//!
//! Ids are `i-<n>`, `ws-<n>` and `lb-<n>` with a random non-negative 63-bit `n` of at least 8
//! digits; instances get addresses `10.0.0.<k>` from a counter that starts at 1 in each process,
//! as the original's did.
//!
//! Creates are idempotent per [`OpContext::idempotency_key`]: the keys live in a file beside the
//! Foobernetes file, `<file>.lyra-keys` (see the private `keys` module), so that the original's
//! format stays untouched. A `create` for a key that already has its resource returns that
//! resource as it is, even if `desired` now differs: the engine compares the returned actual
//! state with what it wants and updates afterwards, as for any resource it reads. The engine
//! scopes each key to its store and to one pending record, so a resource whose record was
//! forgotten (`lyra state rm`, `deletionPolicy: Orphan`) keeps its key here but is never
//! handed to a later create.
//!
//! Several `lyra` processes may share the file (the CLI and the controller applying different
//! deployments, say): each change takes an OS advisory lock on a third file beside it,
//! `<file>.lock` (`deployment.json.lock` by default), for its whole read-modify-write, so no
//! process overwrites another's update. The lock file holds no data and is created on first
//! use; it is safe to delete while no `lyra` uses the cloud, but not while one does (a process
//! would lock the deleted file while another locks a new one). Other programs editing
//! `deployment.json` by hand do not take the lock.

mod gojson;
mod keys;
mod model;
mod store;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema, type_key};
use lyra_core::types::Type;
use lyra_core::value::Map;
use rand::RngExt as _;

use model::{Instance, LoadBalancer, Resource, WebServer, to_actual};
use store::Store;

/// Canonical type names.
pub const INSTANCE: &str = "Foobernetes::Instance";
pub const WEB_SERVER: &str = "Foobernetes::WebServer";
pub const LOAD_BALANCER: &str = "Foobernetes::LoadBalancer";

/// The Foobernetes provider, keeping its cloud in one file.
#[derive(Debug)]
pub struct FoobernetesProvider {
    store: Store,
    instance: ResourceSchema,
    web_server: ResourceSchema,
    load_balancer: ResourceSchema,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Instance,
    WebServer,
    LoadBalancer,
}

impl FoobernetesProvider {
    /// A provider keeping its cloud in `file` (created on the first change).
    pub fn new(file: impl Into<PathBuf>) -> Self {
        FoobernetesProvider {
            store: Store::new(file.into()),
            instance: instance_schema(),
            web_server: web_server_schema(),
            load_balancer: load_balancer_schema(),
        }
    }

    /// The file holding the cloud.
    pub fn file(&self) -> &Path {
        self.store.path()
    }

    /// The file beside [`Self::file`] mapping idempotency keys to the ids made for them.
    pub fn keys_file(&self) -> PathBuf {
        keys::path_for(self.store.path())
    }

    /// The file beside [`Self::file`] that `lyra` processes lock to take turns changing it.
    pub fn lock_file(&self) -> PathBuf {
        store::lock_path_for(self.store.path())
    }

    fn kind(&self, type_name: &str) -> Result<(Kind, &ResourceSchema), ProviderError> {
        let key = type_key(type_name);
        [
            (Kind::Instance, &self.instance),
            (Kind::WebServer, &self.web_server),
            (Kind::LoadBalancer, &self.load_balancer),
        ]
        .into_iter()
        .find(|(_, schema)| type_key(&schema.name) == key)
        .ok_or_else(|| ProviderError::Other(format!("Foobernetes does not manage resources of type {type_name}")))
    }

    async fn create_as<R: Resource>(
        &self,
        key: String,
        desired: &Map,
        schema: &ResourceSchema,
    ) -> Result<Created, ProviderError> {
        let mut entry = R::from_desired(desired, schema)?;
        self.store
            .modify(move |cloud, session| {
                let known = cloud.keys.get(&key).map(str::to_owned);
                let table = R::table_mut(&mut cloud.deployment);
                if let Some(id) = &known
                    && let Some(stored) = table.get(id)
                {
                    let actual = to_actual(stored)?;
                    return Ok((
                        Created {
                            external_id: id.clone(),
                            actual,
                        },
                        false,
                    ));
                }
                // A key naming an id missing here is what a crash (or a failed write) between
                // the index write and the deployment write leaves: the create is finished under
                // that id, so the key stays as written and a retry is the very same create. The
                // prefix is checked because the step's type may have changed since.
                let external_id = match known {
                    Some(id) if is_id_of::<R>(&id) => id,
                    _ => loop {
                        let id = new_id(R::PREFIX);
                        if !table.contains_key(&id) && !cloud.keys.names(&id) {
                            break id;
                        }
                    },
                };
                entry.set_id(external_id.clone());
                entry.on_create(session);
                let actual = to_actual(&entry)?;
                table.insert(external_id.clone(), entry);
                cloud.keys.insert(key, external_id.clone());
                Ok((Created { external_id, actual }, true))
            })
            .await
    }

    async fn lookup_as<R: Resource>(&self, key: String) -> Result<Lookup, ProviderError> {
        // Under the lock, so that the index and the deployment are read as one.
        self.store
            .view(move |cloud| {
                let found = cloud
                    .keys
                    .get(&key)
                    .and_then(|id| Some((id, R::table(&cloud.deployment).get(id)?)));
                let lookup = match found {
                    Some((id, stored)) => Lookup::Found(Created {
                        external_id: id.to_owned(),
                        actual: to_actual(stored)?,
                    }),
                    None => Lookup::Absent,
                };
                Ok(lookup)
            })
            .await
    }

    async fn read_as<R: Resource>(&self, external_id: &str) -> Result<Option<Map>, ProviderError> {
        let deployment = self.store.load().await?;
        R::table(&deployment).get(external_id).map(to_actual).transpose()
    }

    async fn update_as<R: Resource>(
        &self,
        type_name: &str,
        external_id: &str,
        desired: &Map,
        schema: &ResourceSchema,
    ) -> Result<Map, ProviderError> {
        let mut entry = R::from_desired(desired, schema)?;
        let (type_name, external_id) = (type_name.to_owned(), external_id.to_owned());
        self.store
            .modify(move |cloud, _| {
                let table = R::table_mut(&mut cloud.deployment);
                let Some(stored) = table.get(&external_id) else {
                    return Err(ProviderError::NotFound { type_name, external_id });
                };
                entry.set_id(external_id.clone());
                entry.keep_provided(stored);
                let actual = to_actual(&entry)?;
                table.insert(external_id, entry);
                Ok((actual, true))
            })
            .await
    }

    async fn delete_as<R: Resource>(&self, external_id: &str) -> Result<(), ProviderError> {
        let external_id = external_id.to_owned();
        self.store
            .modify(move |cloud, _| {
                let removed = R::table_mut(&mut cloud.deployment).remove(&external_id).is_some();
                // Also when the resource was already gone: its key would otherwise dangle.
                cloud.keys.forget_id(&external_id);
                Ok(((), removed))
            })
            .await
    }
}

#[async_trait]
impl Provider for FoobernetesProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        vec![
            self.instance.clone(),
            self.web_server.clone(),
            self.load_balancer.clone(),
        ]
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let key = key_of(cx)?;
        match self.kind(cx.type_name)? {
            (Kind::Instance, s) => self.create_as::<Instance>(key, desired, s).await,
            (Kind::WebServer, s) => self.create_as::<WebServer>(key, desired, s).await,
            (Kind::LoadBalancer, s) => self.create_as::<LoadBalancer>(key, desired, s).await,
        }
    }

    async fn lookup(&self, cx: &OpContext<'_>, _desired: &Map) -> Result<Lookup, ProviderError> {
        let key = key_of(cx)?;
        match self.kind(cx.type_name)?.0 {
            Kind::Instance => self.lookup_as::<Instance>(key).await,
            Kind::WebServer => self.lookup_as::<WebServer>(key).await,
            Kind::LoadBalancer => self.lookup_as::<LoadBalancer>(key).await,
        }
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        _prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        match self.kind(cx.type_name)?.0 {
            Kind::Instance => self.read_as::<Instance>(external_id).await,
            Kind::WebServer => self.read_as::<WebServer>(external_id).await,
            Kind::LoadBalancer => self.read_as::<LoadBalancer>(external_id).await,
        }
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        let t = cx.type_name;
        match self.kind(t)? {
            (Kind::Instance, s) => self.update_as::<Instance>(t, external_id, desired, s).await,
            (Kind::WebServer, s) => self.update_as::<WebServer>(t, external_id, desired, s).await,
            (Kind::LoadBalancer, s) => self.update_as::<LoadBalancer>(t, external_id, desired, s).await,
        }
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, _prior: &Map) -> Result<(), ProviderError> {
        match self.kind(cx.type_name)?.0 {
            Kind::Instance => self.delete_as::<Instance>(external_id).await,
            Kind::WebServer => self.delete_as::<WebServer>(external_id).await,
            Kind::LoadBalancer => self.delete_as::<LoadBalancer>(external_id).await,
        }
    }
}

/// `prefix-<n>`: the original used Go's `rand.Int63()`; drawing from `[10^7, 2^63)` keeps that
/// range in practice while guaranteeing the 8+ digits the smoke test relies on to filter ids.
/// The key of a create or lookup. Without one, a create could only be matched to nothing or
/// to every other keyless create: refused rather than guessed.
fn key_of(cx: &OpContext<'_>) -> Result<String, ProviderError> {
    cx.idempotency_key.map(str::to_owned).ok_or_else(|| {
        ProviderError::Other(format!(
            "Foobernetes: no idempotency key for {} '{}' (an engine bug)",
            cx.type_name, cx.step_id
        ))
    })
}

fn new_id(prefix: &str) -> String {
    let n: u64 = rand::rng().random_range(10_000_000..=i64::MAX as u64);
    format!("{prefix}-{n}")
}

/// Whether `id` has the shape of `R`'s ids, `prefix-<digits>`.
fn is_id_of<R: Resource>(id: &str) -> bool {
    id.strip_prefix(R::PREFIX)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn optional_string() -> Type {
    Type::optional(Type::String)
}

fn string_hash() -> Type {
    Type::optional(Type::hash(Type::String, Type::String))
}

fn instance_schema() -> ResourceSchema {
    ResourceSchema::new(
        INSTANCE,
        vec![
            AttributeSchema::new("instanceID", optional_string()).computed(),
            AttributeSchema::new("instanceIP", optional_string()).provided(),
            AttributeSchema::new("location", optional_string()).immutable(),
            AttributeSchema::new("image", Type::String),
            AttributeSchema::new("config", string_hash()),
            AttributeSchema::new("cpus", Type::INTEGER),
            AttributeSchema::new("memory", Type::String),
        ],
    )
}

fn web_server_schema() -> ResourceSchema {
    ResourceSchema::new(
        WEB_SERVER,
        vec![
            AttributeSchema::new("webServerID", optional_string()).computed(),
            AttributeSchema::new("port", Type::INTEGER),
            AttributeSchema::new("appServers", Type::array(Type::String)),
        ],
    )
}

fn load_balancer_schema() -> ResourceSchema {
    ResourceSchema::new(
        LOAD_BALANCER,
        vec![
            AttributeSchema::new("loadBalancerID", optional_string()).computed(),
            AttributeSchema::new("loadBalancerIP", optional_string()).provided(),
            AttributeSchema::new("location", optional_string()).immutable(),
            AttributeSchema::new("replica", Type::optional(Type::Boolean)),
            AttributeSchema::new("policy", optional_string()),
            AttributeSchema::new("webServerIDs", Type::array(Type::String)),
            AttributeSchema::new("tags", string_hash()),
        ],
    )
}

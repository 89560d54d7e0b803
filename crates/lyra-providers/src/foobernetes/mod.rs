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

mod gojson;
mod model;
mod store;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use lyra_core::provider::{Created, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema, type_key};
use lyra_core::types::Type;
use lyra_core::value::Map;
use rand::Rng;

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

    async fn create_as<R: Resource>(&self, desired: &Map, schema: &ResourceSchema) -> Result<Created, ProviderError> {
        let mut entry = R::from_desired(desired, schema)?;
        self.store
            .modify(move |deployment, session| {
                let table = R::table_mut(deployment);
                let external_id = loop {
                    let id = new_id(R::PREFIX);
                    if !table.contains_key(&id) {
                        break id;
                    }
                };
                entry.set_id(external_id.clone());
                entry.on_create(session);
                let actual = to_actual(&entry)?;
                table.insert(external_id.clone(), entry);
                Ok((Created { external_id, actual }, true))
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
            .modify(move |deployment, _| {
                let table = R::table_mut(deployment);
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
            .modify(move |deployment, _| Ok(((), R::table_mut(deployment).remove(&external_id).is_some())))
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
        match self.kind(cx.type_name)? {
            (Kind::Instance, s) => self.create_as::<Instance>(desired, s).await,
            (Kind::WebServer, s) => self.create_as::<WebServer>(desired, s).await,
            (Kind::LoadBalancer, s) => self.create_as::<LoadBalancer>(desired, s).await,
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
fn new_id(prefix: &str) -> String {
    let n: u64 = rand::rng().random_range(10_000_000..=i64::MAX as u64);
    format!("{prefix}-{n}")
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
            AttributeSchema::new("instanceID", optional_string()).provided(),
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
            AttributeSchema::new("webServerID", optional_string()).provided(),
            AttributeSchema::new("port", Type::INTEGER),
            AttributeSchema::new("appServers", Type::array(Type::String)),
        ],
    )
}

fn load_balancer_schema() -> ResourceSchema {
    ResourceSchema::new(
        LOAD_BALANCER,
        vec![
            AttributeSchema::new("loadBalancerID", optional_string()).provided(),
            AttributeSchema::new("loadBalancerIP", optional_string()).provided(),
            AttributeSchema::new("location", optional_string()).immutable(),
            AttributeSchema::new("replica", Type::optional(Type::Boolean)),
            AttributeSchema::new("policy", optional_string()),
            AttributeSchema::new("webServerIDs", Type::array(Type::String)),
            AttributeSchema::new("tags", string_hash()),
        ],
    )
}

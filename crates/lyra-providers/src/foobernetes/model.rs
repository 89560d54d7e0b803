//! The Foobernetes cloud as the original's Go structs described it, field for field.
//!
//! Field order, names and Go's zero values (`""`, `0`, `null` for nil pointers, slices and maps)
//! are part of the file format, so the structs mirror the Go declarations: `Option` where Go had a
//! pointer or a nilable slice, a plain value where Go had one.

use std::collections::BTreeMap;

use lyra_core::provider::ProviderError;
use lyra_core::schema::ResourceSchema;
use lyra_core::value::{Map, Value};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Go's `map[string]string`: written with sorted keys, as Go does.
pub(crate) type StringMap = BTreeMap<String, String>;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Deployment {
    #[serde(rename = "LoadBalancers", default, deserialize_with = "null_is_zero")]
    pub load_balancers: BTreeMap<String, LoadBalancer>,
    #[serde(rename = "WebServers", default, deserialize_with = "null_is_zero")]
    pub web_servers: BTreeMap<String, WebServer>,
    #[serde(rename = "Instances", default, deserialize_with = "null_is_zero")]
    pub instances: BTreeMap<String, Instance>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Instance {
    #[serde(rename = "InstanceID", default)]
    pub instance_id: Option<String>,
    #[serde(rename = "InstanceIP", default)]
    pub instance_ip: Option<String>,
    #[serde(rename = "Location", default)]
    pub location: Option<String>,
    #[serde(rename = "Image", default, deserialize_with = "null_is_zero")]
    pub image: String,
    #[serde(rename = "Config", default)]
    pub config: Option<StringMap>,
    #[serde(rename = "Cpus", default, deserialize_with = "null_is_zero")]
    pub cpus: i64,
    #[serde(rename = "Memory", default, deserialize_with = "null_is_zero")]
    pub memory: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WebServer {
    #[serde(rename = "WebServerID", default)]
    pub web_server_id: Option<String>,
    #[serde(rename = "Port", default, deserialize_with = "null_is_zero")]
    pub port: i64,
    #[serde(rename = "AppServers", default)]
    pub app_servers: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LoadBalancer {
    #[serde(rename = "LoadBalancerID", default)]
    pub load_balancer_id: Option<String>,
    #[serde(rename = "LoadBalancerIP", default)]
    pub load_balancer_ip: Option<String>,
    #[serde(rename = "Location", default)]
    pub location: Option<String>,
    #[serde(rename = "Replica", default)]
    pub replica: Option<bool>,
    #[serde(rename = "Policy", default)]
    pub policy: Option<String>,
    #[serde(rename = "WebServerIDs", default)]
    pub web_server_ids: Option<Vec<String>>,
    #[serde(rename = "Tags", default)]
    pub tags: Option<StringMap>,
}

/// Go leaves a non-pointer field at its zero value when the JSON says `null`; serde would fail.
fn null_is_zero<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// What the provider keeps between operations of one process: the original's process-global
/// IP counter. Lives under the store's lock.
#[derive(Debug)]
pub(crate) struct Session {
    next_ip: u64,
}

impl Default for Session {
    fn default() -> Self {
        Session { next_ip: 1 }
    }
}

/// One of the three resource kinds, generic glue for the provider's operations.
pub(crate) trait Resource: Serialize + DeserializeOwned + Clone + Send + 'static {
    /// The id prefix: `i`, `ws`, `lb`.
    const PREFIX: &'static str;

    /// The desired state (lowerCamel attributes) as the Go struct; `schema` gives each
    /// attribute's type for coercion. Ids are left unset.
    fn from_desired(desired: &Map, schema: &ResourceSchema) -> Result<Self, ProviderError>;

    fn table(d: &Deployment) -> &BTreeMap<String, Self>;
    fn table_mut(d: &mut Deployment) -> &mut BTreeMap<String, Self>;

    fn set_id(&mut self, id: String);

    /// Fills what the cloud provides at creation beyond the id.
    fn on_create(&mut self, _session: &mut Session) {}

    /// Carries over from the stored entry what the cloud provided and `self` leaves unset.
    fn keep_provided(&mut self, _stored: &Self) {}
}

impl Resource for Instance {
    const PREFIX: &'static str = "i";

    fn from_desired(desired: &Map, schema: &ResourceSchema) -> Result<Self, ProviderError> {
        let a = Attrs { desired, schema };
        Ok(Instance {
            instance_id: None,
            instance_ip: a.get("instanceIP")?,
            location: a.get("location")?,
            image: a.get("image")?,
            config: a.get("config")?,
            cpus: a.get("cpus")?,
            memory: a.get("memory")?,
        })
    }
    fn table(d: &Deployment) -> &BTreeMap<String, Self> {
        &d.instances
    }
    fn table_mut(d: &mut Deployment) -> &mut BTreeMap<String, Self> {
        &mut d.instances
    }
    fn set_id(&mut self, id: String) {
        self.instance_id = Some(id);
    }
    fn on_create(&mut self, session: &mut Session) {
        // A workflow may pin the address; otherwise the cloud hands out the next one.
        if self.instance_ip.is_none() {
            self.instance_ip = Some(format!("10.0.0.{}", session.next_ip));
            session.next_ip += 1;
        }
    }
    fn keep_provided(&mut self, stored: &Self) {
        if self.instance_ip.is_none() {
            self.instance_ip.clone_from(&stored.instance_ip);
        }
    }
}

impl Resource for WebServer {
    const PREFIX: &'static str = "ws";

    fn from_desired(desired: &Map, schema: &ResourceSchema) -> Result<Self, ProviderError> {
        let a = Attrs { desired, schema };
        Ok(WebServer {
            web_server_id: None,
            port: a.get("port")?,
            app_servers: a.get("appServers")?,
        })
    }
    fn table(d: &Deployment) -> &BTreeMap<String, Self> {
        &d.web_servers
    }
    fn table_mut(d: &mut Deployment) -> &mut BTreeMap<String, Self> {
        &mut d.web_servers
    }
    fn set_id(&mut self, id: String) {
        self.web_server_id = Some(id);
    }
}

impl Resource for LoadBalancer {
    const PREFIX: &'static str = "lb";

    fn from_desired(desired: &Map, schema: &ResourceSchema) -> Result<Self, ProviderError> {
        let a = Attrs { desired, schema };
        Ok(LoadBalancer {
            load_balancer_id: None,
            load_balancer_ip: a.get("loadBalancerIP")?,
            location: a.get("location")?,
            replica: a.get("replica")?,
            policy: a.get("policy")?,
            web_server_ids: a.get("webServerIDs")?,
            tags: a.get("tags")?,
        })
    }
    fn table(d: &Deployment) -> &BTreeMap<String, Self> {
        &d.load_balancers
    }
    fn table_mut(d: &mut Deployment) -> &mut BTreeMap<String, Self> {
        &mut d.load_balancers
    }
    fn set_id(&mut self, id: String) {
        self.load_balancer_id = Some(id);
    }
    fn keep_provided(&mut self, stored: &Self) {
        if self.load_balancer_ip.is_none() {
            self.load_balancer_ip.clone_from(&stored.load_balancer_ip);
        }
    }
}

/// Reads attributes of a desired state, coerced to their schema types.
struct Attrs<'a> {
    desired: &'a Map,
    schema: &'a ResourceSchema,
}

impl Attrs<'_> {
    /// Missing or null gives Go's zero value, as unmarshalling into the Go struct did.
    fn get<T: DeserializeOwned + Default>(&self, name: &str) -> Result<T, ProviderError> {
        let value = match self.desired.get(name) {
            None | Some(Value::Null) => return Ok(T::default()),
            Some(v) => v,
        };
        let invalid = |message: String| ProviderError::InvalidValue {
            attribute: name.to_owned(),
            message,
        };
        let coerced = match self.schema.attribute(name) {
            Some(attr) => attr.ty.coerce(value).map_err(|e| invalid(e.to_string()))?,
            None => value.clone(),
        };
        serde_json::from_value(coerced).map_err(|e| invalid(e.to_string()))
    }
}

/// The actual state the engine sees: every field, nulls included, under its lowerCamel
/// attribute name (the Go field name with a lower-case first letter).
pub(crate) fn to_actual<T: Serialize>(entry: &T) -> Result<Map, ProviderError> {
    match serde_json::to_value(entry).map_err(ProviderError::other)? {
        Value::Object(fields) => Ok(fields.into_iter().map(|(k, v)| (lower_first(&k), v)).collect()),
        other => Err(ProviderError::Other(format!(
            "Foobernetes entry is not an object: {other}"
        ))),
    }
}

fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

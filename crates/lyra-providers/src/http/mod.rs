//! `Http::Resource`: an object of a JSON REST API, shaped after `restapi_object` of the
//! Mastercard/restapi Terraform provider (its `http` data source is a read of the same).
//!
//! The API is the workflow's `providers: {Http: {base_url: ..., bearer_token: ...}}`. A
//! resource is created by POSTing `data` (as JSON) to its collection `path`; the id of the new
//! object is taken from the response (`id_attribute`, a dotted path) unless `object_id` names it
//! in advance. It is then read with GET, updated with PUT and deleted with DELETE at
//! `{path}/{id}`; the methods and the paths (templates of `{path}` and `{id}`, the id
//! percent-encoded) can be changed per resource.
//!
//! Read returns, as `data`, the server's values of exactly the keys the workflow manages (the
//! keys of the recorded `data`, recursively into nested objects): a managed key changed out of
//! band is drift, a field the server adds is not. A managed key the server no longer has reads
//! as null. A 404 or 410 means the object is gone.
//!
//! Failures: connection errors, timeouts, 408, 429 and 5xx are retryable
//! ([`ProviderError::Other`]); 401 and 403 are configuration errors; other 4xx are invalid
//! values of `data`. Messages give the method, the URL (without its user info and query) and
//! the status with a short excerpt of the body, never a header value, token or password.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::invalid;
use async_trait::async_trait;
use lyra_core::provider::{Created, Lookup, OpContext, Provider, ProviderError};
use lyra_core::schema::{AttributeSchema, ResourceSchema};
use lyra_core::types::{Type, kind_of};
use lyra_core::value::{Map, Value};

#[cfg(test)]
mod tests;
mod tls;

/// The canonical type name.
pub const RESOURCE: &str = "Http::Resource";
/// The namespace, and the name of the configuration schema.
pub const NAMESPACE: &str = "Http";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a response body an error quotes.
const EXCERPT: usize = 200;

/// The provider of `Http::Resource`.
#[derive(Default)]
pub struct HttpProvider {
    /// Clients by their TLS settings and timeout: each keeps its connections.
    clients: Mutex<HashMap<(bool, String, Duration), reqwest::Client>>,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider").finish_non_exhaustive()
    }
}

impl HttpProvider {
    pub fn new() -> Self {
        Self::default()
    }

    fn client(&self, config: &Config) -> Result<reqwest::Client, ProviderError> {
        let key = (config.insecure, config.ca_certificate.clone(), config.timeout);
        let mut clients = self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let tls = tls::client_config(config.insecure, &config.ca_certificate)?;
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(config.timeout)
            // Redirects could carry the Authorization header elsewhere; an API answers itself.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProviderError::Config(format!("Http client: {}", cause(&e))))?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// The provider's configuration.
struct Config {
    base_url: Option<String>,
    headers: Vec<(String, String)>,
    bearer_token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    insecure: bool,
    ca_certificate: String,
    timeout: Duration,
}

fn config_error(message: impl Into<String>) -> ProviderError {
    ProviderError::Config(format!("Http {}", message.into()))
}

impl Config {
    fn parse(m: &Map) -> Result<Config, ProviderError> {
        let s = |key: &str| -> Result<Option<String>, ProviderError> {
            match m.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(config_error(format!("{key} must be a string, got {}", kind_of(other)))),
            }
        };
        let base_url = s("base_url")?.map(|u| u.trim().to_owned());
        if let Some(u) = &base_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(config_error(format!(
                "base_url {} is not an http:// or https:// URL",
                shown_url(u)
            )));
        }
        let timeout = match s("timeout")? {
            None => DEFAULT_TIMEOUT,
            Some(t) => humantime::parse_duration(t.trim())
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| config_error(format!("timeout '{t}' is not a duration such as 30s")))?,
        };
        let insecure = match m.get("insecure") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(config_error(format!(
                    "insecure must be a boolean, got {}",
                    kind_of(other)
                )));
            }
        };
        Ok(Config {
            base_url,
            headers: headers_of(m.get("headers")).map_err(config_error)?,
            bearer_token: s("bearer_token")?,
            username: s("username")?,
            password: s("password")?,
            insecure,
            ca_certificate: s("ca_certificate")?.unwrap_or_default(),
            timeout,
        })
    }

    /// What no message may show: the token, the password (and the basic credentials it is
    /// sent as) and every header value.
    fn secrets(&self, resource_headers: &[(String, String)]) -> Vec<String> {
        use base64::Engine as _;
        let mut out: Vec<String> = Vec::new();
        out.extend(self.bearer_token.clone());
        out.extend(self.password.clone());
        if let Some(user) = &self.username {
            let pair = format!("{user}:{}", self.password.as_deref().unwrap_or(""));
            out.push(base64::engine::general_purpose::STANDARD.encode(pair));
        }
        out.extend(self.headers.iter().map(|(_, v)| v.clone()));
        out.extend(resource_headers.iter().map(|(_, v)| v.clone()));
        out.retain(|s| !s.is_empty());
        // Longest first, so no shorter secret masks a piece of a longer one and leaves the rest.
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out
    }
}

/// A `Hash[String, String]` of headers; the message never quotes a value.
fn headers_of(v: Option<&Value>) -> Result<Vec<(String, String)>, String> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(format!("header {k} must be a string, got {}", kind_of(other))),
            })
            .collect(),
        Some(other) => Err(format!("headers must be a hash, got {}", kind_of(other))),
    }
}

/// A URL as messages show it: without user info, query or fragment (either may hold secrets).
fn shown_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(end);
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// The resource's settings, defaults applied.
struct Spec {
    path: String,
    data: Map,
    id_attribute: String,
    object_id: Option<String>,
    methods: [String; 4],
    paths: [String; 4],
    headers: Vec<(String, String)>,
}

const CREATE: usize = 0;
const READ: usize = 1;
const UPDATE: usize = 2;
const DESTROY: usize = 3;
const OPS: [&str; 4] = ["create", "read", "update", "destroy"];
const DEFAULT_METHODS: [&str; 4] = ["POST", "GET", "PUT", "DELETE"];

fn opt_str(m: &Map, key: &str) -> Result<Option<String>, ProviderError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(key, format!("expects a string, got {}", kind_of(other)))),
    }
}

impl Spec {
    fn parse(m: &Map) -> Result<Spec, ProviderError> {
        let path = opt_str(m, "path")?
            .filter(|p| !p.is_empty())
            .ok_or_else(|| invalid("path", "is required"))?;
        let data = match m.get("data") {
            Some(Value::Object(d)) => d.clone(),
            None | Some(Value::Null) => return Err(invalid("data", "is required")),
            Some(other) => return Err(invalid("data", format!("expects a hash, got {}", kind_of(other)))),
        };
        let mut methods = DEFAULT_METHODS.map(str::to_owned);
        let mut paths = ["{path}", "{path}/{id}", "{path}/{id}", "{path}/{id}"].map(str::to_owned);
        for (i, op) in OPS.iter().enumerate() {
            let key = format!("{op}_method");
            if let Some(method) = opt_str(m, &key)? {
                let method = method.trim().to_ascii_uppercase();
                if reqwest::Method::from_bytes(method.as_bytes()).is_err() || method.is_empty() {
                    return Err(invalid(&key, format!("'{method}' is not an HTTP method")));
                }
                methods[i] = method;
            }
            if let Some(p) = opt_str(m, &format!("{op}_path"))? {
                paths[i] = p;
            }
        }
        Ok(Spec {
            path,
            data,
            id_attribute: opt_str(m, "id_attribute")?.unwrap_or_else(|| "id".to_owned()),
            object_id: opt_str(m, "object_id")?.filter(|s| !s.is_empty()),
            methods,
            paths,
            headers: headers_of(m.get("headers")).map_err(|e| invalid("headers", e))?,
        })
    }

    /// The URL of operation `op` on the object `id`.
    fn url(&self, config: &Config, op: usize, id: &str) -> Result<String, ProviderError> {
        let id = percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC).to_string();
        let path = self.paths[op].replace("{path}", &self.path).replace("{id}", &id);
        if path.starts_with("http://") || path.starts_with("https://") {
            return Ok(path);
        }
        let base = config
            .base_url
            .as_deref()
            .ok_or_else(|| config_error(format!("base_url is needed for the relative path {}", shown_url(&path))))?;
        Ok(format!(
            "{}/{}",
            base.trim_end_matches('/'),
            path.trim_start_matches('/')
        ))
    }
}

/// A response: its status and JSON body (null when empty).
struct Response {
    status: u16,
    body: Value,
}

/// Why a request failed, as its sources say (reqwest's own message repeats the URL).
fn cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ")
}

fn scrub(mut text: String, secrets: &[String]) -> String {
    for s in secrets {
        text = text.replace(s.as_str(), "***");
    }
    text
}

/// Sends one request. Gone (404, 410) is `Ok` with that status for the caller to judge; any
/// other failure status is an error.
async fn send(
    cx: &OpContext<'_>,
    client: &reqwest::Client,
    config: &Config,
    spec: &Spec,
    method: &str,
    url: &str,
    body: Option<&Map>,
) -> Result<Response, ProviderError> {
    let secrets = config.secrets(&spec.headers);
    let what = format!("Http {method} {}", shown_url(url));
    let fail = |message: String| ProviderError::Other(scrub(format!("{what}: {message}"), &secrets));
    let method_v = reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| fail("not an HTTP method".to_owned()))?;
    let mut req = client
        .request(method_v, url)
        .header(reqwest::header::ACCEPT, "application/json");
    for (k, v) in config.headers.iter().chain(&spec.headers) {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| invalid("headers", format!("'{k}' is not a header name")))?;
        let value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
            invalid(
                "headers",
                format!("the value of header {k} is not a valid header value"),
            )
        })?;
        req = req.header(name, value);
    }
    if let Some(token) = &config.bearer_token {
        req = req.bearer_auth(token);
    } else if let Some(user) = &config.username {
        req = req.basic_auth(user, config.password.as_deref());
    }
    if let Some(body) = body {
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(Value::Object(body.clone()).to_string());
    }
    let resp = crate::cancellable(cx, async {
        let resp = req.send().await.map_err(|e| fail(cause(&e)))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| fail(cause(&e)))?;
        Ok((status, bytes))
    })
    .await?;
    let (status, bytes) = resp;
    if (200..300).contains(&status) || status == 404 || status == 410 {
        let body = if bytes.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else if (200..300).contains(&status) {
            serde_json::from_slice(&bytes).map_err(|_| fail(format!("{status}: the response is not JSON")))?
        } else {
            Value::Null
        };
        return Ok(Response { status, body });
    }
    // Masked whole before it is cut: a secret across the cut would leave a piece of it.
    let text = scrub(String::from_utf8_lossy(&bytes).into_owned(), &secrets);
    let excerpt: String = text.chars().take(EXCERPT).collect();
    let ellipsis = if text.chars().count() > EXCERPT { "..." } else { "" };
    let message = scrub(format!("{what}: {status}: {}{ellipsis}", excerpt.trim()), &secrets);
    Err(match status {
        408 | 429 | 500..=599 => ProviderError::Other(message),
        401 | 403 => ProviderError::Config(message),
        400..=499 => invalid("data", message),
        _ => ProviderError::Other(message),
    })
}

/// The value at a dotted path of `v` (`data.id`; array items by index).
fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, key| match v {
        Value::Object(m) => m.get(key),
        Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// The server's object, cut down to the keys of `managed`, recursively into objects both
/// have: what the workflow manages of it. A managed key the server lacks is null.
fn project(server: &Map, managed: &Map) -> Map {
    managed
        .iter()
        .map(|(k, mine)| {
            let theirs = match (server.get(k), mine) {
                (Some(Value::Object(s)), Value::Object(m)) => Value::Object(project(s, m)),
                (Some(v), _) => v.clone(),
                (None, _) => Value::Null,
            };
            (k.clone(), theirs)
        })
        .collect()
}

/// An id as the server gave it: a string, or a number written out.
fn id_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The actual state: `desired_or_prior`'s settings, the server's view of the managed data.
fn actual_of(settings: &Map, id: &str, resp: &Response, managed: &Map) -> Map {
    let mut m = settings.clone();
    let server = match &resp.body {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    m.insert("data".into(), Value::Object(project(&server, managed)));
    m.insert("id".into(), Value::String(id.to_owned()));
    m.insert("response".into(), resp.body.clone());
    m.insert("status_code".into(), Value::from(resp.status));
    m
}

impl HttpProvider {
    /// GETs the object: `None` when it is gone.
    async fn get(
        &self,
        cx: &OpContext<'_>,
        config: &Config,
        spec: &Spec,
        id: &str,
        settings: &Map,
    ) -> Result<Option<Map>, ProviderError> {
        let client = self.client(config)?;
        let url = spec.url(config, READ, id)?;
        let resp = send(cx, &client, config, spec, &spec.methods[READ], &url, None).await?;
        if resp.status == 404 || resp.status == 410 {
            return Ok(None);
        }
        if !resp.body.is_object() {
            return Err(ProviderError::Other(format!(
                "Http {} {}: {}: the response is not a JSON object",
                spec.methods[READ],
                shown_url(&url),
                resp.status
            )));
        }
        Ok(Some(actual_of(settings, id, &resp, &spec.data)))
    }
}

/// `m` without the computed attributes: the settings carried from desired or prior.
fn settings_of(m: &Map) -> Map {
    let mut s = m.clone();
    for k in ["id", "response", "status_code"] {
        s.remove(k);
    }
    s
}

#[async_trait]
impl Provider for HttpProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        let opt_s = || Type::optional(Type::String);
        let mut attributes = vec![
            AttributeSchema::new("path", Type::String)
                .required()
                .immutable()
                .doc("The collection's path, relative to base_url (/users) or an absolute URL."),
            AttributeSchema::new("data", Type::hash(Type::String, Type::Any))
                .required()
                .doc("The object, sent as the JSON body; read back as the server's values of these keys."),
            AttributeSchema::new("id_attribute", opt_s())
                .doc("Where the create response holds the new object's id, a dotted path (id)."),
            AttributeSchema::new("object_id", opt_s())
                .immutable()
                .doc("The object's id when known in advance (an API that creates with PUT to {path}/{id})."),
        ];
        for (op, method) in OPS.iter().zip(DEFAULT_METHODS) {
            attributes.push(
                AttributeSchema::new(&format!("{op}_method"), opt_s())
                    .doc(&format!("The HTTP method to {op} the object with ({method}).")),
            );
        }
        for (op, default) in OPS.iter().zip(["{path}", "{path}/{id}", "{path}/{id}", "{path}/{id}"]) {
            attributes.push(AttributeSchema::new(&format!("{op}_path"), opt_s()).doc(&format!(
                "Where to {op} it: a template of {{path}} and {{id}} (the id percent-encoded) ({default})."
            )));
        }
        attributes.extend([
            AttributeSchema::new("headers", Type::optional(Type::hash(Type::String, Type::String)))
                .sensitive()
                .doc("Headers of this resource's requests, beside the provider's (they may carry keys)."),
            AttributeSchema::new("id", Type::String)
                .computed()
                .doc("The object's id."),
            AttributeSchema::new("response", Type::Any)
                .computed()
                .doc("The last response's JSON body, whole."),
            AttributeSchema::new("status_code", Type::INTEGER)
                .computed()
                .doc("The last response's status code."),
        ]);
        vec![ResourceSchema::new(RESOURCE, attributes).doc(
            "An object of a JSON REST API (like Mastercard/restapi's restapi_object): POSTed to path, read, \
             updated and deleted at path/id. Drift is a change of a key of data; fields the server adds are \
             ignored. External id: the object's id.",
        )]
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        let opt_s = || Type::optional(Type::String);
        vec![
            ResourceSchema::new(
                NAMESPACE,
                vec![
                    AttributeSchema::new("base_url", opt_s()).doc("The API's URL, which relative paths extend."),
                    AttributeSchema::new("headers", Type::optional(Type::hash(Type::String, Type::String)))
                        .sensitive()
                        .doc("Headers of every request (they may carry keys)."),
                    AttributeSchema::new("bearer_token", opt_s())
                        .sensitive()
                        .doc("Sent as Authorization: Bearer."),
                    AttributeSchema::new("username", opt_s()).doc("The user of basic authentication."),
                    AttributeSchema::new("password", opt_s())
                        .sensitive()
                        .doc("The password of basic authentication."),
                    AttributeSchema::new("insecure", Type::optional(Type::Boolean))
                        .doc("Skip the verification of the server's TLS certificate (false)."),
                    AttributeSchema::new("ca_certificate", opt_s())
                        .doc("PEM certificates of CAs to trust beside the public ones."),
                    AttributeSchema::new("timeout", opt_s()).doc("How long a request may take (30s)."),
                ],
            )
            .doc("The JSON REST API the Http::Resource type manages."),
        ]
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let config = Config::parse(cx.config)?;
        let spec = Spec::parse(desired)?;
        let client = self.client(&config)?;
        let url = spec.url(&config, CREATE, spec.object_id.as_deref().unwrap_or(""))?;
        let resp = send(
            cx,
            &client,
            &config,
            &spec,
            &spec.methods[CREATE],
            &url,
            Some(&spec.data),
        )
        .await?;
        if resp.status == 404 || resp.status == 410 {
            return Err(invalid(
                "path",
                format!("Http {} {}: {}", spec.methods[CREATE], shown_url(&url), resp.status),
            ));
        }
        let id = match &spec.object_id {
            Some(id) => id.clone(),
            None => at_path(&resp.body, &spec.id_attribute).and_then(id_of).ok_or_else(|| {
                invalid(
                    "id_attribute",
                    format!(
                        "the response to {} {} has no id at '{}'",
                        spec.methods[CREATE],
                        shown_url(&url),
                        spec.id_attribute
                    ),
                )
            })?,
        };
        let actual = self
            .get(cx, &config, &spec, &id, &settings_of(desired))
            .await?
            .ok_or_else(|| {
                ProviderError::Other(format!(
                    "Http {}: object {id} is gone right after its creation",
                    shown_url(&url)
                ))
            })?;
        Ok(Created {
            external_id: id,
            actual,
        })
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let config = Config::parse(cx.config)?;
        let Some(prior) = prior else {
            // Without a record there is no path to read from.
            return Err(ProviderError::Other(format!(
                "Http::Resource {external_id} cannot be read without its recorded state"
            )));
        };
        let spec = Spec::parse(prior)?;
        self.get(cx, &config, &spec, external_id, &settings_of(prior)).await
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        desired: &Map,
        _prior: &Map,
    ) -> Result<Map, ProviderError> {
        let config = Config::parse(cx.config)?;
        let spec = Spec::parse(desired)?;
        let client = self.client(&config)?;
        let url = spec.url(&config, UPDATE, external_id)?;
        let resp = send(
            cx,
            &client,
            &config,
            &spec,
            &spec.methods[UPDATE],
            &url,
            Some(&spec.data),
        )
        .await?;
        if resp.status == 404 || resp.status == 410 {
            return Err(ProviderError::NotFound {
                type_name: RESOURCE.to_owned(),
                external_id: external_id.to_owned(),
            });
        }
        self.get(cx, &config, &spec, external_id, &settings_of(desired))
            .await?
            .ok_or_else(|| {
                ProviderError::Other(format!(
                    "Http {}: object {external_id} is gone after its update",
                    shown_url(&url)
                ))
            })
    }

    async fn delete(&self, cx: &OpContext<'_>, external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        let config = Config::parse(cx.config)?;
        let spec = Spec::parse(prior)?;
        let client = self.client(&config)?;
        let url = spec.url(&config, DESTROY, external_id)?;
        // Gone already (404, 410) is as good as deleted.
        send(cx, &client, &config, &spec, &spec.methods[DESTROY], &url, None).await?;
        Ok(())
    }

    /// With `object_id`, whether that object exists; without, there is no key to find it by.
    async fn lookup(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Lookup, ProviderError> {
        let spec = Spec::parse(desired)?;
        let Some(id) = spec.object_id.clone() else {
            return Ok(Lookup::Unsupported);
        };
        let config = Config::parse(cx.config)?;
        Ok(match self.get(cx, &config, &spec, &id, &settings_of(desired)).await? {
            Some(actual) => Lookup::Found(Created {
                external_id: id,
                actual,
            }),
            None => Lookup::Absent,
        })
    }
}

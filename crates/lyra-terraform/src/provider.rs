//! [`TerraformProvider`]: a Terraform provider process behind Lyra's [`Provider`] trait.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use lyra_core::provider::{Created, OpContext, Provider, ProviderError};
use lyra_core::schema::{ResourceSchema, type_key};
use lyra_core::value::Map;
use serde_json::Value;
use tonic::transport::Channel;

use crate::cty::{self, Ty};
use crate::launch::{Dialer, Launched, error_chain, launch};
use crate::proto::tfplugin as pb;
use crate::proto::tfplugin5::provider_client::ProviderClient as Client5;
use crate::proto::tfplugin6::provider_client::ProviderClient as Client6;
use crate::schema::{BlockInfo, TypeInfo, lyra_namespace};
use crate::{STATE_KEY, TerraformError};

/// The Terraform version the bridge reports to providers (some use it in user agents or to
/// enable features): the protocol features it uses are those of this release.
const TERRAFORM_VERSION: &str = "1.5.7";

/// How many configured processes one provider keeps (a controller serving many workflows with
/// different settings would otherwise start one per workflow and keep them all). The oldest
/// goes first; operations still using it finish before it is killed.
const MAX_INSTANCES: usize = 8;

/// A client of either protocol version. Both use the same messages.
#[derive(Clone)]
enum Rpc {
    V5(Client5<Channel>),
    V6(Client6<Channel>),
}

impl Rpc {
    fn new(protocol: u32, channel: Channel) -> Rpc {
        if protocol == 6 {
            Rpc::V6(Client6::new(channel))
        } else {
            Rpc::V5(Client5::new(channel))
        }
    }
}

/// Calls the method named `$v5` in protocol 5 and `$v6` in protocol 6.
macro_rules! rpc {
    ($rpc:expr, $v5:ident, $v6:ident, $req:expr) => {
        match $rpc {
            Rpc::V5(c) => c.clone().$v5($req).await,
            Rpc::V6(c) => c.clone().$v6($req).await,
        }
    };
}

/// One provider process, configured (or about to be) with one set of settings.
struct Instance {
    launched: Launched,
    rpc: Rpc,
}

/// A Terraform provider, its resource types as Lyra types.
///
/// Terraform configures a provider process once; a run's settings come with each operation
/// ([`OpContext::config`]), so the bridge keeps one configured process per distinct set of
/// settings, started on first use. The process that answered the schema becomes the first.
/// A process that dies fails the operations in flight (naming the provider and how it exited)
/// and is started afresh by the next one.
pub struct TerraformProvider {
    name: String,
    path: PathBuf,
    protocol: u32,
    timeout: Duration,
    types: HashMap<String, Arc<TypeInfo>>,
    schemas: Vec<ResourceSchema>,
    config: Option<(BlockInfo, ResourceSchema)>,
    instances: tokio::sync::Mutex<Vec<(String, Arc<Instance>)>>,
    idle: Mutex<Option<Instance>>,
}

impl std::fmt::Debug for TerraformProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerraformProvider")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

fn dv(msgpack: Vec<u8>) -> Option<pb::DynamicValue> {
    Some(pb::DynamicValue {
        msgpack,
        json: Vec::new(),
    })
}

/// A dynamic value as JSON, whichever encoding the provider chose.
fn value_of(v: Option<&pb::DynamicValue>, ty: &Ty) -> Result<Value, String> {
    let Some(v) = v else {
        return Ok(Value::Null);
    };
    if !v.msgpack.is_empty() {
        return cty::decode(&v.msgpack, ty).map(|(v, _)| v).map_err(|e| e.to_string());
    }
    if !v.json.is_empty() {
        return serde_json::from_slice(&v.json).map_err(|e| e.to_string());
    }
    Ok(Value::Null)
}

/// The msgpack of a dynamic value, re-encoding JSON when the provider sent that.
fn msgpack_of(v: Option<pb::DynamicValue>, ty: &Ty) -> Result<Vec<u8>, String> {
    match v {
        Some(v) if !v.msgpack.is_empty() => Ok(v.msgpack),
        Some(v) if !v.json.is_empty() => {
            let json: Value = serde_json::from_slice(&v.json).map_err(|e| e.to_string())?;
            cty::encode(&json, ty).map_err(|e| e.to_string())
        }
        _ => Ok(cty::null()),
    }
}

/// A Terraform attribute path as Lyra writes attribute paths (`rule[0].port`).
fn path_text(p: &pb::AttributePath) -> String {
    use pb::attribute_path::step::Selector;
    let mut out = String::new();
    for step in &p.steps {
        match &step.selector {
            Some(Selector::AttributeName(n)) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(n);
            }
            Some(Selector::ElementKeyString(k)) => out.push_str(&format!("[{k:?}]")),
            Some(Selector::ElementKeyInt(i)) => out.push_str(&format!("[{i}]")),
            None => {}
        }
    }
    out
}

/// The recorded state, without the bridge's own key; the private bytes; the schema version.
fn split_prior(prior: &Map) -> (Map, Vec<u8>, i64) {
    let mut state = prior.clone();
    let ours = state.remove(STATE_KEY);
    let private = ours
        .as_ref()
        .and_then(|o| o.get("private"))
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default();
    let version = ours
        .as_ref()
        .and_then(|o| o.get("schema_version"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    (state, private, version)
}

impl TerraformProvider {
    /// Starts the provider `name` at `path`, reads its schema, and keeps the process for the
    /// first operation. Call it inside a Tokio runtime.
    pub async fn start(name: &str, path: &Path, timeout: Duration) -> Result<TerraformProvider, TerraformError> {
        let launched = launch(path, timeout).await?;
        let protocol = launched.handshake.protocol;
        let rpc = Rpc::new(protocol, launched.channel.clone());
        let schema_error = |message: String| TerraformError::Schema {
            path: path.to_path_buf(),
            message,
        };
        let reply = tokio::time::timeout(timeout, async {
            rpc!(&rpc, get_schema, get_provider_schema, pb::GetSchemaRequest {})
        })
        .await
        .map_err(|_| schema_error(format!("no answer within {}", humantime::format_duration(timeout))))?
        .map_err(|s| schema_error(status_text(&s)))?
        .into_inner();
        if let Some(e) = errors(&reply.diagnostics) {
            return Err(schema_error(e));
        }
        let mut types = HashMap::new();
        let mut schemas = Vec::new();
        let mut names: Vec<_> = reply.resource_schemas.keys().cloned().collect();
        names.sort();
        for tf_name in names {
            let s = &reply.resource_schemas[&tf_name];
            let info = TypeInfo::new(
                name,
                &tf_name,
                s.version,
                s.block.as_ref().unwrap_or(&pb::schema::Block::default()),
            )
            .map_err(schema_error)?;
            schemas.push(info.schema.clone());
            types.insert(type_key(&info.schema.name), Arc::new(info));
        }
        let namespace = lyra_namespace(name);
        let config = match reply.provider.as_ref().and_then(|p| p.block.as_ref()) {
            Some(block) => {
                let info = BlockInfo::from_proto(block).map_err(schema_error)?;
                let doc = format!("The settings of Terraform's {name} provider ({}).", path.display());
                let schema = ResourceSchema::new(&namespace, info.lyra_attributes()).doc(&doc);
                Some((info, schema))
            }
            None => None,
        };
        Ok(TerraformProvider {
            name: name.to_owned(),
            path: path.to_path_buf(),
            protocol,
            timeout,
            types,
            schemas,
            config,
            instances: tokio::sync::Mutex::new(Vec::new()),
            idle: Mutex::new(Some(Instance { launched, rpc })),
        })
    }

    /// The executable's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The Terraform plugin protocol the provider chose (5 or 6).
    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// The process ids of the provider's running processes.
    pub async fn pids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .instances
            .lock()
            .await
            .iter()
            .filter_map(|(_, i)| i.launched.child.lock().ok().and_then(|c| c.id()))
            .collect();
        if let Some(i) = self.idle.lock().ok().as_ref().and_then(|g| g.as_ref()) {
            out.extend(i.launched.child.lock().ok().and_then(|c| c.id()));
        }
        out
    }

    fn who(&self) -> String {
        format!("terraform provider {} ({})", self.name, self.path.display())
    }

    fn info(&self, type_name: &str) -> Result<&Arc<TypeInfo>, ProviderError> {
        self.types
            .get(&type_key(type_name))
            .ok_or_else(|| ProviderError::Other(format!("{}: has no resource type {type_name}", self.who())))
    }

    /// The process configured with `cx`'s settings, started and configured when there is none
    /// (or it died).
    async fn instance(&self, cx: &OpContext<'_>) -> Result<Arc<Instance>, ProviderError> {
        let key = serde_json::to_string(cx.config).unwrap_or_default();
        let mut instances = self.instances.lock().await;
        instances.retain(|(_, i)| i.launched.exited().is_none());
        if let Some((_, i)) = instances.iter().find(|(k, _)| *k == key) {
            return Ok(Arc::clone(i));
        }
        let idle = self.idle.lock().ok().and_then(|mut g| g.take());
        let instance = match idle {
            Some(i) if i.launched.exited().is_none() => i,
            _ => {
                let launched = launch(&self.path, self.timeout)
                    .await
                    .map_err(|e| ProviderError::Other(e.to_string()))?;
                let rpc = Rpc::new(launched.handshake.protocol, launched.channel.clone());
                Instance { launched, rpc }
            }
        };
        self.configure(&instance, cx).await?;
        let instance = Arc::new(instance);
        if instances.len() >= MAX_INSTANCES {
            instances.remove(0);
        }
        instances.push((key, Arc::clone(&instance)));
        Ok(instance)
    }

    async fn configure(&self, instance: &Instance, cx: &OpContext<'_>) -> Result<(), ProviderError> {
        let config_error = |m: String| ProviderError::Config(format!("{}: {m}", self.who()));
        let (config, ty) = match &self.config {
            Some((block, _)) => (block.config(cx.config), block.ty.clone()),
            None => (Value::Object(serde_json::Map::new()), Ty::Object(Default::default())),
        };
        let encoded = cty::encode(&config, &ty).map_err(|e| config_error(e.to_string()))?;
        let prepared = match &instance.rpc {
            Rpc::V5(c) => {
                let reply = self
                    .call(
                        instance,
                        cx,
                        c.clone().prepare_provider_config(pb::PrepareConfigRequest {
                            config: dv(encoded.clone()),
                        }),
                    )
                    .await?;
                if let Some(e) = errors(&reply.diagnostics) {
                    return Err(config_error(e));
                }
                match reply.prepared_config {
                    Some(p) if !p.msgpack.is_empty() => p.msgpack,
                    _ => encoded,
                }
            }
            Rpc::V6(c) => {
                let reply = self
                    .call(
                        instance,
                        cx,
                        c.clone().validate_provider_config(pb::PrepareConfigRequest {
                            config: dv(encoded.clone()),
                        }),
                    )
                    .await?;
                if let Some(e) = errors(&reply.diagnostics) {
                    return Err(config_error(e));
                }
                encoded
            }
        };
        let request = pb::ConfigureRequest {
            terraform_version: TERRAFORM_VERSION.to_owned(),
            config: dv(prepared),
        };
        let reply = match &instance.rpc {
            Rpc::V5(c) => self.call(instance, cx, c.clone().configure(request)).await?,
            Rpc::V6(c) => self.call(instance, cx, c.clone().configure_provider(request)).await?,
        };
        self.warn(&reply.diagnostics);
        match errors(&reply.diagnostics) {
            Some(e) => Err(config_error(e)),
            None => Ok(()),
        }
    }

    /// Runs an RPC, giving it up when `cx` is cancelled (and asking the provider to stop).
    async fn call<T>(
        &self,
        instance: &Instance,
        cx: &OpContext<'_>,
        rpc: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ProviderError> {
        let cancelled = lyra_plugin::until_cancelled(cx);
        tokio::select! {
            r = rpc => match r {
                Ok(reply) => Ok(reply.into_inner()),
                Err(s) => Err(self.transport_error(instance, &s).await),
            },
            () = cancelled => {
                // Terraform's interrupt: the provider cancels what it is doing.
                let rpc = instance.rpc.clone();
                tokio::spawn(async move { let _ = rpc!(&rpc, stop, stop_provider, pb::StopRequest {}); });
                Err(ProviderError::Cancelled)
            }
        }
    }

    async fn transport_error(&self, instance: &Instance, status: &tonic::Status) -> ProviderError {
        // A process that died is reaped a moment after its socket closes.
        let mut exited = instance.launched.exited();
        for _ in 0..10 {
            if exited.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            exited = instance.launched.exited();
        }
        let how = match exited {
            Some(s) => {
                let tail = instance.launched.stderr_tail();
                let last = tail
                    .last()
                    .map(|l| format!("; its last stderr line: {l}"))
                    .unwrap_or_default();
                format!(" (the provider exited: {s}{last})")
            }
            None => String::new(),
        };
        ProviderError::Other(format!("{}: {}{how}", self.who(), status_text(status)))
    }

    fn warn(&self, diags: &[pb::Diagnostic]) {
        for d in diags
            .iter()
            .filter(|d| d.severity() == pb::diagnostic::Severity::Warning)
        {
            tracing::warn!(provider = %self.name, "{}", diag_text(d));
        }
    }

    /// The provider's errors about `tf_type`, as a provider error.
    fn check(&self, what: &str, info: &TypeInfo, diags: &[pb::Diagnostic]) -> Result<(), ProviderError> {
        self.warn(diags);
        let errs: Vec<&pb::Diagnostic> = diags
            .iter()
            .filter(|d| d.severity() != pb::diagnostic::Severity::Warning)
            .collect();
        if errs.is_empty() {
            return Ok(());
        }
        if let [one] = errs.as_slice()
            && let Some(path) = one.attribute.as_ref().map(path_text).filter(|p| !p.is_empty())
        {
            return Err(ProviderError::InvalidValue {
                attribute: path,
                message: format!("{} ({}, {what})", diag_text(one), self.who()),
            });
        }
        let text: Vec<String> = errs.iter().map(|d| diag_text(d)).collect();
        Err(ProviderError::Other(format!(
            "{}: {what} {}: {}",
            self.who(),
            info.tf_name,
            text.join("; ")
        )))
    }

    fn bad(&self, what: &str, e: impl std::fmt::Display) -> ProviderError {
        ProviderError::Other(format!("{}: {what}: {e}", self.who()))
    }

    /// The record's actual state: the provider's state and what the bridge must keep.
    fn actual(&self, info: &TypeInfo, state: Value, private: &[u8]) -> Result<Map, ProviderError> {
        let Value::Object(mut m) = state else {
            return Err(self.bad(&format!("the state of {}", info.tf_name), "not an object"));
        };
        m.insert(
            STATE_KEY.to_owned(),
            serde_json::json!({
                "private": base64::engine::general_purpose::STANDARD.encode(private),
                "schema_version": info.version,
            }),
        );
        Ok(m)
    }

    /// The recorded state brought to the provider's current schema, as msgpack.
    async fn upgrade(
        &self,
        instance: &Instance,
        cx: &OpContext<'_>,
        info: &TypeInfo,
        state: &Map,
        version: i64,
    ) -> Result<Vec<u8>, ProviderError> {
        let request = pb::UpgradeRequest {
            type_name: info.tf_name.clone(),
            version,
            raw_state: Some(pb::RawState {
                json: serde_json::to_vec(state).unwrap_or_default(),
                flatmap: HashMap::new(),
            }),
        };
        let reply = self
            .call(instance, cx, async {
                rpc!(&instance.rpc, upgrade_resource_state, upgrade_resource_state, request)
            })
            .await?;
        self.check("upgrading the state of", info, &reply.diagnostics)?;
        msgpack_of(reply.upgraded_state, &info.block.ty).map_err(|e| self.bad("its upgraded state", e))
    }

    /// Plans and applies a change from `prior` (msgpack, null for a create) to `desired`.
    async fn change(
        &self,
        instance: &Instance,
        cx: &OpContext<'_>,
        info: &TypeInfo,
        prior: Option<(Vec<u8>, Map, Vec<u8>)>,
        desired: &Map,
    ) -> Result<Map, ProviderError> {
        let config = info.block.config(desired);
        let config_mp = cty::encode(&config, &info.block.ty).map_err(|e| ProviderError::InvalidValue {
            attribute: e.path,
            message: e.message,
        })?;
        let (prior_mp, prior_state, prior_private) = match prior {
            Some((mp, state, private)) => (mp, Some(state), private),
            None => (cty::null(), None, Vec::new()),
        };
        let proposed = info.block.proposed(prior_state.as_ref(), &config);
        let proposed_mp = cty::encode(&proposed, &info.block.ty).map_err(|e| self.bad("the proposed state", e))?;
        let request = pb::PlanRequest {
            type_name: info.tf_name.clone(),
            prior_state: dv(prior_mp.clone()),
            proposed_new_state: dv(proposed_mp),
            config: dv(config_mp.clone()),
            prior_private,
        };
        let plan = self
            .call(instance, cx, async {
                rpc!(&instance.rpc, plan_resource_change, plan_resource_change, request)
            })
            .await?;
        self.check("planning", info, &plan.diagnostics)?;
        if prior_state.is_some() && !plan.requires_replace.is_empty() {
            let paths: Vec<String> = plan.requires_replace.iter().map(path_text).collect();
            return Err(ProviderError::Other(format!(
                "{}: {} must be replaced to change {} (it changed since the plan)",
                self.who(),
                info.tf_name,
                paths.join(", ")
            )));
        }
        // The planned state goes back exactly as it came: it may hold values not known yet.
        let request = pb::ApplyRequest {
            type_name: info.tf_name.clone(),
            prior_state: dv(prior_mp),
            planned_state: plan.planned_state,
            config: dv(config_mp),
            planned_private: plan.planned_private,
        };
        let applied = self
            .call(instance, cx, async {
                rpc!(&instance.rpc, apply_resource_change, apply_resource_change, request)
            })
            .await?;
        self.check("applying", info, &applied.diagnostics)?;
        let state = value_of(applied.new_state.as_ref(), &info.block.ty).map_err(|e| self.bad("its new state", e))?;
        if state.is_null() {
            return Err(self.bad(&format!("applying {}", info.tf_name), "the provider returned no state"));
        }
        self.actual(info, state, &applied.private)
    }

    /// Reads a resource from its state (msgpack) and private bytes.
    async fn read_state(
        &self,
        instance: &Instance,
        cx: &OpContext<'_>,
        info: &TypeInfo,
        current: Vec<u8>,
        private: Vec<u8>,
    ) -> Result<Option<Map>, ProviderError> {
        let request = pb::ReadRequest {
            type_name: info.tf_name.clone(),
            current_state: dv(current),
            private,
        };
        let reply = self
            .call(instance, cx, async {
                rpc!(&instance.rpc, read_resource, read_resource, request)
            })
            .await?;
        self.check("reading", info, &reply.diagnostics)?;
        let state = value_of(reply.new_state.as_ref(), &info.block.ty).map_err(|e| self.bad("its state", e))?;
        if state.is_null() {
            return Ok(None);
        }
        self.actual(info, state, &reply.private).map(Some)
    }
}

fn diag_text(d: &pb::Diagnostic) -> String {
    if d.detail.is_empty() {
        d.summary.clone()
    } else {
        format!("{}: {}", d.summary, d.detail)
    }
}

/// The error diagnostics, joined; `None` when there are none.
fn errors(diags: &[pb::Diagnostic]) -> Option<String> {
    let e: Vec<String> = diags
        .iter()
        .filter(|d| d.severity() != pb::diagnostic::Severity::Warning)
        .map(diag_text)
        .collect();
    (!e.is_empty()).then(|| e.join("; "))
}

fn status_text(s: &tonic::Status) -> String {
    let source = std::error::Error::source(s)
        .map(|e| format!(" ({})", error_chain(e)))
        .unwrap_or_default();
    if s.message().is_empty() {
        format!("{:?}{source}", s.code())
    } else {
        format!("{:?}: {}{source}", s.code(), s.message())
    }
}

#[async_trait]
impl Provider for TerraformProvider {
    fn schemas(&self) -> Vec<ResourceSchema> {
        self.schemas.clone()
    }

    fn config_schemas(&self) -> Vec<ResourceSchema> {
        self.config.iter().map(|(_, s)| s.clone()).collect()
    }

    /// The provider's own plan says what needs a replace (`requires_replace`). The trait's
    /// method is synchronous: the plan is asked on a thread of its own, with a runtime and a
    /// connection of its own, of a process already configured (or the one that gave the
    /// schema). When the provider cannot answer, nothing forces a replace (the warning is
    /// logged) and the update that follows asks again and fails if one is needed.
    fn replace_reasons(&self, type_name: &str, desired: &Map, actual: &Map) -> Vec<String> {
        let Ok(info) = self.info(type_name) else {
            return Vec::new();
        };
        let configured = self.instances.try_lock().ok().and_then(|i| {
            i.iter()
                .find(|(_, i)| i.launched.exited().is_none())
                .map(|(_, i)| i.launched.dialer.clone())
        });
        let dialer: Option<Dialer> = configured.or_else(|| {
            self.idle
                .lock()
                .ok()
                .and_then(|g| g.as_ref().map(|i| i.launched.dialer.clone()))
        });
        let Some(dialer) = dialer else {
            return Vec::new();
        };
        let (prior, prior_private, _) = split_prior(actual);
        let config = info.block.config(desired);
        let proposed = info.block.proposed(Some(&prior), &config);
        let encode = |v: &Value| cty::encode(v, &info.block.ty).map_err(|e| e.to_string());
        let request = match (encode(&Value::Object(prior)), encode(&proposed), encode(&config)) {
            (Ok(p), Ok(n), Ok(c)) => pb::PlanRequest {
                type_name: info.tf_name.clone(),
                prior_state: dv(p),
                proposed_new_state: dv(n),
                config: dv(c),
                prior_private,
            },
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                tracing::warn!(provider = %self.name, "replace_reasons: {e}");
                return Vec::new();
            }
        };
        let protocol = self.protocol;
        let result = lyra_plugin::block_on_own_thread(async {
            let channel = dialer.connect().await.map_err(|e| error_chain(&e))?;
            let rpc = Rpc::new(protocol, channel);
            let reply = rpc!(&rpc, plan_resource_change, plan_resource_change, request)
                .map_err(|s| status_text(&s))?
                .into_inner();
            if let Some(e) = errors(&reply.diagnostics) {
                return Err(e);
            }
            Ok(reply.requires_replace.iter().map(path_text).collect())
        });
        result.unwrap_or_else(|e| {
            tracing::warn!(provider = %self.name, "replace_reasons: {e}");
            Vec::new()
        })
    }

    async fn create(&self, cx: &OpContext<'_>, desired: &Map) -> Result<Created, ProviderError> {
        let info = Arc::clone(self.info(cx.type_name)?);
        let instance = self.instance(cx).await?;
        let actual = self.change(&instance, cx, &info, None, desired).await?;
        let external_id = actual
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .or_else(|| cx.idempotency_key.map(str::to_owned))
            .unwrap_or_else(|| cx.step_id.to_owned());
        Ok(Created { external_id, actual })
    }

    async fn read(
        &self,
        cx: &OpContext<'_>,
        external_id: &str,
        prior: Option<&Map>,
    ) -> Result<Option<Map>, ProviderError> {
        let info = Arc::clone(self.info(cx.type_name)?);
        let instance = self.instance(cx).await?;
        match prior {
            Some(prior) => {
                let (state, private, version) = split_prior(prior);
                let current = self.upgrade(&instance, cx, &info, &state, version).await?;
                self.read_state(&instance, cx, &info, current, private).await
            }
            // Only an id: what the provider imports under it.
            None => {
                let request = pb::ImportRequest {
                    type_name: info.tf_name.clone(),
                    id: external_id.to_owned(),
                };
                let reply = self
                    .call(&instance, cx, async {
                        rpc!(&instance.rpc, import_resource_state, import_resource_state, request)
                    })
                    .await?;
                self.check("importing", &info, &reply.diagnostics)?;
                let Some(found) = reply
                    .imported_resources
                    .into_iter()
                    .find(|r| r.type_name == info.tf_name)
                else {
                    return Ok(None);
                };
                let state = msgpack_of(found.state, &info.block.ty).map_err(|e| self.bad("its imported state", e))?;
                self.read_state(&instance, cx, &info, state, found.private).await
            }
        }
    }

    async fn update(
        &self,
        cx: &OpContext<'_>,
        _external_id: &str,
        desired: &Map,
        prior: &Map,
    ) -> Result<Map, ProviderError> {
        let info = Arc::clone(self.info(cx.type_name)?);
        let instance = self.instance(cx).await?;
        let (state, private, version) = split_prior(prior);
        let current = self.upgrade(&instance, cx, &info, &state, version).await?;
        let (upgraded, _) = cty::decode(&current, &info.block.ty).map_err(|e| self.bad("its upgraded state", e))?;
        let upgraded = match upgraded {
            Value::Object(m) => m,
            _ => state,
        };
        self.change(&instance, cx, &info, Some((current, upgraded, private)), desired)
            .await
    }

    async fn delete(&self, cx: &OpContext<'_>, _external_id: &str, prior: &Map) -> Result<(), ProviderError> {
        let info = Arc::clone(self.info(cx.type_name)?);
        let instance = self.instance(cx).await?;
        let (state, private, version) = split_prior(prior);
        let current = self.upgrade(&instance, cx, &info, &state, version).await?;
        // A destroy is an apply to a null state, with no configuration.
        let request = pb::ApplyRequest {
            type_name: info.tf_name.clone(),
            prior_state: dv(current),
            planned_state: dv(cty::null()),
            config: dv(cty::null()),
            planned_private: private,
        };
        let reply = self
            .call(&instance, cx, async {
                rpc!(&instance.rpc, apply_resource_change, apply_resource_change, request)
            })
            .await?;
        self.check("deleting", &info, &reply.diagnostics)
    }
}

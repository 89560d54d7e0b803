//! Validating admission webhooks, called as the apiserver calls them: after the server's own
//! admission (the object as it would be stored, defaults applied), for the webhooks of every
//! `ValidatingWebhookConfiguration` whose rules, namespace and object selectors match the
//! write, each with an `admission.k8s.io/v1` `AdmissionReview` over HTTPS verified against
//! its `caBundle`.
//!
//! Matching ([`calls`]) and the resolution of a webhook's Service to an address (its port's
//! `targetPort`, then the Service's Endpoints) read the store, under its lock; the calls
//! ([`run`]) are made without it, since a webhook may call back into the API.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::objects::{State, Subresource};
use crate::registry::{ResourceType, Special};
use crate::selectors::LabelSelector;

const GROUP: &str = "admissionregistration.k8s.io";
/// Where the configurations live in the store.
const VALIDATING: &str = "validatingwebhookconfigurations.admissionregistration.k8s.io";

/// What a webhook is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// A write as the webhooks see it: the request's attributes and its objects.
#[derive(Debug, Clone)]
pub struct Request {
    pub rt: Arc<ResourceType>,
    pub version: String,
    pub sub: Subresource,
    pub operation: Operation,
    pub namespace: String,
    pub name: String,
    /// The object as it would be stored (`None` for DELETE).
    pub object: Option<Arc<Value>>,
    pub old_object: Option<Arc<Value>>,
    pub dry_run: bool,
    /// `CreateOptions`, `UpdateOptions`, `PatchOptions` or `DeleteOptions`.
    pub options: Value,
    pub user: String,
}

impl Request {
    fn subresource(&self) -> &'static str {
        match self.sub {
            Subresource::Main => "",
            Subresource::Status => "status",
        }
    }
}

/// Where a webhook is served, once resolved.
#[derive(Debug, Clone)]
struct Target {
    /// The URL connected to: for a Service, its DNS name with the endpoint's port.
    url: String,
    /// For a Service, the name resolves to its endpoint (no DNS here).
    resolve: Option<(String, SocketAddr)>,
    /// PEM certificates; none means the system's roots.
    ca: Vec<u8>,
}

/// One webhook a write must be sent to, resolved under the store's lock.
#[derive(Debug, Clone)]
pub struct Call {
    name: String,
    /// The URL the apiserver's errors name: `https://<svc>.<ns>.svc:<port><path>?timeout=<n>s`.
    shown_url: String,
    /// Why it cannot be called, when its Service does not resolve.
    target: Result<Target, String>,
    timeout: Duration,
    /// `failurePolicy: Ignore`: a failed call lets the write through.
    ignore_failure: bool,
    /// The version the review is sent at (`matchPolicy: Equivalent` may pick another one
    /// of the kind's versions than the request's).
    version: String,
    /// A dry run may be sent only to webhooks without side effects.
    dry_run_refused: bool,
}

/// Whether any webhook configuration exists: when none does, a write is one step.
pub fn any(state: &State) -> bool {
    state.store.list(VALIDATING, None).next().is_some()
}

/// Whether `rt` is exempt: the apiserver never sends webhook configurations to webhooks, so
/// a broken webhook can always be removed.
fn exempt(rt: &ResourceType) -> bool {
    rt.group == GROUP
        && matches!(
            rt.plural.as_str(),
            "validatingwebhookconfigurations" | "mutatingwebhookconfigurations"
        )
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

/// Whether one of `rules` matches the request at `version`.
fn rules_match(rules: &Value, req: &Request, version: &str) -> bool {
    let rt = &req.rt;
    rules.as_array().into_iter().flatten().any(|rule| {
        let any_of = |field: &str, want: &str| strings(&rule[field]).any(|v| v == "*" || v == want);
        let resource = strings(&rule["resources"]).any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            (res == "*" || res == rt.plural) && (sub == "*" || sub == req.subresource())
        });
        // A Namespace is cluster-scoped, though its requests carry its name as namespace.
        let cluster = rt.special == Special::Namespace || req.namespace.is_empty();
        let scope = match rule["scope"].as_str() {
            Some("Namespaced") => !cluster,
            Some("Cluster") => cluster,
            _ => true,
        };
        any_of("operations", req.operation.as_str())
            && any_of("apiGroups", &rt.group)
            && any_of("apiVersions", version)
            && resource
            && scope
    })
}

fn selector_matches(selector: &Value, obj: &Value) -> bool {
    if selector.is_null() {
        return true;
    }
    // A selector that does not parse matches nothing, as the apiserver's conversion fails.
    LabelSelector::from_json(selector).is_ok_and(|s| s.matches(obj))
}

/// Where the Service `namespace/name` port `port` sends traffic: its `targetPort` on the
/// first address of its Endpoints (by port name, else number); an Endpoints object without
/// a Service gives its first port.
fn resolve_service(state: &State, namespace: &str, name: &str, port: i64) -> Result<SocketAddr, String> {
    let endpoints = state.store.get("endpoints", namespace, name);
    let (port_name, target) = match state.store.get("services", namespace, name) {
        Some(svc) => {
            let sp = svc["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["port"].as_i64() == Some(port))
                .ok_or_else(|| format!("service {namespace}/{name}:{port} has no port {port}"))?;
            let target = match &sp["targetPort"] {
                Value::Number(n) => n.as_i64(),
                Value::Null => Some(port),
                // A named target port: the endpoint's port of that name.
                _ => None,
            };
            (sp["name"].as_str().map(str::to_string), target)
        }
        None if endpoints.is_some() => (None, None),
        None => return Err(format!("service \"{name}\" not found")),
    };
    let endpoints = endpoints.ok_or_else(|| format!("endpoints \"{name}\" not found"))?;
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        let Some(ip) = subset["addresses"][0]["ip"].as_str() else {
            continue;
        };
        let ports: Vec<&Value> = subset["ports"].as_array().into_iter().flatten().collect();
        let by_name = port_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .and_then(|n| ports.iter().find(|p| p["name"] == n));
        let by_number = target.and_then(|t| ports.iter().find(|p| p["port"].as_i64() == Some(t)));
        let chosen = match (&port_name, target) {
            (None, None) => ports.first(),
            _ => by_name.or(by_number),
        };
        if let Some(p) = chosen
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        {
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("endpoints \"{name}\": invalid address {ip:?}"))?;
            return Ok(SocketAddr::new(ip, p));
        }
    }
    Err(format!("no endpoints available for service \"{name}\""))
}

/// The webhook's target and the URL its errors name.
fn target(state: &State, hook: &Value, timeout: u64) -> (String, Result<Target, String>) {
    let config = &hook["clientConfig"];
    let ca = config["caBundle"]
        .as_str()
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
        .transpose();
    let query = format!("timeout={timeout}s");
    if let Some(url) = config["url"].as_str() {
        let sep = if url.contains('?') { '&' } else { '?' };
        let shown = format!("{url}{sep}{query}");
        let t = ca.map_err(|e| format!("invalid caBundle: {e}")).map(|ca| Target {
            url: shown.clone(),
            resolve: None,
            ca: ca.unwrap_or_default(),
        });
        return (shown, t);
    }
    let svc = &config["service"];
    let (ns, name) = (
        svc["namespace"].as_str().unwrap_or_default(),
        svc["name"].as_str().unwrap_or_default(),
    );
    let port = svc["port"].as_i64().unwrap_or(443);
    let path = svc["path"].as_str().unwrap_or_default();
    let host = format!("{name}.{ns}.svc");
    let shown = format!("https://{host}:{port}{path}?{query}");
    let t = ca.map_err(|e| format!("invalid caBundle: {e}")).and_then(|ca| {
        let addr = resolve_service(state, ns, name, port)?;
        Ok(Target {
            url: format!("https://{host}:{}{path}?{query}", addr.port()),
            resolve: Some((host.clone(), addr)),
            ca: ca.unwrap_or_default(),
        })
    });
    (shown, t)
}

/// The validating webhooks `req` must be sent to, in the order of their configurations
/// (by name) and of the webhooks in each.
pub fn calls(state: &State, req: &Request) -> Vec<Call> {
    if exempt(&req.rt) {
        return Vec::new();
    }
    // What a namespaceSelector is matched against: the namespace's labels, or a Namespace's
    // own; cluster-scoped objects always match.
    let namespace_object: Option<Value> = if req.rt.special == Special::Namespace {
        req.object.as_deref().or(req.old_object.as_deref()).cloned()
    } else if req.namespace.is_empty() {
        None
    } else {
        Some(
            state
                .store
                .get("namespaces", "", &req.namespace)
                .map_or_else(|| json!({}), |n| (**n).clone()),
        )
    };
    let mut out = Vec::new();
    for config in state.store.list(VALIDATING, None) {
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            let exact = hook["matchPolicy"] == "Exact";
            let version = if rules_match(&hook["rules"], req, &req.version) {
                req.version.clone()
            } else if exact {
                continue;
            } else {
                match req
                    .rt
                    .versions
                    .iter()
                    .find(|v| rules_match(&hook["rules"], req, &v.name))
                {
                    Some(v) => v.name.clone(),
                    None => continue,
                }
            };
            if let Some(ns) = &namespace_object
                && !selector_matches(&hook["namespaceSelector"], ns)
            {
                continue;
            }
            let objects = [req.object.as_deref(), req.old_object.as_deref()];
            if !hook["objectSelector"].is_null()
                && !objects
                    .iter()
                    .flatten()
                    .any(|o| selector_matches(&hook["objectSelector"], o))
            {
                continue;
            }
            let timeout = hook["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30);
            let (shown_url, target) = target(state, hook, timeout);
            out.push(Call {
                name: hook["name"].as_str().unwrap_or_default().to_string(),
                shown_url,
                target,
                timeout: Duration::from_secs(timeout),
                ignore_failure: hook["failurePolicy"] == "Ignore",
                version,
                dry_run_refused: !matches!(hook["sideEffects"].as_str(), Some("None" | "NoneOnDryRun")),
            });
        }
    }
    out
}

/// The `AdmissionReview` sent to one webhook.
fn review(req: &Request, call: &Call, uid: &str) -> Value {
    let rt = &req.rt;
    let at = |version: &str| {
        (
            json!({"group": rt.group, "version": version, "kind": rt.kind}),
            json!({"group": rt.group, "version": version, "resource": rt.plural}),
        )
    };
    let (kind, resource) = at(&call.version);
    let (request_kind, request_resource) = at(&req.version);
    let object = |o: &Option<Arc<Value>>| match o {
        Some(o) => {
            let mut o = (**o).clone();
            o["apiVersion"] = json!(rt.api_version(&call.version));
            o
        }
        None => Value::Null,
    };
    let mut groups = vec![json!("system:authenticated")];
    if let Some(rest) = req.user.strip_prefix("system:serviceaccount:") {
        groups.insert(0, json!("system:serviceaccounts"));
        if let Some((ns, _)) = rest.split_once(':') {
            groups.insert(1, json!(format!("system:serviceaccounts:{ns}")));
        }
    } else if req.user == crate::audit::ANONYMOUS_ADMIN {
        groups.insert(0, json!("system:masters"));
    }
    let mut r = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": request_kind,
        "requestResource": request_resource,
        "name": req.name,
        "operation": req.operation.as_str(),
        "userInfo": {"username": req.user, "groups": groups},
        "object": object(&req.object),
        "oldObject": object(&req.old_object),
        "dryRun": req.dry_run,
        "options": req.options,
    });
    if !req.namespace.is_empty() && rt.special != Special::Namespace {
        r["namespace"] = json!(req.namespace);
    }
    if !req.subresource().is_empty() {
        r["subResource"] = json!(req.subresource());
        r["requestSubResource"] = json!(req.subresource());
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r})
}

/// A rustls configuration (ring's provider) trusting `ca`, or nothing when it is empty: the
/// system's roots, which are not consulted here.
fn tls_config(ca: &[u8]) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        let cert = cert.map_err(|e| format!("invalid caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("invalid caBundle: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Why a request failed, as its sources say (reqwest's own message repeats the URL).
fn cause(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)".into();
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

/// How one call went wrong: the apiserver words the two cases apart.
enum CallError {
    /// Connect, TLS, timeout, HTTP status, an unreadable body.
    Call(String),
    /// A response that does not answer the review.
    Invalid(String),
}

/// POSTs the review to the webhook and returns its `response`.
async fn post(call: &Call, body: &Value, uid: &str) -> Result<Value, CallError> {
    let target = call.target.clone().map_err(CallError::Call)?;
    let tls = tls_config(&target.ca).map_err(CallError::Call)?;
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(call.timeout)
        .no_proxy();
    if let Some((host, addr)) = &target.resolve {
        builder = builder.resolve(host, *addr);
    }
    let client = builder.build().map_err(|e| CallError::Call(cause(&e)))?;
    let resp = client
        .post(&target.url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| CallError::Call(format!("Post \"{}\": {}", call.shown_url, cause(&e))))?;
    let status = resp.status();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| CallError::Call(format!("Post \"{}\": {}", call.shown_url, cause(&e))))?;
    if !status.is_success() {
        return Err(CallError::Call(format!(
            "the server responded with the status code {} but did not return more information",
            status.as_u16()
        )));
    }
    let answer: Value = serde_json::from_slice(&bytes)
        .map_err(|e| CallError::Call(format!("the response is not an AdmissionReview: {e}")))?;
    let response = answer
        .get("response")
        .filter(|r| r.is_object())
        .ok_or_else(|| CallError::Invalid("webhook response was absent".into()))?;
    let got = response["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(CallError::Invalid(format!(
            "expected response.uid={uid:?}, got {got:?}"
        )));
    }
    Ok(response.clone())
}

/// The reasons a `Status` may carry (the error type keeps only static ones).
fn known_reason(reason: &str) -> &'static str {
    const REASONS: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    REASONS.iter().find(|r| **r == reason).copied().unwrap_or("")
}

/// The apiserver's refusal: `admission webhook "<name>" denied the request: <message>`.
fn denied(name: &str, response: &Value) -> ApiError {
    let status = &response["status"];
    let by = format!("admission webhook {name:?} denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{by}: {r}"),
        _ => format!("{by} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .filter(|c| (400..600).contains(c))
        .unwrap_or(400);
    let mut e = ApiError::new(
        u16::try_from(code).unwrap_or(400),
        known_reason(status["reason"].as_str().unwrap_or_default()),
        message,
    );
    if status["details"].is_object() {
        e.details = Some(status["details"].clone());
    }
    e
}

/// Sends `req` to every webhook in `calls`, at once, as the apiserver does; returns the
/// warnings they gave, or the refusal of the first (in order) that refused or failed under
/// `failurePolicy: Fail`.
pub async fn run(calls: Vec<Call>, req: &Request) -> Result<Vec<String>, ApiError> {
    if req.dry_run
        && let Some(c) = calls.iter().find(|c| c.dry_run_refused)
    {
        return Err(ApiError::bad_request(format!(
            "admission webhook {:?} does not support dry run",
            c.name
        )));
    }
    let answers = futures::future::join_all(calls.iter().map(|call| async move {
        let uid = uuid::Uuid::new_v4().to_string();
        post(call, &review(req, call, &uid), &uid).await
    }))
    .await;
    let mut warnings = Vec::new();
    for (call, answer) in calls.iter().zip(answers) {
        let why = match answer {
            Ok(response) => {
                warnings.extend(strings(&response["warnings"]).map(str::to_string));
                if response["allowed"] == true {
                    continue;
                }
                return Err(denied(&call.name, &response));
            }
            Err(CallError::Call(why)) => format!("failed to call webhook: {why}"),
            Err(CallError::Invalid(why)) => format!("received invalid webhook response: {why}"),
        };
        if call.ignore_failure {
            tracing::warn!(webhook = %call.name, "failed calling webhook, ignored: {why}");
            continue;
        }
        let message = format!("failed calling webhook {:?}: {why}", call.name);
        let mut e = ApiError::new(500, "InternalError", format!("Internal error occurred: {message}"));
        e.details = Some(json!({"causes": [{"message": message}]}));
        return Err(e);
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{WriteOptions, state_with_crd};

    fn request(s: &State, rt: &Arc<ResourceType>, ns: &str, op: Operation, sub: Subresource) -> Request {
        let obj = Arc::new(json!({"metadata": {"name": "a", "namespace": ns, "labels": {"tier": "web"}}}));
        let _ = s;
        Request {
            rt: rt.clone(),
            version: "v1".into(),
            sub,
            operation: op,
            namespace: ns.into(),
            name: "a".into(),
            object: (op != Operation::Delete).then(|| obj.clone()),
            old_object: (op != Operation::Create).then_some(obj),
            dry_run: false,
            options: json!({}),
            user: "admin".into(),
        }
    }

    fn configure(s: &mut State, hooks: Value) {
        let t = s.registry.find(GROUP, "v1", "validatingwebhookconfigurations").unwrap();
        let body = json!({"metadata": {"name": "hooks"}, "webhooks": hooks});
        s.create(&t, "v1", "", body, WriteOptions::default()).unwrap();
    }

    fn hook(name: &str, rules: Value, extra: Value) -> Value {
        let mut h = json!({"name": name, "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:1/x"}, "rules": rules});
        for (k, v) in extra.as_object().unwrap() {
            h[k] = v.clone();
        }
        h
    }

    fn names(calls: &[Call]) -> Vec<&str> {
        calls.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn rules_match_operations_groups_resources_subresources_and_scope() {
        let (mut s, wf) = state_with_crd();
        let g = "lyra.example.com";
        configure(
            &mut s,
            json!([
                hook(
                    "create",
                    json!([{"apiGroups": [g], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["workflows"]}]),
                    json!({})
                ),
                hook(
                    "all",
                    json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]),
                    json!({})
                ),
                hook(
                    "status",
                    json!([{"apiGroups": [g], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["workflows/status"]}]),
                    json!({})
                ),
                hook(
                    "everything",
                    json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*/*"]}]),
                    json!({})
                ),
                hook(
                    "cluster",
                    json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"], "scope": "Cluster"}]),
                    json!({})
                ),
                hook(
                    "other-version",
                    json!([{"apiGroups": [g], "apiVersions": ["v2"], "operations": ["*"], "resources": ["workflows"]}]),
                    json!({"matchPolicy": "Exact"})
                ),
            ]),
        );
        let create = request(&s, &wf, "default", Operation::Create, Subresource::Main);
        assert_eq!(names(&calls(&s, &create)), ["create", "all", "everything"]);
        let status = request(&s, &wf, "default", Operation::Update, Subresource::Status);
        assert_eq!(names(&calls(&s, &status)), ["status", "everything"]);
        let delete = request(&s, &wf, "default", Operation::Delete, Subresource::Main);
        assert_eq!(names(&calls(&s, &delete)), ["all", "everything"]);
        let ns = s.registry.find("", "v1", "namespaces").unwrap();
        let namespace = request(&s, &ns, "a", Operation::Create, Subresource::Main);
        assert_eq!(names(&calls(&s, &namespace)), ["all", "everything", "cluster"]);
        // The configurations themselves are never sent.
        let t = s.registry.find(GROUP, "v1", "validatingwebhookconfigurations").unwrap();
        assert!(calls(&s, &request(&s, &t, "", Operation::Delete, Subresource::Main)).is_empty());
    }

    #[test]
    fn selectors_match_namespace_and_object_labels() {
        let (mut s, wf) = state_with_crd();
        let all = json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]);
        let ns_type = s.registry.find("", "v1", "namespaces").unwrap();
        s.create(
            &ns_type,
            "v1",
            "",
            json!({"metadata": {"name": "team-a"}}),
            WriteOptions::default(),
        )
        .unwrap();
        configure(
            &mut s,
            json!([
                hook(
                    "team-a",
                    all.clone(),
                    json!({"namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]}})
                ),
                hook(
                    "web",
                    all.clone(),
                    json!({"objectSelector": {"matchLabels": {"tier": "web"}}})
                ),
                hook(
                    "db",
                    all.clone(),
                    json!({"objectSelector": {"matchLabels": {"tier": "db"}}})
                ),
                hook(
                    "not-default",
                    all,
                    json!({"namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["default"]}]}})
                ),
            ]),
        );
        let in_default = request(&s, &wf, "default", Operation::Create, Subresource::Main);
        assert_eq!(names(&calls(&s, &in_default)), ["web"]);
        let in_team = request(&s, &wf, "team-a", Operation::Create, Subresource::Main);
        assert_eq!(names(&calls(&s, &in_team)), ["team-a", "web", "not-default"]);
    }

    #[test]
    fn services_resolve_through_their_target_port_and_endpoints() {
        let (mut s, _) = state_with_crd();
        let o = WriteOptions::default();
        let svc = s.registry.find("", "v1", "services").unwrap();
        let ep = s.registry.find("", "v1", "endpoints").unwrap();
        let body = json!({"metadata": {"name": "hook"}, "spec": {"ports": [
            {"name": "metrics", "port": 80, "targetPort": 8080},
            {"name": "https-webhook", "port": 443, "targetPort": "https-webhook"}]}});
        s.create(&svc, "v1", "default", body, o).unwrap();
        assert_eq!(
            resolve_service(&s, "default", "hook", 443).unwrap_err(),
            "endpoints \"hook\" not found"
        );
        let body = json!({"metadata": {"name": "hook"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
            "ports": [{"name": "metrics", "port": 18080}, {"name": "https-webhook", "port": 18443}]}]});
        s.create(&ep, "v1", "default", body, o).unwrap();
        assert_eq!(resolve_service(&s, "default", "hook", 443).unwrap().port(), 18443);
        assert_eq!(resolve_service(&s, "default", "hook", 80).unwrap().port(), 18080);
        assert!(resolve_service(&s, "default", "hook", 9).is_err());
        // No Service, only Endpoints: their first port.
        let body = json!({"metadata": {"name": "bare"}, "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
            "ports": [{"port": 9443}]}]});
        s.create(&ep, "v1", "default", body, o).unwrap();
        assert_eq!(resolve_service(&s, "default", "bare", 443).unwrap().port(), 9443);
        assert_eq!(
            resolve_service(&s, "default", "none", 443).unwrap_err(),
            "service \"none\" not found"
        );
    }

    #[test]
    fn refusals_read_like_the_apiservers() {
        let e = denied(
            "v.lyra.dev",
            &json!({"allowed": false, "status": {"message": "no", "code": 403}}),
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (403, "admission webhook \"v.lyra.dev\" denied the request: no")
        );
        let e = denied(
            "v",
            &json!({"allowed": false, "status": {"reason": "Forbidden", "code": 200}}),
        );
        assert_eq!(
            (e.code, e.reason, e.message.as_str()),
            (
                400,
                "Forbidden",
                "admission webhook \"v\" denied the request: Forbidden"
            )
        );
        let e = denied("v", &json!({"allowed": false}));
        assert_eq!(
            e.message,
            "admission webhook \"v\" denied the request without explanation"
        );
    }
}

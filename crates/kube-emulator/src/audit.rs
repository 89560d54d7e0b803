//! Who asked what: every request, attributed to a user and described as RBAC sees it (verb,
//! API group, resource, subresource, namespace, name), so tests can compare what a client
//! does with the RBAC rules it is given.
//!
//! There is no authentication: a bearer token *is* the user's name
//! (`Authorization: Bearer system:serviceaccount:lyra-system:lyra`, as kube-rs sends it), and
//! `Impersonate-User` (`kubectl --as`) names the user the request acts as, as on a real
//! apiserver (impersonation is not checked); a request with neither is [`ANONYMOUS_ADMIN`],
//! the cluster admin the emulator's own kubeconfig stands for.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use axum::http::{HeaderMap, Method};

/// The user of a request without a bearer token.
pub const ANONYMOUS_ADMIN: &str = "admin";

/// One request, as the apiserver's authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// The bearer token, or [`ANONYMOUS_ADMIN`].
    pub user: String,
    /// As RBAC names it: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; for a non-resource request, the HTTP method in lower case. A
    /// server-side apply that creates its object is two records, `create` and `patch`: the
    /// apiserver authorizes it as both.
    pub verb: String,
    /// `""` for the core group (and for non-resource requests).
    pub api_group: String,
    pub api_version: String,
    /// The plural (`workflows`); empty for a non-resource request (discovery, `/openapi`,
    /// `/version`, health), whose [`path`](Self::path) says what it was.
    pub resource: String,
    /// `status`, or empty.
    pub subresource: String,
    /// Empty for cluster-scoped resources; a Namespace's own name for requests on it, as
    /// the authorizer sees them.
    pub namespace: String,
    /// Empty for lists, watches, creates and collection deletes.
    pub name: String,
    /// The URL path, without the query.
    pub path: String,
    /// The HTTP status of the answer (200 for a watch that started).
    pub code: u16,
}

impl AuditRecord {
    /// Whether this is a request on a resource (what RBAC `rules` with `resources` cover).
    pub fn is_resource_request(&self) -> bool {
        !self.resource.is_empty()
    }
}

/// The user a request is attributed to: an impersonated one (`kubectl --as`, which is how
/// kubectl names a user here: client-go sends no bearer token over plain HTTP), else the
/// bearer token's.
pub fn user(headers: &HeaderMap) -> String {
    if let Some(user) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    {
        return user.to_string();
    }
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map_or_else(|| ANONYMOUS_ADMIN.to_string(), str::to_string)
}

/// A request described as the apiserver's `RequestInfo` does.
pub fn describe(method: &Method, path: &str, params: &HashMap<String, String>, user: String, code: u16) -> AuditRecord {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut r = AuditRecord {
        user,
        verb: method.as_str().to_lowercase(),
        api_group: String::new(),
        api_version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        path: path.to_string(),
        code,
    };
    let (group, version, mut parts) = match segments.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return r,
    };
    if parts[0] == "namespaces" && parts.len() > 1 {
        r.namespace = parts[1].to_string();
        // `namespaces/<ns>/<resource>...` is namespaced; `namespaces/<ns>[/status|finalize]` is
        // the Namespace itself.
        if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
            parts = &parts[2..];
        }
    }
    r.api_group = group.to_string();
    r.api_version = version.to_string();
    r.resource = parts[0].to_string();
    r.name = parts.get(1).map(|s| s.to_string()).unwrap_or_default();
    r.subresource = parts.get(2).map(|s| s.to_string()).unwrap_or_default();
    let named = !r.name.is_empty();
    let watch = params.get("watch").is_some_and(|v| v == "true" || v == "1");
    r.verb = match (method.as_str(), named) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (other, _) => {
            return AuditRecord {
                verb: other.to_lowercase(),
                ..r
            };
        }
    }
    .to_string();
    // As the apiserver's RequestInfo: a list or watch of one name (`fieldSelector=
    // metadata.name=N`) is a request on that name, which `resourceNames` rules can allow.
    if matches!(r.verb.as_str(), "list" | "watch")
        && let Some(name) = params.get("fieldSelector").and_then(|s| selected_name(s))
    {
        r.name = name.to_string();
    }
    r
}

/// The name a field selector of exactly `metadata.name=N` (or `==`) selects.
fn selected_name(selector: &str) -> Option<&str> {
    if selector.contains(',') {
        return None;
    }
    let value = selector
        .strip_prefix("metadata.name==")
        .or_else(|| selector.strip_prefix("metadata.name="))?;
    (!value.is_empty()).then_some(value)
}

/// The records so far, oldest first, up to a capacity (the oldest are dropped beyond it).
#[derive(Debug)]
pub struct Log {
    records: Mutex<VecDeque<AuditRecord>>,
    capacity: usize,
}

impl Log {
    pub fn new(capacity: usize) -> Log {
        Log {
            records: Mutex::new(VecDeque::new()),
            capacity,
        }
    }

    pub fn push(&self, record: AuditRecord) {
        if self.capacity == 0 {
            return;
        }
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record);
    }

    pub fn all(&self) -> Vec<AuditRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().cloned().collect()
    }

    pub fn clear(&self) {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(method: Method, path: &str, query: &[(&str, &str)]) -> AuditRecord {
        let params = query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        describe(&method, path, &params, "u".into(), 200)
    }

    fn rbac(r: &AuditRecord) -> (&str, &str, &str, &str, &str, &str) {
        (
            &r.verb,
            &r.api_group,
            &r.resource,
            &r.subresource,
            &r.namespace,
            &r.name,
        )
    }

    #[test]
    fn requests_are_described_as_rbac_sees_them() {
        let wf = "/apis/lyra.dev/v1alpha1/namespaces/default/workflows";
        assert_eq!(
            rbac(&d(Method::GET, wf, &[])),
            ("list", "lyra.dev", "workflows", "", "default", "")
        );
        assert_eq!(rbac(&d(Method::GET, wf, &[("watch", "true")])).0, "watch");
        // A list or watch of one name is on that name, as resourceNames rules see it.
        let one = [("watch", "true"), ("fieldSelector", "metadata.name=hello")];
        assert_eq!(
            rbac(&d(Method::GET, wf, &one)),
            ("watch", "lyra.dev", "workflows", "", "default", "hello")
        );
        let two = [("fieldSelector", "metadata.name=hello,status.phase=Running")];
        assert_eq!(rbac(&d(Method::GET, wf, &two)).5, "");
        assert_eq!(rbac(&d(Method::POST, wf, &[])).0, "create");
        let status = format!("{wf}/hello/status");
        assert_eq!(
            rbac(&d(Method::PATCH, &status, &[])),
            ("patch", "lyra.dev", "workflows", "status", "default", "hello")
        );
        assert_eq!(rbac(&d(Method::DELETE, wf, &[])).0, "deletecollection");
        assert_eq!(
            rbac(&d(Method::PUT, "/api/v1/namespaces/team-a/finalize", &[])),
            ("update", "", "namespaces", "finalize", "team-a", "team-a")
        );
        assert_eq!(
            rbac(&d(Method::GET, "/api/v1/namespaces", &[])),
            ("list", "", "namespaces", "", "", "")
        );
        assert_eq!(
            rbac(&d(
                Method::DELETE,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x",
                &[]
            )),
            (
                "delete",
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "",
                "",
                "x"
            )
        );
        let discovery = d(Method::GET, "/apis/lyra.dev/v1alpha1", &[]);
        assert!(!discovery.is_resource_request());
        assert_eq!(
            (discovery.verb.as_str(), discovery.path.as_str()),
            ("get", "/apis/lyra.dev/v1alpha1")
        );
    }

    #[test]
    fn a_bearer_token_is_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(user(&h), ANONYMOUS_ADMIN);
        h.insert(
            "authorization",
            "Bearer system:serviceaccount:lyra-system:lyra".parse().unwrap(),
        );
        assert_eq!(user(&h), "system:serviceaccount:lyra-system:lyra");
    }
}

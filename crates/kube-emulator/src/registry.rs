//! The resource kinds the server serves: the built-in ones (`builtins`), plus one per
//! established CRD. A kind is served at every served version; objects are stored once, and a
//! version differs only by `apiVersion` (a CRD's `conversion: None`). `events.k8s.io` Events
//! are the exception: a view of the core Events' storage (see [`Storage`]).

use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::Value;

use crate::errors::{ApiError, FieldError};
use crate::schema::Schema;
use crate::schema::cel::Rules;
use crate::table::Column;

/// What a kind needs beyond plain storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    None,
    Namespace,
    Secret,
    Crd,
    /// Defaults clients read back (`replicas`, `strategy`).
    Deployment,
    /// A cluster IP, `type`, and each port's `protocol` and `targetPort`.
    Service,
}

/// Where a kind's objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Under the kind's own store key, as served.
    Own,
    /// As core `v1` Events, converted on every read and write: on a real apiserver
    /// `events.k8s.io/v1` Events are another API view of the same objects.
    CoreEvents,
}

/// One served version of a kind.
#[derive(Debug, Clone)]
pub struct Version {
    pub name: String,
    pub schema: Option<Arc<Schema>>,
    /// The CRD's `openAPIV3Schema` as written: published in `/openapi/v3` for `kubectl explain`.
    pub openapi: Option<Arc<Value>>,
    /// Its CEL rules, when it has any.
    pub rules: Option<Arc<Rules>>,
    pub columns: Vec<Column>,
}

/// A kind of object and everything the server needs to serve it.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    /// Served versions, most preferred first.
    pub versions: Vec<Version>,
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (custom resources and CRDs; not ConfigMaps).
    pub has_generation: bool,
    /// For kinds defined by a CRD, that CRD's uid: a watch ends when it changes.
    pub crd_uid: Option<String>,
    pub special: Special,
    pub storage: Storage,
}

impl ResourceType {
    /// The store key: `workflows.lyra.example.com`, `configmaps`.
    pub fn id(&self) -> String {
        crate::errors::qualified_resource(&self.group, &self.plural)
    }

    /// The store key its objects live under (another kind's, for a view of that kind).
    pub fn store_id(&self) -> String {
        match self.storage {
            Storage::Own => self.id(),
            Storage::CoreEvents => "events".into(),
        }
    }

    /// A stored object as this kind serves it.
    pub fn view(&self, stored: &Arc<Value>) -> Arc<Value> {
        match self.storage {
            Storage::Own => stored.clone(),
            Storage::CoreEvents => Arc::new(crate::events::to_events_v1(stored)),
        }
    }

    /// An object of this kind in its stored form.
    pub fn to_storage(&self, obj: Value) -> Value {
        match self.storage {
            Storage::Own => obj,
            Storage::CoreEvents => crate::events::to_core(&obj),
        }
    }

    pub fn version(&self, v: &str) -> Option<&Version> {
        self.versions.iter().find(|x| x.name == v)
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn not_found(&self, name: &str) -> ApiError {
        ApiError::not_found(&self.group, &self.plural, name)
    }

    pub fn invalid(&self, name: &str, errors: &[FieldError]) -> ApiError {
        ApiError::invalid(&self.group, &self.kind, name, errors)
    }
}

/// All served kinds.
#[derive(Debug, Clone)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
    /// The OpenAPI documents of `types`, cleared whenever they change.
    openapi: crate::openapi::Cache,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            types: crate::builtins::builtin_types().into_iter().map(Arc::new).collect(),
            openapi: crate::openapi::Cache::default(),
        }
    }
}

impl Registry {
    pub fn openapi_cache(&self) -> &crate::openapi::Cache {
        &self.openapi
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.version(version).is_some())
            .cloned()
    }

    pub fn by_id(&self, id: &str) -> Option<Arc<ResourceType>> {
        self.types.iter().find(|t| t.id() == id).cloned()
    }

    pub fn types(&self) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types.iter()
    }

    /// Adds or replaces (by group and plural) a CRD-defined kind.
    pub fn upsert(&mut self, t: ResourceType) {
        self.openapi.clear();
        let t = Arc::new(t);
        match self
            .types
            .iter_mut()
            .find(|x| x.group == t.group && x.plural == t.plural)
        {
            Some(slot) => *slot = t,
            None => self.types.push(t),
        }
    }

    pub fn remove(&mut self, id: &str) {
        self.openapi.clear();
        self.types.retain(|t| t.id() != id);
    }

    /// API groups (not the core group) with their versions, most preferred first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            let entry = match groups.iter_mut().position(|(g, _)| *g == t.group) {
                Some(i) => &mut groups[i].1,
                None => {
                    groups.push((t.group.clone(), Vec::new()));
                    &mut groups.last_mut().expect("just pushed").1
                }
            };
            for v in &t.versions {
                if !entry.contains(&v.name) {
                    entry.push(v.name.clone());
                }
            }
        }
        for (_, versions) in &mut groups {
            versions.sort_by(|a, b| version_priority(a, b));
        }
        groups
    }
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first, then
/// non-Kubernetes-style names alphabetically.
pub fn version_priority(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: u32 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 2, 0));
        }
        let (rank, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        Some((major, rank, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((ma, ra, na)), Some((mb, rb, nb))) => rb.cmp(&ra).then(mb.cmp(&ma)).then(nb.cmp(&na)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_like_kubernetes() {
        let mut vs = vec!["v1alpha1", "foo", "v1beta1", "v2", "v1", "v1beta2", "v10alpha1"];
        vs.sort_by(|a, b| version_priority(a, b));
        assert_eq!(
            vs,
            vec!["v2", "v1", "v1beta2", "v1beta1", "v10alpha1", "v1alpha1", "foo"]
        );
    }
}

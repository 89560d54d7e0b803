//! The `WorkflowDefinition` custom resource: a package registered as a Kubernetes kind of its
//! own. Wire types only; the reconciler that turns one into a CRD is [`crate::registrar`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::kind::DEFAULT_GROUP;

/// The finalizer on every definition: its CRD goes only once no instance is left.
pub const DEFINITION_FINALIZER: &str = "lyra.dev/registration";
/// `"true"` on a definition lets an upgrade through that breaks existing instances'
/// schema (a parameter removed, a type changed, a required one added...).
pub const ALLOW_BREAKING: &str = "lyra.dev/allow-breaking";

/// A workflow package registered as a Kubernetes kind: the controller generates a CRD whose
/// `spec` is the workflow's parameters, and applies every object of that kind.
// Clippy reads the repeated `printcolumn(type_ = ...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "lyra.dev",
    version = "v1alpha1",
    kind = "WorkflowDefinition",
    plural = "workflowdefinitions",
    singular = "workflowdefinition",
    shortname = "wfd",
    category = "lyra",
    status = "WorkflowDefinitionStatus",
    doc = "A Lyra workflow package registered as a Kubernetes kind of its own.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Instances", type_ = "integer", json_path = ".status.instances"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDefinitionSpec {
    /// The package: `oci://HOST/REPO@sha256:…` (a tag is resolved to a digest once, at
    /// registration; see `status.package`).
    #[schemars(length(min = 1))]
    pub package: String,
    /// The generated kind, e.g. `WebApp`.
    #[schemars(regex(pattern = r"^[A-Z][A-Za-z0-9]{0,62}$"))]
    pub kind: String,
    /// Its plural, lowercase (`webapps`): the CRD is `<plural>.<group>`.
    #[schemars(regex(pattern = r"^[a-z][a-z0-9]{0,62}$"))]
    pub plural: String,
    /// Default: the kind in lowercase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub singular: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_names: Vec<String>,
    /// Categories besides `lyra`, which every generated kind is in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// Default: `workflows.lyra.dev`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl WorkflowDefinitionSpec {
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or(DEFAULT_GROUP)
    }

    /// The generated CRD's name.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group())
    }
}

/// What the controller registered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDefinitionStatus {
    /// `Ready` (the CRD is established and its objects are applied) and `Stalled` (the
    /// package is invalid, the kind is taken, or the upgrade breaks instances).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The package reference pinned by digest, as registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// The package's digest (`sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The package's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The generated CRD, `<plural>.<group>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_name: Option<String>,
    /// Objects of the generated kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<i32>,
    /// One line for people: what is happening or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schema_change: Option<SchemaChangeSummary>,
    /// The breaking changes that stopped the last upgrade, one per line (empty once it
    /// went through).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breaking_changes: Vec<String>,
}

/// The last schema change applied to the generated CRD.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaChangeSummary {
    pub time: Time,
    /// The digest the change came from.
    pub from_digest: Option<String>,
    pub to_digest: String,
    /// `path: what changed`, one per change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

/// Conditions as a map keyed by type, so server-side apply merges them per type.
fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// Whether the definition allows breaking changes.
pub fn allows_breaking(def: &WorkflowDefinition) -> bool {
    def.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOW_BREAKING))
        .is_some_and(|v| v == "true")
}

/// The WorkflowDefinition CRD.
pub fn crd() -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    WorkflowDefinition::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_scoped_with_short_name_and_category() {
        let crd = crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("workflowdefinitions.lyra.dev"));
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["wfd".to_owned()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["lyra".to_owned()]));
        let json = serde_json::to_string(&crd).unwrap();
        assert!(!json.contains("uint"), "unsigned formats upset apiservers");
    }

    #[test]
    fn group_defaults_and_crd_name() {
        let spec: WorkflowDefinitionSpec = serde_json::from_value(
            serde_json::json!({"package": "oci://r/x@sha256:0", "kind": "WebApp", "plural": "webapps"}),
        )
        .unwrap();
        assert_eq!(spec.crd_name(), "webapps.workflows.lyra.dev");
        let spec = WorkflowDefinitionSpec {
            group: Some("apps.example.com".into()),
            ..spec
        };
        assert_eq!(spec.crd_name(), "webapps.apps.example.com");
    }
}

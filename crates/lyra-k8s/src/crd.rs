//! The `Workflow` custom resource: wire types only. The engine's types never appear here, so
//! the CRD can evolve (additively, within `v1alpha1`) without touching the engine and the
//! other way round. Integers are signed: schemars renders unsigned ones with `uint` formats
//! that apiservers warn about.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::free::FreeForm;

/// Added to every Workflow; released only when its resources are gone (or forgotten).
pub const FINALIZER: &str = "lyra.dev/cleanup";
/// Changing this annotation's value asks for a run; the value handled last is echoed in
/// `status.lastHandledReconcileAt`.
pub const RECONCILE_REQUESTED_AT: &str = "lyra.dev/reconcile-requested-at";
/// With `approval: Manual`, the hash of the plan (`status.plan.hash`) a person approved: the
/// controller applies only while it equals the hash of the plan computed now.
pub const APPROVE_PLAN: &str = "lyra.dev/approve-plan";
/// The condition that says a plan waits for approval (`approval: Manual`).
pub const AWAITING_APPROVAL: &str = "AwaitingApproval";

/// A Lyra workflow deployed to the cluster: the controller applies it and keeps it applied.
// Clippy reads the repeated `printcolumn(type_ = ...)` arguments as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "lyra.dev",
    version = "v1alpha1",
    kind = "Workflow",
    plural = "workflows",
    singular = "workflow",
    namespaced,
    shortname = "wf",
    category = "lyra",
    status = "WorkflowStatus",
    doc = "A Lyra workflow deployed as a Kubernetes object: the controller applies it with the shared state and keeps it applied.",
    printcolumn(
        name = "Workflow",
        type_ = "string",
        json_path = ".status.workflow",
        description = "The workflow applied"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Steps",
        type_ = "string",
        json_path = ".status.progress",
        description = "Steps done / total"
    ),
    printcolumn(
        name = "Approval",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"AwaitingApproval\")].reason",
        description = "With approval Manual: PlanReady (a plan awaits approval), ApprovalStale, Approved"
    ),
    printcolumn(
        name = "Drifted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drifted\")].status"
    ),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 0),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("has(self.workflowName) != has(self.workflow)").message("set exactly one of workflowName and workflow"))]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpec {
    /// The workflow to apply, by name on the controller's load path (`a::b` is `a/b.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub workflow_name: Option<String>,
    /// The workflow itself, embedded as a YAML object (what a workflow file would hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_object")]
    pub workflow: Option<FreeForm>,
    /// Data for the workflow's lookups: nested values, and flat dotted keys
    /// (`aws.tags.Name: x`) as the original Lyra took them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_object")]
    pub data: Option<FreeForm>,
    /// Re-apply this often (e.g. `60s`, `5m`, `1h30m`) to correct drift. Default: only when
    /// the object changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub refresh_interval: Option<String>,
    /// What deleting this object does to the resources: `Delete` them (default) or `Orphan`
    /// them (leave them, and forget them).
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// While true, nothing is applied. Deleting the object still cleans up.
    #[serde(default)]
    pub suspend: bool,
    /// `Automatic` (default): changes are applied as they come. `Manual`: the plan is
    /// published in `status.plan` and applied only once the object's `lyra.dev/approve-plan`
    /// annotation holds its hash (`lyra approve`). Deletion is never gated.
    #[serde(default)]
    pub approval: Approval,
    /// What a refresh (`refreshInterval`, the spec unchanged) does about resources that
    /// changed outside Lyra: `Correct` them (default: the refresh applies), `Report` them
    /// (the `Drifted` condition, an event and a metric; nothing is changed until the spec
    /// changes or the policy becomes `Correct`), or `Ignore` them (a refresh does nothing).
    #[serde(default)]
    pub drift_policy: DriftPolicy,
}

/// What a refresh does about drift (resources changed outside Lyra).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DriftPolicy {
    #[default]
    Correct,
    Report,
    Ignore,
}

/// Whether a plan that changes something is applied at once or waits for a person.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Approval {
    #[default]
    Automatic,
    Manual,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Delete,
    Orphan,
}

/// Where a Workflow is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Seen, not run yet (or suspended before the first run).
    Pending,
    /// A run is in progress.
    Applying,
    /// The last apply succeeded for the current spec.
    Ready,
    /// The last apply failed, or the input is invalid.
    Failed,
    /// The object is being deleted and its resources torn down.
    Deleting,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Pending,
        Phase::Applying,
        Phase::Ready,
        Phase::Failed,
        Phase::Deleting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Applying => "Applying",
            Phase::Ready => "Ready",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

/// What the controller last observed and did.
// The default makes a new object read `observedGeneration: 0` until the controller has seen
// it: kstatus (Helm 4's `--wait`, Flux, Argo) calls an object without a status Current, so
// without it `helm install --wait` would return before the first run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("default" = {"observedGeneration": 0}))]
pub struct WorkflowStatus {
    /// `Ready`, `Reconciling` and `Stalled`, kstatus style, each with `observedGeneration`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions")]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The workflow applied (its name; an inline workflow is named after the object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    /// The package digest the last successful apply ran (objects of registered kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The state key of the deployment: `k8s/<namespace>/<name>`
    /// (`k8s/<namespace>/<plural>.<group>/<name>` for a registered kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// One line for people: what is happening or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Resource steps done / total, e.g. `3/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// One row per resource step of the last run, sorted by name (failed ones first when
    /// they do not all fit in the status; see `stepsOmitted`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepStatus>,
    /// How many step rows were left out to keep the status small (`lyra state show` has
    /// every resource).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steps_omitted: i32,
    /// The workflow's returns after the last successful apply; secrets show as `(sensitive)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_object")]
    pub returns: Option<Value>,
    /// Returns left out of `returns` to keep the status small, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returns_omitted: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunSummary>,
    /// Who holds the deployment's lease while a run is in progress (or, when a run was
    /// refused, who held it then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_holder: Option<String>,
    /// The value of the `lyra.dev/reconcile-requested-at` annotation last acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handled_reconcile_at: Option<String>,
    /// With `approval: Manual`: the plan that waits for approval (absent when none does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// With `approval: Manual`: the hash of the last approved plan that was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_plan: Option<String>,
}

/// A plan waiting for approval. Secret values show as `(sensitive)`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// `sha256:<hex>`: approve by setting the `lyra.dev/approve-plan` annotation to it.
    pub hash: String,
    /// The generation the plan was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// `2 to create, 1 to update, 0 to replace, 0 to delete, 3 unchanged`.
    pub summary: String,
    #[serde(default)]
    pub create: i32,
    #[serde(default)]
    pub update: i32,
    #[serde(default)]
    pub replace: i32,
    #[serde(default)]
    pub delete: i32,
    #[serde(default)]
    pub unchanged: i32,
    /// One entry per step the plan changes, by step id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<PlanChange>,
    /// Changes left out to keep the status small (the hash covers them all).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub changes_omitted: i32,
}

/// What the plan does to one step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanChange {
    /// The step's id in the deployment (`appServers/1`).
    pub step: String,
    /// Resource type, `Ns::Type`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// `create`, `update`, `replace`, `delete`, `forget`.
    pub action: String,
    /// The attributes that change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<PlanAttribute>,
}

/// One attribute (or a path into one) that changes; values as JSON text.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanAttribute {
    /// `attribute`, or a path into it (`config.name`).
    pub path: String,
    /// Absent: the attribute is not set now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<String>,
    /// Absent: known only after apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forces_replace: bool,
}

/// One resource step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepStatus {
    /// The step's id in the deployment (`appServers/1`).
    pub name: String,
    /// Resource type, `Ns::Type`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// `create`, `update`, `replace`, `read`, `no-op`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_action: Option<String>,
    /// `done`, `failed`, `skipped`, `guarded-off`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Runs that tried this step since it last succeeded, that success included.
    #[serde(default)]
    pub attempts: i32,
}

/// The last run, as recorded in the state's history (`lyra history k8s/<ns>/<name>`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// The run's id in the state history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    /// `apply` or `delete`.
    pub operation: String,
    /// `succeeded`, `failed` or `cancelled`.
    pub outcome: String,
    /// When it finished.
    pub time: Time,
    /// What changed: `created 2, updated 1, deleted 0, unchanged 3, failed 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn free_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Conditions as a map keyed by type, so server-side apply merges them per type.
fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// Every Lyra CRD (`Workflow`, `WorkflowDefinition`), as `lyra crd` installs them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Workflow::crd(), crate::definition::crd()]
}

/// Every CRD as one JSON `List`, as `lyra crd -o json` prints it (`kubectl apply -f` takes it).
pub fn crd_json() -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": crds()})
}

/// Every CRD as YAML documents, as committed in `crds/lyra.yaml` and printed by `lyra crd`.
pub fn crd_yaml() -> String {
    let mut out = String::from(
        "# Generated from the Rust types in crates/lyra-k8s/src/{crd,definition}.rs; regenerate with\n\
         # `cargo run -q -p lyra-cli -- crd > crates/lyra-k8s/crds/lyra.yaml`.\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("a CRD serializes to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_is_current() {
        let committed = include_str!("../crds/lyra.yaml");
        assert!(
            committed == crd_yaml(),
            "crates/lyra-k8s/crds/lyra.yaml is stale; regenerate it with\n  \
             cargo run -q -p lyra-cli -- crd > crates/lyra-k8s/crds/lyra.yaml"
        );
    }

    #[test]
    fn crd_names_scope_and_columns() {
        let crd = Workflow::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("workflows.lyra.dev"));
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.short_names, Some(vec!["wf".to_owned()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["lyra".to_owned()]));
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        let columns: Vec<&str> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Workflow", "Phase", "Ready", "Steps", "Approval", "Drifted", "Message", "Age"
            ]
        );
    }

    #[test]
    fn schema_has_no_unsigned_formats_and_checks_the_workflow_choice() {
        let json = serde_json::to_string(&Workflow::crd()).unwrap();
        assert!(!json.contains("uint"), "unsigned formats upset apiservers");
        assert!(json.contains("has(self.workflowName) != has(self.workflow)"));
        assert!(json.contains("x-kubernetes-preserve-unknown-fields"));
    }

    #[test]
    fn spec_reads_nested_and_dotted_data_and_defaults() {
        let wf: Workflow = serde_json::from_value(serde_json::json!({
            "apiVersion": "lyra.dev/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"workflowName": "webapp", "data": {"webapp": {"replicas": 2}, "aws.tags.Name": "x"}}
        }))
        .unwrap();
        assert_eq!(wf.spec.deletion_policy, DeletionPolicy::Delete);
        assert!(!wf.spec.suspend);
        assert_eq!(wf.spec.approval, Approval::Automatic);
        assert_eq!(wf.spec.refresh_interval, None);
        assert_eq!(
            wf.spec.data.as_ref().unwrap().value("spec.data").unwrap()["aws.tags.Name"],
            "x"
        );
        // Unset fields are left out, so status and spec patches never write nulls.
        let back = serde_json::to_value(&wf.spec).unwrap();
        assert!(back.get("workflow").is_none());
        assert!(
            serde_json::to_value(WorkflowStatus::default())
                .unwrap()
                .as_object()
                .unwrap()
                .is_empty()
        );
    }
}

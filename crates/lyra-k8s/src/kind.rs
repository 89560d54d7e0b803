//! Registered kinds: a workflow's top-level parameters as the typed `spec` of a CRD of its
//! own (`kind: WebApp`), how a later version's schema differs from the one served, and how
//! an instance's spec becomes the engine's data.
//!
//! Everything here is a pure function of the workflow model and JSON: the controller and
//! `lyra register --dry-run` compute the same CRD and the same changes.
//!
//! Mapping (Lyra type → OpenAPI v3, structural as apiextensions.k8s.io/v1 requires):
//! `String` → string; `Integer[min, max]` → integer (int64) with its bounds; `Float` and
//! `Numeric` → number; `Boolean` → boolean; `Enum[..]` → string enum; `Array[T]` → array;
//! `Hash[K, V]` → object with `additionalProperties`; `Struct` → object with properties;
//! `Optional[T]` → T, nullable and not required; `Variant[Integer, String]` → int-or-string;
//! `Any`, other variants and untyped parameters → preserved unknown fields. A `Sensitive`
//! parameter is never inline: its field is `{secretKeyRef: {name, key}}`, read from a Secret
//! in the instance's namespace. A parameter is required unless it is `Optional` or has a
//! `default`; its `doc` is the field's description.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSON, JSONSchemaProps, JSONSchemaPropsOrArray,
    JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use lyra_core::model::{ParamSource, Workflow};
use lyra_core::types::Type;
use serde_json::{Map, Value, json};

use crate::crd::{Approval, DeletionPolicy, DriftPolicy};

/// The spec key that holds Lyra's own settings (deletion policy, suspend, approval, refresh interval)
/// in every registered kind; no parameter may take it.
pub const SETTINGS_KEY: &str = "lyra";
/// The API group of registered kinds unless their definition names another.
pub const DEFAULT_GROUP: &str = "workflows.lyra.dev";
/// The one version a registered kind is served at.
pub const VERSION: &str = "v1alpha1";
/// On a generated CRD: the `WorkflowDefinition` that owns it. An annotation, not an owner
/// reference: deleting the definition must never cascade to the CRD and its instances.
pub const DEFINITION_ANNOTATION: &str = "lyra.dev/definition";
/// On a generated CRD: the digest and version of the package it was generated from.
pub const DIGEST_ANNOTATION: &str = "lyra.dev/package-digest";
pub const PACKAGE_VERSION_ANNOTATION: &str = "lyra.dev/package-version";

/// The names of a registered kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindNames {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
}

impl KindNames {
    /// Names for `kind` in `group` (default [`DEFAULT_GROUP`]): plural and singular are the
    /// kind in lower case (plus `s` for the plural) unless given.
    pub fn new(kind: &str, group: Option<&str>) -> KindNames {
        let lower = kind.to_ascii_lowercase();
        KindNames {
            group: group.unwrap_or(DEFAULT_GROUP).to_owned(),
            version: VERSION.to_owned(),
            kind: kind.to_owned(),
            plural: plural_of(&lower),
            singular: lower,
            short_names: Vec::new(),
            categories: vec!["lyra".to_owned()],
        }
    }

    /// `<plural>.<group>`, the CRD's name.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

/// English plurals for the common endings; a definition can always name its own.
fn plural_of(lower: &str) -> String {
    if lower.ends_with('s') || lower.ends_with('x') || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

/// The package a CRD was generated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageInfo {
    /// The `WorkflowDefinition`'s name.
    pub definition: String,
    /// `sha256:…`, the OCI manifest digest.
    pub digest: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KindError {
    #[error(
        "parameter '{0}' is named '{SETTINGS_KEY}', which every registered kind keeps for Lyra's own settings (spec.{SETTINGS_KEY}); rename the parameter"
    )]
    Reserved(String),
    #[error(
        "parameter '{param}' has a Sensitive value inside a {within}: only a whole parameter can come from a Secret; make it a parameter of its own"
    )]
    NestedSensitive { param: String, within: &'static str },
    #[error(
        "kind {0:?} is not a valid kind name: it must start with an upper-case ASCII letter and hold only ASCII letters and digits"
    )]
    BadKind(String),
}

/// The OpenAPI schema of a registered kind's `spec` for `workflow`'s top-level parameters.
pub fn spec_schema(workflow: &Workflow) -> Result<JSONSchemaProps, KindError> {
    let mut properties = BTreeMap::new();
    let mut required = Vec::new();
    for p in spec_params(workflow) {
        if p.name == SETTINGS_KEY {
            return Err(KindError::Reserved(p.name.clone()));
        }
        let ty = p.ty.clone().unwrap_or(Type::Any);
        let mut schema = match &ty {
            Type::Sensitive(_) => secret_ref_schema(),
            _ => type_schema(&ty, &p.name)?,
        };
        // A default of a secret would put it in the CRD for anyone to read.
        if let (Some(d), false) = (&p.default, ty.is_sensitive()) {
            schema.default = Some(JSON(d.clone()));
        }
        if let Some(doc) = &p.doc {
            schema.description = Some(doc.clone());
        }
        if !matches!(ty, Type::Optional(_)) && p.default.is_none() {
            required.push(p.name.clone());
        }
        properties.insert(p.name.clone(), schema);
    }
    properties.insert(SETTINGS_KEY.to_owned(), settings_schema());
    Ok(JSONSchemaProps {
        type_: Some("object".to_owned()),
        description: Some(format!(
            "The workflow's parameters, by name; Lyra's own settings are under `{SETTINGS_KEY}`."
        )),
        properties: Some(properties),
        required: (!required.is_empty()).then_some(required),
        ..Default::default()
    })
}

/// The top-level parameters that take their value from the data (and so from the spec): a
/// parameter with a `value` is a constant of the workflow, not an input.
fn spec_params(workflow: &Workflow) -> impl Iterator<Item = &lyra_core::model::Param> {
    workflow
        .root
        .params
        .iter()
        .filter(|p| !matches!(p.source, ParamSource::Value(_)))
}

fn object(properties: BTreeMap<String, JSONSchemaProps>, required: Vec<String>) -> JSONSchemaProps {
    JSONSchemaProps {
        type_: Some("object".to_owned()),
        properties: Some(properties),
        required: (!required.is_empty()).then_some(required),
        ..Default::default()
    }
}

fn string(description: &str) -> JSONSchemaProps {
    JSONSchemaProps {
        type_: Some("string".to_owned()),
        description: Some(description.to_owned()),
        ..Default::default()
    }
}

fn secret_ref_schema() -> JSONSchemaProps {
    let key_ref = object(
        BTreeMap::from([
            (
                "name".to_owned(),
                JSONSchemaProps {
                    min_length: Some(1),
                    ..string("The Secret's name, in the instance's namespace.")
                },
            ),
            (
                "key".to_owned(),
                JSONSchemaProps {
                    min_length: Some(1),
                    ..string("The key in the Secret's data.")
                },
            ),
        ]),
        vec!["name".to_owned(), "key".to_owned()],
    );
    let mut schema = object(
        BTreeMap::from([(
            "secretKeyRef".to_owned(),
            JSONSchemaProps {
                description: Some("A sensitive value is read from a Secret, never written inline.".to_owned()),
                ..key_ref
            },
        )]),
        vec!["secretKeyRef".to_owned()],
    );
    schema.description = Some("Sensitive: read from a Secret.".to_owned());
    schema
}

fn settings_schema() -> JSONSchemaProps {
    let mut schema = object(
        BTreeMap::from([
            (
                "deletionPolicy".to_owned(),
                JSONSchemaProps {
                    enum_: Some(vec![JSON(json!("Delete")), JSON(json!("Orphan"))]),
                    ..string(
                        "What deleting this object does to the resources: `Delete` them (default) or `Orphan` them.",
                    )
                },
            ),
            (
                "suspend".to_owned(),
                JSONSchemaProps {
                    type_: Some("boolean".to_owned()),
                    description: Some(
                        "While true, nothing is applied. Deleting the object still cleans up.".to_owned(),
                    ),
                    ..Default::default()
                },
            ),
            (
                "approval".to_owned(),
                JSONSchemaProps {
                    enum_: Some(vec![JSON(json!("Automatic")), JSON(json!("Manual"))]),
                    ..string(
                        "`Automatic` (default): changes are applied as they come. `Manual`: the plan waits in `status.plan` until the `lyra.dev/approve-plan` annotation holds its hash (`lyra approve`). Deletion is never gated.",
                    )
                },
            ),
            (
                "driftPolicy".to_owned(),
                JSONSchemaProps {
                    enum_: Some(vec![
                        JSON(json!("Correct")),
                        JSON(json!("Report")),
                        JSON(json!("Ignore")),
                    ]),
                    ..string(
                        "What a refresh does about resources changed outside Lyra: `Correct` them (default), `Report` them (the `Drifted` condition, an event, a metric; nothing changed), or `Ignore` them.",
                    )
                },
            ),
            (
                "refreshInterval".to_owned(),
                JSONSchemaProps {
                    pattern: Some(r"^([0-9]+(ms|s|m|h))+$".to_owned()),
                    ..string("Re-apply this often (e.g. `5m`) to correct drift. Default: only when the object changes.")
                },
            ),
        ]),
        Vec::new(),
    );
    schema.description = Some("Lyra's own settings for this object.".to_owned());
    schema
}

/// The schema of a value of type `ty` (inside parameter `param`, for errors).
fn type_schema(ty: &Type, param: &str) -> Result<JSONSchemaProps, KindError> {
    let typed = |t: &str| JSONSchemaProps {
        type_: Some(t.to_owned()),
        ..Default::default()
    };
    Ok(match ty {
        Type::String => typed("string"),
        Type::Integer { min, max } => JSONSchemaProps {
            format: Some("int64".to_owned()),
            minimum: min.map(|m| m as f64),
            maximum: max.map(|m| m as f64),
            ..typed("integer")
        },
        Type::Float | Type::Numeric => typed("number"),
        Type::Boolean => typed("boolean"),
        Type::Enum(values) => JSONSchemaProps {
            enum_: Some(values.iter().map(|v| JSON(json!(v))).collect()),
            ..typed("string")
        },
        Type::Array(item) => JSONSchemaProps {
            items: Some(JSONSchemaPropsOrArray::Schema(Box::new(inner(item, param, "list")?))),
            ..typed("array")
        },
        Type::Hash(_, value) => JSONSchemaProps {
            additional_properties: Some(JSONSchemaPropsOrBool::Schema(Box::new(inner(value, param, "hash")?))),
            ..typed("object")
        },
        Type::Struct(fields) => {
            let mut properties = BTreeMap::new();
            let mut required = Vec::new();
            for f in fields {
                properties.insert(f.name.clone(), inner(&f.ty, param, "structure")?);
                if !f.optional && !matches!(f.ty, Type::Optional(_)) {
                    required.push(f.name.clone());
                }
            }
            object(properties, required)
        }
        Type::Optional(t) => JSONSchemaProps {
            nullable: Some(true),
            ..type_schema(t, param)?
        },
        Type::Variant(ts)
            if ts.len() == 2
                && ts.iter().any(|t| matches!(t, Type::Integer { min: None, max: None }))
                && ts.iter().any(|t| matches!(t, Type::String)) =>
        {
            JSONSchemaProps {
                x_kubernetes_int_or_string: Some(true),
                ..Default::default()
            }
        }
        Type::Any | Type::Variant(_) => JSONSchemaProps {
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..Default::default()
        },
        Type::Sensitive(_) => secret_ref_schema(),
    })
}

fn inner(ty: &Type, param: &str, within: &'static str) -> Result<JSONSchemaProps, KindError> {
    if ty.is_sensitive() {
        return Err(KindError::NestedSensitive {
            param: param.to_owned(),
            within,
        });
    }
    type_schema(ty, param)
}

/// The CRD a registered kind is served by: namespaced, one version, the typed spec, the same
/// status and printer columns as `Workflow`, annotated with its definition and package.
pub fn generate_crd(
    names: &KindNames,
    workflow: &Workflow,
    package: &PackageInfo,
) -> Result<CustomResourceDefinition, KindError> {
    if !valid_kind(&names.kind) {
        return Err(KindError::BadKind(names.kind.clone()));
    }
    let spec = spec_schema(workflow)?;
    let root = object(
        BTreeMap::from([
            ("apiVersion".to_owned(), typed_string()),
            ("kind".to_owned(), typed_string()),
            (
                "metadata".to_owned(),
                JSONSchemaProps {
                    type_: Some("object".to_owned()),
                    ..Default::default()
                },
            ),
            ("spec".to_owned(), spec),
            ("status".to_owned(), workflow_status_schema()),
        ]),
        vec!["spec".to_owned()],
    );
    let root = JSONSchemaProps {
        description: Some(format!(
            "A {} deployed by Lyra from the workflow package {} {} ({}).",
            names.kind, workflow.name, package.version, package.digest
        )),
        ..root
    };
    let column = |name: &str, type_: &str, path: &str, description: &str| CustomResourceColumnDefinition {
        name: name.to_owned(),
        type_: type_.to_owned(),
        json_path: path.to_owned(),
        description: (!description.is_empty()).then(|| description.to_owned()),
        ..Default::default()
    };
    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(names.crd_name()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                crate::controller::MANAGER.to_owned(),
            )])),
            annotations: Some(BTreeMap::from([
                (DEFINITION_ANNOTATION.to_owned(), package.definition.clone()),
                (DIGEST_ANNOTATION.to_owned(), package.digest.clone()),
                (PACKAGE_VERSION_ANNOTATION.to_owned(), package.version.clone()),
            ])),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: names.group.clone(),
            names: CustomResourceDefinitionNames {
                kind: names.kind.clone(),
                plural: names.plural.clone(),
                singular: Some(names.singular.clone()),
                short_names: (!names.short_names.is_empty()).then(|| names.short_names.clone()),
                categories: (!names.categories.is_empty()).then(|| names.categories.clone()),
                list_kind: Some(format!("{}List", names.kind)),
            },
            scope: "Namespaced".to_owned(),
            versions: vec![CustomResourceDefinitionVersion {
                name: names.version.clone(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(root),
                }),
                subresources: Some(CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(json!({}))),
                    ..Default::default()
                }),
                additional_printer_columns: Some(vec![
                    column("Phase", "string", ".status.phase", ""),
                    column("Ready", "string", ".status.conditions[?(@.type==\"Ready\")].status", ""),
                    column("Steps", "string", ".status.progress", "Steps done / total"),
                    column(
                        "Approval",
                        "string",
                        ".status.conditions[?(@.type==\"AwaitingApproval\")].reason",
                        "With approval Manual: PlanReady (a plan awaits approval), ApprovalStale, Approved",
                    ),
                    column(
                        "Drifted",
                        "string",
                        ".status.conditions[?(@.type==\"Drifted\")].status",
                        "With driftPolicy Report: whether a resource changed outside Lyra",
                    ),
                    column("Age", "date", ".metadata.creationTimestamp", ""),
                ]),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    })
}

fn typed_string() -> JSONSchemaProps {
    JSONSchemaProps {
        type_: Some("string".to_owned()),
        ..Default::default()
    }
}

fn valid_kind(kind: &str) -> bool {
    kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
        && kind.len() <= 63
}

/// The `Workflow` CRD's status schema, which every registered kind shares.
fn workflow_status_schema() -> JSONSchemaProps {
    let crd = crate::crd::Workflow::crd();
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("status").cloned())
        .unwrap_or_else(|| JSONSchemaProps {
            type_: Some("object".to_owned()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..Default::default()
        })
}

/// One difference between the spec schema served and a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaChange {
    /// Where, e.g. `spec.replicas` or `spec.tags[*]`.
    pub path: String,
    pub description: String,
    /// Whether objects valid under the old schema may be invalid under the new one (or mean
    /// something else): such a change is refused unless breaking changes are allowed.
    pub breaking: bool,
}

impl std::fmt::Display for SchemaChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tag = if self.breaking { "breaking" } else { "compatible" };
        write!(f, "{}: {} ({tag})", self.path, self.description)
    }
}

/// Every difference between `old` and `new` (spec schemas, as [`spec_schema`] makes them),
/// breaking ones first, each list in path order.
pub fn schema_changes(old: &JSONSchemaProps, new: &JSONSchemaProps) -> Vec<SchemaChange> {
    let mut changes = Vec::new();
    compare("spec", old, new, &mut changes);
    changes.sort_by(|a, b| b.breaking.cmp(&a.breaking).then_with(|| a.path.cmp(&b.path)));
    changes
}

/// The spec schema of a generated CRD, to compare a new version with.
pub fn served_spec_schema(crd: &CustomResourceDefinition) -> Option<&JSONSchemaProps> {
    crd.spec
        .versions
        .iter()
        .find(|v| v.storage)?
        .schema
        .as_ref()?
        .open_api_v3_schema
        .as_ref()?
        .properties
        .as_ref()?
        .get("spec")
}

fn compare(path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps, out: &mut Vec<SchemaChange>) {
    let mut push = |description: String, breaking: bool| {
        out.push(SchemaChange {
            path: path.to_owned(),
            description,
            breaking,
        })
    };
    let kind = |s: &JSONSchemaProps| -> String {
        if s.x_kubernetes_int_or_string == Some(true) {
            "int-or-string".to_owned()
        } else if s.properties.as_ref().is_some_and(|p| p.contains_key("secretKeyRef")) {
            "secret reference".to_owned()
        } else {
            s.type_.clone().unwrap_or_else(|| "any value".to_owned())
        }
    };
    let (old_kind, new_kind) = (kind(old), kind(new));
    if old_kind != new_kind {
        // Anything fits "any value": widening to it is the one type change that is safe.
        let breaking = new_kind != "any value";
        push(format!("type changed from {old_kind} to {new_kind}"), breaking);
        return;
    }
    if old.nullable == Some(true) && new.nullable != Some(true) {
        push("no longer accepts null".to_owned(), true);
    }
    if old.default != new.default {
        let show = |d: &Option<JSON>| d.as_ref().map_or("none".to_owned(), |d| d.0.to_string());
        push(
            format!("default changed from {} to {}", show(&old.default), show(&new.default)),
            false,
        );
    }
    if old.description != new.description {
        push("description changed".to_owned(), false);
    }
    // Enums: a value no longer accepted breaks objects that use it.
    match (&old.enum_, &new.enum_) {
        (Some(o), Some(n)) => {
            let (o, n): (BTreeSet<String>, BTreeSet<String>) = (
                o.iter().map(|v| v.0.to_string()).collect(),
                n.iter().map(|v| v.0.to_string()).collect(),
            );
            let removed: Vec<_> = o.difference(&n).cloned().collect();
            let added: Vec<_> = n.difference(&o).cloned().collect();
            if !removed.is_empty() {
                push(format!("enum narrowed: no longer accepts {}", removed.join(", ")), true);
            }
            if !added.is_empty() {
                push(format!("enum widened: now also accepts {}", added.join(", ")), false);
            }
        }
        (None, Some(_)) => push("now restricted to an enum".to_owned(), true),
        (Some(_), None) => push("no longer restricted to an enum".to_owned(), false),
        (None, None) => {}
    }
    let count = |v: Option<i64>| v.map(|v| v as f64);
    for (what, old, new, lower) in [
        ("minimum", old.minimum, new.minimum, true),
        ("maximum", old.maximum, new.maximum, false),
        ("minimum length", count(old.min_length), count(new.min_length), true),
        ("maximum length", count(old.max_length), count(new.max_length), false),
        ("minimum items", count(old.min_items), count(new.min_items), true),
        ("maximum items", count(old.max_items), count(new.max_items), false),
    ] {
        bound(&mut push, what, old, new, lower);
    }
    if old.pattern != new.pattern {
        let breaking = new.pattern.is_some();
        push(
            format!(
                "pattern changed from {} to {}",
                old.pattern.as_deref().unwrap_or("none"),
                new.pattern.as_deref().unwrap_or("none")
            ),
            breaking,
        );
    }

    // Object properties: removed and newly required ones break; optional additions do not.
    let empty = BTreeMap::new();
    let (op, np) = (
        old.properties.as_ref().unwrap_or(&empty),
        new.properties.as_ref().unwrap_or(&empty),
    );
    let required = |s: &JSONSchemaProps| -> BTreeSet<String> { s.required.iter().flatten().cloned().collect() };
    let (or, nr) = (required(old), required(new));
    let mut nested = Vec::new();
    for (name, o) in op {
        let at = format!("{path}.{name}");
        match np.get(name) {
            None => out.push(SchemaChange {
                path: at,
                description: "removed".to_owned(),
                breaking: true,
            }),
            Some(n) => {
                if nr.contains(name) && !or.contains(name) {
                    out.push(SchemaChange {
                        path: at.clone(),
                        description: "now required".to_owned(),
                        breaking: true,
                    });
                } else if or.contains(name) && !nr.contains(name) {
                    out.push(SchemaChange {
                        path: at.clone(),
                        description: "no longer required".to_owned(),
                        breaking: false,
                    });
                }
                nested.push((at, o, n));
            }
        }
    }
    for name in np.keys().filter(|n| !op.contains_key(*n)) {
        let breaking = nr.contains(name);
        out.push(SchemaChange {
            path: format!("{path}.{name}"),
            description: if breaking { "added, required" } else { "added" }.to_owned(),
            breaking,
        });
    }
    for (at, o, n) in nested {
        compare(&at, o, n, out);
    }
    if let (Some(JSONSchemaPropsOrArray::Schema(o)), Some(JSONSchemaPropsOrArray::Schema(n))) = (&old.items, &new.items)
    {
        compare(&format!("{path}[*]"), o, n, out);
    }
    if let (Some(JSONSchemaPropsOrBool::Schema(o)), Some(JSONSchemaPropsOrBool::Schema(n))) =
        (&old.additional_properties, &new.additional_properties)
    {
        compare(&format!("{path}.*"), o, n, out);
    }
}

/// A lower bound (`lower`) raised or an upper one lowered, or either newly set, narrows what
/// is accepted.
fn bound(push: &mut impl FnMut(String, bool), what: &str, old: Option<f64>, new: Option<f64>, lower: bool) {
    let show = |v: Option<f64>| v.map_or("none".to_owned(), |v| v.to_string());
    if old == new {
        return;
    }
    let tighter = match (old, new) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(o), Some(n)) => {
            if lower {
                n > o
            } else {
                n < o
            }
        }
    };
    push(format!("{what} changed from {} to {}", show(old), show(new)), tighter);
}

/// A `secretKeyRef` of an instance's spec: the Secret to read for a Sensitive parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub param: String,
    pub name: String,
    pub key: String,
    /// Where the value goes in the engine's data (the parameter's lookup key, or its name).
    data_key: String,
}

/// What an instance's spec asks for: the engine's data, the Secrets to read into it, and
/// Lyra's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    pub data: Value,
    pub secret_refs: Vec<SecretRef>,
    pub deletion_policy: DeletionPolicy,
    pub suspend: bool,
    pub approval: Approval,
    pub drift_policy: DriftPolicy,
    pub refresh_interval: Option<String>,
}

impl InstanceSpec {
    /// Reads an instance's `spec` for `workflow`: each parameter's field goes to the data
    /// key the parameter reads (its lookup key, or its name), so the workflow runs exactly as
    /// it does from a data file. A missing field is left out (the parameter's default or
    /// "missing" error applies); fields that are not parameters are ignored (the API server
    /// prunes them). `Err` names the field and what is wrong.
    pub fn parse(workflow: &Workflow, spec: &Value) -> Result<InstanceSpec, String> {
        let empty = Map::new();
        let fields = match spec {
            Value::Object(m) => m,
            Value::Null => &empty,
            _ => return Err("spec must be an object".to_owned()),
        };
        let mut data = Value::Object(Map::new());
        let mut secret_refs = Vec::new();
        for p in spec_params(workflow) {
            let Some(v) = fields.get(&p.name) else { continue };
            let data_key = match &p.source {
                ParamSource::Lookup(key) => key.clone(),
                _ => p.name.clone(),
            };
            if p.ty.as_ref().is_some_and(Type::is_sensitive) {
                let r = v.get("secretKeyRef");
                let text = |f: &str| {
                    r.and_then(|r| r.get(f))
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                };
                match (text("name"), text("key")) {
                    (Some(name), Some(key)) => secret_refs.push(SecretRef {
                        param: p.name.clone(),
                        name: name.to_owned(),
                        key: key.to_owned(),
                        data_key,
                    }),
                    _ => {
                        return Err(format!(
                            "spec.{}: a Sensitive parameter takes {{secretKeyRef: {{name, key}}}}, never an inline value",
                            p.name
                        ));
                    }
                }
                continue;
            }
            insert(&mut data, &data_key, v.clone());
        }
        let settings = fields.get(SETTINGS_KEY);
        let setting = |k: &str| settings.and_then(|s| s.get(k));
        let deletion_policy = match setting("deletionPolicy").and_then(Value::as_str) {
            None | Some("Delete") => DeletionPolicy::Delete,
            Some("Orphan") => DeletionPolicy::Orphan,
            Some(other) => {
                return Err(format!(
                    "spec.{SETTINGS_KEY}.deletionPolicy: {other:?} is not Delete or Orphan"
                ));
            }
        };
        let approval = match setting("approval").and_then(Value::as_str) {
            None | Some("Automatic") => Approval::Automatic,
            Some("Manual") => Approval::Manual,
            Some(other) => {
                return Err(format!(
                    "spec.{SETTINGS_KEY}.approval: {other:?} is not Automatic or Manual"
                ));
            }
        };
        let drift_policy = match setting("driftPolicy").and_then(Value::as_str) {
            None | Some("Correct") => DriftPolicy::Correct,
            Some("Report") => DriftPolicy::Report,
            Some("Ignore") => DriftPolicy::Ignore,
            Some(other) => {
                return Err(format!(
                    "spec.{SETTINGS_KEY}.driftPolicy: {other:?} is not Correct, Report or Ignore"
                ));
            }
        };
        Ok(InstanceSpec {
            data,
            secret_refs,
            deletion_policy,
            suspend: setting("suspend").and_then(Value::as_bool).unwrap_or(false),
            approval,
            drift_policy,
            refresh_interval: setting("refreshInterval").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// Puts the value read from `r`'s Secret where its parameter reads it.
    pub fn insert_secret(&mut self, r: &SecretRef, value: String) {
        insert(&mut self.data, &r.data_key, Value::String(value));
    }
}

/// Sets `key` (dotted: `a.b.c`) in `data`, making the objects on the way.
fn insert(data: &mut Value, key: &str, value: Value) {
    let mut at = data;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(m) = at else {
            unreachable!("made an object above")
        };
        if parts.peek().is_none() {
            m.insert(part.to_owned(), value);
            return;
        }
        at = m.entry(part.to_owned()).or_insert_with(|| Value::Object(Map::new()));
    }
}

#[cfg(test)]
mod tests;

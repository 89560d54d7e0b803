//! What `lyra register` does, kept out of the CLI: the `WorkflowDefinition` a package makes,
//! creating or updating it, and the preview of an upgrade (`--dry-run`): the schema diff and,
//! for every existing object of the kind, the input its plan would run with.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use lyra_core::model::Workflow as Model;
use lyra_core::value::Map;
use lyra_package::Package;

use crate::definition::{ALLOW_BREAKING, WorkflowDefinition, WorkflowDefinitionSpec};
use crate::kind::{self, DEFINITION_ANNOTATION, InstanceSpec, KindNames, PackageInfo, SchemaChange};
use crate::reconcile::ObjectKey;

/// The field manager `lyra register` applies definitions as.
pub const MANAGER: &str = "lyra-cli";

/// What the user asked for beyond the package.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The definition's name. Default: the package's name, made a DNS name.
    pub name: Option<String>,
    /// Default: the package's name in CamelCase (`web_app` → `WebApp`).
    pub kind: Option<String>,
    pub plural: Option<String>,
    pub group: Option<String>,
    pub allow_breaking: bool,
}

/// `team::web_app-v2` → `WebAppV2`.
pub fn kind_of(name: &str) -> String {
    let last = name.rsplit("::").next().unwrap_or(name);
    last.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|f| f.to_ascii_uppercase().to_string() + cs.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// `team::web_app` → `team-web-app`.
pub fn definition_name_of(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

/// The definition registering `package` (pinned as `pinned`).
pub fn definition(package: &Package, pinned: &str, req: &Request) -> WorkflowDefinition {
    let kind = req.kind.clone().unwrap_or_else(|| kind_of(&package.manifest.name));
    let names = KindNames::new(&kind, req.group.as_deref());
    let name = req
        .name
        .clone()
        .unwrap_or_else(|| definition_name_of(&package.manifest.name));
    let annotations = req
        .allow_breaking
        .then(|| BTreeMap::from([(ALLOW_BREAKING.to_owned(), "true".to_owned())]));
    WorkflowDefinition {
        metadata: ObjectMeta {
            name: Some(name),
            annotations,
            ..Default::default()
        },
        spec: WorkflowDefinitionSpec {
            package: pinned.to_owned(),
            kind,
            plural: req.plural.clone().unwrap_or(names.plural),
            singular: None,
            short_names: Vec::new(),
            categories: Vec::new(),
            group: req.group.clone(),
        },
        status: None,
    }
}

/// `req` completed from the definition already registered under its name, if any: an upgrade
/// keeps the kind's names unless they are given again.
pub async fn complete(client: &Client, package: &Package, mut req: Request) -> Result<Request, kube::Error> {
    let name = req
        .name
        .clone()
        .unwrap_or_else(|| definition_name_of(&package.manifest.name));
    let api: Api<WorkflowDefinition> = Api::all(client.clone());
    if let Some(existing) = api.get_opt(&name).await? {
        let spec = existing.spec;
        if req.kind.is_none() {
            req.kind = Some(spec.kind);
            req.plural = req.plural.or(Some(spec.plural));
        }
        req.group = req.group.or(spec.group);
    }
    req.name = Some(name);
    Ok(req)
}

/// Creates or updates the definition (server-side apply, as [`MANAGER`]).
pub async fn apply(client: &Client, def: &WorkflowDefinition) -> Result<WorkflowDefinition, kube::Error> {
    let api: Api<WorkflowDefinition> = Api::all(client.clone());
    let mut body = serde_json::to_value(def).unwrap_or_default();
    body["apiVersion"] = "lyra.dev/v1alpha1".into();
    body["kind"] = "WorkflowDefinition".into();
    api.patch(
        &def.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
}

/// One existing object of the kind, with the input the new version would run it with.
#[derive(Debug)]
pub struct InstanceInput {
    pub namespace: String,
    pub name: String,
    pub deployment: String,
    /// The engine's data; `Err`: why the object's spec does not fit the new version.
    pub data: Result<Map, String>,
}

/// What registering would change.
#[derive(Debug)]
pub struct Preview {
    pub crd_name: String,
    /// The CRD exists (this is an upgrade).
    pub exists: bool,
    /// Another definition owns the kind: registering would be refused.
    pub taken_by: Option<String>,
    pub changes: Vec<SchemaChange>,
    pub instances: Vec<InstanceInput>,
}

impl Preview {
    pub fn breaking(&self) -> impl Iterator<Item = &SchemaChange> {
        self.changes.iter().filter(|c| c.breaking)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("{0}")]
    Kind(#[from] kind::KindError),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

/// The preview of registering `def` with `package` (whose main workflow is `main`).
pub async fn preview(
    client: &Client,
    def: &WorkflowDefinition,
    package: &Arc<Package>,
    main: &Model,
) -> Result<Preview, PreviewError> {
    let spec = &def.spec;
    let mut names = KindNames::new(&spec.kind, Some(spec.group()));
    names.plural = spec.plural.clone();
    let info = PackageInfo {
        definition: def.name_any(),
        digest: package.digest.clone(),
        version: package.manifest.version.clone(),
    };
    let crd = kind::generate_crd(&names, main, &info)?;
    let crd_name = names.crd_name();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Some(existing) = crds.get_opt(&crd_name).await? else {
        return Ok(Preview {
            crd_name,
            exists: false,
            taken_by: None,
            changes: Vec::new(),
            instances: Vec::new(),
        });
    };
    let taken_by = match existing.annotations().get(DEFINITION_ANNOTATION) {
        Some(o) if *o == def.name_any() => None,
        Some(o) => Some(o.clone()),
        None => Some("(not Lyra)".to_owned()),
    };
    let empty = Default::default();
    let changes = kind::schema_changes(
        kind::served_spec_schema(&existing).unwrap_or(&empty),
        kind::served_spec_schema(&crd).unwrap_or(&empty),
    );
    let resource = crate::registrar::api_resource(&existing);
    let objects = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .list(&ListParams::default())
        .await?;
    let mut instances = Vec::new();
    for obj in objects.items {
        let (Some(ns), Some(name)) = (obj.metadata.namespace.clone(), obj.metadata.name.clone()) else {
            continue;
        };
        let key = ObjectKey::of_kind(&crd_name, &ns, &name);
        let spec = obj.data.get("spec").cloned().unwrap_or_else(|| serde_json::json!({}));
        let data = match InstanceSpec::parse(main, &spec) {
            Ok(mut parsed) => {
                let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
                let mut failed = None;
                for r in parsed.secret_refs.clone() {
                    match crate::registrar::read_secret(&secrets, &r.name, &r.key).await {
                        Ok(v) => parsed.insert_secret(&r, v),
                        Err(m) => failed = Some(format!("spec.{}.secretKeyRef: {m}", r.param)),
                    }
                }
                match failed {
                    Some(m) => Err(m),
                    None => crate::data::expand(Some(&parsed.data)),
                }
            }
            Err(m) => Err(m),
        };
        instances.push(InstanceInput {
            namespace: ns,
            name,
            deployment: key.deployment(),
            data,
        });
    }
    instances.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(Preview {
        crd_name,
        exists: true,
        taken_by,
        changes,
        instances,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_definition_names_from_package_names() {
        assert_eq!(kind_of("web"), "Web");
        assert_eq!(kind_of("team::web_app-v2"), "WebAppV2");
        assert_eq!(definition_name_of("team::web_app"), "team-web-app");
        assert_eq!(definition_name_of("Web"), "web");
    }
}

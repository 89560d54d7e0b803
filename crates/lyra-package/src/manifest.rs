//! The package manifest: the wire form of a workflow's interface, kept apart from the
//! engine's own types so that the engine can change without changing packages.

use std::collections::BTreeSet;

use lyra_core::model::{ParamSource, Step, StepKind};
use lyra_core::program::Program;
use serde::{Deserialize, Serialize};

/// What a package holds and what it takes and gives: the config blob of the OCI artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The main workflow's name (`web`, `team::web`).
    pub name: String,
    /// SemVer.
    pub version: String,
    #[serde(default)]
    pub parameters: Vec<Parameter>,
    #[serde(default)]
    pub returns: Vec<ReturnValue>,
    /// Every resource type the package's workflows use, sorted.
    #[serde(default)]
    pub resource_types: Vec<String>,
    /// Every workflow file in the layer, sorted by path.
    #[serde(default)]
    pub files: Vec<FileEntry>,
}

/// One parameter of the main workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parameter {
    pub name: String,
    /// The Lyra type expression as written (`Integer[1, 10]`, `Optional[String]`); `Any` when
    /// the workflow declares none.
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
    /// The data key the parameter is looked up under, when it is not its own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<String>,
    #[serde(default)]
    pub sensitive: bool,
}

/// One value the main workflow returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReturnValue {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
}

/// One workflow file in the package's layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// The workflow's name (`a::b`).
    pub workflow: String,
    /// Its path in the layer (`a/b.yaml`).
    pub path: String,
}

impl Manifest {
    /// The manifest of a validated program: its main workflow's interface and every resource
    /// type any of its workflows uses. `files` is left empty for the builder to fill.
    pub fn of_program(program: &Program, version: &str) -> Manifest {
        let main = &program.main;
        let parameters = main
            .root
            .params
            .iter()
            // A parameter with a `value` is a constant of the workflow, not an input: the data
            // cannot set it (a registered kind has no field for it either).
            .filter(|p| !matches!(p.source, ParamSource::Value(_)))
            .map(|p| {
                let sensitive = p.ty.as_ref().is_some_and(|t| t.is_sensitive());
                Parameter {
                    name: p.name.clone(),
                    ty: p.ty.as_ref().map_or_else(|| "Any".to_owned(), ToString::to_string),
                    // A default is never recorded for a sensitive parameter: it would be a
                    // secret in a public artifact.
                    default: p.default.clone().filter(|_| !sensitive),
                    doc: p.doc.clone(),
                    lookup: match &p.source {
                        ParamSource::Lookup(key) if *key != p.name => Some(key.clone()),
                        _ => None,
                    },
                    sensitive,
                }
            })
            .collect();
        let returns = main
            .root
            .returns
            .iter()
            .map(|r| ReturnValue {
                name: r.name.clone(),
                ty: r.ty.as_ref().map_or_else(|| "Any".to_owned(), ToString::to_string),
            })
            .collect();
        let mut types = BTreeSet::new();
        for wf in program.workflows.values().chain(std::iter::once(main)) {
            resource_types(&wf.root, &mut types);
        }
        Manifest {
            name: main.name.clone(),
            version: version.to_owned(),
            parameters,
            returns,
            resource_types: types.into_iter().collect(),
            files: Vec::new(),
        }
    }
}

fn resource_types(step: &Step, out: &mut BTreeSet<String>) {
    match &step.kind {
        StepKind::Workflow { steps, .. } => steps.iter().for_each(|s| resource_types(s, out)),
        StepKind::Resource { type_name, .. } => {
            out.insert(type_name.clone());
        }
        StepKind::Collection { step, .. } => resource_types(step, out),
        StepKind::Call { .. } => {}
    }
}

/// `a/b.yaml` for workflow `a::b`.
pub(crate) fn path_of(workflow: &str) -> String {
    format!("{}.yaml", workflow.replace("::", "/"))
}

//! The file `lyra state export` writes and `lyra state import` reads: a versioned JSON
//! document, separate from the store's rows and the engine's types, so either can change
//! without breaking files people keep.

use lyra_core::state::{
    ChangeCounts, ChangeRecord, DeploymentExport, DeploymentState, Operation, Outcome, ResourceRecord, RunRecord,
};
use lyra_core::value::Map;
use serde::{Deserialize, Serialize};

pub const FORMAT: &str = "lyra-state";
pub const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportFile {
    pub format: String,
    pub version: u32,
    pub deployments: Vec<DeploymentFile>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentFile {
    pub deployment: String,
    pub workflow: Option<String>,
    pub resources: Vec<ResourceFile>,
    /// Oldest first.
    pub history: Vec<RunFile>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceFile {
    pub step: String,
    #[serde(rename = "type")]
    pub type_name: String,
    pub external_id: String,
    pub desired: Map,
    pub actual: Map,
    pub depends_on: Vec<String>,
    pub managed: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// Attributes whose values are secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensitive: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub operation: String,
    pub workflow: Option<String>,
    pub actor: String,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub outcome: Option<String>,
    pub counts: ChangeCounts,
    pub changes: Vec<ChangeRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl ExportFile {
    pub fn new(deployments: &[DeploymentExport]) -> ExportFile {
        ExportFile {
            format: FORMAT.to_owned(),
            version: VERSION,
            deployments: deployments.iter().map(DeploymentFile::from_export).collect(),
        }
    }

    /// Parses and checks a file; errors name what is wrong and where.
    pub fn parse(text: &str) -> Result<ExportFile, String> {
        let file: ExportFile = serde_json::from_str(text).map_err(|e| format!("not a Lyra state export: {e}"))?;
        if file.format != FORMAT {
            return Err(format!("not a Lyra state export (format is '{}')", file.format));
        }
        if file.version != VERSION {
            return Err(format!(
                "export version {} is not supported (this lyra reads version {VERSION})",
                file.version
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for d in &file.deployments {
            if !seen.insert(&d.deployment) {
                return Err(format!("deployment '{}' appears twice", d.deployment));
            }
        }
        Ok(file)
    }
}

impl DeploymentFile {
    fn from_export(e: &DeploymentExport) -> DeploymentFile {
        DeploymentFile {
            deployment: e.state.name.clone(),
            workflow: e.state.workflow.clone(),
            resources: e
                .state
                .resources
                .iter()
                .map(|r| ResourceFile {
                    step: r.step_id.clone(),
                    type_name: r.type_name.clone(),
                    external_id: r.external_id.clone(),
                    desired: r.desired.clone(),
                    actual: r.actual.clone(),
                    depends_on: r.depends_on.clone(),
                    managed: r.managed,
                    pending: r.pending,
                    sensitive: r.sensitive.clone(),
                })
                .collect(),
            history: e
                .history
                .iter()
                .map(|r| RunFile {
                    operation: r.operation.as_str().to_owned(),
                    workflow: r.workflow.clone(),
                    actor: r.actor.clone(),
                    started_at_ms: r.started_at,
                    finished_at_ms: r.finished_at,
                    outcome: r.outcome.map(|o| o.as_str().to_owned()),
                    counts: r.counts.clone(),
                    changes: r.changes.clone(),
                    error: r.error.clone(),
                    note: r.note.clone(),
                })
                .collect(),
        }
    }

    pub fn into_export(self) -> Result<DeploymentExport, String> {
        let name = self.deployment;
        let history = self
            .history
            .into_iter()
            .map(|r| {
                let operation = Operation::parse(&r.operation)
                    .ok_or_else(|| format!("deployment '{name}': unknown operation '{}'", r.operation))?;
                let outcome = match r.outcome.as_deref() {
                    None => None,
                    Some("succeeded") => Some(Outcome::Succeeded),
                    Some("failed") => Some(Outcome::Failed),
                    Some("cancelled") => Some(Outcome::Cancelled),
                    Some(other) => return Err(format!("deployment '{name}': unknown outcome '{other}'")),
                };
                Ok(RunRecord {
                    id: 0,
                    deployment: name.clone(),
                    workflow: r.workflow,
                    operation,
                    actor: r.actor,
                    started_at: r.started_at_ms,
                    finished_at: r.finished_at_ms,
                    outcome,
                    counts: r.counts,
                    changes: r.changes,
                    error: r.error,
                    note: r.note,
                })
            })
            .collect::<Result<_, String>>()?;
        let resources = self
            .resources
            .into_iter()
            .map(|r| ResourceRecord {
                step_id: r.step,
                type_name: r.type_name,
                external_id: r.external_id,
                desired: r.desired,
                actual: r.actual,
                depends_on: r.depends_on,
                managed: r.managed,
                pending: r.pending,
                sensitive: r.sensitive,
            })
            .collect();
        Ok(DeploymentExport {
            state: DeploymentState {
                name,
                workflow: self.workflow,
                resources,
                unreadable: Vec::new(),
            },
            history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_other_documents_and_versions() {
        assert!(ExportFile::parse("{}").unwrap_err().contains("not a Lyra state export"));
        let future = r#"{"format":"lyra-state","version":9,"deployments":[]}"#;
        assert!(ExportFile::parse(future).unwrap_err().contains("version 9"));
        let twice = r#"{"format":"lyra-state","version":1,"deployments":[
            {"deployment":"a","workflow":null,"resources":[],"history":[]},
            {"deployment":"a","workflow":null,"resources":[],"history":[]}]}"#;
        assert!(ExportFile::parse(twice).unwrap_err().contains("twice"));
    }

    #[test]
    fn round_trips_through_json() {
        let export = DeploymentExport {
            state: DeploymentState {
                name: "d".into(),
                workflow: Some("w".into()),
                resources: vec![ResourceRecord::intent("s", "Null::Resource", Map::new(), vec![])],
                unreadable: vec![],
            },
            history: vec![],
        };
        let text = serde_json::to_string(&ExportFile::new(std::slice::from_ref(&export))).unwrap();
        let back = ExportFile::parse(&text)
            .unwrap()
            .deployments
            .remove(0)
            .into_export()
            .unwrap();
        assert_eq!(back, export);
    }
}

//! The file `lyra state export` writes and `lyra state import` reads: a versioned JSON
//! document, separate from the store's rows and the engine's types, so either can change
//! without breaking files people keep.

use lyra_core::state::{ChangeCounts, ChangeRecord, DeploymentState, Operation, Outcome, ResourceRecord, RunReturns};
use lyra_core::value::Map;
use lyra_state::{DeploymentExport, RunRecord};
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
    #[serde(default)]
    pub pending: bool,
    /// Attributes whose values are secret.
    #[serde(default)]
    pub sensitive: Vec<String>,
    /// A pending record's idempotency key: it moves with the record, so the target store can
    /// still find what the interrupted create made. (Files from before have none: the old
    /// key is assumed.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_key: Option<String>,
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
    pub changes: Vec<ChangeFile>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
    /// A succeeded apply's returns (`lyra output`); absent in files from before they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returns: Option<RunReturns>,
}

/// A step a run changed, in the history. Files written before `step` was the one name for a
/// step id say `step_id`; they still read.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeFile {
    #[serde(alias = "step_id")]
    pub step: String,
    pub action: String,
    #[serde(default)]
    pub error: Option<String>,
}

impl ExportFile {
    pub fn new(deployments: &[DeploymentExport]) -> ExportFile {
        ExportFile {
            format: FORMAT.to_owned(),
            version: VERSION,
            deployments: deployments.iter().map(DeploymentFile::from_export).collect(),
        }
    }

    /// Parses and checks a file; errors name what is wrong and where (`LINE:COLUMN: ` first
    /// when the JSON is at fault).
    pub fn parse(text: &str) -> Result<ExportFile, String> {
        let file: ExportFile = serde_json::from_str(text).map_err(|e| {
            let message = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            let message = message.strip_suffix(&suffix).unwrap_or(&message);
            format!("{}:{}: not a Lyra state export: {message}", e.line(), e.column())
        })?;
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
                    create_key: r.create_key.clone(),
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
                    changes: r
                        .changes
                        .iter()
                        .map(|c| ChangeFile {
                            step: c.step_id.clone(),
                            action: c.action.clone(),
                            error: c.error.clone(),
                        })
                        .collect(),
                    error: r.error.clone(),
                    note: r.note.clone(),
                    returns: r.returns.clone(),
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
                    changes: r
                        .changes
                        .into_iter()
                        .map(|c| ChangeRecord {
                            step_id: c.step,
                            action: c.action,
                            error: c.error,
                        })
                        .collect(),
                    error: r.error,
                    note: r.note,
                    returns: r.returns,
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
                create_key: r.create_key,
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
    fn reads_files_that_say_step_id() {
        let old = r#"{"format":"lyra-state","version":1,"deployments":[{"deployment":"a","workflow":null,
            "resources":[],"history":[{"operation":"forget","workflow":null,"actor":"u@h",
            "started_at_ms":1,"finished_at_ms":2,"outcome":"succeeded","counts":{"created":0,
            "updated":0,"replaced":0,"deleted":0,"unchanged":0,"failed":0,"skipped":0},
            "changes":[{"step_id":"vm","action":"forget"}]}]}]}"#;
        let export = ExportFile::parse(old)
            .unwrap()
            .deployments
            .remove(0)
            .into_export()
            .unwrap();
        assert_eq!(export.history[0].changes[0].step_id, "vm");
        let again = serde_json::to_value(ExportFile::new(&[export])).unwrap();
        assert_eq!(again["deployments"][0]["history"][0]["changes"][0]["step"], "vm");
    }

    #[test]
    fn json_errors_are_located() {
        let e = ExportFile::parse("{\n  \"format\": 1\n}").unwrap_err();
        assert!(e.starts_with("2:"), "{e}");
    }

    #[test]
    fn round_trips_through_json() {
        let export = DeploymentExport {
            state: DeploymentState {
                name: "d".into(),
                workflow: Some("w".into()),
                resources: vec![ResourceRecord::intent(
                    "s",
                    "Null::Resource",
                    Map::new(),
                    vec![],
                    "store/1/d/s".into(),
                )],
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

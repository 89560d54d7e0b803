//! `lyra import`: adopting a resource that exists into a step of a deployment. The resource
//! is read by its id and recorded as the step's, with no desired state of its own: the next
//! plan reads it again and shows what converging it to the workflow changes, like any other
//! managed resource. Nothing is created, changed or deleted.

use crate::model::{Step, StepKind};
use crate::program::Program;
use crate::provider::OpContext;
use crate::state::{
    ChangeCounts, ChangeRecord, Operation, Outcome, ResourceRecord, RunEnd, RunId, RunStart, StoreError,
};
use crate::value::{Map, too_deep, too_deep_message};

use super::{Engine, EngineError};

/// A resource adopted into a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Adopted {
    pub step_id: String,
    pub type_name: String,
    pub external_id: String,
    /// The attributes the provider reported (secret ones included: mask them to show).
    pub actual: Map,
    /// The attributes of `actual` that are secret.
    pub sensitive: Vec<String>,
    /// The run that recorded it (an `import` in the history).
    pub run: RunId,
}

/// Why a resource cannot be adopted. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("the workflow has no step {step:?}")]
    NoStep {
        step: String,
        /// The workflow's resource steps that can adopt one.
        candidates: Vec<String>,
    },
    #[error(
        "step {0:?} is inside a collection or a call: only the workflow's own resource steps can adopt a resource for now"
    )]
    Nested(String),
    #[error("step '{0}' is not a resource step")]
    NotResource(String),
    #[error("step '{0}' reads its resource by `external_id`: it already names the resource it uses")]
    ReadOnly(String),
    #[error("step '{step}' already has a resource in deployment '{deployment}' ({external_id:?})")]
    Recorded {
        step: String,
        deployment: String,
        external_id: String,
    },
    #[error("no provider serves {0}")]
    NoProvider(String),
    #[error("{type_name} {external_id:?} does not exist")]
    Missing { type_name: String, external_id: String },
    #[error("reading {type_name} {external_id:?}: {message}")]
    Read {
        type_name: String,
        external_id: String,
        message: String,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<StoreError> for AdoptError {
    fn from(e: StoreError) -> Self {
        AdoptError::Engine(EngineError::Store(e))
    }
}

impl Engine<'_> {
    /// Reads the resource `external_id` of step `step_id`'s type and records it as that
    /// step's, as a run of its own (`import`). Reads with the provider settings the workflow
    /// gives (`data` binds its parameters), and records them with it, so that a later delete
    /// reaches the resource even without the workflow.
    pub async fn adopt(
        &self,
        program: &Program,
        deployment: &str,
        data: &Map,
        step_id: &str,
        external_id: &str,
        actor: &str,
    ) -> Result<Adopted, AdoptError> {
        let step = resource_step(&program.main.root, step_id)?;
        let StepKind::Resource {
            type_name,
            external_id: by_id,
            ..
        } = &step.kind
        else {
            return Err(AdoptError::NotResource(step_id.to_owned()));
        };
        if by_id.is_some() {
            return Err(AdoptError::ReadOnly(step_id.to_owned()));
        }
        let providers = self.providers;
        let Some((schema, provider)) = providers.resolve(type_name) else {
            return Err(AdoptError::NoProvider(type_name.clone()));
        };
        let env = self.top_params(&program.main.root, data)?;
        let configs = self.provider_configs(&program.main, &env)?;
        let state = self.readable(deployment, self.store.load(deployment).await?)?;
        if let Some(rec) = state.as_ref().and_then(|s| s.resource(step_id)) {
            return Err(AdoptError::Recorded {
                step: step_id.to_owned(),
                deployment: deployment.to_owned(),
                external_id: rec.external_id.clone(),
            });
        }
        let config = configs.for_type(&schema.name);
        let cx = OpContext {
            deployment,
            step_id,
            type_name: &schema.name,
            idempotency_key: None,
            config: config.map_or(super::config::none(), |c| &c.map),
            cancel: self.cancel,
        };
        let read_failed = |message: String| AdoptError::Read {
            type_name: schema.name.clone(),
            external_id: external_id.to_owned(),
            message,
        };
        let actual = match provider.read(&cx, external_id, None).await {
            Ok(Some(actual)) => actual,
            Ok(None) => {
                return Err(AdoptError::Missing {
                    type_name: schema.name.clone(),
                    external_id: external_id.to_owned(),
                });
            }
            Err(e) => return Err(read_failed(e.to_string())),
        };
        if let Some((name, _)) = actual.iter().find(|(_, v)| too_deep(v)) {
            return Err(read_failed(too_deep_message(&format!(
                "attribute '{name}' of the provider's answer"
            ))));
        }
        let sensitive: Vec<String> = actual.keys().filter(|k| schema.is_secret(k)).cloned().collect();
        let mut record = ResourceRecord {
            step_id: step_id.to_owned(),
            type_name: schema.name.clone(),
            external_id: external_id.to_owned(),
            // Nothing was applied yet: the next plan compares the workflow with `actual`.
            desired: Map::new(),
            actual: actual.clone(),
            depends_on: Vec::new(),
            managed: true,
            pending: false,
            sensitive: sensitive.clone(),
            create_key: None,
        };
        super::config::record(&mut record, config);
        let run = self
            .store
            .begin_run(&RunStart {
                deployment: deployment.to_owned(),
                workflow: None,
                operation: Operation::Import,
                actor: actor.to_owned(),
            })
            .await?;
        let put = self.store.put_resource(deployment, &record).await;
        let end = RunEnd {
            outcome: if put.is_ok() {
                Outcome::Succeeded
            } else {
                Outcome::Failed
            },
            counts: ChangeCounts::default(),
            changes: vec![ChangeRecord {
                step_id: step_id.to_owned(),
                action: "import".to_owned(),
                error: put.as_ref().err().map(ToString::to_string),
            }],
            error: None,
            // Quoted: an id is the provider's text, and must not forge lines of the history.
            note: Some(format!("adopted {} {external_id:?} as step '{step_id}'", schema.name)),
            returns: None,
        };
        self.store.finish_run(run, &end).await?;
        put?;
        Ok(Adopted {
            step_id: step_id.to_owned(),
            type_name: schema.name.clone(),
            external_id: external_id.to_owned(),
            actual,
            sensitive,
            run,
        })
    }
}

/// The workflow's own step `id` (a top-level resource workflow is its one step).
fn resource_step<'p>(root: &'p Step, id: &str) -> Result<&'p Step, AdoptError> {
    let StepKind::Workflow { steps, .. } = &root.kind else {
        return if root.name == id {
            Ok(root)
        } else {
            Err(AdoptError::NoStep {
                step: id.to_owned(),
                candidates: vec![root.name.clone()],
            })
        };
    };
    if let Some(step) = steps.iter().find(|s| s.name == id) {
        return Ok(step);
    }
    if let Some((first, _)) = id.split_once('/')
        && steps.iter().any(|s| s.name == first)
    {
        return Err(AdoptError::Nested(id.to_owned()));
    }
    Err(AdoptError::NoStep {
        step: id.to_owned(),
        candidates: steps
            .iter()
            .filter(|s| matches!(s.kind, StepKind::Resource { external_id: None, .. }))
            .map(|s| s.name.clone())
            .collect(),
    })
}

//! Manual approval (`approval: Manual`): the plan published in `status.plan` and its hash.
//!
//! The hash names one plan made from one set of inputs: the changes as shown (masked), the
//! deployment, the workflow (its name, the package digest, the text of every file loaded),
//! the data and the recorded state. It is public (in the status), and the data and the state
//! may hold secrets, so the inputs enter it only through an HMAC keyed by the state store's
//! id, which only the state's users hold: two different secrets behind the same masked plan
//! give different hashes, and guessing a secret from the hash needs the key.

use hmac::{KeyInit as _, Mac as _};
use lyra_core::diag::Sources;
use lyra_core::report::{Action, Report, StepReport};
use lyra_core::state::DeploymentState;
use lyra_core::state::fingerprint_value as state_value;
use lyra_core::value::canonical_json as canonical;
use lyra_core::value::{Map, Value};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::crd::{PlanAttribute, PlanChange, PlanStatus};
use crate::status::clip;

type HmacSha256 = hmac::Hmac<Sha256>;

/// The published changes, serialized, at most (the hash covers them all).
pub const PLAN_BUDGET: usize = 64 * 1024;
/// One value shown in a change, at most.
const VALUE_LIMIT: usize = 512;

/// What a plan was made from.
pub struct PlanInputs<'a> {
    pub deployment: &'a str,
    /// The workflow's name (an inline one is named after the object).
    pub workflow: &'a str,
    /// The package's digest, for an object of a registered kind.
    pub digest: Option<&'a str>,
    pub sources: &'a Sources,
    pub data: &'a Map,
    pub state: Option<&'a DeploymentState>,
}

/// Whether a plan changes anything: only then does it wait for approval.
pub fn changes_anything(r: &Report) -> bool {
    let c = &r.counts;
    c.created + c.updated + c.replaced + c.deleted > 0 || r.steps.iter().any(|s| s.action == Action::Forget)
}

/// The steps a plan changes, by step id: what the status shows and the hash covers.
fn changed_steps(r: &Report) -> Vec<&StepReport> {
    let mut steps: Vec<&StepReport> = r
        .steps
        .iter()
        .filter(|s| {
            matches!(
                s.action,
                Action::Create | Action::Update | Action::Replace | Action::Delete | Action::Forget
            )
        })
        .collect();
    steps.sort_by(|a, b| a.id.cmp(&b.id));
    steps
}

/// A change's value as shown: masked when secret (the report is masked already; this is
/// the second lock), `None` for an absent old value or a new one known only after apply.
fn shown(sensitive: bool, v: Option<&Value>) -> Option<String> {
    v.map(|v| {
        if sensitive {
            lyra_core::secret::MASK.to_owned()
        } else {
            v.to_string()
        }
    })
}

/// The plan's changes as one value, in full (for the hash).
fn changes_value(r: &Report) -> Value {
    Value::Array(
        changed_steps(r)
            .into_iter()
            .map(|s| {
                json!({
                    "step": s.id,
                    "type": s.type_name,
                    "action": s.action.as_str(),
                    "attributes": s.changes.iter().map(|c| json!({
                        "path": c.path,
                        "old": shown(c.sensitive, c.old.as_ref()),
                        "new": shown(c.sensitive, c.new.as_ref()),
                        "forcesReplace": c.forces_replace,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// The hash of `plan` made from `inputs`: `sha256:<hex>`. `key` is the HMAC key of the
/// inputs (the state store's id).
pub fn plan_hash(key: &str, plan: &Report, inputs: &PlanInputs<'_>) -> String {
    let mut files: Vec<Value> = inputs
        .sources
        .files()
        .iter()
        .map(|f| json!({"name": f.name, "text": f.text}))
        .collect();
    files.sort_by_key(canonical);
    let secret_part = json!({
        "files": files,
        "data": Value::Object(inputs.data.clone()),
        "state": state_value(inputs.state),
    });
    let mut mac =
        HmacSha256::new_from_slice(format!("lyra approval v1\0{key}").as_bytes()).expect("HMAC takes any key length");
    mac.update(canonical(&secret_part).as_bytes());
    let keyed = hex::encode(mac.finalize().into_bytes());
    let public = json!({
        "version": 1,
        "deployment": inputs.deployment,
        "workflow": inputs.workflow,
        "digest": inputs.digest,
        "changes": changes_value(plan),
        "inputs": keyed,
    });
    format!("sha256:{}", hex::encode(Sha256::digest(canonical(&public).as_bytes())))
}

/// `2 to create, 1 to update, 0 to replace, 0 to delete, 3 unchanged`.
pub fn summary(r: &Report) -> String {
    let c = &r.counts;
    format!(
        "{} to create, {} to update, {} to replace, {} to delete, {} unchanged",
        c.created, c.updated, c.replaced, c.deleted, c.unchanged
    )
}

/// The plan as `status.plan` shows it: every change that fits in [`PLAN_BUDGET`], by step id.
pub fn plan_status(r: &Report, hash: String, generation: Option<i64>) -> PlanStatus {
    let int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let mut changes = Vec::new();
    let mut omitted = 0;
    let mut used = 0;
    for s in changed_steps(r) {
        let change = PlanChange {
            step: s.id.clone(),
            type_: s.type_name.clone(),
            action: s.action.as_str().to_owned(),
            attributes: s
                .changes
                .iter()
                .map(|c| PlanAttribute {
                    path: c.path.clone(),
                    old: shown(c.sensitive, c.old.as_ref()).map(|v| clip(&v, VALUE_LIMIT)),
                    new: shown(c.sensitive, c.new.as_ref()).map(|v| clip(&v, VALUE_LIMIT)),
                    forces_replace: c.forces_replace,
                })
                .collect(),
        };
        let n = serde_json::to_vec(&change).map_or(0, |v| v.len() + 1);
        if used + n <= PLAN_BUDGET {
            used += n;
            changes.push(change);
        } else {
            omitted += 1;
        }
    }
    let c = &r.counts;
    PlanStatus {
        hash,
        generation,
        summary: summary(r),
        create: int(c.created),
        update: int(c.updated),
        replace: int(c.replaced),
        delete: int(c.deleted),
        unchanged: int(c.unchanged),
        changes,
        changes_omitted: omitted,
    }
}

/// The first characters of a hash, for messages (`sha256:0123456789ab`).
pub fn short_hash(hash: &str) -> &str {
    let end = "sha256:".len() + 12;
    hash.get(..end).unwrap_or(hash)
}

#[cfg(test)]
mod tests;

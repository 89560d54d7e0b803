//! `lyra approve`: approves the plan an object with `approval: Manual` waits on, by setting
//! its `lyra.dev/approve-plan` annotation to the plan's hash (a merge patch). The controller
//! decides whether that hash is still the plan (see `lyra_k8s::approval`); this only shows
//! what is published and records the person's yes.

use std::fmt::Write as _;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use lyra_k8s::crd::{APPROVE_PLAN, AWAITING_APPROVAL, PlanStatus, Workflow, WorkflowStatus};
use serde_json::json;

use crate::args::{ApproveArgs, Output};
use crate::exit::{Exit, kind};
use crate::{confirm, json, print};

pub async fn approve(a: &ApproveArgs, out: Output) -> Result<(), Exit> {
    let client = Client::try_default().await.map_err(|e| {
        Exit::failure(format!("connecting to Kubernetes: {e}")).hint("set KUBECONFIG (or run in a cluster)")
    })?;
    let namespace = a
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let resource = resource(&client, a.kind.as_deref()).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);
    let what = format!("{} {namespace}/{}", resource.kind, a.name);
    let obj = api
        .get_opt(&a.name)
        .await
        .map_err(|e| Exit::failure(format!("reading {what}: {e}")))?;
    let Some(obj) = obj else {
        return Err(Exit::new(Exit::FAILURE, kind::NOT_FOUND, format!("{what} not found")));
    };
    let status: WorkflowStatus = obj
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    let plan = awaiting(&what, &obj, &status)?;
    let deployment = status.deployment.clone().unwrap_or_default();
    let already = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|m| m.get(APPROVE_PLAN))
        .is_some_and(|v| *v == plan.hash);
    if out == Output::Text {
        print(&plan_text(&what, &deployment, plan))?;
    }
    if confirm::wanted(a.yes, out) && !confirm::ask(&format!("Approve plan {} of {what}?", plan.hash)).await {
        return Err(Exit::new(
            Exit::FAILURE,
            kind::DECLINED,
            "approval cancelled: nothing was changed",
        ));
    }
    if !already {
        let patch = json!({"metadata": {"annotations": {APPROVE_PLAN: plan.hash}}});
        api.patch(&a.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| Exit::failure(format!("annotating {what}: {e}")))?;
    }
    match out {
        Output::Json => json(&json!({
            "object": {
                "apiVersion": resource.api_version,
                "kind": resource.kind,
                "namespace": namespace,
                "name": a.name,
            },
            "deployment": status.deployment,
            "annotation": APPROVE_PLAN,
            "hash": plan.hash,
            "already_approved": already,
            "plan": plan,
        })),
        Output::Text => print(&format!(
            "approved plan {} of {what}{}: lyra-controller applies it if it is still the plan when it looks again\n",
            plan.hash,
            if already { " (it already was)" } else { "" }
        )),
    }
}

/// The plan the object waits on, or why there is none to approve.
fn awaiting<'s>(what: &str, obj: &DynamicObject, status: &'s WorkflowStatus) -> Result<&'s PlanStatus, Exit> {
    let refuse = |why: String| Exit::new(Exit::FAILURE, kind::NOT_AWAITING, why);
    let waiting = status
        .conditions
        .iter()
        .any(|c| c.type_ == AWAITING_APPROVAL && c.status == "True");
    let plan = match (&status.plan, waiting) {
        (Some(plan), true) => plan,
        _ => {
            let manual = obj
                .data
                .pointer("/spec/approval")
                .or_else(|| obj.data.pointer("/spec/lyra/approval"))
                .and_then(|v| v.as_str())
                == Some("Manual");
            let hint = if manual {
                "nothing to approve until lyra-controller publishes a plan that changes something (`kubectl describe` shows its conditions)"
            } else {
                "only objects with approval: Manual wait for approval (spec.approval, or spec.lyra.approval for a registered kind)"
            };
            return Err(refuse(format!("{what} has no plan awaiting approval")).hint(hint));
        }
    };
    // The spec moved after this plan was made: the controller plans again, and approving
    // the old plan would do nothing.
    if let (Some(planned), Some(now)) = (plan.generation, obj.metadata.generation)
        && planned != now
    {
        return Err(refuse(format!(
            "the plan of {what} was made for generation {planned}, and the object is at generation {now} now"
        ))
        .hint("wait for lyra-controller to publish the new plan, then approve that"));
    }
    Ok(plan)
}

/// The plan as `lyra plan` prints one: a block per step, then the counts.
fn plan_text(what: &str, deployment: &str, plan: &PlanStatus) -> String {
    let mut out = format!("{what} (deployment {deployment}) waits on plan {}:\n", plan.hash);
    for c in &plan.changes {
        let label = match &c.type_ {
            Some(t) => format!("{} ({t})", c.step),
            None => c.step.clone(),
        };
        let (mark, verb) = match c.action.as_str() {
            "create" => ("+", "created"),
            "update" => ("~", "updated in place"),
            "replace" => ("-/+", "replaced"),
            "delete" => ("-", "deleted"),
            _ => ("-", "forgotten (not deleted: read-only)"),
        };
        let _ = writeln!(out, "  {mark} {label} will be {verb}");
        for at in &c.attributes {
            let new = at.new.as_deref().unwrap_or("(known after apply)");
            let note = if at.forces_replace {
                "  # forces replacement"
            } else {
                ""
            };
            let _ = match &at.old {
                None => writeln!(out, "      + {} = {new}", at.path),
                Some(old) => writeln!(out, "      ~ {}: {old} -> {new}{note}", at.path),
            };
        }
    }
    if plan.changes_omitted > 0 {
        let _ = writeln!(
            out,
            "  … and {} more step(s) left out of the status (the hash covers them; `lyra plan` shows them)",
            plan.changes_omitted
        );
    }
    let _ = writeln!(out, "Plan: {}.", plan.summary);
    out
}

/// The API resource `--kind` names: `Workflow` by default, else a CRD by its kind, plural or
/// `plural.group` (a registered kind).
async fn resource(client: &Client, kind: Option<&str>) -> Result<ApiResource, Exit> {
    let workflow = ApiResource::erase::<Workflow>(&());
    let Some(kind) = kind else { return Ok(workflow) };
    if [
        workflow.kind.as_str(),
        "workflows",
        "workflow",
        "wf",
        "workflows.lyra.dev",
    ]
    .contains(&kind)
    {
        return Ok(workflow);
    }
    // Read as dynamic objects: the few fields needed do not call for the typed CRD.
    let crd_resource = ApiResource {
        group: "apiextensions.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "apiextensions.k8s.io/v1".to_owned(),
        kind: "CustomResourceDefinition".to_owned(),
        plural: "customresourcedefinitions".to_owned(),
    };
    let crds: Api<DynamicObject> = Api::all_with(client.clone(), &crd_resource);
    let list = crds
        .list(&Default::default())
        .await
        .map_err(|e| Exit::failure(format!("listing CustomResourceDefinitions to find kind {kind}: {e}")))?;
    let text = |crd: &DynamicObject, pointer: &str| {
        crd.data
            .pointer(pointer)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let found: Vec<&DynamicObject> = list
        .items
        .iter()
        .filter(|crd| {
            [
                text(crd, "/spec/names/kind"),
                text(crd, "/spec/names/plural"),
                text(crd, "/spec/names/singular"),
                crd.metadata.name.clone().unwrap_or_default(),
            ]
            .iter()
            .any(|n| n == kind)
        })
        .collect();
    let crd = match found.as_slice() {
        [one] => *one,
        [] => {
            return Err(
                Exit::new(Exit::FAILURE, kind::NOT_FOUND, format!("no kind {kind} is served"))
                    .hint("name a registered kind by its Kind, plural or plural.group (`kubectl get wfd` lists them)"),
            );
        }
        _ => {
            return Err(Exit::usage(format!(
                "kind {kind} is ambiguous: {}; name it as plural.group",
                found
                    .iter()
                    .filter_map(|c| c.metadata.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    };
    let versions = crd
        .data
        .pointer("/spec/versions")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    let version = versions
        .iter()
        .find(|v| v["storage"] == true)
        .or_else(|| versions.first())
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default()
        .to_owned();
    let group = text(crd, "/spec/group");
    Ok(ApiResource {
        api_version: format!("{group}/{version}"),
        group,
        version,
        kind: text(crd, "/spec/names/kind"),
        plural: text(crd, "/spec/names/plural"),
    })
}

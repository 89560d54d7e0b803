//! Loading a workflow together with every workflow it calls, and validating them all.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::diag::{Diagnostic, Diagnostics, Sources, Span};
use crate::model::{Step, StepKind, Workflow};
use crate::schema::SchemaRegistry;
use crate::validate::{Signature, validate};
use crate::yaml::parse_workflow_partial;

/// A validated workflow and the workflows it calls, ready to plan or apply.
#[derive(Debug, Clone)]
pub struct Program {
    pub main: Arc<Workflow>,
    pub workflows: HashMap<String, Arc<Workflow>>,
}

/// Where workflow sources come from: given a workflow name, its display path and text.
/// The CLI reads files from a load path; the controller may embed them.
pub trait WorkflowSource {
    fn fetch(&mut self, name: &str) -> Option<(String, String)>;
}

impl<F: FnMut(&str) -> Option<(String, String)>> WorkflowSource for F {
    fn fetch(&mut self, name: &str) -> Option<(String, String)> {
        self(name)
    }
}

/// Parses `main` (already read: display path and text) and every workflow it calls
/// (through `source`), then validates them all. All problems are reported at once.
pub fn load(
    main_name: &str,
    main: (String, String),
    source: &mut dyn WorkflowSource,
    sources: &mut Sources,
    schemas: &SchemaRegistry,
) -> Result<Program, Diagnostics> {
    let mut diags = Diagnostics::default();
    let mut parsed: HashMap<String, Workflow> = HashMap::new();
    let mut queue: Vec<(String, Option<(String, String)>)> = vec![(main_name.to_owned(), Some(main))];
    let mut tried: HashSet<String> = HashSet::new();
    while let Some((name, text)) = queue.pop() {
        if !tried.insert(name.clone()) {
            continue;
        }
        let Some((path, text)) = text.or_else(|| source.fetch(&name)) else {
            // Reported where it is called, by validation.
            continue;
        };
        let file = sources.add(path, text.clone());
        let (wf, problems) = parse_workflow_partial(&name, file, &text);
        diags.extend(problems);
        if let Some(wf) = wf {
            let mut targets = Vec::new();
            call_targets(&wf.root, &mut targets);
            for t in targets {
                if !tried.contains(&t) {
                    queue.push((t, None));
                }
            }
            parsed.insert(name, wf);
        }
    }
    let sigs: HashMap<String, Signature> = parsed.iter().map(|(n, wf)| (n.clone(), Signature::of(wf))).collect();
    check_recursion(&parsed, &mut diags);
    let mut workflows = HashMap::new();
    for (name, mut wf) in parsed {
        if let Err(d) = validate(&mut wf, schemas, &sigs) {
            diags.extend(d);
        }
        workflows.insert(name, Arc::new(wf));
    }
    diags.into_result()?;
    let main = workflows.get(main_name).cloned().expect("the main workflow parsed");
    Ok(Program { main, workflows })
}

fn call_targets(step: &Step, out: &mut Vec<String>) {
    match &step.kind {
        StepKind::Workflow { steps, .. } => steps.iter().for_each(|s| call_targets(s, out)),
        StepKind::Collection { step, .. } => call_targets(step, out),
        StepKind::Call { target, .. } => out.push(target.clone()),
        StepKind::Resource { .. } => {}
    }
}

fn calls_with_spans(step: &Step, out: &mut Vec<(String, Span)>) {
    match &step.kind {
        StepKind::Workflow { steps, .. } => steps.iter().for_each(|s| calls_with_spans(s, out)),
        StepKind::Collection { step, .. } => calls_with_spans(step, out),
        StepKind::Call {
            target, target_span, ..
        } => out.push((target.clone(), *target_span)),
        StepKind::Resource { .. } => {}
    }
}

/// A workflow that (indirectly) calls itself would never finish.
fn check_recursion(parsed: &HashMap<String, Workflow>, diags: &mut Diagnostics) {
    let mut names: Vec<&String> = parsed.keys().collect();
    names.sort();
    for start in names {
        let mut calls = Vec::new();
        calls_with_spans(&parsed[start].root, &mut calls);
        for (target, span) in calls {
            // Depth-first search from `target` back to `start`.
            let mut stack = vec![(target.clone(), vec![start.clone(), target.clone()])];
            let mut seen = HashSet::new();
            while let Some((cur, path)) = stack.pop() {
                if cur == *start {
                    diags.push(Diagnostic::new(span, format!("recursive call: {}", path.join(" -> "))));
                    break;
                }
                if !seen.insert(cur.clone()) {
                    continue;
                }
                if let Some(wf) = parsed.get(&cur) {
                    let mut next = Vec::new();
                    call_targets(&wf.root, &mut next);
                    for n in next {
                        let mut p = path.clone();
                        p.push(n.clone());
                        stack.push((n, p));
                    }
                }
            }
        }
    }
}

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

/// Whether `name` can name a workflow to look up: `::`-separated segments of ASCII letters,
/// digits, `_` and `-` (`web`, `foober_iter`, `team::web-v2`). A load path turns names into
/// paths (`a::b` is `a/b.yaml`), so anything that could leave it (`..`, `/`, `\`, an absolute
/// path, an empty segment) is refused here, before any file is looked at. `Err` says why.
pub fn check_workflow_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".to_owned());
    }
    for segment in name.split("::") {
        if segment.is_empty() {
            return Err("a segment is empty (names look like a::b)".to_owned());
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-')))
        {
            return Err(format!(
                "{c:?} is not allowed (names are letters, digits, '_' and '-', in segments joined by '::')"
            ));
        }
    }
    Ok(())
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
        // A call target that is not a name is never looked up: validation reports it.
        let text = text.or_else(|| check_workflow_name(&name).ok().and_then(|()| source.fetch(&name)));
        let Some((path, text)) = text else {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A call target that is not a name is reported where it is called and never handed to
    /// the source (which could turn it into a path outside the load path).
    #[test]
    fn call_targets_that_are_not_names_are_never_fetched() {
        let main = "steps:\n  a:\n    call: ../../etc/x\n  b:\n    call: ok\n";
        let mut asked = Vec::new();
        let mut source = |name: &str| {
            asked.push(name.to_owned());
            (name == "ok").then(|| ("ok.yaml".to_owned(), "steps: {}\n".to_owned()))
        };
        let mut sources = Sources::default();
        let err = load(
            "main",
            ("main.yaml".into(), main.into()),
            &mut source,
            &mut sources,
            &SchemaRegistry::default(),
        )
        .unwrap_err();
        assert_eq!(asked, ["ok"]);
        let messages: Vec<&str> = err.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "step 'a' calls '../../etc/x', which is not a workflow name: '.' is not allowed \
              (names are letters, digits, '_' and '-', in segments joined by '::')"
            ]
        );
        assert_eq!(sources.location(err.0[0].span), "main.yaml:3:11");
    }

    #[test]
    fn workflow_names_are_segments_that_cannot_leave_the_load_path() {
        for ok in ["web", "foober_iter", "team::web-v2", "A::b::C9"] {
            assert_eq!(check_workflow_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "..",
            "../x",
            "a::..::b",
            "/etc/passwd",
            "a/b",
            "a\\b",
            "a::",
            "::a",
            "a::::b",
            "a:b",
            "a:::b",
            "a.b",
            "a b",
            "~",
            "é",
        ] {
            assert!(check_workflow_name(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(check_workflow_name("a::..").unwrap_err().contains("'.'"));
    }
}

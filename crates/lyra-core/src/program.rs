//! Loading a workflow together with every workflow it calls, and validating them all.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::diag::{Diagnostic, Diagnostics, Sources, Span};
use crate::model::{Step, StepKind, Workflow};
use crate::schema::SchemaRegistry;
use crate::validate::{Signature, Unloaded, validate};
use crate::value::MAX_DEPTH;
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

    /// The names of every workflow the source could fetch (sorted), for the help of a call to
    /// an unknown one; `None` when it cannot list them (the help then names the workflows
    /// that were loaded). Asked only when a call names an unknown workflow.
    fn names(&mut self) -> Option<Vec<String>> {
        None
    }

    /// Why `fetch` gave nothing for `name`, when the source has such a workflow but could not
    /// give it (unreadable, outside the load path): the call says so instead of calling it
    /// unknown. Asked after a `fetch` of `name` that gave nothing.
    fn refused(&mut self, name: &str) -> Option<String> {
        let _ = name;
        None
    }
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
    let mut unloaded = Unloaded::default();
    while let Some((name, text)) = queue.pop() {
        if !tried.insert(name.clone()) {
            continue;
        }
        // A call target that is not a name is never looked up: validation reports it.
        let text = text.or_else(|| check_workflow_name(&name).ok().and_then(|()| source.fetch(&name)));
        let Some((path, text)) = text else {
            // Reported where it is called, by validation.
            if let Some(why) = source.refused(&name) {
                unloaded.refused.insert(name, why);
            }
            continue;
        };
        let file = sources.add(path, text);
        let text = &sources.get(file).expect("just added").text;
        let (wf, problems) = parse_workflow_partial(&name, file, text);
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
    let recursive = diags.len();
    check_recursion(&parsed, &mut diags);
    if diags.len() == recursive
        && let Some(main) = parsed.get(main_name)
    {
        check_nesting(main, &parsed, &mut diags);
    }
    // Listing the source can be costly (a directory tree): only for the help of a call that
    // names no loaded workflow.
    let unknown_call = parsed.values().any(|wf| {
        let mut targets = Vec::new();
        call_targets(&wf.root, &mut targets);
        targets
            .iter()
            .any(|t| !parsed.contains_key(t) && !unloaded.refused.contains_key(t))
    });
    if unknown_call {
        unloaded.on_path = source.names();
    }
    for (name, wf) in &parsed {
        if name != main_name
            && let Some(block) = wf.providers.first()
        {
            diags.push(
                Diagnostic::new(
                    block.span,
                    format!("'providers' belongs to the main workflow; '{name}' is called by '{main_name}'"),
                )
                .with_help(format!(
                    "configure providers in '{main_name}': a called workflow uses the main workflow's"
                )),
            );
        }
    }
    let mut workflows = HashMap::new();
    for (name, mut wf) in parsed {
        if let Err(d) = validate(&mut wf, schemas, &sigs, &unloaded) {
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

/// A call: its target, where it is, and how deep it is nested (the call step counts).
type CallAt = (String, Span, usize);

/// How deeply steps nest inside `step` (a resource is 1), without following calls, and each
/// call with the nesting around it (the call step itself counts).
fn local_nesting(step: &Step, outer: usize, calls: &mut Vec<CallAt>) -> usize {
    let here = outer + 1;
    match &step.kind {
        StepKind::Workflow { steps, .. } => steps
            .iter()
            .map(|s| local_nesting(s, here, calls))
            .max()
            .unwrap_or(here),
        StepKind::Collection { step, .. } => local_nesting(step, here, calls),
        StepKind::Call {
            target, target_span, ..
        } => {
            calls.push((target.clone(), *target_span, here));
            here
        }
        StepKind::Resource { .. } => here,
    }
}

/// Steps run inside their parents, so the engine's stack grows with their nesting. Within one
/// file it is bounded by the YAML nesting limit; across calls (`a` calls `b` calls `c`...)
/// it is checked here, at the main workflow's call that leads too deep. Runs after the
/// recursion check: the calls form no cycle.
fn check_nesting(main: &Workflow, parsed: &HashMap<String, Workflow>, diags: &mut Diagnostics) {
    // Each workflow's own nesting and calls; then, children first (iteratively: a call
    // chain may be long), the deepest nesting through its calls.
    let mut local: HashMap<&str, (usize, Vec<CallAt>)> = HashMap::new();
    for (name, wf) in parsed {
        let mut calls = Vec::new();
        let own = local_nesting(&wf.root, 0, &mut calls);
        local.insert(name.as_str(), (own, calls));
    }
    let mut total: HashMap<&str, usize> = HashMap::new();
    let mut stack: Vec<(&str, bool)> = vec![(main.name.as_str(), false)];
    while let Some((name, expanded)) = stack.pop() {
        if total.contains_key(name) {
            continue;
        }
        let Some((own, calls)) = local.get(name) else {
            // Not loaded: reported where it is called.
            total.insert(name, 0);
            continue;
        };
        if expanded {
            let through_calls = calls
                .iter()
                .map(|(t, _, at)| at - 1 + total.get(t.as_str()).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            total.insert(name, (*own).max(through_calls));
        } else {
            stack.push((name, true));
            stack.extend(calls.iter().map(|(t, _, _)| (t.as_str(), false)));
        }
    }
    let Some((_, calls)) = local.get(main.name.as_str()) else {
        return;
    };
    let deepest = calls
        .iter()
        .map(|(t, span, at)| (at - 1 + total.get(t.as_str()).copied().unwrap_or(0), t, span))
        .max_by_key(|(d, _, _)| *d);
    if let Some((depth, target, span)) = deepest
        && depth > MAX_DEPTH
    {
        // Name the chain: follow the deepest call at each level.
        let mut chain = vec![main.name.clone(), target.clone()];
        let mut cur = target.as_str();
        while let Some((_, calls)) = local.get(cur) {
            let next = calls
                .iter()
                .max_by_key(|(t, _, at)| at + total.get(t.as_str()).copied().unwrap_or(0));
            match next {
                Some((t, _, _)) if chain.len() <= 2 * MAX_DEPTH => {
                    chain.push(t.clone());
                    cur = t.as_str();
                }
                _ => break,
            }
        }
        if chain.len() > 8 {
            let tail = chain.split_off(chain.len() - 3);
            chain.truncate(4);
            chain.push("...".to_owned());
            chain.extend(tail);
        }
        diags.push(
            Diagnostic::new(
                *span,
                format!(
                    "steps nest {depth} levels deep through calls, more than the limit of {MAX_DEPTH}: {}",
                    chain.join(" -> ")
                ),
            )
            .with_help("call fewer levels deep, or inline some of the called workflows"),
        );
    }
}

/// A workflow that (indirectly) calls itself would never finish. Each cycle is reported at
/// every call along it. Linear in the size of the call graph, so long call chains are cheap.
fn check_recursion(parsed: &HashMap<String, Workflow>, diags: &mut Diagnostics) {
    let mut names: Vec<&String> = parsed.keys().collect();
    names.sort();
    let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    let calls: Vec<Vec<(String, Span)>> = names
        .iter()
        .map(|n| {
            let mut c = Vec::new();
            calls_with_spans(&parsed[*n].root, &mut c);
            c
        })
        .collect();
    // deps[i]: the workflows `i` calls (find_cycles reads "depends on").
    let deps: Vec<Vec<usize>> = calls
        .iter()
        .map(|c| {
            let mut d: Vec<usize> = c.iter().filter_map(|(t, _)| index.get(t.as_str()).copied()).collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    for mut cycle in crate::validate::find_cycles(&deps) {
        // find_cycles lists a cycle callee first; calls go the other way.
        cycle.reverse();
        for k in 0..cycle.len() {
            let (from, to) = (cycle[k], cycle[(k + 1) % cycle.len()]);
            let path: Vec<&str> = (0..=cycle.len())
                .map(|j| names[cycle[(k + j) % cycle.len()]].as_str())
                .collect();
            if let Some((_, span)) = calls[from].iter().find(|(t, _)| *t == *names[to]) {
                diags.push(Diagnostic::new(*span, format!("recursive call: {}", path.join(" -> "))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Providers;

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

    /// `w0` calls `w1` ... calls `w{n-1}`, which holds one (unknown-typed, so schemas need
    /// not matter) resource... A `steps:` of nothing keeps it valid.
    fn chain(n: usize) -> Result<Program, Diagnostics> {
        let text = |i: usize| {
            if i + 1 < n {
                format!("steps:\n  next:\n    call: w{}\n", i + 1)
            } else {
                "steps:\n".to_owned()
            }
        };
        let mut source = |name: &str| {
            let i: usize = name.strip_prefix('w')?.parse().ok()?;
            (i < n).then(|| (format!("{name}.yaml"), text(i)))
        };
        let mut sources = Sources::default();
        let providers = Providers::new();
        load(
            "w0",
            ("w0.yaml".into(), text(0)),
            &mut source,
            &mut sources,
            providers.schemas(),
        )
    }

    #[test]
    fn call_chains_nest_up_to_the_limit() {
        assert!(chain(MAX_DEPTH).is_ok());
        let err = chain(MAX_DEPTH + 2).unwrap_err();
        assert_eq!(err.len(), 1, "{err}");
        let msg = &err.0[0].message;
        assert!(
            msg.contains("more than the limit of 64") && msg.contains("w0 -> w1 -> "),
            "{msg}"
        );
        assert_eq!((err.0[0].span.line, err.0[0].span.col), (3, 11));
        // Long chains are checked without recursion.
        let err = chain(5_000).unwrap_err();
        assert!(err.0[0].message.contains("nest 5000 levels"), "{err}");
    }

    #[test]
    fn recursion_is_reported_at_every_call_of_the_cycle() {
        let texts = |name: &str| match name {
            "a" => Some("steps:\n  x:\n    call: b\n"),
            "b" => Some("steps:\n  y:\n    call: c\n"),
            "c" => Some("steps:\n  z:\n    call: a\n  self:\n    call: d\n"),
            "d" => Some("steps:\n  again:\n    call: d\n"),
            _ => None,
        };
        let mut source = |name: &str| texts(name).map(|t| (format!("{name}.yaml"), t.to_owned()));
        let mut sources = Sources::default();
        let providers = Providers::new();
        let err = load(
            "a",
            ("a.yaml".into(), texts("a").unwrap().into()),
            &mut source,
            &mut sources,
            providers.schemas(),
        )
        .unwrap_err();
        let mut msgs: Vec<&str> = err.iter().map(|d| d.message.as_str()).collect();
        msgs.sort_unstable();
        assert_eq!(
            msgs,
            [
                "recursive call: a -> b -> c -> a",
                "recursive call: b -> c -> a -> b",
                "recursive call: c -> a -> b -> c",
                "recursive call: d -> d",
            ],
            "{err}"
        );
    }
}

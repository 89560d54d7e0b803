//! Static validation: everything that can be known about a workflow before it runs, reported
//! all at once. Fills in [`Step::inputs`] and the per-workflow dependency lists the engine uses.
//!
//! Checks: one producer per value, a producer for every consumed value, no dependency cycles
//! (the cycle is named), known resource types and attributes, literal values of the right
//! type, returns that exist, calls to workflows that exist (and do not recurse).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::diag::{Diagnostic, Diagnostics, Span};
use crate::model::{ParamSource, ReturnSource, Step, StepKind, Workflow};
use crate::schema::SchemaRegistry;

/// What a call needs to know about the workflow it calls.
#[derive(Debug, Clone)]
pub struct Signature {
    /// Parameters, and whether each has its own source (a lookup or a value).
    pub params: Vec<(String, bool)>,
    pub returns: Vec<String>,
}

impl Signature {
    pub fn of(wf: &Workflow) -> Signature {
        Signature {
            params: wf
                .root
                .params
                .iter()
                .map(|p| (p.name.clone(), !matches!(p.source, ParamSource::Implicit)))
                .collect(),
            returns: wf.root.returns.iter().map(|r| r.name.clone()).collect(),
        }
    }
}

/// Validates `wf` in place. `calls` holds the signatures of every workflow it may call.
pub fn validate(
    wf: &mut Workflow,
    schemas: &SchemaRegistry,
    calls: &HashMap<String, Signature>,
) -> Result<(), Diagnostics> {
    let mut cx = Cx {
        schemas,
        calls,
        diags: Diagnostics::default(),
    };
    let inputs = cx.step(&mut wf.root, true);
    // The top level reads only its own parameters (which come from data).
    for (name, span) in inputs {
        cx.diags.push(
            Diagnostic::new(span, format!("nothing produces '${name}'")).with_help(format!(
                "declare a parameter '{name}' (with a lookup or a value), or return '{name}' from a step"
            )),
        );
    }
    cx.diags.into_result()
}

struct Cx<'a> {
    schemas: &'a SchemaRegistry,
    calls: &'a HashMap<String, Signature>,
    diags: Diagnostics,
}

/// Names read from the enclosing scope, with where each is first read.
type Inputs = BTreeMap<String, Span>;

fn add(inputs: &mut Inputs, name: &str, span: Span) {
    inputs.entry(name.to_owned()).or_insert(span);
}

impl Cx<'_> {
    /// Analyses a step; returns what it reads from its enclosing scope.
    fn step(&mut self, step: &mut Step, top: bool) -> Inputs {
        let mut inputs = Inputs::new();
        // Names bound by the step's own parameters: visible inside, read from outside.
        let mut local: HashSet<String> = HashSet::new();
        for p in &step.params {
            local.insert(p.name.clone());
            match &p.source {
                // At the top level an undeclared source means a data key of the same name.
                ParamSource::Implicit if !top => add(&mut inputs, &p.name, p.span),
                ParamSource::Value(e) => e.refs().iter().for_each(|r| add(&mut inputs, &r.name, r.span)),
                _ => {}
            }
        }
        if let Some((g, span)) = &step.when {
            g.names().iter().for_each(|n| add(&mut inputs, n, *span));
        }
        let explicit_params = !step.params.is_empty();
        let step_name = step.name.clone();
        match &mut step.kind {
            StepKind::Resource {
                type_name,
                type_span,
                value,
                external_id,
            } => {
                let mut inner = Inputs::new();
                for a in value.iter() {
                    a.expr.refs().iter().for_each(|r| add(&mut inner, &r.name, r.span));
                }
                if let Some((e, _)) = external_id {
                    e.refs().iter().for_each(|r| add(&mut inner, &r.name, r.span));
                }
                // A resource's declared parameters only document what it reads (the original
                // said so: "never necessary in yaml"); everything it reads is an input.
                for (n, s) in inner {
                    if !local.contains(&n) {
                        add(&mut inputs, &n, s);
                    }
                }
                match self.schemas.get(type_name) {
                    None => {
                        let known = self.schemas.names().join(", ");
                        self.diags.push(
                            Diagnostic::new(
                                *type_span,
                                format!("unknown resource type '{type_name}' in step '{step_name}'"),
                            )
                            .with_help(format!("known types: {known}")),
                        );
                    }
                    Some(schema) => {
                        *type_name = schema.name.clone();
                        for a in value.iter() {
                            match schema.attribute(&a.name) {
                                None => {
                                    let known: Vec<&str> = schema.attributes.iter().map(|x| x.name.as_str()).collect();
                                    self.diags.push(
                                        Diagnostic::new(
                                            a.span,
                                            format!(
                                                "unknown attribute '{}' for {} in step '{step_name}'",
                                                a.name, schema.name
                                            ),
                                        )
                                        .with_help(format!(
                                            "{} has: {}",
                                            schema.name,
                                            known.join(", ")
                                        )),
                                    );
                                }
                                Some(attr) if attr.computed => {
                                    let returns_it =
                                        step.returns.iter().any(|r| r.source_name() == Some(attr.name.as_str()));
                                    let help = if returns_it {
                                        "remove it from 'value'; the step already returns it".to_owned()
                                    } else {
                                        format!(
                                            "remove it from 'value'; to use it, return it: `returns: {{myName: {}}}`",
                                            attr.name
                                        )
                                    };
                                    self.diags.push(
                                        Diagnostic::new(
                                            a.span,
                                            format!(
                                                "attribute '{}' of {} in step '{step_name}' is computed by the provider and cannot be set",
                                                a.name, schema.name
                                            ),
                                        )
                                        .with_help(help),
                                    );
                                }
                                Some(attr) => {
                                    if let crate::expr::Expr::Lit(v) = &a.expr
                                        && let Err(e) = attr.ty.coerce(v)
                                    {
                                        let inner = if e.path.is_empty() {
                                            String::new()
                                        } else {
                                            format!(" at '{}'", e.path)
                                        };
                                        self.diags.error(
                                            a.span,
                                            format!(
                                                "attribute '{}' of step '{step_name}'{inner} expects {}, got {}",
                                                a.name, e.expected, e.found
                                            ),
                                        );
                                    }
                                }
                            }
                        }
                        for r in &step.returns {
                            match r.source_name() {
                                Some(attr) if schema.attribute(attr).is_none() => {
                                    self.diags.push(
                                        Diagnostic::new(
                                            r.span,
                                            format!(
                                                "step '{step_name}' returns '{attr}', which is not an attribute of {}",
                                                schema.name
                                            ),
                                        )
                                        .with_help(format!(
                                            "{} has: {}",
                                            schema.name,
                                            schema
                                                .attributes
                                                .iter()
                                                .map(|x| x.name.as_str())
                                                .collect::<Vec<_>>()
                                                .join(", ")
                                        )),
                                    );
                                }
                                None => self
                                    .diags
                                    .error(r.span, "a resource's returns name attributes; 'value' is for workflows"),
                                _ => {}
                            }
                        }
                    }
                }
            }
            StepKind::Workflow { steps, deps } => {
                let free = self.scope(&step_name, steps, deps, &local, &step.returns);
                for (n, s) in free {
                    if top || explicit_params {
                        self.diags.push(
                            Diagnostic::new(s, format!("nothing in workflow '{step_name}' produces '${n}'"))
                                .with_help(format!("add a parameter '{n}' or a step that returns '{n}'")),
                        );
                    } else {
                        // A nested workflow without declared parameters reads what it needs
                        // from the enclosing scope.
                        add(&mut inputs, &n, s);
                    }
                }
            }
            StepKind::Collection {
                over,
                vars,
                step: inner,
                ..
            } => {
                for e in over.exprs() {
                    e.refs().iter().for_each(|r| add(&mut inputs, &r.name, r.span));
                }
                let inner_inputs = self.step(inner, false);
                for (n, s) in inner_inputs {
                    if !vars.contains(&n) && !local.contains(&n) {
                        add(&mut inputs, &n, s);
                    }
                }
            }
            StepKind::Call {
                target,
                target_span,
                args,
            } => {
                for (_, e, _) in args.iter() {
                    e.refs().iter().for_each(|r| add(&mut inputs, &r.name, r.span));
                }
                match self.calls.get(target.as_str()) {
                    // Never looked up: it could name a file outside the load path.
                    None if let Err(why) = crate::program::check_workflow_name(target) => {
                        self.diags.error(
                            *target_span,
                            format!("step '{step_name}' calls '{target}', which is not a workflow name: {why}"),
                        );
                    }
                    None => {
                        let mut known: Vec<&str> = self.calls.keys().map(String::as_str).collect();
                        known.sort_unstable();
                        self.diags.push(
                            Diagnostic::new(
                                *target_span,
                                format!("step '{step_name}' calls '{target}', which is not a known workflow"),
                            )
                            .with_help(format!("workflows on the load path: {}", known.join(", "))),
                        );
                    }
                    Some(sig) => {
                        for (called, _, span) in args.iter() {
                            if !sig.params.iter().any(|(p, _)| p == called) {
                                self.diags
                                    .error(*span, format!("workflow '{target}' has no parameter '{called}'"));
                            }
                        }
                        for (p, has_source) in &sig.params {
                            if !has_source && !args.iter().any(|(c, _, _)| c == p) {
                                add(&mut inputs, p, step.span);
                            }
                        }
                        for r in &step.returns {
                            match r.source_name() {
                                Some(n) if !sig.returns.iter().any(|x| x == n) => self.diags.error(
                                    r.span,
                                    format!(
                                        "workflow '{target}' has no return '{n}' (it returns: {})",
                                        sig.returns.join(", ")
                                    ),
                                ),
                                None => self
                                    .diags
                                    .error(r.span, "a call's returns name the called workflow's returns"),
                                _ => {}
                            }
                        }
                    }
                }
            }
        }
        step.inputs = inputs.keys().cloned().collect();
        inputs
    }

    /// Analyses the children of a workflow; returns the names they read that nothing in
    /// the scope produces.
    fn scope(
        &mut self,
        wf_name: &str,
        steps: &mut [Step],
        deps: &mut Vec<Vec<usize>>,
        params: &HashSet<String>,
        returns: &[crate::model::Return],
    ) -> Inputs {
        #[derive(Clone, Copy)]
        enum Producer {
            Param,
            Child(usize),
        }
        let mut producers: HashMap<String, (Producer, Span)> = HashMap::new();
        for p in params {
            producers.insert(p.clone(), (Producer::Param, Span::default()));
        }
        let names: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
        let mut child_inputs = Vec::with_capacity(steps.len());
        for (i, child) in steps.iter_mut().enumerate() {
            child_inputs.push(self.step(child, false));
            let produced: Vec<(String, Span)> = match &child.kind {
                StepKind::Collection { into, .. } => vec![(into.clone(), child.span)],
                _ => child.returns.iter().map(|r| (r.name.clone(), r.span)).collect(),
            };
            for (name, span) in produced {
                match producers.get(&name) {
                    Some((Producer::Param, _)) => self.diags.error(
                        span,
                        format!("step '{}' returns '{name}', which is already a parameter of workflow '{wf_name}'", child.name),
                    ),
                    Some((Producer::Child(j), first)) => self.diags.push(Diagnostic::new(
                        span,
                        format!(
                            "'{name}' is produced by both '{}' (line {}) and '{}' in workflow '{wf_name}'; every value needs exactly one producer",
                            names[*j], first.line, child.name
                        ),
                    )),
                    None => {
                        producers.insert(name, (Producer::Child(i), span));
                    }
                }
            }
        }
        let mut free = Inputs::new();
        deps.clear();
        for inputs in &child_inputs {
            let mut d = Vec::new();
            for (n, s) in inputs {
                match producers.get(n) {
                    Some((Producer::Child(j), _)) => d.push(*j),
                    Some((Producer::Param, _)) => {}
                    None => add(&mut free, n, *s),
                }
            }
            d.sort_unstable();
            d.dedup();
            deps.push(d);
        }
        for r in returns {
            let names: Vec<(String, Span)> = match &r.source {
                ReturnSource::Same => vec![(r.name.clone(), r.span)],
                ReturnSource::Alias(a) => vec![(a.clone(), r.span)],
                ReturnSource::Value(e) => e.refs().iter().map(|x| (x.name.clone(), x.span)).collect(),
            };
            // What no step produces is read from the enclosing scope (or is an error, as
            // decided by the caller for any free name).
            for (n, s) in names {
                if !producers.contains_key(&n) {
                    add(&mut free, &n, s);
                }
            }
        }
        for cycle in find_cycles(deps) {
            let mut names: Vec<&str> = cycle.iter().map(|i| steps[*i].name.as_str()).collect();
            names.push(names[0]);
            self.diags.error(
                steps[cycle[0]].span,
                format!("dependency cycle in workflow '{wf_name}': {}", names.join(" -> ")),
            );
        }
        free
    }
}

/// Every dependency cycle among `deps` (node -> nodes it depends on), each as the list of
/// nodes along it. Iterative, so deep chains cannot overflow the stack.
pub fn find_cycles(deps: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = deps.len();
    let mut removed = vec![false; n];
    let mut cycles = Vec::new();
    loop {
        // Kahn's algorithm over what is left: strip everything that is not blocked by a cycle.
        let mut pending: Vec<usize> = (0..n)
            .map(|i| deps[i].iter().filter(|d| !removed[**d]).count())
            .collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                dependents[d].push(i);
            }
        }
        let mut queue: Vec<usize> = (0..n).filter(|i| !removed[*i] && pending[*i] == 0).collect();
        let mut done = removed.clone();
        while let Some(i) = queue.pop() {
            done[i] = true;
            for &j in &dependents[i] {
                if !done[j] {
                    pending[j] -= 1;
                    if pending[j] == 0 {
                        queue.push(j);
                    }
                }
            }
        }
        let Some(start) = (0..n).find(|i| !done[*i]) else {
            return cycles;
        };
        // Walk blocked dependencies until a node repeats: that loop is a cycle.
        let mut path = vec![start];
        let mut seen: HashMap<usize, usize> = HashMap::from([(start, 0)]);
        let mut cur = start;
        loop {
            let next = *deps[cur]
                .iter()
                .find(|d| !done[**d])
                .expect("a blocked node has a blocked dependency");
            if let Some(&at) = seen.get(&next) {
                let mut cycle: Vec<usize> = path[at..].to_vec();
                // Print the cycle in data-flow order: producer before consumer.
                cycle.reverse();
                cycles.push(cycle.clone());
                for i in cycle {
                    removed[i] = true;
                }
                break;
            }
            seen.insert(next, path.len());
            path.push(next);
            cur = next;
        }
        // Nodes that were only blocked by the removed cycle are freed by the next round.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cycles_and_ignores_chains() {
        assert!(find_cycles(&[vec![], vec![0], vec![1]]).is_empty());
        let c = find_cycles(&[vec![2], vec![0], vec![1], vec![2]]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].len(), 3);
        let deep: Vec<Vec<usize>> = (0..100_000)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert!(find_cycles(&deep).is_empty());
    }
}

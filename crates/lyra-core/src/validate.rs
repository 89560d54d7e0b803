//! Static validation: everything that can be known about a workflow before it runs, reported
//! all at once. Fills in [`Step::inputs`] and the per-workflow dependency lists the engine uses.
//!
//! Checks: one producer per value, a producer for every consumed value, no dependency cycles
//! (the cycle is named), known resource types and attributes, literal values of the right
//! type, returns that exist, calls to workflows that exist (and do not recurse).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::FastMap;
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

/// What the workflow source said about the workflows that were not loaded, for the messages
/// of the calls to them.
#[derive(Debug, Default, Clone)]
pub struct Unloaded {
    /// The names of the workflows on the load path, when the source can list them.
    pub on_path: Option<Vec<String>>,
    /// Workflows the source has but could not give (unreadable, outside the load path), and
    /// why.
    pub refused: HashMap<String, String>,
}

/// Validates `wf` in place. `calls` holds the signatures of every workflow it may call;
/// `unloaded` what is known of the others.
pub fn validate(
    wf: &mut Workflow,
    schemas: &SchemaRegistry,
    calls: &HashMap<String, Signature>,
    unloaded: &Unloaded,
) -> Result<(), Diagnostics> {
    let mut cx = Cx {
        schemas,
        calls,
        unloaded,
        diags: Diagnostics::default(),
    };
    cx.providers(wf);
    let inputs = cx.step(&mut wf.root, true);
    // The top level reads only its own parameters (which come from data). What a top-level
    // resource or collection reads beyond them is not declared; parameter values, guards and
    // call arguments that read variables were reported where they are.
    for (name, span) in inputs {
        cx.diags.push(
            Diagnostic::new(span, format!("nothing at the top level defines '${name}'")).with_help(format!(
                "declare it: `parameters: [{name}]` reads the data key '{name}' (or give it a lookup or a value)"
            )),
        );
    }
    cx.diags.into_result()
}

/// "LABEL: a, b, c", at most 20 names, then how many more.
fn names_help(label: &str, names: &[String]) -> String {
    const SHOWN: usize = 20;
    if names.is_empty() {
        return format!("{label}: none");
    }
    let mut text = format!(
        "{label}: {}",
        names.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ")
    );
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

struct Cx<'a> {
    schemas: &'a SchemaRegistry,
    calls: &'a HashMap<String, Signature>,
    unloaded: &'a Unloaded,
    diags: Diagnostics,
}

/// Names read from the enclosing scope, with where each is first read.
type Inputs = BTreeMap<String, Span>;

fn add(inputs: &mut Inputs, name: &str, span: Span) {
    inputs.entry(name.to_owned()).or_insert(span);
}

impl Cx<'_> {
    /// The `providers:` block: known namespaces that take configuration, known settings of
    /// the right type, values that read only the top-level parameters.
    fn providers(&mut self, wf: &Workflow) {
        let mut seen: HashSet<String> = HashSet::new();
        for block in &wf.providers {
            if !seen.insert(crate::schema::type_key(&block.namespace)) {
                self.diags.error(
                    block.span,
                    format!("provider '{}' is configured twice", block.namespace),
                );
                continue;
            }
            let Some(schema) = self.schemas.config(&block.namespace) else {
                let configurable = self.schemas.config_names().join(", ");
                let serves = self.schemas.names().iter().any(|t| {
                    crate::schema::type_key(crate::schema::namespace_of(t)) == crate::schema::type_key(&block.namespace)
                });
                let msg = if serves {
                    format!("provider '{}' takes no configuration", block.namespace)
                } else {
                    format!("unknown provider '{}' in 'providers'", block.namespace)
                };
                self.diags.push(
                    Diagnostic::new(block.span, msg)
                        .with_help(format!("providers that take configuration: {configurable}")),
                );
                continue;
            };
            for a in &block.value {
                let Some(attr) = schema.attribute(&a.name) else {
                    let known: Vec<&str> = schema.attributes.iter().map(|x| x.name.as_str()).collect();
                    self.diags.push(
                        Diagnostic::new(
                            a.span,
                            format!("unknown setting '{}' of provider {}", a.name, schema.name),
                        )
                        .with_help(format!("{} takes: {}", schema.name, known.join(", "))),
                    );
                    continue;
                };
                if let crate::expr::Expr::Lit(v) = &a.expr
                    && let Err(e) = attr.ty.coerce(v)
                {
                    self.diags.error(
                        a.span,
                        format!(
                            "setting '{}' of provider {} expects {}, got {}",
                            a.name, schema.name, e.expected, e.found
                        ),
                    );
                }
                for r in a.expr.refs() {
                    if !wf.root.params.iter().any(|p| p.name == r.name) {
                        self.diags.push(
                            Diagnostic::new(
                                r.span,
                                format!(
                                    "provider settings read only the top-level parameters; '${}' is not one",
                                    r.name
                                ),
                            )
                            .with_help(format!(
                                "declare it: `parameters: [{}]` reads the data key '{}' (type it Sensitive if it is a secret)",
                                r.name, r.name
                            )),
                        );
                    }
                }
            }
            let missing: Vec<&str> = schema
                .attributes
                .iter()
                .filter(|x| x.required && !block.value.iter().any(|a| a.name == x.name))
                .map(|x| x.name.as_str())
                .collect();
            if !missing.is_empty() {
                self.diags.error(
                    block.span,
                    format!("provider {} needs {}", schema.name, missing.join(", ")),
                );
            }
        }
    }

    /// A top-level parameter's `value` reads `$r`: nothing encloses the top level, and the
    /// parameters of one step do not see each other, so it cannot be defined.
    fn top_value_reference(&mut self, p: &crate::model::Param, r: &crate::expr::Ref, params: &[crate::model::Param]) {
        let (name, at) = (&p.name, r.name.as_str());
        let help = match params.iter().find(|q| q.name == at) {
            Some(q) => match &q.source {
                ParamSource::Lookup(key) => {
                    format!(
                        "'{at}' is another parameter: give '{name}' the same data, `lookup: {key}`, or read ${at} where '{name}' is used"
                    )
                }
                ParamSource::Implicit => {
                    format!(
                        "'{at}' is another parameter: give '{name}' the same data, `lookup: {at}`, or read ${at} where '{name}' is used"
                    )
                }
                ParamSource::Value(_) => {
                    format!("'{at}' is another parameter: repeat its value, or read ${at} where '{name}' is used")
                }
            },
            None => "write the value itself, or take it from the data with `lookup: KEY`".to_owned(),
        };
        self.diags.push(
            Diagnostic::new(
                r.span,
                format!(
                    "parameter '{name}' of the top level reads '${at}', but a top-level value is a literal: it cannot read variables"
                ),
            )
            .with_help(help),
        );
    }

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
                // Nothing encloses the top level: its values are literals.
                ParamSource::Value(e) if top => {
                    for r in e.refs() {
                        self.top_value_reference(p, r, &step.params);
                    }
                }
                ParamSource::Value(e) => e.refs().iter().for_each(|r| add(&mut inputs, &r.name, r.span)),
                _ => {}
            }
        }
        match step.when.as_deref() {
            // A guard is decided by the workflow around the step; the top level has none (and
            // a called workflow's own guard would be ignored).
            Some((_, span)) if top => self.diags.push(
                Diagnostic::new(
                    *span,
                    format!("the top-level step '{}' cannot have a guard ('when')", step.name),
                )
                .with_help("guard the steps inside it, or the step that calls this workflow"),
            ),
            Some((g, span)) => g.names().iter().for_each(|n| add(&mut inputs, n, *span)),
            None => {}
        }
        let explicit_params = !step.params.is_empty();
        let step_name = step.name.clone();
        match &mut step.kind {
            StepKind::Resource {
                type_name,
                type_span,
                value,
                external_id,
                ..
            } => {
                let mut inner = Inputs::new();
                for a in value.iter() {
                    a.expr.refs().iter().for_each(|r| add(&mut inner, &r.name, r.span));
                }
                if let Some((e, _)) = external_id.as_deref_mut() {
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
                        let missing: Vec<&str> = schema
                            .attributes
                            .iter()
                            .filter(|a| a.required && !value.iter().any(|v| v.name == a.name))
                            .map(|a| a.name.as_str())
                            .collect();
                        if !missing.is_empty() {
                            let list = missing.iter().map(|m| format!("'{m}'")).collect::<Vec<_>>().join(", ");
                            self.diags.push(
                                Diagnostic::new(
                                    step.span,
                                    format!("step '{step_name}' does not set {list}, which {} requires", schema.name),
                                )
                                .with_help("`lyra providers` lists every attribute of every type"),
                            );
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
                into,
                step: inner,
                ..
            } => {
                // What to iterate over may be one of the collection's own parameters (at the
                // top level, that is the only way to read data), as the engine resolves it.
                for e in over.exprs() {
                    for r in e.refs() {
                        if !local.contains(&r.name) {
                            add(&mut inputs, &r.name, r.span);
                        }
                    }
                }
                // A collection produces one value, its `into` list; `returns` may only name
                // (and type) it.
                for r in &step.returns {
                    if r.name != *into || r.source_name() != Some(into.as_str()) {
                        let what = match &r.source {
                            ReturnSource::Value(_) => format!("'{}', built from a 'value'", r.name),
                            ReturnSource::Alias(a) if a != &r.name => format!("'{}' (from '{a}')", r.name),
                            _ => format!("'{}'", r.name),
                        };
                        self.diags.push(
                            Diagnostic::new(
                                r.span,
                                format!(
                                    "collection '{step_name}' produces one value, its list '{into}', and cannot return {what}"
                                ),
                            )
                            .with_help(if r.name == *into {
                                format!("return the list as it is: `returns: {into}` (with a type if need be)")
                            } else {
                                format!(
                                    "return '{into}' (with a type if need be), or name the list with `into: {}`",
                                    r.name
                                )
                            }),
                        );
                    }
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
                for a in args.iter() {
                    let read: Vec<(&str, Span)> = match &a.source {
                        ParamSource::Implicit => vec![(a.name.as_str(), a.span)],
                        ParamSource::Value(e) => e.refs().iter().map(|r| (r.name.as_str(), r.span)).collect(),
                        ParamSource::Lookup(_) => vec![],
                    };
                    for (name, span) in read {
                        if top {
                            self.diags.push(
                                Diagnostic::new(
                                    span,
                                    format!(
                                        "argument '{}' of the top-level call '{step_name}' reads '${name}', but there are no variables at the top level",
                                        a.name
                                    ),
                                )
                                .with_help(format!(
                                    "pass a literal (`{}: {{value: ...}}`) or data (`{}: {{lookup: KEY}}`)",
                                    a.name, a.name
                                )),
                            );
                        } else {
                            add(&mut inputs, name, span);
                        }
                    }
                }
                match self.calls.get(target.as_str()) {
                    // Never looked up: it could name a file outside the load path.
                    None if let Err(why) = crate::program::check_workflow_name(target) => {
                        self.diags.error(
                            *target_span,
                            format!("step '{step_name}' calls '{target}', which is not a workflow name: {why}"),
                        );
                    }
                    // Found, but it could not be read: say why, not that it does not exist.
                    None if let Some(why) = self.unloaded.refused.get(target.as_str()) => {
                        self.diags.error(
                            *target_span,
                            format!("step '{step_name}' calls '{target}', which cannot be loaded: {why}"),
                        );
                    }
                    None => {
                        let help = match &self.unloaded.on_path {
                            Some(names) => names_help("workflows on the load path", names),
                            None => {
                                let mut known: Vec<String> = self.calls.keys().cloned().collect();
                                known.sort_unstable();
                                names_help("known workflows", &known)
                            }
                        };
                        self.diags.push(
                            Diagnostic::new(
                                *target_span,
                                format!("step '{step_name}' calls '{target}', which is not a known workflow"),
                            )
                            .with_help(help),
                        );
                    }
                    Some(sig) => {
                        for a in args.iter() {
                            if !sig.params.iter().any(|(p, _)| *p == a.name) {
                                self.diags
                                    .error(a.span, format!("workflow '{target}' has no parameter '{}'", a.name));
                            }
                        }
                        for (p, has_source) in &sig.params {
                            if !has_source && !args.iter().any(|a| a.name == *p) {
                                if top {
                                    self.diags.push(
                                        Diagnostic::new(
                                            step.span,
                                            format!(
                                                "the top-level call '{step_name}' does not pass parameter '{p}' of '{target}', which has no value of its own"
                                            ),
                                        )
                                        .with_help(format!(
                                            "pass it: `parameters: {{{p}: {{lookup: KEY}}}}` (data) or `{{{p}: {{value: ...}}}}`"
                                        )),
                                    );
                                } else {
                                    add(&mut inputs, p, step.span);
                                }
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
        let mut producers: FastMap<String, (Producer, Span)> =
            FastMap::with_capacity_and_hasher(params.len() + steps.len(), Default::default());
        for p in params {
            producers.insert(p.clone(), (Producer::Param, Span::default()));
        }
        let names: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
        let mut child_inputs = Vec::with_capacity(steps.len());
        for (i, child) in steps.iter_mut().enumerate() {
            // Kept until the scope is read whole: as an exactly sized list, not the map it
            // was built in (a B-tree node holds room for eleven names, even for one).
            let inputs: Vec<(String, Span)> = self.step(child, false).into_iter().collect();
            child_inputs.push(inputs);
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
            for (n, s) in inputs.iter() {
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
        // What is read in the scope: the engine makes no value for a return nothing reads.
        let mut read: HashSet<&str, foldhash::fast::RandomState> = HashSet::default();
        read.extend(child_inputs.iter().flatten().map(|(n, _)| n.as_str()));
        for r in returns {
            match &r.source {
                ReturnSource::Same => {
                    read.insert(&r.name);
                }
                ReturnSource::Alias(a) => {
                    read.insert(a);
                }
                ReturnSource::Value(e) => read.extend(e.refs().into_iter().map(|x| x.name.as_str())),
            }
        }
        for child in steps.iter_mut() {
            for r in &mut child.returns {
                r.read = read.contains(r.name.as_str());
            }
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
    use crate::diag::Sources;
    use crate::schema::{AttributeSchema, ResourceSchema};
    use crate::types::Type;

    fn schemas() -> SchemaRegistry {
        let mut r = SchemaRegistry::default();
        r.insert(ResourceSchema::new(
            "Test::Thing",
            vec![
                AttributeSchema::new("input", Type::Any),
                AttributeSchema::new("output", Type::Any).provided(),
            ],
        ));
        r
    }

    /// The problems with `main.yaml` (calling the workflows in `others`), as
    /// `line:col message | help`, in order.
    fn problems_with(main: &str, others: &[(&str, &str)], listed: Option<&[&str]>) -> Vec<String> {
        struct Source<'a> {
            others: &'a [(&'a str, &'a str)],
            listed: Option<&'a [&'a str]>,
        }
        impl crate::program::WorkflowSource for Source<'_> {
            fn fetch(&mut self, name: &str) -> Option<(String, String)> {
                let (_, text) = self.others.iter().find(|(n, _)| *n == name)?;
                (!text.is_empty()).then(|| (format!("{name}.yaml"), (*text).to_owned()))
            }
            /// A workflow given as empty text stands for one that cannot be read.
            fn refused(&mut self, name: &str) -> Option<String> {
                self.others
                    .iter()
                    .any(|(n, t)| *n == name && t.is_empty())
                    .then(|| format!("cannot read {name}.yaml"))
            }
            fn names(&mut self) -> Option<Vec<String>> {
                self.listed.map(|l| l.iter().map(|n| (*n).to_owned()).collect())
            }
        }
        let mut source = Source { others, listed };
        let mut sources = Sources::default();
        match crate::program::load(
            "main",
            ("main.yaml".into(), main.into()),
            &mut source,
            &mut sources,
            &schemas(),
        ) {
            Ok(_) => vec![],
            Err(d) => d
                .iter()
                .map(|d| {
                    format!(
                        "{}:{} {} | {}",
                        d.span.line,
                        d.span.col,
                        d.message,
                        d.help.as_deref().unwrap_or("")
                    )
                })
                .collect(),
        }
    }

    fn problems(main: &str) -> Vec<String> {
        problems_with(main, &[], None)
    }

    /// A top-level value is a literal: reading a variable is said to be that, at the reference,
    /// not "nothing produces" with the advice to declare a parameter that is declared.
    #[test]
    fn top_level_values_cannot_read_variables() {
        let p = problems(
            "parameters:\n  region:\n    lookup: net.region\n  zone:\n    value: $region\n  other:\n    value: [$elsewhere]\n  plain:\n  copy:\n    value: $plain\nsteps:\n",
        );
        assert_eq!(
            p,
            [
                "5:12 parameter 'zone' of the top level reads '$region', but a top-level value is a literal: it cannot read variables \
                 | 'region' is another parameter: give 'zone' the same data, `lookup: net.region`, or read $region where 'zone' is used",
                "7:13 parameter 'other' of the top level reads '$elsewhere', but a top-level value is a literal: it cannot read variables \
                 | write the value itself, or take it from the data with `lookup: KEY`",
                "10:12 parameter 'copy' of the top level reads '$plain', but a top-level value is a literal: it cannot read variables \
                 | 'plain' is another parameter: give 'copy' the same data, `lookup: plain`, or read $plain where 'copy' is used",
            ]
        );
        // A nested step's value reads the enclosing workflow, which may declare it.
        assert!(problems("parameters: [region]\nsteps:\n  a:\n    parameters:\n      zone: {value: $region}\n    resource: Test::Thing\n    value: {input: $zone}\n").is_empty());
    }

    /// What else the top level reads: an undeclared name (the help says how to declare it, and
    /// no longer to return it from a sibling step, which a top level has not), a guard (which
    /// nothing would evaluate), and the arguments of a top-level call.
    #[test]
    fn the_top_level_reads_only_its_parameters() {
        assert_eq!(
            problems("resource: Test::Thing\nvalue:\n  input: $region\n"),
            [
                "3:10 nothing at the top level defines '$region' | declare it: `parameters: [region]` reads the data key 'region' (or give it a lookup or a value)"
            ]
        );
        assert_eq!(
            problems("parameters: [flag]\nwhen: flag\nsteps:\n"),
            [
                "2:7 the top-level step 'main' cannot have a guard ('when') | guard the steps inside it, or the step that calls this workflow"
            ]
        );
        let lib = [(
            "lib",
            "parameters:\n  a: {type: String}\n  b: {value: 1}\n  c:\nsteps:\n",
        )];
        assert_eq!(
            problems_with("call: lib\nparameters:\n  a: {value: $x}\n  b:\n", &lib, None),
            [
                "1:1 the top-level call 'main' does not pass parameter 'c' of 'lib', which has no value of its own \
                 | pass it: `parameters: {c: {lookup: KEY}}` (data) or `{c: {value: ...}}`",
                "3:14 argument 'a' of the top-level call 'main' reads '$x', but there are no variables at the top level \
                 | pass a literal (`a: {value: ...}`) or data (`a: {lookup: KEY}`)",
                "4:3 argument 'b' of the top-level call 'main' reads '$b', but there are no variables at the top level \
                 | pass a literal (`b: {value: ...}`) or data (`b: {lookup: KEY}`)",
            ]
        );
        // Literals and lookups are what a top-level call passes.
        assert!(
            problems_with(
                "call: lib\nparameters:\n  a: {lookup: k}\n  c: {value: 3}\n",
                &lib,
                None
            )
            .is_empty()
        );
        // A top-level collection iterates over its own parameters.
        assert!(problems("parameters:\n  zones: {lookup: zones}\neach: $zones\nas: z\nstep:\n  resource: Test::Thing\n  value: {input: $z}\n").is_empty());
    }

    /// A call's arguments keep their lookup (read from the data, so the caller needs no such
    /// variable) and their type.
    #[test]
    fn call_arguments_keep_their_source_and_type() {
        let lib = [("lib", "parameters: [a, b]\nsteps:\n")];
        let main = "steps:\n  c:\n    call: lib\n    parameters:\n      a: {lookup: data.a, type: Integer}\n      b: {value: 1, type: 'Sensitive[Integer]'}\n";
        assert!(problems_with(main, &lib, None).is_empty());
        let mut sources = Sources::default();
        let mut fetch = |name: &str| (name == "lib").then(|| ("lib.yaml".to_owned(), lib[0].1.to_owned()));
        let prog = crate::program::load(
            "main",
            ("main.yaml".into(), main.into()),
            &mut fetch,
            &mut sources,
            &schemas(),
        )
        .unwrap();
        let StepKind::Workflow { steps, .. } = &prog.main.root.kind else {
            panic!()
        };
        let StepKind::Call { args, .. } = &steps[0].kind else {
            panic!()
        };
        assert!(matches!(&args[0].source, ParamSource::Lookup(k) if k == "data.a"));
        assert_eq!(args[0].ty.as_ref().map(ToString::to_string).as_deref(), Some("Integer"));
        assert!(args[1].ty.as_ref().is_some_and(Type::is_sensitive));
        // The lookup reads no variable of the caller.
        assert!(steps[0].inputs.is_empty(), "{:?}", steps[0].inputs);
    }

    /// A collection produces its `into` list only: `returns` may name (and type) it, and
    /// anything else is an error instead of being ignored.
    #[test]
    fn a_collection_returns_only_its_list() {
        let wf = |returns: &str| {
            format!(
                "returns: [names]\nsteps:\n  servers:\n    times: 2\n    into: names\n    returns: {returns}\n    step:\n      returns: output\n      resource: Test::Thing\n"
            )
        };
        for ok in ["names", "[names]", "{names: {type: 'Array[String]'}}", "{names: names}"] {
            assert!(problems(&wf(ok)).is_empty(), "{ok}: {:?}", problems(&wf(ok)));
        }
        assert_eq!(
            problems(&wf("{ids: output, names: {value: 1}, servers: {type: Array}}")),
            [
                "6:15 collection 'servers' produces one value, its list 'names', and cannot return 'ids' (from 'output') \
                 | return 'names' (with a type if need be), or name the list with `into: ids`",
                "6:28 collection 'servers' produces one value, its list 'names', and cannot return 'names', built from a 'value' \
                 | return the list as it is: `returns: names` (with a type if need be)",
                "6:47 collection 'servers' produces one value, its list 'names', and cannot return 'servers' \
                 | return 'names' (with a type if need be), or name the list with `into: servers`",
            ]
        );
    }

    /// The help of a call to an unknown workflow names what is on the load path (as the source
    /// lists it), not only what was loaded.
    #[test]
    fn unknown_calls_list_the_load_path() {
        let lib = [("lib", "steps:\n")];
        let main = "steps:\n  a:\n    call: lib\n  b:\n    call: libb\n";
        let p = problems_with(main, &lib, Some(&["lib", "main", "net::vpc", "zone"]));
        assert_eq!(
            p,
            [
                "5:11 step 'b' calls 'libb', which is not a known workflow | workflows on the load path: lib, main, net::vpc, zone"
            ]
        );
        // One the source has but cannot give is not called unknown.
        let p = problems_with("steps:\n  a:\n    call: broken\n", &[("broken", "")], Some(&["broken"]));
        assert_eq!(
            p,
            ["3:11 step 'a' calls 'broken', which cannot be loaded: cannot read broken.yaml | "]
        );
        // A source that cannot list names what was loaded.
        let p = problems_with(main, &lib, None);
        assert_eq!(
            p,
            ["5:11 step 'b' calls 'libb', which is not a known workflow | known workflows: lib, main"]
        );
        // Long lists are cut.
        let many: Vec<String> = (0..25).map(|i| format!("w{i:02}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let p = problems_with(main, &lib, Some(&many));
        assert!(p[0].ends_with("w18, w19 and 5 more"), "{p:?}");
    }

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

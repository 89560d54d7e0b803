//! The dependency graph of a workflow, as DOT or Mermaid text for `lyra graph`.

use crate::model::{Step, StepKind, Workflow};

/// A node (a step, by id and label) and the edges producer -> consumer between steps.
#[derive(Debug, Default)]
pub struct Graph {
    /// (id, label)
    pub nodes: Vec<(String, String)>,
    /// (producer id, consumer id)
    pub edges: Vec<(String, String)>,
}

impl Graph {
    pub fn of(wf: &Workflow) -> Graph {
        let mut g = Graph::default();
        match &wf.root.kind {
            StepKind::Workflow { .. } => g.scope(&wf.root, ""),
            _ => g.node(&wf.root, &wf.root.name.clone()),
        }
        g
    }

    fn node(&mut self, step: &Step, id: &str) {
        let label = match &step.kind {
            StepKind::Resource { type_name, .. } => format!("{}\\n{type_name}", step.name),
            StepKind::Collection { step: inner, .. } => {
                let what = match &inner.kind {
                    StepKind::Resource { type_name, .. } => type_name.clone(),
                    other => other.label().to_owned(),
                };
                format!("{} (each)\\n{what}", step.name)
            }
            StepKind::Call { target, .. } => format!("{}\\ncall {target}", step.name),
            StepKind::Workflow { .. } => step.name.clone(),
        };
        self.nodes.push((id.to_owned(), label));
    }

    fn scope(&mut self, wf: &Step, prefix: &str) {
        let StepKind::Workflow { steps, deps } = &wf.kind else {
            return;
        };
        let id = |s: &Step| {
            if prefix.is_empty() {
                s.name.clone()
            } else {
                format!("{prefix}/{}", s.name)
            }
        };
        for s in steps {
            match &s.kind {
                StepKind::Workflow { .. } => {
                    let sid = id(s);
                    self.nodes.push((sid.clone(), s.name.clone()));
                    self.scope(s, &sid);
                }
                _ => self.node(s, &id(s)),
            }
        }
        for (i, ds) in deps.iter().enumerate() {
            for &d in ds {
                self.edges.push((id(&steps[d]), id(&steps[i])));
            }
        }
    }

    pub fn to_dot(&self, name: &str) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('"', "\\\""));
        let mut out = format!("digraph {} {{\n  rankdir=LR;\n  node [shape=box];\n", q(name));
        for (id, label) in &self.nodes {
            out.push_str(&format!("  {} [label={}];\n", q(id), q(label)));
        }
        for (a, b) in &self.edges {
            out.push_str(&format!("  {} -> {};\n", q(a), q(b)));
        }
        out.push_str("}\n");
        out
    }

    pub fn to_mermaid(&self) -> String {
        let key = |s: &str| {
            s.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>()
        };
        let mut out = String::from("flowchart LR\n");
        for (id, label) in &self.nodes {
            out.push_str(&format!(
                "  n_{}[\"{}\"]\n",
                key(id),
                label.replace("\\n", "<br/>").replace('"', "'")
            ));
        }
        for (a, b) in &self.edges {
            out.push_str(&format!("  n_{} --> n_{}\n", key(a), key(b)));
        }
        out
    }
}

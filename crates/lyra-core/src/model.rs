//! The workflow model that the YAML front end produces and the engine runs.
//!
//! A workflow is a tree of [`Step`]s. After [`crate::validate`] has run, every step knows the
//! names it reads from its enclosing scope ([`Step::inputs`]) and every workflow knows which
//! of its children depend on which ([`StepKind::Workflow::deps`]).

use crate::diag::{FileId, Span};
use crate::expr::Expr;
use crate::guard::Guard;
use crate::types::Type;

/// A named, loaded workflow: the top-level step of one file.
#[derive(Debug, Clone)]
pub struct Workflow {
    /// `a::b` for `workflows/a/b.yaml`.
    pub name: String,
    pub file: FileId,
    pub root: Step,
    /// The `providers:` block: each provider's configuration, by namespace. Only the main
    /// workflow's is used (validation refuses one in a called workflow); its values read the
    /// top-level parameters.
    pub providers: Vec<ProviderConfig>,
}

/// One entry of `providers:`, `Postgres: {url: $dbUrl}`.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// The namespace as written (`Postgres`).
    pub namespace: String,
    pub span: Span,
    pub value: Vec<Attr>,
}

/// A resource step's `retry:` and `timeout:`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controls {
    /// How many times a provider call is made at most (1: no retry).
    pub attempts: u32,
    /// The wait before the first retry; doubled after each, up to `max_backoff`.
    pub backoff: std::time::Duration,
    pub max_backoff: std::time::Duration,
    /// The most one provider call may take; it is abandoned then.
    pub timeout: Option<std::time::Duration>,
}

impl Controls {
    /// No retry, no timeout.
    pub fn none() -> Controls {
        Controls {
            attempts: 1,
            backoff: std::time::Duration::from_secs(1),
            max_backoff: std::time::Duration::from_secs(30),
            timeout: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    /// Where the step is defined (its key, or the start of the file for a top-level step).
    pub span: Span,
    pub params: Vec<Param>,
    pub returns: Vec<Return>,
    /// Boxed, as the other parts most steps lack: a workflow of 10,000 steps keeps 10,000
    /// `Step`s, and each byte of one is 10 KB of the model.
    pub when: Option<Box<(Guard, Span)>>,
    pub kind: StepKind,
    /// Filled in by validation: the names this step reads from its enclosing scope.
    pub inputs: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum StepKind {
    Workflow {
        steps: Vec<Step>,
        /// Filled in by validation: for each child, the indices of the children it depends on.
        deps: Vec<Vec<usize>>,
    },
    Resource {
        type_name: String,
        type_span: Span,
        value: Vec<Attr>,
        external_id: Option<Box<(Expr, Span)>>,
        controls: Controls,
    },
    Collection {
        over: Box<Over>,
        over_span: Span,
        /// Names bound in each iteration.
        vars: Vec<String>,
        /// The name of the collected array (default: the step's name).
        into: String,
        step: Box<Step>,
    },
    Call {
        target: String,
        target_span: Span,
        /// Arguments, named by the called workflow's parameters. Their source is read in the
        /// caller's scope (`Implicit`: the caller's variable of the same name); a `ty`
        /// converts the argument before the called parameter's own type does.
        args: Vec<Param>,
    },
}

impl StepKind {
    pub fn label(&self) -> &'static str {
        match self {
            StepKind::Workflow { .. } => "workflow",
            StepKind::Resource { .. } => "resource",
            StepKind::Collection { .. } => "collection",
            StepKind::Call { .. } => "call",
        }
    }
}

/// One attribute of a resource's desired state.
#[derive(Debug, Clone)]
pub struct Attr {
    pub name: String,
    pub span: Span,
    pub expr: Expr,
}

/// What a collection iterates over.
#[derive(Debug, Clone)]
pub enum Over {
    /// An array; each element is bound to the `as` names (destructured when several).
    Each(Expr),
    /// A hash; key and value are bound to the two `as` names.
    EachPair(Expr),
    /// `0..n`.
    Times(Expr),
    /// `a..b`, end exclusive.
    Range(Expr, Expr),
}

impl Over {
    pub fn exprs(&self) -> Vec<&Expr> {
        match self {
            Over::Each(e) | Over::EachPair(e) | Over::Times(e) => vec![e],
            Over::Range(a, b) => vec![a, b],
        }
    }
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub span: Span,
    pub ty: Option<Type>,
    pub source: ParamSource,
    /// What the parameter is for (`doc:`): shown by `lyra inspect` and as the description of
    /// a registered kind's spec field.
    pub doc: Option<String>,
    /// The value taken when the data has no key for the parameter (`default:`, a literal;
    /// only with a lookup or the implicit same-named key).
    pub default: Option<crate::value::Value>,
}

#[derive(Debug, Clone)]
pub enum ParamSource {
    /// The same-named variable of the enclosing scope (or, at the top level, the same-named
    /// data key).
    Implicit,
    /// A key in the lookup data (`a.b.c`).
    Lookup(String),
    /// A value built in the enclosing scope.
    Value(Expr),
}

#[derive(Debug, Clone)]
pub struct Return {
    /// The name this step produces in its enclosing scope.
    pub name: String,
    pub span: Span,
    pub ty: Option<Type>,
    pub source: ReturnSource,
    /// Filled in by validation: whether anything reads this name where it is produced (a
    /// sibling step, or the enclosing workflow's returns). True until then, and for a step
    /// outside a workflow's steps (a collection's, a called workflow's root), whose returns
    /// are taken whole.
    pub read: bool,
}

#[derive(Debug, Clone)]
pub enum ReturnSource {
    /// From the attribute, inner variable or called return of the same name.
    Same,
    /// From the attribute, inner variable or called return named here.
    Alias(String),
    /// Built from inner variables (workflows only).
    Value(Box<Expr>),
}

impl Return {
    /// Whether a resource step makes this return's value: when something reads it, or it has
    /// a type to check.
    pub fn wanted(&self) -> bool {
        self.read || self.ty.is_some()
    }

    /// The attribute / inner name this return reads, unless it is built from a value.
    pub fn source_name(&self) -> Option<&str> {
        match &self.source {
            ReturnSource::Same => Some(&self.name),
            ReturnSource::Alias(a) => Some(a),
            ReturnSource::Value(_) => None,
        }
    }
}

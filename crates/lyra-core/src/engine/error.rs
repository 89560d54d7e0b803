//! Why a step fails. The texts are the messages users see in reports, the history and a
//! resource's status (tests and docs quote them): change them with care.

use std::fmt;

use crate::provider::ProviderError;
use crate::state::StoreError;
use crate::types::TypeError;
use crate::value::too_deep_message;

/// Where a message is about: a workflow location followed by ": ", or nothing.
#[derive(Debug, Default)]
pub(super) struct Loc(Option<String>);

impl Loc {
    pub(super) fn at(location: String) -> Loc {
        Loc(Some(location))
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(l) => write!(f, "{l}: "),
            None => Ok(()),
        }
    }
}

/// A step's failure; its text is the step report's error. (Type errors are boxed: a `Result`
/// carrying one on every value resolved should stay small.)
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error("{at}parameter '{param}': lookup key '{key}' not found in the data")]
    MissingKey { at: Loc, param: String, key: String },
    #[error("{at}parameter '{param}': {}", too_deep_message(&format!("the data at '{}'", .key)))]
    DataTooDeep { at: Loc, param: String, key: String },
    /// `of` says whose parameter it is (" passed to 'w'", " of 'w'"), or is empty.
    #[error("{at}parameter '{param}'{of} {}", type_error_text(.error, *.secret))]
    ParamType {
        at: Loc,
        param: String,
        of: String,
        error: Box<TypeError>,
        secret: bool,
    },
    #[error("{at}return '{name}' {}", type_error_text(.error, *.secret))]
    ReturnType {
        at: Loc,
        name: String,
        error: Box<TypeError>,
        secret: bool,
    },
    /// A template built a value too deep; `at` is its first reference, if any.
    #[error("{at}{}", too_deep_message("the value built here"))]
    BuiltTooDeep { at: Loc },
    #[error("{at}{reference} does not exist")]
    NoSuchPath { at: Loc, reference: String },
    #[error("{at}${name} is not defined here")]
    Unbound { at: Loc, name: String },
    #[error("{at}{problem}")]
    Iteration { at: Loc, problem: IterationError },
    #[error("{at}{}", too_deep_message(&format!("the collected '{}'", .into)))]
    CollectedTooDeep { at: Loc, into: String },
    #[error("{at}workflow '{target}' is not loaded")]
    NotLoaded { at: Loc, target: String },
    #[error("{at}no provider for '{type_name}'")]
    NoProvider { at: Loc, type_name: String },
    #[error("no provider for '{type_name}': cannot delete it")]
    NoProviderToDelete { type_name: String },
    #[error("no provider for '{type_name}': cannot read it")]
    NoProviderToRead { type_name: String },
    #[error(
        "{at}attribute '{attribute}'{} of {type_name} expects {}, got {}",
        inside(.error, *.secret),
        .error.expected,
        found(.error, *.secret)
    )]
    AttributeType {
        at: Loc,
        attribute: String,
        type_name: String,
        error: Box<TypeError>,
        secret: bool,
    },
    #[error("{at}{type_name}: {source}")]
    Provider {
        at: Loc,
        type_name: String,
        source: ProviderError,
    },
    #[error("{at}{type_name} '{external_id}' does not exist")]
    ReadMissing {
        at: Loc,
        type_name: String,
        external_id: String,
    },
    /// Values nested deeper than the limit could be written but never read back.
    #[error(
        "{at}{type_name} returned a value that cannot be recorded: {}",
        too_deep_message(&format!("attribute '{}'", .attribute))
    )]
    Unrecordable {
        at: Loc,
        type_name: String,
        attribute: String,
    },
    /// A record whose `create` may or may not have happened; `forget` is the caller's command
    /// to forget the record.
    #[error(
        "{at}'{step_id}' was possibly created, unrecorded: an earlier run stopped between creating this \
         {type_name} and recording it, and {type_name} cannot tell whether it exists. Check, delete it by \
         hand if it does, then run {forget}"
    )]
    Unrecorded {
        at: Loc,
        step_id: String,
        type_name: String,
        forget: String,
    },
    #[error("recording '{step_id}' in the state failed: {source}")]
    Record { step_id: String, source: StoreError },
    #[error("forgetting '{step_id}' in the state failed: {source}")]
    Forget { step_id: String, source: StoreError },
}

/// Why a collection cannot iterate over its value. Of a secret value, the numbers are not
/// shown.
#[derive(Debug, thiserror::Error)]
pub(super) enum IterationError {
    #[error("'each' needs an array, got {0}")]
    EachNeedsArray(&'static str),
    #[error("'eachPair' needs a hash, got {0}")]
    EachPairNeedsHash(&'static str),
    #[error("'times' and 'range' need integers")]
    NotIntegers,
    #[error("'times' must not be negative, got {0}")]
    NegativeTimes(i64),
    #[error("'times' must not be negative")]
    NegativeSecretTimes,
    #[error("'range' ends ({to}) before it starts ({from})")]
    BackwardRange { from: i64, to: i64 },
    #[error("'range' ends before it starts")]
    BackwardSecretRange,
}

/// A type error for a message. Of a secret value, neither the value nor where inside it
/// the problem is: only what was expected.
pub(super) fn type_error_text(e: &TypeError, secret: bool) -> String {
    if secret {
        format!("expects {}, got a sensitive value (not shown)", e.expected)
    } else {
        e.to_string()
    }
}

fn inside(e: &TypeError, secret: bool) -> String {
    if e.path.is_empty() || secret {
        String::new()
    } else {
        format!(" at '{}'", e.path)
    }
}

fn found(e: &TypeError, secret: bool) -> &str {
    if secret {
        "a sensitive value (not shown)"
    } else {
        &e.found
    }
}

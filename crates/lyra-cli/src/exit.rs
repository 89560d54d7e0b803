//! Exit statuses scripts can trust: 0 success, 1 failure, 2 usage error, 3 locked by another
//! run, 4 changes pending (only when asked: `--detailed-exitcode`), 130 interrupted. And the one way a command that cannot do its work says so: text on
//! stderr, or under `-o json` the error document on stdout (`{"error": {...}}`, see
//! docs/json-output.md).

use lyra_core::diag::{Diagnostics, Sources};
use serde_json::{Map, Value};

use crate::output::{DiagnosticJson, diagnostics_json};

/// An early end of a command, with its exit status and what to tell the user.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    /// What went wrong, as one word for scripts (`error.kind`).
    pub kind: &'static str,
    /// Already reported on stdout (a run's report, whatever its outcome): nothing more to print.
    pub reported: bool,
    /// Boxed: every fallible function returns an `Exit`, most of them never fail.
    details: Box<Details>,
}

#[derive(Debug, Default)]
struct Details {
    /// One paragraph, for `error.message` and (after `error: `) for people.
    message: String,
    /// What people read on stderr when it is more than `error: {message}`: diagnostics with
    /// their source lines, hints.
    text: Option<String>,
    diagnostics: Vec<DiagnosticJson>,
    /// Fields of the error document beyond the common ones (`deployment`, `lease`, ...).
    fields: Map<String, Value>,
}

/// `error.kind`: one word per way a command can fail.
pub mod kind {
    /// Bad arguments, a workflow or file that is not there (exit 2).
    pub const USAGE: &str = "usage";
    /// The workflow, its data or a file given is not valid (exit 1).
    pub const INVALID_INPUT: &str = "invalid_input";
    /// No such deployment (or step) in the state (exit 1).
    pub const NOT_FOUND: &str = "not_found";
    /// No state at the given location, and the command does not create one (exit 1).
    pub const NO_STATE: &str = "no_state";
    /// The state store failed: unreachable, corrupt (exit 1).
    pub const STATE: &str = "state";
    /// Another run holds the deployment's lease (exit 3).
    pub const LOCKED: &str = "locked";
    /// The lease was lost during the run (exit 1).
    pub const LEASE_LOST: &str = "lease_lost";
    /// What the command would write is already there (exit 1).
    pub const CONFLICT: &str = "conflict";
    /// `apply FILE`: something the saved plan was made from moved since (exit 1).
    pub const STALE_PLAN: &str = "stale_plan";
    /// Ctrl-C, SIGTERM or SIGHUP (exit 130).
    pub const INTERRUPTED: &str = "interrupted";
    /// The question before an apply or delete was not answered `yes`: nothing changed (exit 1).
    pub const DECLINED: &str = "declined";
    /// `approve`: the object has no plan awaiting approval (exit 1).
    pub const NOT_AWAITING: &str = "not_awaiting";
    /// Anything else: writing output, starting the runtime (exit 1).
    pub const FAILED: &str = "failed";
}

impl Exit {
    pub const SUCCESS: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    /// Another run holds the deployment's lease.
    pub const LOCKED: u8 = 3;
    /// Something would change, or has drifted: `plan --detailed-exitcode`, `lyra drift`. Not
    /// 2, which scripts already read as a usage error.
    pub const CHANGES: u8 = 4;
    pub const INTERRUPTED: u8 = 130;

    pub fn new(code: u8, kind: &'static str, message: impl Into<String>) -> Exit {
        Exit {
            code,
            kind,
            reported: false,
            details: Box::new(Details {
                message: message.into(),
                ..Details::default()
            }),
        }
    }

    pub fn usage(message: impl Into<String>) -> Exit {
        Exit::new(Self::USAGE, kind::USAGE, message)
    }

    pub fn failure(message: impl Into<String>) -> Exit {
        Exit::new(Self::FAILURE, kind::FAILED, message)
    }

    /// A problem with a file or value given, not located in a workflow.
    pub fn invalid_input(message: impl Into<String>) -> Exit {
        Exit::new(Self::FAILURE, kind::INVALID_INPUT, message)
    }

    pub fn state(e: impl std::fmt::Display) -> Exit {
        Exit::new(Self::FAILURE, kind::STATE, format!("state: {e}"))
    }

    pub fn interrupted(message: impl Into<String>) -> Exit {
        Exit::new(Self::INTERRUPTED, kind::INTERRUPTED, message)
    }

    /// Problems in workflows or data, each at its file:line:col.
    pub fn invalid(d: &Diagnostics, sources: &Sources) -> Exit {
        let n = d.len();
        let mut exit = Exit::invalid_input(format!(
            "the input is not valid: {n} problem{} found",
            if n == 1 { "" } else { "s" }
        ));
        exit.details.text = Some(crate::load::render(d, sources));
        exit.details.diagnostics = diagnostics_json(d, sources);
        exit
    }

    /// The command has printed its report (a run that failed or was cancelled): exit with
    /// `code`, saying nothing more.
    pub fn reported(code: u8) -> Exit {
        Exit {
            reported: true,
            ..Exit::new(code, kind::FAILED, "")
        }
    }

    /// Adds a field to the error document.
    pub fn with(mut self, key: &str, value: impl serde::Serialize) -> Exit {
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        self.details.fields.insert(key.to_owned(), value);
        self
    }

    /// Adds a line for people, after the message.
    pub fn hint(mut self, hint: &str) -> Exit {
        let d = &mut self.details;
        let text = d.text.take().unwrap_or_else(|| format!("error: {}", d.message));
        d.text = Some(format!("{text}\n  {hint}"));
        self
    }

    /// What people read on stderr.
    pub fn human(&self) -> String {
        let d = &self.details;
        d.text.clone().unwrap_or_else(|| format!("error: {}", d.message))
    }

    /// The error document of `-o json`.
    pub fn document(&self) -> Value {
        let mut error = Map::new();
        error.insert("kind".into(), self.kind.into());
        let d = &self.details;
        error.insert("message".into(), d.message.clone().into());
        error.insert("exit_code".into(), self.code.into());
        error.insert(
            "diagnostics".into(),
            serde_json::to_value(&d.diagnostics).unwrap_or(Value::Null),
        );
        for (k, v) in &d.fields {
            error.insert(k.clone(), v.clone());
        }
        serde_json::json!({ "error": error })
    }
}

impl From<anyhow::Error> for Exit {
    fn from(e: anyhow::Error) -> Exit {
        Exit::failure(format!("{e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_document_has_the_common_fields_first() {
        let doc = Exit::usage("bad").with("deployment", "d").document();
        assert_eq!(
            doc.to_string(),
            r#"{"error":{"kind":"usage","message":"bad","exit_code":2,"diagnostics":[],"deployment":"d"}}"#
        );
    }
}

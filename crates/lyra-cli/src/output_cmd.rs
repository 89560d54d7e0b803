//! `lyra output`: the workflow's returns as the deployment's last succeeded apply recorded
//! them (the history keeps them with the run). Secret returns are kept masked, so they are
//! shown as `(sensitive)` and cannot be asked for by name.

use lyra_core::state::{Operation, Outcome, RunReturns};
use lyra_core::value::{Map, Value};
use lyra_state::RunRecord;
use serde::Serialize;

use crate::args::{Output, OutputArgs};
use crate::exit::{Exit, kind};
use crate::{json, near_names, open_existing, print, unknown_deployment, warn};

const SENSITIVE: &str = "(sensitive)";

/// `lyra output -o json`.
#[derive(Debug, Serialize)]
struct OutputJson<'a> {
    deployment: &'a str,
    /// The run whose returns these are; `null` when none is recorded.
    run: Option<i64>,
    /// Every return (or only NAME), secret ones as `(sensitive)`.
    returns: Map,
    /// The names of the secret returns.
    sensitive: Vec<String>,
    /// Why the returns are missing or may be out of date, in words (`null` when they are the
    /// latest apply's).
    note: Option<String>,
}

/// Where the returns come from: the newest run that settled what the deployment returns.
struct Found<'r> {
    run: Option<&'r RunRecord>,
    returns: Option<&'r RunReturns>,
    note: Option<String>,
}

/// Newest first: a succeeded apply gives its returns; a succeeded delete means there are none;
/// runs that change no resource (unlock, forget, import, refresh) are passed over; an apply
/// that failed, was cancelled or never finished is passed over too, but said (its resources
/// may no longer match the older returns).
fn find(history: &[RunRecord]) -> Found<'_> {
    let mut note = None;
    for run in history {
        match (run.operation, run.outcome) {
            (Operation::Apply, Some(Outcome::Succeeded)) => {
                let returns = run.returns.as_ref();
                if returns.is_none() && note.is_none() {
                    note = Some(format!(
                        "run {} recorded no returns (it ran before Lyra kept them): apply again to record them",
                        run.id
                    ));
                }
                return Found {
                    run: Some(run),
                    returns,
                    note,
                };
            }
            (Operation::Delete, Some(Outcome::Succeeded)) => {
                return Found {
                    run: Some(run),
                    returns: None,
                    note: Some(format!("the deployment was deleted (run {})", run.id)),
                };
            }
            (Operation::Apply | Operation::Delete, outcome) if note.is_none() => {
                let how = outcome.map_or("did not finish", |o| match o {
                    Outcome::Failed => "failed",
                    Outcome::Cancelled => "was cancelled",
                    Outcome::Succeeded => "succeeded",
                });
                note = Some(format!(
                    "the latest {} (run {}) {how}: these returns are from before it",
                    run.operation.as_str(),
                    run.id
                ));
            }
            _ => {}
        }
    }
    Found {
        run: None,
        returns: None,
        note: Some(note.unwrap_or_else(|| "no apply of this deployment has succeeded".to_owned())),
    }
}

pub async fn output(a: &OutputArgs, out: Output) -> Result<(), Exit> {
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    let history = store.history(&a.deployment).await.map_err(Exit::state)?;
    if history.is_empty() && store.load(&a.deployment).await.map_err(Exit::state)?.is_none() {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    }
    let found = find(&history);
    let empty = RunReturns::default();
    let recorded = found.returns.unwrap_or(&empty);
    // Recorded masked already; masked again, in case a store holds a value from elsewhere.
    let shown = |name: &str, value: &Value| -> Value {
        if recorded.sensitive.iter().any(|s| s == name) {
            Value::String(SENSITIVE.to_owned())
        } else {
            value.clone()
        }
    };
    let Some(name) = &a.name else {
        let returns: Map = recorded.values.iter().map(|(k, v)| (k.clone(), shown(k, v))).collect();
        return finish(a, out, &found, returns, recorded, None);
    };
    let Some(value) = recorded.values.get(name) else {
        let near = near_names(name, recorded.values.keys().map(String::as_str));
        let mut exit = Exit::new(
            Exit::FAILURE,
            kind::NOT_FOUND,
            format!("deployment '{}' has no return {name:?}", a.deployment),
        )
        .with("deployment", &a.deployment)
        .with("did_you_mean", &near);
        let hint = match (&found.note, near.is_empty()) {
            (_, false) => Some(format!("did you mean: {}?", near.join(", "))),
            (Some(note), true) => Some(note.clone()),
            (None, true) => Some("`lyra output DEPLOYMENT` lists them".to_owned()),
        };
        if let Some(hint) = hint {
            exit = exit.hint(&hint);
        }
        return Err(exit);
    };
    if recorded.sensitive.iter().any(|s| s == name) {
        // A script reading `$(lyra output d token)` must not take the mask for the value.
        return Err(Exit::failure(format!(
            "return '{name}' of deployment '{}' is sensitive: Lyra keeps no secret in its history, \
             so its value is not recorded",
            a.deployment
        ))
        .hint("read it where it is kept (the resource or secret store it comes from)"));
    }
    let mut one = Map::new();
    one.insert(name.clone(), shown(name, value));
    finish(a, out, &found, one, recorded, Some(value))
}

fn finish(
    a: &OutputArgs,
    out: Output,
    found: &Found<'_>,
    returns: Map,
    recorded: &RunReturns,
    named: Option<&Value>,
) -> Result<(), Exit> {
    if out == Output::Json {
        let sensitive = recorded
            .sensitive
            .iter()
            .filter(|s| returns.contains_key(*s))
            .cloned()
            .collect();
        return json(&OutputJson {
            deployment: &a.deployment,
            run: found.run.filter(|_| found.returns.is_some()).map(|r| r.id),
            returns,
            sensitive,
            note: found.note.clone(),
        });
    }
    if let Some(note) = &found.note {
        warn(&format!("note: {note}\n"));
    }
    match named {
        // One value, for scripts: a string as it is, anything else as JSON.
        Some(Value::String(s)) => print(&format!("{s}\n")),
        Some(v) => print(&format!("{v}\n")),
        None if returns.is_empty() => {
            if found.returns.is_some() {
                warn(&format!("deployment '{}' returns nothing\n", a.deployment));
            }
            Ok(())
        }
        None => print(&crate::output::returns_text(&returns)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lyra_core::state::ChangeCounts;

    fn run(id: i64, operation: Operation, outcome: Option<Outcome>, returns: Option<RunReturns>) -> RunRecord {
        RunRecord {
            id,
            deployment: "d".to_owned(),
            workflow: None,
            operation,
            actor: "me".to_owned(),
            started_at: 0,
            finished_at: None,
            outcome,
            counts: ChangeCounts::default(),
            changes: vec![],
            error: None,
            note: None,
            returns,
        }
    }

    fn returns(v: i64) -> Option<RunReturns> {
        let mut values = Map::new();
        values.insert("n".to_owned(), Value::from(v));
        Some(RunReturns {
            values,
            sensitive: vec![],
        })
    }

    #[test]
    fn the_newest_settled_run_decides() {
        let ok = Some(Outcome::Succeeded);
        // Newest first.
        let h = [
            run(4, Operation::Unlock, ok, None),
            run(3, Operation::Apply, Some(Outcome::Failed), None),
            run(2, Operation::Apply, ok, returns(2)),
            run(1, Operation::Apply, ok, returns(1)),
        ];
        let f = find(&h);
        assert_eq!(f.run.map(|r| r.id), Some(2));
        assert_eq!(f.returns, returns(2).as_ref());
        assert!(
            f.note
                .as_deref()
                .is_some_and(|n| n.contains("run 3") && n.contains("failed"))
        );

        let deleted = [
            run(2, Operation::Delete, ok, None),
            run(1, Operation::Apply, ok, returns(1)),
        ];
        let f = find(&deleted);
        assert!(f.returns.is_none());
        assert!(f.note.as_deref().is_some_and(|n| n.contains("deleted")));

        let never = [run(1, Operation::Apply, None, None)];
        let f = find(&never);
        assert!(f.run.is_none() && f.returns.is_none());
        assert!(f.note.as_deref().is_some_and(|n| n.contains("did not finish")));
    }
}

//! `lyra drift`: what changed behind Lyra's back. The engine reads and compares
//! (`Engine::drift`); this prints its report, in words or as the `drift` JSON document, and
//! turns it into the exit code (0 none, 4 drift, 1 a read failed).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use lyra_core::diag::Sources;
use lyra_core::engine::{DriftReport, DriftStatus, EngineError, Quiet, ResourceDrift};
use lyra_core::state::Outcome;
use lyra_core::value::{Value, short};
use serde::Serialize;

use crate::args::{DriftArgs, Output};
use crate::exit::Exit;
use crate::{actor, engine_error, fenced, json, locking, open_existing, print, signals, unknown_deployment};

const SENSITIVE: &str = "(sensitive)";
const ABSENT: &str = "(absent)";

pub async fn drift(a: &DriftArgs, out: Output) -> Result<(), Exit> {
    let providers = crate::providers_for(&a.foobernetes_file, None).await;
    let url = a.state.state.as_deref();
    let store = open_existing(url).await?;
    if store.load(&a.deployment).await.map_err(Exit::state)?.is_none() {
        return Err(unknown_deployment(store.as_ref(), &a.deployment, url).await);
    }
    let cancel = Arc::new(AtomicBool::new(false));
    signals::install(Arc::clone(&cancel), out);
    let sources = Sources::default();
    if !a.refresh_state {
        // Reads only: no lease, so it never waits for (or blocks) a run.
        let report = crate::engine(a.concurrency, &providers, store.as_ref(), &Quiet, &sources, &cancel)
            .drift(&a.deployment, false, &actor())
            .await
            .map_err(|e| engine_error(e, &sources))?;
        return finish(&report, out, None);
    }
    let (providers_ref, sources_ref, cancel_ref) = (&providers, &sources, &cancel);
    let (result, kept) = locking::under_lease(
        &store,
        &a.deployment,
        "refresh",
        &a.lock,
        &cancel,
        |leased| async move {
            crate::engine(
                a.concurrency,
                providers_ref,
                leased.recorder(),
                &Quiet,
                sources_ref,
                cancel_ref,
            )
            .drift(&a.deployment, true, &actor())
            .await
        },
    )
    .await?;
    let report = match result {
        Err(EngineError::Store(e)) if fenced(&e) => return Err(locking::lease_lost(&a.deployment)),
        other => other.map_err(|e| engine_error(e, &sources))?,
    };
    finish(&report, out, (!kept).then(|| locking::lease_lost(&a.deployment)))
}

/// Prints the report and ends the command by it: interrupted, a read failed, drift, or none.
/// A lease lost while refreshing fails the command after the report (under `-o json`, the
/// error document carries it).
fn finish(r: &DriftReport, out: Output, lost: Option<Exit>) -> Result<(), Exit> {
    match (out, lost) {
        (Output::Json, Some(lost)) => return Err(lost.with("report", drift_json(r))),
        (Output::Json, None) => json(&drift_json(r))?,
        (Output::Text, lost) => {
            print(&drift_text(r))?;
            if let Some(lost) = lost {
                return Err(lost);
            }
        }
    }
    match r.outcome {
        Outcome::Cancelled => Err(Exit::reported(Exit::INTERRUPTED)),
        Outcome::Failed => Err(Exit::reported(Exit::FAILURE)),
        Outcome::Succeeded if r.drifted() => Err(Exit::reported(Exit::CHANGES)),
        Outcome::Succeeded => Ok(()),
    }
}

/// `lyra drift -o json`: the CLI's contract, apart from the engine's types.
#[derive(Serialize)]
pub struct DriftJson<'a> {
    pub deployment: &'a str,
    pub workflow: Option<&'a str>,
    /// Whether anything differs: an attribute, or a resource gone.
    pub drifted: bool,
    /// Whether what was read was recorded (`--refresh-state`).
    pub refreshed: bool,
    /// The refresh run in the history; `null` when nothing was recorded.
    pub run: Option<i64>,
    /// `failed` when a resource could not be read (or recorded).
    pub outcome: &'static str,
    pub duration_ms: u128,
    pub counts: DriftCountsJson,
    /// Every recorded resource, by step id.
    pub resources: Vec<DriftResourceJson<'a>>,
}

#[derive(Serialize)]
pub struct DriftCountsJson {
    pub resources: usize,
    pub unchanged: usize,
    pub drifted: usize,
    pub gone: usize,
    pub failed: usize,
    pub skipped: usize,
}

#[derive(Serialize)]
pub struct DriftResourceJson<'a> {
    pub step: &'a str,
    #[serde(rename = "type")]
    pub type_name: &'a str,
    pub external_id: &'a str,
    /// `false`: read-only (`external_id`).
    pub managed: bool,
    /// `unchanged`, `drifted`, `gone`, `failed` (not read) or `skipped` (pending, cancelled).
    pub status: &'static str,
    pub error: Option<&'a str>,
    /// `--refresh-state`: what was read is now recorded.
    pub recorded: bool,
    pub changes: Vec<DriftChangeJson<'a>>,
}

#[derive(Serialize)]
pub struct DriftChangeJson<'a> {
    pub attribute: &'a str,
    pub path: &'a str,
    /// As recorded (`null`: absent), `"(sensitive)"` for a secret.
    pub recorded: Value,
    /// As read now (`null`: absent), `"(sensitive)"` for a secret.
    pub live: Value,
    pub sensitive: bool,
}

fn shown(sensitive: bool, v: Option<&Value>) -> Value {
    match v {
        Some(v) if sensitive && !v.is_null() => Value::String(SENSITIVE.to_owned()),
        Some(v) => v.clone(),
        None => Value::Null,
    }
}

pub fn drift_json(r: &DriftReport) -> DriftJson<'_> {
    DriftJson {
        deployment: &r.deployment,
        workflow: r.workflow.as_deref(),
        drifted: r.drifted(),
        refreshed: r.refreshed,
        run: r.run,
        outcome: r.outcome.as_str(),
        duration_ms: r.duration.as_millis(),
        counts: DriftCountsJson {
            resources: r.resources.len(),
            unchanged: r.count(DriftStatus::Unchanged),
            drifted: r.count(DriftStatus::Drifted),
            gone: r.count(DriftStatus::Gone),
            failed: r.count(DriftStatus::Failed),
            skipped: r.count(DriftStatus::Skipped),
        },
        resources: r
            .resources
            .iter()
            .map(|x| DriftResourceJson {
                step: &x.step_id,
                type_name: &x.type_name,
                external_id: &x.external_id,
                managed: x.managed,
                status: x.status.as_str(),
                error: x.error.as_deref(),
                recorded: x.recorded,
                changes: x
                    .changes
                    .iter()
                    .map(|c| DriftChangeJson {
                        attribute: &c.attribute,
                        path: &c.path,
                        recorded: shown(c.sensitive, c.recorded.as_ref()),
                        live: shown(c.sensitive, c.live.as_ref()),
                        sensitive: c.sensitive,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn label(x: &ResourceDrift) -> String {
    if x.managed {
        format!("{} ({})", x.step_id, x.type_name)
    } else {
        format!("{} ({}, read-only)", x.step_id, x.type_name)
    }
}

fn value_text(sensitive: bool, v: Option<&Value>) -> String {
    match v {
        None => ABSENT.to_owned(),
        Some(_) if sensitive => SENSITIVE.to_owned(),
        Some(v) => short(v),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The report in words: a block per drifted resource, a line per resource gone, failed or not
/// checked, then a summary.
pub fn drift_text(r: &DriftReport) -> String {
    let mut out = String::new();
    for x in &r.resources {
        match x.status {
            DriftStatus::Unchanged => {}
            DriftStatus::Drifted => {
                let _ = writeln!(out, "~ {}", label(x));
                for c in &x.changes {
                    let _ = writeln!(
                        out,
                        "    {}: {} -> {}",
                        c.path,
                        value_text(c.sensitive, c.recorded.as_ref()),
                        value_text(c.sensitive, c.live.as_ref())
                    );
                }
                if let Some(e) = &x.error {
                    let _ = writeln!(out, "  ! not recorded: {e}");
                }
            }
            DriftStatus::Gone => {
                let _ = writeln!(out, "- {}: gone", label(x));
            }
            DriftStatus::Failed => {
                let why = x.error.as_deref().unwrap_or("no reason given");
                let _ = writeln!(out, "! {}: could not be read: {why}", label(x));
            }
            DriftStatus::Skipped => {
                let why = x.error.as_deref().unwrap_or("not read");
                let _ = writeln!(out, "? {}: not checked: {why}", label(x));
            }
        }
    }
    let total = r.resources.len();
    let (gone, failed, skipped) = (
        r.count(DriftStatus::Gone),
        r.count(DriftStatus::Failed),
        r.count(DriftStatus::Skipped),
    );
    let drifted = r.count(DriftStatus::Drifted) + gone;
    if drifted == 0 && failed == 0 && skipped == 0 {
        let n = r.count(DriftStatus::Unchanged);
        let _ = writeln!(
            out,
            "no drift: {} the state",
            plural(n, "resource matches", "resources match")
        );
    } else {
        let mut line = format!("{drifted} of {} drifted", plural(total, "resource", "resources"));
        if gone > 0 {
            let _ = write!(line, " ({gone} gone)");
        }
        if failed > 0 {
            let _ = write!(line, "; {failed} could not be read");
        }
        if skipped > 0 {
            let _ = write!(line, "; {skipped} not checked");
        }
        let _ = writeln!(out, "{line}");
    }
    if r.refreshed {
        let recorded = r.resources.iter().filter(|x| x.recorded).count();
        let run = r.run.map(|id| format!(" (run {id})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "refreshed: recorded what was read of {}{run}; no resource was changed{}",
            plural(recorded, "resource", "resources"),
            if gone > 0 {
                "; gone resources keep their records"
            } else {
                ""
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lyra_core::engine::DriftChange;
    use serde_json::json;

    fn resource(step: &str, status: DriftStatus, changes: Vec<DriftChange>) -> ResourceDrift {
        ResourceDrift {
            step_id: step.into(),
            type_name: "N::R".into(),
            external_id: format!("{step}-1"),
            managed: true,
            status,
            changes,
            error: None,
            recorded: false,
        }
    }

    fn report(resources: Vec<ResourceDrift>) -> DriftReport {
        DriftReport {
            deployment: "d".into(),
            workflow: Some("w".into()),
            refreshed: false,
            run: None,
            resources,
            outcome: Outcome::Succeeded,
            duration: std::time::Duration::ZERO,
        }
    }

    fn change(path: &str, recorded: Option<Value>, live: Option<Value>, sensitive: bool) -> DriftChange {
        DriftChange {
            attribute: path.split('.').next().unwrap().into(),
            path: path.into(),
            recorded,
            live,
            sensitive,
        }
    }

    #[test]
    fn drift_reads_like_a_plan() {
        let mut pending = resource("p", DriftStatus::Skipped, vec![]);
        pending.error = Some("pending".into());
        let r = report(vec![
            resource(
                "a",
                DriftStatus::Drifted,
                vec![
                    change("config.name", Some(json!("beta")), Some(json!("gamma")), false),
                    change("extra", None, Some(json!(1)), false),
                    change("password", Some(json!("(sensitive)")), Some(json!("(sensitive)")), true),
                ],
            ),
            resource("b", DriftStatus::Gone, vec![]),
            resource("c", DriftStatus::Unchanged, vec![]),
            pending,
        ]);
        assert_eq!(
            drift_text(&r),
            "~ a (N::R)\n\
             \x20   config.name: \"beta\" -> \"gamma\"\n\
             \x20   extra: (absent) -> 1\n\
             \x20   password: (sensitive) -> (sensitive)\n\
             - b (N::R): gone\n\
             ? p (N::R): not checked: pending\n\
             2 of 4 resources drifted (1 gone); 1 not checked\n"
        );
        let r = report(vec![resource("c", DriftStatus::Unchanged, vec![])]);
        assert_eq!(drift_text(&r), "no drift: 1 resource matches the state\n");
    }
}

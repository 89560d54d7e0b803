//! What the CLI prints. The JSON shapes here are the CLI's stable output contract, separate
//! from the engine's types: scripts depend on them.

use std::fmt::Write as _;

use lyra_core::diag::{Diagnostics, Sources};
use lyra_core::report::{Action, AttrChange, Mode, Report, Status, StepReport};
use lyra_core::state::{ChangeCounts, ResourceRecord, UnreadableRecord};
use lyra_core::value::{Map, Value, short};
use lyra_state::{DeploymentSummary, Lease, RunRecord};
use serde::Serialize;

// Times and leases read the same in messages from the CLI and from the state's lease keeper.
pub use lyra_state::lease::{describe as lease_text, utc as time_text};

const SENSITIVE: &str = "(sensitive)";
const KNOWN_AFTER_APPLY: &str = "(known after apply)";

#[derive(Serialize)]
pub struct ReportJson<'a> {
    pub deployment: &'a str,
    pub workflow: Option<&'a str>,
    pub operation: &'static str,
    pub outcome: &'static str,
    pub duration_ms: u128,
    pub counts: &'a ChangeCounts,
    pub returns: Map,
    pub steps: Vec<StepJson<'a>>,
}

#[derive(Serialize)]
pub struct StepJson<'a> {
    pub step: &'a str,
    #[serde(rename = "type")]
    pub type_name: Option<&'a str>,
    pub action: &'static str,
    pub status: &'static str,
    pub external_id: Option<&'a str>,
    pub duration_ms: u128,
    pub error: Option<&'a str>,
    /// Attribute changes (plans, and what an apply changed); `[]` when none.
    pub changes: Vec<ChangeJson<'a>>,
}

#[derive(Serialize)]
pub struct ChangeJson<'a> {
    /// The top-level attribute.
    pub attribute: &'a str,
    /// Where in it the change is: the attribute itself, or a path into it (`config.name`).
    pub path: &'a str,
    pub old: Value,
    /// `null` with `known_after_apply: true` when the value is not known yet.
    pub new: Value,
    pub known_after_apply: bool,
    pub forces_replace: bool,
}

fn mask(c: &AttrChange, v: Option<&Value>) -> Value {
    match v {
        Some(_) if c.sensitive => Value::String(SENSITIVE.to_owned()),
        Some(v) => v.clone(),
        None => Value::Null,
    }
}

pub fn report_json(r: &Report) -> ReportJson<'_> {
    ReportJson {
        deployment: &r.deployment,
        workflow: r.workflow.as_deref(),
        operation: match r.mode {
            Mode::Plan => "plan",
            Mode::Apply => "apply",
            Mode::Delete => "delete",
        },
        outcome: r.outcome.as_str(),
        duration_ms: r.duration.as_millis(),
        counts: &r.counts,
        returns: masked_returns(r),
        steps: r
            .steps
            .iter()
            .map(|s| StepJson {
                step: &s.id,
                type_name: s.type_name.as_deref(),
                action: s.action.as_str(),
                status: s.status.as_str(),
                external_id: s.external_id.as_deref(),
                duration_ms: s.duration.as_millis(),
                error: s.error.as_deref(),
                changes: s
                    .changes
                    .iter()
                    .map(|c| ChangeJson {
                        attribute: &c.attribute,
                        path: &c.path,
                        old: mask(c, c.old.as_ref()),
                        new: mask(c, c.new.as_ref()),
                        known_after_apply: c.new.is_none(),
                        forces_replace: c.forces_replace,
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// A problem in a workflow or data file, as `validate` and the error document list them.
#[derive(Debug, Serialize)]
pub struct DiagnosticJson {
    pub file: Option<String>,
    /// 1-based; `null` when the problem is about the whole file.
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub message: String,
    pub help: Option<String>,
}

pub fn diagnostics_json(d: &Diagnostics, sources: &Sources) -> Vec<DiagnosticJson> {
    d.iter()
        .map(|d| DiagnosticJson {
            file: sources.get(d.span.file).map(|f| f.name.clone()),
            line: (d.span.line > 0).then_some(d.span.line),
            column: (d.span.line > 0).then_some(d.span.col),
            message: d.message.clone(),
            help: d.help.clone(),
        })
        .collect()
}

/// `lyra validate -o json`.
#[derive(Serialize)]
pub struct ValidationJson<'a> {
    pub workflow: &'a str,
    pub valid: bool,
    pub diagnostics: Vec<DiagnosticJson>,
}

/// `lyra graph -o json`: steps by id, and producer → consumer edges.
#[derive(Serialize)]
pub struct GraphJson<'a> {
    pub workflow: &'a str,
    pub nodes: Vec<NodeJson<'a>>,
    pub edges: Vec<EdgeJson<'a>>,
}

#[derive(Serialize)]
pub struct NodeJson<'a> {
    pub step: &'a str,
    /// What the graph shows: the step's name and kind, one per line.
    pub label: String,
}

#[derive(Serialize)]
pub struct EdgeJson<'a> {
    pub from: &'a str,
    pub to: &'a str,
}

pub fn graph_json<'a>(workflow: &'a str, g: &'a lyra_core::graph::Graph) -> GraphJson<'a> {
    GraphJson {
        workflow,
        nodes: g
            .nodes
            .iter()
            .map(|(step, label)| NodeJson {
                step,
                // The graph's labels carry DOT's line break escape.
                label: label.replace("\\n", "\n"),
            })
            .collect(),
        edges: g.edges.iter().map(|(from, to)| EdgeJson { from, to }).collect(),
    }
}

/// Colours of the plan's marks, the way diff and Terraform use them. Written into the text;
/// `print` strips them unless stdout is a terminal that wants colour (see `crate::print`).
mod paint {
    use anstyle::{AnsiColor, Style};

    pub const CREATE: Style = AnsiColor::Green.on_default();
    pub const UPDATE: Style = AnsiColor::Yellow.on_default();
    pub const DELETE: Style = AnsiColor::Red.on_default();
    pub const FAILED: Style = AnsiColor::Red.on_default().bold();
    pub const SUMMARY: Style = Style::new().bold();

    pub fn paint(style: Style, text: &str) -> String {
        format!("{style}{text}{style:#}")
    }
}

/// An action's mark, coloured.
fn mark(a: Action) -> String {
    let style = match a {
        Action::Create => paint::CREATE,
        Action::Update => paint::UPDATE,
        Action::Replace | Action::Delete | Action::Forget => paint::DELETE,
        Action::Read | Action::Noop | Action::Group => return sign(a).to_owned(),
    };
    paint::paint(style, sign(a))
}

fn sign(a: Action) -> &'static str {
    match a {
        Action::Create => "+",
        Action::Update => "~",
        Action::Replace => "-/+",
        Action::Delete | Action::Forget => "-",
        Action::Read => "<=",
        Action::Noop | Action::Group => " ",
    }
}

fn value_text(c: &AttrChange, v: Option<&Value>) -> String {
    match v {
        _ if c.sensitive => SENSITIVE.to_owned(),
        Some(v) => short(v),
        None => KNOWN_AFTER_APPLY.to_owned(),
    }
}

/// A resource step's label, `id (Type)`; composite steps are named by their id alone.
fn label(s: &StepReport) -> String {
    match &s.type_name {
        Some(t) => format!("{} ({t})", s.id),
        None => s.id.clone(),
    }
}

/// [`plan_coloured`] without its colours: for files and comparisons.
pub fn plan_text(r: &Report) -> String {
    anstream::adapter::strip_str(&plan_coloured(r)).to_string()
}

/// Whether a step has nothing to show in a plan: unchanged, read or guarded off, and neither
/// failed nor skipped.
fn quiet(s: &StepReport) -> bool {
    !matches!(s.status, Status::Failed | Status::Skipped)
        && (matches!(s.action, Action::Noop | Action::Read) || s.status == Status::GuardedOff)
}

/// A plan, Terraform-style: one block per resource that changes, each step that failed or
/// was skipped with why, then a summary line. Its marks are coloured; `print` strips the
/// colours where they do not belong.
pub fn plan_coloured(r: &Report) -> String {
    let mut out = String::new();
    // The unchanged are left out before sorting: a no-change plan of 10,000 steps shows none.
    let mut steps: Vec<&StepReport> = r.steps.iter().filter(|s| !quiet(s)).collect();
    steps.sort_by(|a, b| a.id.cmp(&b.id));
    for s in steps {
        match (s.action, s.status) {
            // Whatever the step was about to do, it did not get there: what stopped it is
            // the news, not the change it would have made.
            (_, status @ (Status::Failed | Status::Skipped)) => {
                let what = if status == Status::Failed { "failed" } else { "skipped" };
                let bang = paint::paint(paint::FAILED, "!");
                match &s.error {
                    Some(e) => writeln!(out, "  {bang} {} {what}: {e}", label(s)),
                    None => writeln!(out, "  {bang} {} {what}", label(s)),
                }
                .ok();
                continue;
            }
            (Action::Group, _) => {
                if let Some(e) = &s.error {
                    let _ = writeln!(out, "  ? {}: {e}", s.id);
                }
                continue;
            }
            (Action::Replace, _) => {
                let _ = writeln!(out, "{} {} will be replaced", mark(Action::Replace), label(s));
            }
            (a, _) => {
                let verb = match a {
                    Action::Create => "created",
                    Action::Update => "updated in place",
                    Action::Delete => "deleted",
                    _ => "forgotten (not deleted: read-only)",
                };
                let _ = writeln!(out, "  {} {} will be {verb}", mark(a), label(s));
            }
        }
        for c in &s.changes {
            let note = if c.forces_replace { "  # forces replacement" } else { "" };
            match &c.old {
                None => {
                    let plus = paint::paint(paint::CREATE, "+");
                    let _ = writeln!(out, "      {plus} {} = {}", c.path, value_text(c, c.new.as_ref()));
                }
                Some(old) => {
                    let _ = writeln!(
                        out,
                        "      {} {}: {} -> {}{note}",
                        paint::paint(paint::UPDATE, "~"),
                        c.path,
                        value_text(c, Some(old)),
                        value_text(c, c.new.as_ref())
                    );
                }
            }
        }
    }
    let c = &r.counts;
    let changes = c.created + c.updated + c.replaced + c.deleted;
    if c.failed + c.skipped > 0 || r.outcome != lyra_core::state::Outcome::Succeeded {
        // Failed, or cancelled: the counts are those of the steps that could be planned.
        let _ = writeln!(
            out,
            "Plan {}: {} failed, {} skipped; {} to create, {} to update, {} to replace, {} to delete, {} unchanged.",
            r.outcome.as_str(),
            c.failed,
            c.skipped,
            c.created,
            c.updated,
            c.replaced,
            c.deleted,
            c.unchanged
        );
    } else if changes == 0 {
        let _ = writeln!(
            out,
            "No changes. {} resource{} up to date.",
            c.unchanged,
            if c.unchanged == 1 { " is" } else { "s are" }
        );
    } else {
        let _ = writeln!(
            out,
            "{} {} to create, {} to update, {} to replace, {} to delete, {} unchanged.",
            paint::paint(paint::SUMMARY, "Plan:"),
            c.created,
            c.updated,
            c.replaced,
            c.deleted,
            c.unchanged
        );
    }
    out
}

/// The end of an apply or delete: failures and skips with why, a summary.
pub fn result_text(r: &Report) -> String {
    let mut out = String::new();
    for s in r
        .steps
        .iter()
        .filter(|s| matches!(s.status, Status::Failed | Status::Skipped))
    {
        let what = if s.status == Status::Failed {
            "failed"
        } else {
            "skipped"
        };
        match &s.error {
            Some(e) => {
                let _ = writeln!(out, "{what}: {}: {e}", s.id);
            }
            None => {
                let _ = writeln!(out, "{what}: {}", s.id);
            }
        }
    }
    let c = &r.counts;
    let verb = if r.mode == Mode::Delete { "delete" } else { "apply" };
    let _ = writeln!(
        out,
        "{verb} {}: {} created, {} updated, {} replaced, {} deleted, {} unchanged, {} failed, {} skipped ({:.2}s)",
        r.outcome.as_str(),
        c.created,
        c.updated,
        c.replaced,
        c.deleted,
        c.unchanged,
        c.failed,
        c.skipped,
        r.duration.as_secs_f64()
    );
    out
}

/// Returns are data: they go to stdout, as YAML-ish `name: json` lines.
pub fn returns_text(returns: &Map) -> String {
    returns.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

#[derive(Serialize)]
pub struct RunJson<'a> {
    pub id: i64,
    pub deployment: &'a str,
    pub workflow: Option<&'a str>,
    pub operation: &'static str,
    pub actor: &'a str,
    pub started_at: String,
    /// `null` while running or when the run never finished (a crash).
    pub finished_at: Option<String>,
    /// `null` while running or when the run never finished (a crash).
    pub outcome: Option<&'static str>,
    pub counts: &'a ChangeCounts,
    pub changes: Vec<RunChangeJson<'a>>,
    pub error: Option<&'a str>,
    /// What a state edit did (`lyra state rm`, `unlock`, `import`), in words.
    pub note: Option<&'a str>,
}

/// A step a run changed (or failed to), as kept in the history.
#[derive(Serialize)]
pub struct RunChangeJson<'a> {
    pub step: &'a str,
    pub action: &'a str,
    pub error: Option<&'a str>,
}

/// A point in time in JSON output: RFC 3339, UTC, to the millisecond.
pub fn instant(ms: i64) -> String {
    let time = match u64::try_from(ms) {
        Ok(ms) => std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        Err(_) => std::time::UNIX_EPOCH,
    };
    humantime::format_rfc3339_millis(time).to_string()
}

pub fn run_json(r: &RunRecord) -> RunJson<'_> {
    RunJson {
        id: r.id,
        deployment: &r.deployment,
        workflow: r.workflow.as_deref(),
        operation: r.operation.as_str(),
        actor: &r.actor,
        started_at: instant(r.started_at),
        finished_at: r.finished_at.map(instant),
        outcome: r.outcome.map(|o| o.as_str()),
        counts: &r.counts,
        changes: r
            .changes
            .iter()
            .map(|c| RunChangeJson {
                step: &c.step_id,
                action: &c.action,
                error: c.error.as_deref(),
            })
            .collect(),
        error: r.error.as_deref(),
        note: r.note.as_deref(),
    }
}

#[derive(Serialize)]
pub struct LeaseJson<'a> {
    pub owner: &'a str,
    pub operation: &'a str,
    /// The holder's process id, where the lease names it (the CLI's do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// On the state store's clock.
    pub since: String,
    pub expires: String,
}

pub fn lease_json(l: &Lease) -> LeaseJson<'_> {
    LeaseJson {
        owner: &l.owner,
        operation: &l.operation,
        pid: lyra_state::lease::holder_pid(l),
        since: instant(l.since),
        expires: instant(l.expires),
    }
}

/// One element of `lyra state list -o json`: the `state show` object without `resources`.
#[derive(Serialize)]
pub struct DeploymentJson<'a> {
    pub deployment: &'a str,
    pub workflow: Option<&'a str>,
    pub lease: Option<LeaseJson<'a>>,
    pub resource_count: usize,
    pub last_run: Option<RunJson<'a>>,
}

pub fn summary_json(d: &DeploymentSummary) -> DeploymentJson<'_> {
    DeploymentJson {
        deployment: &d.name,
        workflow: d.workflow.as_deref(),
        lease: d.lease.as_ref().map(lease_json),
        resource_count: d.resources,
        last_run: d.last_run.as_ref().map(run_json),
    }
}

#[derive(Serialize)]
pub struct UnreadableJson<'a> {
    pub step: &'a str,
    #[serde(rename = "type")]
    pub type_name: &'a str,
    pub error: &'a str,
}

#[derive(Serialize)]
pub struct ResourceJson<'a> {
    pub step: &'a str,
    #[serde(rename = "type")]
    pub type_name: &'a str,
    pub external_id: &'a str,
    /// The actual state the provider last reported, sensitive values masked.
    pub state: Masked<'a>,
    pub managed: bool,
    /// An interrupted run may have created it without recording the result.
    pub pending: bool,
    pub depends_on: &'a [String],
}

/// A record's actual state, masked only when it is written: one masked copy at a time, not
/// one per resource of the whole deployment.
pub struct Masked<'a> {
    record: &'a ResourceRecord,
    shown: &'a dyn Fn(&ResourceRecord) -> Map,
}

impl Serialize for Masked<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.shown)(self.record).serialize(s)
    }
}

/// `lyra state show -o json`, a stable shape for scripts: `deployment`, `workflow`, `lease`,
/// `resources` and `unreadable` (records the store cannot decode, see `lyra state rm`). The
/// records are read one at a time: each resource is written as `next` gives it, so the output of a deployment of
/// any size goes through memory one record at a time. Unreadable records come in their
/// place among the others and are listed after them. `next` failing ends the document
/// early: serialising fails, and [`StreamedStateJson::failure`] says why.
pub struct StreamedStateJson<'a, F> {
    pub deployment: &'a str,
    pub workflow: Option<&'a str>,
    pub lease: Option<LeaseJson<'a>>,
    pub shown: &'a dyn Fn(&ResourceRecord) -> Map,
    next: std::cell::RefCell<F>,
    unreadable: std::cell::RefCell<Vec<UnreadableRecord>>,
    failure: std::cell::RefCell<Option<lyra_core::state::StoreError>>,
}

impl<'a, F> StreamedStateJson<'a, F>
where
    F: FnMut() -> Option<Result<lyra_state::ReadRecord, lyra_core::state::StoreError>>,
{
    pub fn new(
        deployment: &'a str,
        workflow: Option<&'a str>,
        lease: Option<&'a Lease>,
        shown: &'a dyn Fn(&ResourceRecord) -> Map,
        next: F,
    ) -> Self {
        StreamedStateJson {
            deployment,
            workflow,
            lease: lease.map(lease_json),
            shown,
            next: std::cell::RefCell::new(next),
            unreadable: std::cell::RefCell::default(),
            failure: std::cell::RefCell::default(),
        }
    }

    /// The records that could not be read, once the document is written.
    pub fn unreadable(&self) -> Vec<UnreadableRecord> {
        self.unreadable.take()
    }

    /// Why reading stopped part-way, if it did.
    pub fn failure(&self) -> Option<lyra_core::state::StoreError> {
        self.failure.take()
    }
}

impl<F> Serialize for StreamedStateJson<'_, F>
where
    F: FnMut() -> Option<Result<lyra_state::ReadRecord, lyra_core::state::StoreError>>,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut doc = s.serialize_struct("StateJson", 5)?;
        doc.serialize_field("deployment", self.deployment)?;
        doc.serialize_field("workflow", &self.workflow)?;
        doc.serialize_field("lease", &self.lease)?;
        doc.serialize_field("resources", &StreamedResources(self))?;
        let unreadable = self.unreadable.borrow();
        let unreadable: Vec<UnreadableJson<'_>> = unreadable.iter().map(unreadable_json).collect();
        doc.serialize_field("unreadable", &unreadable)?;
        doc.end()
    }
}

struct StreamedResources<'s, 'a, F>(&'s StreamedStateJson<'a, F>);

impl<F> Serialize for StreamedResources<'_, '_, F>
where
    F: FnMut() -> Option<Result<lyra_state::ReadRecord, lyra_core::state::StoreError>>,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        let doc = self.0;
        let mut seq = s.serialize_seq(None)?;
        loop {
            let next = (doc.next.borrow_mut())();
            match next {
                None => break,
                Some(Ok(lyra_state::ReadRecord::Readable(r))) => {
                    seq.serialize_element(&resource_json(&r, doc.shown))?
                }
                Some(Ok(lyra_state::ReadRecord::Unreadable(u))) => doc.unreadable.borrow_mut().push(u),
                Some(Err(e)) => {
                    let message = e.message.clone();
                    *doc.failure.borrow_mut() = Some(e);
                    return Err(S::Error::custom(message));
                }
            }
        }
        seq.end()
    }
}

fn resource_json<'a>(r: &'a ResourceRecord, shown: &'a dyn Fn(&ResourceRecord) -> Map) -> ResourceJson<'a> {
    ResourceJson {
        step: &r.step_id,
        type_name: &r.type_name,
        external_id: &r.external_id,
        state: Masked { record: r, shown },
        managed: r.managed,
        pending: r.pending,
        depends_on: &r.depends_on,
    }
}

pub fn unreadable_json(u: &UnreadableRecord) -> UnreadableJson<'_> {
    UnreadableJson {
        step: &u.step_id,
        type_name: &u.type_name,
        error: &u.error,
    }
}

/// Returns with the sensitive ones masked.
pub fn masked_returns(r: &Report) -> Map {
    r.returns
        .iter()
        .map(|(k, v)| {
            let v = if r.sensitive_returns.contains(k) {
                Value::String(SENSITIVE.to_owned())
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

/// A borderless table: the header, then one row per item.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING).set_header(header.to_vec());
    for r in rows {
        t.add_row(r.clone());
    }
    // Keep lines free of padding at the end, for grep and diff.
    t.to_string().lines().map(|l| l.trim_end().to_owned() + "\n").collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record of step `step` with no state (a `Null::Resource`'s shape).
    pub(crate) fn record(step: &str) -> ResourceRecord {
        ResourceRecord {
            step_id: step.to_owned(),
            type_name: "Null::Resource".to_owned(),
            external_id: format!("x-{step}"),
            desired: Map::new(),
            actual: Map::new(),
            depends_on: vec![],
            managed: true,
            pending: false,
            sensitive: vec![],
            create_key: None,
        }
    }

    /// Records come in as they are read: readable ones are written in order, unreadable ones
    /// listed after them; a failure part-way cuts the document short and says why.
    #[test]
    fn a_streamed_state_is_written_as_read() {
        use lyra_core::state::{StoreError, StoreErrorKind};
        use lyra_state::ReadRecord;
        let shown = |r: &ResourceRecord| r.actual.clone();
        let bad = UnreadableRecord {
            step_id: "b".into(),
            type_name: "T::T".into(),
            error: "corrupt".into(),
        };
        let mut items = vec![
            Ok(ReadRecord::Readable(record("a"))),
            Ok(ReadRecord::Unreadable(bad.clone())),
            Ok(ReadRecord::Readable(record("c"))),
        ]
        .into_iter();
        let doc = StreamedStateJson::new("d", Some("wf"), None, &shown, || items.next());
        let text = serde_json::to_string(&doc).expect("written");
        let value: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value["resources"][0]["step"], "a");
        assert_eq!(value["resources"][1]["step"], "c");
        assert_eq!(value["unreadable"][0]["step"], "b");
        assert_eq!(doc.unreadable(), vec![bad]);
        assert!(doc.failure().is_none());

        let mut items = vec![
            Ok(ReadRecord::Readable(record("a"))),
            Err(StoreError::new(StoreErrorKind::Unavailable, "the server went away")),
            Ok(ReadRecord::Readable(record("never"))),
        ]
        .into_iter();
        let doc = StreamedStateJson::new("d", None, None, &shown, || items.next());
        let mut out = Vec::new();
        assert!(serde_json::to_writer(&mut out, &doc).is_err(), "cut short");
        let out = String::from_utf8(out).expect("text");
        assert!(out.contains("\"step\":\"a\"") && !out.contains("never"), "{out}");
        let failure = doc.failure().expect("why");
        assert_eq!(failure.kind, StoreErrorKind::Unavailable);
    }

    #[test]
    fn formats_times() {
        assert_eq!(time_text(1_796_083_200_000), "2026-12-01T00:00:00Z");
        assert_eq!(instant(1_796_083_200_123), "2026-12-01T00:00:00.123Z");
    }

    fn report(mode: Mode, outcome: lyra_core::state::Outcome, steps: Vec<StepReport>) -> Report {
        let n = |f: &dyn Fn(&StepReport) -> bool| u32::try_from(steps.iter().filter(|s| f(s)).count()).unwrap();
        let counts = ChangeCounts {
            created: n(&|s| s.action == Action::Create && matches!(s.status, Status::Planned | Status::Done)),
            failed: n(&|s| s.status == Status::Failed),
            skipped: n(&|s| s.status == Status::Skipped),
            ..ChangeCounts::default()
        };
        Report {
            mode,
            deployment: "d".into(),
            workflow: None,
            outcome,
            run: None,
            returns: Map::new(),
            sensitive_returns: vec![],
            steps,
            counts,
            duration: std::time::Duration::ZERO,
        }
    }

    fn step(id: &str, type_name: Option<&str>, action: Action, status: Status, error: Option<&str>) -> StepReport {
        StepReport {
            id: id.into(),
            type_name: type_name.map(Into::into),
            action,
            status,
            external_id: None,
            duration: std::time::Duration::ZERO,
            error: error.map(Into::into),
            changes: vec![AttrChange {
                attribute: "input".into(),
                path: "input".into(),
                old: None,
                new: Some(Value::from(1)),
                forces_replace: false,
                sensitive: false,
            }],
            refused: false,
        }
    }

    /// A step that failed or was skipped says so, with why, whatever it was about to do (a
    /// failed create used to read "will be created", its error only in `-o json`); a
    /// composite step too; the summary counts them.
    #[test]
    fn plans_show_failed_and_skipped_steps_with_their_errors() {
        use lyra_core::state::Outcome;
        let r = report(
            Mode::Plan,
            Outcome::Failed,
            vec![
                step(
                    "db",
                    Some("N::R"),
                    Action::Create,
                    Status::Failed,
                    Some("x.yaml:3:4: no such key"),
                ),
                step("up", Some("N::R"), Action::Update, Status::Failed, Some("quota")),
                step(
                    "app",
                    Some("N::R"),
                    Action::Noop,
                    Status::Skipped,
                    Some("it depends on 'db', which did not complete"),
                ),
                step("grp", None, Action::Group, Status::Failed, Some("a step inside failed")),
                step("ok", Some("N::R"), Action::Create, Status::Planned, None),
                step(
                    "old",
                    Some("N::R"),
                    Action::Delete,
                    Status::Skipped,
                    Some("the run was cancelled"),
                ),
            ],
        );
        assert_eq!(
            plan_text(&r),
            "  ! app (N::R) skipped: it depends on 'db', which did not complete\n\
             \x20 ! db (N::R) failed: x.yaml:3:4: no such key\n\
             \x20 ! grp failed: a step inside failed\n\
             \x20 + ok (N::R) will be created\n\
             \x20     + input = 1\n\
             \x20 ! old (N::R) skipped: the run was cancelled\n\
             \x20 ! up (N::R) failed: quota\n\
             Plan failed: 3 failed, 2 skipped; 1 to create, 0 to update, 0 to replace, 0 to delete, 0 unchanged.\n"
        );
        // Cancelled: the plan says it is incomplete, and why each step was not planned.
        let r = report(
            Mode::Plan,
            Outcome::Cancelled,
            vec![
                step("ok", Some("N::R"), Action::Create, Status::Planned, None),
                step(
                    "later",
                    Some("N::R"),
                    Action::Noop,
                    Status::Skipped,
                    Some("the run was cancelled"),
                ),
            ],
        );
        assert_eq!(
            plan_text(&r),
            "  ! later (N::R) skipped: the run was cancelled\n\
             \x20 + ok (N::R) will be created\n\
             \x20     + input = 1\n\
             Plan cancelled: 0 failed, 1 skipped; 1 to create, 0 to update, 0 to replace, 0 to delete, 0 unchanged.\n"
        );
    }

    #[test]
    fn results_list_failed_and_skipped_steps_with_their_errors() {
        use lyra_core::state::Outcome;
        let r = report(
            Mode::Delete,
            Outcome::Failed,
            vec![
                step("db", Some("N::R"), Action::Delete, Status::Failed, Some("N::R: busy")),
                step(
                    "net",
                    Some("N::R"),
                    Action::Delete,
                    Status::Skipped,
                    Some("kept because a resource that depends on it was not deleted"),
                ),
                step("quiet", Some("N::R"), Action::Delete, Status::Failed, None),
                step("gone", Some("N::R"), Action::Delete, Status::Done, None),
            ],
        );
        let text = result_text(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[..3],
            [
                "failed: db: N::R: busy",
                "skipped: net: kept because a resource that depends on it was not deleted",
                "failed: quiet",
            ]
        );
        assert!(
            lines[3].starts_with(
                "delete failed: 0 created, 0 updated, 0 replaced, 0 deleted, 0 unchanged, 2 failed, 1 skipped"
            ),
            "{text}"
        );
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].find("BB"), lines[1].find('1'));
    }
}

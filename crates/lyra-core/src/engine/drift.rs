//! Drift: every resource recorded for a deployment read through its provider and compared
//! with the actual state the record holds, changing nothing. Refreshing records what was read
//! as the new actual state, still changing no resource; a resource found gone keeps its
//! record (the next apply makes it again, `lyra state rm` forgets it).
//!
//! Needs no workflow, like a delete: each record carries the provider settings it was made
//! with. Read-only (`external_id`) records are read and reported too (`managed: false`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use super::error::{Loc, StepError};
use super::{CANCELLED, Engine, EngineError, config};
use crate::engine::change_paths;
use crate::provider::{OpContext, ProviderError};
use crate::secret::{Secrets, masked};
use crate::state::{ChangeCounts, ChangeRecord, Operation, Outcome, ResourceRecord, RunEnd, RunId};
use crate::value::{Value, too_deep};

/// Why a pending record is not read: it has no resource id to read by.
pub const PENDING: &str = "pending: an earlier run stopped while creating it, so there is nothing recorded to compare; the next apply resolves it";

/// What a drift check found, resource by resource. Safe to show as it is: secret values are
/// masked and errors scrubbed, as in a plan's report.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftReport {
    pub deployment: String,
    /// The workflow last applied to the deployment.
    pub workflow: Option<String>,
    /// Whether what was read was recorded (`refresh`).
    pub refreshed: bool,
    /// The refresh run in the history; `None` when nothing was recorded.
    pub run: Option<RunId>,
    /// Every record, by step id.
    pub resources: Vec<ResourceDrift>,
    /// Failed when a read (or, refreshing, a write) failed; cancelled when the run was.
    pub outcome: Outcome,
    pub duration: Duration,
}

impl DriftReport {
    /// How many resources ended with `status`.
    pub fn count(&self, status: DriftStatus) -> usize {
        self.resources.iter().filter(|r| r.status == status).count()
    }

    /// Whether anything differs from the record: an attribute, or a resource gone.
    pub fn drifted(&self) -> bool {
        self.resources
            .iter()
            .any(|r| matches!(r.status, DriftStatus::Drifted | DriftStatus::Gone))
    }
}

/// How one recorded resource compares with what its provider reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftStatus {
    /// As recorded.
    Unchanged,
    /// Some attributes differ (`changes`).
    Drifted,
    /// The provider says it does not exist any more.
    Gone,
    /// It could not be read (`error` says why).
    Failed,
    /// Not read: pending, or the run was cancelled (`error` says which).
    Skipped,
}

impl DriftStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftStatus::Unchanged => "unchanged",
            DriftStatus::Drifted => "drifted",
            DriftStatus::Gone => "gone",
            DriftStatus::Failed => "failed",
            DriftStatus::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDrift {
    pub step_id: String,
    pub type_name: String,
    pub external_id: String,
    /// `false`: a read-only (`external_id`) resource.
    pub managed: bool,
    pub status: DriftStatus,
    /// What differs, attribute by attribute, nested values as paths (`config.name`), in a
    /// stable order.
    pub changes: Vec<DriftChange>,
    /// Why it failed or was skipped, or why what was read could not be recorded.
    pub error: Option<String>,
    /// Refreshing: what was read is now the record's actual state.
    pub recorded: bool,
}

/// One value that differs between the record and the resource.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftChange {
    /// The top-level attribute.
    pub attribute: String,
    /// The attribute, or a path into it.
    pub path: String,
    /// As recorded; `None`: absent.
    pub recorded: Option<Value>,
    /// As read now; `None`: absent.
    pub live: Option<Value>,
    /// A secret: both values are the mask, and a secret's inner keys are not shown.
    pub sensitive: bool,
}

/// Keys the engine or a provider keeps beside the attributes (`lyra:terraform`'s private
/// state): bookkeeping, not something a person changed.
fn bookkeeping(key: &str) -> bool {
    key.starts_with("lyra:")
}

impl Engine<'_> {
    /// Reads every resource recorded for `deployment` and reports what differs from its
    /// record. With `refresh`, records what was read as each drifted resource's actual state,
    /// as a run of its own in the history (the caller holds the deployment's lease); without
    /// it, writes nothing. A deployment that was never recorded has nothing to report.
    pub async fn drift(&self, deployment: &str, refresh: bool, actor: &str) -> Result<DriftReport, EngineError> {
        let started = Instant::now();
        let Some(state) = self.readable(deployment, self.store.load(deployment).await?)? else {
            return Ok(DriftReport {
                deployment: deployment.to_owned(),
                workflow: None,
                refreshed: refresh,
                run: None,
                resources: Vec::new(),
                outcome: Outcome::Succeeded,
                duration: started.elapsed(),
            });
        };
        let run = self
            .begin(refresh, Operation::Refresh, deployment, &state.workflow, actor)
            .await?;
        let schemas = self.providers.schemas();
        let mut known = Secrets::default();
        for rec in &state.resources {
            known.add_record(rec, schemas.get(&rec.type_name));
        }
        let secrets = Mutex::new(known);
        let fatal: Mutex<Option<String>> = Mutex::new(None);
        // The futures are made before the stream: a stream that maps borrowed records to
        // futures is not `Send` for every lifetime, which the controller's tasks need.
        let reads: Vec<_> = state
            .resources
            .iter()
            .map(|rec| self.drift_one(deployment, rec, run.is_some(), &secrets, &fatal))
            .collect();
        let mut resources: Vec<ResourceDrift> = stream::iter(reads)
            .buffer_unordered(self.concurrency.max(1))
            .collect()
            .await;
        resources.sort_by(|a, b| a.step_id.cmp(&b.step_id));
        // Masked with every secret met, as a run's report is: a value read from one resource
        // may echo another's secret.
        let secrets = secrets.into_inner().expect("secrets lock");
        for r in &mut resources {
            redact(&secrets, r);
        }
        let fatal = fatal.into_inner().expect("fatal lock").map(|f| secrets.scrub(&f));
        let outcome = if self.cancel.load(Ordering::SeqCst) {
            Outcome::Cancelled
        } else if fatal.is_some() || resources.iter().any(|r| r.status == DriftStatus::Failed) {
            Outcome::Failed
        } else {
            Outcome::Succeeded
        };
        let report = DriftReport {
            deployment: deployment.to_owned(),
            workflow: state.workflow,
            refreshed: refresh,
            run,
            resources,
            outcome,
            duration: started.elapsed(),
        };
        if let Some(id) = run {
            self.store.finish_run(id, &refresh_end(&report, fatal)).await?;
        }
        Ok(report)
    }

    async fn drift_one(
        &self,
        deployment: &str,
        rec: &ResourceRecord,
        refresh: bool,
        secrets: &Mutex<Secrets>,
        fatal: &Mutex<Option<String>>,
    ) -> ResourceDrift {
        let mut out = ResourceDrift {
            step_id: rec.step_id.clone(),
            type_name: rec.type_name.clone(),
            external_id: rec.external_id.clone(),
            managed: rec.managed,
            status: DriftStatus::Skipped,
            changes: Vec::new(),
            error: None,
            recorded: false,
        };
        if rec.pending {
            out.error = Some(PENDING.to_owned());
            return out;
        }
        if self.cancel.load(Ordering::SeqCst) {
            out.error = Some(CANCELLED.to_owned());
            return out;
        }
        let failed = |mut out: ResourceDrift, e: StepError| {
            out.status = DriftStatus::Failed;
            out.error = Some(e.to_string());
            out
        };
        let Some((schema, provider)) = self.providers.resolve(&rec.type_name) else {
            let e = StepError::NoProviderToRead {
                type_name: rec.type_name.clone(),
            };
            return failed(out, e);
        };
        // As a delete reaches it: with the settings the resource was recorded with.
        let cx = OpContext {
            deployment,
            step_id: &rec.step_id,
            type_name: &rec.type_name,
            idempotency_key: None,
            config: config::recorded(rec).unwrap_or(config::none()),
            cancel: self.cancel,
        };
        let live = match provider.read(&cx, &rec.external_id, Some(&rec.actual)).await {
            Ok(Some(live)) => live,
            Ok(None) | Err(ProviderError::NotFound { .. }) => {
                out.status = DriftStatus::Gone;
                return out;
            }
            Err(source) => {
                let e = StepError::Provider {
                    at: Loc::default(),
                    type_name: rec.type_name.clone(),
                    source,
                };
                return failed(out, e);
            }
        };
        if let Some((k, _)) = live.iter().find(|(_, v)| too_deep(v)) {
            let e = StepError::Unrecordable {
                at: Loc::default(),
                type_name: rec.type_name.clone(),
                attribute: k.clone(),
            };
            return failed(out, e);
        }
        let secret = |k: &str| schema.is_secret(k) || rec.sensitive.iter().any(|s| s == k);
        {
            // The values read of secret attributes are secrets too (a new password), wherever
            // they show up.
            let mut s = secrets.lock().expect("secrets lock");
            for (k, v) in live.iter().filter(|(k, _)| secret(k)) {
                if schema.is_secret(k) {
                    s.add(v);
                } else {
                    s.add_derived(v);
                }
            }
        }
        let keys: BTreeSet<&String> = rec
            .actual
            .keys()
            .chain(live.keys())
            .filter(|k| !bookkeeping(k))
            .collect();
        for k in keys {
            let (recorded, now) = (rec.actual.get(k), live.get(k));
            let paths = change_paths(k, recorded, now);
            if paths.is_empty() {
                continue;
            }
            if secret(k) {
                // One change for the whole value: where inside a secret it changed is not shown.
                out.changes.push(DriftChange {
                    attribute: k.clone(),
                    path: k.clone(),
                    recorded: recorded.cloned(),
                    live: now.cloned(),
                    sensitive: true,
                });
            } else {
                out.changes.extend(paths.into_iter().map(|p| DriftChange {
                    attribute: k.clone(),
                    path: p.path,
                    recorded: p.old,
                    live: p.new,
                    sensitive: false,
                }));
            }
        }
        if out.changes.is_empty() {
            out.status = DriftStatus::Unchanged;
            return out;
        }
        out.status = DriftStatus::Drifted;
        if refresh {
            let updated = ResourceRecord {
                actual: live,
                ..rec.clone()
            };
            match self.store.put_resource(deployment, &updated).await {
                Ok(()) => out.recorded = true,
                Err(source) => {
                    let e = StepError::Record {
                        step_id: rec.step_id.clone(),
                        source,
                    };
                    *fatal.lock().expect("fatal lock") = Some(e.to_string());
                    out.error = Some(e.to_string());
                }
            }
        }
        out
    }
}

/// Masks secret changes (and those holding a known secret) and scrubs the texts.
fn redact(secrets: &Secrets, r: &mut ResourceDrift) {
    for c in &mut r.changes {
        let reveals = |v: &Option<Value>| v.as_ref().is_some_and(|v| secrets.reveals(v));
        c.sensitive |= reveals(&c.recorded) || reveals(&c.live);
        if c.sensitive {
            for v in [&mut c.recorded, &mut c.live].into_iter().flatten() {
                if !v.is_null() {
                    *v = masked();
                }
            }
        }
    }
    if let Some(e) = &mut r.error {
        *e = secrets.scrub(e);
    }
    r.external_id = secrets.scrub(&r.external_id);
}

/// The history's record of a refresh: what was recorded, found gone, or could not be read.
fn refresh_end(r: &DriftReport, fatal: Option<String>) -> RunEnd {
    let n = |s: DriftStatus| u32::try_from(r.count(s)).unwrap_or(u32::MAX);
    let refreshed = r.resources.iter().filter(|x| x.recorded).count();
    let gone = r.count(DriftStatus::Gone);
    let counts = ChangeCounts {
        updated: u32::try_from(refreshed).unwrap_or(u32::MAX),
        unchanged: n(DriftStatus::Unchanged),
        failed: n(DriftStatus::Failed),
        skipped: n(DriftStatus::Skipped),
        ..ChangeCounts::default()
    };
    let changes = r
        .resources
        .iter()
        .filter_map(|x| {
            let action = match x.status {
                _ if x.recorded => "refresh",
                DriftStatus::Gone => "gone",
                DriftStatus::Failed => "read",
                DriftStatus::Drifted if x.error.is_some() => "refresh",
                _ => return None,
            };
            Some(ChangeRecord {
                step_id: x.step_id.clone(),
                action: action.to_owned(),
                error: x.error.clone().filter(|_| !x.recorded),
            })
        })
        .collect();
    let mut note = format!("recorded what was read of {refreshed} drifted resource(s); no resource was changed");
    if gone > 0 {
        note.push_str(&format!("; {gone} gone, their records kept"));
    }
    RunEnd {
        outcome: r.outcome,
        counts,
        changes,
        error: fatal,
        note: Some(note),
        returns: None,
    }
}

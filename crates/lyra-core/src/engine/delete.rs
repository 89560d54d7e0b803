//! Deleting recorded resources (a deployment's delete, an apply's garbage): in reverse
//! dependency order, concurrently where independent, keeping whatever something that could
//! not be deleted still uses.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};

use super::error::{Loc, StepError};
use super::resource::pending_key;
use super::{CANCELLED, Run};
use crate::provider::{Lookup, OpContext, Provider};
use crate::report::{Action, Mode, Status, StepReport};
use crate::state::ResourceRecord;
use crate::value::Map;

/// Where the deletion of each resource stands.
struct Progress {
    /// blockers[i]: how many resources that depend on i are still to be deleted.
    blockers: Vec<usize>,
    /// Whether i could not be deleted, or is kept for something that was not.
    failed: Vec<bool>,
}

impl Run<'_, '_> {
    /// Deletes `records` in reverse dependency order, concurrently where independent.
    /// Returns false if anything could not be deleted.
    pub(super) async fn delete_all(&self, records: Vec<ResourceRecord>) -> bool {
        let n = records.len();
        let index: HashMap<&str, usize> = records
            .iter()
            .enumerate()
            .map(|(i, r)| (r.step_id.as_str(), i))
            .collect();
        // depends[i]: the resources i depends on.
        let mut depends: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut d = Progress {
            blockers: vec![0usize; n],
            failed: vec![false; n],
        };
        for (i, r) in records.iter().enumerate() {
            for dep in &r.depends_on {
                if let Some(&j) = index.get(dep.as_str()) {
                    depends[i].push(j);
                    d.blockers[j] += 1;
                }
            }
        }
        let mut ready: Vec<usize> = (0..n).filter(|i| d.blockers[*i] == 0).collect();
        ready.sort_by(|a, b| records[*b].step_id.cmp(&records[*a].step_id));
        let mut ok = true;
        let mut running = FuturesUnordered::new();
        let records = &records;
        loop {
            let until = self.start_until(running.len());
            while running.len() < until
                && let Some(i) = ready.pop()
            {
                running.push(async move { (i, self.delete_one(&records[i]).await) });
                #[cfg(test)]
                super::tests::note_in_flight(self.deployment, running.len());
            }
            let Some((i, success)) = running.next().await else {
                break;
            };
            if !success {
                ok = false;
                d.failed[i] = true;
            }
            for &j in &depends[i] {
                d.blockers[j] -= 1;
                if d.failed[i] {
                    d.failed[j] = true;
                }
                if d.blockers[j] == 0 {
                    if d.failed[j] {
                        // Something that uses it could not be deleted: keep it, and
                        // everything it uses.
                        self.keep(j, &depends, &mut d, records);
                    } else {
                        ready.push(j);
                    }
                }
            }
        }
        ok
    }

    /// Reports `j` as kept and, once nothing else waits on them, everything it depends on.
    fn keep(&self, j: usize, depends: &[Vec<usize>], d: &mut Progress, records: &[ResourceRecord]) {
        let mut stack = vec![j];
        while let Some(x) = stack.pop() {
            let why = Some("kept because a resource that depends on it was not deleted".to_owned());
            self.report(deletion_report(
                &records[x],
                Action::Delete,
                Status::Skipped,
                Duration::ZERO,
                why,
            ));
            for &k in &depends[x] {
                d.blockers[k] -= 1;
                d.failed[k] = true;
                if d.blockers[k] == 0 {
                    stack.push(k);
                }
            }
        }
    }

    async fn delete_one(&self, rec: &ResourceRecord) -> bool {
        let started = Instant::now();
        if self.cancelled() {
            let why = Some(CANCELLED.to_owned());
            self.report(deletion_report(
                rec,
                Action::Delete,
                Status::Skipped,
                Duration::ZERO,
                why,
            ));
            return false;
        }
        let action = if rec.managed { Action::Delete } else { Action::Forget };
        let finish =
            |status: Status, error: Option<String>| deletion_report(rec, action, status, started.elapsed(), error);
        let failed = |e: StepError| {
            self.report(finish(Status::Failed, Some(e.to_string())));
            false
        };
        if self.mode == Mode::Plan {
            self.report(finish(Status::Planned, None));
            return true;
        }
        // Held for the provider's calls only, as when applying (see `Run::resource`).
        let _slot = self.window.acquire().await;
        let permit = self.sem.acquire().await;
        self.engine.observer.step_started(&rec.step_id, &rec.type_name);
        if rec.managed {
            let Some(provider) = self.engine.providers.get(&rec.type_name) else {
                return failed(StepError::NoProviderToDelete {
                    type_name: rec.type_name.clone(),
                });
            };
            let provider: &Arc<dyn Provider> = provider;
            let provider_failed = |source| StepError::Provider {
                at: Loc::default(),
                type_name: rec.type_name.clone(),
                source,
            };
            let key = rec.pending.then(|| pending_key(self.deployment, rec));
            let no_config: &Map = super::config::none();
            let cx = OpContext {
                deployment: self.deployment,
                step_id: &rec.step_id,
                type_name: &rec.type_name,
                idempotency_key: key.as_deref(),
                // As recorded; a record made before its provider had settings takes the run's.
                config: super::config::recorded(rec)
                    .or_else(|| self.configs.for_type(&rec.type_name).map(|c| &c.map))
                    .unwrap_or(no_config),
                cancel: self.engine.cancel,
            };
            // A pending record has no id: ask the provider what, if anything, was made.
            let target = if rec.pending {
                match provider.lookup(&cx, &super::config::attributes(&rec.desired)).await {
                    Ok(Lookup::Found(c)) => Some((c.external_id, c.actual)),
                    Ok(Lookup::Absent) => None,
                    Ok(Lookup::Unsupported) => {
                        return failed(StepError::Unrecorded {
                            at: Loc::default(),
                            step_id: rec.step_id.clone(),
                            type_name: rec.type_name.clone(),
                            forget: self.engine.hints.forget_records(self.deployment, &[&rec.step_id]),
                        });
                    }
                    Err(e) => return failed(provider_failed(e)),
                }
            } else {
                Some((rec.external_id.clone(), rec.actual.clone()))
            };
            if let Some((ext, actual)) = target
                && let Err(e) = provider.delete(&cx, &ext, &actual).await
            {
                return failed(provider_failed(e));
            }
        }
        drop(permit);
        if let Err(source) = self.engine.store.remove_resource(self.deployment, &rec.step_id).await {
            let e = StepError::Forget {
                step_id: rec.step_id.clone(),
                source,
            };
            *self.fatal.lock().expect("fatal lock") = Some(e.to_string());
            return failed(e);
        }
        self.report(finish(Status::Done, None));
        true
    }
}

/// The report of deleting (or keeping) a recorded resource.
fn deletion_report(
    rec: &ResourceRecord,
    action: Action,
    status: Status,
    duration: Duration,
    error: Option<String>,
) -> StepReport {
    StepReport {
        id: rec.step_id.clone(),
        type_name: Some(rec.type_name.clone()),
        action,
        status,
        external_id: Some(rec.external_id.clone()),
        duration,
        error,
        changes: vec![],
        refused: false,
    }
}

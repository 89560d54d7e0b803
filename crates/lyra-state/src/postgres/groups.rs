//! Puts written together. A run's independent steps record their resources at about the
//! same time; written one statement each they take a pooled connection and a commit (a WAL
//! flush) apiece, and the connections they wait for are the ones other runs need. So the
//! puts of one deployment under one fence that arrive while one of theirs is being written
//! wait for it, and the first of them then writes them all in one statement. The first put
//! of all lets the executor turn once before it writes, and takes along those that came
//! meanwhile (the other steps made ready with its own). A put still returns only once its own
//! record is committed.
//!
//! A put whose group fails for any reason (the lease lost, the server gone, its leader
//! cancelled) is written again alone, so that each gets its own answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::rows::ResourceRow;

/// Most puts written in one statement.
pub(super) const MOST: usize = 64;

/// The deployment, and the fence's token (none: unfenced).
pub(super) type Key = (String, Option<String>);

/// A put waiting for its group.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) row: Arc<ResourceRow>,
    turn: oneshot::Sender<Turn>,
}

/// What a waiting put is told.
#[derive(Debug)]
pub(super) enum Turn {
    /// Committed with its group.
    Written,
    /// Its group failed: it writes itself.
    Alone,
    /// It writes these with its own.
    Lead(Vec<Queued>),
}

/// The puts waiting, by key. A key present means one of its puts is being written.
#[derive(Debug, Default)]
pub(super) struct Groups {
    waiting: Mutex<HashMap<Key, Vec<Queued>>>,
    /// Groups of more than one put written.
    #[cfg(test)]
    pub(super) together: std::sync::atomic::AtomicUsize,
    /// The most puts written in one group.
    #[cfg(test)]
    pub(super) largest: std::sync::atomic::AtomicUsize,
}

/// What `join` answers.
#[derive(Debug)]
pub(super) enum Joined<'a> {
    /// Nothing of the key is being written: write now.
    Lead,
    /// Wait for the turn.
    Wait(Waiting<'a>),
}

/// A put waiting for its turn. Dropped before it took its turn (cancelled), it gives the turn
/// up: a lead handed to it at that moment would otherwise be lost, and with it the key, whose
/// later puts would wait for a writer that never comes.
#[derive(Debug)]
pub(super) struct Waiting<'a> {
    groups: &'a Groups,
    key: Key,
    told: oneshot::Receiver<Turn>,
}

impl Waiting<'_> {
    /// None: the leader went without an answer (its future dropped).
    pub(super) async fn turn(mut self) -> Option<Turn> {
        (&mut self.told).await.ok()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // No turn can come after this; one that came and was not taken is passed on.
        self.told.close();
        if let Ok(Turn::Lead(group)) = self.told.try_recv() {
            drop(Leading::new(self.groups, self.key.clone(), group));
        }
    }
}

impl Groups {
    pub(super) fn join(&self, key: &Key, row: &Arc<ResourceRow>) -> Joined<'_> {
        let mut groups = self.waiting.lock().expect("put groups lock");
        match groups.get_mut(key) {
            None => {
                groups.insert(key.clone(), Vec::new());
                Joined::Lead
            }
            Some(queue) => {
                let (turn, told) = oneshot::channel();
                queue.push(Queued {
                    row: Arc::clone(row),
                    turn,
                });
                Joined::Wait(Waiting {
                    groups: self,
                    key: key.clone(),
                    told,
                })
            }
        }
    }

    /// The key's writer is done: the first put waiting leads the next group (itself and up
    /// to [`MOST`] - 1 behind it), or the key is free.
    fn hand_over(&self, key: &Key) {
        let mut groups = self.waiting.lock().expect("put groups lock");
        let Some(queue) = groups.get_mut(key) else { return };
        loop {
            if queue.is_empty() {
                groups.remove(key);
                return;
            }
            let mut group: Vec<Queued> = queue.drain(..queue.len().min(MOST)).collect();
            let next = group.remove(0);
            match next.turn.send(Turn::Lead(group)) {
                Ok(()) => return,
                // It stopped waiting (cancelled): the rest go back, the next one leads.
                Err(Turn::Lead(group)) => {
                    queue.splice(0..0, group);
                }
                Err(_) => unreachable!("only a Lead was sent"),
            }
        }
    }

    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        self.waiting.lock().expect("put groups lock").is_empty()
    }
}

/// The writing of one group, from its leader. Dropped however the write ended (even
/// cancelled), it tells the puts it has not answered to write themselves, and hands the key
/// over.
#[derive(Debug)]
pub(super) struct Leading<'a> {
    groups: &'a Groups,
    key: Key,
    pub(super) others: Vec<Queued>,
}

impl<'a> Leading<'a> {
    pub(super) fn new(groups: &'a Groups, key: Key, others: Vec<Queued>) -> Leading<'a> {
        Leading { groups, key, others }
    }

    /// Takes into a group led by a put that found the key free the puts that queued behind
    /// it meanwhile (up to [`MOST`] in all).
    pub(super) fn gather(&mut self) {
        let mut groups = self.groups.waiting.lock().expect("put groups lock");
        if let Some(queue) = groups.get_mut(&self.key) {
            let room = MOST.saturating_sub(1 + self.others.len());
            self.others.extend(queue.drain(..queue.len().min(room)));
        }
    }

    /// The group is committed.
    pub(super) fn written(&mut self) {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::Relaxed;
            if !self.others.is_empty() {
                self.groups.together.fetch_add(1, Relaxed);
            }
            self.groups.largest.fetch_max(1 + self.others.len(), Relaxed);
        }
        for queued in self.others.drain(..) {
            // One that stopped waiting needs no answer.
            let _ = queued.turn.send(Turn::Written);
        }
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        for queued in self.others.drain(..) {
            let _ = queued.turn.send(Turn::Alone);
        }
        self.groups.hand_over(&self.key);
    }
}

/// The rows of a group to write, the last put of a step winning (puts that wait together
/// are unordered, so any one of them is a possible last write).
pub(super) fn distinct<'r>(rows: impl DoubleEndedIterator<Item = &'r ResourceRow>) -> Vec<&'r ResourceRow> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<&ResourceRow> = rows.rev().filter(|r| seen.insert(r.step_id.as_str())).collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: &str) -> Arc<ResourceRow> {
        Arc::new(ResourceRow {
            deployment: "d".to_owned(),
            step_id: step.to_owned(),
            type_name: "T".to_owned(),
            external_id: String::new(),
            desired: "{}".to_owned(),
            actual: "{}".to_owned(),
            depends_on: "[]".to_owned(),
            managed: true,
            pending: false,
            sensitive: "[]".to_owned(),
            updated_at: 0,
            create_key: None,
        })
    }

    fn key() -> Key {
        ("d".to_owned(), Some("t".to_owned()))
    }

    fn waiting(joined: Joined<'_>) -> Waiting<'_> {
        match joined {
            Joined::Wait(waiting) => waiting,
            Joined::Lead => panic!("expected to wait"),
        }
    }

    #[tokio::test]
    async fn the_first_waiting_put_leads_the_ones_behind_it() {
        let groups = Groups::default();
        assert!(matches!(groups.join(&key(), &row("a")), Joined::Lead));
        let b = waiting(groups.join(&key(), &row("b")));
        let c = waiting(groups.join(&key(), &row("c")));
        // Another fence is another group.
        assert!(matches!(groups.join(&("d".to_owned(), None), &row("x")), Joined::Lead));
        drop(Leading::new(&groups, ("d".to_owned(), None), Vec::new()));

        let mut first = Leading::new(&groups, key(), Vec::new());
        first.written();
        drop(first);
        let Some(Turn::Lead(others)) = b.turn().await else {
            panic!("b leads")
        };
        assert_eq!(others.len(), 1);
        assert_eq!(others[0].row.step_id, "c");
        let mut second = Leading::new(&groups, key(), others);
        second.written();
        drop(second);
        assert!(matches!(c.turn().await, Some(Turn::Written)));
        assert!(groups.is_idle());
    }

    #[tokio::test]
    async fn a_leader_gathers_the_puts_that_queued_behind_it() {
        let groups = Groups::default();
        assert!(matches!(groups.join(&key(), &row("a")), Joined::Lead));
        let mut leading = Leading::new(&groups, key(), Vec::new());
        let waits: Vec<_> = (0..MOST + 2)
            .map(|i| waiting(groups.join(&key(), &row(&format!("s{i}")))))
            .collect();
        leading.gather();
        // The leader's own row and MOST - 1 others: one statement's worth.
        assert_eq!(leading.others.len(), MOST - 1);
        assert_eq!(leading.others[0].row.step_id, "s0");
        leading.written();
        drop(leading);
        let mut waits = waits.into_iter();
        for w in waits.by_ref().take(MOST - 1) {
            assert!(matches!(w.turn().await, Some(Turn::Written)));
        }
        // The three left: the first leads the other two.
        let Some(Turn::Lead(rest)) = waits.next().expect("a put left").turn().await else {
            panic!("the first one left leads")
        };
        assert_eq!(rest.len(), 2);
        drop(Leading::new(&groups, key(), rest));
        for w in waits {
            assert!(matches!(w.turn().await, Some(Turn::Alone)));
        }
        assert!(groups.is_idle());
    }

    #[tokio::test]
    async fn a_failed_or_cancelled_group_leaves_each_put_to_itself() {
        let groups = Groups::default();
        assert!(matches!(groups.join(&key(), &row("a")), Joined::Lead));
        let gone = waiting(groups.join(&key(), &row("b")));
        let c = waiting(groups.join(&key(), &row("c")));
        let d = waiting(groups.join(&key(), &row("d")));
        // b stopped waiting: c leads instead, with d.
        drop(gone);
        drop(Leading::new(&groups, key(), Vec::new()));
        let Some(Turn::Lead(others)) = c.turn().await else {
            panic!("c leads")
        };
        assert_eq!(others.len(), 1);
        // Its write fails (dropped unanswered): d writes alone, and the key is free.
        drop(Leading::new(&groups, key(), others));
        assert!(matches!(d.turn().await, Some(Turn::Alone)));
        assert!(groups.is_idle());
    }

    #[test]
    fn a_group_has_at_most_most_puts() {
        let groups = Groups::default();
        assert!(matches!(groups.join(&key(), &row("lead")), Joined::Lead));
        let mut waits: Vec<_> = (0..MOST + 5)
            .map(|i| waiting(groups.join(&key(), &row(&format!("s{i}")))))
            .collect();
        drop(Leading::new(&groups, key(), Vec::new()));
        let Ok(Turn::Lead(others)) = waits.remove(0).told.try_recv() else {
            panic!("s0 leads")
        };
        assert_eq!(others.len(), MOST - 1);
        assert_eq!(groups.waiting.lock().unwrap()[&key()].len(), 5);
    }

    #[tokio::test]
    async fn a_lead_handed_to_a_put_cancelled_meanwhile_is_passed_on() {
        let groups = Groups::default();
        assert!(matches!(groups.join(&key(), &row("a")), Joined::Lead));
        let b = waiting(groups.join(&key(), &row("b")));
        let c = waiting(groups.join(&key(), &row("c")));
        // b is handed the lead (with c behind it), then dropped before it looked.
        drop(Leading::new(&groups, key(), Vec::new()));
        drop(b);
        // c is not left waiting, and the key is free for the next put.
        assert!(matches!(c.turn().await, Some(Turn::Alone)));
        assert!(groups.is_idle());
        assert!(matches!(groups.join(&key(), &row("e")), Joined::Lead));
    }

    #[test]
    fn the_last_put_of_a_step_wins() {
        let (a1, b, a2) = (row("a"), row("b"), row("a"));
        let mut a2_row = (*a2).clone();
        a2_row.type_name = "Later".to_owned();
        let rows = [&*a1, &*b, &a2_row];
        let kept = distinct(rows.into_iter());
        let kept: Vec<(&str, &str)> = kept
            .iter()
            .map(|r| (r.step_id.as_str(), r.type_name.as_str()))
            .collect();
        assert_eq!(kept, [("b", "T"), ("a", "Later")]);
    }
}

//! The records a run starts from, and which of them the run accounts for.

use std::hash::BuildHasher as _;

use hashbrown::HashTable;

use crate::state::ResourceRecord;

/// The deployment's records as the run found them, in step-id order, with an index of their
/// positions. A map owning them cost more to build (each record moved) and to free than
/// planning 10,000 unchanged steps did.
pub(super) struct Prior {
    records: Vec<ResourceRecord>,
    /// The records' step ids end to end, `ends[i]` closing the `i`th: a lookup compares
    /// with these rather than with the records' own, each in its own allocation and cold by
    /// the time the step asks (lookups were a fifth of a no-change plan's engine samples, an
    /// eighth with these).
    ids: String,
    ends: Vec<usize>,
    index: HashTable<usize>,
    /// Seeded at random per process, so ids from a workflow cannot be chosen to collide.
    hasher: foldhash::fast::RandomState,
}

impl Prior {
    pub(super) fn new(mut records: Vec<ResourceRecord>) -> Prior {
        // The stores read them in this order already, so this is usually just a check.
        if !records.is_sorted_by(|a, b| a.step_id <= b.step_id) {
            records.sort_by(|a, b| a.step_id.cmp(&b.step_id));
        }
        // Step ids are the stores' key, so never repeated; were one, its first record is the
        // one (a second, never claimed, would be taken for garbage).
        records.dedup_by(|later, first| later.step_id == first.step_id);
        let mut ids = String::with_capacity(records.iter().map(|r| r.step_id.len()).sum());
        let mut ends = Vec::with_capacity(records.len());
        for r in &records {
            ids.push_str(&r.step_id);
            ends.push(ids.len());
        }
        let hasher = foldhash::fast::RandomState::default();
        let mut index = HashTable::with_capacity(records.len());
        for i in 0..records.len() {
            let hash = hasher.hash_one(id_at(&ids, &ends, i));
            index.insert_unique(hash, i, |&j: &usize| hasher.hash_one(id_at(&ids, &ends, j)));
        }
        Prior {
            records,
            ids,
            ends,
            index,
            hasher,
        }
    }

    /// Where the record of `id` is: for [`Prior::at`] and [`Claims::claim`].
    pub(super) fn position(&self, id: &str) -> Option<usize> {
        self.index
            .find(self.hasher.hash_one(id), |&j| id_at(&self.ids, &self.ends, j) == id)
            .copied()
    }

    pub(super) fn get(&self, id: &str) -> Option<&ResourceRecord> {
        self.position(id).and_then(|i| self.at(i))
    }

    pub(super) fn at(&self, position: usize) -> Option<&ResourceRecord> {
        self.records.get(position)
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    pub(super) fn iter(&self) -> std::slice::Iter<'_, ResourceRecord> {
        self.records.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }
}

/// The `i`th of the step ids laid end to end in `ids`.
fn id_at<'i>(ids: &'i str, ends: &[usize], i: usize) -> &'i str {
    let start = if i == 0 { 0 } else { ends[i - 1] };
    &ids[start..ends[i]]
}

/// Which recorded resources the run accounts for; the rest are garbage. Only recorded ids
/// can be garbage, so a claim is a mark on the record, not a copy of the id.
pub(super) struct Claims {
    claimed: Vec<bool>,
    /// Subtrees accounted for as a whole (`id/`; empty: everything).
    prefixes: Vec<String>,
}

impl Claims {
    pub(super) fn new(prior: &Prior) -> Claims {
        Claims {
            claimed: vec![false; prior.len()],
            prefixes: Vec::new(),
        }
    }

    /// Claims the record at `position` ([`Prior::position`]).
    pub(super) fn claim(&mut self, position: usize) {
        if let Some(c) = self.claimed.get_mut(position) {
            *c = true;
        }
    }

    pub(super) fn claim_subtree(&mut self, prior: &Prior, id: &str) {
        if let Some(at) = prior.position(id) {
            self.claim(at);
        }
        self.prefixes
            .push(if id.is_empty() { String::new() } else { format!("{id}/") });
    }

    /// The records no claim covers, in step-id order.
    pub(super) fn unclaimed<'p>(&self, prior: &'p Prior) -> impl Iterator<Item = &'p ResourceRecord> {
        prior
            .records
            .iter()
            .zip(&self.claimed)
            .filter(|(r, claimed)| !**claimed && !self.prefixes.iter().any(|p| r.step_id.starts_with(p.as_str())))
            .map(|(r, _)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ResourceRecord {
        ResourceRecord::intent(id, "Null::Resource", Default::default(), vec![], String::new())
    }

    #[test]
    fn finds_records_in_any_order() {
        let prior = Prior::new(vec![
            record("b"),
            record("a/1"),
            record("c"),
            record("a"),
            record("é/ü"),
        ]);
        assert_eq!(prior.get("a/1").map(|r| r.step_id.as_str()), Some("a/1"));
        assert_eq!(prior.get("é/ü").map(|r| r.step_id.as_str()), Some("é/ü"));
        assert!(prior.contains("c"));
        // The ids are laid end to end: neither a neighbour's tail nor two ids run together match.
        assert!(!prior.contains("1"));
        assert!(!prior.contains("a/1b"));
        assert!(!prior.contains("d"));
        assert!(!prior.contains(""));
        assert!(prior.get("a/").is_none());
    }

    #[test]
    fn a_repeated_id_keeps_its_first_record() {
        let mut second = record("a");
        second.external_id = "second".into();
        let prior = Prior::new(vec![record("b"), record("a"), second]);
        assert_eq!(prior.get("a").map(|r| r.external_id.as_str()), Some(""));
        let mut claims = Claims::new(&prior);
        claims.claim(prior.position("a").unwrap());
        let left: Vec<&str> = claims.unclaimed(&prior).map(|r| r.step_id.as_str()).collect();
        assert_eq!(left, ["b"]);
    }

    #[test]
    fn unclaimed_are_those_neither_claimed_nor_under_a_claimed_subtree() {
        let prior = Prior::new(vec![
            record("a"),
            record("b/0"),
            record("b/1"),
            record("bb"),
            record("c"),
        ]);
        let mut claims = Claims::new(&prior);
        claims.claim(prior.position("a").unwrap());
        claims.claim_subtree(&prior, "b");
        let left: Vec<&str> = claims.unclaimed(&prior).map(|r| r.step_id.as_str()).collect();
        assert_eq!(left, ["bb", "c"]);
        claims.claim_subtree(&prior, "");
        assert_eq!(claims.unclaimed(&prior).count(), 0);
    }
}

//! What a failover claimant remembers of the stores it could not see (`super::sees` said
//! no), so that a round does not read every such store's directory and bucket again.
//!
//! A verdict stands while the store's registry row is the one it was given for (any change of
//! the row — its owner, its directory, its destination — asks again) and for at most
//! [`RECHECK_AFTER_ROUNDS`] rounds (a volume mounted since, a directory made visible: looked
//! at again). Every round starts by forgetting the stores no silent member owns any more
//! ([`Unseen::start_round`]), so what is kept never outgrows the silent members' stores.
//!
//! Memory only: a restart forgets everything and asks again.

use std::collections::HashMap;

use crate::registry::StoreRecord;

/// How many rounds an unseen verdict stands on an unchanged row.
pub const RECHECK_AFTER_ROUNDS: u64 = 20;

/// The unseen verdicts, by store id (see the module docs).
#[derive(Default)]
pub struct Unseen {
    round: u64,
    verdicts: HashMap<String, Verdict>,
}

struct Verdict {
    row: StoreRecord,
    why: String,
    round: u64,
}

impl Unseen {
    /// Begins a round over `stores`, the stores the silent members own now: forgets the
    /// verdicts of every other store.
    pub fn start_round<'a>(&mut self, stores: impl IntoIterator<Item = &'a StoreRecord>) {
        self.round += 1;
        let ids: std::collections::HashSet<&str> =
            stores.into_iter().map(|r| r.store_id.as_str()).collect();
        self.verdicts.retain(|id, _| ids.contains(id.as_str()));
    }

    /// Whether an unseen verdict on exactly this row still stands (no need to look again).
    pub fn stands(&self, record: &StoreRecord) -> bool {
        self.verdicts.get(&record.store_id).is_some_and(|v| {
            v.row == *record && self.round.saturating_sub(v.round) < RECHECK_AFTER_ROUNDS
        })
    }

    /// Records that `record`'s store cannot be seen, because `why`: `true` when that is news
    /// (no verdict, another row, or another reason before), to be logged once.
    pub fn remember(&mut self, record: &StoreRecord, why: &str) -> bool {
        let news = self
            .verdicts
            .get(&record.store_id)
            .is_none_or(|v| v.row != *record || v.why != why);
        let verdict = Verdict {
            row: record.clone(),
            why: why.to_string(),
            round: self.round,
        };
        self.verdicts.insert(record.store_id.clone(), verdict);
        news
    }

    /// Forgets `store_id`'s verdict (it is seen now).
    pub fn forget(&mut self, store_id: &str) {
        self.verdicts.remove(store_id);
    }

    /// How many verdicts are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.verdicts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, owner: &str) -> StoreRecord {
        StoreRecord {
            store_id: id.into(),
            store_dir: format!("/stores/{id}"),
            destination: format!("file:///bucket/{id}"),
            labels: Default::default(),
            options: serde_json::json!({}),
            node_token_hash: "0".repeat(64),
            instance_id: owner.into(),
            registered_at_ms: 1,
            owner_since_ms: 1,
        }
    }

    #[test]
    fn a_verdict_stands_until_the_row_changes_or_its_rounds_pass() {
        let mut u = Unseen::default();
        let a = row("a", "dead");
        u.start_round([&a]);
        assert!(!u.stands(&a));
        assert!(u.remember(&a, "not under an allowed root"));
        assert!(u.stands(&a));
        // The same verdict again is no news; another reason is.
        assert!(!u.remember(&a, "not under an allowed root"));
        // A change of the row asks again.
        let moved = StoreRecord {
            store_dir: "/elsewhere/a".into(),
            ..a.clone()
        };
        assert!(!u.stands(&moved));
        // And so does time: RECHECK_AFTER_ROUNDS rounds later.
        for _ in 1..RECHECK_AFTER_ROUNDS {
            u.start_round([&a]);
            assert!(u.stands(&a));
        }
        u.start_round([&a]);
        assert!(!u.stands(&a));
        assert!(
            !u.remember(&a, "not under an allowed root"),
            "asked again, same answer"
        );
        assert!(u.stands(&a));
        assert!(u.remember(&a, "does not exist here"));
        u.forget("a");
        assert!(!u.stands(&a));
    }

    #[test]
    fn stores_no_silent_member_owns_are_forgotten() {
        let mut u = Unseen::default();
        let (a, b) = (row("a", "dead"), row("b", "dead"));
        u.start_round([&a, &b]);
        u.remember(&a, "x");
        u.remember(&b, "x");
        assert_eq!(u.len(), 2);
        // b was claimed by another member, or its owner came back.
        u.start_round([&a]);
        assert_eq!(u.len(), 1);
        assert!(u.stands(&a) && !u.stands(&b));
        u.start_round(std::iter::empty());
        assert_eq!(u.len(), 0);
    }
}

//! What retention proved of a prefix's generations while a view lives ([`Settled`]): which
//! generations hold nothing retention may delete, so a later run lists only the others
//! (`retention.rs` says why that is enough). Kept in the [`super::view::View`], which retention
//! updates; its own module, so the view and retention each import it and not each other.
//!
//! # What a crash leaves
//! Nothing: it lives in memory with the view; a new view starts unsettled, and its first run
//! lists all of `gen/`.

use std::collections::BTreeSet;

use crate::manifest::{self, Manifest};

/// The most generations a run lists one by one; more, and it lists all of `gen/` once.
pub const MAX_NARROW_LISTS: usize = 16;

/// What retention proved of the prefix's generations while a view lives (module docs).
#[derive(Debug, Default)]
pub(in crate::worker) struct Settled {
    /// Every generation numbered up to this was listed by a run; `None` before the first run
    /// that listed `gen/`.
    pub(super) through: Option<u64>,
    /// Generations up to `through` that are *not* settled: listed again by the next run.
    pub(super) unsettled: BTreeSet<u64>,
    /// Set when a junk manifest disappeared: the next run lists all of `gen/`.
    pub(super) list_all: bool,
}

impl Settled {
    /// The generations of the objects `m` names may have lost their last manifest.
    pub(super) fn manifest_gone(&mut self, m: Option<&Manifest>) {
        match m {
            Some(m) => self.unsettled.extend(
                m.objects()
                    .filter_map(|o| manifest::parse_generation(&o.key)),
            ),
            None => self.list_all = true,
        }
    }

    /// The generations to list one by one below `upper`, or `None`: list all of `gen/`.
    pub(super) fn narrow(&self, upper: u64) -> Option<BTreeSet<u64>> {
        let through = self.through.filter(|_| !self.list_all)?;
        let mut look: BTreeSet<u64> = self.unsettled.range(..upper).copied().collect();
        for g in through.saturating_add(1)..upper {
            look.insert(g);
            if look.len() > MAX_NARROW_LISTS {
                return None;
            }
        }
        (look.len() <= MAX_NARROW_LISTS).then_some(look)
    }
}

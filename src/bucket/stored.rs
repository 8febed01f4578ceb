//! [`Stored`]: what a store's prefix holds, bytes and objects, as its
//! [`UsageBucket`](super::usage::UsageBucket) learns it, in memory that does not grow with the
//! objects (the service's memory target is 10,000 stores, each of thousands of objects).
//!
//! # Groups
//! Totals are kept per *group* of keys, never per key: a key's group is its directory, the key
//! up to and including its last `/` (`gen/0000000007/wal/` for `gen/0000000007/wal/….seg`,
//! `manifests/`, and `""` for the top-level `LATEST` and `lease`). A group of at most
//! [`MAX_KEPT`] objects also keeps each object's name and length, so a write or delete there is
//! exact; a larger one keeps only its totals. With the service's layout that is a few groups a
//! generation (its claim and snapshot, `side/`, `keys/` with each object's length; `wal/` and
//! `archive/` as totals), one for the manifests and one for the top level: a store's memory
//! grows with its generations, never with its objects. (The rule names no part of the layout:
//! the bucket floor knows none.)
//!
//! # What the totals mean
//! - **A listing sets them.** A listing that covered a group whole (all its pages, of a prefix
//!   the group lies under, from the prefix's start or from a position before the group) sets
//!   the group to what it showed, and a covered group it did not show is gone. A page follows
//!   another when its position ([`super::ListQuery::after`]: our tokens are the last key of the
//!   page before) is where a listing in progress stopped; a page at a position no listing
//!   stopped at (a listing resumed from a key) starts one there, covering only the groups after
//!   it. Retention lists `manifests/` every run and `gen/` (or single generations) as it needs;
//!   resume lists both: the accounting makes no request of its own.
//! - **Writes move them between listings.** In a group that keeps its objects, a successful
//!   write sets the object's length and a successful delete removes it: exact. In a larger
//!   group, a create (`If-None-Match`, or an unconditional write) adds its length and one
//!   object, a replacement (`If-Match`) its length less the group's mean object length, and a
//!   delete takes one object and the mean length (a deleted object's length is not known
//!   there), and a group left with no object holds no bytes. So the totals are exact but after
//!   a partial delete or a replacement in a large group (old `wal/` segments of a generation
//!   whose later ones a kept restore point still names, say): an estimate until the group's
//!   next listing. Retention lists `manifests/` every run, so that group is exact again at the
//!   next run.
//! - A write to a key a listing in progress had already passed (at or before its position) is
//!   added to what that listing showed, so a listing racing the worker's uploads loses none
//!   (give or take a write racing the very page that covers its key).
//! - Not seen: objects others write or delete in groups this process never lists again; a
//!   write whose answer was lost (counted once a listing shows it); an unconditional rewrite of
//!   an existing key of a many-object group (counted twice until the group is listed).
//!
//! At most [`MAX_LISTINGS`] listings are followed at once (more: the oldest is forgotten, and
//! its later pages teach nothing).
//!
//! # What a crash leaves
//! Nothing: the totals are this process's memory. The next one starts at zero and learns the
//! prefix from its resume's and first retention pass's listings.

use std::collections::BTreeMap;

use super::ObjectMeta;

/// The most listings followed page by page at once.
pub const MAX_LISTINGS: usize = 16;

/// The most objects a group keeps by name and length; a larger one keeps only its totals.
pub const MAX_KEPT: usize = 8;

/// Bytes and objects of one group, or of a prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub objects: u64,
}

impl Totals {
    fn mean(&self) -> u64 {
        self.bytes.checked_div(self.objects).unwrap_or(0)
    }

    fn add(&mut self, len: u64) {
        self.bytes = self.bytes.saturating_add(len);
        self.objects = self.objects.saturating_add(1);
    }

    fn take(&mut self, len: u64) {
        self.bytes = self.bytes.saturating_sub(len);
        self.objects = self.objects.saturating_sub(1);
        if self.objects == 0 {
            self.bytes = 0;
        }
    }
}

/// One group: its totals, and its objects while it has at most [`MAX_KEPT`].
#[derive(Debug, Clone)]
struct Group {
    totals: Totals,
    /// Each object's name (after the group's directory) and length; `None` once the group
    /// held more than [`MAX_KEPT`] (until a listing shows it smaller).
    kept: Option<Vec<(String, u64)>>,
}

impl Group {
    fn new() -> Group {
        Group {
            totals: Totals::default(),
            kept: Some(Vec::new()),
        }
    }

    fn write(&mut self, name: &str, write: Write) {
        let Some(kept) = &mut self.kept else {
            match write {
                Write::Created(len) => self.totals.add(len),
                Write::Replaced(len) => {
                    let mean = self.totals.mean();
                    self.totals.take(mean);
                    self.totals.add(len);
                }
                Write::Deleted => {
                    let mean = self.totals.mean();
                    self.totals.take(mean);
                }
            }
            return;
        };
        let at = kept.iter().position(|(n, _)| n == name);
        match (write, at) {
            (Write::Created(len) | Write::Replaced(len), Some(i)) => {
                self.totals.take(kept[i].1);
                self.totals.add(len);
                kept[i].1 = len;
            }
            (Write::Created(len) | Write::Replaced(len), None) => {
                self.totals.add(len);
                kept.push((name.to_string(), len));
                if kept.len() > MAX_KEPT {
                    self.kept = None;
                }
            }
            (Write::Deleted, Some(i)) => {
                let (_, len) = kept.swap_remove(i);
                self.totals.take(len);
            }
            // Not there as far as this group knows: a delete of a missing key succeeds too.
            (Write::Deleted, None) => {}
        }
    }
}

/// The group of `key` (its directory) and its name within it; see the module docs.
pub fn group(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(i) => key.split_at(i + 1),
        None => ("", key),
    }
}

/// A successful write, as the totals see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A new object of this length (or an unconditional write).
    Created(u64),
    /// An `If-Match` write: an object replaced by one of this length.
    Replaced(u64),
    Deleted,
}

fn apply(groups: &mut BTreeMap<String, Group>, key: &str, write: Write) {
    let (g, name) = group(key);
    match write {
        Write::Created(_) | Write::Replaced(_) => groups
            .entry(g.to_string())
            .or_insert_with(Group::new)
            .write(name, write),
        Write::Deleted => {
            if let Some(group) = groups.get_mut(g) {
                group.write(name, write);
                if group.totals.objects == 0 {
                    groups.remove(g);
                }
            }
        }
    }
}

/// A listing in progress: what its pages showed so far, by group.
#[derive(Debug)]
struct Listing {
    prefix: String,
    /// Every key it lists sorts after this (its first page's position); `None`: from the
    /// prefix's start.
    start: Option<String>,
    /// The last key listed so far: where its next page starts.
    position: String,
    shown: BTreeMap<String, Group>,
}

impl Listing {
    /// Whether the listing's range holds `key` and its pages have passed it.
    fn passed(&self, key: &str) -> bool {
        key.starts_with(&self.prefix)
            && self.start.as_deref().is_none_or(|s| key > s)
            && key <= self.position.as_str()
    }

    /// Whether the listing, once complete, shows every key of group `g`.
    fn covers(&self, g: &str) -> bool {
        g.starts_with(&self.prefix) && self.start.as_deref().is_none_or(|s| g > s)
    }
}

/// What a prefix holds, by group; see the module docs.
#[derive(Debug, Default)]
pub struct Stored {
    groups: BTreeMap<String, Group>,
    listings: Vec<Listing>,
}

impl Stored {
    /// Every group's totals added up.
    pub fn totals(&self) -> Totals {
        self.groups
            .values()
            .map(|g| g.totals)
            .fold(Totals::default(), |a, t| Totals {
                bytes: a.bytes.saturating_add(t.bytes),
                objects: a.objects.saturating_add(t.objects),
            })
    }

    /// How many groups are known (what the memory grows with).
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Learns a successful write of `key`.
    pub fn written(&mut self, key: &str, write: Write) {
        apply(&mut self.groups, key, write);
        for l in &mut self.listings {
            if l.passed(key) {
                apply(&mut l.shown, key, write);
            }
        }
    }

    /// Learns one page of a listing of `prefix`: `after` is the query's position
    /// ([`super::ListQuery::after`]), `continued` whether it carried a token (a next page),
    /// `last` whether it is the listing's last page.
    pub fn listed(
        &mut self,
        prefix: &str,
        after: Option<&str>,
        continued: bool,
        objects: &[ObjectMeta],
        last: bool,
    ) {
        let following = continued
            .then(|| {
                self.listings
                    .iter()
                    .position(|l| l.prefix == prefix && Some(l.position.as_str()) == after)
            })
            .flatten();
        let mut listing = match following {
            Some(i) => self.listings.swap_remove(i),
            None => Listing {
                prefix: prefix.to_string(),
                start: after.map(str::to_string),
                position: after.unwrap_or_default().to_string(),
                shown: BTreeMap::new(),
            },
        };
        for o in objects.iter().filter(|o| o.key.starts_with(prefix)) {
            apply(&mut listing.shown, &o.key, Write::Created(o.len));
        }
        if let Some(o) = objects.last() {
            listing.position.clone_from(&o.key);
        }
        if last {
            self.groups.retain(|g, _| !listing.covers(g));
            for (g, t) in std::mem::take(&mut listing.shown) {
                if listing.covers(&g) {
                    self.groups.insert(g, t);
                }
            }
        } else if !objects.is_empty() {
            if self.listings.len() >= MAX_LISTINGS {
                self.listings.remove(0);
            }
            self.listings.push(listing);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key: &str, len: u64) -> ObjectMeta {
        ObjectMeta {
            key: key.to_string(),
            len,
            etag: String::new(),
            modified_ms: None,
            lock: None,
        }
    }

    fn totals(bytes: u64, objects: u64) -> Totals {
        Totals { bytes, objects }
    }

    #[test]
    fn a_group_is_a_directory() {
        assert_eq!(
            group("gen/0000000007/wal/1-2.seg"),
            ("gen/0000000007/wal/", "1-2.seg")
        );
        assert_eq!(
            group("gen/0000000007/GENERATION"),
            ("gen/0000000007/", "GENERATION")
        );
        assert_eq!(group("manifests/42.json"), ("manifests/", "42.json"));
        assert_eq!(group("LATEST"), ("", "LATEST"));
    }

    #[test]
    fn a_listing_sets_the_groups_it_covered_and_only_those() {
        let mut s = Stored::default();
        for (k, n) in [
            ("gen/1/a", 10),
            ("gen/2/a", 20),
            ("gen/3/a", 30),
            ("m/x", 5),
        ] {
            s.written(k, Write::Created(n));
        }
        assert_eq!(s.totals(), totals(65, 4));
        // Another writer deleted gen/2/a and added gen/3/b; a two-page listing of gen/ sees it.
        s.listed("gen/", None, false, &[meta("gen/1/a", 10)], false);
        let page = [meta("gen/3/a", 30), meta("gen/3/b", 3)];
        s.listed("gen/", Some("gen/1/a"), true, &page, true);
        assert_eq!(s.totals(), totals(48, 4));
        assert_eq!(s.groups(), 3);
        // A listing of part of a group covers none.
        s.listed("gen/3/a", None, false, &[], true);
        assert_eq!(s.totals(), totals(48, 4));
    }

    #[test]
    fn a_resumed_listing_covers_the_groups_after_its_position() {
        let mut s = Stored::default();
        for (k, n) in [("gen/1/a", 10), ("gen/2/a", 20), ("gen/3/a", 30)] {
            s.written(k, Write::Created(n));
        }
        // Resumed after gen/1/a (a token no listing here stopped at): gen/2/ is gone, gen/1/
        // (before the position) is not known to be.
        s.listed("gen/", Some("gen/1/a"), true, &[meta("gen/3/a", 30)], true);
        assert_eq!(s.totals(), totals(40, 2));
        // A listing that starts inside a group does not cover it.
        s.listed("gen/", Some("gen/3/0"), false, &[], true);
        assert_eq!(s.totals(), totals(40, 2));
    }

    #[test]
    fn a_small_group_is_exact_and_a_large_one_takes_the_mean() {
        let mut s = Stored::default();
        s.written("gen/1/GENERATION", Write::Created(200));
        s.written("gen/1/snapshot.bin", Write::Created(3000));
        s.written("LATEST", Write::Created(7));
        s.written("LATEST", Write::Replaced(9));
        s.written("gen/1/snapshot.bin", Write::Deleted);
        s.written("gen/1/snapshot.bin", Write::Deleted);
        assert_eq!(
            s.totals(),
            totals(209, 2),
            "exact: the small groups know their objects"
        );
        for i in 0..=MAX_KEPT as u64 {
            s.written(&format!("gen/1/wal/{i}"), Write::Created(10 + 20 * (i % 2)));
        }
        assert_eq!(s.totals(), totals(209 + 170, 11));
        s.written("gen/1/wal/1", Write::Deleted);
        assert_eq!(
            s.totals(),
            totals(209 + 170 - 18, 10),
            "the mean of 170 over 9"
        );
        for i in (0..=MAX_KEPT).filter(|i| *i != 1) {
            s.written(&format!("gen/1/wal/{i}"), Write::Deleted);
        }
        s.written("gen/1/GENERATION", Write::Deleted);
        s.written("LATEST", Write::Deleted);
        assert_eq!(s.totals(), Totals::default(), "emptied groups hold nothing");
        assert_eq!(s.groups(), 0);
    }

    #[test]
    fn a_write_the_listing_had_passed_is_kept() {
        let mut s = Stored::default();
        s.listed("gen/", None, false, &[meta("gen/1/a", 10)], false);
        // Written while the listing runs: gen/1/b after its position (the next page shows
        // it), gen/0/z before it (no page will).
        s.written("gen/0/z", Write::Created(5));
        s.written("gen/1/b", Write::Created(20));
        s.listed("gen/", Some("gen/1/a"), true, &[meta("gen/1/b", 20)], true);
        assert_eq!(s.totals(), totals(35, 3));
    }
}

//! A new registration against the stores already registered, on every instance (the registry
//! is shared, so a PostgreSQL registry's other instances count as much as this one).
//!
//! Refused with a [`Conflict`], in this order (the first that applies answers; the codes are
//! chosen in `error.rs`):
//! - the same store directory: `ALREADY_EXISTS`;
//! - a directory inside or above a registered store's: `FAILED_PRECONDITION` naming that store
//!   (one store's files would be another's, and two workers would read them);
//! - a destination that shares objects with a registered store's (the same bucket and one
//!   prefix equal to or inside the other, see [`Destination::overlaps`]): `FAILED_PRECONDITION`
//!   naming that store. For `Adopt` the message says to deregister it first: adopting a prefix
//!   that a live store still backs up would give the prefix two writers.
//!
//! The fleet checks once before any work (so `Adopt` reads nothing from a refused prefix) and
//! again inside the registry's insert transaction, under its lock, where the answer is final.
//! A registered destination that no longer parses (written by an older version) is compared as
//! text.
//!
//! # Cost
//!
//! A check walks every registered store, so it must cost little per store: a [`Prepared`]
//! memo keeps each registered store's directory as normalized bytes (its path components
//! joined by `/`, so that "inside" is a byte prefix ending at a `/`, exactly
//! [`Path::starts_with`]) and its destination parsed, keyed by store id and checked against
//! the record's text. A store's row never changes, so an entry is built once; entries of
//! stores no longer registered are dropped when the memo has grown to twice the fleet.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::destination::Destination;
use crate::registry::StoreRecord;

/// Why a new store cannot join the registered ones (codes: `error.rs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// The same store directory is registered already.
    #[error("{0}")]
    SameDir(String),
    /// The directory is inside or above a registered store's.
    #[error("{0}")]
    NestedDir(String),
    /// The destination shares objects with a registered store's.
    #[error("{0}")]
    SharedDestination(String),
}

/// What the new store is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    Register,
    Adopt,
}

/// The new store: its resolved directory and its destination (raw and parsed).
pub struct Candidate<'a> {
    pub dir: &'a Path,
    pub destination: &'a str,
    pub parsed: &'a Destination,
    pub intent: Intent,
}

/// What a check needs of one registered store, computed once.
struct Prepared {
    /// The record's text, to tell a memo entry still describes it.
    raw_dir: String,
    raw_destination: String,
    /// The directory's components joined by `/` (see the module docs).
    dir: Vec<u8>,
    /// The destination parsed, or `None` when it no longer parses (compared as text).
    destination: Option<Destination>,
}

impl Prepared {
    fn of(r: &StoreRecord) -> Prepared {
        Prepared {
            raw_dir: r.store_dir.clone(),
            raw_destination: r.destination.clone(),
            dir: normalized(Path::new(&r.store_dir)),
            destination: Destination::recorded(&r.destination).ok(),
        }
    }

    fn describes(&self, r: &StoreRecord) -> bool {
        self.raw_dir == r.store_dir && self.raw_destination == r.destination
    }
}

/// The registered stores as checks need them, by store id (see the module docs).
#[derive(Default)]
pub struct Memo(Mutex<HashMap<String, Prepared>>);

/// `path`'s components joined by `/`: two paths are equal, or one inside the other, exactly
/// when these bytes are equal, or one is a prefix of the other ending where a `/` follows.
fn normalized(path: &Path) -> Vec<u8> {
    path.components()
        .collect::<PathBuf>()
        .as_os_str()
        .as_bytes()
        .to_vec()
}

/// Whether normalized `a` is `b` or inside it ([`Path::starts_with`] on the paths).
fn within(a: &[u8], b: &[u8]) -> bool {
    a.starts_with(b) && (a.len() == b.len() || b.ends_with(b"/") || a[b.len()] == b'/')
}

/// Why `new` cannot join `registered`, if it cannot.
pub fn find(new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<Conflict> {
    find_with(&Memo::default(), new, registered)
}

/// [`find`], with what it needs of each registered store from `memo` (built there on first use).
pub fn find_with(memo: &Memo, new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<Conflict> {
    let mut memo = memo.0.lock().unwrap_or_else(|e| e.into_inner());
    if memo.len() > 2 * registered.len() + 64 {
        let ids: std::collections::HashSet<&str> =
            registered.iter().map(|r| r.store_id.as_str()).collect();
        memo.retain(|id, _| ids.contains(id.as_str()));
    }
    for r in registered {
        let fresh = memo.get(&r.store_id).is_some_and(|p| p.describes(r));
        if !fresh {
            memo.insert(r.store_id.clone(), Prepared::of(r));
        }
    }
    let prepared = |r: &StoreRecord| &memo[&r.store_id];
    let new_dir = normalized(new.dir);
    if let Some(r) = registered.iter().find(|r| prepared(r).dir == new_dir) {
        return Some(Conflict::SameDir(format!(
            "store_dir {} is already registered (store {} on instance {})",
            new.dir.display(),
            r.store_id,
            r.instance_id
        )));
    }
    for r in registered {
        let theirs = &prepared(r).dir;
        let how = if within(&new_dir, theirs) {
            "inside"
        } else if within(theirs, &new_dir) {
            "above"
        } else {
            continue;
        };
        return Some(Conflict::NestedDir(format!(
            "store_dir {} is {how} the directory {} of store {} (instance {}): a store \
             directory cannot hold another store",
            new.dir.display(),
            r.store_dir,
            r.store_id,
            r.instance_id
        )));
    }
    for r in registered {
        let shared = match &prepared(r).destination {
            Some(theirs) => new.parsed.overlaps(theirs),
            None => r.destination == new.destination,
        };
        if !shared {
            continue;
        }
        return Some(Conflict::SharedDestination(match new.intent {
            Intent::Register => format!(
                "destination {} shares objects with {}, where store {} (instance {}) backs \
                 up: one prefix holds one store's backups; choose another prefix",
                new.destination, r.destination, r.store_id, r.instance_id
            ),
            Intent::Adopt => format!(
                "store {} (instance {}) still backs up to {}: deregister it before adopting \
                 its backups into a new store",
                r.store_id, r.instance_id, r.destination
            ),
        }));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, dir: &str, dest: &str) -> StoreRecord {
        StoreRecord {
            store_id: id.into(),
            store_dir: dir.into(),
            destination: dest.into(),
            labels: Default::default(),
            options: serde_json::json!({}),
            node_token_hash: String::new(),
            instance_id: "i".into(),
            registered_at_ms: 0,
        }
    }

    fn code(dir: &str, dest: &str, intent: Intent, reg: &[StoreRecord]) -> String {
        let parsed = Destination::parse(dest).unwrap();
        let c = Candidate {
            dir: Path::new(dir),
            destination: dest,
            parsed: &parsed,
            intent,
        };
        match find(&c, reg) {
            None => "ok".into(),
            Some(Conflict::SameDir(m)) => format!("exists: {m}"),
            Some(Conflict::NestedDir(m) | Conflict::SharedDestination(m)) => {
                format!("precondition: {m}")
            }
        }
    }

    #[test]
    fn within_is_path_starts_with_on_the_normalized_paths() {
        let paths = [
            "/", "/r", "/r/", "/r/a", "/r//a", "/r/./a", "/r/a/", "/r/ab", "/r/a/x", "/r/a/x/y",
            "/s", "/r/b",
        ];
        for a in paths {
            for b in paths {
                let (na, nb) = (normalized(Path::new(a)), normalized(Path::new(b)));
                assert_eq!(
                    within(&na, &nb),
                    Path::new(a).starts_with(b),
                    "{a} within {b}"
                );
                assert_eq!(na == nb, Path::new(a) == Path::new(b), "{a} == {b}");
            }
        }
    }

    #[test]
    fn a_memo_entry_is_rebuilt_when_the_record_differs_and_pruned() {
        let memo = Memo::default();
        let parsed = Destination::parse("s3://b/p/b").unwrap();
        let c = Candidate {
            dir: Path::new("/r/b"),
            destination: "s3://b/p/b",
            parsed: &parsed,
            intent: Intent::Register,
        };
        assert_eq!(
            find_with(&memo, &c, &[record("A", "/r/a", "s3://b/p/a")]),
            None
        );
        // The same id now with another directory (a test's registry reused): not the memo's.
        let moved = [record("A", "/r/b/inner", "s3://b/p/a")];
        assert!(matches!(
            find_with(&memo, &c, &moved),
            Some(Conflict::NestedDir(_))
        ));
        let many: Vec<StoreRecord> = (0..100)
            .map(|i| {
                record(
                    &format!("S{i}"),
                    &format!("/t/{i}"),
                    &format!("s3://b/q/{i}"),
                )
            })
            .collect();
        assert_eq!(find_with(&memo, &c, &many), None);
        assert_eq!(find_with(&memo, &c, &many[..1]), None);
        assert!(memo.0.lock().unwrap().len() <= 66, "not pruned");
    }

    #[test]
    fn contradictions_are_found() {
        let reg = [record("A", "/r/a", "s3://b/p/a")];
        let r = Intent::Register;
        assert_eq!(code("/r/b", "s3://b/p/b", r, &reg), "ok");
        assert!(code("/r/a", "s3://b/p/b", r, &reg).starts_with("exists"));
        let inside = code("/r/a/x", "s3://b/p/b", r, &reg);
        assert!(inside.starts_with("precondition") && inside.contains("store A"));
        assert!(code("/r", "s3://b/p/b", r, &reg).contains("is above"));
        assert!(code("/r/ab", "s3://b/p/ab", r, &reg) == "ok");
        let dest = code("/r/b", "s3://b/p", r, &reg);
        assert!(
            dest.contains("shares objects") && dest.contains("store A"),
            "{dest}"
        );
        assert!(code("/r/b", "s3://b/p/a/x", r, &reg).contains("shares objects"));
        let adopt = code("/r/b", "s3://b/p/a", Intent::Adopt, &reg);
        assert!(adopt.contains("deregister it") && adopt.contains("store A"));
        let legacy = [record("L", "/r/l", "not a url")];
        assert_eq!(code("/r/b", "s3://b/p/a", r, &legacy), "ok");
    }
}

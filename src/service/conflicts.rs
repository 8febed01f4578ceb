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

use std::path::Path;

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

/// Why `new` cannot join `registered`, if it cannot.
pub fn find(new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<Conflict> {
    if let Some(r) = registered
        .iter()
        .find(|r| Path::new(&r.store_dir) == new.dir)
    {
        return Some(Conflict::SameDir(format!(
            "store_dir {} is already registered (store {} on instance {})",
            new.dir.display(),
            r.store_id,
            r.instance_id
        )));
    }
    for r in registered {
        let theirs = Path::new(&r.store_dir);
        let how = if new.dir.starts_with(theirs) {
            "inside"
        } else if theirs.starts_with(new.dir) {
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
        let shared = match Destination::recorded(&r.destination) {
            Ok(theirs) => new.parsed.overlaps(&theirs),
            Err(_) => r.destination == new.destination,
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

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
//! - a destination that shares objects with a registered store's *replica*
//!   (`options.replica`): `FAILED_PRECONDITION` naming that store. A replica's prefix has a
//!   live writer too; a standby registered on it (of the same instance, whose holder id the
//!   replica's lease names) could be promoted beside it.
//!
//! The fleet checks once before any work (so `Adopt` reads nothing from a refused prefix) and
//! again inside the registry's insert transaction, under its lock, where the answer is final.
//! A registered destination that no longer parses (written by an older version) is compared as
//! text.
//!
//! # Cost
//!
//! A check must not walk every registered store: registering a fleet of 10,000 would then be
//! quadratic, under the registry's lock. The stores are kept in an [`Index`]: directories
//! and destinations as [`PathKey`]s in a [`PathIndex`] each, so the same directory, one
//! inside or above, and a destination equal, inside or above are each a lookup or a range
//! (`path_index`'s module docs). The index is built once per full read of the registry and
//! extended by the stores appended since ([`Registered::read`]); any other change rebuilds it.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;

use super::destination::Destination;
use super::path_index::{PathIndex, PathKey};
use crate::registry::{Registered, StoreRecord};

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

/// The registered stores, indexed for checks (see the module docs).
#[derive(Default)]
struct Index {
    /// The registry read the indexed stores came from, and how many of them are indexed.
    read: u64,
    len: usize,
    dirs: PathIndex,
    destinations: PathIndex,
    /// Registered stores' replicas (`options.replica`) that parse.
    replicas: PathIndex,
    /// Destinations that no longer parse (written by an older version), compared as text.
    unparsed: HashMap<String, Vec<usize>>,
}

/// A directory's components, as [`Path::starts_with`] and `==` on paths compare them.
fn dir_key(dir: &Path) -> PathKey {
    let components: Vec<_> = dir.components().collect();
    PathKey::new(components.iter().map(|c| c.as_os_str().as_bytes()))
}

/// A destination's key: two overlap ([`Destination::overlaps`]) exactly when their keys are
/// equal or one is above the other.
fn destination_key(d: &Destination) -> PathKey {
    match d {
        Destination::File(path) => {
            let components: Vec<_> = path.components().collect();
            PathKey::new(
                std::iter::once(&b"file"[..])
                    .chain(components.iter().map(|c| c.as_os_str().as_bytes())),
            )
        }
        Destination::S3 { bucket, prefix } => PathKey::new(
            [&b"s3"[..], bucket.as_bytes()]
                .into_iter()
                .chain(prefix.iter().map(|p| p.as_bytes())),
        ),
    }
}

impl Index {
    /// Indexes `stores[self.len..]`.
    fn extend(&mut self, stores: &[StoreRecord]) {
        for (i, r) in stores.iter().enumerate().skip(self.len) {
            self.dirs.insert(dir_key(Path::new(&r.store_dir)), i);
            match Destination::recorded(&r.destination) {
                Ok(d) => self.destinations.insert(destination_key(&d), i),
                Err(_) => self
                    .unparsed
                    .entry(r.destination.clone())
                    .or_default()
                    .push(i),
            }
            if let Some(replica) = Self::replica_of(r) {
                self.replicas.insert(destination_key(&replica), i);
            }
        }
        self.len = stores.len();
    }

    /// `r`'s replica destination, when its options name one that parses.
    fn replica_of(r: &StoreRecord) -> Option<Destination> {
        let raw = r
            .options
            .get("replica")?
            .as_str()
            .filter(|s| !s.is_empty())?;
        Destination::recorded(raw).ok()
    }

    fn find(&self, new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<Conflict> {
        let dir = dir_key(new.dir);
        if let Some(r) = self.dirs.equal(&dir).map(|i| &registered[i]) {
            return Some(Conflict::SameDir(format!(
                "store_dir {} is already registered (store {} on instance {})",
                new.dir.display(),
                r.store_id,
                r.instance_id
            )));
        }
        let inside = self.dirs.above(&dir).map(|i| (i, "inside"));
        let above = self.dirs.below(&dir).map(|i| (i, "above"));
        if let Some((i, how)) = [inside, above].into_iter().flatten().min() {
            let r = &registered[i];
            return Some(Conflict::NestedDir(format!(
                "store_dir {} is {how} the directory {} of store {} (instance {}): a store \
                 directory cannot hold another store",
                new.dir.display(),
                r.store_dir,
                r.store_id,
                r.instance_id
            )));
        }
        let key = destination_key(new.parsed);
        let shared = [
            self.destinations.equal(&key),
            self.destinations.above(&key),
            self.destinations.below(&key),
            self.unparsed
                .get(new.destination)
                .and_then(|p| p.first().copied()),
        ];
        let Some(i) = shared.into_iter().flatten().min() else {
            let replica = [
                self.replicas.equal(&key),
                self.replicas.above(&key),
                self.replicas.below(&key),
            ];
            let r = &registered[replica.into_iter().flatten().min()?];
            return Some(Conflict::SharedDestination(format!(
                "destination {} shares objects with {}, the replica of store {} (instance \
                 {}), which a live worker writes: choose another prefix",
                new.destination,
                r.options
                    .get("replica")
                    .and_then(|v| v.as_str())
                    .map_or("?", crate::bucket::url::without_query),
                r.store_id,
                r.instance_id
            )));
        };
        let r = &registered[i];
        Some(Conflict::SharedDestination(match new.intent {
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
        }))
    }
}

/// The index of the last check, kept for the next (see the module docs).
#[derive(Default)]
pub struct Memo(Mutex<Index>);

/// Why `new` cannot join `registered`, if it cannot.
pub fn find(new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<Conflict> {
    let mut index = Index::default();
    index.extend(registered);
    index.find(new, registered)
}

/// [`find`] on the stores of a registry check, with the index `memo` kept from the last one.
pub fn find_in(memo: &Memo, new: &Candidate<'_>, registered: Registered<'_>) -> Option<Conflict> {
    let mut index = memo.0.lock().unwrap_or_else(|e| e.into_inner());
    if index.read != registered.read || index.len > registered.stores.len() {
        *index = Index {
            read: registered.read,
            ..Index::default()
        };
    }
    index.extend(registered.stores);
    index.find(new, registered.stores)
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
            owner_since_ms: 0,
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

    /// The walk the index replaces: every registered store, in order.
    fn walk(new: &Candidate<'_>, registered: &[StoreRecord]) -> Option<(usize, &'static str)> {
        if let Some(i) = registered
            .iter()
            .position(|r| Path::new(&r.store_dir) == new.dir)
        {
            return Some((i, "same"));
        }
        if let Some(i) = registered.iter().position(|r| {
            new.dir.starts_with(&r.store_dir) || Path::new(&r.store_dir).starts_with(new.dir)
        }) {
            return Some((i, "nested"));
        }
        registered
            .iter()
            .position(|r| match Destination::recorded(&r.destination) {
                Ok(theirs) => new.parsed.overlaps(&theirs),
                Err(_) => r.destination == new.destination,
            })
            .map(|i| (i, "shared"))
    }

    proptest::proptest! {
        #[test]
        fn the_index_answers_as_the_walk(
            stores in proptest::collection::vec((0u8..40, 0u8..40, proptest::bool::ANY), 0..30),
            queries in proptest::collection::vec((0u8..40, 0u8..40), 1..20),
        ) {
            // Small alphabets, so that equal, nested and shared paths are common.
            let dir = |n: u8| ["/r", "/r/a", "/r/a/b", "/r/ab", "/s", "/r/a/b/c", "/r//a"]
                [usize::from(n % 7)].to_string() + &format!("/{}", n / 7 % 3);
            let dest = |n: u8| match n % 5 {
                0 => format!("s3://b/p/{}", n / 5 % 4),
                1 => format!("s3://b/p/{}/x", n / 5 % 4),
                2 => format!("s3://c/p/{}", n / 5 % 4),
                3 => "s3://b".to_string(),
                _ => format!("file:///d/{}", n / 5 % 4),
            };
            let mut registered: Vec<StoreRecord> = Vec::new();
            let memo = Memo::default();
            for (k, (d, t, legacy)) in stores.iter().enumerate() {
                let destination = if *legacy { format!("legacy {t}") } else { dest(*t) };
                registered.push(record(&format!("S{k}"), &dir(*d), &destination));
                for (qd, qt) in &queries {
                    let (qdir, qdest) = (dir(*qd), dest(*qt));
                    let parsed = Destination::parse(&qdest).unwrap();
                    let c = Candidate {
                        dir: Path::new(&qdir),
                        destination: &qdest,
                        parsed: &parsed,
                        intent: Intent::Register,
                    };
                    let expected = walk(&c, &registered)
                        .map(|(i, kind)| (registered[i].store_id.clone(), kind));
                    let named = |found: Option<Conflict>| {
                        found.map(|f| {
                            let (m, kind) = match f {
                                Conflict::SameDir(m) => (m, "same"),
                                Conflict::NestedDir(m) => (m, "nested"),
                                Conflict::SharedDestination(m) => (m, "shared"),
                            };
                            let id = registered
                                .iter()
                                .find(|r| m.contains(&format!("store {} ", r.store_id)))
                                .map_or(m.clone(), |r| r.store_id.clone());
                            (id, kind)
                        })
                    };
                    let read = Registered { stores: &registered, read: 7 };
                    proptest::prop_assert_eq!(&named(find_in(&memo, &c, read)), &expected);
                    proptest::prop_assert_eq!(&named(find(&c, &registered)), &expected);
                }
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

    /// Issue 40, finding 5c: a new destination (a standby's included) on a registered store's
    /// replica, or inside or above it, is refused naming that store.
    #[test]
    fn a_registered_replica_is_a_destination_in_use() {
        let mut b = record("B", "/r/b", "s3://b/q");
        b.options = serde_json::json!({"replica": "s3://b/p?region=r"});
        let reg = [b];
        for dest in ["s3://b/p", "s3://b/p/x"] {
            for intent in [Intent::Register, Intent::Adopt] {
                let m = code("/r/s", dest, intent, &reg);
                assert!(
                    m.starts_with("precondition")
                        && m.contains("the replica of store B")
                        && !m.contains("region=r"),
                    "{dest}: {m}"
                );
            }
        }
        assert_eq!(code("/r/s", "s3://b/other", Intent::Register, &reg), "ok");
        assert_eq!(code("/r/s", "s3://c/p", Intent::Register, &reg), "ok");
    }
}

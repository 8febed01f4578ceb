//! What restoring each restore point the worker knows would move ([`KnownShapes`]: objects,
//! stored, plain and decoded bytes, as `crate::restore::predict::Shape` counts them; the
//! service turns them into predicted restore times), published after every step: from the
//! manifests the view already holds (those it wrote, read at resume, or read by retention),
//! never a request of its own.
//!
//! # Invariants
//! - A restore point is shown only while the view holds its manifest: one retention deleted
//!   (and the view forgot) leaves the shapes at the next step.
//! - `latest` is the manifest LATEST names, extended by the segments of its generation the
//!   worker shipped after it (what a `restore` without `--restore-point-only` fetches).
//! - An unchanged view costs one hash of a few numbers: the shapes are rebuilt only when the
//!   manifests held, LATEST or the shipped segments changed.
//!
//! What a crash leaves: nothing; the shapes are memory, published again by the next worker.

use std::hash::{Hash, Hasher};

use std::collections::BTreeMap;

use super::view::View;
use crate::manifest::{Manifest, ObjectEntry, SegmentEntry};

/// What restoring one restore point moves: its objects and their bytes as stored, plain, and
/// plain decoded from compressed or sealed objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PointSize {
    pub objects: u64,
    pub stored_bytes: u64,
    pub plain_bytes: u64,
    pub plain_encoded_bytes: u64,
}

impl PointSize {
    /// The restore point of `m` extended by `extension` (segments shipped after it).
    pub fn of(m: &Manifest, extension: &[SegmentEntry]) -> PointSize {
        let mut s = PointSize::default();
        for o in m.objects().chain(extension.iter().map(|e| &e.object)) {
            s.add(o);
        }
        s
    }

    fn add(&mut self, o: &ObjectEntry) {
        self.objects += 1;
        self.stored_bytes = self.stored_bytes.saturating_add(o.len);
        self.plain_bytes = self.plain_bytes.saturating_add(o.plain_len());
        if o.is_encoded() {
            self.plain_encoded_bytes = self.plain_encoded_bytes.saturating_add(o.plain_len());
        }
    }
}

/// One reading of [`KnownShapes`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KnownPoints {
    /// Every restore point the view holds, by manifest key.
    pub points: BTreeMap<String, PointSize>,
    /// The one LATEST names, extended by the segments shipped after it.
    pub latest: Option<PointSize>,
    /// What [`publish`] last built this from, to skip an unchanged view.
    mark: u64,
}

/// The restore points the worker knows (see the module docs); readers take a copy.
#[derive(Debug, Default)]
pub struct KnownShapes(std::sync::Mutex<KnownPoints>);

impl KnownShapes {
    pub fn get(&self) -> KnownPoints {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update<T>(&self, f: impl FnOnce(&mut KnownPoints) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Publishes `view`'s restore points into `known` (see the module docs).
pub(super) fn publish(known: &KnownShapes, view: &View) {
    let latest_key = view.latest.as_ref().map(|(l, _)| l.manifest.as_str());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        view.manifests.len(),
        latest_key,
        view.current.as_ref().map(|g| (g.number, g.segments.len())),
        view.newest_own.as_ref().map(|m| m.commit_seq),
    )
        .hash(&mut h);
    let mark = h.finish();
    if known.update(|k| k.mark == mark && mark != 0) {
        return;
    }
    let newest = latest_key
        .and_then(|key| view.manifests.get(key).cloned().flatten())
        .or_else(|| view.newest_own.clone());
    let latest = newest.as_ref().map(|m| {
        let extension = match &view.current {
            Some(g)
                if g.number == m.generation
                    && g.segments.len() > m.segments.len()
                    && g.segments.get(..m.segments.len()) == Some(&m.segments[..]) =>
            {
                &g.segments[m.segments.len()..]
            }
            _ => &[],
        };
        PointSize::of(m, extension)
    });
    known.update(|k| {
        k.points
            .retain(|key, _| matches!(view.manifests.get(key), Some(Some(_))));
        for (key, m) in &view.manifests {
            if let Some(m) = m
                && !k.points.contains_key(key)
            {
                k.points.insert(key.clone(), PointSize::of(m, &[]));
            }
        }
        if let (Some(m), Some(key)) = (&newest, latest_key)
            && !k.points.contains_key(key)
        {
            k.points.insert(key.to_string(), PointSize::of(m, &[]));
        }
        k.latest = latest;
        k.mark = mark;
    });
}

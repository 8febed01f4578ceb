//! Paths of components indexed so that "equal", "inside" and "above" are answered in
//! logarithmic time, not by a walk of every entry.
//!
//! A [`PathKey`] is a sequence of components, each escaped (byte 0 as `1 1`, byte 1 as
//! `1 2`) and ended by a 0. No escaped byte is 0, so every 0 ends a component, and one key is
//! a byte prefix of another exactly when its components are a prefix of the other's
//! components: `a/b` is a prefix of `a/b/c` but not of `a/bc`. So in a sorted map the entries
//! a key is above are one range beginning at the key, and the entries above a key are found by
//! looking up each of its proper prefixes, one per component.
//!
//! Entries carry the position their value had in the caller's list; a query answers the
//! smallest position among the entries that match, so the answer is the one a walk of the
//! list in order would find first.

use std::collections::BTreeMap;

/// Components, in the comparable form of the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathKey(Vec<u8>);

impl PathKey {
    pub fn new<'a>(components: impl IntoIterator<Item = &'a [u8]>) -> PathKey {
        let mut key = Vec::new();
        for c in components {
            for &b in c {
                match b {
                    0 => key.extend_from_slice(&[1, 1]),
                    1 => key.extend_from_slice(&[1, 2]),
                    b => key.push(b),
                }
            }
            key.push(0);
        }
        PathKey(key)
    }

    /// The keys of the proper prefixes (the first component, the first two, …, all but the
    /// last).
    fn proper_prefixes(&self) -> impl Iterator<Item = &[u8]> {
        let k = &self.0;
        k.iter()
            .enumerate()
            .filter(move |&(i, &b)| b == 0 && i + 1 < k.len())
            .map(move |(i, _)| &k[..=i])
    }
}

/// Keys with the positions of their values (see the module docs).
#[derive(Debug, Default)]
pub struct PathIndex(BTreeMap<Vec<u8>, Vec<usize>>);

impl PathIndex {
    /// Adds `key` at `position`; positions must be added in increasing order.
    pub fn insert(&mut self, key: PathKey, position: usize) {
        self.0.entry(key.0).or_default().push(position);
    }

    /// The first position of an entry equal to `key`.
    pub fn equal(&self, key: &PathKey) -> Option<usize> {
        self.0.get(&key.0).and_then(|p| p.first().copied())
    }

    /// The first position of an entry that `key` is strictly inside.
    pub fn above(&self, key: &PathKey) -> Option<usize> {
        key.proper_prefixes()
            .filter_map(|p| self.0.get(p).and_then(|p| p.first().copied()))
            .min()
    }

    /// The first position of an entry strictly inside `key`.
    pub fn below(&self, key: &PathKey) -> Option<usize> {
        self.0
            .range::<[u8], _>((
                std::ops::Bound::Excluded(&key.0[..]),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(&key.0))
            .filter_map(|(_, p)| p.first().copied())
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> PathKey {
        PathKey::new(s.split('/').filter(|c| !c.is_empty()).map(str::as_bytes))
    }

    #[test]
    fn answers_as_component_prefixes_do() {
        let paths = [
            "a", "a/b", "a/bc", "a/b/c", "a/b/c/d", "b", "a/b\0", "a/b\u{1}", "ab", "a/\u{1}1",
        ];
        let mut index = PathIndex::default();
        for (i, p) in paths.iter().enumerate() {
            index.insert(key(p), i);
        }
        let parts = |s: &str| -> Vec<String> {
            s.split('/')
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        };
        for q in paths.iter().chain(&["", "a/b/c/d/e", "c", "a/b/x"]) {
            let qp = parts(q);
            let first = |f: &dyn Fn(&[String]) -> bool| paths.iter().position(|p| f(&parts(p)));
            assert_eq!(
                index.equal(&key(q)),
                first(&|p| p == qp.as_slice()),
                "{q:?} ="
            );
            assert_eq!(
                index.above(&key(q)),
                first(&|p| p.len() < qp.len() && qp.starts_with(p)),
                "{q:?} inside"
            );
            assert_eq!(
                index.below(&key(q)),
                first(&|p| p.len() > qp.len() && p.starts_with(&qp)),
                "{q:?} above"
            );
        }
    }
}

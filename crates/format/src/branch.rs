//! Branches in the bucket (`src/branch/` in the library): where a branch manifest was cut from
//! ([`BranchOrigin`]), which prefixes it may name ([`prefix_url_problem`]), and the pins and
//! releases a branch writes into the prefix holding its objects ([`Pin`], [`Release`]).
//!
//! ```text
//! pins/<branch lineage>.json       a pin: the objects of this prefix a branch names; created once
//! pins/<branch lineage>.released   its release, created once by `branch delete`
//! ```
//!
//! A pin is written before its branch manifest; retention of the prefix keeps every object a
//! live pin names. A pin is live until its release exists, or until its branch manifest is
//! found missing once the pin is older than the grace a crashed branch is given.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where pins live.
pub const PINS_PREFIX: &str = "pins/";

/// The key of the pin of the branch of lineage `branch`.
pub fn pin_key(branch: Uuid) -> String {
    format!("{PINS_PREFIX}{branch}.json")
}

/// The key of the release of that pin.
pub fn release_key(branch: Uuid) -> String {
    format!("{PINS_PREFIX}{branch}.released")
}

/// The branch lineage a pin or release key names, and whether it is a release.
pub fn parse_pin_key(key: &str) -> Option<(Uuid, bool)> {
    let rest = key.strip_prefix(PINS_PREFIX)?;
    let (id, released) = match rest.strip_suffix(".json") {
        Some(id) => (id, false),
        None => (rest.strip_suffix(".released")?, true),
    };
    let parsed = Uuid::parse_str(id).ok()?;
    // Only the canonical spelling: one branch, one key.
    (parsed.to_string() == id).then_some((parsed, released))
}

/// What a pin holds: the branch that names objects of this prefix, and which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The branch prefix's URL, without a query.
    pub branch: String,
    /// The branch's lineage (its manifest's).
    pub lineage: Uuid,
    /// The branch manifest's key under the branch prefix: while the pin is past its grace,
    /// its absence means the branch never came to be (or was removed by hand).
    pub manifest: String,
    /// The fork commit.
    pub commit_seq: u64,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// The keys under this prefix the branch names.
    pub keys: Vec<String>,
    /// The stored length of each key, in the order of `keys`: what the branch is charged for
    /// the objects it alone keeps (`crate`'s users: retention's charges). Empty in a pin
    /// written without them (their bytes are then unknown, counted 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lens: Vec<u64>,
}

/// Bytes under `pins/` that are not a pin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: not a pin: {detail}")]
pub struct PinError {
    pub key: String,
    pub detail: String,
}

/// What a release holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub lineage: Uuid,
    /// RFC 3339, UTC.
    pub released_at: String,
}

impl Pin {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("pin serializes");
        v.push(b'\n');
        v
    }

    /// Parses a pin stored under `key`, which must name its lineage.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Pin, PinError> {
        let bad = |detail: String| PinError {
            key: key.to_string(),
            detail,
        };
        let p: Pin = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if parse_pin_key(key) != Some((p.lineage, false)) {
            return Err(bad(format!("names branch {}, not its key's", p.lineage)));
        }
        if let Some(why) = prefix_url_problem(&p.branch) {
            return Err(bad(format!("branch prefix {:?}: {why}", p.branch)));
        }
        if !p.lens.is_empty() && p.lens.len() != p.keys.len() {
            return Err(bad(format!(
                "{} lengths for {} keys",
                p.lens.len(),
                p.keys.len()
            )));
        }
        Ok(p)
    }
}

impl Release {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("release serializes");
        v.push(b'\n');
        v
    }
}

/// Where a branch was cut from (`src/branch/`): the parent prefix, the parent's restore point
/// whose objects the branch names, and the commit the branch stops at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchOrigin {
    /// The parent prefix's URL, without a query.
    pub prefix: String,
    /// The lineage of the parent's restore point.
    pub lineage: Uuid,
    /// The parent's manifest key the branch was cut from.
    pub manifest: String,
    /// The fork commit: what the branch restores to (the manifest's `commit_seq`).
    pub commit_seq: u64,
}

/// Why `url` is not a prefix a branch manifest may name, if it is not: `s3://bucket/prefix`
/// or `file:///absolute/path`, with no query, fragment, `..` segment, empty segment, or
/// control character, at most 1024 bytes.
pub fn prefix_url_problem(url: &str) -> Option<&'static str> {
    if url.len() > 1024 {
        return Some("longer than 1024 bytes");
    }
    if url
        .chars()
        .any(|c| c.is_control() || c == '?' || c == '#' || c == '\\')
    {
        return Some("holds a control character, '?', '#' or '\\'");
    }
    let path = if let Some(rest) = url.strip_prefix("s3://") {
        match rest.split_once('/') {
            Some((b, p)) if !b.is_empty() => p,
            None if !rest.is_empty() => "",
            _ => return Some("no bucket name after s3://"),
        }
    } else if let Some(p) = url.strip_prefix("file:///") {
        p
    } else {
        return Some("not an s3:// or file:/// URL");
    };
    if path.is_empty() {
        return None;
    }
    if path
        .trim_end_matches('/')
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Some("an empty, '.' or '..' path segment");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_urls_are_plain() {
        for ok in ["s3://b", "s3://b/p", "s3://b/p/q/", "file:///x/y"] {
            assert_eq!(prefix_url_problem(ok), None, "{ok}");
        }
        for bad in [
            "s3://",
            "s3:///p",
            "s3://b/../p",
            "s3://b//p",
            "s3://b/p?endpoint=x",
            "file://rel",
            "file:///a/./b",
            "http://b/p",
            "s3://b/p\n",
        ] {
            assert!(prefix_url_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn pin_keys_round_trip_and_only_canonical_ones_parse() {
        let id = Uuid::from_u128(7);
        assert_eq!(parse_pin_key(&pin_key(id)), Some((id, false)));
        assert_eq!(parse_pin_key(&release_key(id)), Some((id, true)));
        assert_eq!(parse_pin_key(&pin_key(id).to_uppercase()), None);
        assert_eq!(parse_pin_key("pins/x.json"), None);
        let pin = Pin {
            branch: "s3://b/branch".into(),
            lineage: id,
            manifest: "manifests/00000000000000000007.json".into(),
            commit_seq: 7,
            created_at: "2026-12-07T00:00:00Z".into(),
            keys: vec!["gen/0000000001/snapshot.bin".into()],
            lens: vec![],
        };
        assert_eq!(Pin::decode(&pin_key(id), &pin.encode()).unwrap(), pin);
        assert!(Pin::decode(&pin_key(Uuid::from_u128(8)), &pin.encode()).is_err());
        let sized = Pin {
            lens: vec![4096],
            ..pin.clone()
        };
        assert_eq!(Pin::decode(&pin_key(id), &sized.encode()).unwrap(), sized);
        let e = Pin::decode(
            &pin_key(id),
            &Pin {
                lens: vec![1, 2],
                ..pin
            }
            .encode(),
        );
        assert!(e.unwrap_err().to_string().contains("2 lengths for 1 keys"));
    }
}

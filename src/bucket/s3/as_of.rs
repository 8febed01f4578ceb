//! Reading an S3 prefix as it was at an instant, from object versions (`--bucket-as-of TIME`,
//! issue 29): what an attacker with the writer's keys added after TIME (newer versions, delete
//! markers, a forged pointer or `LATEST`) is not seen, and every locked version from before it
//! still is, so the prefix restores, verifies and lists as before the attack (pgBackRest's
//! `repo-target-time` is the model).
//!
//! # How
//! The first request lists every version and delete marker under the prefix
//! (`ListObjectVersions`, 1,000 a page) and keeps, of each key, the newest entry whose
//! `LastModified` is at or before TIME: a version (its id, length and ETag) or a delete
//! marker (the key did not exist then). A version and a delete marker with the same
//! `LastModified` (a store stamping to the second) resolve to the version: reading an object
//! that was deleted in the same second as TIME is the error on the safe side. Then:
//! - a listing is served from that table (no request);
//! - a HEAD or GET names the version (`versionId`): one request, as without TIME;
//! - every write, delete and retention change is refused before any request: a bucket read
//!   as of a past instant is read-only.
//!
//! The table is built once per opened bucket, lazily, and a failure to build it (throttling,
//! a dropped connection) fails that request only: the retry layer above tries again. It holds
//! one entry per key of the prefix as it was at TIME (keys, version ids, ETags), which is what
//! a restore of the prefix reads anyway: entries after TIME are dropped page by page, so an
//! attacker's flood of newer versions costs listing requests, not memory. A server repeating
//! its continuation markers is an error, not an endless loop. Needs a versioned bucket (every Object Lock bucket is one); in an
//! unversioned bucket each key has the one "null" version.
//!
//! Stateless on disk: nothing is written anywhere.

use std::collections::BTreeMap;

use aws_sdk_s3::Client;

use crate::bucket::{BucketError, ListPage, ListQuery, ObjectMeta};

/// One key as it was at the instant.
#[derive(Debug, Clone)]
pub(super) struct Version {
    pub id: String,
    pub len: u64,
    pub etag: String,
    pub modified_ms: Option<i64>,
}

/// The prefix as it was at `at_ms`: built on first use ([`AsOf::table`]).
#[derive(Debug)]
pub(super) struct AsOf {
    pub at_ms: i64,
    table: tokio::sync::OnceCell<BTreeMap<String, Version>>,
}

/// One entry of a version listing: `(key, last modified ms, version or None for a marker)`.
#[cfg(test)]
type Entry = (String, i64, Option<Version>);

impl AsOf {
    pub fn new(at_ms: i64) -> AsOf {
        AsOf {
            at_ms,
            table: tokio::sync::OnceCell::new(),
        }
    }

    /// The table of keys (relative to `root`) and their versions at the instant.
    pub async fn table(
        &self,
        b: &super::S3Bucket,
        client: &Client,
        bucket: &str,
        root: &str,
    ) -> Result<&BTreeMap<String, Version>, BucketError> {
        self.table
            .get_or_try_init(|| async {
                let mut newest = Newest::new(self.at_ms);
                list_versions(b, client, bucket, root, &mut newest).await?;
                Ok(newest.table())
            })
            .await
    }
}

/// Of each key, its newest entry at or before the instant, fed one entry at a time: entries
/// after the instant are dropped as they come, so what an attacker added after it (any number
/// of versions and markers) costs listing requests, never memory.
struct Newest {
    at_ms: i64,
    by_key: BTreeMap<String, (i64, Option<Version>)>,
}

impl Newest {
    fn new(at_ms: i64) -> Newest {
        Newest {
            at_ms,
            by_key: BTreeMap::new(),
        }
    }

    fn offer(&mut self, key: &str, modified: i64, version: Option<Version>) {
        if modified > self.at_ms {
            return;
        }
        let replace = match self.by_key.get(key) {
            None => true,
            Some((m, v)) => modified > *m || (modified == *m && v.is_none() && version.is_some()),
        };
        if replace {
            self.by_key.insert(key.to_string(), (modified, version));
        }
    }

    /// The keys that were versions at the instant (a delete marker: the key did not exist).
    fn table(self) -> BTreeMap<String, Version> {
        self.by_key
            .into_iter()
            .filter_map(|(k, (_, v))| v.map(|v| (k, v)))
            .collect()
    }
}

#[cfg(test)]
fn pick(entries: Vec<Entry>, at_ms: i64) -> BTreeMap<String, Version> {
    let mut newest = Newest::new(at_ms);
    for (key, modified, version) in entries {
        newest.offer(&key, modified, version);
    }
    newest.table()
}

async fn list_versions(
    b: &super::S3Bucket,
    client: &Client,
    bucket: &str,
    root: &str,
    newest: &mut Newest,
) -> Result<(), BucketError> {
    let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
    loop {
        let page = client
            .list_object_versions()
            .bucket(bucket)
            .prefix(root)
            .set_key_marker(key_marker.clone())
            .set_version_id_marker(version_marker.clone())
            .send()
            .await
            .map_err(|e| super::map_error(b, "S3 ListObjectVersions", "", false, e))?;
        let ms = |t: Option<&aws_smithy_types::DateTime>| t.and_then(|t| t.to_millis().ok());
        for v in page.versions() {
            let (Some(key), Some(modified)) = (
                v.key().and_then(|k| k.strip_prefix(root)),
                ms(v.last_modified()),
            ) else {
                continue;
            };
            newest.offer(
                key,
                modified,
                Some(Version {
                    id: v.version_id().unwrap_or("null").to_string(),
                    len: crate::units::u64_of(v.size().unwrap_or(0)),
                    etag: v.e_tag().unwrap_or_default().to_string(),
                    modified_ms: Some(modified),
                }),
            );
        }
        for d in page.delete_markers() {
            if let (Some(key), Some(modified)) = (
                d.key().and_then(|k| k.strip_prefix(root)),
                ms(d.last_modified()),
            ) {
                newest.offer(key, modified, None);
            }
        }
        if page.is_truncated() != Some(true) {
            return Ok(());
        }
        let next = (
            page.next_key_marker().map(str::to_string),
            page.next_version_id_marker().map(str::to_string),
        );
        if next.0.is_none() && next.1.is_none() {
            return Ok(());
        }
        // A server answering the same page again would keep this loop forever.
        if next == (key_marker.clone(), version_marker.clone()) {
            return Err(BucketError::Permanent {
                op: "S3 ListObjectVersions",
                key: root.to_string(),
                message: "the server sent the same continuation markers again".into(),
            });
        }
        (key_marker, version_marker) = next;
    }
}

/// One page of `table`'s keys for `query`, as S3's listing would give it.
pub(super) fn list(table: &BTreeMap<String, Version>, query: &ListQuery<'_>) -> ListPage {
    let prefix = query.prefix;
    let max = query.max_keys.clamp(1, 1000);
    let from = match query.after() {
        Some(after) => std::ops::Bound::Excluded(after.to_string()),
        None => std::ops::Bound::Included(prefix.to_string()),
    };
    let mut objects = Vec::new();
    let mut more = false;
    for (key, v) in table.range((from, std::ops::Bound::Unbounded)) {
        if !key.starts_with(prefix) {
            if key.as_str() > prefix {
                break;
            }
            continue;
        }
        if objects.len() == max {
            more = true;
            break;
        }
        objects.push(ObjectMeta {
            key: key.clone(),
            len: v.len,
            etag: v.etag.clone(),
            modified_ms: v.modified_ms,
            lock: None,
        });
    }
    let next_token = more
        .then(|| objects.last().map(|o| o.key.clone()))
        .flatten();
    ListPage {
        objects,
        next_token,
    }
}

/// What a write to a bucket read as of an instant answers.
pub(super) fn refused(op: &'static str, key: &str, at_ms: i64) -> BucketError {
    BucketError::Permanent {
        op,
        key: key.to_string(),
        message: format!(
            "the bucket is read as it was at {}: read-only",
            crate::units::rfc3339_ms(at_ms)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(id: &str) -> Option<Version> {
        Some(Version {
            id: id.into(),
            len: 1,
            etag: id.into(),
            modified_ms: None,
        })
    }

    #[test]
    fn the_newest_entry_at_or_before_the_instant_wins_and_markers_hide() {
        let entries = vec![
            ("a".to_string(), 10, v("a1")),
            ("a".to_string(), 30, v("a2")),
            ("b".to_string(), 10, v("b1")),
            ("b".to_string(), 20, None),
            ("c".to_string(), 10, v("c1")),
            ("c".to_string(), 25, None),
            ("d".to_string(), 40, v("d1")),
            ("e".to_string(), 20, None),
            ("e".to_string(), 20, v("e1")),
        ];
        let t = pick(entries, 20);
        let ids: Vec<(&str, &str)> = t.iter().map(|(k, v)| (k.as_str(), v.id.as_str())).collect();
        assert_eq!(ids, [("a", "a1"), ("c", "c1"), ("e", "e1")]);
        let page = list(&t, &ListQuery::new("", None, 2));
        assert_eq!(page.objects.len(), 2);
        assert_eq!(page.next_token.as_deref(), Some("c"));
        let rest = list(&t, &ListQuery::new("", page.next_token, 2));
        assert_eq!(rest.objects[0].key, "e");
        assert!(rest.next_token.is_none());
        assert!(list(&t, &ListQuery::new("b", None, 5)).objects.is_empty());
    }
}

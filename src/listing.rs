//! Restore points one page at a time: what `ListRestorePoints` (and so `ctl
//! list-restore-points`) reads, at a cost of about one page, whatever the prefix holds.
//!
//! # Order and cursor
//! Pages are newest first, as `ListRestorePoints` always answered: manifest keys are
//! `manifests/<commit_seq:020>.json`, so key order is commit order, and a page holds the
//! valid manifests just below where the previous page ended. A page ends at a [`Cursor`]: the
//! commit count of the last key it examined (the next page holds keys strictly below it) and a
//! *span*, the commit counts the next page's first LIST should cover. Its token
//! ([`Cursor::token`]) is that key, `~` and the span: at most 56 bytes, opaque to clients, and
//! a bare manifest key (what earlier servers gave) is still a token (no span).
//!
//! # Walking down with an ascending LIST
//! A LIST only goes up (`start_after`), so a page lists *windows*: the keys with commit counts
//! in `[below - span, below)`, one LIST from `start_after = manifests/<below - span:020>`
//! (which sorts just before that count's key) up to the first key at or above `below`. A
//! window with too few keys is followed by the one below it, 8 times as wide, down to commit 0;
//! before a page's third window, one LIST from commit 0 is tried, which ends the walk when at
//! most 1,000 keys are left below (points far apart would otherwise widen the window for up
//! to 21 LISTs).
//! The first page starts at LATEST's commit: one LIST of everything from there up (a manifest
//! written after LATEST's, and other lineages' newer ones, are there), then windows below it.
//! Only a prefix without a readable LATEST (a crash after the first manifest) lists all of
//! `manifests/` for its first page, 1 request per 1,000 keys.
//!
//! The next page's span is twice what this page covered, so with restore points about evenly
//! spaced a page costs one LIST, and `ctl list-restore-points --all` costs requests in
//! proportion to the restore points (each page: GET LATEST, a LIST or two, a GET per point).
//!
//! # What is read
//! LATEST (to mark the point it names), the windows' LISTs, and the GETs of the page's
//! manifests only, [`GET_PARALLELISM`] at once, in order. Nothing summarises the whole prefix:
//! there is no total to count. Keys under `manifests/` that are not manifest keys are not
//! restore points and are skipped; so are manifests that do not decode, that are gone by the
//! time they are read (retention), or that the store refuses to hand out: a page may then hold
//! fewer points than asked, and more GETs are made to fill it. The next page is announced when
//! a key is left below the page, so the last page may be empty (its keys all invalid).
//!
//! Reads only; a failure leaves nothing behind.
//!
//! # A prefix without restore points
//! [`holds_a_backup`] tells the two cases apart, for `ls` and `verify`: a prefix that holds
//! nothing of a backup (no `LATEST`, `lease`, nor anything under `manifests/` or `gen/`: a
//! typo, or a path one level too high) is an error naming what it holds instead; a prefix
//! with a generation or a lease but no restore point is a backup whose first restore point is
//! not written yet (a first backup under way, or stopped before it), a valid state.

use futures::StreamExt;

use crate::bucket::{Bucket, BucketError, ListQuery};
use crate::manifest::{
    GEN_PREFIX, LATEST_KEY, LEASE_KEY, MANIFESTS_PREFIX, Manifest, POINTERS_PREFIX,
    parse_manifest_key,
};

/// Manifests fetched at once.
pub const GET_PARALLELISM: usize = 8;
/// Keys asked for per LIST request (S3's most).
const LIST_PAGE: usize = 1000;
/// The commit counts a first page's first window below LATEST covers, per point asked for.
const FIRST_SPAN_PER_POINT: u64 = 16;
/// How much wider each further window of a page is than the one above it.
const GROWTH: u64 = 8;
/// The window of a page's walk before which one LIST from commit 0 is tried: when it reaches
/// up to the walk (at most 1,000 keys below it), the walk is done, however far apart the
/// points are; else the windows go on.
const PROBE_AFTER: usize = 3;
/// Between a token's manifest key and its span.
const SPAN_SEPARATOR: char = '~';

/// Where a page ended: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The next page holds keys of commit counts strictly below this.
    pub below: u64,
    /// Commit counts the next page's first window covers (`None`: a first page's guess).
    pub span: Option<u64>,
}

impl Cursor {
    /// The cursor a token names: `manifests/<seq:020>.json`, optionally `~<span>`.
    pub fn parse(token: &str) -> Option<Cursor> {
        let (key, span) = match token.split_once(SPAN_SEPARATOR) {
            Some((key, span)) => (key, Some(parse_span(span)?)),
            None => (token, None),
        };
        Some(Cursor {
            below: parse_manifest_key(key)?,
            span: span.map(|s| s.max(1)),
        })
    }

    /// The token a client passes back for the page after this cursor.
    pub fn token(&self) -> String {
        let key = crate::manifest::manifest_key(self.below);
        match self.span {
            Some(span) => format!("{key}{SPAN_SEPARATOR}{span}"),
            None => key,
        }
    }
}

/// A span: 1 to 20 ASCII digits that fit a u64 (no sign, so one span has one spelling).
fn parse_span(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| s.parse().ok()).flatten()
}

/// One restore point of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub manifest: Manifest,
    /// LATEST names it.
    pub is_latest: bool,
}

/// One page: valid restore points, newest first, and where the next page starts (`None`:
/// this is the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub points: Vec<Listed>,
    pub next: Option<Cursor>,
}

/// The bucket could not be read (listing, throttling, timeouts).
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("cannot list the restore points of {url}: {source}")]
    Bucket { url: String, source: BucketError },
}

/// Up to `size` (at least 1) valid restore points after `cursor` (from the newest when
/// `None`), newest first; see the module docs for what it reads.
pub async fn page(
    bucket: &dyn Bucket,
    cursor: Option<Cursor>,
    size: usize,
) -> Result<Page, ListingError> {
    let err = |source| ListingError::Bucket {
        url: bucket.url(),
        source,
    };
    let size = size.max(1);
    let latest = match crate::latest::read(bucket).await {
        Ok(found) => found.and_then(|f| f.latest.ok()).map(|l| l.manifest),
        Err(e) => return Err(err(e)),
    };
    let guess = FIRST_SPAN_PER_POINT.saturating_mul(crate::units::u64_len(size));
    let mut walk = match cursor {
        Some(c) => Walk::below(bucket, c.below, c.span.unwrap_or(guess)),
        None => match latest.as_deref().and_then(parse_manifest_key) {
            Some(top) => Walk::from_top(bucket, top, guess).await.map_err(err)?,
            None => Walk::everything(bucket).await.map_err(err)?,
        },
    };

    let mut points = Vec::with_capacity(size);
    let mut first: Option<u64> = None;
    let mut last: Option<u64> = None;
    while points.len() < size {
        let need = size - points.len();
        // One key more than the page needs: whether a next page exists costs no GET.
        walk.fill(need + 1).await.map_err(err)?;
        let batch: Vec<(u64, String)> = walk.found.drain(..need.min(walk.found.len())).collect();
        let Some((seq, _)) = batch.last() else {
            break;
        };
        first = first.or(batch.first().map(|(s, _)| *s));
        last = Some(*seq);
        let fetched: Vec<Result<Option<Listed>, BucketError>> = futures::stream::iter(batch)
            .map(|(_, key)| {
                let latest = latest.as_deref();
                async move { fetch(bucket, key, latest).await }
            })
            .buffered(GET_PARALLELISM)
            .collect()
            .await;
        for f in fetched {
            points.extend(f.map_err(err)?);
        }
    }
    let next = match (walk.found.is_empty(), last) {
        (false, Some(below)) => {
            // Twice the counts this page covered, from the cursor it started at (or its
            // newest key) down to its last key.
            let top = cursor.map_or(first.unwrap_or(below).saturating_add(1), |c| c.below);
            let span = top.saturating_sub(below).saturating_mul(2).max(1);
            Some(Cursor {
                below,
                span: Some(span),
            })
        }
        _ => None,
    };
    Ok(Page { points, next })
}

/// A manifest of the page: `None` when it is not a valid restore point (any more).
async fn fetch(
    bucket: &dyn Bucket,
    key: String,
    latest: Option<&str>,
) -> Result<Option<Listed>, BucketError> {
    let data = match bucket.get(&key).await {
        Ok(o) => o.data,
        Err(BucketError::NotFound { .. } | BucketError::Permanent { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(match Manifest::decode(&key, &data) {
        Ok(manifest) => Some(Listed {
            is_latest: latest == Some(key.as_str()),
            key,
            manifest,
        }),
        Err(e) => {
            tracing::debug!(%key, error = %e, "not listed: an invalid manifest");
            None
        }
    })
}

/// Manifest keys found, newest first, and the windows below them not yet listed.
struct Walk<'b> {
    bucket: &'b dyn Bucket,
    /// Listed, not yet examined, newest first.
    found: std::collections::VecDeque<(u64, String)>,
    /// Keys below this commit count are not listed yet; `None`: every key is.
    unlisted_below: Option<u64>,
    span: u64,
    /// The one LIST from the bottom was made (see [`PROBE_AFTER`]).
    probed: bool,
}

impl<'b> Walk<'b> {
    fn below(bucket: &'b dyn Bucket, below: u64, span: u64) -> Walk<'b> {
        Walk {
            bucket,
            found: Default::default(),
            unlisted_below: (below > 0).then_some(below),
            span: span.max(1),
            probed: false,
        }
    }

    /// Every key from `top` up, then windows below it.
    async fn from_top(
        bucket: &'b dyn Bucket,
        top: u64,
        span: u64,
    ) -> Result<Walk<'b>, BucketError> {
        let mut walk = Walk::below(bucket, top, span);
        walk.found = list_range(bucket, top, None)
            .await?
            .into_iter()
            .rev()
            .collect();
        Ok(walk)
    }

    /// Every key, listed now.
    async fn everything(bucket: &'b dyn Bucket) -> Result<Walk<'b>, BucketError> {
        let mut walk = Walk::below(bucket, 0, 1);
        walk.found = list_range(bucket, 0, None)
            .await?
            .into_iter()
            .rev()
            .collect();
        Ok(walk)
    }

    /// Lists windows until `want` keys are found or every key is listed.
    async fn fill(&mut self, want: usize) -> Result<(), BucketError> {
        let mut windows = 0;
        while self.found.len() < want {
            let Some(hi) = self.unlisted_below else {
                return Ok(());
            };
            windows += 1;
            if windows == PROBE_AFTER && !self.probed {
                // Points far apart: one LIST of the oldest keys may hold every key below.
                self.probed = true;
                let (keys, complete) = list_range_within(self.bucket, 0, Some(hi), 1).await?;
                if complete {
                    self.found.extend(keys.into_iter().rev());
                    self.unlisted_below = None;
                    return Ok(());
                }
            }
            let lo = hi.saturating_sub(self.span);
            let keys = list_range(self.bucket, lo, Some(hi)).await?;
            self.found.extend(keys.into_iter().rev());
            self.unlisted_below = (lo > 0).then_some(lo);
            self.span = self.span.saturating_mul(GROWTH);
        }
        Ok(())
    }
}

/// The manifest keys of commit counts in `[lo, hi)` (`hi` `None`: no upper bound), in order.
async fn list_range(
    bucket: &dyn Bucket,
    lo: u64,
    hi: Option<u64>,
) -> Result<Vec<(u64, String)>, BucketError> {
    Ok(list_range_within(bucket, lo, hi, usize::MAX).await?.0)
}

/// [`list_range`] in at most `requests` LISTs: the keys, and whether they are all of them.
async fn list_range_within(
    bucket: &dyn Bucket,
    lo: u64,
    hi: Option<u64>,
    requests: usize,
) -> Result<(Vec<(u64, String)>, bool), BucketError> {
    // A key's own prefix sorts just before it: listing after it starts at `lo`'s key.
    let start = format!("{MANIFESTS_PREFIX}{lo:020}");
    let mut out = Vec::new();
    let mut token = None;
    for _ in 0..requests {
        let query =
            ListQuery::new(MANIFESTS_PREFIX, token, LIST_PAGE).starting_after(start.clone());
        let page = bucket.list(query).await?;
        for o in page.objects {
            let Some(seq) = parse_manifest_key(&o.key) else {
                continue;
            };
            if hi.is_some_and(|hi| seq >= hi) {
                return Ok((out, true));
            }
            out.push((seq, o.key));
        }
        match page.next_token {
            Some(t) => token = Some(t),
            None => return Ok((out, true)),
        }
    }
    Ok((out, false))
}

/// Keys of the prefix's root listed to tell a backup from something else; the names of the
/// first levels among them are shown in the error.
const PEEK_KEYS: usize = 200;
/// First-level names an error shows, at most.
const SHOWN_NAMES: usize = 5;

/// Why a prefix without restore points is not a backup (see the module docs).
#[derive(Debug, thiserror::Error)]
pub enum PrefixError {
    #[error(
        "{url} holds no backup (no LATEST, lease, manifests/ or gen/ under it): {}",
        seen_words(url, seen)
    )]
    NoBackup {
        url: String,
        /// First-level names under the prefix (`node1/`, `notes.txt`), at most a few.
        seen: Vec<String>,
    },
    #[error("cannot list {url}: {source}")]
    Bucket { url: String, source: BucketError },
}

fn seen_words(url: &str, seen: &[String]) -> String {
    match seen.first() {
        None => "it holds no object at all; check the path".to_string(),
        Some(first) if first.ends_with('/') => format!(
            "it holds {}; is the backup a level down, e.g. {}/{}?",
            seen.join(", "),
            url.trim_end_matches('/'),
            first.trim_end_matches('/')
        ),
        Some(_) => format!("it holds {}; check the path", seen.join(", ")),
    }
}

/// Whether the prefix holds a backup, for a prefix where no restore point was found: `Ok` when
/// it holds a generation, a lease, LATEST or a manifest key (a backup whose first restore point
/// is not written yet); else [`PrefixError::NoBackup`]. Two LISTs at most.
pub async fn holds_a_backup(bucket: &dyn Bucket) -> Result<(), PrefixError> {
    let err = |source| PrefixError::Bucket {
        url: bucket.url(),
        source,
    };
    let generations = bucket
        .list(ListQuery::new(GEN_PREFIX, None, 1))
        .await
        .map_err(err)?;
    if !generations.objects.is_empty() {
        return Ok(());
    }
    let root = bucket
        .list(ListQuery::new("", None, PEEK_KEYS))
        .await
        .map_err(err)?;
    let ours = |k: &str| {
        k == LATEST_KEY
            || k == LEASE_KEY
            || k.starts_with(MANIFESTS_PREFIX)
            || k.starts_with(POINTERS_PREFIX)
    };
    if root.objects.iter().any(|o| ours(&o.key)) {
        return Ok(());
    }
    let mut seen: Vec<String> = Vec::new();
    for o in &root.objects {
        let name = match o.key.split_once('/') {
            Some((dir, _)) => format!("{dir}/"),
            None => o.key.clone(),
        };
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen.truncate(SHOWN_NAMES);
    Err(PrefixError::NoBackup {
        url: bucket.url(),
        seen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_stay_short() {
        for c in [
            Cursor {
                below: 0,
                span: None,
            },
            Cursor {
                below: 42,
                span: Some(1),
            },
            Cursor {
                below: u64::MAX,
                span: Some(u64::MAX),
            },
        ] {
            let t = c.token();
            assert!(t.len() <= 64, "{t}");
            assert_eq!(Cursor::parse(&t), Some(c), "{t}");
        }
        assert_eq!(
            Cursor::parse("manifests/00000000000000000042.json"),
            Some(Cursor {
                below: 42,
                span: None
            })
        );
        for bad in [
            "",
            "not-a-token",
            "manifests/42.json",
            "manifests/00000000000000000042.json~",
            "manifests/00000000000000000042.json~+5",
            "manifests/00000000000000000042.json~99999999999999999999",
            "manifests/00000000000000000042.json~1~2",
        ] {
            assert_eq!(Cursor::parse(bad), None, "{bad}");
        }
    }
}

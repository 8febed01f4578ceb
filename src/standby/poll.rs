//! One look at the bucket: what was shipped past what a standby applied.
//!
//! A poll is **one LIST** of `gen/` starting after the key
//! `gen/<generation>/wal/<applied end:020>`. S3 lists keys in order, so the page holds first
//! the segments of the generation followed that start at or past the applied end (the only
//! ones that can continue it), then the keys of any later generation (its `GENERATION` claim
//! first). Nothing new: an empty page. So an idle prefix costs one LIST per poll, whatever
//! its size and history, and LATEST is read (one GET) only when a later generation exists and
//! the segments of the one followed have stopped ([`super`]).

use crate::bucket::{Bucket, BucketError, ListQuery, ObjectMeta};
use crate::manifest::{GEN_PREFIX, parse_generation, segments_prefix};

/// Keys a poll asks for (S3's largest page): segments past this many are the next poll's.
pub const POLL_PAGE: usize = 1000;

/// What a poll saw.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    /// Every key listed (segments of the generation followed among them).
    pub listed: Vec<ObjectMeta>,
    /// Whether a key of a later generation was listed.
    pub later_generation: bool,
}

/// The key a poll lists after: every segment starting at or past `end` sorts after it.
pub(crate) fn list_after(generation: u64, end: u64) -> String {
    format!("{}{end:020}", segments_prefix(generation))
}

/// One LIST (see the module docs).
pub(crate) async fn poll(
    bucket: &dyn Bucket,
    generation: u64,
    end: u64,
) -> Result<Seen, BucketError> {
    let query =
        ListQuery::new(GEN_PREFIX, None, POLL_PAGE).starting_after(list_after(generation, end));
    let page = bucket.list(query).await?;
    let later_generation = page
        .objects
        .iter()
        .any(|o| parse_generation(&o.key).is_some_and(|g| g > generation));
    Ok(Seen {
        listed: page.objects,
        later_generation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{generation_key, segment_key};

    #[test]
    fn the_listing_key_sorts_before_every_segment_that_can_continue_and_after_the_rest() {
        let after = list_after(7, 1_000);
        assert!(segment_key(7, 1_000, 2_000) > after);
        assert!(segment_key(7, 1_500, 2_000) > after);
        assert!(segment_key(7, 999, 1_000) < after);
        assert!(segment_key(7, 0, 999) < after);
        assert!(generation_key(8) > after);
        assert!(segment_key(8, 0, 10) > after);
        assert!(generation_key(7) < after);
    }
}

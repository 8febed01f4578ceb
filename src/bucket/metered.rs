//! [`MeteredBucket`]: a wrapper that times every request, counts it by outcome and traces it.
//!
//! Each request records `mushroom_backup_bucket_request_duration_seconds` (a histogram) and
//! `mushroom_backup_bucket_requests_total` (a counter), both labelled `op` and `outcome`
//! (see [`crate::telemetry::metrics`] for the contract), and runs inside a DEBUG span
//! `bucket.request` with `bucket.op` and `bucket.key` (the prefix for `list`). Outcomes:
//! `ok`; `not_found` (also a HEAD of a missing object, which is not an error);
//! `precondition_failed`, `conflict`, `transient`, `permanent`, `cancelled`, `crashed` from
//! the [`BucketError`]. A request whose future is dropped before it finished (a timeout, a
//! `select!` that took another branch) is recorded as `cancelled` with the time it ran.
//!
//! Where it sits decides what it measures: under the retry layer ([`super::retry::Retrying`])
//! every attempt is one request, as the object store sees them; above it, one logical
//! request with its retries. Without a metrics recorder installed the metrics cost a
//! lookup that does nothing, and without a subscriber enabling DEBUG for this module the span
//! is a disabled span.

use std::future::Future;
use std::ops::Range;
use std::sync::OnceLock;
use std::time::Instant;

use bytes::Bytes;
use tracing::Instrument as _;

use super::faults::Op;
use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutOpts,
};
use crate::telemetry::metrics::{BUCKET_REQUEST_DURATION, BUCKET_REQUESTS};

/// Every `outcome` label.
pub const OUTCOMES: [&str; 8] = [
    "ok",
    "not_found",
    "precondition_failed",
    "conflict",
    "transient",
    "permanent",
    "cancelled",
    "crashed",
];

/// The series of one `(op, outcome)`, registered at its first request.
type Series = OnceLock<(metrics::Histogram, metrics::Counter)>;

/// A bucket whose requests are metered and traced; see the module docs.
///
/// Each `(op, outcome)` series is looked up in the recorder once, at its first request, and
/// kept: install the recorder ([`crate::telemetry::init`]) before the first request, or this
/// wrapper records nothing.
pub struct MeteredBucket {
    inner: DynBucket,
    series: [[Series; OUTCOMES.len()]; Op::ALL.len()],
}

impl MeteredBucket {
    pub fn new(inner: DynBucket) -> Self {
        MeteredBucket {
            inner,
            series: Default::default(),
        }
    }

    fn series(&self, op: Op, outcome: &'static str) -> &(metrics::Histogram, metrics::Counter) {
        let o = OUTCOMES
            .iter()
            .position(|x| *x == outcome)
            .expect("every outcome is listed");
        self.series[op as usize][o].get_or_init(|| {
            let labels = [("op", op.name()), ("outcome", outcome)];
            (
                metrics::histogram!(BUCKET_REQUEST_DURATION, &labels),
                metrics::counter!(BUCKET_REQUESTS, &labels),
            )
        })
    }
}

/// The `outcome` label of a failed request.
pub fn outcome_of(e: &BucketError) -> &'static str {
    match e {
        BucketError::NotFound { .. } => "not_found",
        BucketError::PreconditionFailed { .. } => "precondition_failed",
        BucketError::Conflict { .. } => "conflict",
        // Retried, like every transient failure.
        BucketError::Transient { .. } | BucketError::Unreachable { .. } => "transient",
        BucketError::Permanent { .. }
        | BucketError::NoSuchBucket { .. }
        | BucketError::AccessDenied { .. }
        | BucketError::NoCredentials { .. } => "permanent",
        BucketError::Cancelled => "cancelled",
        BucketError::Crashed { .. } => "crashed",
    }
}

/// Records one request when it ends, or as `cancelled` when dropped before.
struct Meter<'a> {
    bucket: &'a MeteredBucket,
    op: Op,
    start: Instant,
    outcome: Option<&'static str>,
}

impl Drop for Meter<'_> {
    fn drop(&mut self) {
        let (histogram, counter) = self
            .bucket
            .series(self.op, self.outcome.unwrap_or("cancelled"));
        histogram.record(self.start.elapsed().as_secs_f64());
        counter.increment(1);
    }
}

/// Runs `request` as one metered, traced request; `outcome` names how an `Ok` ended.
async fn metered<T>(
    bucket: &MeteredBucket,
    op: Op,
    key: &str,
    request: impl Future<Output = Result<T, BucketError>>,
    outcome: impl FnOnce(&T) -> &'static str,
) -> Result<T, BucketError> {
    let span = tracing::debug_span!("bucket.request", bucket.op = op.name(), bucket.key = key);
    let mut meter = Meter {
        bucket,
        op,
        start: Instant::now(),
        outcome: None,
    };
    let result = request.instrument(span).await;
    meter.outcome = Some(match &result {
        Ok(v) => outcome(v),
        Err(e) => outcome_of(e),
    });
    result
}

fn ok<T>(_: &T) -> &'static str {
    "ok"
}

#[async_trait::async_trait]
impl Bucket for MeteredBucket {
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(std::sync::Arc::new(MeteredBucket::new(
            self.inner.sibling(url)?,
        )))
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        let get = self.inner.get_at_most(key, at_most);
        metered(self, Op::Get, key, get, ok).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        metered(
            self,
            Op::GetRange,
            key,
            self.inner.get_range(key, range),
            ok,
        )
        .await
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let op = Op::of_part(&part);
        metered(self, op, key, self.inner.get_buffers(key, part), ok).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        metered(self, Op::Head, key, self.inner.head(key), |m| {
            if m.is_some() { "ok" } else { "not_found" }
        })
        .await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        metered(self, Op::Put, key, self.inner.put_with(key, body, opts), ok).await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        metered(self, Op::Delete, key, self.inner.delete(key, if_match), ok).await
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        metered(
            self,
            Op::Put,
            key,
            self.inner.put_retention(key, retain),
            ok,
        )
        .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let prefix = query.prefix;
        metered(self, Op::List, prefix, self.inner.list(query), ok).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::bucket::PutCondition;
    use crate::bucket::mem::MemBucket;

    #[tokio::test]
    async fn requests_pass_through_unchanged() {
        let b = MeteredBucket::new(Arc::new(MemBucket::new()));
        let etag = b
            .put(
                "a",
                Body::from(Bytes::from_static(b"1")),
                PutCondition::IfNoneMatch,
            )
            .await
            .unwrap();
        assert!(matches!(
            b.put(
                "a",
                Body::from(Bytes::from_static(b"2")),
                PutCondition::IfNoneMatch
            )
            .await,
            Err(BucketError::PreconditionFailed { .. })
        ));
        assert_eq!(b.get("a").await.unwrap().data, Bytes::from_static(b"1"));
        assert_eq!(b.head("a").await.unwrap().unwrap().etag, etag);
        assert!(b.head("missing").await.unwrap().is_none());
        assert_eq!(
            b.list(ListQuery::new("", None, 10))
                .await
                .unwrap()
                .objects
                .len(),
            1
        );
        b.delete("a", Some(&etag)).await.unwrap();
        assert!(matches!(
            b.get("a").await,
            Err(BucketError::NotFound { .. })
        ));
    }

    #[test]
    fn every_error_has_its_outcome() {
        let key = || "k".to_string();
        let cases = [
            (BucketError::NotFound { key: key() }, "not_found"),
            (
                BucketError::PreconditionFailed { key: key() },
                "precondition_failed",
            ),
            (BucketError::Conflict { key: key() }, "conflict"),
            (
                BucketError::Transient {
                    op: "put",
                    key: key(),
                    message: "503".into(),
                    indeterminate: true,
                },
                "transient",
            ),
            (
                BucketError::Permanent {
                    op: "put",
                    key: key(),
                    message: "403".into(),
                },
                "permanent",
            ),
            (BucketError::Cancelled, "cancelled"),
            (BucketError::Crashed { request: 3 }, "crashed"),
        ];
        for (e, want) in cases {
            assert_eq!(outcome_of(&e), want, "{e:?}");
            assert!(OUTCOMES.contains(&want));
        }
    }
}

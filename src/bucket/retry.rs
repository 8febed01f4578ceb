//! [`Retrying`]: the one retry layer. The S3 client's own retries are off, so every retry of a
//! bucket request in the program happens here, logged, with backoff, and cancellable.
//!
//! What is retried: errors for which [`BucketError::is_retryable`] holds (`Transient`, and the
//! 409 `Conflict` real S3 answers to racing conditional writes), up to
//! [`RetryPolicy::max_attempts`] attempts, sleeping `first_delay`, then twice that each time,
//! at most `max_delay`. Never retried: `Permanent`, `NotFound`, `PreconditionFailed`,
//! `Cancelled`, `Crashed`. Every request and every sleep races the [`CancellationToken`]; once
//! it is cancelled the call returns [`BucketError::Cancelled`] at once (a request then in flight
//! is dropped, and may or may not have taken effect).
//!
//! # Indeterminate failures
//! After an attempt that failed *indeterminately* (it may have taken effect), the outcome of a
//! later attempt is interpreted in that light:
//! - a conditional `put` answered `PreconditionFailed` re-reads the object; if its content is
//!   exactly the body, our own earlier attempt took effect and the put returns `Ok` with the
//!   object's ETag. (Another writer storing the very same bytes is indistinguishable, and just
//!   as good for write-once objects; a compare-and-swap whose object was meanwhile replaced
//!   again reports `PreconditionFailed`, which is true of the state it leaves.)
//! - a `delete` answered `NotFound` or `PreconditionFailed` while the object is gone is `Ok`.
//!
//! When the attempts run out, the last error is returned as `Transient` (an unreachable
//! endpoint as `Unreachable`), indeterminate if any attempt was, so the caller knows to re-read
//! before acting. Every retry and the giving up are logged with the error's one-line `Display`
//! (never a `Debug` dump of an SDK error).

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::{
    Body, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutCondition,
    PutOpts,
};

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The sleep after the first failed attempt.
    pub first_delay: Duration,
    /// The longest sleep between two attempts.
    pub max_delay: Duration,
    /// Attempts in all, the first one included (at least 1).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 5 s, 10 attempts: about 25 s of trying before giving up.
    fn default() -> Self {
        RetryPolicy {
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            max_attempts: 10,
        }
    }
}

/// A bucket whose requests are retried; see the module docs.
pub struct Retrying {
    inner: DynBucket,
    policy: RetryPolicy,
    cancel: CancellationToken,
}

/// How a series of attempts ended.
struct Attempts<T> {
    result: Result<T, BucketError>,
    /// Whether an attempt before the last one failed indeterminately.
    earlier_indeterminate: bool,
}

impl Retrying {
    pub fn new(inner: DynBucket, policy: RetryPolicy, cancel: CancellationToken) -> Self {
        Retrying {
            inner,
            policy,
            cancel,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, runs out of attempts or is cancelled.
    async fn attempts<T, F, Fut>(&self, op: &'static str, key: &str, mut attempt: F) -> Attempts<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, BucketError>>,
    {
        let mut earlier_indeterminate = false;
        let mut backoff =
            crate::backoff::Backoff::new(self.policy.first_delay, self.policy.max_delay);
        let max_attempts = self.policy.max_attempts.max(1);
        let mut number = 1;
        loop {
            let result = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => Err(BucketError::Cancelled),
                result = attempt() => result,
            };
            let e = match result {
                Err(e) if e.is_retryable() => e,
                result => {
                    return Attempts {
                        result,
                        earlier_indeterminate,
                    };
                }
            };
            if number >= max_attempts {
                tracing::warn!(op, key, attempts = number, "giving up: {e}");
                let indeterminate = earlier_indeterminate || e.is_indeterminate();
                return Attempts {
                    result: Err(gave_up(op, key, number, indeterminate, e)),
                    earlier_indeterminate,
                };
            }
            let delay = backoff.next_delay();
            tracing::info!(op, key, attempt = number, ?delay, "retrying: {e}");
            earlier_indeterminate |= e.is_indeterminate();
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => {
                    return Attempts { result: Err(BucketError::Cancelled), earlier_indeterminate };
                }
                _ = tokio::time::sleep(delay) => {}
            }
            number += 1;
        }
    }
}

/// The error returned when the attempts ran out on `e`: `Transient`, indeterminate if any
/// attempt was, except that an unreachable endpoint stays `Unreachable` (its message names the
/// endpoint, which is what an operator needs to see).
fn gave_up(
    op: &'static str,
    key: &str,
    attempts: u32,
    indeterminate: bool,
    e: BucketError,
) -> BucketError {
    match e {
        BucketError::Unreachable {
            endpoint, reason, ..
        } => BucketError::Unreachable {
            endpoint,
            reason: format!("{reason} (gave up after {attempts} attempts)"),
            indeterminate,
        },
        e => BucketError::Transient {
            op,
            key: key.to_string(),
            message: format!("gave up after {attempts} attempts: {e}"),
            indeterminate,
        },
    }
}

#[async_trait::async_trait]
impl super::Bucket for Retrying {
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(std::sync::Arc::new(Retrying::new(
            self.inner.sibling(url)?,
            self.policy,
            self.cancel.clone(),
        )))
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.attempts("get", key, || self.inner.get_at_most(key, at_most))
            .await
            .result
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.attempts("get_range", key, || {
            self.inner.get_range(key, range.clone())
        })
        .await
        .result
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let op = super::faults::Op::of_part(&part).name();
        self.attempts(op, key, || self.inner.get_buffers(key, part.clone()))
            .await
            .result
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.attempts("head", key, || self.inner.head(key))
            .await
            .result
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        let done = self
            .attempts("put", key, || {
                self.inner.put_with(key, body.clone(), opts.clone())
            })
            .await;
        match done.result {
            Err(BucketError::PreconditionFailed { .. })
                if done.earlier_indeterminate && opts.cond != PutCondition::None =>
            {
                match self.get(key).await {
                    Ok(there) if body.same_content(&there.data).await? => {
                        tracing::info!(key, "put: an earlier attempt took effect");
                        Ok(there.etag)
                    }
                    Ok(_) | Err(BucketError::NotFound { .. }) => {
                        Err(BucketError::PreconditionFailed {
                            key: key.to_string(),
                        })
                    }
                    Err(e) => Err(e),
                }
            }
            result => result,
        }
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        let done = self
            .attempts("delete", key, || self.inner.delete(key, if_match))
            .await;
        match done.result {
            Err(e @ (BucketError::NotFound { .. } | BucketError::PreconditionFailed { .. }))
                if done.earlier_indeterminate =>
            {
                match self.head(key).await? {
                    None => {
                        tracing::info!(key, "delete: an earlier attempt took effect");
                        Ok(())
                    }
                    Some(_) => Err(e),
                }
            }
            result => result,
        }
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        // Idempotent: setting the same date again is the same request.
        self.attempts("put_retention", key, || {
            self.inner.put_retention(key, retain)
        })
        .await
        .result
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.attempts("list", query.prefix, || self.inner.list(query.clone()))
            .await
            .result
    }
}

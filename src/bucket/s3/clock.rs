//! The bucket's clock on S3: an object's age as the store itself reckons it, the response's
//! `Date` header minus the object's `Last-Modified`, both stamped by the store.
//!
//! The SDK's `GetObjectOutput` carries `Last-Modified` but not `Date`, so a GetObject is sent
//! with a [`ResponseDate`] interceptor of its own (`customize().interceptor(..)`), which copies
//! the raw response's `Date` header before the output is deserialized. Both headers are
//! HTTP-dates (RFC 9110), so the age has **second resolution**: it may read up to a second
//! more or less than the object's true age. An age is never negative: a `Last-Modified` after
//! the `Date` (a store whose frontends' clocks disagree) reads as zero, the reading least
//! likely to make anyone take something over early. A response without either header, or with
//! one that does not parse as an HTTP-date, has no age (`None`): the caller must fall back to
//! its own clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::BoxError;
use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;

/// Holds the `Date` header of the response to the one request it is given to.
#[derive(Debug, Clone, Default)]
pub(super) struct ResponseDate {
    seen: Arc<Mutex<Option<String>>>,
}

impl ResponseDate {
    /// The `Date` the response carried, if any (the last attempt's, were there several).
    pub(super) fn date(&self) -> Option<String> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Intercept for ResponseDate {
    fn name(&self) -> &'static str {
        "ResponseDate"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let date = context.response().headers().get("date").map(str::to_string);
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = date;
        Ok(())
    }
}

/// `date` (an HTTP-date) minus `last_modified`, never negative; `None` when either is missing
/// or unreadable.
pub(super) fn age(date: Option<&str>, last_modified: Option<&DateTime>) -> Option<Duration> {
    let now = SystemTime::try_from(DateTime::from_str(date?, Format::HttpDate).ok()?).ok()?;
    let modified = SystemTime::try_from(*last_modified?).ok()?;
    Some(now.duration_since(modified).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_is_the_date_minus_last_modified_in_seconds() {
        let lm = DateTime::from_str("Tue, 01 Dec 2026 10:00:00 GMT", Format::HttpDate).unwrap();
        let at = |d: &str| age(Some(d), Some(&lm));
        assert_eq!(
            at("Tue, 01 Dec 2026 10:00:07 GMT"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(at("Tue, 01 Dec 2026 10:00:00 GMT"), Some(Duration::ZERO));
        // A Last-Modified after the Date reads as no age at all, never as a negative one.
        assert_eq!(at("Tue, 01 Dec 2026 09:59:00 GMT"), Some(Duration::ZERO));
        assert_eq!(at("yesterday"), None);
        assert_eq!(age(None, Some(&lm)), None);
        assert_eq!(age(Some("Tue, 01 Dec 2026 10:00:07 GMT"), None), None);
    }
}

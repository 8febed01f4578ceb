//! The one mapping of aws-sdk-s3 errors into [`BucketError`]s, each one line in words.
//!
//! What an operator sees of a failed S3 request is the `Display` of what [`map_error`] returns,
//! never the SDK's `Debug` dump (`ServiceError(… ErrorMetadata …)`), in errors and in the retry
//! layer's log lines alike:
//! - `NoSuchBucket` is [`BucketError::NoSuchBucket`]: "bucket b does not exist";
//! - HTTP 403 and the credential codes (`AccessDenied`, `InvalidAccessKeyId`,
//!   `SignatureDoesNotMatch`, expired or invalid tokens) are [`BucketError::AccessDenied`]:
//!   "access denied to s3://b/p (check the credentials for ENDPOINT): CODE: MESSAGE (HTTP 403)"
//!   (a 403 `RequestTimeTooSkewed` is a clock, not a credential, and is `Permanent`);
//! - a request that could not be signed because the credentials chain found no credentials
//!   (or found its configuration broken) is [`BucketError::NoCredentials`]: "no AWS
//!   credentials found (…) for s3://b/p: set …", at once: nothing was sent, and no retry
//!   would find any (the SDK reports it as a dispatch failure, like a refused connection,
//!   which is why it is told apart by the [`CredentialsError`] in its sources);
//! - a request that could not be sent or was not answered (connect, DNS, TLS, I/O errors,
//!   timeouts) is [`BucketError::Unreachable`]: "cannot reach the endpoint URL: reason";
//! - anything else keeps its place in the taxonomy of the module docs of [`super`]
//!   (`NotFound`, `PreconditionFailed`, `Conflict`, `Transient`, `Permanent`), the message of
//!   the last two reading "S3 OPERATION KEY: CODE: MESSAGE (HTTP n)".

use std::error::Error;

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use super::S3Bucket;
use crate::bucket::BucketError;

/// Error codes that mean the credentials are not good for this request, whatever the status.
const CREDENTIAL_CODES: [&str; 8] = [
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccountProblem",
];

/// Error codes of throttling: the store did not do the request; later it may.
const THROTTLING_CODES: [&str; 6] = [
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
];

/// Maps the SDK error of the request `op` (the S3 operation, as "S3 GetObject") on our key
/// `key` of bucket `b`; `write` says whether the request may change the bucket (then a failure
/// whose outcome is unknown is indeterminate).
pub(super) fn map_error<E>(
    b: &S3Bucket,
    op: &'static str,
    key: &str,
    write: bool,
    e: SdkError<E>,
) -> BucketError
where
    E: ProvideErrorMetadata + Error + Send + Sync + 'static,
{
    let key = key.to_string();
    let unreachable = |reason: String| BucketError::Unreachable {
        endpoint: b.endpoint.clone(),
        reason,
        indeterminate: write,
    };
    let service = match &e {
        SdkError::ServiceError(service) => service,
        SdkError::ConstructionFailure(_) => {
            return BucketError::Permanent {
                op,
                key,
                message: format!("cannot build the request: {}", chain(&e)),
            };
        }
        SdkError::TimeoutError(_) => {
            return unreachable(format!(
                "no answer within {:?} (the attempt timeout)",
                b.options.attempt_timeout
            ));
        }
        SdkError::DispatchFailure(d) => {
            if let Some(detail) = credentials_missing(&e) {
                return BucketError::NoCredentials {
                    url: super::super::Bucket::url(b),
                    detail,
                };
            }
            let Some(connector) = d.as_connector_error() else {
                return unreachable(chain(&e));
            };
            let reason = match connector.source() {
                Some(source) => chain(source),
                None => connector.to_string(),
            };
            if connector.is_user() {
                return BucketError::Permanent {
                    op,
                    key,
                    message: format!("the request could not be sent: {reason}"),
                };
            }
            if connector.is_timeout() {
                return unreachable(format!("timed out: {reason}"));
            }
            return unreachable(reason);
        }
        SdkError::ResponseError(r) => {
            return BucketError::Transient {
                op,
                key,
                message: format!(
                    "unreadable response (HTTP {}): {}",
                    r.raw().status().as_u16(),
                    chain(&e)
                ),
                indeterminate: write,
            };
        }
        // A kind of failure this SDK version does not have yet: it may have happened.
        _ => {
            return BucketError::Transient {
                op,
                key,
                message: chain(&e),
                indeterminate: write,
            };
        }
    };
    let status = service.raw().status().as_u16();
    let code = service.err().code();
    let detail = describe(code, service.err().message(), status);
    let transient = |indeterminate| BucketError::Transient {
        op,
        key: key.clone(),
        message: detail.clone(),
        indeterminate,
    };
    match (status, code) {
        (_, Some("NoSuchBucket")) => BucketError::NoSuchBucket {
            bucket: b.bucket.clone(),
        },
        (_, Some("RequestTimeTooSkewed")) => BucketError::Permanent {
            op,
            key,
            message: format!("{detail}: check this machine's clock"),
        },
        (403, _) => access_denied(b, detail),
        (_, Some(c)) if CREDENTIAL_CODES.contains(&c) => access_denied(b, detail),
        (404, _) | (_, Some("NoSuchKey")) => BucketError::NotFound { key },
        (412, _) => BucketError::PreconditionFailed { key },
        (409, _) | (_, Some("ConditionalRequestConflict")) => BucketError::Conflict { key },
        (429 | 503, _) => transient(false),
        (_, Some(c)) if THROTTLING_CODES.contains(&c) => transient(false),
        (500 | 502 | 504, _) | (_, Some("InternalError" | "RequestTimeout")) => transient(write),
        _ => BucketError::Permanent {
            op,
            key,
            message: detail,
        },
    }
}

/// When `e`'s sources hold the credentials chain's word that it found no credentials (or
/// that its configuration is broken): that word and its causes, on one line. A provider that
/// failed otherwise (timed out, an STS error) may do better later: `None`, and the error is
/// classified as any other dispatch failure.
fn credentials_missing(e: &(dyn Error + 'static)) -> Option<String> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<CredentialsError>() {
            return matches!(
                c,
                CredentialsError::CredentialsNotLoaded(_)
                    | CredentialsError::InvalidConfiguration(_)
            )
            .then(|| chain(c));
        }
        source = s.source();
    }
    None
}

fn access_denied(b: &S3Bucket, detail: String) -> BucketError {
    BucketError::AccessDenied {
        url: super::super::Bucket::url(b),
        endpoint: b.endpoint.clone(),
        detail,
    }
}

/// "CODE: MESSAGE (HTTP n)", leaving out what the answer did not say (a HEAD has no body).
fn describe(code: Option<&str>, message: Option<&str>, status: u16) -> String {
    let words: Vec<&str> = [code, message]
        .into_iter()
        .flatten()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if words.is_empty() {
        format!("HTTP {status}")
    } else {
        one_line(&format!("{} (HTTP {status})", words.join(": ")))
    }
}

/// An error and its sources on one line ([`crate::units::error_chain`]).
pub(super) fn chain(e: &(dyn Error + 'static)) -> String {
    crate::units::error_chain(e)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_says_each_cause_once_on_one_line() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "tcp connect error:\n  {}", self.0)
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(chain(&Outer(io)), "tcp connect error: Connection refused");
    }

    #[test]
    fn describe_leaves_out_what_is_missing() {
        assert_eq!(describe(None, None, 403), "HTTP 403");
        assert_eq!(
            describe(Some("InvalidArgument"), Some("bad\nthing "), 400),
            "InvalidArgument: bad thing (HTTP 400)"
        );
    }
}

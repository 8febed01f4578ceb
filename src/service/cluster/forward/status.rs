//! What a forwarded call's answer and metadata say: whether the route may be stale, whether
//! the client or the owner made a status, and what remains of the caller's deadline.

#[allow(unused_imports)]
use super::*;

/// Whether an owner's answer says the route may be stale: it could not be reached, or it
/// answered as an instance that does not run the store does ([`disowns`]).
pub(super) fn disowned<R>(answer: &Answer<R>) -> bool {
    match answer {
        Err(_) => true,
        Ok(Err(s)) => disowns(s),
        Ok(Ok(_)) => false,
    }
}

/// The answer of an instance that does not run the store a call (or a node's stream) names:
/// the one-hop rule's `FAILED_PRECONDITION`, or `NOT_FOUND`.
pub(in crate::service) fn disowns(s: &Status) -> bool {
    matches!(s.code(), Code::FailedPrecondition | Code::NotFound)
}

/// The owner's status as it answered (code, message and details).
pub(in crate::service) fn same_status(s: &Status) -> Status {
    Status::with_details(
        s.code(),
        s.message().to_string(),
        s.details().to_vec().into(),
    )
}

/// A status the client made (no connection, a broken one), not one the owner answered.
pub(in crate::service) fn from_transport(s: &Status) -> bool {
    std::error::Error::source(s).is_some()
}

/// The client's own deadline ran out (tonic's `TimeoutExpired`).
pub(super) fn timed_out(s: &Status) -> bool {
    let mut cur = std::error::Error::source(s);
    while let Some(c) = cur {
        if c.is::<tonic::TimeoutExpired>() {
            return true;
        }
        cur = c.source();
    }
    false
}

/// A transport error and its causes, on one line.
pub(in crate::service) fn describe(s: &Status) -> String {
    match std::error::Error::source(s) {
        Some(cause) => format!("{}: {}", s.message(), crate::units::error_chain(cause)),
        None => s.message().to_string(),
    }
}

/// What remains of the caller's deadline (`grpc-timeout`: at most 8 digits and a unit).
pub fn remaining_deadline(meta: &MetadataMap) -> Option<Duration> {
    let v = meta.get("grpc-timeout")?.to_str().ok()?;
    parse_grpc_timeout(v)
}

/// `grpc-timeout`'s value (gRPC over HTTP/2: `1*8DIGIT unit`, unit one of H M S m u n).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pub(super) struct MetaInjector<'a>(pub(super) &'a mut MetadataMap);

impl Injector for MetaInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

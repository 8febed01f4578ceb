//! Who may call what: operator calls need the admin token when one is set; `ReportPosition`
//! needs the store's node token. An empty token never passes: neither an empty configured
//! admin token (start-up refuses one; this is the second line) nor an empty bearer. Tokens travel as `authorization: Bearer <token>` and are
//! compared in constant time against the configured token or the stored hash; no token is ever
//! logged or echoed.

use tonic::metadata::MetadataMap;

use crate::registry;

/// A caller without the token its call needs (`UNAUTHENTICATED`, `error.rs`); the message never
/// holds a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AuthError(pub String);

/// The bearer token of a request, if it carries one.
pub fn bearer(meta: &MetadataMap) -> Option<&str> {
    meta.get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Checks an operator call against the admin token, when one is configured.
pub fn require_admin(admin_token: Option<&str>, meta: &MetadataMap) -> Result<(), AuthError> {
    let Some(want) = admin_token else {
        return Ok(());
    };
    if want.is_empty() {
        return Err(AuthError(
            "the server's admin token is empty: every operator call is refused".into(),
        ));
    }
    match bearer(meta) {
        None => Err(AuthError(
            "this call needs `authorization: Bearer <admin token>`".into(),
        )),
        Some("") => Err(AuthError(
            "the bearer token is empty: this call needs the admin token".into(),
        )),
        Some(got) if constant_time_eq(got.as_bytes(), want.as_bytes()) => Ok(()),
        Some(_) => Err(AuthError("the admin token is wrong".into())),
    }
}

/// What `ReportPosition` answers for an unknown store and for a wrong token alike, so that it
/// tells a caller without the token nothing about which store ids exist.
pub const NODE_REFUSED: &str = "unknown store (on this instance) or wrong node token";

/// Checks a node's token against the stored token hash of the store it names, `None` when this
/// instance has no such store. Both refusals are the same `UNAUTHENTICATED` [`NODE_REFUSED`],
/// and an unknown store costs the same hash and comparison as a known one.
pub fn require_node(meta: &MetadataMap, token_hash: Option<&str>) -> Result<(), AuthError> {
    let Some(got) = bearer(meta) else {
        return Err(AuthError(
            "ReportPosition needs `authorization: Bearer <node token>`".into(),
        ));
    };
    // A hash no token has (not hex), compared all the same.
    const NO_STORE: &str = "----------------------------------------------------------------";
    let matches = registry::token_matches(got, token_hash.unwrap_or(NO_STORE));
    if matches && token_hash.is_some() {
        Ok(())
    } else {
        Err(AuthError(NODE_REFUSED.into()))
    }
}

pub(in crate::service) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(authorization: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(a) = authorization {
            m.insert("authorization", a.parse().unwrap());
        }
        m
    }

    #[test]
    fn an_empty_token_never_passes() {
        // An empty configured token refuses every call, even one with an empty bearer.
        for a in [None, Some("Bearer "), Some("Bearer   "), Some("Bearer x")] {
            assert!(require_admin(Some(""), &meta(a)).is_err(), "{a:?}");
        }
        for a in [
            None,
            Some("Bearer "),
            Some("Bearer  "),
            Some("Bearer wrong"),
        ] {
            assert!(require_admin(Some("secret"), &meta(a)).is_err(), "{a:?}");
        }
        assert!(require_admin(Some("secret"), &meta(Some("Bearer secret"))).is_ok());
        assert!(require_admin(None, &meta(None)).is_ok());
    }
}

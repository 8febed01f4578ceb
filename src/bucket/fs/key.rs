//! What a key may be in a local-directory bucket, and the name of its scratch file: a key maps
//! to a path below the root one segment at a time, so a key that could escape the root, collide
//! with the bucket's own files (`.lock`, `.tmp/`) or name one file in two ways is refused. The
//! S3 bucket applies the same rules, so a prefix copies between the two.

use super::{BucketError, SCRATCH_SUFFIX};

/// Refuses keys that could escape the root, collide with the bucket's own files or name one
/// file in two ways.
pub(crate) fn check_key(op: &'static str, key: &str) -> Result<(), BucketError> {
    let why = if key.is_empty() {
        "the key is empty"
    } else if key.starts_with('/') {
        "the key is absolute"
    } else if key.starts_with('.') {
        "keys starting with '.' are reserved for the bucket's own files"
    } else if key.contains('\0') {
        "the key contains a NUL byte"
    } else if key.split('/').any(|s| s.is_empty()) {
        "the key has an empty segment ('//' or a trailing '/')"
    } else if key.split('/').any(|s| s == "." || s == "..") {
        "the key has a '.' or '..' segment"
    } else {
        return Ok(());
    };
    Err(BucketError::Permanent {
        op,
        key: key.to_string(),
        message: format!("bad key: {why}"),
    })
}

/// The scratch file name of `key` under [`TMP_DIR`]: the key with `%` and `/` escaped (`lease`
/// is `lease.scratch`), or `None` when that is longer than a file name may be.
pub(super) fn scratch_name(key: &str) -> Option<String> {
    let name = key.replace('%', "%25").replace('/', "%2F") + SCRATCH_SUFFIX;
    (name.len() <= 255).then_some(name)
}

//! Checking the store directories and destinations clients send.
//!
//! A store directory must be an absolute, normalized UTF-8 path of at most 4096 bytes, and —
//! after resolving symbolic links — lie strictly under one of the allowed roots. A directory
//! that does not exist yet is resolved through its nearest existing ancestor (what does not
//! exist cannot be a link), so a link planted later is caught when the worker starts: the
//! service resolves the path again at every start, and the running worker at every look (its
//! [`StoreDir`](crate::store::dir::StoreDir) is confined to the same roots: the directory is
//! opened once, inside a root, and a path that later resolves outside every root, or names
//! another directory, is refused with the reason in health).

use std::path::{Component, Path, PathBuf};

use super::error::ServiceError;

/// The longest store path accepted.
pub const MAX_PATH_BYTES: usize = 4096;

/// Resolves `raw` and checks it lies under one of `roots` (themselves resolved).
pub fn check_store_dir(raw: &str, roots: &[PathBuf]) -> Result<PathBuf, ServiceError> {
    let bad = |why: &str| ServiceError::InvalidArgument(format!("store_dir {raw:?}: {why}"));
    if raw.is_empty() {
        return Err(ServiceError::InvalidArgument("store_dir is empty".into()));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(ServiceError::InvalidArgument(format!(
            "store_dir is {} bytes, over the limit of {MAX_PATH_BYTES}",
            raw.len()
        )));
    }
    if raw.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(bad("must be an absolute path"));
    }
    for c in path.components() {
        match c {
            Component::ParentDir => return Err(bad("must not contain '..'")),
            Component::CurDir => return Err(bad("must not contain '.'")),
            _ => {}
        }
    }
    let resolved = resolve(path)
        .map_err(|e| ServiceError::InvalidArgument(format!("store_dir {raw:?}: {e}")))?;
    for root in roots {
        if resolved != *root && resolved.starts_with(root) {
            return Ok(resolved);
        }
    }
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(ServiceError::PermissionDenied(format!(
        "store_dir {raw:?} (resolved: {}) is not under an allowed root ({})",
        resolved.display(),
        roots.join(", ")
    )))
}

/// Canonicalizes the longest existing prefix of `path` and appends the rest.
pub fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(real) => {
                let mut out = real;
                for part in rest.iter().rev() {
                    out.push(part);
                }
                return Ok(out);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else {
                    return Err(e);
                };
                rest.push(name);
                if !existing.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Checks a destination's scheme and shape (it is opened later).
pub fn check_destination(raw: &str) -> Result<(), ServiceError> {
    let bad = |why: &str| ServiceError::InvalidArgument(format!("destination {raw:?}: {why}"));
    if let Some(path) = raw.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad(
                "a file:// destination needs an absolute path (file:///path)",
            ));
        }
        if Path::new(path)
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(bad("must not contain '..'"));
        }
        Ok(())
    } else if let Some(rest) = raw.strip_prefix("s3://") {
        let bucket = rest.split('/').next().unwrap_or("");
        if bucket.is_empty() {
            return Err(bad("no bucket name after s3://"));
        }
        Ok(())
    } else {
        Err(bad("the scheme must be file:// or s3://"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let roots = vec![root.clone()];
        let ok = check_store_dir(root.join("a/b").to_str().unwrap(), &roots).unwrap();
        assert_eq!(ok, root.join("a/b"));
        let code = |r: Result<PathBuf, ServiceError>| match r {
            Err(ServiceError::InvalidArgument(_)) => "invalid",
            Err(ServiceError::PermissionDenied(_)) => "denied",
            Ok(_) => "ok",
            Err(_) => "other",
        };
        assert_eq!(code(check_store_dir("relative/x", &roots)), "invalid");
        assert_eq!(
            code(check_store_dir(
                &format!("{}/a/../b", root.display()),
                &roots
            )),
            "invalid"
        );
        assert_eq!(
            code(check_store_dir(&format!("/{}", "x".repeat(5000)), &roots)),
            "invalid"
        );
        assert_eq!(code(check_store_dir("/etc/passwd", &roots)), "denied");
        assert_eq!(
            code(check_store_dir(root.to_str().unwrap(), &roots)),
            "denied"
        );
        // A link under the root that points outside it is outside.
        std::os::unix::fs::symlink("/tmp", root.join("escape")).unwrap();
        assert_eq!(
            code(check_store_dir(
                root.join("escape/s").to_str().unwrap(),
                &roots
            )),
            "denied"
        );
    }

    #[test]
    fn destinations_are_checked() {
        assert!(check_destination("file:///x/y").is_ok());
        assert!(check_destination("s3://bucket/prefix").is_ok());
        assert!(check_destination("ftp://x").is_err());
        assert!(check_destination("file://rel").is_err());
        assert!(check_destination("s3:///nobucket").is_err());
    }
}

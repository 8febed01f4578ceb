//! Checking the store directories clients send (destinations: `destination.rs`).
//!
//! A store directory must be an absolute, normalized UTF-8 path of at most 4096 bytes with no
//! control character, and — after resolving symbolic links — lie strictly under one of the
//! allowed roots. A directory that does not exist yet is resolved through its nearest existing
//! ancestor (what does not exist cannot be a link), so a link planted later is caught when the
//! worker starts: the service resolves the path again at every start, and the running worker
//! at every look (its
//! [`StoreDir`](crate::store::dir::StoreDir) is confined to the same roots: the directory is
//! opened once, inside a root, and a path that later resolves outside every root, or names
//! another directory, is refused with the reason in health).

use std::path::{Component, Path, PathBuf};

use super::limits::{self, FieldError};

/// Why a store directory is refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreDirError {
    /// Not a well-formed path (empty, relative, `..`, too long, a control character).
    #[error(transparent)]
    Bad(#[from] FieldError),
    /// Well formed, but not strictly under an allowed root once resolved.
    #[error("{0}")]
    OutsideRoots(String),
}

/// The longest store path accepted.
pub const MAX_PATH_BYTES: usize = 4096;

/// Resolves `raw` and checks it lies under one of `roots` (themselves resolved).
pub fn check_store_dir(raw: &str, roots: &[PathBuf]) -> Result<PathBuf, StoreDirError> {
    if raw.is_empty() {
        return Err(FieldError("store_dir is empty".into()).into());
    }
    limits::check_text("store_dir", raw, MAX_PATH_BYTES)?;
    let bad = |why: &str| {
        StoreDirError::Bad(FieldError(format!(
            "store_dir {}: {why}",
            limits::quote(raw)
        )))
    };
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
    let resolved = resolve(path).map_err(|e| bad(&e.to_string()))?;
    for root in roots {
        if resolved != *root && resolved.starts_with(root) {
            return Ok(resolved);
        }
    }
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(StoreDirError::OutsideRoots(format!(
        "store_dir {} (resolved: {}) is not under an allowed root ({})",
        limits::quote(raw),
        resolved.display(),
        roots.join(", ")
    )))
}

/// Canonicalizes the longest existing prefix of `path` and appends the rest; a dangling
/// symbolic link on the way is an error.
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
                // A link whose target is missing is not "what does not exist": its target
                // could appear anywhere later. Refused rather than followed.
                if std::fs::symlink_metadata(&existing).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(std::io::Error::other(format!(
                        "{} is a symbolic link to a missing target",
                        existing.display()
                    )));
                }
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
        let code = |r: Result<PathBuf, StoreDirError>| match r {
            Err(StoreDirError::Bad(_)) => "invalid",
            Err(StoreDirError::OutsideRoots(_)) => "denied",
            Ok(_) => "ok",
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
}

//! The walk behind a local-directory bucket's listing: keys in S3's byte order, straight from
//! the directory tree.

use std::fs;
use std::io;
use std::path::Path;

use super::is_absent;

/// Appends to `out`, in key order, the keys under `dir` (whose keys start with `rel`) that
/// start with `prefix` and sort after `after`, until `out` holds `want` keys.
///
/// Entries are visited sorted by name, a directory's name taken with its trailing `/`: every key
/// below directory `d` starts with `d/` and no sibling's key does, so this visits keys in exactly
/// the byte order S3 lists them in, and whole subtrees outside the prefix or before `after` are
/// skipped.
pub(super) fn walk(
    dir: &Path,
    rel: &str,
    prefix: &str,
    after: Option<&str>,
    want: usize,
    out: &mut Vec<String>,
) -> io::Result<()> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if rel.is_empty() && name.starts_with('.') {
            continue; // the bucket's own files
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            entries.push((format!("{rel}{name}/"), true));
        } else if kind.is_file() {
            entries.push((format!("{rel}{name}"), false));
        }
    }
    entries.sort();
    for (key, is_dir) in entries {
        if is_dir {
            let relevant = key.starts_with(prefix) || prefix.starts_with(&key);
            let passed = after.is_some_and(|a| a > key.as_str() && !a.starts_with(&key));
            if relevant && !passed {
                match walk(&dir.join(&key[rel.len()..]), &key, prefix, after, want, out) {
                    // Removed meanwhile by a delete: it holds no keys.
                    Err(e) if is_absent(&e) => {}
                    other => other?,
                }
            }
        } else if key.starts_with(prefix) && after.is_none_or(|a| key.as_str() > a) {
            out.push(key);
        }
        if out.len() >= want {
            return Ok(());
        }
    }
    Ok(())
}

//! The walk behind a local-directory bucket's listing: keys in S3's byte order, straight from
//! the directory tree, each directory opened from the one above it without following a link.

use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::FileType;
use rustix::io::Errno;

use super::{BucketError, Inner, io_error};
use crate::nofollow::{AtError, kind_at, open_dir_at};

/// Appends to `out`, in key order, the keys under `dir` (whose keys start with `rel`) that
/// start with `prefix` and sort after `after`, until `out` holds `want` keys.
///
/// Entries are visited sorted by name, a directory's name taken with its trailing `/`: every key
/// below directory `d` starts with `d/` and no sibling's key does, so this visits keys in exactly
/// the byte order S3 lists them in, and whole subtrees outside the prefix or before `after` are
/// skipped.
///
/// Anything but a directory or a regular file (a symbolic link, a FIFO, …) that would be
/// listed, or that a key of the listing could lie below, is refused with the bucket's
/// bad-bucket error naming it: never followed, and never skipped, so that a listing does not
/// silently miss what a link hides (see the module docs, "Links").
pub(super) fn walk(
    b: &Inner,
    dir: BorrowedFd<'_>,
    rel: &str,
    prefix: &str,
    after: Option<&str>,
    want: usize,
    out: &mut Vec<String>,
) -> Result<(), BucketError> {
    let err = |e: Errno| io_error("list", prefix, e.into(), false);
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." || (rel.is_empty() && name.starts_with('.')) {
            continue; // the bucket's own files
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match kind_at(dir, name).map_err(err)? {
                Some(kind) => kind,
                None => continue, // removed meanwhile
            },
            kind => kind,
        };
        let key = format!("{rel}{name}");
        match kind {
            FileType::Directory => entries.push((key + "/", true)),
            FileType::RegularFile => entries.push((key, false)),
            other => {
                if listed(&key, prefix, after) || descended(&format!("{key}/"), prefix, after) {
                    return Err(b.bad_bucket("list", prefix, &key, other));
                }
            }
        }
    }
    entries.sort();
    for (key, is_dir) in entries {
        if is_dir {
            if descended(&key, prefix, after) {
                let name = &key[rel.len()..key.len() - 1];
                match open_dir_at(dir, name) {
                    Ok(Some(sub)) => walk(b, sub.as_fd(), &key, prefix, after, want, out)?,
                    // Removed meanwhile by a delete: it holds no keys.
                    Ok(None) => {}
                    Err(AtError::Io(e)) => return Err(err(e)),
                    // Replaced since it was read, by a link or a file.
                    Err(e) => return Err(b.at_error("list", prefix, &key[..key.len() - 1], e)),
                }
            }
        } else if listed(&key, prefix, after) {
            out.push(key);
        }
        if out.len() >= want {
            return Ok(());
        }
    }
    Ok(())
}

/// Whether the file `key` belongs in the listing.
fn listed(key: &str, prefix: &str, after: Option<&str>) -> bool {
    key.starts_with(prefix) && after.is_none_or(|a| key > a)
}

/// Whether keys of the listing may lie below the directory `dir` (its name with its `/`).
fn descended(dir: &str, prefix: &str, after: Option<&str>) -> bool {
    let relevant = dir.starts_with(prefix) || prefix.starts_with(dir);
    let passed = after.is_some_and(|a| a > dir && !a.starts_with(dir));
    relevant && !passed
}

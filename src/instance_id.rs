//! The default instance id of a `serve`: unique per data directory, stable across restarts.
//!
//! # Why
//! The instance id names a process's instance lease in every bucket it backs up to
//! (`instances/<id>.lease`, [`crate::lease::instance`]) and its claim in the registry. Two
//! `serve` processes on one host, each with its own data directory (and registry), sharing a
//! bucket, used to default to the host name alike: they renewed one instance lease object and
//! each kept the other out ("the instance lease is held by another process with this instance
//! id"). So the default is `<host>-<8 random hex digits>`, made once per data directory and kept
//! in it: the host name still shows, the id survives restarts (so a restarted process finds its
//! own instance leases and claim), and two data directories never share one.
//!
//! An explicit `--instance-id` (or `instance_id` in the TOML file) is used as given, as before,
//! and nothing is written.
//!
//! # The file
//! `<data_dir>/instance-id`: the id and a newline. It is never rewritten. It is created whole or
//! not at all: the id is written to a temp file of this process's own
//! (`instance-id.<pid>.<random>.tmp`, `O_EXCL`, not following a link), fsynced, then linked to
//! the name (`link`: fails when the name exists, so of two processes racing on one directory
//! exactly one id is kept and both read it), and the directory fsynced. The name is read
//! without following a link and must be a regular file holding one id of at most
//! [`MAX_ID_BYTES`] letters, digits, `-`, `_` and `.`; anything else is refused, naming the
//! file (the operator removes it or names an id).
//!
//! # What a crash leaves
//! Before the link: a temp file, removed at the next start by the process that finds it (its
//! name is this module's; nothing else is touched), and no id (the next start makes one).
//! After it: the id, kept.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The file holding the default instance id in the data directory.
pub const ID_FILE: &str = "instance-id";
/// The longest id read from the file.
pub const MAX_ID_BYTES: usize = 200;

/// Why the default instance id cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum InstanceIdError {
    #[error("the instance id file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "the instance id file {path}: {reason} (remove it to make a new id, or give \
         --instance-id)"
    )]
    Bad { path: PathBuf, reason: String },
}

/// The default instance id of the `serve` whose data directory is `data_dir` (created if need
/// be): the one kept there, or a new one kept there first. See the module docs.
pub fn default_for(data_dir: &Path, host: &str) -> Result<String, InstanceIdError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InstanceIdError::Io { path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let path = data_dir.join(ID_FILE);
    remove_stale_temps(data_dir);
    // At most twice: a racing process may link its id between our look and our link.
    for _ in 0..2 {
        if let Some(id) = read(&path)? {
            return Ok(id);
        }
        let id = new_id(host);
        let tmp = data_dir.join(format!(
            "{ID_FILE}.{}.{}.tmp",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let written = write_new(&tmp, &id).map_err(io(&tmp));
        let linked = written.and_then(|()| match std::fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(&path)(e)),
        });
        let _ = std::fs::remove_file(&tmp);
        if linked? {
            File::open(data_dir)
                .and_then(|d| d.sync_all())
                .map_err(io(data_dir))?;
            return Ok(id);
        }
    }
    read(&path)?.ok_or_else(|| InstanceIdError::Bad {
        path,
        reason: "created and removed while this process was reading it".into(),
    })
}

/// `<host>-<8 random hex digits>`, the host name cut to what an id may hold.
fn new_id(host: &str) -> String {
    let host: String = host
        .chars()
        .map(|c| if allowed(c) { c } else { '-' })
        .take(MAX_ID_BYTES - 9)
        .collect();
    let host = if host.is_empty() { "host" } else { &host };
    format!("{host}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// The id in `path`, `None` when there is no such file.
fn read(path: &Path) -> Result<Option<String>, InstanceIdError> {
    let bad = |reason: String| InstanceIdError::Bad {
        path: path.to_path_buf(),
        reason,
    };
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(bad("is a symbolic link".into()));
        }
        Err(source) => {
            return Err(InstanceIdError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let io = |source| InstanceIdError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !file.metadata().map_err(io)?.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    let mut text = String::new();
    let limit = u64::try_from(MAX_ID_BYTES + 2).unwrap_or(u64::MAX);
    file.take(limit)
        .read_to_string(&mut text)
        .map_err(|e| match e.kind() {
            io::ErrorKind::InvalidData => bad("is not UTF-8".into()),
            _ => io(e),
        })?;
    let id = text.strip_suffix('\n').unwrap_or(&text);
    if id.is_empty() || id.len() > MAX_ID_BYTES || !id.chars().all(allowed) {
        return Err(bad(format!(
            "does not hold one id of at most {MAX_ID_BYTES} letters, digits, '-', '_' and '.'"
        )));
    }
    Ok(Some(id.to_string()))
}

/// Creates `tmp` (never an existing file, never through a link) holding `id`, fsynced.
fn write_new(tmp: &Path, id: &str) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    f.write_all(format!("{id}\n").as_bytes())?;
    f.sync_all()
}

/// Removes the temp files of this module's that crashed processes left (best effort).
fn remove_stale_temps(data_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return;
    };
    let mine = std::process::id();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name
            .strip_prefix(ID_FILE)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|r| r.strip_suffix(".tmp"))
        else {
            continue;
        };
        let pid = rest.split('.').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p != mine && !alive(p)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether a process with this pid exists (a signal 0 is delivered or refused for rights).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_per_data_dir_kept_across_restarts_and_unique_per_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let first = default_for(&a, "vm.example").unwrap();
        assert!(first.starts_with("vm.example-"), "{first}");
        assert_eq!(first.len(), "vm.example-".len() + 8);
        assert_eq!(default_for(&a, "vm.example").unwrap(), first, "not stable");
        assert_ne!(default_for(&b, "vm.example").unwrap(), first, "shared");
        assert_eq!(
            std::fs::read_to_string(a.join(ID_FILE)).unwrap(),
            format!("{first}\n")
        );
        let leftovers: Vec<_> = std::fs::read_dir(&a)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != ID_FILE)
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(new_id("a b/c").starts_with("a-b-c-"));
    }

    #[test]
    fn racing_starts_on_one_dir_agree_on_one_id() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| default_for(&dir, "h").unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    }

    #[test]
    fn a_bad_file_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(ID_FILE);
        for (content, says) in [("", "does not hold"), ("a b\n", "does not hold")] {
            std::fs::write(&path, content).unwrap();
            let e = default_for(tmp.path(), "h").unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(ID_FILE), "{e}");
        }
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        let e = default_for(tmp.path(), "h").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }
}

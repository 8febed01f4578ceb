//! [`InstanceLock`]: the lock a `serve` holds on its data directory for its whole life, and
//! what a free lock proves about the process that held it before.
//!
//! # The lock
//!
//! `<data_dir>/instance.lock` is opened without following a symbolic link (`O_NOFOLLOW`), with
//! `O_NONBLOCK` (a FIFO planted there cannot make the open hang) and checked to be a regular
//! file once open, then locked with an exclusive, non-blocking `flock`. A second process on
//! the same directory finds it locked and refuses to start, naming the holder from the record
//! in the file ([`LockError::Held`]). The kernel drops a `flock` when the last descriptor of
//! its open file goes away: when its process exits, however it exits (SIGKILL included), and
//! never before. The service drops the lock only once every task and worker of the fleet has
//! stopped, as [`crate::service::run`] returns.
//!
//! # The record
//!
//! Right after locking, the holder writes (in place, then `fsync`) one line of JSON
//! ([`LockRecord`]): its host and pid, the device and inode of the lock file itself, the nonce
//! of the registry claim it holds or is about to take, and the earlier holders its own start
//! proved dead. It is written in place, never by rename: a rename would put a new inode under
//! the name, and the next process would lock that one instead of the one the holder has
//! locked. A crash mid-write leaves a torn record, which proves nothing (below).
//!
//! # What a free lock proves
//!
//! When this process takes the lock and the file holds a record, every process named in it
//! (the writer, and the holders the writer had found dead) held this very lock while it ran
//! under the nonce recorded, and no longer holds it: it has stopped. So a registry claim whose
//! nonce is one of theirs is a dead process's claim, and can be taken over at once, whatever
//! its heartbeat says ([`InstanceLock::dead`], used by
//! [`InstanceClaim::take_as_after`](crate::registry::InstanceClaim::take_as_after)). That is a
//! stronger fact than a stale heartbeat, which proves only that the holder stopped renewing
//! the registry, not that it stopped writing buckets.
//!
//! The proof holds only for the file the writer actually locked, on a filesystem whose `flock`
//! is the kernel's own. So the record proves nothing ([`InstanceLock::unproven`] says why) when:
//! - **it names another file**: its device and inode are not those of the file now locked, or
//!   its host is not this host. A data directory *copied* (`cp -a`, `rsync`, restored from a
//!   backup, onto this host or another) carries the record of a process that may well be alive
//!   elsewhere, holding the original lock with a fresh heartbeat; the copy is a new inode, so
//!   its record proves nothing and the claim is judged by its heartbeat, as before. (The
//!   heartbeat could not tell the two cases apart: a process killed a moment ago has a fresh
//!   heartbeat too. Only the file's identity can.) A directory *moved* on one filesystem keeps
//!   its inode, and then its lock: a live holder still excludes a process started on the new
//!   path.
//! - **the filesystem is a network or cluster one** (NFS, SMB/CIFS, Ceph, 9p, AFS, GFS2,
//!   OCFS2) or FUSE: there `flock` is emulated or leased (an NFS client cut off from its
//!   server loses its locks after the lease time while its process runs on), so a free lock
//!   does not prove its holder dead. The lock still excludes what it can.
//! - **the record does not parse** (torn by a crash mid-write, or written by something else).
//!
//! A whole machine cloned (same host name, same disk image, so the same device and inode) is
//! indistinguishable from this one: give a clone its own host name or instance id.
//!
//! # What a crash leaves
//!
//! The file and its record, never a held lock. A crash between writing the record and taking
//! the claim leaves a record naming a nonce the registry never saw, and the earlier holders
//! among its dead (so the claim that crashed process was about to take over is still proven
//! dead at the next start). The file is never deleted: removing it while another process
//! waits to lock it would split the lock between two inodes.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "instance.lock";

/// How many earlier holders a record carries: enough for the holder a crash interrupted
/// between its record and its claim, and the one before it.
const MAX_DEAD: usize = 4;

/// The most of the file read as a record; anything longer is not one.
const MAX_RECORD: u64 = 16 << 10;

/// `statfs` magic numbers of the filesystems whose `flock` proves nothing (see the module
/// docs): NFS, SMB, CIFS, SMB2, Ceph, FUSE, 9p, AFS, GFS2, OCFS2.
const UNPROVEN_FILESYSTEMS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517b, "SMB"),
    (0xff53_4d42, "CIFS"),
    (0xfe53_4d42, "SMB2"),
    (0x00c3_6400, "Ceph"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9p"),
    (0x5346_414f, "AFS"),
    (0x0116_1970, "GFS2"),
    (0x7461_636f, "OCFS2"),
];

/// A process that held this lock under a claim nonce, proven stopped by the lock being free.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeadHolder {
    /// The nonce of the registry claim it held (or was about to take).
    pub nonce: String,
    pub host: String,
    pub pid: i64,
}

/// What a holder writes into the lock file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockRecord {
    /// The writer, and the nonce of the claim it holds or is about to take.
    pub holder: DeadHolder,
    /// When it started, by its own clock (ms since the Unix epoch).
    pub started_at_ms: i64,
    /// The device and inode of the file it locked and wrote this into.
    pub dev: u64,
    pub ino: u64,
    /// The earlier holders its own start proved dead, newest first.
    #[serde(default)]
    pub dead: Vec<DeadHolder>,
}

/// Why the lock could not be taken or written.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds the lock.
    #[error(
        "the data directory {dir} is in use: its lock {path} is held by another live process \
         ({}); stop that process, or give this one its own --data-dir",
        .holder.as_ref().map_or_else(
            || "its record is unreadable".to_string(),
            |r| format!("pid {} on host {}", r.holder.pid, r.holder.host),
        )
    )]
    Held {
        dir: PathBuf,
        path: PathBuf,
        holder: Option<Box<LockRecord>>,
    },
    /// The lock file is a symbolic link, a FIFO, a directory…: not used.
    #[error("{path}: {what}, not a regular file; remove it")]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
}

/// This process's lock on its data directory; released when dropped (or at exit).
#[derive(Debug)]
pub struct InstanceLock {
    file: File,
    path: PathBuf,
    dev: u64,
    ino: u64,
    host: String,
    dead: Vec<DeadHolder>,
    unproven: Option<String>,
}

impl InstanceLock {
    /// Locks `dir/instance.lock` (creating it, mode 0600) for a process on `host`, and reads
    /// what the previous holder left; see the module docs. Writes nothing yet.
    pub fn take(dir: &Path, host: &str) -> Result<InstanceLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io_err = |op, source| LockError::Io {
            path: path.clone(),
            op,
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => LockError::NotAFile {
                    path: path.clone(),
                    what: "a symbolic link",
                },
                Some(libc::ENXIO) => LockError::NotAFile {
                    path: path.clone(),
                    what: "a FIFO or socket",
                },
                Some(libc::EISDIR) => LockError::NotAFile {
                    path: path.clone(),
                    what: "a directory",
                },
                _ => io_err("open", e),
            })?;
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        if !meta.is_file() {
            return Err(LockError::NotAFile {
                path,
                what: "not a regular file (a FIFO, a device…)",
            });
        }
        // Blocking again: the descriptor is a regular file, reads and writes never wait.
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| io_err("fcntl", e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)
            .map_err(|e| io_err("fcntl", e.into()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: read_record(&mut file).ok().flatten().map(Box::new),
                    path,
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err("flock", e)),
        }
        // Any mode the file was created with is the umask's; it is ours, keep it private.
        if meta.permissions().mode() & 0o077 != 0 {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
        }
        let (dev, ino) = (meta.dev(), meta.ino());
        let previous = read_record(&mut file);
        let mut lock = InstanceLock {
            file,
            path,
            dev,
            ino,
            host: host.to_string(),
            dead: Vec::new(),
            unproven: None,
        };
        match (network_filesystem(&lock.file), previous) {
            (Some(fs), _) => {
                lock.unproven = Some(format!(
                    "the data directory is on {fs}, where a free lock proves nothing"
                ))
            }
            (None, Err(e)) => lock.unproven = Some(format!("its record is unreadable: {e}")),
            (None, Ok(None)) => {}
            (None, Ok(Some(r))) => match lock.proves(&r) {
                Ok(()) => {
                    lock.dead.push(r.holder);
                    lock.dead.extend(r.dead);
                    lock.dead.truncate(MAX_DEAD);
                }
                Err(why) => lock.unproven = Some(why),
            },
        }
        Ok(lock)
    }

    /// Whether `r`, found in the file just locked, speaks of this file on this host.
    fn proves(&self, r: &LockRecord) -> Result<(), String> {
        if r.holder.host != self.host {
            return Err(format!(
                "its record was written on host {:?}, not this one ({:?}): a copied data \
                 directory",
                r.holder.host, self.host
            ));
        }
        if (r.dev, r.ino) != (self.dev, self.ino) {
            return Err(format!(
                "its record names another file (device {}, inode {}; this is device {}, inode \
                 {}): a copied data directory",
                r.dev, r.ino, self.dev, self.ino
            ));
        }
        Ok(())
    }

    /// The earlier holders of this lock proven to have stopped, newest first (empty when the
    /// file was new, or proves nothing: see [`InstanceLock::unproven`]).
    pub fn dead(&self) -> &[DeadHolder] {
        &self.dead
    }

    /// Why the file held a record that proves nothing, if it did.
    pub fn unproven(&self) -> Option<&str> {
        self.unproven.as_deref()
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that this process (`pid`, started at `started_at_ms`) holds, or is about to
    /// take, the claim `nonce`, with the holders proven dead: written in place and fsynced.
    pub fn record(&mut self, nonce: &str, pid: i64, started_at_ms: i64) -> Result<(), LockError> {
        let record = LockRecord {
            holder: DeadHolder {
                nonce: nonce.to_string(),
                host: self.host.clone(),
                pid,
            },
            started_at_ms,
            dev: self.dev,
            ino: self.ino,
            dead: self.dead.clone(),
        };
        let mut line = serde_json::to_vec(&record).expect("a record serializes");
        line.push(b'\n');
        let path = &self.path;
        let io_err = |op, source| LockError::Io {
            path: path.clone(),
            op,
            source,
        };
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(|e| io_err("seek", e))?;
        self.file.write_all(&line).map_err(|e| io_err("write", e))?;
        self.file
            .set_len(line.len() as u64)
            .map_err(|e| io_err("truncate", e))?;
        self.file.sync_data().map_err(|e| io_err("fsync", e))
    }
}

/// The record in `file`: `None` when the file is empty.
fn read_record(file: &mut File) -> Result<Option<LockRecord>, String> {
    file.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    file.take(MAX_RECORD + 1)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() as u64 > MAX_RECORD {
        return Err(format!("longer than {MAX_RECORD} bytes"));
    }
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The name of the network, cluster or FUSE filesystem `file` is on, if it is on one.
fn network_filesystem(file: &File) -> Option<&'static str> {
    let st = rustix::fs::fstatfs(file).ok()?;
    #[allow(clippy::useless_conversion)]
    let magic = i64::from(st.f_type) & 0xffff_ffff;
    UNPROVEN_FILESYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    #[test]
    fn a_held_lock_refuses_a_second_taker_naming_the_holder() {
        let d = dir();
        let mut first = InstanceLock::take(d.path(), "h").unwrap();
        assert!(first.dead().is_empty() && first.unproven().is_none());
        first.record("n1", 41, 0).unwrap();
        let e = InstanceLock::take(d.path(), "h").expect_err("held");
        let text = e.to_string();
        assert!(
            text.contains("pid 41 on host h") && text.contains(LOCK_FILE),
            "{text}"
        );
        drop(first);
        let second = InstanceLock::take(d.path(), "h").unwrap();
        assert_eq!(
            second.dead(),
            [DeadHolder {
                nonce: "n1".into(),
                host: "h".into(),
                pid: 41
            }]
        );
    }

    #[test]
    fn the_dead_carry_over_a_start_that_crashed_before_its_claim() {
        let d = dir();
        let mut a = InstanceLock::take(d.path(), "h").unwrap();
        a.record("a", 1, 0).unwrap();
        drop(a);
        let mut b = InstanceLock::take(d.path(), "h").unwrap();
        b.record("b", 2, 0).unwrap();
        drop(b); // "crashed" before taking its claim: the registry may still name "a"
        let c = InstanceLock::take(d.path(), "h").unwrap();
        let nonces: Vec<_> = c.dead().iter().map(|h| h.nonce.as_str()).collect();
        assert_eq!(nonces, ["b", "a"]);
    }

    #[test]
    fn a_copied_or_foreign_record_proves_nothing() {
        let (src, copy) = (dir(), dir());
        let mut a = InstanceLock::take(src.path(), "h").unwrap();
        a.record("live", 7, 0).unwrap();
        // Copied while its holder runs: the copy is another inode.
        std::fs::copy(src.path().join(LOCK_FILE), copy.path().join(LOCK_FILE)).unwrap();
        let there = InstanceLock::take(copy.path(), "h").unwrap();
        assert!(there.dead().is_empty());
        assert!(there.unproven().unwrap().contains("another file"));
        drop(there);
        // The same file, read by a process on another host name.
        let elsewhere = InstanceLock::take(copy.path(), "other").unwrap();
        assert!(elsewhere.dead().is_empty());
        drop(a);
    }

    #[test]
    fn a_torn_record_proves_nothing_and_links_and_fifos_are_refused() {
        let d = dir();
        std::fs::write(d.path().join(LOCK_FILE), b"{\"holder\":{\"non").unwrap();
        let l = InstanceLock::take(d.path(), "h").unwrap();
        assert!(l.dead().is_empty());
        assert!(l.unproven().unwrap().contains("unreadable"));
        drop(l);

        let linked = dir();
        std::os::unix::fs::symlink(d.path().join(LOCK_FILE), linked.path().join(LOCK_FILE))
            .unwrap();
        let e = InstanceLock::take(linked.path(), "h").expect_err("a symlink");
        assert!(e.to_string().contains("symbolic link"), "{e}");

        let fifo = dir();
        let path = fifo.path().join(LOCK_FILE);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let e = InstanceLock::take(fifo.path(), "h").expect_err("a FIFO");
        assert!(matches!(e, LockError::NotAFile { .. }), "{e}");
    }
}

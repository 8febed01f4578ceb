//! [`DirWatch`]: says, without looking, that a store directory has not changed.
//!
//! An idle store must cost (almost) nothing: a fleet of a thousand stores, each looked at every
//! `wal_interval`, would otherwise spend its time in `open`, `read` and `stat` of files that
//! did not change. A [`DirWatch`] gives a store directory a **stamp** ([`DirWatch::stamp`]) that
//! changes whenever a file in the directory or in its `archive/` is written, created, deleted,
//! renamed or has its attributes changed; a caller that remembers the stamp beside what it read
//! may answer from that read while the stamp stays the same.
//!
//! # How it knows
//! One inotify instance for the whole process (the kernel allows 128 per user, and the fleet
//! would need one per store otherwise), watching each directory for modification events only:
//! `IN_MODIFY`, `IN_ATTRIB`, `IN_CLOSE_WRITE`, `IN_CREATE`, `IN_DELETE`, `IN_MOVED_FROM`,
//! `IN_MOVED_TO`, and the directory's own deletion or move. Reads, opens and `flock`s (the
//! backup side's own looks) raise none, so looking never invalidates a stamp.
//!
//! **Exact for completed writes.** The kernel queues an event inside the `write`/`rename` that
//! causes it, before that call returns; [`DirWatch::stamp`] drains the queue (a non-blocking
//! `read`) before it answers. So a stamp taken after a write returned — in any process — always
//! differs from one taken before it. There is no reader thread and no delay to wait out.
//!
//! # What it cannot see, and the bound on that
//! A write through a shared mapping (`mmap`) raises no event, and neither does a write made by
//! another host on a network filesystem. Callers therefore trust a stamp for at most
//! [`DirWatch::trust`] after the read it vouches for, and read again after that:
//! - [`LOCAL_WATCH_TRUST`] (5 minutes) where the directory is on a local filesystem (ext4,
//!   XFS, Btrfs, tmpfs, ramfs, F2FS, ZFS). There only `mmap` writes go unseen: the store format
//!   is written with `write(2)`, and an engine that maps its WAL reports its positions over
//!   `ReportPosition` instead.
//! - [`WATCH_TRUST`] (30 s) everywhere else: NFS, SMB, FUSE, overlay mounts, or a directory
//!   whose filesystem could not be asked.
//!
//! These re-reads are the only looks an idle store makes; at 30 s everywhere they were a fifth
//! of an idle fleet's CPU.
//!
//! # Being told instead of asking
//! A watch made with [`DirWatch::signalling`] also raises a [`Signal`] (a `watch` channel's
//! counter) whenever an event of its directory is read from the queue, by whoever reads it: a
//! [`DirWatch::stamp`], or the process's one `dir-watch` thread, which blocks in `poll(2)` on
//! the queue and drains it when something arrives. So a quiet store's runner can sleep until
//! its directory changes (or its trust runs out) instead of asking every `wal_interval`; an
//! idle process has that one thread asleep in the kernel. The signal says "look again", never
//! what changed: the stamp stays the exact test. It is raised after the event is counted, so
//! a stamp taken after the signal was seen always differs from one taken before the write. A
//! queue overflow raises every signal.
//!
//! **Coalesced under sustained writes.** The thread is asleep in `poll(2)` while nothing
//! happens, so the first event after a quiet spell is signalled at once. After each drain it
//! waits [`COALESCE`] before polling again, so a store written to all the time (an engine at
//! 100 commits a second raises two or three events per commit) costs the thread at most one
//! wake-up per [`COALESCE`] instead of one per event: at 100 commits/s that wake-up per event
//! was three quarters of a following `backup`'s CPU (0.65 of 0.87 % of a core, `cargo bench
//! --bench durable`, scenario 5). The price is a signal up to [`COALESCE`] late during such a
//! stream of writes; nothing waits on it then but a resting runner, whose next tick is on the
//! `wal_interval` grid anyway, and a `durability = sync` worker, which is urgent: while any
//! watch made with [`DirWatch::signalling_urgently`] lives, the thread does not wait. A stamp
//! is never late: [`DirWatch::stamp`] drains the queue itself.
//!
//! A queue overflow (`IN_Q_OVERFLOW`, when events pile up unread) changes every stamp. A
//! directory that is deleted, moved away or unmounted has no stamp (`None`: look every time)
//! until a directory is found at its path again, which is watched afresh under a new stamp.
//!
//! # What a crash leaves
//! Nothing: the watch lives in the kernel only as long as the process.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use super::disk::ARCHIVE_DIR;

/// How long a stamp may vouch for a read on a network or unknown filesystem: changes the watch
/// cannot see (another host writing over a network filesystem, writes through `mmap`) are found
/// within this.
pub const WATCH_TRUST: Duration = Duration::from_secs(30);
/// How long a stamp may vouch for a read on a local filesystem, where only writes through
/// `mmap` go unseen.
pub const LOCAL_WATCH_TRUST: Duration = Duration::from_secs(300);

/// `statfs` magic numbers of the local filesystems whose every `write(2)` raises an event.
const LOCAL_FILESYSTEMS: [u64; 7] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0xF2F5_2010, // F2FS
    0x2FC1_2FC1, // ZFS
];

/// The trust a stamp of `dir` earns: [`LOCAL_WATCH_TRUST`] on a local filesystem,
/// [`WATCH_TRUST`] otherwise (and when the filesystem cannot be asked).
pub fn trust_for(dir: &Path) -> Duration {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return WATCH_TRUST;
    };
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills in.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return WATCH_TRUST;
    }
    // `f_type` is signed on some targets: compare its low 32 bits.
    #[allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]
    let magic = (st.f_type as u64) & 0xFFFF_FFFF;
    if LOCAL_FILESYSTEMS.contains(&magic) {
        LOCAL_WATCH_TRUST
    } else {
        WATCH_TRUST
    }
}

/// How long the `dir-watch` thread waits after a drain before it looks at the queue again,
/// unless an urgent watch lives (see the module docs).
pub const COALESCE: Duration = Duration::from_millis(50);

/// Live watches made with [`DirWatch::signalling_urgently`]: while any does, the `dir-watch`
/// thread signals every event as it comes.
static URGENT: AtomicUsize = AtomicUsize::new(0);

const MASK: u32 = libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// Events after which a watch no longer follows the directory at its path.
const GONE: u32 = libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_UNMOUNT;

/// Raised (its counter incremented) whenever an event of a [`DirWatch::signalling`] watch's
/// directory is read from the queue: "something here may have changed; look".
pub type Signal = Arc<watch::Sender<u64>>;

/// A fresh [`Signal`], nobody subscribed yet.
pub fn signal() -> Signal {
    Arc::new(watch::channel(0).0)
}

fn raise(signal: &Signal) {
    signal.send_modify(|n| *n = n.wrapping_add(1));
}

/// One kernel watch (one directory inode), shared by every [`DirWatch`] of that directory.
struct Watched {
    users: usize,
    /// The signals of the [`DirWatch`]es using this watch (those made with one).
    listeners: Vec<Signal>,
    /// Events seen for this watch.
    events: u64,
    /// The directory was deleted, moved or unmounted: the watch no longer follows the path.
    gone: bool,
    /// The kernel dropped the watch (`IN_IGNORED`): nothing to remove.
    dropped: bool,
}

struct Table {
    by_wd: HashMap<i32, Watched>,
    /// Queue overflows: every stamp includes it.
    overflows: u64,
}

struct Inotify {
    fd: OwnedFd,
    table: Mutex<Table>,
    /// The `dir-watch` thread runs: signals are raised without anybody asking.
    thread: bool,
}

/// The process's inotify instance, or `None` where the kernel refuses one.
fn inotify() -> Option<&'static Inotify> {
    static INOTIFY: OnceLock<Option<Inotify>> = OnceLock::new();
    INOTIFY
        .get_or_init(|| {
            // SAFETY: plain syscall; the descriptor is owned below.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            if fd < 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "no inotify: idle stores are looked at every interval"
                );
                return None;
            }
            let spawned = std::thread::Builder::new()
                .name("dir-watch".into())
                .spawn(move || wait_for_events(fd));
            if let Err(e) = &spawned {
                tracing::warn!(error = %e, "no dir-watch thread: quiet stores are looked at every interval");
            }
            Some(Inotify {
                // SAFETY: `fd` is a fresh descriptor nothing else owns.
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
                table: Mutex::new(Table {
                    by_wd: HashMap::new(),
                    overflows: 0,
                }),
                thread: spawned.is_ok(),
            })
        })
        .as_ref()
}

/// The `dir-watch` thread: sleeps in `poll(2)` until the queue has events, then drains it
/// (raising the signals). The descriptor lives as long as the process (a static).
fn wait_for_events(fd: i32) {
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own; the descriptor is never closed (a static).
        let n = unsafe { libc::poll(&mut p, 1, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        if p.revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
            return;
        }
        if let Some(ino) = inotify() {
            drop(ino.drained());
        }
        if URGENT.load(Ordering::Acquire) == 0 {
            std::thread::sleep(COALESCE);
        }
    }
}

impl Inotify {
    /// Locks the table after reading every queued event into it.
    fn drained(&self) -> MutexGuard<'_, Table> {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        // Left uninitialised (this runs for every store at every tick): only the bytes the
        // kernel wrote are ever looked at. u64 words keep it aligned for `inotify_event`.
        let mut buf = std::mem::MaybeUninit::<[u64; 1024]>::uninit();
        // The watches that had events, each signalled once when the queue is empty.
        let mut touched: Vec<i32> = Vec::new();
        loop {
            // SAFETY: reads into a buffer we own, at most its size.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    std::mem::size_of_val(&buf),
                )
            };
            if n <= 0 {
                // EAGAIN: the queue is empty. Any other error: nothing more to read now.
                for wd in touched {
                    if let Some(w) = table.by_wd.get(&wd) {
                        w.listeners.iter().for_each(raise);
                    }
                }
                return table;
            }
            // SAFETY: the kernel initialised the first `n` bytes of the buffer.
            let bytes: &[u8] =
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), n.unsigned_abs()) };
            let mut at = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= bytes.len() {
                // SAFETY: the kernel wrote whole events; `read_unaligned` needs no alignment.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(bytes[at..].as_ptr().cast()) };
                at += head + ev.len as usize;
                if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                    table.overflows += 1;
                    touched = table.by_wd.keys().copied().collect();
                    continue;
                }
                if let Some(w) = table.by_wd.get_mut(&ev.wd) {
                    if !touched.contains(&ev.wd) {
                        touched.push(ev.wd);
                    }
                    w.events += 1;
                    w.gone |= ev.mask & GONE != 0;
                    w.dropped |= ev.mask & libc::IN_IGNORED != 0;
                }
            }
        }
    }

    /// Watches `path` (a directory); `None` when it cannot be watched (absent, not a
    /// directory, out of watches).
    fn add(&self, table: &mut Table, path: &Path, listener: Option<&Signal>) -> Option<i32> {
        let c = CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: a NUL-terminated path and our own descriptor.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK) };
        if wd < 0 {
            return None;
        }
        let w = table.by_wd.entry(wd).or_insert(Watched {
            users: 0,
            listeners: Vec::new(),
            events: 0,
            gone: false,
            dropped: false,
        });
        if w.gone {
            // The kernel reused a number it had dropped: a new watch.
            w.events += 1;
            w.gone = false;
            w.dropped = false;
        }
        w.users += 1;
        if let Some(l) = listener {
            w.listeners.push(l.clone());
        }
        Some(wd)
    }

    fn release(&self, table: &mut Table, wd: i32, listener: Option<&Signal>) {
        if let Some(w) = table.by_wd.get_mut(&wd) {
            if let Some(l) = listener
                && let Some(i) = w.listeners.iter().position(|x| Arc::ptr_eq(x, l))
            {
                w.listeners.swap_remove(i);
            }
            w.users = w.users.saturating_sub(1);
            if w.users == 0 {
                let dropped = w.dropped;
                table.by_wd.remove(&wd);
                // A moved directory is still watched by the kernel (under its new path).
                if !dropped {
                    // SAFETY: our own descriptor and a watch we added.
                    unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
                }
            }
        }
    }
}

/// The watch of one store directory (and its `archive/`). See the module docs.
pub struct DirWatch {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// [`DirWatch::trust`] in milliseconds: asked of the filesystem whenever the directory is
    /// (re)watched.
    trust_ms: AtomicU64,
    /// Raised on the directory's events ([`DirWatch::signalling`]).
    signal: Option<Signal>,
    /// Counted in [`URGENT`] while it lives ([`DirWatch::signalling_urgently`]).
    urgent: bool,
}

#[derive(Default)]
struct Inner {
    dir_wd: Option<i32>,
    archive_wd: Option<i32>,
    /// The directory's event count when `archive/` was last looked for.
    archive_tried_at: Option<u64>,
    /// Watches started afresh (a directory gone and found again): part of every stamp, so a
    /// stamp from before never matches one after.
    restarts: u64,
}

impl DirWatch {
    /// Starts watching `dir`. Never fails: a directory that cannot be watched has no stamp.
    pub fn new(dir: impl Into<PathBuf>) -> DirWatch {
        Self::made(dir.into(), None, false)
    }

    /// Starts watching `dir`, raising `signal` whenever an event of it (or of its `archive/`)
    /// is read: see the module docs.
    pub fn signalling(dir: impl Into<PathBuf>, signal: Signal) -> DirWatch {
        Self::made(dir.into(), Some(signal), false)
    }

    /// [`DirWatch::signalling`] for a caller that acts on every change at once (a
    /// `durability = sync` worker): while it lives no signal is held back to coalesce events
    /// (see the module docs), in the whole process.
    pub fn signalling_urgently(dir: impl Into<PathBuf>, signal: Signal) -> DirWatch {
        Self::made(dir.into(), Some(signal), true)
    }

    fn made(dir: PathBuf, signal: Option<Signal>, urgent: bool) -> DirWatch {
        if urgent {
            URGENT.fetch_add(1, Ordering::AcqRel);
        }
        let w = DirWatch {
            dir,
            inner: Mutex::new(Inner::default()),
            trust_ms: AtomicU64::new(crate::units::millis_u64(WATCH_TRUST)),
            signal,
            urgent,
        };
        let _ = w.stamp();
        w
    }

    /// Whether the directory's changes raise the signal without anybody asking: a signal was
    /// given, the directory is watched now and the `dir-watch` thread runs. When not, a caller
    /// must ask ([`DirWatch::stamp`]) at its own pace.
    pub fn signals(&self) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        self.signal.is_some() && inner.dir_wd.is_some() && inotify().is_some_and(|i| i.thread)
    }

    /// A value that changes whenever the directory or its `archive/` changed: equal stamps
    /// mean no change in between (within [`DirWatch::trust`]; see the module docs). `None` when
    /// the directory cannot be watched: look every time.
    pub fn stamp(&self) -> Option<u64> {
        let ino = inotify()?;
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut table = ino.drained();
        // The directory itself: (re)watch it when it is not, or no longer, followed.
        let signal = self.signal.as_ref();
        if let Some(wd) = inner.dir_wd
            && table.by_wd.get(&wd).is_none_or(|w| w.gone)
        {
            ino.release(&mut table, wd, signal);
            inner.dir_wd = None;
            if let Some(a) = inner.archive_wd.take() {
                ino.release(&mut table, a, signal);
            }
            inner.archive_tried_at = None;
            inner.restarts += 1;
        }
        if inner.dir_wd.is_none() {
            inner.dir_wd = Some(ino.add(&mut table, &self.dir, signal)?);
            let trust = crate::units::millis_u64(trust_for(&self.dir));
            self.trust_ms.store(trust, Ordering::Relaxed);
        }
        let dir_wd = inner.dir_wd.expect("set above");
        let dir_events = table.by_wd.get(&dir_wd).map_or(0, |w| w.events);
        // archive/: dropped when gone; looked for again whenever the directory changed (its
        // creation is an event of the directory).
        if let Some(a) = inner.archive_wd
            && table.by_wd.get(&a).is_none_or(|w| w.gone)
        {
            ino.release(&mut table, a, signal);
            inner.archive_wd = None;
        }
        if inner.archive_wd.is_none() && inner.archive_tried_at != Some(dir_events) {
            inner.archive_tried_at = Some(dir_events);
            inner.archive_wd = ino.add(&mut table, &self.dir.join(ARCHIVE_DIR), signal);
        }
        let archive_events = inner
            .archive_wd
            .and_then(|a| table.by_wd.get(&a))
            .map_or(0, |w| w.events);
        Some(
            table
                .overflows
                .wrapping_add(dir_events)
                .wrapping_add(archive_events)
                .wrapping_add(inner.restarts << 32)
                .wrapping_add(u64::from(inner.archive_wd.is_some()) << 48),
        )
    }

    /// How long an unchanged stamp may vouch for a read of this directory (see the module
    /// docs): [`LOCAL_WATCH_TRUST`] or [`WATCH_TRUST`].
    pub fn trust(&self) -> Duration {
        Duration::from_millis(self.trust_ms.load(Ordering::Relaxed))
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        if self.urgent {
            URGENT.fetch_sub(1, Ordering::AcqRel);
        }
        let Some(ino) = inotify() else { return };
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut table = ino.table.lock().unwrap_or_else(|p| p.into_inner());
        for wd in [inner.dir_wd.take(), inner.archive_wd.take()]
            .into_iter()
            .flatten()
        {
            ino.release(&mut table, wd, self.signal.as_ref());
        }
    }
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatch").field("dir", &self.dir).finish()
    }
}

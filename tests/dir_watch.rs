//! `DirWatch`: a stamp that stays while a store directory is only read, and changes at once —
//! with no wait for any event to be delivered — after every completed write, in this process
//! or another, including writes into an `archive/` created after the watch started.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use mushroom_backup::store::disk::{self, DiskState};
use mushroom_backup::store::watch::DirWatch;

mod support;

fn append(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open for append");
    f.write_all(bytes).expect("append");
}

/// An empty store directory in a temp dir (which holds it for as long as it lives).
fn empty_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    (tmp, dir)
}

/// Asserts that `change` changes the stamp, and returns the new one.
fn changes(w: &DirWatch, before: u64, what: &str, change: impl FnOnce()) -> u64 {
    change();
    let after = w.stamp().expect("watched");
    assert_ne!(after, before, "{what} did not change the stamp");
    after
}

#[test]
fn reading_a_store_leaves_the_stamp_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    support::store::write(&dir, 300, 100, 4096);
    let w = DirWatch::new(&dir);
    let s0 = w.stamp().expect("a directory is watched");
    for _ in 0..3 {
        let look = DiskState::look(&dir).expect("look");
        for a in &look.archives {
            std::fs::read(&a.path).unwrap();
        }
        std::fs::read(dir.join(disk::WAL_FILE)).unwrap();
        std::fs::metadata(dir.join(disk::SNAPSHOT_FILE)).unwrap();
        // An offline reader fsyncs wal.bin itself; that is not a change either.
        std::fs::File::open(dir.join(disk::WAL_FILE))
            .unwrap()
            .sync_all()
            .unwrap();
        let _ = disk::lock_is_held(&dir).unwrap();
        assert_eq!(w.stamp(), Some(s0));
    }
}

#[test]
fn every_completed_write_changes_the_stamp_at_once() {
    let (_tmp, dir) = empty_dir();
    let w = DirWatch::new(&dir);
    let mut s = w.stamp().expect("watched");
    // Many small appends, each seen before the next: no event is ever late.
    for i in 0..500u32 {
        s = changes(&w, s, "an append", || {
            append(&dir.join("wal.bin"), &i.to_le_bytes())
        });
    }
    s = changes(&w, s, "a new file", || {
        std::fs::write(dir.join("snapshot.bin.tmp"), b"x").unwrap()
    });
    s = changes(&w, s, "a rename", || {
        std::fs::rename(dir.join("snapshot.bin.tmp"), dir.join("snapshot.bin")).unwrap()
    });
    s = changes(&w, s, "a permission change", || {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.join("snapshot.bin"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap()
    });
    // archive/ does not exist when the watch starts: its creation, and everything in it after.
    s = changes(&w, s, "creating archive/", || {
        std::fs::create_dir(dir.join("archive")).unwrap()
    });
    s = changes(&w, s, "a rotation into archive/", || {
        std::fs::rename(
            dir.join("wal.bin"),
            dir.join("archive/00000000000000000001.wal"),
        )
        .unwrap()
    });
    for i in 0..20u32 {
        s = changes(&w, s, "an append inside archive/", || {
            append(
                &dir.join("archive/00000000000000000001.wal"),
                &i.to_le_bytes(),
            )
        });
    }
    s = changes(&w, s, "a deletion inside archive/", || {
        std::fs::remove_file(dir.join("archive/00000000000000000001.wal")).unwrap()
    });
    // Another process's write is seen the moment that process is done.
    for _ in 0..20 {
        s = changes(&w, s, "another process's append", || {
            let status = Command::new("sh")
                .arg("-c")
                .arg("printf x >> \"$1\"")
                .arg("sh")
                .arg(dir.join("store.meta"))
                .status()
                .unwrap();
            assert!(status.success());
        });
    }
    let _ = s;
}

#[test]
fn a_directory_gone_has_no_stamp_until_one_is_back_and_then_a_new_one() {
    let (tmp, dir) = empty_dir();
    let w = DirWatch::new(&dir);
    let before = w.stamp().expect("watched");
    std::fs::remove_dir(&dir).unwrap();
    assert_eq!(w.stamp(), None, "a removed directory has no stamp");
    assert_eq!(w.stamp(), None);
    std::fs::create_dir(&dir).unwrap();
    let again = w.stamp().expect("watched again");
    assert_ne!(again, before);
    assert_eq!(w.stamp(), Some(again));
    // A directory moved away: its path now names another (or no) directory.
    std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
    assert_eq!(w.stamp(), None);
    std::fs::create_dir(&dir).unwrap();
    let third = w.stamp().expect("watched");
    append(&dir.join("wal.bin"), b"x");
    assert_ne!(
        w.stamp(),
        Some(third),
        "the new directory is the one watched"
    );
    // A path that never was a directory has no stamp.
    assert_eq!(DirWatch::new(tmp.path().join("absent")).stamp(), None);
}

#[test]
fn watches_of_one_directory_outlive_each_other() {
    let (tmp, dir) = empty_dir();
    let a = DirWatch::new(&dir);
    let b = DirWatch::new(&dir);
    let sb = b.stamp().unwrap();
    drop(a);
    changes(&b, sb, "a write after the other watch was dropped", || {
        append(&dir.join("wal.bin"), b"x")
    });
    // Many stores, one inotify instance: each stamp moves only with its own directory.
    let dirs: Vec<_> = (0..300)
        .map(|i| {
            let d = tmp.path().join(format!("s{i}"));
            std::fs::create_dir(&d).unwrap();
            d
        })
        .collect();
    let watches: Vec<_> = dirs.iter().map(DirWatch::new).collect();
    let stamps: Vec<_> = watches.iter().map(|w| w.stamp().unwrap()).collect();
    append(&dirs[7].join("wal.bin"), b"x");
    for (i, w) in watches.iter().enumerate() {
        assert_eq!(w.stamp() == Some(stamps[i]), i != 7, "store {i}");
    }
}

#[test]
fn a_stamp_is_trusted_longer_on_a_local_filesystem_than_on_any_other() {
    use mushroom_backup::store::watch::{LOCAL_WATCH_TRUST, WATCH_TRUST, trust_for};
    // Not a filesystem a write lands on, and no filesystem at all: the short bound.
    assert_eq!(trust_for(Path::new("/proc")), WATCH_TRUST);
    assert_eq!(
        trust_for(Path::new("/no/such/directory/anywhere")),
        WATCH_TRUST
    );
    // tmpfs, where this machine has one.
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(trust_for(Path::new("/dev/shm")), LOCAL_WATCH_TRUST);
    }
    // A watch asks the filesystem its directory is on.
    let tmp = tempfile::tempdir().unwrap();
    let w = DirWatch::new(tmp.path());
    assert!(w.stamp().is_some());
    assert_eq!(w.trust(), trust_for(tmp.path()));
}

//! What a hostile bucket holds, for tests: zstd bombs (a frame of RLE blocks, decoding to
//! 32,768 times its size), the manifest LATEST names (to edit in place), and a child's peak
//! resident memory and a cap on its address space (so that a test of a bomb cannot take the
//! machine down when the code under test is wrong).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Plain bytes of one RLE block of [`zstd_bomb`] (zstd's largest block).
pub const BOMB_BLOCK: u64 = 128 << 10;

/// A zstd frame of `blocks` RLE blocks of 128 KiB of zeros each, the last one ending the
/// frame: `6 + 4 × blocks` stored bytes decoding to `blocks × 128 KiB`.
pub fn zstd_bomb(blocks: usize) -> Vec<u8> {
    // Magic; a descriptor without content size, not single-segment; a 128 KiB window.
    let mut out = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38];
    out.reserve(blocks * 4);
    for i in 0..blocks {
        let last = u32::from(i + 1 == blocks);
        // Block_Size (the regenerated size of an RLE block) << 3 | RLE type (1) << 1 | last.
        let header = ((BOMB_BLOCK as u32) << 3) | (1 << 1) | last;
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.push(0);
    }
    out
}

/// The number of blocks of a [`zstd_bomb`] of about `stored` bytes.
pub fn bomb_blocks(stored: usize) -> usize {
    (stored - 6) / 4
}

/// The manifest LATEST of the `file://` bucket directory `bucket` names: its path and JSON.
pub fn latest_manifest(bucket: &Path) -> (PathBuf, serde_json::Value) {
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).expect("LATEST")).unwrap();
    let path = bucket.join(
        latest["manifest"]
            .as_str()
            .expect("LATEST names a manifest"),
    );
    let m = serde_json::from_slice(&std::fs::read(&path).expect("the manifest")).unwrap();
    (path, m)
}

/// The key of a segment of the manifest `m`'s generation from its last segment's end,
/// claiming `len` plain bytes.
pub fn segment_past(m: &serde_json::Value, len: u64) -> String {
    let generation = m["generation"].as_u64().unwrap();
    let start = m["segments"].as_array().unwrap().last().unwrap()["end"]
        .as_u64()
        .unwrap();
    mushroom_backup::manifest::segment_key(generation, start, start + len)
}

/// Replaces the object `entry` names (a manifest entry's JSON) with `stored`, re-sealing the
/// entry's stored length and CRC (the manifest has no checksum of its own) and stating
/// `plain_len` plain bytes of codec zstd; the plain CRC is left as it was.
pub fn replace_object(bucket: &Path, entry: &mut serde_json::Value, stored: &[u8], plain_len: u64) {
    let key = entry["key"].as_str().unwrap().to_string();
    std::fs::write(bucket.join(&key), stored).unwrap();
    entry["len"] = stored.len().into();
    entry["crc"] = crc32fast::hash(stored).into();
    entry["codec"] = "zstd".into();
    entry["plain_len"] = plain_len.into();
    if entry.get("plain_crc").is_none_or(|c| c.is_null()) {
        entry["plain_crc"] = 0.into();
    }
}

/// The names of what `dir` holds, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Peak resident memory (`VmHWM`) of the process `pid`, in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM in the status");
    kb * 1024
}

/// Caps `cmd`'s address space at `bytes` (`RLIMIT_AS`): an allocation past it fails (the
/// process aborts) instead of taking the machine's memory.
pub fn cap_address_space(cmd: &mut Command, bytes: u64) {
    // SAFETY: setrlimit is async-signal-safe and touches only the child being set up.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

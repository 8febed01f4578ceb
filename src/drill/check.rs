//! A drilled store against its manifest: the format's read-back, the commit seq, and every
//! file's plain length and CRC-32 (see the module docs of [`super`]). Reads only the restored
//! directory and the manifest, a chunk at a time (no file is held whole); writes nothing.

use std::path::{Path, PathBuf};

use crate::bucket::Bucket;
use crate::manifest::{Manifest, ObjectEntry};
use crate::restore::{RestoreReport, read_back};
use crate::store::disk::{ARCHIVE_DIR, SNAPSHOT_FILE, WAL_FILE, archive_name};
use crate::store::format::CHECK_CHUNK;

/// `Err(why)`, naming the object or file, when the store at `dir` is not what the manifest of
/// `report` promises; the manifest when it is (read for the check, so the drill's prediction
/// is calibrated from it without another request).
pub(super) async fn against_manifest(
    bucket: &dyn Bucket,
    dir: &Path,
    report: &RestoreReport,
    at: Option<u64>,
) -> Result<Manifest, String> {
    let key = &report.manifest_key;
    let object = bucket
        .get(key)
        .await
        .map_err(|e| format!("{key}: cannot read the manifest again: {e}"))?;
    let manifest = Manifest::decode(key, &object.data).map_err(|e| e.to_string())?;
    let expected = at.unwrap_or(manifest.commit_seq);
    if report.commit_seq != expected {
        return Err(format!(
            "{key}: the restore reports commit {}, the drill expected {expected}",
            report.commit_seq
        ));
    }
    let dir = dir.to_path_buf();
    let key = key.clone();
    tokio::task::spawn_blocking(move || {
        files(&dir, &key, &manifest, expected, at.is_none()).map(|()| manifest)
    })
    .await
    .map_err(|e| format!("the drill's check failed: {e}"))?
}

fn files(
    dir: &Path,
    key: &str,
    m: &Manifest,
    expected: u64,
    whole_wal: bool,
) -> Result<(), String> {
    let back = read_back(dir).map_err(|e| format!("read-back of the drilled store: {e}"))?;
    if back.commit_seq != expected {
        return Err(format!(
            "{key}: the drilled store reads back as commit {}, the manifest promises {expected}",
            back.commit_seq
        ));
    }
    if let Some(s) = &m.snapshot {
        whole(dir, &PathBuf::from(SNAPSHOT_FILE), &s.object, true)?;
    }
    for a in &m.archives {
        let rel = Path::new(ARCHIVE_DIR).join(archive_name(a.number));
        whole(dir, &rel, &a.object, whole_wal)?;
    }
    for side in &m.side_files {
        whole(dir, Path::new(&side.name), &side.object, true)?;
    }
    if whole_wal && !m.segments.is_empty() {
        let wal = open(dir, Path::new(WAL_FILE))?;
        let len = wal.1;
        let want = m.segments_end();
        if len != want {
            return Err(format!(
                "{WAL_FILE} of the drilled store is {len} bytes, the segments of {key} end at {want}"
            ));
        }
        for s in &m.segments {
            let o = &s.object;
            if s.end > len {
                return Err(format!(
                    "{}: its range {}..{} is past the end of {WAL_FILE}",
                    o.key, s.start, s.end
                ));
            }
            let crc = crc_of(&wal.0, s.start, s.end - s.start)
                .map_err(|e| format!("{WAL_FILE} of the drilled store: {e}"))?;
            compare(
                &o.key,
                &format!("{WAL_FILE} bytes {}..{}", s.start, s.end),
                (s.end - s.start, crc),
                o,
            )?;
        }
    }
    Ok(())
}

/// One file restored from one object: its length and CRC. A file that is not there is
/// refused when `required` (an `at` restore leaves out the WAL files past N).
fn whole(dir: &Path, rel: &Path, o: &ObjectEntry, required: bool) -> Result<(), String> {
    if !required && !dir.join(rel).exists() {
        return Ok(());
    }
    let (file, len) = open(dir, rel)?;
    let what = rel.display().to_string();
    if len != o.plain_len() {
        return compare(&o.key, &what, (len, 0), o);
    }
    let crc = crc_of(&file, 0, len).map_err(|e| format!("{what} of the drilled store: {e}"))?;
    compare(&o.key, &what, (len, crc), o)
}

/// The file at `rel` and its length.
fn open(dir: &Path, rel: &Path) -> Result<(std::fs::File, u64), String> {
    let io = |e: std::io::Error| format!("{} of the drilled store: {e}", rel.display());
    let file = std::fs::File::open(dir.join(rel)).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    Ok((file, len))
}

/// The CRC-32 of `len` bytes of `file` from `offset`, read a chunk at a time: a drill holds
/// no restored file in memory, whatever its size.
fn crc_of(file: &std::fs::File, mut offset: u64, len: u64) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHECK_CHUNK];
    let end = offset + len;
    while offset < end {
        let n = usize::try_from(end - offset).map_or(buf.len(), |n| n.min(buf.len()));
        file.read_exact_at(&mut buf[..n], offset)?;
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(hasher.finalize())
}

/// A restored file's (or range's) length and CRC against the entry; the CRC is not looked at
/// when the length differs.
fn compare(key: &str, what: &str, (len, crc): (u64, u32), o: &ObjectEntry) -> Result<(), String> {
    if len != o.plain_len() {
        return Err(format!(
            "{key}: restored as {what} of {len} bytes, the manifest says {}",
            o.plain_len()
        ));
    }
    // A sealed object's plain_crc is a keyed tag (at_rest/seal.rs), not a CRC: the restore
    // checked it with the generation's key, and authenticated every chunk.
    if !o.encrypted && crc != o.plain_crc() {
        return Err(format!(
            "{key}: restored as {what} with CRC {crc:08x}, the manifest says {:08x}",
            o.plain_crc()
        ));
    }
    Ok(())
}

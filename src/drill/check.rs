//! A drilled store against its manifest: the format's read-back, the commit seq, and every
//! file's plain length and CRC-32 (see the module docs of [`super`]). Reads only the restored
//! directory and the manifest; writes nothing.

use std::path::{Path, PathBuf};

use crate::bucket::Bucket;
use crate::manifest::{Manifest, ObjectEntry};
use crate::restore::{RestoreReport, read_back};
use crate::store::disk::{ARCHIVE_DIR, SNAPSHOT_FILE, WAL_FILE, archive_name};

/// `Err(why)`, naming the object or file, when the store at `dir` is not what the manifest of
/// `report` promises.
pub(super) async fn against_manifest(
    bucket: &dyn Bucket,
    dir: &Path,
    report: &RestoreReport,
    at: Option<u64>,
) -> Result<(), String> {
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
    tokio::task::spawn_blocking(move || files(&dir, &key, &manifest, expected, at.is_none()))
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
        let wal = read(dir, Path::new(WAL_FILE))?;
        let want = m.segments_end();
        if crate::units::u64_len(wal.len()) != want {
            return Err(format!(
                "{WAL_FILE} of the drilled store is {} bytes, the segments of {key} end at {want}",
                wal.len()
            ));
        }
        for s in &m.segments {
            let o = &s.object;
            let range = crate::units::usize_of(s.start)..crate::units::usize_of(s.end);
            let Some(bytes) = wal.get(range) else {
                return Err(format!(
                    "{}: its range {}..{} is past the end of {WAL_FILE}",
                    o.key, s.start, s.end
                ));
            };
            compare(
                &o.key,
                &format!("{WAL_FILE} bytes {}..{}", s.start, s.end),
                bytes,
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
    let bytes = read(dir, rel)?;
    compare(&o.key, &rel.display().to_string(), &bytes, o)
}

fn read(dir: &Path, rel: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(dir.join(rel)).map_err(|e| format!("{} of the drilled store: {e}", rel.display()))
}

fn compare(key: &str, what: &str, bytes: &[u8], o: &ObjectEntry) -> Result<(), String> {
    let len = crate::units::u64_len(bytes.len());
    if len != o.plain_len() {
        return Err(format!(
            "{key}: restored as {what} of {len} bytes, the manifest says {}",
            o.plain_len()
        ));
    }
    // A sealed object's plain_crc is a keyed tag (at_rest/seal.rs), not a CRC: the restore
    // checked it with the generation's key, and authenticated every chunk.
    let crc = crc32fast::hash(bytes);
    if !o.encrypted && crc != o.plain_crc() {
        return Err(format!(
            "{key}: restored as {what} with CRC {crc:08x}, the manifest says {:08x}",
            o.plain_crc()
        ));
    }
    Ok(())
}

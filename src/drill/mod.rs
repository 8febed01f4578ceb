//! Restore drills: proof that a backup restores, by restoring it (issue 14, part 2).
//!
//! [`drill`] restores a restore point — the newest one LATEST names (exactly it: no segments
//! past it), or with `at` the one the real restore chooses for commit N — into scratch space,
//! with **the real restore path** ([`crate::restore::restore`], the function `restore` and
//! `Adopt` use: every object's length and CRC checked on download, every file read back with
//! the format's reader, all-or-nothing rename). Then it checks the restored store against what
//! the manifest promises ([`check`]): the format's read-back again on the store as renamed
//! into place ([`crate::restore::read_back`]), its commit seq, and every file's length and
//! CRC-32 against the manifest's plain length and CRC (snapshot, archives, side files, and
//! each segment's bytes at its offsets of `wal.bin`). The manifest carries no digest of the
//! store's contents, so there is none to compare. The scratch is removed when the drill ends,
//! whatever its outcome.
//!
//! # Outcomes
//!
//! - [`DrillError::Input`]: nothing to drill — no restore point, or none reaching `at` — or a
//!   scratch directory that cannot be made. Not a drill's result: the caller answers it as an
//!   error and records nothing.
//! - `Ok(`[`Drilled`]`)` with `failure: None`: the restore point restores and is what its
//!   manifest says; with `failure: Some(why)`: it does not, `why` naming the object (the key)
//!   or the file that failed.
//!
//! # Scratch, and what a crash leaves
//!
//! Each drill restores into its own directory `<scratch root>/<label>-<uuid>/store` (the
//! restore's own temporary directory sits beside `store`, inside it). The scratch root and
//! each drill's directory are [`SCRATCH_MODE`] (`0700`, a wider root is narrowed) and the
//! restore writes its store `0700`/`0600` (`crate::restore::stage`): a drill of an encrypted
//! store writes plain bytes, which no other user may read, whatever the service's umask. The directory is removed
//! when the drill returns, fails, or its future is dropped ([`Scratch`]'s `Drop`). A crash
//! leaves the directory behind; [`clear_scratch`] removes every such directory of the scratch
//! root (and nothing else), and the service calls it when it starts, before any drill runs.
//!
//! # With `at`
//!
//! An `at` restore may cut `wal.bin` inside a segment or turn an archive into `wal.bin`: the
//! WAL files are then checked by the read-back (frame CRCs and the seq chain) and the commit
//! seq (which must be N) rather than against whole-object CRCs; snapshot, side files and the
//! archives kept as archives are still compared with the manifest.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::bucket::{Bucket, BucketError};
use crate::manifest::Manifest;
use crate::restore::{self, RestoreError, RestoreOptions};

mod check;

/// What a drill found.
#[derive(Debug, Clone, PartialEq)]
pub struct Drilled {
    /// `None`: the restore point restored and matched its manifest. `Some`: why not, naming
    /// the object or file.
    pub failure: Option<String>,
    /// The commit restored (the manifest's, or `at`). When the restore failed: the commit of
    /// the manifest LATEST names (without `at`), else 0.
    pub commit_seq: u64,
    /// The manifest drilled; when the restore failed, the one LATEST names (without `at`),
    /// else empty.
    pub manifest_key: String,
    /// How long the restore took (download, read-back, rename), measured.
    pub restore_time: Duration,
    /// Bytes of the objects restored (as stored).
    pub bytes: u64,
    /// The restore's own report (timings, prediction) when it restored, for calibration
    /// (`crate::restore::predict`).
    pub report: Option<crate::restore::RestoreReport>,
    /// What the restore moved, from the manifest the check read (`None` when it cannot be
    /// told from it alone).
    pub shape: Option<crate::restore::predict::Shape>,
}

/// How a drill restores: the keys, the rates its prediction is made at, and the counters a
/// caller watches it by (`crate::restore::progress`).
#[derive(Debug, Clone, Default)]
pub struct DrillOptions {
    pub keys: crate::restore::keys::RestoreKeys,
    pub rates: crate::restore::predict::Rates,
    pub tracker: crate::restore::progress::Progress,
}

/// Why there was nothing to drill.
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    /// No restore point, none reaching `at`, or the bucket cannot be read at all.
    #[error(transparent)]
    Input(RestoreError),
    /// The scratch directory cannot be made.
    #[error("drill scratch {}: {source}", path.display())]
    Scratch {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The newest restore point LATEST names, with the plain bytes of its objects (as its
/// manifest states them): what a scheduled drill would write into scratch, which is what the
/// budget bounds. A compressed store takes several times its stored bytes there. (`None`:
/// LATEST is missing or unreadable, or the manifest's lengths overflow: there is nothing to
/// drill by the budget's measure; the drill itself then says why.)
pub async fn newest_size(bucket: &dyn Bucket) -> Result<Option<(String, u64)>, BucketError> {
    Ok(newest(bucket).await?.map(|(key, _, bytes)| (key, bytes)))
}

/// The manifest LATEST names: its key, commit seq and plain bytes (`None`: none readable).
async fn newest(bucket: &dyn Bucket) -> Result<Option<(String, u64, u64)>, BucketError> {
    let Some(found) = crate::latest::read(bucket).await? else {
        return Ok(None);
    };
    let Ok(latest) = found.latest else {
        return Ok(None);
    };
    let manifest = match bucket.get(&latest.manifest).await {
        Ok(o) => o,
        Err(BucketError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Manifest::decode(&latest.manifest, &manifest.data)
        .ok()
        .and_then(|m| Some((m.commit_seq, m.total_plain_len()?)))
        .map(|(seq, bytes)| (latest.manifest, seq, bytes)))
}

/// Drills the restore point of `bucket` chosen by `at` (see the module docs), restoring under
/// `scratch_root` in a directory named after `label` (the store's id).
#[tracing::instrument(name = "drill", skip_all, fields(at = ?at))]
pub async fn drill(
    bucket: &dyn Bucket,
    scratch_root: &Path,
    label: &str,
    at: Option<u64>,
    how: DrillOptions,
) -> Result<Drilled, DrillError> {
    let scratch = Scratch::create(scratch_root, label)?;
    let target = scratch.path.join("store");
    let opts = RestoreOptions {
        at,
        // The restore point itself, exactly what its manifest promises.
        restore_point_only: at.is_none(),
        keys: how.keys,
        rates: how.rates,
        tracker: how.tracker,
        ..RestoreOptions::default()
    };
    let started = Instant::now();
    let restored = restore::restore(bucket, &target, &opts).await;
    let restore_time = started.elapsed();
    let report = match restored {
        Ok(r) => r,
        Err(
            e @ (RestoreError::NoRestorePoint { .. }
            | RestoreError::Unreachable { .. }
            | RestoreError::TargetNotEmpty { .. }
            | RestoreError::BadTarget { .. }),
        ) => return Err(DrillError::Input(e)),
        Err(e) => {
            // Which restore point failed, as far as LATEST says (a restore without `at`
            // chooses the one it names when it is readable).
            let (manifest_key, commit_seq) = match at {
                None => newest(bucket)
                    .await
                    .ok()
                    .flatten()
                    .map_or((String::new(), 0), |(key, seq, _)| (key, seq)),
                Some(_) => (String::new(), 0),
            };
            return Ok(Drilled {
                failure: Some(format!("the restore failed: {e}")),
                commit_seq,
                manifest_key,
                restore_time,
                bytes: 0,
                report: None,
                shape: None,
            });
        }
    };
    let (failure, shape) = match check::against_manifest(bucket, &target, &report, at).await {
        // The shape restored, when the manifest alone says it (not an `--at` drill that
        // read segments past it).
        Ok(m) => {
            let shape = crate::restore::predict::Shape::of_manifest(&m, &[], at.is_some());
            (
                None,
                (shape.objects == report.objects as u64).then_some(shape),
            )
        }
        Err(why) => (Some(why), None),
    };
    Ok(Drilled {
        shape,
        failure,
        commit_seq: report.commit_seq,
        manifest_key: report.manifest_key.clone(),
        restore_time,
        bytes: report.bytes,
        report: Some(report),
    })
}

/// Removes every drill's scratch under `scratch_root` (what a crash left): call it before any
/// drill runs. Only directories named as [`drill`] names them (`<label>-<uuid>`) go, so that
/// nothing else an operator put there (a store registered under the data directory, say) is
/// ever deleted; the others are left, with a warning. A missing root is fine.
pub fn clear_scratch(scratch_root: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(scratch_root) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(is_scratch_name);
        if ours && entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
            tracing::info!(path = %entry.path().display(), "removed a drill's scratch left by an earlier process");
        } else {
            tracing::warn!(path = %entry.path().display(), "not a drill's scratch: left in place");
        }
    }
    Ok(())
}

/// Whether `name` is one [`Scratch::create`] gives: `<label>-<uuid>`.
fn is_scratch_name(name: &str) -> bool {
    const UUID_LEN: usize = 36;
    name.len() > UUID_LEN
        && name.is_char_boundary(name.len() - UUID_LEN)
        && name[..name.len() - UUID_LEN].ends_with('-')
        && Uuid::parse_str(&name[name.len() - UUID_LEN..]).is_ok()
}

/// The mode of the scratch root and of each drill's directory in it: the service's user
/// alone, whatever the umask (a drill writes a decrypted store there).
pub const SCRATCH_MODE: u32 = 0o700;

/// One drill's scratch directory, removed on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn create(root: &Path, label: &str) -> Result<Scratch, DrillError> {
        // Only the id's safe characters go into the name: the label is a store id, but a
        // directory name is no place to trust that.
        let safe: String = label
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .take(64)
            .collect();
        let path = root.join(format!("{safe}-{}", Uuid::new_v4()));
        let scratch_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DrillError::Scratch { path, source }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(SCRATCH_MODE)
            .create(root)
            .map_err(scratch_error(root))?;
        // A root an earlier version made wider is narrowed: it is the service's own.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(SCRATCH_MODE))
            .map_err(scratch_error(root))?;
        std::fs::DirBuilder::new()
            .mode(SCRATCH_MODE)
            .create(&path)
            .map_err(scratch_error(&path))?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a drill's scratch; the next start removes it");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_scratch_names_are_cleared() {
        let root = tempfile::tempdir().unwrap();
        let ours = root
            .path()
            .join("0b9c2a4e-0000-4000-8000-000000000001-6f1e0c8e-5b7a-4d0e-9a43-2f1c7d9e8b10");
        std::fs::create_dir_all(ours.join("store")).unwrap();
        let theirs = root.path().join("someones-store");
        std::fs::create_dir_all(&theirs).unwrap();
        super::clear_scratch(root.path()).unwrap();
        assert!(!ours.exists());
        assert!(theirs.exists());
        super::clear_scratch(&root.path().join("missing")).unwrap();
        assert!(!super::is_scratch_name("x-not-a-uuid"));
        assert!(!super::is_scratch_name(
            "6f1e0c8e-5b7a-4d0e-9a43-2f1c7d9e8b10"
        ));
    }
}

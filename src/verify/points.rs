//! `ls`: the restore points of a prefix, in key order, and how they read.

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use super::{LIST_PARALLELISM, VerifyError, bucket_err, load_manifests};
use crate::bucket::Bucket;
use crate::manifest::parse_manifest_key;

/// One restore point as `ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestorePointInfo {
    pub key: String,
    /// From the manifest, or from its key when it does not parse.
    pub commit_seq: Option<u64>,
    pub lineage: Option<Uuid>,
    pub generation: Option<u64>,
    pub created_at: Option<String>,
    /// Bytes of the objects the manifest names.
    pub bytes: Option<u64>,
    /// LATEST names it.
    pub is_latest: bool,
    /// Why the manifest is not valid, when it is not.
    pub error: Option<String>,
}

impl fmt::Display for RestorePointInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        if let Some(c) = self.commit_seq {
            write!(f, "  commit {c}")?;
        }
        if let Some(e) = &self.error {
            return write!(f, "  INVALID: {e}");
        }
        if let Some(g) = self.generation {
            write!(f, "  generation {g}")?;
        }
        if let Some(l) = self.lineage {
            write!(f, "  lineage {l}")?;
        }
        if let Some(t) = &self.created_at {
            write!(f, "  {t}")?;
        }
        if let Some(b) = self.bytes {
            write!(f, "  {b} bytes")?;
        }
        if self.is_latest {
            write!(f, "  (LATEST)")?;
        }
        Ok(())
    }
}

/// One line per restore point, for `ls` without `--json`.
pub fn restore_points_text(points: &[RestorePointInfo]) -> String {
    if points.is_empty() {
        return "no restore points yet\n".to_string();
    }
    points.iter().map(|p| format!("{p}\n")).collect()
}

/// Every key under `manifests/`, in key order, with what its manifest says (or why it is not
/// valid). Reads the manifests and LATEST only, none of the objects they name.
pub async fn list_restore_points(
    bucket: &dyn Bucket,
) -> Result<Vec<RestorePointInfo>, VerifyError> {
    let latest = match crate::latest::read(bucket).await {
        Ok(found) => found.and_then(|f| f.latest.ok()).map(|l| l.manifest),
        Err(e) => return Err(bucket_err(bucket)(e)),
    };
    Ok(load_manifests(bucket, LIST_PARALLELISM)
        .await?
        .into_iter()
        .map(|(key, m)| {
            let is_latest = latest.as_deref() == Some(key.as_str());
            match m {
                Ok(m) => RestorePointInfo {
                    commit_seq: Some(m.commit_seq),
                    lineage: Some(m.lineage),
                    generation: Some(m.generation),
                    created_at: Some(m.created_at.clone()),
                    bytes: m.total_len(),
                    is_latest,
                    error: None,
                    key,
                },
                Err(e) => RestorePointInfo {
                    commit_seq: parse_manifest_key(&key),
                    lineage: None,
                    generation: None,
                    created_at: None,
                    bytes: None,
                    is_latest,
                    error: Some(e),
                    key,
                },
            }
        })
        .collect())
}

//! The disk a restore writes to, checked before anything is downloaded: a plan whose
//! entries claim more plain bytes than the target's file system has free is refused, naming
//! the object that claims the most (security review 4, finding 6: a decompression bomb may
//! claim 32,768 times its stored size, and was written until its CRC failed).

use super::stage::{Layout, Target};

/// Why `target`'s file system cannot take what `layout` writes, if it cannot. `None` when it
/// can, or when its free space cannot be read (the writes then fail as they would). `kept`:
/// bytes an interrupted run of the same restore left in place already.
pub(crate) fn space_problem(target: &Target, layout: &Layout, kept: u64) -> Option<String> {
    let needed = layout
        .claims()
        .fold(0u64, |sum, (_, plain)| sum.saturating_add(plain))
        .saturating_sub(kept);
    let v = rustix::fs::statvfs(&target.parent).ok()?;
    let free = v.f_bavail.saturating_mul(v.f_frsize);
    (needed > free).then(|| {
        let (key, claim) = layout
            .claims()
            .max_by_key(|(_, plain)| *plain)
            .unwrap_or(("?", 0));
        format!(
            "the restore writes up to {needed} bytes (the plain bytes its plan's objects state; \
             the most, {claim}, by {key}) and {} has {free} bytes free: refused before \
             downloading",
            target.parent.display()
        )
    })
}

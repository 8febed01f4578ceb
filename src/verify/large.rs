//! Verify's checks of an encoded object whose plain bytes are more than
//! [`super::PLAIN_IN_MEMORY`]: decoded into an unnamed temporary file (`tempfile::tempfile`,
//! `O_TMPFILE` in `TMPDIR`: nothing is left by a crash), then read back a chunk at a time by
//! the format's streaming readers ([`check_snapshot`], [`check_wal`]), which answer exactly
//! what the in-memory readers do. Memory holds a chunk, never the plain bytes; the file holds
//! at most the entry's plain length (the decoder refuses more, and refuses a plain length its
//! stored bytes cannot decode to). A segment read as frames only (role `Frames`) that large is
//! not parsed: no writer ships one (`at_rest::bounds::SEGMENT_MAX`), which `check_manifest`
//! reports naming it.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Seek, Write};

use super::{Facts, Role, WalFacts};
use crate::at_rest::decode::Decoder;
use crate::at_rest::seal::GenerationKey;
use crate::manifest::ObjectEntry;
use crate::store::format::{CHECK_CHUNK, check_snapshot, check_wal};

/// `facts` (stored length and CRC filled in) completed from the plain bytes of `stored`, which
/// `probe` describes.
pub(super) fn facts(
    mut facts: Facts,
    stored: &[u8],
    roles: &BTreeSet<Role>,
    probe: &ObjectEntry,
    key: Option<&GenerationKey>,
) -> Facts {
    let mut file = match decode_to_file(probe, key, stored) {
        Ok((file, len, crc)) => {
            let check = key.map_or(crc, |k| k.plain_tag(len, crc));
            facts.plain = Some(Ok((len, check)));
            file
        }
        Err(why) => {
            facts.plain = Some(Err(why));
            return facts;
        }
    };
    let io = |e: std::io::Error| format!("{}: reading its decoded bytes back: {e}", probe.key);
    for role in roles {
        if let Err(e) = file.rewind() {
            facts.plain = Some(Err(io(e)));
            return facts;
        }
        match role {
            Role::Snapshot => {
                facts.snapshot =
                    Some(check_snapshot(&file, CHECK_CHUNK).map_err(|e| e.to_string()));
            }
            Role::Wal => {
                facts.wal = Some(
                    check_wal(&file, CHECK_CHUNK, &mut Vec::new())
                        .map(|c| WalFacts {
                            header: c.header,
                            frames: c.frames,
                            stop: c.stop.map(|why| format!("{why} at byte {}", c.valid_len)),
                        })
                        .map_err(|e| e.to_string()),
                );
            }
            Role::Frames | Role::Opaque => {}
        }
    }
    facts
}

/// Decodes `stored` into a new unnamed temporary file: the file, and the plain length and
/// CRC (checked against `probe` by the decoder), or why not (naming the object).
fn decode_to_file(
    probe: &ObjectEntry,
    key: Option<&GenerationKey>,
    stored: &[u8],
) -> Result<(File, u64, u32), String> {
    let file = tempfile::tempfile()
        .map_err(|e| format!("{}: no temporary file to decode into: {e}", probe.key))?;
    let out = std::io::BufWriter::with_capacity(CHECK_CHUNK, &file);
    let mut d = Decoder::new(probe, key, out).map_err(|e| e.to_string())?;
    d.write_stored(stored).map_err(|e| e.to_string())?;
    let (mut out, decoded) = d.finish().map_err(|e| e.to_string())?;
    out.flush()
        .map_err(|e| format!("{}: writing its decoded bytes: {e}", probe.key))?;
    drop(out);
    Ok((file, decoded.plain.len, decoded.plain.crc))
}

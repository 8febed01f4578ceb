//! The checks of one verify: LATEST against the manifest it names, and each manifest against
//! what the bucket holds for every object it names (`facts_of`).

#[allow(unused_imports)]
use super::*;

/// LATEST must name a manifest that verifies, with its commit_seq and lineage.
pub(super) async fn check_latest(
    bucket: &dyn Bucket,
    checks: &[ManifestCheck],
) -> Result<Option<LatestCheck>, VerifyError> {
    let found = match crate::latest::read(bucket).await {
        Ok(Some(found)) => found,
        Ok(None) => return Ok(None),
        Err(e) => return Err(bucket_err(bucket)(e)),
    };
    let latest = match found.latest {
        Ok(l) => l,
        Err(e) => {
            return Ok(Some(LatestCheck {
                manifest: None,
                commit_seq: None,
                ok: false,
                problems: vec![e.to_string()],
            }));
        }
    };
    let mut problems = Vec::new();
    match checks.iter().find(|c| c.key == latest.manifest) {
        None => problems.push(format!("names {}, which does not exist", latest.manifest)),
        Some(c) if !c.ok => {
            problems.push(format!("names {}, which does not verify", latest.manifest))
        }
        Some(c) => {
            if c.commit_seq != Some(latest.commit_seq) || c.lineage != Some(latest.lineage) {
                problems.push(format!(
                    "says commit {} of lineage {}; the manifest holds commit {} of lineage {}",
                    latest.commit_seq,
                    latest.lineage,
                    c.commit_seq.unwrap_or_default(),
                    c.lineage.unwrap_or_default()
                ));
            }
        }
    }
    Ok(Some(LatestCheck {
        manifest: Some(latest.manifest),
        commit_seq: Some(latest.commit_seq),
        ok: problems.is_empty(),
        problems,
    }))
}

/// Every problem of one decoded manifest, given the facts of the objects it names.
pub(super) fn check_manifest(m: &Manifest, facts: &HashMap<String, Fetched>) -> Vec<String> {
    let mut problems = Vec::new();
    // The facts of an object whose length and CRC are as stated (else the problems, and None:
    // parsing bytes known to be wrong would only add noise).
    let object = |e: &ObjectEntry, problems: &mut Vec<String>| -> Option<Facts> {
        let key = &e.key;
        if parse_generation(key) != Some(e.generation) {
            problems.push(format!(
                "{key}: the entry says generation {}, the key does not",
                e.generation
            ));
        }
        match facts.get(key) {
            None | Some(Fetched::Missing) => {
                problems.push(format!("{key}: missing"));
                None
            }
            Some(Fetched::Unreadable(why)) => {
                problems.push(format!("{key}: cannot be read: {why}"));
                None
            }
            Some(Fetched::Got(f)) => {
                if f.len != e.len {
                    problems.push(format!(
                        "{key}: {} bytes, the manifest says {}",
                        f.len, e.len
                    ));
                    None
                } else if f.crc != e.crc {
                    problems.push(format!(
                        "{key}: CRC mismatch (expected {:08x}, got {:08x})",
                        e.crc, f.crc
                    ));
                    None
                } else {
                    // Decoded unless encrypted and read without its key.
                    let decoded = e.is_encoded() && !(e.encrypted && f.plain.is_none());
                    match (&f.plain, decoded) {
                        (None, false) => Some(f.clone()),
                        (Some(Ok((len, crc))), true)
                            if *len == e.plain_len() && *crc == e.plain_crc() =>
                        {
                            Some(f.clone())
                        }
                        (Some(Ok((len, crc))), true) => {
                            problems.push(format!(
                                "{key}: decodes to {len} bytes with CRC {crc:08x}, the manifest \
                                 says {} bytes with CRC {:08x}",
                                e.plain_len(),
                                e.plain_crc()
                            ));
                            None
                        }
                        (Some(Err(why)), _) => {
                            problems.push(why.clone());
                            None
                        }
                        _ => {
                            problems.push(format!(
                                "{key}: manifests disagree on how the object is encoded"
                            ));
                            None
                        }
                    }
                }
            }
        }
    };

    if let Some(s) = &m.snapshot
        && let Some(f) = object(&s.object, &mut problems)
    {
        let key = &s.object.key;
        match f.snapshot {
            Some(Ok(h)) => {
                if h.snapshot_id != s.snapshot_id {
                    problems.push(format!(
                        "{key}: snapshot {}, the manifest says {}",
                        h.snapshot_id, s.snapshot_id
                    ));
                }
                if h.commit_seq != s.commit_seq {
                    problems.push(format!(
                        "{key}: holds {} commits, the manifest says {}",
                        h.commit_seq, s.commit_seq
                    ));
                }
            }
            Some(Err(e)) => problems.push(format!("{key}: {e}")),
            None => {}
        }
    }

    // WAL files: archives, then wal.bin rebuilt from segments; floors chain.
    let mut floor = m.wal_floor;
    let check_wal = |key: &str,
                     w: &Result<WalFacts, String>,
                     number: u64,
                     floor: u64,
                     frames: u64,
                     problems: &mut Vec<String>| {
        match w {
            Err(e) => problems.push(format!("{key}: {e}")),
            Ok(w) => {
                if w.header.number != number {
                    problems.push(format!(
                        "{key}: WAL number {}, expected {number}",
                        w.header.number
                    ));
                }
                if w.header.floor != floor {
                    problems.push(format!(
                        "{key}: floor {}, expected {floor} (floors must chain)",
                        w.header.floor
                    ));
                }
                if w.frames != frames {
                    problems.push(format!(
                        "{key}: {} valid frames, the manifest says {frames}",
                        w.frames
                    ));
                }
            }
        }
    };
    for a in &m.archives {
        if let Some(Facts { wal: Some(w), .. }) = object(&a.object, &mut problems) {
            check_wal(&a.object.key, &w, a.number, floor, a.frames, &mut problems);
        }
        floor += a.frames;
    }
    let mut seq = floor;
    for s in &m.segments {
        let key = &s.object.key;
        if let Some(p) = crate::at_rest::bounds::segment_len_problem(s.end - s.start) {
            problems.push(format!("{key}: {p}"));
        }
        let Some(f) = object(&s.object, &mut problems) else {
            seq += s.frames;
            continue;
        };
        if s.start == 0 {
            if let Some(w) = &f.wal {
                check_wal(key, w, m.wal_number, floor, s.frames, &mut problems);
                if let Ok(w) = w {
                    if w.header.wal_id != m.wal_id {
                        problems.push(format!(
                            "{key}: WAL id {}, the manifest's wal.bin is {}",
                            w.header.wal_id, m.wal_id
                        ));
                    }
                    if let Some(stop) = &w.stop {
                        problems.push(format!("{key}: {stop}: wal.bin does not parse whole"));
                    }
                }
            }
        } else if let Some(fr) = &f.frames {
            if let Some(stop) = &fr.stop {
                problems.push(format!("{key}: {stop}: wal.bin does not parse whole"));
            }
            if fr.frames > 0 && fr.first_seq != Some(seq + 1) {
                problems.push(format!(
                    "{key}: starts at commit {}, expected {}",
                    fr.first_seq.unwrap_or_default(),
                    seq + 1
                ));
            } else if fr.frames != s.frames {
                problems.push(format!(
                    "{key}: {} valid frames, the manifest says {}",
                    fr.frames, s.frames
                ));
            }
        }
        seq += s.frames;
    }

    for side in &m.side_files {
        if let Some(p) = side_file_name_problem(&side.name) {
            problems.push(format!("{}: {p}", side.object.key));
        }
        object(&side.object, &mut problems);
    }
    problems
}

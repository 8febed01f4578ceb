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
    let mut check = ManifestProblems {
        facts,
        problems: Vec::new(),
    };
    if let Some(s) = &m.snapshot {
        check.snapshot(s);
    }
    // WAL files: archives, then wal.bin rebuilt from segments; floors chain.
    let floor = check.archives(m);
    check.segments(m, floor);
    for side in &m.side_files {
        if let Some(p) = side_file_name_problem(&side.name) {
            check.problems.push(format!("{}: {p}", side.object.key));
        }
        check.object(&side.object);
    }
    check.problems
}

/// The problems found so far in one manifest, and the facts of the objects it names.
struct ManifestProblems<'a> {
    facts: &'a HashMap<String, Fetched>,
    problems: Vec<String>,
}

impl ManifestProblems<'_> {
    /// The facts of an object whose length and CRC are as stated (else the problems, and None:
    /// parsing bytes known to be wrong would only add noise).
    fn object(&mut self, e: &ObjectEntry) -> Option<Facts> {
        let key = &e.key;
        if parse_generation(key) != Some(e.generation) {
            self.problems.push(format!(
                "{key}: the entry says generation {}, the key does not",
                e.generation
            ));
        }
        let f = match self.facts.get(key) {
            None | Some(Fetched::Missing) => {
                self.problems.push(format!("{key}: missing"));
                return None;
            }
            Some(Fetched::Unreadable(why)) => {
                self.problems.push(format!("{key}: cannot be read: {why}"));
                return None;
            }
            Some(Fetched::Got(f)) => f,
        };
        if f.len != e.len {
            self.problems.push(format!(
                "{key}: {} bytes, the manifest says {}",
                f.len, e.len
            ));
            None
        } else if f.crc != e.crc {
            self.problems.push(format!(
                "{key}: CRC mismatch (expected {:08x}, got {:08x})",
                e.crc, f.crc
            ));
            None
        } else {
            self.decoded(e, f)
        }
    }

    /// The facts of a stored object whose length and CRC are right, when its decoded bytes
    /// are as the entry states too (decoded unless encrypted and read without its key).
    fn decoded(&mut self, e: &ObjectEntry, f: &Facts) -> Option<Facts> {
        let key = &e.key;
        let decoded = e.is_encoded() && !(e.encrypted && f.plain.is_none());
        match (&f.plain, decoded) {
            (None, false) => Some(f.clone()),
            (Some(Ok((len, crc))), true) if *len == e.plain_len() && *crc == e.plain_crc() => {
                Some(f.clone())
            }
            (Some(Ok((len, crc))), true) => {
                self.problems.push(format!(
                    "{key}: decodes to {len} bytes with CRC {crc:08x}, the manifest \
                     says {} bytes with CRC {:08x}",
                    e.plain_len(),
                    e.plain_crc()
                ));
                None
            }
            (Some(Err(why)), _) => {
                self.problems.push(why.clone());
                None
            }
            _ => {
                self.problems.push(format!(
                    "{key}: manifests disagree on how the object is encoded"
                ));
                None
            }
        }
    }

    /// The snapshot object, and the id and commit count its header carries.
    fn snapshot(&mut self, s: &crate::manifest::SnapshotEntry) {
        let Some(f) = self.object(&s.object) else {
            return;
        };
        let key = &s.object.key;
        match f.snapshot {
            Some(Ok(h)) => {
                if h.snapshot_id != s.snapshot_id {
                    self.problems.push(format!(
                        "{key}: snapshot {}, the manifest says {}",
                        h.snapshot_id, s.snapshot_id
                    ));
                }
                if h.commit_seq != s.commit_seq {
                    self.problems.push(format!(
                        "{key}: holds {} commits, the manifest says {}",
                        h.commit_seq, s.commit_seq
                    ));
                }
            }
            Some(Err(e)) => self.problems.push(format!("{key}: {e}")),
            None => {}
        }
    }

    /// One WAL file's header and frames: its number, a floor that chains, the frames stated.
    fn wal(
        &mut self,
        key: &str,
        w: &Result<WalFacts, String>,
        number: u64,
        floor: u64,
        frames: u64,
    ) {
        let w = match w {
            Err(e) => {
                self.problems.push(format!("{key}: {e}"));
                return;
            }
            Ok(w) => w,
        };
        if w.header.number != number {
            self.problems.push(format!(
                "{key}: WAL number {}, expected {number}",
                w.header.number
            ));
        }
        if w.header.floor != floor {
            self.problems.push(format!(
                "{key}: floor {}, expected {floor} (floors must chain)",
                w.header.floor
            ));
        }
        if w.frames != frames {
            self.problems.push(format!(
                "{key}: {} valid frames, the manifest says {frames}",
                w.frames
            ));
        }
    }

    /// The archives in order, each floor chaining from the one before; returns the floor
    /// wal.bin must start at.
    fn archives(&mut self, m: &Manifest) -> u64 {
        let mut floor = m.wal_floor;
        for a in &m.archives {
            if let Some(Facts { wal: Some(w), .. }) = self.object(&a.object) {
                self.wal(&a.object.key, &w, a.number, floor, a.frames);
            }
            floor += a.frames;
        }
        floor
    }

    /// The segments wal.bin is rebuilt from: the first holds its header (at `floor`), each
    /// later one continues the commits where the one before stopped.
    fn segments(&mut self, m: &Manifest, floor: u64) {
        let mut seq = floor;
        for s in &m.segments {
            let key = &s.object.key;
            if let Some(p) = crate::at_rest::bounds::segment_len_problem(s.end - s.start) {
                self.problems.push(format!("{key}: {p}"));
            }
            if let Some(f) = self.object(&s.object) {
                if s.start == 0 {
                    if let Some(w) = &f.wal {
                        self.first_segment(m, key, w, floor, s.frames);
                    }
                } else if let Some(fr) = &f.frames {
                    self.later_segment(key, fr, seq, s.frames);
                }
            }
            seq += s.frames;
        }
    }

    /// The segment at offset 0: wal.bin's header (number, floor, id) and whole frames.
    fn first_segment(
        &mut self,
        m: &Manifest,
        key: &str,
        w: &Result<WalFacts, String>,
        floor: u64,
        frames: u64,
    ) {
        self.wal(key, w, m.wal_number, floor, frames);
        if let Ok(w) = w {
            if w.header.wal_id != m.wal_id {
                self.problems.push(format!(
                    "{key}: WAL id {}, the manifest's wal.bin is {}",
                    w.header.wal_id, m.wal_id
                ));
            }
            if let Some(stop) = &w.stop {
                self.problems
                    .push(format!("{key}: {stop}: wal.bin does not parse whole"));
            }
        }
    }

    /// A later segment: whole frames, the first one commit `seq + 1`, as many as stated.
    fn later_segment(&mut self, key: &str, fr: &FrameFacts, seq: u64, frames: u64) {
        if let Some(stop) = &fr.stop {
            self.problems
                .push(format!("{key}: {stop}: wal.bin does not parse whole"));
        }
        if fr.frames > 0 && fr.first_seq != Some(seq + 1) {
            self.problems.push(format!(
                "{key}: starts at commit {}, expected {}",
                fr.first_seq.unwrap_or_default(),
                seq + 1
            ));
        } else if fr.frames != frames {
            self.problems.push(format!(
                "{key}: {} valid frames, the manifest says {}",
                fr.frames, frames
            ));
        }
    }
}

//! Generators of the store's and the bucket's encodings, shared by the property tests
//! (`format_props`, `manifest_props`, `fuzz_decoders`), and [`Trickle`], which feeds one to a
//! reading decoder a few bytes at a time: each includes this file with
//! `#[path = "support/generators.rs"] mod generators;`. Each test binary uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use mushroom_backup::manifest::{FORMAT, Manifest, ObjectEntry, SegmentEntry, segment_key};
use mushroom_backup::store::engine::codec::Op;
use mushroom_backup::store::format::{WalHeader, encode_frame};
use proptest::prelude::*;
use uuid::Uuid;

pub fn uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

/// Any u64, often one at or next to the edges where arithmetic overflows.
pub fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        (0u64..70).prop_map(|d| u64::MAX - d),
        any::<u64>(),
    ]
}

/// Frame payloads of a WAL file.
pub fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 0..8)
}

/// A valid WAL file and the end offset of each of its frames.
pub fn wal_file(id: Uuid, number: u64, floor: u64, payloads: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
    let mut file = WalHeader {
        wal_id: id,
        number,
        floor,
    }
    .encode()
    .to_vec();
    let mut ends = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        encode_frame(floor + 1 + i as u64, p, &mut file);
        ends.push(file.len());
    }
    (file, ends)
}

/// One operation of the reference engine's commit payload.
pub fn op() -> impl Strategy<Value = Op> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..16);
    prop_oneof![
        (bytes(), bytes()).prop_map(|(key, value)| Op::Put { key, value }),
        bytes().prop_map(|key| Op::Delete { key }),
    ]
}

/// The reference engine's map (a snapshot's payload).
pub fn map() -> impl Strategy<Value = BTreeMap<Vec<u8>, Vec<u8>>> {
    prop::collection::btree_map(
        prop::collection::vec(any::<u8>(), 0..12),
        prop::collection::vec(any::<u8>(), 0..24),
        0..12,
    )
}

/// A valid manifest of one generation with no snapshot: one segment per entry of `frames`
/// (its frame count), contiguous, and `commit_seq` their sum.
pub fn manifest(frames: Vec<u64>) -> Manifest {
    let lineage = Uuid::from_u128(7);
    let mut end = 0;
    let segments = frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let start = end;
            end += 48 + 10 * i as u64;
            SegmentEntry {
                object: ObjectEntry {
                    key: segment_key(1, start, end),
                    len: end - start,
                    crc: i as u32,
                    lineage,
                    generation: 1,
                    ..Default::default()
                },
                start,
                end,
                frames: *f,
            }
        })
        .collect();
    let mut m = Manifest {
        format: FORMAT,
        lineage,
        generation: 1,
        commit_seq: 0,
        created_at: "2026-12-01T00:00:00Z".into(),
        wal_floor: 0,
        wal_id: Uuid::from_u128(9),
        wal_number: 1,
        snapshot: None,
        archives: vec![],
        segments,
        side_files: vec![],
        parent: None,
        branch: None,
        branched_from: None,
    };
    m.commit_seq = m.computed_commit_seq().unwrap();
    m
}

/// A reader that hands out at most `.1` bytes of `.0` at a time, as a pipe or a slow disk may.
pub struct Trickle<'a>(pub &'a [u8], pub usize);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.0.len()).min(self.1);
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

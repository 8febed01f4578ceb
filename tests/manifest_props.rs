//! Property tests of the restore-point decoders on bad input: arbitrary bytes, and valid
//! manifests, LATEST and GENERATION claims with bytes flipped, cut or spliced, never panic;
//! valid encodings round-trip; a manifest whose entries do not add up is refused.

#[path = "support/generators.rs"]
mod generators;

use generators::manifest;
use mushroom_backup::manifest::{Codec, GenerationClaim, Latest, Manifest, manifest_key};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Manifest::decode("manifests/00000000000000000001.json", &bytes);
        let _ = Latest::decode(&bytes);
        let _ = GenerationClaim::decode("gen/0000000001/GENERATION", &bytes);
    }

    #[test]
    fn valid_manifests_round_trip(frames in proptest::collection::vec(0u64..1_000_000, 1..20)) {
        let m = manifest(frames);
        prop_assert_eq!(Manifest::decode(&m.key(), &m.encode()).unwrap(), m);
    }

    #[test]
    fn mutated_manifests_never_panic_and_never_lie(
        frames in proptest::collection::vec(0u64..1000, 1..8),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let m = manifest(frames);
        let mut bytes = m.encode();
        let i = at.index(bytes.len());
        bytes[i] = byte;
        if let Ok(d) = Manifest::decode(&m.key(), &bytes) {
            // Whatever decodes still adds up: commit_seq is what its entries say.
            prop_assert_eq!(d.computed_commit_seq(), Some(d.commit_seq));
        }
        let n = cut.index(bytes.len());
        let _ = Manifest::decode(&m.key(), &bytes[..n]);
    }

    #[test]
    fn a_commit_seq_that_does_not_add_up_is_refused(frames in proptest::collection::vec(0u64..1000, 1..8), off in 1u64..1000) {
        let mut m = manifest(frames);
        m.commit_seq += off;
        prop_assert!(Manifest::decode(&manifest_key(m.commit_seq), &m.encode()).is_err());
    }

    #[test]
    fn mixed_codecs_round_trip_and_raw_entries_carry_no_codec_fields(
        frames in proptest::collection::vec(0u64..1000, 1..8),
        zstd in proptest::collection::vec(any::<bool>(), 8),
        stored in proptest::collection::vec(1u64..1000, 8),
    ) {
        let raw = manifest(frames);
        let json = String::from_utf8(raw.encode()).unwrap();
        prop_assert!(!json.contains("codec") && !json.contains("plain_len"));
        let mut m = raw.clone();
        for (i, s) in m.segments.iter_mut().enumerate() {
            if zstd[i % 8] {
                let o = &mut s.object;
                o.plain_len = Some(o.len);
                o.plain_crc = Some(o.crc);
                o.codec = Codec::Zstd;
                o.len = stored[i % 8];
                o.crc ^= 1;
            }
        }
        // Contiguity is judged on plain lengths, so a stored length that differs is fine.
        let back = Manifest::decode(&m.key(), &m.encode()).unwrap();
        prop_assert_eq!(back.total_plain_len(), raw.total_len());
        prop_assert_eq!(back, m.clone());
        // An encoded entry that loses its plain length is refused, never read as raw.
        if let Some(s) = m.segments.iter_mut().find(|s| s.object.codec == Codec::Zstd) {
            s.object.plain_len = None;
            prop_assert!(Manifest::decode(&m.key(), &m.encode()).is_err());
        }
    }
}

//! The lineage decision: may this store back up to this prefix, and as which lineage?
//!
//! A prefix holds the backups of one store lineage. The first backup of a store gives it a
//! random lineage id (`backup.lineage`, a side file, so a store restored from the prefix
//! carries it on). The worker refuses the prefix — uploads nothing, deletes nothing, reports
//! the reason — when its newest restore point is another lineage's, when the store has no
//! lineage but the prefix has restore points, or when the store holds fewer commits than that
//! restore point (it was restored from an older backup, or rewound).
//!
//! One exception: a store restored on boot has a lineage of its own and a parent record
//! (`backup.parent`) naming the lineage and manifest it came from. While LATEST names exactly
//! that manifest, the store adopts the prefix. Once LATEST has moved on, the parent record no
//! longer matches and the store is refused like any other lineage.
//!
//! A promotion (`mushroom-backup promote`, `standby::promote`) claims that restore point for
//! the promoted store before it has one of its own: LATEST keeps naming the parent's manifest
//! and gains `adopted_by`, the promoted store's lineage. From then on every other store is
//! refused here, the old primary (whose lineage the restore point is) first: only the
//! adopter named proceeds. (DESIGN.md section 5 knows no such claim: a promoted store would
//! otherwise leave the old primary free to write until its own first restore point.)
//!
//! This module is a pure function of what the store and the prefix hold, so every case is a
//! unit test. It is also the rule a failover claimant applies before it takes a store over
//! (`service::failover::sees`), against the restore point LATEST names
//! ([`NewestRestorePoint::named_by`]): a store the new worker would refuse is not claimed.

use uuid::Uuid;

use crate::manifest::{Latest, Manifest, ParentRef};
use crate::store::format::ParentRecord;

/// What the worker may do with the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Back up as `lineage`; `write_lineage` when the store has no `backup.lineage` yet.
    Proceed {
        lineage: Uuid,
        write_lineage: bool,
        parent: Option<ParentRef>,
    },
    /// Touch nothing; the reason is for the operator.
    Refuse(String),
}

/// What the prefix's newest restore point is: what the rule needs of its manifest.
pub struct NewestRestorePoint<'a> {
    pub key: &'a str,
    /// Its manifest's lineage.
    pub lineage: Uuid,
    /// Its manifest's commit count.
    pub commit_seq: u64,
    /// What LATEST holds, when it exists.
    pub latest: Option<&'a Latest>,
}

impl<'a> NewestRestorePoint<'a> {
    /// The restore point of manifest `m`, stored at `key`.
    pub fn of(key: &'a str, m: &Manifest, latest: Option<&'a Latest>) -> Self {
        NewestRestorePoint {
            key,
            lineage: m.lineage,
            commit_seq: m.commit_seq,
            latest,
        }
    }

    /// The restore point LATEST names, from LATEST alone (it holds the lineage and commit
    /// count of the manifest it names), with no read of the manifest.
    pub fn named_by(latest: &'a Latest) -> Self {
        NewestRestorePoint {
            key: &latest.manifest,
            lineage: latest.lineage,
            commit_seq: latest.commit_seq,
            latest: Some(latest),
        }
    }
}

/// Decides, from the store's lineage and parent record, its durable commit count and the
/// prefix's newest restore point.
pub fn decide(
    store_lineage: Option<Uuid>,
    parent: Option<&ParentRecord>,
    store_commit_seq: u64,
    newest: Option<NewestRestorePoint<'_>>,
    new_lineage: impl FnOnce() -> Uuid,
) -> Decision {
    let Some(newest) = newest else {
        return match store_lineage {
            Some(lineage) => Decision::Proceed {
                lineage,
                write_lineage: false,
                parent: None,
            },
            None => Decision::Proceed {
                lineage: new_lineage(),
                write_lineage: true,
                parent: None,
            },
        };
    };
    let m = &newest;
    let Some(lineage) = store_lineage else {
        return Decision::Refuse(format!(
            "the store has no backup.lineage but the prefix has restore points \
             (newest {} of lineage {}, {} commits): it is another store's prefix",
            newest.key, m.lineage, m.commit_seq
        ));
    };
    if let Some(adopter) = newest.latest.and_then(|l| l.adopted_by)
        && adopter != lineage
    {
        return Decision::Refuse(format!(
            "the prefix was promoted: LATEST gives its restore point {} (lineage {}) to lineage \
             {adopter}, not this store's {lineage}; this store no longer writes it (back it up \
             to a new prefix)",
            newest.key, m.lineage
        ));
    }
    if lineage == m.lineage {
        if store_commit_seq < m.commit_seq {
            return Decision::Refuse(format!(
                "the store holds fewer commits than the newest restore point ({store_commit_seq} < {} in {}): \
                 it was restored from an older backup or rewound; back it up to a new prefix",
                m.commit_seq, newest.key
            ));
        }
        return Decision::Proceed {
            lineage,
            write_lineage: false,
            parent: None,
        };
    }
    if let Some(p) = parent {
        // No LATEST at all, with the parent the newest manifest listed, is the parent too: a
        // branch whose LATEST a crash never wrote (`crate::branch`). Anyone who moved on would
        // have left a newer manifest.
        let latest_names_parent = newest
            .latest
            .is_none_or(|l| l.manifest == p.manifest && l.lineage == p.lineage);
        if p.lineage == m.lineage && p.manifest == newest.key && latest_names_parent {
            if store_commit_seq < m.commit_seq {
                // Restored with `--at` below the parent's restore point: its next restore
                // points would land on keys the parent already holds.
                return Decision::Refuse(format!(
                    "the store was restored to commit {store_commit_seq}, below its parent's restore point \
                     {} ({} commits): an adopted store must start at its parent's newest restore \
                     point; restore it without --at, or back it up to a new prefix",
                    newest.key, m.commit_seq
                ));
            }
            return Decision::Proceed {
                lineage,
                write_lineage: false,
                parent: Some(ParentRef {
                    lineage: p.lineage,
                    manifest: p.manifest.clone(),
                }),
            };
        }
        return Decision::Refuse(format!(
            "the newest restore point {} belongs to lineage {}, not this store's {lineage}; \
             the store was restored from {} of lineage {}, but LATEST has moved on since \
             (another instance writes to this prefix)",
            newest.key, m.lineage, p.manifest, p.lineage
        ));
    }
    Decision::Refuse(format!(
        "the newest restore point {} belongs to lineage {}, not this store's {lineage}: \
         it is another store's prefix",
        newest.key, m.lineage
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{FORMAT, ObjectEntry, SegmentEntry, manifest_key, segment_key};

    fn manifest(lineage: u128, commit_seq: u64) -> Manifest {
        Manifest {
            format: FORMAT,
            lineage: Uuid::from_u128(lineage),
            generation: 1,
            commit_seq,
            created_at: String::new(),
            wal_floor: 0,
            wal_id: Uuid::from_u128(77),
            wal_number: 1,
            snapshot: None,
            archives: vec![],
            segments: vec![SegmentEntry {
                object: ObjectEntry {
                    key: segment_key(1, 0, 10),
                    len: 10,
                    crc: 0,
                    lineage: Uuid::from_u128(lineage),
                    generation: 1,
                    ..Default::default()
                },
                start: 0,
                end: 10,
                frames: commit_seq,
            }],
            side_files: vec![],
            parent: None,
            branch: None,
            branched_from: None,
        }
    }

    fn latest(m: &Manifest) -> Latest {
        Latest {
            manifest: m.key(),
            commit_seq: m.commit_seq,
            lineage: m.lineage,
            adopted_by: None,
            adopted_at: None,
        }
    }

    fn newest<'a>(key: &'a str, m: &'a Manifest, l: &'a Latest) -> Option<NewestRestorePoint<'a>> {
        Some(NewestRestorePoint::of(key, m, Some(l)))
    }

    /// What a failover claimant asks (LATEST alone) is answered as the worker answers it (the
    /// manifest LATEST names): a rewound store, another lineage, an adopted one.
    #[test]
    fn latest_alone_decides_as_the_manifest_it_names() {
        let m = manifest(1, 100);
        let l = latest(&m);
        let key = l.manifest.clone();
        let parent = ParentRecord {
            lineage: Uuid::from_u128(1),
            manifest: key.clone(),
            commit_seq: 100,
        };
        let cases = [
            (Some(1), None, 99),
            (Some(1), None, 100),
            (Some(2), None, 500),
            (None, None, 500),
            (Some(2), Some(&parent), 100),
            (Some(2), Some(&parent), 90),
        ];
        let mut refused = 0;
        for (lineage, parent, seq) in cases {
            let lineage = lineage.map(Uuid::from_u128);
            let by_manifest = decide(lineage, parent, seq, newest(&key, &m, &l), Uuid::new_v4);
            let by_latest = decide(
                lineage,
                parent,
                seq,
                Some(NewestRestorePoint::named_by(&l)),
                Uuid::new_v4,
            );
            assert_eq!(by_manifest, by_latest, "{lineage:?} {parent:?} {seq}");
            refused += usize::from(matches!(by_latest, Decision::Refuse(_)));
        }
        assert_eq!(
            refused, 4,
            "the rewound, the two strangers, the adopted one rewound"
        );
    }

    /// A promotion's claim (`adopted_by`): the old primary and any other adopter of the same
    /// parent are refused; the adopter named proceeds as before.
    #[test]
    fn a_claimed_latest_lets_only_its_adopter_write() {
        let m = manifest(1, 100);
        let key = m.key();
        let claimed = Latest {
            adopted_by: Some(Uuid::from_u128(3)),
            adopted_at: None,
            ..latest(&m)
        };
        let parent = ParentRecord {
            lineage: Uuid::from_u128(1),
            manifest: key.clone(),
            commit_seq: 100,
        };
        for by in [
            newest(&key, &m, &claimed),
            Some(NewestRestorePoint::named_by(&claimed)),
        ] {
            let old = decide(Some(Uuid::from_u128(1)), None, 120, by, Uuid::new_v4);
            assert!(
                matches!(&old, Decision::Refuse(r) if r.contains("promoted")),
                "{old:?}"
            );
        }
        let other = decide(
            Some(Uuid::from_u128(4)),
            Some(&parent),
            100,
            newest(&key, &m, &claimed),
            Uuid::new_v4,
        );
        assert!(matches!(other, Decision::Refuse(_)), "{other:?}");
        let adopter = decide(
            Some(Uuid::from_u128(3)),
            Some(&parent),
            100,
            newest(&key, &m, &claimed),
            Uuid::new_v4,
        );
        assert!(
            matches!(&adopter, Decision::Proceed { lineage, parent: Some(_), .. } if *lineage == Uuid::from_u128(3)),
            "{adopter:?}"
        );
    }

    #[test]
    fn empty_prefix_gives_a_new_lineage_once() {
        let d = decide(None, None, 5, None, || Uuid::from_u128(1));
        assert_eq!(
            d,
            Decision::Proceed {
                lineage: Uuid::from_u128(1),
                write_lineage: true,
                parent: None
            }
        );
        let d = decide(Some(Uuid::from_u128(2)), None, 5, None, || unreachable!());
        assert!(matches!(
            d,
            Decision::Proceed {
                write_lineage: false,
                ..
            }
        ));
    }

    #[test]
    fn refusals_name_their_cause() {
        let m = manifest(1, 100);
        let (key, l) = (manifest_key(100), latest(&m));
        let Decision::Refuse(r) = decide(
            Some(Uuid::from_u128(1)),
            None,
            99,
            newest(&key, &m, &l),
            Uuid::new_v4,
        ) else {
            panic!("not refused")
        };
        assert!(
            r.contains("fewer commits than the newest restore point"),
            "{r}"
        );
        let Decision::Refuse(r) = decide(None, None, 500, newest(&key, &m, &l), Uuid::new_v4)
        else {
            panic!("not refused")
        };
        assert!(r.contains("no backup.lineage"), "{r}");
        let Decision::Refuse(r) = decide(
            Some(Uuid::from_u128(2)),
            None,
            500,
            newest(&key, &m, &l),
            Uuid::new_v4,
        ) else {
            panic!("not refused")
        };
        assert!(r.contains("belongs to lineage"), "{r}");
        assert!(matches!(
            decide(
                Some(Uuid::from_u128(1)),
                None,
                100,
                newest(&key, &m, &l),
                Uuid::new_v4
            ),
            Decision::Proceed { .. }
        ));
    }

    #[test]
    fn adoption_only_while_latest_names_the_parent() {
        let m = manifest(1, 100);
        let (key, l) = (manifest_key(100), latest(&m));
        let parent = ParentRecord {
            lineage: Uuid::from_u128(1),
            manifest: key.clone(),
            commit_seq: 100,
        };
        let d = decide(
            Some(Uuid::from_u128(2)),
            Some(&parent),
            100,
            newest(&key, &m, &l),
            Uuid::new_v4,
        );
        assert!(
            matches!(
                d,
                Decision::Proceed {
                    parent: Some(_),
                    ..
                }
            ),
            "{d:?}"
        );
        let d = decide(
            Some(Uuid::from_u128(2)),
            Some(&parent),
            90,
            newest(&key, &m, &l),
            Uuid::new_v4,
        );
        assert!(
            matches!(d, Decision::Refuse(ref r) if r.contains("below its parent's restore point")
                && !r.contains("  ")),
            "{d:?}"
        );
        let moved = manifest(1, 150);
        let (key2, l2) = (manifest_key(150), latest(&moved));
        let d = decide(
            Some(Uuid::from_u128(2)),
            Some(&parent),
            100,
            newest(&key2, &moved, &l2),
            Uuid::new_v4,
        );
        assert!(
            matches!(d, Decision::Refuse(ref r) if r.contains("LATEST has moved on")),
            "{d:?}"
        );
    }
}

//! The cells of the matrix: every combination of the modes a store can have, the combinations
//! refused by design ([`refused`]), and the seeded sample the default run keeps ([`sample`]).
//!
//! A cell's name is its eight values joined by `-`, in the order of [`Cell`]'s fields, e.g.
//! `keyfile-zstd-random-sync-mutable-replica-kill-moto`. No value is a part of another's name
//! within its dimension's set of names, and `MATRIX_FILTER` matches whole values
//! (`MATRIX_FILTER=sync,keyfile`: cells whose values include both `sync` and `keyfile`).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How the store's objects are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encryption {
    /// No key: plain (or zstd) objects.
    Plain,
    /// A symmetric key file (`key new`): `serve --encryption-key-file`.
    KeyFile,
    /// An age recipient: `serve --encryption-recipient` (the writer holds no secret); the
    /// standby's `serve` and every restore hold the identity.
    Age,
}

/// The store's `compression` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    Zstd,
    None,
}

/// What the node's values hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Data {
    /// Rows of text (the engine's `ValueKind::Text`, at least 3:1 with zstd).
    Text,
    /// Random bytes from the workload's seeded generator (`ValueKind::Random`): incompressible.
    Random,
}

/// The store's `durability` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Durability {
    Sync,
    Async,
}

/// The prefix's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// LATEST rewritten in place.
    Mutable,
    /// `object_lock = governance`: every object created once under S3 Object Lock.
    WriteOnce,
}

/// Whether the store names a second destination (`StoreOptions.replica`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Replica {
    None,
    One,
}

/// How the cell ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// The host dies: SIGKILL of `serve` and the node at once.
    Kill,
    /// The host dies, then a standby in a second `serve` is promoted (`Promote`).
    PromoteDead,
    /// A standby in a second `serve` is promoted while the old primary and its node keep
    /// running (a partitioned or confused old primary); they are killed a while later.
    PromoteLive,
}

/// Where the bucket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Server {
    File,
    Moto,
    SeaweedFs,
}

/// One combination of modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cell {
    pub encryption: Encryption,
    pub compression: Compression,
    pub data: Data,
    pub durability: Durability,
    pub layout: Layout,
    pub replica: Replica,
    pub ending: Ending,
    pub server: Server,
}

impl Cell {
    /// The cell's values' names, in field order.
    pub fn values(&self) -> [&'static str; 8] {
        [
            match self.encryption {
                Encryption::Plain => "plain",
                Encryption::KeyFile => "keyfile",
                Encryption::Age => "age",
            },
            match self.compression {
                Compression::Zstd => "zstd",
                Compression::None => "uncompressed",
            },
            match self.data {
                Data::Text => "text",
                Data::Random => "random",
            },
            match self.durability {
                Durability::Sync => "sync",
                Durability::Async => "async",
            },
            match self.layout {
                Layout::Mutable => "mutable",
                Layout::WriteOnce => "writeonce",
            },
            match self.replica {
                Replica::None => "single",
                Replica::One => "replica",
            },
            match self.ending {
                Ending::Kill => "kill",
                Ending::PromoteDead => "promote-dead",
                Ending::PromoteLive => "promote-live",
            },
            match self.server {
                Server::File => "file",
                Server::Moto => "moto",
                Server::SeaweedFs => "seaweedfs",
            },
        ]
    }

    pub fn name(&self) -> String {
        self.values().join("-")
    }

    /// Whether every token of `filter` (comma-separated) is one of the cell's values.
    pub fn matches(&self, filter: &str) -> bool {
        let values = self.values();
        filter
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .all(|t| values.contains(&t))
    }

    /// The combination finding 1 of security review 4 broke: an encrypted store in sync mode
    /// whose segments zstd cannot shrink (its sealed segments are longer than their ranges).
    pub fn is_encrypted_incompressible_sync(&self) -> bool {
        self.encryption != Encryption::Plain
            && self.data == Data::Random
            && self.durability == Durability::Sync
    }
}

/// Every combination, pruned or not: 3 × 2 × 2 × 2 × 2 × 2 × 3 × 3 = 864.
pub fn product() -> Vec<Cell> {
    let mut out = Vec::new();
    for encryption in [Encryption::Plain, Encryption::KeyFile, Encryption::Age] {
        for compression in [Compression::Zstd, Compression::None] {
            for data in [Data::Text, Data::Random] {
                for durability in [Durability::Sync, Durability::Async] {
                    for layout in [Layout::Mutable, Layout::WriteOnce] {
                        for replica in [Replica::None, Replica::One] {
                            for ending in [Ending::Kill, Ending::PromoteDead, Ending::PromoteLive] {
                                for server in [Server::File, Server::Moto, Server::SeaweedFs] {
                                    out.push(Cell {
                                        encryption,
                                        compression,
                                        data,
                                        durability,
                                        layout,
                                        replica,
                                        ending,
                                        server,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Why the product leaves `cell` out, when a combination is refused by design; `None` for a
/// cell that runs. Only two rules, each the README's:
///
/// - **write-once on `file://`**: `--object-lock` "needs an `s3://` destination in a bucket
///   created with Object Lock enabled (a `file://` destination is refused, naming the
///   option)" ("Immutable backups and a second copy"). 144 cells.
/// - **an async primary promoted while it still runs**: an async primary promises no
///   acknowledgement window, so a promotion must wait until its lease is stale
///   (`--wait-for-lease`; without it `Promote` is refused naming why), and the lease of a
///   `serve` that is alive never goes stale ("Standby and promotion"). 120 cells.
///
/// Not pruned, though it may look so: encryption with promotion (the service's standby and
/// `Promote` take the instance's keys; only the standalone `mb promote` refuses encrypted
/// prefixes), a replica with promotion (the standby itself has no replica, as `Register`
/// requires; the old primary's replica prefix is checked as it was left), async promotion on
/// `file://` (a bucket with no clock: `--wait-for-lease` is used for every async promotion).
pub fn refused(cell: &Cell) -> Option<&'static str> {
    if cell.layout == Layout::WriteOnce && cell.server == Server::File {
        return Some("write-once needs an s3:// bucket with Object Lock; file:// is refused");
    }
    if cell.durability == Durability::Async && cell.ending == Ending::PromoteLive {
        return Some(
            "an async primary promises no acknowledgement window: a live one is never fenced \
             (Promote is refused without --wait-for-lease, and waits forever with it)",
        );
    }
    None
}

/// The cells that run: the product less [`refused`].
pub fn runnable() -> Vec<Cell> {
    product()
        .into_iter()
        .filter(|c| refused(c).is_none())
        .collect()
}

/// A seeded sample of `size` cells of `pool` (all of it when it is smaller):
/// 1. one encrypted, incompressible, sync cell, whenever `pool` holds one (the combination
///    finding 1 broke is never left to chance);
/// 2. then cells drawn in a seeded order, each kept while it shows a value of some dimension
///    that no kept cell shows yet, until every value of every dimension is covered (4–6 cells);
/// 3. then the rest of the draw, up to `size`.
///
/// The result is in the order the cells were chosen.
pub fn sample(pool: &[Cell], size: usize, seed: u64) -> Vec<Cell> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<Cell> = pool.to_vec();
    order.shuffle(&mut rng);
    let mut kept: Vec<Cell> = Vec::new();
    if let Some(c) = order.iter().find(|c| c.is_encrypted_incompressible_sync()) {
        kept.push(*c);
    }
    let covered = |kept: &[Cell]| -> std::collections::BTreeSet<(usize, &'static str)> {
        kept.iter()
            .flat_map(|c| c.values().into_iter().enumerate())
            .collect()
    };
    for c in &order {
        if kept.len() >= size {
            break;
        }
        let have = covered(&kept);
        let new = c
            .values()
            .into_iter()
            .enumerate()
            .any(|v| !have.contains(&v));
        if new && !kept.contains(c) {
            kept.push(*c);
        }
    }
    for c in &order {
        if kept.len() >= size {
            break;
        }
        if !kept.contains(c) {
            kept.push(*c);
        }
    }
    kept.truncate(size.max(1).min(pool.len()));
    kept
}

/// A fresh seed, printed by the caller, when `MATRIX_SEED` names none.
pub fn fresh_seed() -> u64 {
    rand::rng().random()
}

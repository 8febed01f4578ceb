//! One promise, one matrix (issue 40): the guarantees of docs/guarantees.md checked
//! in every combination of the modes a store can have, not only in the mode each feature was
//! built in (security review 4, finding 1: an encrypted sync store acknowledged commits no
//! restore reached).
//!
//! The dimensions (`matrix/cells.rs`): encryption (none, key file, age recipient) ×
//! compression (zstd, none) × data (text, random bytes) × durability (sync, async) × layout
//! (mutable, write-once) × replica (none, one) × ending (SIGKILL of serve and node, promotion of
//! a standby with the old primary dead, or still running) × server (`file://`, moto,
//! SeaweedFS): 864 cells, 600 once the combinations refused by design are pruned
//! ([`cells::refused`] says which and why). Each cell (`matrix/driver.rs`) runs real `serve`
//! processes, a real node over gRPC and real buckets, ends as its ending says, restores the
//! prefix (and the replica's) from the bucket and checks it against what was acknowledged,
//! verifies every manifest, and checks that a refused backup leaves the bucket untouched.
//!
//! - The default run keeps a seeded sample of [`DEFAULT_CELLS`] cells (always one encrypted,
//!   incompressible, sync cell; then cells until every value of every dimension is covered;
//!   then seeded draws). Its seed is printed; `MATRIX_SEED=<seed>` replays it,
//!   `MATRIX_CELLS=N` sizes it.
//! - `MATRIX=full` runs every cell of the pruned product (hours: about 20 s a cell).
//! - `MATRIX_FILTER=age,sync,promote-live` keeps the cells having each of these values (whole
//!   values of the cell's name) before sampling, or of the full run.
//!
//! Each cell prints `MATRIX cell=<name> acked=N lost=M secs=S …`, the run a `FIGURE matrix`
//! line; a cell that lost a promised commit, failed a check or whose processes failed fails
//! the test, which names every such cell. A cell on an S3 server the run lacks is skipped
//! with a line saying so, except under `CI=true`, where the server's absence fails the test.

mod support;

#[path = "matrix/cells.rs"]
mod cells;
#[path = "matrix/driver.rs"]
mod driver;
#[path = "matrix/node.rs"]
mod node;
#[path = "matrix/setup.rs"]
mod setup;

use std::time::Instant;

use cells::{Cell, Server};
use support::s3_servers::{Kind, S3Server};

/// Cells in the default run: 2–11 s each (a debug build on 2 busy cores), about 2 minutes.
const DEFAULT_CELLS: usize = 16;

/// The S3 server a cell needs, `Ok(None)` for `file://`; `Err` when the run has none.
fn server_of(cell: &Cell) -> Result<Option<S3Server>, ()> {
    let kind = match cell.server {
        Server::File => return Ok(None),
        Server::Moto => Kind::Moto,
        Server::SeaweedFs => Kind::SeaweedFs,
    };
    S3Server::of(kind).map(Some).ok_or(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guarantee_holds_in_every_combination_of_modes() {
    let began = Instant::now();
    let full = std::env::var("MATRIX").is_ok_and(|v| v == "full");
    let filter = std::env::var("MATRIX_FILTER").unwrap_or_default();
    let seed: u64 = std::env::var("MATRIX_SEED")
        .ok()
        .map(|s| s.parse().expect("MATRIX_SEED: a number"))
        .unwrap_or_else(cells::fresh_seed);
    let size: usize = std::env::var("MATRIX_CELLS")
        .ok()
        .map(|s| s.parse().expect("MATRIX_CELLS: a number"))
        .unwrap_or(DEFAULT_CELLS);
    let product = cells::product().len();
    let pool: Vec<Cell> = cells::runnable()
        .into_iter()
        .filter(|c| c.matches(&filter))
        .collect();
    assert!(!pool.is_empty(), "MATRIX_FILTER={filter} keeps no cell");
    let chosen = if full {
        pool.clone()
    } else {
        cells::sample(&pool, size, seed)
    };
    eprintln!(
        "MATRIX seed={seed} (MATRIX_SEED={seed} replays it): {product} cells, {} runnable, {} \
         after MATRIX_FILTER={filter:?}; running {}{}",
        cells::runnable().len(),
        pool.len(),
        chosen.len(),
        if full { " (MATRIX=full)" } else { "" }
    );

    let (mut run, mut skipped, mut lost_total) = (0usize, 0usize, 0usize);
    let mut bad: Vec<String> = Vec::new();
    for cell in chosen {
        let name = cell.name();
        let Ok(server) = server_of(&cell) else {
            eprintln!("MATRIX cell={name} skipped: no such S3 server in this run");
            skipped += 1;
            continue;
        };
        let started = Instant::now();
        let result = tokio::spawn(driver::run(cell, server, seed)).await;
        let secs = started.elapsed().as_secs_f64();
        run += 1;
        match result {
            Ok(o) => {
                lost_total += o.lost;
                let verdict = if o.failures.is_empty() {
                    "ok"
                } else {
                    "FAILED"
                };
                eprintln!(
                    "MATRIX cell={name} acked={} lost={} secs={secs:.1} {verdict}; {}{}",
                    o.acked,
                    o.lost,
                    o.notes.join("; "),
                    o.failures
                        .iter()
                        .map(|f| format!("\n  FAILED: {f}"))
                        .collect::<String>()
                );
                if !o.failures.is_empty() {
                    bad.push(format!(
                        "{name} (lost {}): {}",
                        o.lost,
                        o.failures.join("; ")
                    ));
                }
            }
            Err(e) => {
                let why = e
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    })
                    .unwrap_or_else(|| "cancelled".to_string());
                let short: String = why.chars().take(600).collect();
                eprintln!("MATRIX cell={name} acked=? lost=? secs={secs:.1} BROKE: {short}");
                bad.push(format!("{name} broke: {short}"));
            }
        }
    }
    eprintln!(
        "FIGURE matrix cells={product} runnable={} run={run} skipped={skipped} lost={lost_total} \
         failed={} seed={seed} secs={:.0}",
        cells::runnable().len(),
        bad.len(),
        began.elapsed().as_secs_f64()
    );
    assert!(
        bad.is_empty(),
        "{} of {run} cells failed (MATRIX_SEED={seed} replays the sample):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn the_product_and_its_pruning_count_as_documented() {
    assert_eq!(cells::product().len(), 864);
    let pruned: Vec<_> = cells::product()
        .into_iter()
        .filter(|c| cells::refused(c).is_some())
        .collect();
    assert_eq!(pruned.len(), 144 + 120);
    assert_eq!(cells::runnable().len(), 600);
    // Every name is unique, and the sample is seeded: the same seed, the same cells.
    let names: std::collections::BTreeSet<String> =
        cells::product().iter().map(Cell::name).collect();
    assert_eq!(names.len(), 864);
    let pool = cells::runnable();
    assert_eq!(cells::sample(&pool, 8, 7), cells::sample(&pool, 8, 7));
    for seed in 0..50 {
        let s = cells::sample(&pool, 8, seed);
        assert_eq!(s.len(), 8);
        assert!(s[0].is_encrypted_incompressible_sync(), "{:?}", s[0]);
        // Every value of every dimension is covered by 8 cells.
        let covered: std::collections::BTreeSet<(usize, &str)> = s
            .iter()
            .flat_map(|c| c.values().into_iter().enumerate())
            .collect();
        assert_eq!(covered.len(), 19, "seed {seed}: {s:?}");
    }
}

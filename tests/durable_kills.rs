//! The proof a database owner wants (issue 27): no commit acknowledged as durable is lost when
//! the node's host dies.
//!
//! A real reference node (`node --durability sync --acked-log FILE`) commits into a store
//! registered with `durability = sync` on a real `serve`, whose S3 goes through
//! [`FaultProxy`] (503 SlowDown, connections dropped after the request took effect, delays) in
//! front of moto. Every round starts `serve` and the node, lets the node get acknowledgements
//! for a while (a seeded 0.5–2.5 s after its first of the round), then SIGKILLs both — the
//! host dies — and restores the prefix straight from moto: the restore must reach every
//! commit in the acked log (lines are fsynced before the next acknowledgement, so a kill never
//! leaves a line for a commit that was not acknowledged). The next round restarts both on the
//! same directories; its `serve` takes the bucket lease over after the dead one's TTL.
//!
//! `SOAK_ROUNDS` sets the rounds (default 3, about 30–60 s), `SOAK_KEY=1` encrypts the store
//! (a key file for `serve` and the restores, `support::soak`); the figures are printed as a
//! `FIGURE durable-kills` line: rounds, acknowledged commits, lost commits, faults met. The
//! proxy prints its seed; `MUSHROOM_FAULT_SEED=<seed>` replays the faults and the kill
//! schedule.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::binary::{self, Running};
use support::fault_proxy::{FaultPlan, FaultProxy};
use support::served::{self, DEADLINE, Dirs};

const TTL_MS: &str = "2000";
/// Commits per second the node is asked for (each waits for nothing: acks are asynchronous
/// to the commits, as an engine's group commit is).
const RATE: &str = "40";
const PREFIX: &str = "acked";

/// `serve` with its S3 through `s3` (the proxy), a short lease TTL and frequent restore points.
fn serve(d: &Dirs, s3: &str) -> Command {
    let mut cmd = served::command(d);
    cmd.env("AWS_ENDPOINT_URL", s3)
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args([
            "--lease-ttl-ms",
            TTL_MS,
            "--restore-point-interval-ms",
            "500",
        ]);
    support::soak::keyed(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_commit_is_lost_when_the_host_is_killed_under_s3_faults() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rounds = support::soak::rounds(3);
    let began = Instant::now();
    let bucket = support::s3::create_bucket(&endpoint, "durable-kills").await;
    let url = format!("s3://{bucket}/{PREFIX}");
    let proxy = FaultProxy::start(&endpoint, FaultPlan::default());
    let mut schedule = ChaCha8Rng::seed_from_u64(proxy.seed() ^ 0x6163_6b73);
    let d = served::dirs();
    let dir = d.root.join(PREFIX);
    std::fs::create_dir_all(&dir).unwrap();
    let log = d.base.join("acked.log");

    let (server, addr) = served::start("serve (round 1)", serve(&d, proxy.url()));
    let c = served::client(addr).await;
    let r = served::register_sync(&c, &dir, &url).await;
    drop(c);

    let (mut acked_total, mut lost_total, mut restored_last) = (0usize, 0usize, 0u64);
    let mut first = Some((server, addr));
    for round in 1..=rounds {
        let (mut srv, addr) = first.take().unwrap_or_else(|| {
            served::start(&format!("serve (round {round})"), serve(&d, proxy.url()))
        });
        let before = served::acked_log(&log).len();
        let mut n = Running::spawn(
            &format!("node (round {round})"),
            served::sync_node(addr, &dir, (&r.store_id, &r.node_token), &log, RATE),
        );
        // Until this round's first acknowledgement (the new serve waits out the dead one's
        // lease first), then a seeded while more.
        let deadline = Instant::now() + DEADLINE;
        while served::acked_log(&log).len() == before {
            if Instant::now() > deadline {
                n.fail(&format!(
                    "no acknowledgement in round {round}; serve said:\n{}",
                    served::stderr(&srv)
                ));
            }
            // Reads the node's output meanwhile, so that its pipes never fill.
            n.next_line(Instant::now() + Duration::from_millis(50));
            srv.next_line(Instant::now() + Duration::from_millis(1));
        }
        let hold = Duration::from_millis(schedule.random_range(500..=2500));
        let until = Instant::now() + hold;
        while Instant::now() < until {
            n.next_line(Instant::now() + Duration::from_millis(20));
            srv.next_line(Instant::now() + Duration::from_millis(1));
        }
        // The host dies: both processes at once.
        srv.signal(libc::SIGKILL);
        n.signal(libc::SIGKILL);
        srv.wait_exit(Duration::from_secs(10));
        n.wait_exit(Duration::from_secs(10));

        let seqs = served::acked_log(&log);
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "the acked log does not rise: {seqs:?}"
        );
        let into = d.base.join(format!("restored-{round}"));
        let mut restore = support::soak::keyed(binary::command(&endpoint));
        restore
            .args(["restore", "--from", &url, "--json", "--to"])
            .arg(&into);
        binary::run_ok("restore", restore, Duration::from_secs(60));
        let restored = binary::store_digest(&into);
        let reached = restored["commit_seq"].as_u64().expect("a commit_seq");
        let lost = seqs.iter().filter(|s| **s > reached).count();
        eprintln!(
            "round {round}: held {hold:?} after the first ack; {} acknowledged this round, {} in all, \
             highest {:?}; the restore reaches {reached}; lost {lost}; proxy so far {:?}",
            seqs.len() - before,
            seqs.len(),
            seqs.last(),
            proxy.counts()
        );
        assert!(
            reached >= restored_last,
            "the restore went backwards: {reached} after {restored_last}"
        );
        restored_last = reached;
        acked_total = seqs.len();
        lost_total += lost;
        assert_eq!(
            lost,
            0,
            "round {round}: {lost} acknowledged commits are not in the restore (it reaches \
             {reached}, the acked log {:?})",
            seqs.last()
        );
    }

    support::soak::assert_encrypted(&endpoint, &url);
    let counts = proxy.counts();
    eprintln!(
        "FIGURE durable-kills: {rounds} SIGKILLs of serve and node, {}, {acked_total} commits \
         acknowledged, {lost_total} lost; the last restore reached {restored_last}; proxy (seed \
         {}): {counts:?}; {:?} in all",
        support::soak::mode(),
        proxy.seed(),
        began.elapsed()
    );
    if counts.requests >= 200 {
        counts.assert_every_kind_injected();
    }
    counts.assert_no_upstream_error();
}

//! [`Throttled`]: the bucket wrapper every request of a throttled bucket passes, under the retry
//! layer (each attempt is paced, as each is sent) and over the usage counter and the backend.
//!
//! A request is classed (the module docs of [`super`]), takes its request token at every scope
//! of its [`Lane`], then runs as a [`Pacer`]'s request: the backend paces the pieces it streams
//! ([`super::pace`]); the bytes it did not pace (a local directory's, memory's) are paced when
//! the request ends well. A request that failed is not paced further: what it sent was paced
//! as it went, or was nothing.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::lane::caller_class;
use super::{Lane, Pacer, TrafficClass};
use crate::bucket::faults::Op;
use crate::bucket::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutOpts,
};

/// What a request is when nothing else says (a worker's bucket): a segment's reads and writes,
/// and every small object a restore point or the lease is made of, `wal` (never waits); a
/// snapshot's, an archive's and a side file's, `bulk`; a delete, `housekeeping`.
pub fn classify(op: Op, key: &str) -> TrafficClass {
    if op == Op::Delete {
        return TrafficClass::Housekeeping;
    }
    // The bucket floor knows no manifest: `gen/<generation>/…` is the layout's (DESIGN.md),
    // and the tests below name its keys.
    let Some(rest) = key
        .strip_prefix("gen/")
        .and_then(|r| r.split_once('/'))
        .map(|(_, rest)| rest)
    else {
        return TrafficClass::Wal;
    };
    if rest.starts_with("snapshot") || rest.starts_with("archive/") || rest.starts_with("side/") {
        TrafficClass::Bulk
    } else {
        TrafficClass::Wal
    }
}

/// A bucket whose requests are paced through a [`Lane`]; see the module docs.
pub struct Throttled {
    inner: DynBucket,
    lane: Arc<Lane>,
}

impl Throttled {
    pub fn new(inner: DynBucket, lane: Lane) -> Throttled {
        Throttled {
            inner,
            lane: Arc::new(lane),
        }
    }

    /// The class of a request: its caller's, else the lane's, else by what it does.
    fn class(&self, op: Op, key: &str) -> TrafficClass {
        caller_class()
            .or(self.lane.class())
            .unwrap_or_else(|| classify(op, key))
    }

    /// Runs one request of `op` on `key`: its token, then `f` paced; `len` says how many bytes
    /// it moved once it ended well, of which those the backend did not pace are paced then.
    async fn run<T, F>(
        &self,
        op: Op,
        key: &str,
        f: F,
        len: impl FnOnce(&T) -> u64,
    ) -> Result<T, BucketError>
    where
        F: std::future::Future<Output = Result<T, BucketError>>,
    {
        let class = self.class(op, key);
        let _open = match op {
            Op::Get | Op::GetRange => self.lane.download(class).await,
            _ => None,
        };
        self.lane.request(class).await;
        let pacer = Pacer::new(self.lane.clone(), class);
        let out = pacer.run(f).await?;
        let unpaced = len(&out).saturating_sub(pacer.paced());
        pacer.bytes(unpaced).await;
        Ok(out)
    }
}

#[async_trait::async_trait]
impl Bucket for Throttled {
    fn url(&self) -> String {
        self.inner.url()
    }

    /// The sibling is paced through the same lane (a branch's reads of its parent are the
    /// branch store's traffic).
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(Arc::new(Throttled {
            inner: self.inner.sibling(url)?,
            lane: self.lane.clone(),
        }))
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.run(Op::Get, key, self.inner.get_at_most(key, at_most), |o| {
            o.data.len() as u64
        })
        .await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.run(Op::GetRange, key, self.inner.get_range(key, range), |d| {
            d.len() as u64
        })
        .await
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let op = Op::of_part(&part);
        self.run(op, key, self.inner.get_buffers(key, part), |b| {
            b.iter().map(|b| b.len() as u64).sum()
        })
        .await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.run(Op::Head, key, self.inner.head(key), |_| 0).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        let len = body.len();
        self.run(Op::Put, key, self.inner.put_with(key, body, opts), |_| len)
            .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        self.run(Op::Delete, key, self.inner.delete(key, if_match), |_| 0)
            .await
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        self.run(Op::Put, key, self.inner.put_retention(key, retain), |_| 0)
            .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let prefix = query.prefix.to_string();
        self.run(Op::List, &prefix, self.inner.list(query), |_| 0)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::bucket::mem::MemBucket;
    use crate::bucket::throttle::{LimitSet, StoreScope, Throttle, in_class};
    use crate::bucket::{PutCondition, put_immutable};

    fn limits(items: &[&str]) -> LimitSet {
        LimitSet::none().with(&LimitSet::parse_all(items).unwrap())
    }

    #[test]
    fn requests_are_classed_by_what_they_touch() {
        use TrafficClass::*;
        for (op, key, class) in [
            (
                Op::Put,
                "gen/0000000001/wal/00000000000000000001-00000000000000000009.seg",
                Wal,
            ),
            (Op::Put, "gen/0000000001/snapshot.bin", Bulk),
            (
                Op::Get,
                "gen/0000000001/archive/00000000000000000003.wal",
                Bulk,
            ),
            (Op::Put, "gen/0000000001/side/x.0badf00d", Bulk),
            (Op::Put, "gen/0000000001/GENERATION", Wal),
            (Op::Put, "manifests/00000000000000000042.json", Wal),
            (Op::Put, "lease", Wal),
            (Op::Get, "LATEST", Wal),
            (Op::List, "manifests/", Wal),
            (Op::Delete, "gen/0000000001/snapshot.bin", Housekeeping),
        ] {
            assert_eq!(classify(op, key), class, "{key}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_and_the_instance_pace_bulk_and_the_wal_never_waits() {
        let throttle = Throttle::new(limits(&["bulk=1000000"]));
        let store = throttle.store("s", &limits(&["bulk=500000"]));
        let b: DynBucket = Arc::new(Throttled::new(
            Arc::new(MemBucket::new()),
            Lane::new(&throttle, Some(store.clone()), None),
        ));
        let started = Instant::now();
        for i in 0..10 {
            let key = format!("gen/0000000001/archive/{i:020}.wal");
            b.put(&key, vec![7u8; 500_000].into(), PutCondition::IfNoneMatch)
                .await
                .unwrap();
        }
        // 5 MB at the store's 0.5 MB/s: 10 s, less the store's burst.
        let took = started.elapsed().as_secs_f64();
        assert!((9.85..=10.01).contains(&took), "{took}");
        // A segment goes at once, however much bulk is owed.
        let started = Instant::now();
        let seg = "gen/0000000001/wal/00000000000000000001-00000000000000000002.seg";
        put_immutable(
            b.as_ref(),
            seg,
            vec![1u8; 4_000_000].into(),
            &PutCondition::IfNoneMatch,
        )
        .await
        .unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        // ... and bulk yields to it: the next bulk byte waits for the 4 MB the WAL took.
        let started = Instant::now();
        b.put(
            "gen/0000000001/snapshot.bin",
            vec![0u8; 1000].into(),
            PutCondition::None,
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let measured = store.measured()[TrafficClass::Bulk as usize];
        assert!(measured.bytes_per_second > 0.0);
        // Held back without a break since the first archive: what health's note reads.
        let held = store.held_back(TrafficClass::Bulk).expect("held back");
        assert!(held >= Duration::from_secs(13), "{held:?}");
        tokio::time::sleep(StoreScope::BREAK * 3).await;
        assert_eq!(store.held_back(TrafficClass::Bulk), None);
        assert_eq!(store.held_back(TrafficClass::Wal), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_class_wins_and_requests_are_paced() {
        let throttle = Throttle::new(limits(&["housekeeping=unlimited,requests=10"]));
        let b = Throttled::new(Arc::new(MemBucket::new()), Lane::new(&throttle, None, None));
        let started = Instant::now();
        // 50 reads of LATEST (wal when classed by key) as housekeeping: 5 s less the burst.
        in_class(TrafficClass::Housekeeping, async {
            for _ in 0..50 {
                let _ = b.head("LATEST").await.unwrap();
            }
        })
        .await;
        let took = started.elapsed().as_secs_f64();
        assert!((4.8..=5.0).contains(&took), "{took}");
        // The same reads outside the pass are not housekeeping: no wait.
        let started = Instant::now();
        for _ in 0..50 {
            let _ = b.head("LATEST").await.unwrap();
        }
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_limited_request_is_given_the_patience_its_pacing_needs() {
        let throttle = Throttle::new(limits(&["bulk=1000000"]));
        let lane = Arc::new(Lane::new(&throttle, None, None));
        // Unlimited classes keep the client's timeouts.
        assert_eq!(
            Pacer::new(lane.clone(), TrafficClass::Wal).patience(1 << 30),
            None
        );
        assert_eq!(
            Pacer::new(lane.clone(), TrafficClass::Check).patience(1 << 30),
            None
        );
        // 8 MB at 1 MB/s: four times its 8 s.
        let bulk = Pacer::new(lane.clone(), TrafficClass::Bulk);
        assert_eq!(bulk.patience(8_000_000), Some(Duration::from_secs(32)));
        // Never past 6 h, however large.
        assert_eq!(bulk.patience(u64::MAX), Some(Duration::from_secs(6 * 3600)));
    }

    #[tokio::test(start_paused = true)]
    async fn stores_share_a_contended_instance_limit_fairly() {
        // Three stores want bulk under an instance limit of 3 MB/s; one of them sends four
        // bodies at once, the others one each: each gets a third all the same.
        let throttle = Throttle::new(limits(&["bulk=3000000"]));
        let mut tasks = Vec::new();
        for (s, parallel) in [("a", 4usize), ("b", 1), ("c", 1)] {
            let store = throttle.store(s, &LimitSet::none());
            let b: DynBucket = Arc::new(Throttled::new(
                Arc::new(MemBucket::new()),
                Lane::new(&throttle, Some(store.clone()), None),
            ));
            for p in 0..parallel {
                let b = b.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0.. {
                        let key = format!("gen/0000000001/archive/{p}{i:019}.wal");
                        b.put(&key, vec![0u8; 100_000].into(), PutCondition::None)
                            .await
                            .unwrap();
                    }
                }));
            }
        }
        tokio::time::sleep(Duration::from_secs(20)).await;
        for store in throttle.stores() {
            let rate = store.measured()[TrafficClass::Bulk as usize].bytes_per_second;
            assert!(
                (800_000.0..=1_200_000.0).contains(&rate),
                "{}: {rate}",
                store.name()
            );
        }
        for t in tasks {
            t.abort();
        }
    }
}

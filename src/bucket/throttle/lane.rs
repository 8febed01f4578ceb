//! The scopes a request is paced at and how: [`Throttle`] (an instance's, or a command's: every
//! class's limit and meter at the instance scope, and the endpoints'), [`StoreScope`] (one
//! store's), and [`Lane`] (what a bucket is opened with: a store's scope, its endpoint's and
//! the instance's). [`Pacer`] is one request's pacing, which a backend reaches through
//! [`pace`] (in the request's task) or carries into a body it streams from another task.
//!
//! Fairness (the module docs of [`super`]): a store's pieces of one class go one at a time
//! (its turn, a FIFO lock), so a scope's queue holds at most one piece per store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::{LimitSet, Measured, Meter, Rate, TokenBucket, TrafficClass};

const CLASSES: usize = TrafficClass::ALL.len();

tokio::task_local! {
    /// The pacing of the request this task is making (set by [`super::Throttled`]).
    static PACE: Pacer;
    /// The class its caller says the task's requests are ([`in_class`]).
    static CLASS: TrafficClass;
}

/// Runs `f` with every bucket request it makes (in this task) counted as `class`: how a
/// retention pass says its reads, listings and deletes are housekeeping.
pub async fn in_class<F: std::future::Future>(class: TrafficClass, f: F) -> F::Output {
    CLASS.scope(class, f).await
}

/// The class [`in_class`] set for this task, if any.
pub(super) fn caller_class() -> Option<TrafficClass> {
    CLASS.try_with(|c| *c).ok()
}

/// Paces `n` bytes of the request this task is making, when it is throttled: what a backend
/// calls for each piece it sends or reads in the request's own task.
pub async fn pace(n: u64) {
    if let Ok(p) = PACE.try_with(Pacer::clone) {
        p.bytes(n).await;
    }
}

/// One class at one scope: its limits (as buckets) and what it measured.
#[derive(Debug)]
struct Slot {
    bytes: TokenBucket,
    requests: TokenBucket,
    meter: Meter,
}

/// Every class at one scope.
#[derive(Debug)]
pub(super) struct Scope {
    slots: [Slot; CLASSES],
}

impl Scope {
    fn new(limits: &LimitSet) -> Scope {
        Scope {
            slots: TrafficClass::ALL.map(|c| Slot {
                bytes: TokenBucket::new(limits.get(c).bytes_per_second),
                requests: TokenBucket::new(limits.get(c).requests_per_second),
                meter: Meter::default(),
            }),
        }
    }

    fn slot(&self, class: TrafficClass) -> &Slot {
        &self.slots[class as usize]
    }

    fn apply(&self, limits: &LimitSet) {
        for c in TrafficClass::ALL {
            let (slot, rate) = (self.slot(c), limits.get(c));
            if slot.bytes.rate() != rate.bytes_per_second {
                slot.bytes.set_rate(rate.bytes_per_second);
            }
            if slot.requests.rate() != rate.requests_per_second {
                slot.requests.set_rate(rate.requests_per_second);
            }
        }
    }

    fn limits(&self) -> LimitSet {
        let mut l = LimitSet::none();
        for c in TrafficClass::ALL {
            let s = self.slot(c);
            l.set_rate(
                c,
                Rate {
                    bytes_per_second: s.bytes.rate(),
                    requests_per_second: s.requests.rate(),
                },
            );
        }
        l
    }

    fn measured(&self) -> [Measured; CLASSES] {
        TrafficClass::ALL.map(|c| self.slot(c).meter.rate())
    }
}

/// An instance's throttle (or a command's): the instance scope, the endpoints' scopes, and the
/// stores' scopes it made (held weakly, for the listing). Shared as an `Arc`.
#[derive(Debug)]
pub struct Throttle {
    scope: Scope,
    endpoints: Mutex<BTreeMap<String, Arc<Scope>>>,
    endpoint_limits: Mutex<BTreeMap<String, LimitSet>>,
    stores: Mutex<BTreeMap<String, Weak<StoreScope>>>,
    /// Stores taking pieces of each class now (what a piece's size divides the rate by).
    waiting: [AtomicUsize; CLASSES],
}

impl Throttle {
    /// A throttle whose instance scope has `limits`.
    pub fn new(limits: LimitSet) -> Arc<Throttle> {
        Arc::new(Throttle {
            scope: Scope::new(&limits),
            endpoints: Mutex::default(),
            endpoint_limits: Mutex::default(),
            stores: Mutex::default(),
            waiting: Default::default(),
        })
    }

    /// No limit anywhere: every request only counted.
    pub fn unlimited() -> Arc<Throttle> {
        Throttle::new(LimitSet::none())
    }

    /// The instance scope's limits now.
    pub fn limits(&self) -> LimitSet {
        self.scope.limits()
    }

    /// Sets the instance scope's limits: the next piece of every class is paced by them.
    pub fn set_limits(&self, limits: &LimitSet) {
        self.scope.apply(limits);
    }

    /// What the instance scope measured, per class (in [`TrafficClass::ALL`]'s order).
    pub fn measured(&self) -> [Measured; CLASSES] {
        self.scope.measured()
    }

    /// Sets the limits of the endpoint `endpoint` (a host, as [`Lane::new`] is given it).
    pub fn set_endpoint_limits(&self, endpoint: &str, limits: &LimitSet) {
        lock(&self.endpoint_limits).insert(endpoint.to_string(), *limits);
        if let Some(s) = lock(&self.endpoints).get(endpoint) {
            s.apply(limits);
        }
    }

    /// The scope of `endpoint`, made with its limits at its first use.
    fn endpoint(&self, endpoint: &str) -> Arc<Scope> {
        let limits = lock(&self.endpoint_limits)
            .get(endpoint)
            .copied()
            .unwrap_or_default();
        lock(&self.endpoints)
            .entry(endpoint.to_string())
            .or_insert_with(|| Arc::new(Scope::new(&limits)))
            .clone()
    }

    /// The scope of the store `name`, with its own `limits` set: the one held already (a
    /// store's workers share one), or a new one; listed by [`Throttle::stores`] while held.
    pub fn store(self: &Arc<Self>, name: &str, limits: &LimitSet) -> Arc<StoreScope> {
        let mut stores = lock(&self.stores);
        if let Some(held) = stores.get(name).and_then(Weak::upgrade) {
            held.set_limits(limits);
            return held;
        }
        let store = Arc::new(StoreScope {
            name: name.to_string(),
            scope: Scope::new(limits),
            turns: Default::default(),
            held: Default::default(),
        });
        stores.retain(|_, s| s.strong_count() > 0);
        stores.insert(name.to_string(), Arc::downgrade(&store));
        store
    }

    /// The scope of the store `name`, while one is held.
    pub fn store_named(&self, name: &str) -> Option<Arc<StoreScope>> {
        lock(&self.stores).get(name).and_then(Weak::upgrade)
    }

    /// The stores' scopes held now, by name.
    pub fn stores(&self) -> Vec<Arc<StoreScope>> {
        lock(&self.stores)
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// One store's scope: its limits and meters, its turns (one per class), and how long each
/// class has been held back without a break ([`StoreScope::held_back`]).
#[derive(Debug)]
pub struct StoreScope {
    name: String,
    scope: Scope,
    turns: [tokio::sync::Mutex<()>; CLASSES],
    /// Per class: when its pieces began to wait, and until when the last one waits.
    held: [Mutex<Option<(Instant, Instant)>>; CLASSES],
}

impl StoreScope {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store's own limits now.
    pub fn limits(&self) -> LimitSet {
        self.scope.limits()
    }

    /// Sets the store's own limits, applied to its next piece.
    pub fn set_limits(&self, limits: &LimitSet) {
        self.scope.apply(limits);
    }

    /// What the store's requests measured, per class.
    pub fn measured(&self) -> [Measured; CLASSES] {
        self.scope.measured()
    }

    /// How long pieces of `class` have waited for a limit without a break of more than
    /// [`StoreScope::BREAK`]; `None` when they are not waiting now.
    pub fn held_back(&self, class: TrafficClass) -> Option<Duration> {
        let now = Instant::now();
        let held = *lock(&self.held[class as usize]);
        held.filter(|(_, until)| *until + Self::BREAK >= now)
            .map(|(since, _)| now.saturating_duration_since(since))
    }

    /// A pause in waiting that ends a stretch of being held back.
    pub const BREAK: Duration = Duration::from_secs(2);

    /// A piece of `class` waits `wait` from now.
    fn waits(&self, class: TrafficClass, wait: Duration) {
        let now = Instant::now();
        let mut held = lock(&self.held[class as usize]);
        *held = match *held {
            Some((since, until)) if until + Self::BREAK >= now => Some((since, now + wait)),
            _ => Some((now, now + wait)),
        };
    }
}

/// What one bucket's requests are paced through: a store's scope (none for a command that
/// serves no store), its endpoint's, and the instance's; and the class every request of the
/// bucket is, when it was opened for one ([`Lane::classed`]).
#[derive(Debug, Clone)]
pub struct Lane {
    throttle: Arc<Throttle>,
    store: Option<Arc<StoreScope>>,
    endpoint: Option<Arc<Scope>>,
    class: Option<TrafficClass>,
    /// The downloads of the lane's limited classes open at once ([`Lane::download`]).
    downloads: Arc<tokio::sync::Semaphore>,
}

impl Lane {
    /// The lane of `store` (if any) to `endpoint` (a host; `None`: no endpoint scope).
    pub fn new(
        throttle: &Arc<Throttle>,
        store: Option<Arc<StoreScope>>,
        endpoint: Option<&str>,
    ) -> Lane {
        Lane {
            throttle: throttle.clone(),
            store,
            endpoint: endpoint.map(|e| throttle.endpoint(e)),
            class: None,
            downloads: Arc::new(tokio::sync::Semaphore::new(usize::from(DOWNLOAD_SHARES))),
        }
    }

    /// This lane with every request counted as `class` (unless its caller runs
    /// [`in_class`]): a restore's bucket, a drill's.
    pub fn classed(mut self, class: TrafficClass) -> Lane {
        self.class = Some(class);
        self
    }

    /// The class the lane was opened for, if any.
    pub fn class(&self) -> Option<TrafficClass> {
        self.class
    }

    /// The scopes, the store's first.
    fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.store
            .as_deref()
            .map(|s| &s.scope)
            .into_iter()
            .chain(self.endpoint.as_deref())
            .chain(std::iter::once(&self.throttle.scope))
    }

    /// The store's turn at `class`, when the lane has a store.
    async fn turn(&self, class: TrafficClass) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.store {
            Some(s) => Some(s.turns[class as usize].lock().await),
            None => None,
        }
    }

    /// Takes one request of `class` at every scope, waiting as long as the slowest says.
    pub async fn request(&self, class: TrafficClass) {
        for s in self.scopes() {
            s.slot(class).meter.add(0, 1);
        }
        if class == TrafficClass::Wal || !self.scopes().any(|s| s.slot(class).requests.rate() > 0) {
            return;
        }
        let _turn = self.turn(class).await;
        let wait = self
            .scopes()
            .map(|s| s.slot(class).requests.take(1))
            .max()
            .unwrap_or_default();
        sleep(wait).await;
    }

    /// Paces `n` bytes of `class` through every scope; see the module docs. `wal` never waits:
    /// its bytes are taken from every scope's `bulk` budget (which bulk then waits for).
    pub async fn bytes(&self, class: TrafficClass, n: u64) {
        if self.slowest(class).is_none() {
            for s in self.scopes() {
                s.slot(class).meter.add(n, 0);
                if class == TrafficClass::Wal {
                    s.slot(TrafficClass::Bulk).bytes.take(n);
                }
            }
            return;
        }
        let _turn = self.turn(class).await;
        let waiting = Waiting::enter(&self.throttle.waiting[class as usize]);
        let others = waiting.others;
        let mut left = n;
        while left > 0 {
            let piece = left.min(self.piece(class, others + 1));
            let mut wait = Duration::ZERO;
            for s in self.scopes() {
                let slot = s.slot(class);
                slot.meter.add(piece, 0);
                wait = wait.max(slot.bytes.take(piece));
            }
            if let Some(store) = self.store.as_deref().filter(|_| !wait.is_zero()) {
                store.waits(class, wait);
            }
            sleep(wait).await;
            left -= piece;
        }
    }

    /// A turn to open a download of `class`, held until its response is read, when the class
    /// is limited: a response is paced as it is read, but the server sends ahead of the reader
    /// into the sockets' buffers, so the downloads open at once are kept to one per
    /// [`DOWNLOAD_RATE`] of the slowest limit (at least one, at most [`DOWNLOAD_SHARES`]), and
    /// what the server sends ahead stays a few buffers' worth. `None`: not limited.
    pub async fn download(&self, class: TrafficClass) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let slowest = self.slowest(class)?;
        let open = slowest
            .div_ceil(DOWNLOAD_RATE)
            .clamp(1, u64::from(DOWNLOAD_SHARES));
        let shares = u32::try_from(u64::from(DOWNLOAD_SHARES) / open).unwrap_or(1);
        self.downloads.acquire_many(shares).await.ok()
    }

    /// The slowest byte limit of `class` at any scope of the lane; `None` when no scope limits
    /// it, and always for `wal` (never limited).
    fn slowest(&self, class: TrafficClass) -> Option<u64> {
        if class == TrafficClass::Wal {
            return None;
        }
        self.scopes()
            .map(|s| s.slot(class).bytes.rate())
            .filter(|r| *r > 0)
            .min()
    }

    /// The piece a store takes of `class` at a time while `stores` take it: a second of the
    /// slowest scope's rate shared by them, from 16 KiB to 1 MiB.
    pub fn piece(&self, class: TrafficClass, stores: usize) -> u64 {
        let slowest = self.slowest(class).unwrap_or(u64::MAX);
        (slowest / stores.max(1) as u64).clamp(16 << 10, 1 << 20)
    }
}

/// The rate one open download of a limited class stands for ([`Lane::download`]).
pub const DOWNLOAD_RATE: u64 = 32_000_000;
/// The most downloads of a limited class a lane opens at once.
pub const DOWNLOAD_SHARES: u16 = 16;

/// One request's pacing: its lane and class, and the bytes its backend paced as it streamed.
#[derive(Debug, Clone)]
pub struct Pacer {
    lane: Arc<Lane>,
    class: TrafficClass,
    paced: Arc<AtomicU64>,
}

impl Pacer {
    pub(super) fn new(lane: Arc<Lane>, class: TrafficClass) -> Pacer {
        Pacer {
            lane,
            class,
            paced: Arc::default(),
        }
    }

    /// The pacing of the request this task is making, if it is throttled: for a body a
    /// backend streams from another task (an HTTP connection's).
    pub fn current() -> Option<Pacer> {
        PACE.try_with(Pacer::clone).ok()
    }

    /// Paces `n` bytes.
    pub async fn bytes(&self, n: u64) {
        self.paced.fetch_add(n, Ordering::Relaxed);
        self.lane.bytes(self.class, n).await;
    }

    /// Whether its bytes are limited at any scope now (a backend streams a body paced only
    /// then: unlimited, the request's bytes are only counted when it ends).
    pub fn limited(&self) -> bool {
        self.lane.slowest(self.class).is_some()
    }

    /// How much longer than usual a request moving `len` bytes may take, when its class is
    /// limited: four times what `len` takes at the slowest scope's rate shared by the stores
    /// taking the class now (at most 6 h). A backend adds it to its timeouts, so a paced
    /// request is never cut by a timeout its pacing outlasts. `None`: not limited.
    pub fn patience(&self, len: u64) -> Option<Duration> {
        if !self.limited() {
            return None;
        }
        let slowest = self.lane.slowest(self.class)?;
        let sharing = self.lane.throttle.waiting[self.class as usize].load(Ordering::Relaxed) + 1;
        let seconds = 4.0 * len as f64 * sharing as f64 / slowest as f64;
        Some(Duration::from_secs_f64(seconds.min(6.0 * 3600.0)))
    }

    /// Bytes paced so far.
    pub(super) fn paced(&self) -> u64 {
        self.paced.load(Ordering::Relaxed)
    }

    /// Runs `f` as this pacer's request: [`pace`] in it paces through this pacer.
    pub(super) async fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        PACE.scope(self.clone(), f).await
    }
}

/// A store counted among those taking a class while it is held (also when its future is
/// dropped mid-way).
struct Waiting<'a> {
    count: &'a AtomicUsize,
    /// Stores that were taking the class when this one came.
    others: usize,
}

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Waiting<'a> {
        let others = count.fetch_add(1, Ordering::Relaxed);
        Waiting { count, others }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn sleep(wait: Duration) {
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

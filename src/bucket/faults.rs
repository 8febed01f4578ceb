//! [`FaultyBucket`]: a wrapper that injects faults into the requests of the bucket it wraps,
//! for tests of everything above the bucket layer.
//!
//! Every request gets a 1-based number in the order requests *start* (all operations; writes
//! also get their own count). A [`FaultPlan`] decides, from that number, what happens to it:
//! - pass it through;
//! - **fail** it: `Transient` (determinate), the inner bucket never sees it;
//! - **lose the answer**: do it, then return `Transient` with `indeterminate` set (a timeout
//!   after the request reached the store);
//! - **delay** it (a `tokio::time` sleep, so paused-time tests stay instant), then do it;
//! - answer **conflict** (409, as real S3 does to racing conditional writes) without doing it;
//! - **crash**: the simulated process dies at this request, which either does not happen
//!   ([`CrashKind::Before`]) or happens ([`CrashKind::After`]); it and every later request
//!   return [`BucketError::Crashed`], and so does any request still in flight when it dies (a
//!   dead process hears no answers).
//!
//! A plan may target all requests or only writes (put and delete, see [`FaultPlan::writes_only`]):
//! then reads are never faulted and the plan's request numbers count writes only, which is
//! what a crash-at-every-write test iterates over.
//!
//! Seeded plans are replayable: the fault for request `n` is a pure function of the seed and `n`
//! (splitmix64), so the same seed and the same sequence of requests give the same log.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{
    Body, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutCondition,
    PutOpts,
};

/// A bucket operation, as counted and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Get,
    GetRange,
    Head,
    Put,
    Delete,
    List,
}

impl Op {
    /// Every operation, in declaration order (`op as usize` indexes it).
    pub const ALL: [Op; 6] = [
        Op::Get,
        Op::GetRange,
        Op::Head,
        Op::Put,
        Op::Delete,
        Op::List,
    ];

    /// The operation a `get_buffers` of `part` is: ranged, or the whole object.
    pub fn of_part(part: &Part) -> Op {
        match part {
            Part::Range(_) => Op::GetRange,
            Part::Whole { .. } => Op::Get,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::GetRange => "get_range",
            Op::Head => "head",
            Op::Put => "put",
            Op::Delete => "delete",
            Op::List => "list",
        }
    }

    /// Whether the operation changes the bucket.
    pub fn is_write(self) -> bool {
        matches!(self, Op::Put | Op::Delete)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a crashing request takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    /// The process dies before sending the request: it does not happen.
    Before,
    /// The process dies after the request took effect, before hearing the answer.
    After,
}

/// What happens to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    Fail,
    LoseAnswer,
    Delay(Duration),
    Conflict,
    Crash(CrashKind),
}

/// One request, as a plan sees it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request's number among the requests the plan targets (1-based).
    pub number: u64,
    pub op: Op,
    pub key: &'a str,
    /// A put with `If-None-Match`/`If-Match`, or a delete with `if_match`.
    pub conditional: bool,
}

/// Probabilities (each in `0.0..=1.0`, together at most 1) of the faults of a seeded plan.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SeededFaults {
    /// Fail without doing it (`Transient`, determinate).
    pub fail: f64,
    /// Do it, then fail (`Transient`, indeterminate).
    pub lose_answer: f64,
    /// Sleep up to `max_delay`, then do it.
    pub delay: f64,
    pub max_delay: Duration,
    /// Answer 409 `Conflict` without doing it (conditional writes only).
    pub conflict: f64,
}

type CustomPlan = Arc<dyn Fn(&Request<'_>) -> Fault + Send + Sync>;

#[derive(Clone)]
enum Rule {
    None,
    CrashAt(u64, CrashKind),
    Seeded(u64, SeededFaults),
    Custom(CustomPlan),
}

/// Decides the fault of every request; see the module docs.
#[derive(Clone)]
pub struct FaultPlan {
    rule: Rule,
    writes_only: bool,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rule = match &self.rule {
            Rule::None => "none".to_string(),
            Rule::CrashAt(n, kind) => format!("crash {kind:?} request {n}"),
            Rule::Seeded(seed, faults) => format!("seeded {seed:#x} {faults:?}"),
            Rule::Custom(_) => "custom".to_string(),
        };
        let targets = if self.writes_only { "writes" } else { "all" };
        write!(f, "FaultPlan({rule}, targets {targets})")
    }
}

impl FaultPlan {
    /// Every request passes (still counted and logged).
    pub fn none() -> Self {
        Self::from_rule(Rule::None)
    }

    /// The process dies at request `n` (1-based).
    pub fn crash_at(n: u64, kind: CrashKind) -> Self {
        Self::from_rule(Rule::CrashAt(n, kind))
    }

    /// Random faults, replayable from `seed`.
    pub fn seeded(seed: u64, faults: SeededFaults) -> Self {
        Self::from_rule(Rule::Seeded(seed, faults))
    }

    /// Any rule: `f` sees each targeted request and picks its fault.
    pub fn custom(f: impl Fn(&Request<'_>) -> Fault + Send + Sync + 'static) -> Self {
        Self::from_rule(Rule::Custom(Arc::new(f)))
    }

    /// Targets only writes (put, delete): reads pass, and request numbers count writes.
    pub fn writes_only(mut self) -> Self {
        self.writes_only = true;
        self
    }

    fn from_rule(rule: Rule) -> Self {
        FaultPlan {
            rule,
            writes_only: false,
        }
    }

    /// The fault for a targeted request.
    pub fn fault(&self, req: &Request<'_>) -> Fault {
        match &self.rule {
            Rule::None => Fault::Pass,
            Rule::CrashAt(n, kind) if req.number == *n => Fault::Crash(*kind),
            Rule::CrashAt(..) => Fault::Pass,
            Rule::Seeded(seed, faults) => seeded_fault(*seed, faults, req),
            Rule::Custom(f) => f(req),
        }
    }
}

fn seeded_fault(seed: u64, faults: &SeededFaults, req: &Request<'_>) -> Fault {
    let draw = unit(splitmix64(seed ^ splitmix64(req.number)));
    let mut bound = faults.fail;
    if draw < bound {
        return Fault::Fail;
    }
    bound += faults.lose_answer;
    if draw < bound {
        return Fault::LoseAnswer;
    }
    bound += faults.delay;
    if draw < bound {
        let nanos = crate::units::nanos_u64(faults.max_delay);
        let pick = splitmix64(seed ^ splitmix64(req.number ^ 0x5bd1_e995));
        return Fault::Delay(Duration::from_nanos(pick % nanos.max(1)));
    }
    bound += faults.conflict;
    if draw < bound && req.conditional {
        return Fault::Conflict;
    }
    Fault::Pass
}

/// splitmix64's output function: a well-mixed 64-bit value from any input.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform value in `[0, 1)`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// One line of the request log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Its number among all requests (1-based).
    pub request: u64,
    pub op: Op,
    pub key: String,
    /// What the plan did to it (`Pass` for requests it does not target).
    pub fault: Fault,
}

#[derive(Default)]
struct State {
    requests: u64,
    writes: u64,
    /// The number of the request the process died at.
    crashed_at: Option<u64>,
    log: Vec<LogEntry>,
}

/// A bucket that injects the faults of a [`FaultPlan`]; see the module docs.
pub struct FaultyBucket {
    inner: DynBucket,
    plan: FaultPlan,
    /// Shared with its siblings: one numbering of requests, one crash, across prefixes.
    state: Arc<Mutex<State>>,
}

impl FaultyBucket {
    pub fn new(inner: DynBucket, plan: FaultPlan) -> Self {
        FaultyBucket {
            inner,
            plan,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// How many requests were made (all operations, crashed ones included).
    pub fn requests(&self) -> u64 {
        self.state().requests
    }

    /// How many writes (puts and deletes) were made.
    pub fn writes(&self) -> u64 {
        self.state().writes
    }

    /// Whether the simulated process has died.
    pub fn has_crashed(&self) -> bool {
        self.state().crashed_at.is_some()
    }

    /// Every request so far, in the order they started.
    pub fn log(&self) -> Vec<LogEntry> {
        self.state().log.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves counters that are still meaningful.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Numbers the request and picks its fault.
    fn start(&self, op: Op, key: &str, conditional: bool) -> Result<(u64, Fault), BucketError> {
        let mut state = self.state();
        state.requests += 1;
        let request = state.requests;
        if op.is_write() {
            state.writes += 1;
        }
        let targeted = match (self.plan.writes_only, op.is_write()) {
            (false, _) => Some(request),
            (true, true) => Some(state.writes),
            (true, false) => None,
        };
        let fault = match (state.crashed_at, targeted) {
            (Some(_), _) | (None, None) => Fault::Pass,
            (None, Some(number)) => self.plan.fault(&Request {
                number,
                op,
                key,
                conditional,
            }),
        };
        state.log.push(LogEntry {
            request,
            op,
            key: key.to_string(),
            fault,
        });
        if let Some(at) = state.crashed_at {
            return Err(BucketError::Crashed { request: at });
        }
        if let Fault::Crash(_) = fault {
            state.crashed_at = Some(request);
        }
        Ok((request, fault))
    }

    /// Runs one request under its fault.
    async fn run<T>(
        &self,
        op: Op,
        key: &str,
        conditional: bool,
        request: impl Future<Output = Result<T, BucketError>>,
    ) -> Result<T, BucketError> {
        let (number, fault) = self.start(op, key, conditional)?;
        let injected = |message: &str, indeterminate| BucketError::Transient {
            op: op.name(),
            key: key.to_string(),
            message: format!("injected fault at request {number}: {message}"),
            indeterminate,
        };
        let result = match fault {
            Fault::Pass => request.await,
            Fault::Fail => Err(injected("failed", false)),
            Fault::LoseAnswer => {
                let _ = request.await;
                Err(injected("the answer was lost", op.is_write()))
            }
            Fault::Delay(d) => {
                tokio::time::sleep(d).await;
                request.await
            }
            Fault::Conflict => Err(BucketError::Conflict {
                key: key.to_string(),
            }),
            Fault::Crash(CrashKind::Before) => {
                return Err(BucketError::Crashed { request: number });
            }
            Fault::Crash(CrashKind::After) => {
                let _ = request.await;
                return Err(BucketError::Crashed { request: number });
            }
        };
        match self.state().crashed_at {
            Some(at) => Err(BucketError::Crashed { request: at }),
            None => result,
        }
    }
}

#[async_trait::async_trait]
impl super::Bucket for FaultyBucket {
    fn url(&self) -> String {
        self.inner.url()
    }

    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(Arc::new(FaultyBucket {
            inner: self.inner.sibling(url)?,
            plan: self.plan.clone(),
            state: self.state.clone(),
        }))
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.run(Op::Get, key, false, self.inner.get_at_most(key, at_most))
            .await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.run(Op::GetRange, key, false, self.inner.get_range(key, range))
            .await
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let op = Op::of_part(&part);
        self.run(op, key, false, self.inner.get_buffers(key, part))
            .await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.run(Op::Head, key, false, self.inner.head(key)).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        let conditional = opts.cond != PutCondition::None;
        self.run(
            Op::Put,
            key,
            conditional,
            self.inner.put_with(key, body, opts),
        )
        .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        let conditional = if_match.is_some();
        self.run(
            Op::Delete,
            key,
            conditional,
            self.inner.delete(key, if_match),
        )
        .await
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        self.run(Op::Put, key, false, self.inner.put_retention(key, retain))
            .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let prefix = query.prefix;
        self.run(Op::List, prefix, false, self.inner.list(query))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_all_is_indexed_by_the_op() {
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i, "{op:?}");
            // A new variant stops this compiling until it is listed in `Op::ALL`.
            match op {
                Op::Get | Op::GetRange | Op::Head | Op::Put | Op::Delete | Op::List => {}
            }
        }
    }

    #[test]
    fn seeded_faults_follow_their_probabilities() {
        let faults = SeededFaults {
            fail: 0.25,
            lose_answer: 0.25,
            ..Default::default()
        };
        let (mut fail, mut lose) = (0, 0);
        for number in 1..=10_000 {
            let req = Request {
                number,
                op: Op::Put,
                key: "k",
                conditional: false,
            };
            match seeded_fault(7, &faults, &req) {
                Fault::Fail => fail += 1,
                Fault::LoseAnswer => lose += 1,
                Fault::Pass => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!((2200..2800).contains(&fail), "{fail} failures");
        assert!((2200..2800).contains(&lose), "{lose} lost answers");
    }
}

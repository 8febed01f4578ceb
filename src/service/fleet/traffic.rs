//! The instance's throttle as the service runs it ([`Traffic`]): the instance scope's base
//! limits (`serve --limit`, `[limits]`, then `SetLimits` without a store), the schedule laid
//! over them at every tick, the endpoints' limits, and every store's scope (its
//! `StoreOptions.limits`), all on one [`Throttle`] every bucket of the instance is opened on
//! ([`crate::bucket::Opener::throttled`]).
//!
//! A tick every [`Traffic::TICK`] evaluates the schedule: a window's boundary applies within a
//! tick. A base set live lasts until the process ends (its lasting form is the configuration);
//! a store's limits are kept in its registry options by `SetLimits` (`ops::limits`). Nothing
//! else is kept: a crash leaves the configuration's and the registry's limits, which the next
//! start applies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::bucket::throttle::{ClassLimit, Lane, LimitSet, Schedule, Throttle, ThrottleSettings};

impl super::Fleet {
    /// The instance's throttle, base limits and schedule.
    pub fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// The lane of a bucket at `url` paced in the scope of the store `store_id` (while its
    /// worker holds one; else the instance's alone).
    pub fn store_lane(&self, url: &str, store_id: &str) -> Lane {
        let scope = self.traffic.throttle().store_named(store_id);
        self.buckets().lane(url, scope)
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Traffic {
    throttle: Arc<Throttle>,
    base: Mutex<LimitSet>,
    schedule: Schedule,
}

impl Traffic {
    /// How often the schedule is evaluated.
    pub const TICK: Duration = Duration::from_millis(250);

    /// The throttle of `settings`, the schedule applied as of now.
    pub fn new(settings: &ThrottleSettings) -> Arc<Traffic> {
        let now = crate::units::unix_now_ms();
        let throttle = Throttle::new(settings.schedule.at(&settings.instance, now));
        for (endpoint, limits) in &settings.endpoints {
            throttle.set_endpoint_limits(endpoint, limits);
        }
        Arc::new(Traffic {
            throttle,
            base: Mutex::new(settings.instance),
            schedule: settings.schedule.clone(),
        })
    }

    pub fn throttle(&self) -> &Arc<Throttle> {
        &self.throttle
    }

    /// The instance's limits outside every window of the schedule.
    pub fn base(&self) -> LimitSet {
        *self.base.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets `limits` over the base and applies them (with the schedule) at once.
    pub fn set_instance(&self, limits: &[ClassLimit]) {
        {
            let mut base = self.base.lock().unwrap_or_else(|p| p.into_inner());
            *base = base.with(limits);
        }
        self.tick();
    }

    /// The schedule's windows as `GetLimits` lists them, those open at `now_ms` marked.
    pub fn schedule_lines(&self, now_ms: i64) -> Vec<String> {
        self.schedule
            .windows
            .iter()
            .map(|w| {
                let open = Schedule {
                    windows: vec![w.clone()],
                };
                let marker = match open.at(&LimitSet::none(), now_ms) != LimitSet::none() {
                    true => "open: ",
                    false => "",
                };
                format!("{marker}{w}")
            })
            .collect()
    }

    /// Applies the base with the windows open now, when they changed; logged.
    pub fn tick(&self) {
        let effective = self.schedule.at(&self.base(), crate::units::unix_now_ms());
        if effective != self.throttle.limits() {
            let shown: Vec<String> = effective.limits().iter().map(|l| l.to_string()).collect();
            tracing::info!(limits = %shown.join(" "), "instance traffic limits now in force");
            self.throttle.set_limits(&effective);
        }
    }

    /// Ticks until `shutdown`.
    pub async fn keep(self: Arc<Self>, shutdown: CancellationToken) {
        let mut every = tokio::time::interval(Self::TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = every.tick() => self.tick(),
            }
        }
    }
}

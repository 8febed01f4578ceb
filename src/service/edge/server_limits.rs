//! What one client may hold of the server: streams, calls in flight, time.
//!
//! Without these a caller with no token at all could hold the server's memory and tasks for
//! ever: thousands of `ReportPosition` streams that never send their first report (the token
//! is checked against the store that report names), unary calls whose request never ends,
//! connections that went silent. [`Limits`] bounds each:
//!
//! - a `ReportPosition` stream's first report, and so its token check, is due within
//!   `first_report_timeout`; the stream then ends `DEADLINE_EXCEEDED`;
//! - every call's handler, reading its request included, ends within `call_timeout`
//!   (`DEADLINE_EXCEEDED`; [`CallTimeoutLayer`]), except `Adopt`, `Drill` and `Promote`, which restore a
//!   whole store inside the call, and `Move` and `Drain` (a flush and a handover per store),
//!   which have `adopt_timeout`. A stream's handler ends when its response
//!   starts, so the long-lived streams are not cut; the client's own `grpc-timeout` applies
//!   too, whichever is shorter;
//! - a connection has at most `max_concurrent_streams` streams open (HTTP/2
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`) and `concurrency_per_connection` calls in their
//!   handlers at once (more wait); it is pinged every `keepalive_interval` and dropped when a
//!   ping is not answered within `keepalive_timeout`;
//! - at most `max_health_watchers` `WatchHealth` streams are open on the whole server (more
//!   are `RESOURCE_EXHAUSTED`), all served by one poller (`health_watch`);
//! - at most `max_streams_per_store` `ReportPosition` streams are attached to one store (more
//!   are `RESOURCE_EXHAUSTED`, naming the limit; `wal_source::streamed`), so a token holder's
//!   streams cannot pile up on a store.
//!
//! A handler cut by a timeout is dropped where it stands, as when its client goes away.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::error::ServiceError;
pub use crate::service::config::limits::Limits;

impl Limits {
    /// The tower layer that applies `call_timeout` and `adopt_timeout`.
    pub fn call_timeouts(&self) -> CallTimeoutLayer {
        CallTimeoutLayer {
            call: self.call_timeout,
            adopt: self.adopt_timeout,
        }
    }
}

/// Ends every call's handler after its timeout with `DEADLINE_EXCEEDED`; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct CallTimeoutLayer {
    call: Duration,
    adopt: Duration,
}

impl<S> tower::Layer<S> for CallTimeoutLayer {
    type Service = CallTimeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallTimeout {
            inner,
            limits: *self,
        }
    }
}

/// The service of [`CallTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct CallTimeout<S> {
    inner: S,
    limits: CallTimeoutLayer,
}

const ADOPT_PATH: &str = "/mushroom.backup.v1.BackupControl/Adopt";
/// A drill restores a whole store too: it has Adopt's limit.
const DRILL_PATH: &str = "/mushroom.backup.v1.BackupControl/Drill";
/// A branch with a store directory restores the branch there: Adopt's limit too.
const BRANCH_PATH: &str = "/mushroom.backup.v1.BackupControl/Branch";
/// A promotion waits out the old writer's lease and catches up: Adopt's limit too.
const PROMOTE_PATH: &str = "/mushroom.backup.v1.BackupControl/Promote";
/// A move flushes and hands a store over; a drain does it for every store of an instance.
const MOVE_PATHS: [&str; 2] = [
    "/mushroom.backup.v1.BackupControl/Move",
    "/mushroom.backup.v1.BackupControl/Drain",
];

impl<S, B, ResBody> tower::Service<http::Request<B>> for CallTimeout<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        let (limit, setting) = if [ADOPT_PATH, DRILL_PATH, PROMOTE_PATH, BRANCH_PATH]
            .contains(&path)
            || MOVE_PATHS.contains(&path)
        {
            (self.limits.adopt, "adopt_timeout_ms")
        } else {
            (self.limits.call, "call_timeout_ms")
        };
        let method = path.rsplit('/').next().unwrap_or_default().to_string();
        let future = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(limit, future).await {
                Ok(result) => result,
                Err(_) => {
                    let status = tonic::Status::from(ServiceError::CallTimeout {
                        method,
                        ms: limit.as_millis(),
                        setting,
                    });
                    Ok(status.into_http())
                }
            }
        })
    }
}

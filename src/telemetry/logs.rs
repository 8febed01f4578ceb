//! JSON log lines that carry the current trace: `{"trace_id":"…","span_id":"…",…}`.
//!
//! The OpenTelemetry layer makes an entered span's context the current OpenTelemetry context
//! (context activation), so the ids are read from there: no lookup in the span registry.

use std::fmt::Write as _;

use opentelemetry::trace::TraceContextExt as _;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps a JSON event format: the object it writes gets the ids of the current span first.
pub(super) struct WithTraceIds<F> {
    inner: F,
    /// Whether spans are traced at all; when not, the inner format is used as is.
    traced: bool,
}

impl<F> WithTraceIds<F> {
    pub(super) fn new(inner: F, traced: bool) -> Self {
        Self { inner, traced }
    }
}

/// The current trace id, hex, when a sampled or remote span is current (events carry it).
pub fn current_trace_id() -> Option<String> {
    current_ids().map(|(trace, _)| trace)
}

/// The current trace and span ids, hex, when a sampled or remote span is current.
fn current_ids() -> Option<(String, String)> {
    opentelemetry::Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid()
            .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
    })
}

/// Puts the ids in front of the fields of `json`, one object written by the inner format.
fn splice(json: &str, ids: Option<(String, String)>) -> String {
    match (ids, json.strip_prefix('{')) {
        (Some((trace, span)), Some(rest)) => {
            let sep = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            let mut out = String::with_capacity(json.len() + 64);
            let _ = write!(
                out,
                "{{\"trace_id\":\"{trace}\",\"span_id\":\"{span}\"{sep}{rest}"
            );
            out
        }
        _ => json.to_string(),
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let ids = if self.traced { current_ids() } else { None };
        if ids.is_none() {
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&splice(&line, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::splice;

    fn ids() -> Option<(String, String)> {
        Some(("ab".into(), "cd".into()))
    }

    #[test]
    fn the_ids_come_first_and_the_object_stays_valid() {
        let line = "{\"timestamp\":\"t\",\"level\":\"INFO\"}\n";
        let out = splice(line, ids());
        assert_eq!(
            out,
            "{\"trace_id\":\"ab\",\"span_id\":\"cd\",\"timestamp\":\"t\",\"level\":\"INFO\"}\n"
        );
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["trace_id"], "ab");
        assert_eq!(
            splice("{}\n", ids()),
            "{\"trace_id\":\"ab\",\"span_id\":\"cd\"}\n"
        );
        assert_eq!(splice(line, None), line);
    }
}

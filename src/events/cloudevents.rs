//! An [`Event`] as a CloudEvents 1.0 document in the structured JSON mode (content type
//! [`CONTENT_TYPE`]): `specversion` "1.0", `id` the event's UUID (the same on every retry, so
//! a receiver can drop a duplicate), `source` `/mushroom-backup/<instance id>`, `type`
//! `dev.mushroom.backup.<kind>` ([`super::EventKind::name`]), `time` RFC 3339 in UTC with
//! milliseconds, `subject` the store id, `datacontenttype` "application/json", and `data`: the
//! event itself (position, seq, kind, store_id, detail, trace_id, the kind's facts). An event in
//! the fleet's log carries its position there in the `position` extension attribute too, as a
//! string of decimal digits (CloudEvents integers are 32-bit; positions are not). With a trace
//! id the document also carries the `traceparent` extension attribute (W3C Trace Context), so a
//! receiver that traces can join the trace.

use serde_json::{Value, json};

use super::Event;

/// The structured mode's content type.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";
/// The prefix of every event's `type`.
pub const TYPE_PREFIX: &str = "dev.mushroom.backup.";

/// `source` for events of instance `instance_id`.
pub fn source(instance_id: &str) -> String {
    format!("/mushroom-backup/{instance_id}")
}

/// The document for `event`, from `source` ([`source`]).
pub fn document(event: &Event, source: &str) -> Value {
    let mut doc = json!({
        "specversion": "1.0",
        "id": event.id,
        "source": source,
        "type": format!("{TYPE_PREFIX}{}", event.kind.name()),
        "time": crate::units::rfc3339_ms(event.time_unix_ms),
        "subject": event.store_id,
        "datacontenttype": "application/json",
        "data": event,
    });
    if event.position > 0 {
        doc["position"] = Value::String(event.position.to_string());
    }
    if event.trace_id.len() == 32 {
        // The span is not known here: the event's own 8 bytes would not name a real span, so
        // the parent id is the trace's (a valid, non-zero id), flagged not sampled.
        doc["traceparent"] = Value::String(format!(
            "00-{}-{}-00",
            event.trace_id,
            &event.trace_id[16..]
        ));
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventKind, Facts};

    #[test]
    fn a_paused_event_is_a_cloudevent_naming_its_store() {
        let e = Event {
            id: "7a1b".into(),
            position: 0,
            seq: 4,
            kind: EventKind::Paused,
            store_id: "s1".into(),
            time_unix_ms: 1_764_748_800_123,
            detail: "paused: maintenance".into(),
            trace_id: String::new(),
            facts: Facts::default(),
        };
        let d = document(&e, &source("i1"));
        assert_eq!(d["specversion"], "1.0");
        assert_eq!(d["type"], "dev.mushroom.backup.paused");
        assert_eq!(d["subject"], "s1");
        assert_eq!(d["source"], "/mushroom-backup/i1");
        assert_eq!(d["id"], "7a1b");
        assert_eq!(d["time"], "2025-12-03T08:00:00.123Z");
        assert_eq!(d["data"]["kind"], "paused");
        assert_eq!(d["data"]["seq"], 4);
        assert!(d.get("traceparent").is_none());
        assert!(d.get("position").is_none(), "not in the log: no position");
        let logged = document(
            &Event {
                position: 12,
                ..e.clone()
            },
            &source("i1"),
        );
        assert_eq!(logged["position"], "12");
        assert_eq!(logged["data"]["position"], 12);
        assert!(
            d["data"].get("commit_seq").is_none(),
            "no facts: none shown"
        );
    }
}

-- The event log (src/registry/events.rs): every event of the fleet, in the order the registry
-- took it. `position` is the fleet-wide order (a sequence, taken under an advisory lock
-- held to the commit, so positions become visible in order; never reused); `id` the event's UUID (the CloudEvents id); `body` the event as
-- JSON. No foreign key: a store's history outlives its registration. Pruned by age and count
-- from the oldest end; `events_pruned.through` is the highest position ever pruned, so the
-- oldest position still kept is known even when every row is gone.
-- Keep in step with the other backend's 0009_events.sql.
CREATE TABLE events (
    position BIGSERIAL PRIMARY KEY,
    id       TEXT    NOT NULL,
    store_id TEXT    NOT NULL,
    at_ms    BIGINT  NOT NULL,
    body     TEXT    NOT NULL,
    CONSTRAINT events_id_key UNIQUE (id)
);
CREATE INDEX events_by_store ON events (store_id, position);

CREATE TABLE events_pruned (
    id      INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    through BIGINT  NOT NULL
);
INSERT INTO events_pruned (id, through) VALUES (1, 0);

-- Webhook deliveries (src/registry/webhook_cursor.rs): per webhook (the SHA-256 of its URL as
-- configured: the URL may hold a token, so it is never stored), the last position delivered
-- and which instance delivers it until when (a claim renewed while it delivers).
CREATE TABLE webhook_cursors (
    webhook       TEXT   NOT NULL PRIMARY KEY,
    name          TEXT   NOT NULL,
    delivered     BIGINT NOT NULL,
    holder        TEXT   NOT NULL,
    held_until_ms BIGINT NOT NULL
);

-- Restore drills (src/registry/drill.rs): the last drill of each store (the service's Drill
-- call, or its scheduler), written when a drill ends, replaced by the next, deleted with its
-- store. A restarted service shows it in health again (a failed one keeps the store unhealthy
-- until a drill succeeds) and schedules the next drill from its time.
CREATE TABLE store_drills (
    store_id       TEXT    NOT NULL PRIMARY KEY REFERENCES stores (store_id) ON DELETE CASCADE,
    ok             BOOLEAN NOT NULL,
    commit_seq     BIGINT  NOT NULL,
    manifest_key   TEXT    NOT NULL,
    duration_ms    BIGINT  NOT NULL,
    bytes          BIGINT  NOT NULL,
    error          TEXT    NOT NULL,
    finished_at_ms BIGINT  NOT NULL,
    last_ok_at_ms  BIGINT  NOT NULL
);

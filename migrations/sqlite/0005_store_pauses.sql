-- Paused stores (src/registry/pause.rs): one row per store whose uploads an operator paused
-- (the service's Pause call), written before the worker is paused, deleted on Resume and with
-- its store. A restarted service spawns these stores' workers paused.
CREATE TABLE store_pauses (
    store_id     TEXT   NOT NULL PRIMARY KEY REFERENCES stores (store_id) ON DELETE CASCADE,
    reason       TEXT   NOT NULL,
    paused_at_ms BIGINT NOT NULL,
    until_ms     BIGINT NOT NULL
);

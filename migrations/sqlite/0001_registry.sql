-- The registry of stores, SQLite flavour (keep in step with migrations/postgres/0001_registry.sql).
-- Applied once by sqlx's Migrator at `Registry::open`; never edit an applied migration: add one.

-- One row per registered store directory. `labels` is a JSON object of strings, `options` any
-- JSON value; both are TEXT so the two backends store the same bytes.
CREATE TABLE stores (
    store_id         TEXT    NOT NULL,
    store_dir        TEXT    NOT NULL,
    destination      TEXT    NOT NULL,
    labels           TEXT    NOT NULL,
    options          TEXT    NOT NULL,
    node_token_hash  TEXT    NOT NULL,
    instance_id      TEXT    NOT NULL,
    registered_at_ms BIGINT  NOT NULL,
    CONSTRAINT stores_pkey PRIMARY KEY (store_id),
    CONSTRAINT stores_store_dir_key UNIQUE (store_dir)
);
CREATE INDEX stores_by_instance ON stores (instance_id, registered_at_ms, store_id);

-- Append-only record of what every instance did or refused to do.
CREATE TABLE audit_log (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       BIGINT  NOT NULL,
    instance_id TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    store_id    TEXT,
    store_dir   TEXT,
    outcome     TEXT    NOT NULL,
    detail      TEXT    NOT NULL,
    peer        TEXT
);

-- The last health each store's instance reported (one row per store, overwritten).
CREATE TABLE store_health (
    store_id       TEXT   NOT NULL PRIMARY KEY REFERENCES stores (store_id) ON DELETE CASCADE,
    instance_id    TEXT   NOT NULL,
    reported_at_ms BIGINT NOT NULL,
    health         TEXT   NOT NULL
);

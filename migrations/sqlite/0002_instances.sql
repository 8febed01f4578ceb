-- Every instance's last sign of life, written on every health report. An instance writes a
-- store's health row only when that health changed, so a store's owner counts as silent when
-- neither the store's row nor the owner's heartbeat is recent.
CREATE TABLE instances (
    instance_id  TEXT   NOT NULL PRIMARY KEY,
    heartbeat_ms BIGINT NOT NULL
);

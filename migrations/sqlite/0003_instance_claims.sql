-- Which live process holds each instance id (src/registry/claim.rs), so that two processes
-- started with one id never both run its stores. `nonce` is random per process; times are
-- milliseconds since the Unix epoch, `heartbeat_ms` by the database's own clock, so every
-- instance judges a claim's age on one clock. A claim whose heartbeat is older than the
-- service's bound is taken over by compare-and-set on its nonce; a clean stop deletes it.
CREATE TABLE instance_claims (
    instance_id   TEXT   NOT NULL PRIMARY KEY,
    nonce         TEXT   NOT NULL,
    host          TEXT   NOT NULL,
    pid           BIGINT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    heartbeat_ms  BIGINT NOT NULL
);

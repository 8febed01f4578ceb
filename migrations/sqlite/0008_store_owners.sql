-- Since when the instance named in `stores.instance_id` owns the store (milliseconds since the
-- Unix epoch): its registration, or the failover claim or planned move that gave it to that
-- instance (src/registry/ownership.rs). Existing rows were owned since they were registered.
-- Keep in step with the other backend's 0008_store_owners.sql.
ALTER TABLE stores ADD COLUMN owner_since_ms BIGINT NOT NULL DEFAULT 0;
UPDATE stores SET owner_since_ms = registered_at_ms;

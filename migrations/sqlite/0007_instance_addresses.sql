-- Where each instance answers calls from the others (serve --advertise-address, HOST:PORT;
-- empty when it has none: started on a wildcard listener without one) and the failover group
-- it belongs to (empty: none). Written when the instance starts, after it claimed its id, so
-- a refused second process never overwrites a live one's address.
ALTER TABLE instances ADD COLUMN advertise_address TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN failover_group TEXT NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN started_at_ms BIGINT NOT NULL DEFAULT 0;

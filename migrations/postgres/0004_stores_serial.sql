-- A counter of changes to `stores` (src/registry/mod.rs, "The registration check"): every
-- insert and delete of a store moves it in the same transaction, so a registration that finds
-- it where it left it knows the stores it read last are still the registered ones, and checks
-- a new store against those instead of reading every row again.
CREATE TABLE stores_serial (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    serial BIGINT  NOT NULL
);
INSERT INTO stores_serial (id, serial) VALUES (1, 0);

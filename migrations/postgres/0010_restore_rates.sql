-- Predicted restore times (src/registry/rates.rs, src/restore/predict.rs): the rates this
-- instance's drills and restores measured, per destination endpoint (the S3 endpoint and
-- bucket, or file:// for directory buckets), smoothed; and each drill's prediction made before
-- it, beside the time it measured.
CREATE TABLE restore_rates (
    endpoint                  TEXT             NOT NULL PRIMARY KEY,
    download_bytes_per_second DOUBLE PRECISION NOT NULL,
    first_byte_seconds        DOUBLE PRECISION NOT NULL,
    decode_bytes_per_second   DOUBLE PRECISION NOT NULL,
    check_bytes_per_second    DOUBLE PRECISION NOT NULL,
    fixed_seconds             DOUBLE PRECISION NOT NULL,
    samples                   BIGINT           NOT NULL,
    updated_at_ms             BIGINT           NOT NULL
);
ALTER TABLE store_drills ADD COLUMN predicted_ms BIGINT NOT NULL DEFAULT 0;

//! A store's compression option ([`StoreOptions::compression`]): `compression` (`zstd` or
//! `none`) and `compression_level` of the Register request, over the service's default.

use super::StoreOptions;
use crate::at_rest::{AtRestError, Compression};

impl StoreOptions {
    /// The compression these options ask for, if they ask for one (a level alone means
    /// zstd); an error names the field and its range.
    pub fn compression(&self) -> Result<Option<Compression>, AtRestError> {
        let level = self.compression_level.map(i64::from);
        let kind = match self.compression.as_deref() {
            Some(k) => k,
            None if level.is_none() => return Ok(None),
            None => "zstd",
        };
        Compression::parse(kind, level)
            .map(Some)
            .map_err(|e| AtRestError::Settings {
                detail: e
                    .to_string()
                    .replace("--compression-level", "options.compression_level")
                    .replace("--compression", "options.compression"),
            })
    }
}

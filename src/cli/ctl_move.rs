//! Which instance owns a store: how `ctl health` and `ctl list` show a store's owner and
//! since when (the registry's, `StoreHealth.owner_instance_id` / `owner_since_unix_ms`).

use mushroom_backup::health::rfc3339_ms;

/// `\n  owner B since <time>` for `ctl health` and `ctl list`; empty when the answer named
/// none (an older server).
pub(super) fn owner_text(owner: &str, since_ms: i64) -> String {
    if owner.is_empty() {
        return String::new();
    }
    format!("\n  owner {owner} since {}", rfc3339_ms(since_ms))
}

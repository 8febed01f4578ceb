//! At start, one instance id per bucket (security review 4, finding 4): two `serve`s given one
//! `--instance-id`, each with its own data directory and registry, on one bucket would take
//! each other's store leases in turn; the second is refused at its start, naming the live
//! holder and itself. The data directory's own previous process (its registry claim's
//! predecessor) is no other `serve`: its lease goes by the usual rules. Reads (and, when free,
//! holds) the instance lease of each lease root the stores use: what their workers would do
//! moments later anyway.

use super::{Fleet, FleetError};
use crate::lease::instance;

impl Fleet {
    /// Refuses to start when another live process holds this instance id's lease in a lease
    /// root of `stores` (two `serve`s given one `--instance-id` on one bucket would take each
    /// other's store leases in turn), naming both. Another: not this data directory's previous
    /// process (the registry claim's predecessor), whose lease goes by the usual rules. A
    /// lease root that cannot be read now is left to the workers, which retry.
    pub(super) async fn refuse_a_shared_instance_id(
        &self,
        stores: &[crate::registry::StoreRecord],
    ) -> Result<(), FleetError> {
        let mut seen = std::collections::BTreeSet::new();
        let predecessor = self
            .claim
            .predecessor()
            .map(|p| instance::holder_id(&self.config.instance_id, p.nonce()));
        for record in stores {
            let Some(root) = instance::lease_root(&record.destination) else {
                continue;
            };
            if !seen.insert(root) {
                continue;
            }
            match self.leases.shared_with(&record.destination).await {
                // This data directory's previous process (its registry claim's predecessor)
                // is no other `serve`: its lease is waited out, or taken at once when its lock
                // proves it dead.
                Ok(Some((_, holder, _))) if Some(&holder) == predecessor.as_ref() => {}
                Ok(Some((root, holder, host))) => {
                    let c = self.leases.config();
                    return Err(FleetError::InstanceIdShared(format!(
                        "another live `serve` uses instance id {} on the lease root {root}: its \
                         instance lease is held by {holder} on host {host} (this process: {} \
                         on host {}); give each `serve` sharing a bucket its own instance id \
                         (the default, kept in its data directory, is)",
                        self.config.instance_id, c.holder, c.host
                    )));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(destination = %record.destination, error = %e, "cannot read the instance lease at start")
                }
            }
        }
        Ok(())
    }
}

//! TEMPORARY STUB (not committed): the agreed registry API, to compile the service against.
#![allow(unused)]
use std::collections::BTreeMap;
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("exists {what} {value}")]
    AlreadyExists { what: &'static str, value: String },
    #[error("bad url")]
    BadUrl { url: String, reason: String },
    #[error("unavailable")]
    Unavailable { detail: String },
    #[error("db")]
    Database(String),
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreRecord {
    pub store_id: String,
    pub store_dir: String,
    pub destination: String,
    pub labels: BTreeMap<String, String>,
    pub options: serde_json::Value,
    pub node_token_hash: String,
    pub instance_id: String,
    pub registered_at_ms: i64,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub at_ms: i64,
    pub instance_id: String,
    pub action: String,
    pub store_id: Option<String>,
    pub store_dir: Option<String>,
    pub outcome: String,
    pub detail: String,
    pub peer: Option<String>,
}
pub struct Registry;
impl Registry {
    pub async fn open(url: &str) -> Result<Registry, RegistryError> {
        todo!()
    }
    pub fn kind(&self) -> &'static str {
        todo!()
    }
    pub async fn ping(&self) -> Result<(), RegistryError> {
        todo!()
    }
    pub async fn insert_store(&self, rec: &StoreRecord) -> Result<(), RegistryError> {
        todo!()
    }
    pub async fn delete_store(&self, store_id: &str) -> Result<bool, RegistryError> {
        todo!()
    }
    pub async fn get_store(&self, store_id: &str) -> Result<Option<StoreRecord>, RegistryError> {
        todo!()
    }
    pub async fn find_by_dir(&self, store_dir: &str) -> Result<Option<StoreRecord>, RegistryError> {
        todo!()
    }
    pub async fn list_stores(
        &self,
        instance_id: Option<&str>,
    ) -> Result<Vec<StoreRecord>, RegistryError> {
        todo!()
    }
    pub async fn record_audit(&self, entry: &AuditEntry) -> Result<(), RegistryError> {
        todo!()
    }
}
pub fn new_node_token() -> String {
    todo!()
}
pub fn hash_token(token: &str) -> String {
    todo!()
}
pub fn token_matches(token: &str, hash: &str) -> bool {
    todo!()
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthRow {
    pub store_id: String,
    pub instance_id: String,
    pub reported_at_ms: i64,
    pub health_json: String,
}
impl Registry {
    pub async fn put_health(
        &self,
        store_id: &str,
        instance_id: &str,
        reported_at_ms: i64,
        health_json: &str,
    ) -> Result<(), RegistryError> {
        todo!()
    }
    pub async fn all_health(&self) -> Result<Vec<HealthRow>, RegistryError> {
        todo!()
    }
}

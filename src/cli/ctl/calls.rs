//! The `ctl` calls on one store or the fleet's list that need more than one request or a view
//! of their own: deregister, trigger, pause, resume, health, watch-health, list-stores,
//! list-restore-points, adopt.

#[allow(unused_imports)]
use super::*;

/// `ctl deregister`.
pub(super) async fn deregister(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    flush: bool,
) -> anyhow::Result<()> {
    let req = proto::DeregisterRequest {
        store_id: store_id.clone(),
        flush,
    };
    ctl.client
        .deregister(ctl.request(req, true))
        .await
        .map_err(|s| failed("Deregister", s))?;
    print(
        j,
        json!({"deregistered": store_id, "flushed": flush}),
        format!("deregistered store {store_id}"),
    )?;
    Ok(())
}

/// `ctl trigger`.
pub(super) async fn trigger(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    kind: Kind,
) -> anyhow::Result<()> {
    let (k, name) = match kind {
        Kind::Ship => (proto::TriggerKind::Ship, "ship"),
        Kind::RestorePoint => (proto::TriggerKind::RestorePoint, "restore-point"),
        Kind::Retention => (proto::TriggerKind::Retention, "retention"),
    };
    let req = proto::TriggerRequest {
        store_id: store_id.clone(),
        kind: k as i32,
    };
    ctl.client
        .trigger(ctl.request(req, true))
        .await
        .map_err(|s| failed("Trigger", s))?;
    print(
        j,
        json!({"triggered": name, "store_id": store_id}),
        format!("triggered {name} on store {store_id}"),
    )?;
    Ok(())
}

/// `ctl pause`.
pub(super) async fn pause(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    reason: String,
    until_unix_ms: i64,
) -> anyhow::Result<()> {
    let req = proto::PauseRequest {
        store_id: store_id.clone(),
        reason,
        until_unix_ms,
    };
    let r = ctl
        .client
        .pause(ctl.request(req, true))
        .await
        .map_err(|s| failed("Pause", s))?
        .into_inner();
    print(
        j,
        json!({
            "store_id": store_id,
            "paused": true,
            "reason": r.reason,
            "until_unix_ms": r.until_unix_ms,
            "paused_at_unix_ms": r.paused_at_unix_ms,
            "was_paused": r.was_paused,
        }),
        format!(
            "{} store {store_id} until {}: {}",
            if r.was_paused { "re-paused" } else { "paused" },
            rfc3339_ms(r.until_unix_ms),
            r.reason
        ),
    )?;
    Ok(())
}

/// `ctl resume`.
pub(super) async fn resume(ctl: &mut Ctl, j: bool, store_id: String) -> anyhow::Result<()> {
    let req = proto::ResumeRequest {
        store_id: store_id.clone(),
    };
    let r = ctl
        .client
        .resume(ctl.request(req, true))
        .await
        .map_err(|s| failed("Resume", s))?
        .into_inner();
    print(
        j,
        json!({"store_id": store_id, "resumed": true, "was_paused": r.was_paused}),
        if r.was_paused {
            format!("resumed store {store_id}")
        } else {
            format!("store {store_id} was not paused")
        },
    )?;
    Ok(())
}

/// `ctl health`'s exit code when a store it shows is unhealthy (see the module docs).
pub const UNHEALTHY: u8 = 3;

/// `ctl health`: whether every store it shows is healthy.
pub(super) async fn health(
    ctl: &mut Ctl,
    j: bool,
    store_id: Option<String>,
) -> anyhow::Result<bool> {
    let r = ctl.health(store_id, false).await?;
    print(j, health_json(&r), health_text(&r))?;
    Ok(r.stores.iter().all(|s| s.healthy))
}

/// `ctl watch-health`.
pub(super) async fn watch_health(
    ctl: &mut Ctl,
    j: bool,
    store_id: Option<String>,
    count: Option<u64>,
) -> anyhow::Result<()> {
    let req = proto::HealthRequest {
        store_id: store_id.unwrap_or_default(),
        fresh: false,
    };
    let mut stream = ctl
        .client
        .watch_health(ctl.request(req, false))
        .await
        .map_err(|s| failed("WatchHealth", s))?
        .into_inner();
    let mut seen = 0u64;
    while count.is_none_or(|c| seen < c) {
        match stream.message().await {
            Ok(Some(r)) => {
                seen += 1;
                print(j, health_json(&r), format!("{}\n", health_text(&r)))?;
            }
            Ok(None) => break,
            Err(s) => return Err(failed("WatchHealth", s)),
        }
    }
    Ok(())
}

/// `ctl list-stores`.
pub(super) async fn list_stores(ctl: &mut Ctl, j: bool) -> anyhow::Result<()> {
    let r = ctl
        .client
        .list_stores(ctl.request(proto::ListStoresRequest {}, true))
        .await
        .map_err(|s| failed("ListStores", s))?
        .into_inner();
    let text = if r.stores.is_empty() {
        "no stores".to_string()
    } else {
        r.stores
            .iter()
            .map(|s| {
                format!(
                    "{}  {}  -> {}  (instance {}){}",
                    s.store_id,
                    s.store_dir,
                    s.destination,
                    s.instance_id,
                    super::moves::owner_text(&s.owner_instance_id, s.owner_since_unix_ms)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let stores: Vec<Value> = r.stores.iter().map(store_json).collect();
    print(j, json!({"stores": stores}), text)?;
    Ok(())
}

/// `ctl list-restore-points`.
pub(super) async fn list_restore_points(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    page_size: u32,
    page_token: Option<String>,
    all: bool,
) -> anyhow::Result<()> {
    let mut token = page_token.unwrap_or_default();
    let mut points = Vec::new();
    let next = loop {
        let req = proto::ListRestorePointsRequest {
            store_id: store_id.clone(),
            page_size,
            page_token: token.clone(),
        };
        let r = ctl
            .client
            .list_restore_points(ctl.request(req, true))
            .await
            .map_err(|s| failed("ListRestorePoints", s))?
            .into_inner();
        points.extend(r.restore_points);
        if !all || r.next_page_token.is_empty() {
            break r.next_page_token;
        }
        token = r.next_page_token;
    };
    let mut text: Vec<String> = points
        .iter()
        .map(|p| {
            format!(
                "commit {:>10}  generation {:>4}  {:>10} bytes  {}{}",
                p.commit_seq,
                p.generation,
                p.bytes,
                p.manifest_key,
                if p.is_latest { "  (LATEST)" } else { "" }
            )
        })
        .collect();
    if points.is_empty() {
        text.push("no restore points".into());
    }
    if !next.is_empty() {
        text.push(format!("more: --page-token {next}"));
    }
    let list: Vec<Value> = points.iter().map(restore_point_json).collect();
    print(
        j,
        json!({"restore_points": list, "next_page_token": next}),
        text.join("\n"),
    )?;
    Ok(())
}

/// `ctl adopt`.
pub(super) async fn adopt(
    ctl: &mut Ctl,
    j: bool,
    dir: String,
    destination: String,
    at: Option<u64>,
    store: StoreFlags,
) -> anyhow::Result<()> {
    let req = proto::AdoptRequest {
        store_dir: dir,
        destination,
        at_commit_seq: at.unwrap_or(0),
        at_time: String::new(),
        labels: store.labels(),
        options: store.options(),
        instance_id: String::new(),
    };
    let r = ctl
        .client
        .adopt(ctl.request(req, true))
        .await
        .map_err(|s| failed("Adopt", s))?
        .into_inner();
    print(
        j,
        json!({
            "store_id": r.store_id,
            "node_token": r.node_token,
            "commit_seq": r.commit_seq,
            "parent_manifest": r.parent_manifest,
        }),
        format!(
            "adopted store {} at commit {} (from {})\nnode token (shown once): {}",
            r.store_id, r.commit_seq, r.parent_manifest, r.node_token
        ),
    )?;
    Ok(())
}

/// `ctl branch`.
pub(super) async fn branch(
    ctl: &mut Ctl,
    j: bool,
    store_id: String,
    (at, at_time): (Option<u64>, Option<String>),
    destination: String,
    dir: Option<String>,
    store: StoreFlags,
) -> anyhow::Result<()> {
    let req = proto::BranchRequest {
        store_id,
        at_commit_seq: at.unwrap_or(0),
        at_time: at_time.unwrap_or_default(),
        destination: destination.clone(),
        store_dir: dir.unwrap_or_default(),
        labels: store.labels(),
        options: store.options(),
        instance_id: String::new(),
    };
    let r = ctl
        .client
        .branch(ctl.request(req, true))
        .await
        .map_err(|s| failed("Branch", s))?
        .into_inner();
    let mut text = format!(
        "branched at commit {} into {destination} (lineage {}, from {} of {}): {} requests, \
         {} bytes written",
        r.commit_seq, r.lineage, r.parent_manifest, r.holder, r.requests, r.bytes_written
    );
    if !r.store_id.is_empty() {
        text.push_str(&format!(
            "\nregistered store {}\nnode token (shown once): {}",
            r.store_id, r.node_token
        ));
    }
    print(
        j,
        json!({
            "commit_seq": r.commit_seq,
            "lineage": r.lineage,
            "parent_manifest": r.parent_manifest,
            "holder": r.holder,
            "requests": r.requests,
            "bytes_written": r.bytes_written,
            "store_id": r.store_id,
            "node_token": r.node_token,
        }),
        text,
    )?;
    Ok(())
}

/// `ctl register`, and `ctl standby` (`standby`: a standby of the destination).
pub(super) async fn register(
    ctl: &mut Ctl,
    j: bool,
    dir: String,
    destination: String,
    store: StoreFlags,
    standby: bool,
) -> anyhow::Result<()> {
    let mut options = store.options();
    if let Some(o) = options.as_mut() {
        o.standby = standby;
    }
    let req = proto::RegisterRequest {
        store_dir: dir,
        destination,
        labels: store.labels(),
        options,
        instance_id: String::new(),
    };
    let r = ctl
        .client
        .register(ctl.request(req, true))
        .await
        .map_err(|s| failed("Register", s))?
        .into_inner();
    print(
        j,
        json!({"store_id": r.store_id, "node_token": r.node_token}),
        format!(
            "registered {}store {}\nnode token (shown once): {}",
            if standby { "standby " } else { "" },
            r.store_id,
            r.node_token
        ),
    )?;
    Ok(())
}

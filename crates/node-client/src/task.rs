//! The client's one background task: it keeps a position stream open to the service, sends
//! the newest position (spaced by `min_report_interval`), answers the service's commands, and
//! reconnects with backoff until closed.

#[allow(unused_imports)]
use super::*;

impl Task {
    pub(super) async fn run(mut self) {
        let mut backoff = Backoff::new(self.config.first_backoff, self.config.max_backoff);
        loop {
            self.shared.set_state(ConnectionState::Connecting);
            match self.once().await {
                Ended::Closed => {
                    durable::lost(&self.shared.durable, "the client closed".into());
                    self.shared.set_state(ConnectionState::Closed);
                    return;
                }
                Ended::Permanent(e) => {
                    durable::lost(&self.shared.durable, e.to_string());
                    tracing::error!(error = %e, "the server refused the node; not reconnecting");
                    self.shared.set_error(e);
                    self.shared.set_state(ConnectionState::Failed);
                    return;
                }
                Ended::Retry { error, accepted } => {
                    if accepted {
                        durable::lost(&self.shared.durable, error.to_string());
                    }
                    if self.stop.is_cancelled() {
                        self.shared.set_state(ConnectionState::Closed);
                        return;
                    }
                    if accepted {
                        backoff.reset();
                    }
                    let delay = backoff.next_delay();
                    let attempt = backoff.attempts();
                    tracing::warn!(error = %error, retry_in = ?delay, "position stream down");
                    self.shared.set_error(error);
                    self.shared
                        .set_state(ConnectionState::Backoff { attempt, delay });
                    tokio::select! {
                        _ = self.stop.cancelled() => {
                            self.shared.set_state(ConnectionState::Closed);
                            return;
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// One connection: connect, open the stream, read commands until it ends.
    pub(super) async fn once(&mut self) -> Ended {
        let channel: Channel = tokio::select! {
            _ = self.stop.cancelled() => return Ended::Closed,
            c = self.endpoint.connect() => match c {
                Ok(c) => c,
                Err(e) => return Ended::Retry {
                    error: NodeClientError::Connect {
                        server: self.config.server.clone(),
                        detail: error_chain(&e),
                    },
                    accepted: false,
                },
            },
        };
        let mut client = BackupControlClient::new(channel);
        let mut request = tonic::Request::new(self.outbound());
        request
            .metadata_mut()
            .insert("authorization", self.auth.clone());
        // The server answers only after reading the first report (and checking the token), so
        // this waits for one; ending the outbound stream (close) ends the wait too.
        let response = match client.report_position(request).await {
            Ok(r) => r,
            Err(status) => return self.ended_by(status, false),
        };
        self.shared.set_state(ConnectionState::Connected);
        let mut commands = response.into_inner();
        let mut closing = false;
        loop {
            let next = if closing {
                match tokio::time::timeout(self.config.close_timeout, commands.message()).await {
                    Ok(m) => m,
                    Err(_) => return Ended::Closed,
                }
            } else {
                tokio::select! {
                    _ = self.stop.cancelled() => { closing = true; continue; }
                    m = commands.message() => m,
                }
            };
            match next {
                Ok(Some(cmd)) => self.command(cmd),
                Ok(None) if closing || self.stop.is_cancelled() => return Ended::Closed,
                Ok(None) => {
                    return Ended::Retry {
                        error: NodeClientError::Stream {
                            code: Code::Unavailable,
                            message: "the server ended the stream".into(),
                        },
                        accepted: true,
                    };
                }
                Err(status) => return self.ended_by(status, true),
            }
        }
    }

    pub(super) fn ended_by(&self, status: Status, accepted: bool) -> Ended {
        if self.stop.is_cancelled() {
            return Ended::Closed;
        }
        let code = status.code();
        let message = status.message().to_string();
        if permanent(code) {
            Ended::Permanent(NodeClientError::Rejected { code, message })
        } else {
            Ended::Retry {
                error: NodeClientError::Stream { code, message },
                accepted,
            }
        }
    }

    pub(super) fn command(&self, cmd: proto::NodeCommand) {
        match cmd.command {
            Some(proto::node_command::Command::Refresh(r)) => {
                tracing::debug!(reason = %r.reason, "the server asks for a refresh");
                if let Some(f) = &self.config.on_refresh {
                    f(&r.reason);
                }
                let _ = self
                    .shared
                    .refresh
                    .send(RefreshRequest { reason: r.reason });
            }
            Some(proto::node_command::Command::Durable(d)) => durable::acknowledged(
                &self.shared.durable,
                DurableAck {
                    commit_seq: d.commit_seq,
                    generation: d.generation,
                    named_by_restore_point: d.named_by_restore_point,
                },
            ),
            Some(proto::node_command::Command::DurabilityLost(l)) => {
                tracing::warn!(reason = %l.reason, "the service lost durability");
                durable::lost(&self.shared.durable, l.reason);
            }
            // A command of a newer server: ignored.
            None => {}
        }
    }

    /// The reports of one stream: the newest at once (if any), then every newer one, at most
    /// one per `min_report_interval`; ends (after the newest) when the client closes.
    pub(super) fn outbound(
        &self,
    ) -> impl futures_core::Stream<Item = proto::PositionReport> + Send + 'static + use<> {
        struct Out {
            rx: watch::Receiver<Newest>,
            first: bool,
            /// When the previous report was handed to the stream.
            last_sent: Option<tokio::time::Instant>,
            spacing: Duration,
            stop: CancellationToken,
            shared: Arc<Shared>,
            store_id: String,
        }
        impl Out {
            /// Waits out the spacing since the last report. Closing cuts it short (what is
            /// pending goes at once), and so does anyone waiting for an acknowledgement: the
            /// wait would pay the spacing on top of the service's PUT.
            async fn space(&self) {
                let Some(at) = self.last_sent else { return };
                let until = at + self.spacing;
                while !self.stop.is_cancelled()
                    && !durable::awaited(&self.shared)
                    && tokio::time::Instant::now() < until
                {
                    // A stale wake-up (the listener is gone) sleeps on.
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => {}
                        _ = self.stop.cancelled() => {}
                        _ = self.shared.urgent.notified() => {}
                    }
                }
            }
        }
        let out = Out {
            rx: self.newest.clone(),
            first: true,
            last_sent: None,
            spacing: self.config.min_report_interval,
            stop: self.stop.clone(),
            shared: self.shared.clone(),
            store_id: self.config.store_id.clone(),
        };
        futures_util::stream::unfold(out, |mut out| async move {
            loop {
                let value = if out.first {
                    out.first = false;
                    *out.rx.borrow_and_update()
                } else {
                    // The spacing first: while it runs nobody waits on the channel, so the
                    // engine's `report` wakes no one; positions reported meanwhile coalesce
                    // into the newest. Then the newest, after the rest of a spacing skipped
                    // for a listener that has gone since.
                    out.space().await;
                    tokio::select! {
                        biased;
                        changed = out.rx.changed() => if changed.is_err() { return None },
                        _ = out.stop.cancelled() => return None,
                    }
                    out.space().await;
                    *out.rx.borrow_and_update()
                };
                if let Some((seq, pos)) = value {
                    let report = position_report(&out.store_id, &pos);
                    out.last_sent = Some(tokio::time::Instant::now());
                    out.shared.progress.send_modify(|p| p.sent = seq);
                    return Some((report, out));
                }
            }
        })
    }
}

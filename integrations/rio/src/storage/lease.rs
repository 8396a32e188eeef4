//! A pushed member's lease: its heartbeats, and the health they give it (what fences the server).

use std::sync::Weak;

use cassandra_membership::{
    FailureCause, HeartbeatOutcome, MembershipEntry, SiloAddress, SiloHealth, SiloStatus, Timestamp,
};
use tracing::{debug, warn};

use super::Inner;
use crate::fence::FenceHorizon;

/// Ends the lease of `address` with a final `health`: the keeper stops, and the health stays
/// (fencing the server) until the endpoint is pushed again or removed.
pub(super) fn finish(inner: &Inner, address: SiloAddress, health: SiloHealth) {
    let ep = address.endpoint();
    let mut own = inner.own.lock().unwrap_or_else(|p| p.into_inner());
    if own.get(&ep).is_none_or(|o| o.address != address) {
        return; // another incarnation of this endpoint has been pushed since
    }
    if let Some(o) = own.remove(&ep) {
        o.keeper.abort();
    }
    // The final health fences from now on; no deadline to keep.
    serve_until(inner, ep, None);
    warn!(%address, ?health, "membership entry is final: no longer renewing its lease");
    inner.health.send_modify(|m| {
        m.insert(ep, health);
    });
}

/// Sets (or with `None` clears) the fence horizon of the member at `ep`, which
/// [`CassandraMembershipStorage::fenced`](super::CassandraMembershipStorage::fenced) compares with
/// the clock.
pub(super) fn serve_until(
    inner: &Inner,
    ep: std::net::SocketAddr,
    until: Option<tokio::time::Instant>,
) {
    let mut m = inner.serve_until.lock().unwrap_or_else(|p| p.into_inner());
    match until {
        Some(t) => m.insert(ep, t),
        None => m.remove(&ep),
    };
}

/// The first member at `now` that may not serve, with its health: one whose health says so, or
/// whose fence horizon has passed although its keeper has not run since (a process resumed
/// after a pause): `LeaseAtRisk` then.
pub(super) fn fenced(
    inner: &Inner,
    now: tokio::time::Instant,
) -> Option<(std::net::SocketAddr, SiloHealth)> {
    let serve_until = inner
        .serve_until
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    inner.health.borrow().iter().find_map(|(ep, h)| {
        if !h.should_serve() {
            return Some((*ep, h.clone()));
        }
        let past = serve_until.get(ep).is_some_and(|until| now >= *until);
        past.then(|| {
            let (lease, failures, cause) = match h {
                SiloHealth::Healthy { lease } => (Some(*lease), 0, None),
                SiloHealth::Failing {
                    lease,
                    failures,
                    cause,
                    ..
                } => (*lease, *failures, Some(*cause)),
                _ => (None, 0, None),
            };
            (
                *ep,
                SiloHealth::LeaseAtRisk {
                    lease,
                    failures,
                    cause: cause.or(Some(FailureCause::Outage)),
                },
            )
        })
    })
}

/// Sets a non-final health of `address`, unless it is no longer this value's member there.
fn report(inner: &Inner, address: SiloAddress, health: SiloHealth) {
    let ep = address.endpoint();
    let own = inner.own.lock().unwrap_or_else(|p| p.into_inner());
    if own.get(&ep).is_none_or(|o| o.address != address) {
        return;
    }
    inner.health.send_if_modified(|m| {
        let changed = m.get(&ep) != Some(&health);
        if changed {
            if matches!(health, SiloHealth::LeaseAtRisk { .. }) {
                warn!(%address, ?health, "lease at risk: serving no object until healthy");
            }
            m.insert(ep, health);
        }
        changed
    });
}

/// Publishes `address`'s I-am-alive every heartbeat period while a clone of the storage lives,
/// and reports the member's health ([`FenceHorizon`]): Healthy after each heartbeat, Failing
/// while they fail, LeaseAtRisk past the horizon (confirmed live by reading the own row before
/// it is Healthy again), final when the entry is Dead or missing.
pub(super) async fn keep_lease(
    inner: Weak<Inner>,
    address: SiloAddress,
    published: tokio::time::Instant,
) {
    let (period, gone_after) = match inner.upgrade() {
        Some(i) => (i.options.heartbeat_period, i.options.gone_after()),
        None => return,
    };
    let mut fence = FenceHorizon::new(published, period, gone_after);
    if let Some(i) = inner.upgrade() {
        serve_until(&i, address.endpoint(), Some(fence.horizon()));
    }
    // Heartbeats start one period apart (from the previous start), each bounded by half a
    // period: a healthy one always lands before the fence horizon.
    let mut next = published + period;
    let mut failures = 0u32;
    let mut cause: Option<FailureCause> = None;
    let mut lease = None;
    let mut at_risk = false;
    loop {
        let wake = if at_risk {
            next
        } else {
            next.min(fence.horizon())
        };
        tokio::time::sleep_until(wake).await;
        let Some(inner) = inner.upgrade() else { return };
        let now = tokio::time::Instant::now();
        if now < next {
            // Woken by the horizon, not by a heartbeat.
            if fence.at_risk(now) {
                at_risk = true;
                // Nothing failed yet: the heartbeat is late, as in an outage.
                let cause = cause.or(Some(FailureCause::Outage));
                report(
                    &inner,
                    address,
                    SiloHealth::LeaseAtRisk {
                        lease,
                        failures,
                        cause,
                    },
                );
            }
            continue;
        }
        let started = now;
        let wall = Timestamp::now();
        let beat =
            tokio::time::timeout(period / 2, inner.table.update_i_am_alive(&address, wall)).await;
        let error = match beat {
            Ok(Ok(HeartbeatOutcome::Refreshed { lease: l })) => {
                // No I-am-alive stored for longer than `gone_after` until this one landed: the
                // others may have taken the server for gone and re-placed its objects, which its
                // registry still holds. It must not serve again (MAPPING.md: no rejoin in place).
                let silent = tokio::time::Instant::now().duration_since(fence.last_published());
                if silent > gone_after {
                    warn!(%address, ?silent, ?gone_after, "no I-am-alive stored for longer than gone_after: the server may have been taken for gone");
                    return finish(&inner, address, SiloHealth::EntryMissing);
                }
                if at_risk {
                    // The others may have declared it dead meanwhile, which a Cassandra
                    // heartbeat between lease renewals does not see.
                    match inner.table.read_row(&address).await {
                        Ok(r) if r.rows.is_empty() => {
                            return finish(&inner, address, SiloHealth::EntryMissing);
                        }
                        Ok(r) if r.rows[0].entry.status == SiloStatus::Dead => {
                            return finish(&inner, address, SiloHealth::DeclaredDead);
                        }
                        Ok(_) => at_risk = false,
                        Err(e) => {
                            next = tokio::time::Instant::now() + period / 4;
                            debug!(%address, error = %e, "own row unreadable after a fence");
                            continue;
                        }
                    }
                }
                let refresh_by = l.refresh_by.map(|r| started + r.duration_since(wall));
                fence.published(started, refresh_by);
                serve_until(&inner, address.endpoint(), Some(fence.horizon()));
                failures = 0;
                cause = None;
                lease = Some(l);
                report(&inner, address, SiloHealth::Healthy { lease: l });
                next = started + period;
                continue;
            }
            Ok(Ok(HeartbeatOutcome::DeclaredDead { .. })) => {
                return finish(&inner, address, SiloHealth::DeclaredDead);
            }
            Ok(Ok(HeartbeatOutcome::NotFound)) => {
                return finish(&inner, address, SiloHealth::EntryMissing);
            }
            Ok(Err(e)) => {
                cause = Some(FailureCause::of(&e));
                e.to_string()
            }
            Err(_) => {
                cause = Some(FailureCause::Outage);
                format!("no answer within {:?}", period / 2)
            }
        };
        failures = failures.saturating_add(1);
        warn!(%address, error, failures, "heartbeat failed");
        let now = tokio::time::Instant::now();
        let health = if fence.at_risk(now) {
            at_risk = true;
            SiloHealth::LeaseAtRisk {
                lease,
                failures,
                cause,
            }
        } else {
            SiloHealth::Failing {
                failures,
                lease,
                last_error: error,
                cause: cause.unwrap_or(FailureCause::Other),
            }
        };
        report(&inner, address, health);
        // A missed heartbeat is retried sooner; the lease has room for several.
        next = now + period / 4;
    }
}

impl super::CassandraMembershipStorage {
    /// rio lists the members every round of its provider: that read also tells this process
    /// whether the members it pushed were declared Dead (a peer's `remove`, a restart at the
    /// same address) or lost their entry, which a Cassandra heartbeat between two lease
    /// renewals does not see. A row missing from the snapshot is confirmed by reading it.
    pub(super) async fn check_own_rows(&self, entries: &[MembershipEntry]) {
        let own: Vec<SiloAddress> = self.own().values().map(|o| o.address).collect();
        for address in own {
            let health = match entries.iter().find(|e| e.address == address) {
                Some(entry) if entry.status == SiloStatus::Dead => SiloHealth::DeclaredDead,
                Some(_) => continue,
                None => match self.inner.table.read_row(&address).await {
                    Ok(read) if read.rows.is_empty() => SiloHealth::EntryMissing,
                    Ok(read) if read.rows[0].entry.status == SiloStatus::Dead => {
                        SiloHealth::DeclaredDead
                    }
                    // Live, or unknown: the heartbeat decides.
                    _ => continue,
                },
            };
            finish(&self.inner, address, health);
        }
    }
}

//! The versioned membership-protocol steps a host needs: joining, declaring silent silos dead,
//! and leaving gracefully. Each is a read → conditional write loop that retries version conflicts.

use std::time::Duration;

use tracing::{debug, info};

use crate::error::{MembershipError, Result};
use crate::model::{MembershipEntry, SiloAddress, SiloStatus, SuspectTime, Timestamp};
use crate::options::MembershipOptions;
use crate::runtime::observe;
use crate::table::MembershipTable;

/// How many read → write rounds a protocol step tries before giving up.
const MAX_ROUNDS: u32 = 50;

async fn pause(round: u32) {
    // Short, growing, jittered pauses: concurrent writers spread out instead of colliding again.
    let ms = 5u64.saturating_mul(1 << round.min(6)) + rand::random_range(0..10);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Inserts `entry` (retrying version conflicts). Errors if the address already has a row of
/// another incarnation (another start time) or a Dead one. Retrying after `OutcomeUnknown` is
/// safe: a row of this very incarnation is recognised as the earlier attempt's insert.
pub async fn join(table: &dyn MembershipTable, entry: &MembershipEntry) -> Result<()> {
    for round in 0..MAX_ROUNDS {
        let snapshot = table.read_all().await?;
        if let Some(row) = snapshot.get(&entry.address) {
            // Our own incarnation (same address, generation and start time): an earlier attempt
            // whose outcome was unknown had inserted it. Continue, unless it was declared Dead.
            if row.entry.start_time == entry.start_time && row.entry.status != SiloStatus::Dead {
                info!(cluster = table.cluster_id(), silo = %entry.address, "joined (an earlier attempt had inserted the entry)");
                return Ok(());
            }
            return Err(MembershipError::config(
                "entry.address",
                format!(
                    "{} already has an entry: a silo incarnation joins once",
                    entry.address
                ),
            ));
        }
        if table.insert_row(entry, &snapshot.version.next()).await? {
            info!(cluster = table.cluster_id(), silo = %entry.address, status = ?entry.status, "joined");
            return Ok(());
        }
        observe::conflict();
        pause(round).await;
    }
    Err(contention("join"))
}

/// Moves `address`'s entry to `status` (with the I-am-alive time `now`), retrying version
/// conflicts. Returns `false` if the entry is missing or already Dead (a Dead entry never revives).
pub async fn set_status(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    status: SiloStatus,
    now: Timestamp,
) -> Result<bool> {
    for round in 0..MAX_ROUNDS {
        let snapshot = table.read_row(address).await?;
        let Some(row) = snapshot.rows.first() else {
            return Ok(false);
        };
        if row.entry.status == SiloStatus::Dead {
            return Ok(status == SiloStatus::Dead);
        }
        let mut entry = row.entry.clone();
        entry.status = status;
        entry.i_am_alive_time = entry.i_am_alive_time.max(now);
        if table
            .update_row(&entry, &row.etag, &snapshot.version.next())
            .await?
        {
            info!(cluster = table.cluster_id(), silo = %address, ?status, "status changed");
            return Ok(true);
        }
        observe::conflict();
        pause(round).await;
    }
    Err(contention("set_status"))
}

/// Graceful leave: ShuttingDown, then Dead, each through the versioned protocol, so the other
/// silos see this one left rather than crashed.
pub async fn leave(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    now: Timestamp,
) -> Result<()> {
    if set_status(table, address, SiloStatus::ShuttingDown, now).await? {
        set_status(table, address, SiloStatus::Dead, now).await?;
    }
    Ok(())
}

/// One round of failure detection from `me`'s point of view, in the style of Orleans' table-based
/// detector: every other Active silo whose I-am-alive time is older than
/// `publish period × missed limit` gets `me`'s suspicion; once it has
/// `num_votes_for_death_declaration` fresh votes it is declared Dead. Returns the silos this
/// round declared dead.
pub async fn declare_silent_silos_dead(
    table: &dyn MembershipTable,
    me: &SiloAddress,
    options: &MembershipOptions,
    now: Timestamp,
) -> Result<Vec<SiloAddress>> {
    let silence = options
        .i_am_alive_table_publish_timeout
        .saturating_mul(options.num_missed_table_i_am_alive_limit);
    let mut declared = Vec::new();
    let snapshot = table.read_all().await?;
    for row in &snapshot.rows {
        let e = &row.entry;
        if &e.address == me
            || e.status != SiloStatus::Active
            || e.i_am_alive_time.saturating_add(silence) > now
        {
            continue;
        }
        let mut entry = e.clone();
        // Keep only fresh votes, one per voter, and add ours.
        let fresh = now.saturating_sub(options.death_vote_expiration_timeout);
        entry
            .suspect_times
            .retain(|s| s.time >= fresh && &s.suspecting_silo != me);
        entry.suspect_times.push(SuspectTime {
            suspecting_silo: *me,
            time: now,
        });
        let mut voters: Vec<_> = entry
            .suspect_times
            .iter()
            .map(|s| s.suspecting_silo)
            .collect();
        voters.sort();
        voters.dedup();
        if voters.len() as u32 >= options.num_votes_for_death_declaration {
            entry.status = SiloStatus::Dead;
        }
        // One attempt per round: on a conflict the next round re-reads and votes again.
        let current = table.read_all().await?;
        let Some(now_row) = current.get(&e.address) else {
            continue;
        };
        if now_row.etag != row.etag {
            continue;
        }
        if table
            .update_row(&entry, &row.etag, &current.version.next())
            .await?
        {
            if entry.status == SiloStatus::Dead {
                info!(cluster = table.cluster_id(), silo = %e.address, by = %me, "declared dead after missed heartbeats");
                declared.push(e.address);
            } else {
                debug!(cluster = table.cluster_id(), silo = %e.address, by = %me, "suspected");
            }
        } else {
            observe::conflict();
        }
    }
    Ok(declared)
}

fn contention(operation: &'static str) -> MembershipError {
    MembershipError::Contention {
        operation,
        attempts: MAX_ROUNDS,
        elapsed: Duration::ZERO,
    }
}

//! The guarantees checked where a write lands (deaths, votes, versions), and the names the
//! history gives silos (`s3#2`: the silo at 10.0.0.3, its second generation).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::Invariant;
use super::storage::{EPOCH_MS, World};
use crate::model::{MembershipSnapshot, SiloAddress, SiloStatus, Timestamp};

/// The short name of a simulated silo.
pub(super) fn name(a: &SiloAddress) -> String {
    let host = match a.endpoint().ip() {
        IpAddr::V4(ip) => ip.octets()[3].to_string(),
        IpAddr::V6(ip) => ip.to_string(),
    };
    format!("s{host}#{}", a.generation())
}

fn statuses(s: &MembershipSnapshot) -> BTreeMap<SiloAddress, SiloStatus> {
    s.rows
        .iter()
        .map(|r| (r.entry.address, r.entry.status))
        .collect()
}

/// A write of `writer`'s (sent at `sent`, its clock `skew_ms` off) changed the table from
/// `before` to `after`: records what landed and checks the deaths it wrote.
pub(super) fn landed(
    world: &World,
    writer: SiloAddress,
    skew_ms: i64,
    sent: Duration,
    before: &MembershipSnapshot,
    after: &MembershipSnapshot,
) {
    let now = world.now();
    let mine = after.get(&writer);
    let moved = mine.map(|r| &r.etag) != before.get(&writer).map(|r| &r.etag);
    if let Some(row) = mine.filter(|r| moved && r.entry.status != SiloStatus::Dead) {
        // What the others judge it by: the I-am-alive time stored, on the simulation's time
        // line (its clock's skew taken off) — a rewrite of an old time publishes nothing new.
        let stamped_ms = row.entry.i_am_alive_time.as_millis() - EPOCH_MS - skew_ms;
        let stamped = Duration::from_millis(u64::try_from(stamped_ms).unwrap_or(0));
        let mut st = world.state();
        let last = st.landed.entry(writer).or_default();
        *last = (*last).max(stamped);
    }
    if after.version.version != before.version.version {
        let changes: Vec<String> = after
            .rows
            .iter()
            .filter_map(|r| {
                let was = before.get(&r.entry.address).map(|b| &b.entry);
                let (who, e) = (name(&r.entry.address), &r.entry);
                match was {
                    Some(b) if b.status != e.status => Some(format!("{who} {:?}", e.status)),
                    Some(b) if b.suspect_times != e.suspect_times => {
                        let voters: Vec<String> = e
                            .suspect_times
                            .iter()
                            .map(|s| name(&s.suspecting_silo))
                            .collect();
                        Some(format!("{who} suspected by {}", voters.join(",")))
                    }
                    Some(_) => None,
                    None => Some(format!("{who} {:?} (new)", e.status)),
                }
            })
            .collect();
        let by = if world.state().by_operator.contains(&writer)
            && after.get(&writer).map(|r| r.entry.status) == Some(SiloStatus::Dead)
        {
            "an operator".to_owned()
        } else {
            name(&writer)
        };
        world.log(format_args!(
            "v{} by {by}: {}",
            after.version.version,
            changes.join(", ")
        ));
        world
            .state()
            .versions
            .insert(after.version.version, statuses(after));
    }
    for row in &after.rows {
        let e = &row.entry;
        let was = before.get(&e.address).map(|r| r.entry.status);
        if e.status != SiloStatus::Dead || was == Some(SiloStatus::Dead) {
            continue;
        }
        world.state().deaths.insert(e.address, now);
        if e.address == writer || world.state().by_operator.contains(&e.address) {
            world.log(format_args!(
                "{} Dead (by itself or an operator)",
                name(&e.address)
            ));
            continue;
        }
        let voters: Vec<String> = e
            .suspect_times
            .iter()
            .map(|s| name(&s.suspecting_silo))
            .collect();
        world.log(format_args!(
            "{} declared Dead by {} (votes {})",
            name(&e.address),
            name(&writer),
            voters.join(",")
        ));
        silence(world, &e.address, now);
        votes(world, writer, skew_ms, sent, before, e);
        fence_at_death(world, &e.address);
    }
}

/// [`Invariant::NoLiveSiloDeclaredDead`]: the I-am-alive time the dead silo last stored (taken
/// on the simulation's time line) is a detection horizon (less twice the skew) before its death,
/// or earlier.
fn silence(world: &World, dead: &SiloAddress, now: Duration) {
    let horizon = world.options.detection_horizon();
    let Some(last) = world.state().landed.get(dead).copied() else {
        return;
    };
    let silent = now.saturating_sub(last);
    if silent + world.skew_bound * 2 < horizon {
        world.violated(
            Invariant::NoLiveSiloDeclaredDead,
            format!(
                "{} declared Dead {:.3}s after the I-am-alive time it last stored (horizon {:?})",
                name(dead),
                silent.as_secs_f64(),
                horizon
            ),
        );
    }
}

/// [`Invariant::DeathOnCountedVotes`]: the votes a death is written on.
fn votes(
    world: &World,
    writer: SiloAddress,
    skew_ms: i64,
    sent: Duration,
    before: &MembershipSnapshot,
    dead: &crate::model::MembershipEntry,
) {
    let o = &world.options;
    // The writer's clock when it sent the write.
    let sent_ms = i64::try_from(sent.as_millis()).unwrap_or(i64::MAX);
    // A vote is stamped just before its write is sent (after its re-read): 5 ms for rounding.
    let call_ms = 5;
    let life_ms =
        i64::try_from(o.effective_death_vote_expiration_timeout().as_millis()).unwrap_or(0);
    let oldest = Timestamp::from_millis(EPOCH_MS + sent_ms + skew_ms - call_ms - life_ms);
    let mut counted: Vec<SiloAddress> = Vec::new();
    for vote in &dead.suspect_times {
        let voter = vote.suspecting_silo;
        let standing = before
            .get(&voter)
            .map(|r| r.entry.status)
            .filter(|s| *s != SiloStatus::Dead);
        let problem = if standing.is_none() {
            Some("Dead or without a row at the version written on")
        } else if vote.time < oldest {
            Some("older than the vote lifetime")
        } else {
            None
        };
        match problem {
            Some(why) => world.violated(
                Invariant::DeathOnCountedVotes,
                format!(
                    "{} declared Dead by {} counting the vote of {}: {why}",
                    name(&dead.address),
                    name(&writer),
                    name(&voter)
                ),
            ),
            None => counted.push(voter),
        }
    }
    counted.sort();
    counted.dedup();
    if (counted.len() as u32) < o.num_votes_for_death_declaration {
        world.violated(
            Invariant::DeathOnCountedVotes,
            format!(
                "{} declared Dead by {} on {} vote(s) that count",
                name(&dead.address),
                name(&writer),
                counted.len()
            ),
        );
    }
}

/// [`Invariant::NoServingAfterDeath`], at the instant the death lands.
fn fence_at_death(world: &World, dead: &SiloAddress) {
    if world.state().by_operator.contains(dead) {
        // Unseen by the silo until it reads its row: `FenceBound`'s own-row part applies.
        return;
    }
    let serves = world
        .state()
        .fences
        .get(dead)
        .is_some_and(crate::runtime::health::Fence::should_serve);
    if serves {
        world.violated(
            Invariant::NoServingAfterDeath,
            format!(
                "{} answers should_serve() == true as its death lands",
                name(dead)
            ),
        );
    }
}

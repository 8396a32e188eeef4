//! rio's model onto the membership table's, as pure functions of a snapshot and "now".

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cassandra_membership::{
    MembershipEntry, MembershipRow, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp,
};
use chrono::{DateTime, Utc};
use rio_rs::cluster::storage::Member;
use rio_rs::errors::MembershipError as RioError;

/// 2022-01-01T00:00:00Z: generations count seconds from here (`SiloAddress::generation_at`).
#[cfg(test)]
const GENERATION_EPOCH_MILLIS: i64 = 1_640_995_200_000;

/// rio names a member by an ip text and a port text; the table by a socket address.
pub(crate) fn endpoint(ip: &str, port: &str) -> Result<SocketAddr, RioError> {
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| RioError::Unknown(format!("member ip {ip:?} is not an IP address")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| RioError::Unknown(format!("member port {port:?} is not a port number")))?;
    Ok(SocketAddr::new(ip, port))
}

/// rio's active flag as a status: active is Active; inactive is Joining, the one status that is
/// neither Active nor final (ShuttingDown, Stopping and Dead only lead to Dead), because rio
/// flips a member back to active when it answers again.
pub(crate) fn status_for(active: bool) -> SiloStatus {
    if active {
        SiloStatus::Active
    } else {
        SiloStatus::Joining
    }
}

/// The generation of a new incarnation at `endpoint`: seconds since 2022, and above every
/// generation the snapshot holds for that endpoint, so a restart within a second is still new.
pub(crate) fn next_generation(
    snapshot: &MembershipSnapshot,
    endpoint: SocketAddr,
    now: Timestamp,
) -> i32 {
    let by_clock = SiloAddress::generation_at(now);
    snapshot
        .rows
        .iter()
        .map(|r| r.entry.address)
        .filter(|a| a.endpoint() == endpoint)
        .map(|a| a.generation().saturating_add(1))
        .fold(by_clock, i32::max)
}

/// True when the entry's own I-am-alive (the later of its row and its heartbeats, as a read
/// reports it) is older than `gone_after`: the process that kept it has stopped.
pub(crate) fn is_gone(entry: &MembershipEntry, now: Timestamp, gone_after: Duration) -> bool {
    now.duration_since(entry.i_am_alive_time.max(entry.start_time)) > gone_after
}

/// The incarnation rio means by `endpoint`: the newest generation that is neither Dead nor gone.
pub(crate) fn live_row(
    snapshot: &MembershipSnapshot,
    endpoint: SocketAddr,
    now: Timestamp,
    gone_after: Duration,
) -> Option<&MembershipRow> {
    let entry = live_entry(
        snapshot.rows.iter().map(|r| &r.entry),
        endpoint,
        now,
        gone_after,
    )?;
    snapshot.get(&entry.address)
}

/// [`live_row`] among entries (a cluster view's).
pub(crate) fn live_entry<'a>(
    entries: impl Iterator<Item = &'a MembershipEntry>,
    endpoint: SocketAddr,
    now: Timestamp,
    gone_after: Duration,
) -> Option<&'a MembershipEntry> {
    entries
        .filter(|e| e.address.endpoint() == endpoint)
        .filter(|e| e.status != SiloStatus::Dead && !is_gone(e, now, gone_after))
        .max_by_key(|e| e.address.generation())
}

/// Older incarnations at `endpoint` that are not Dead yet (a push declares them Dead).
pub(crate) fn older_incarnations(
    snapshot: &MembershipSnapshot,
    current: SiloAddress,
) -> Vec<MembershipRow> {
    snapshot
        .rows
        .iter()
        .filter(|r| r.entry.address.endpoint() == current.endpoint())
        .filter(|r| r.entry.address.generation() < current.generation())
        .filter(|r| r.entry.status != SiloStatus::Dead)
        .cloned()
        .collect()
}

/// What rio sees: one member per endpoint (its live incarnation), in address order.
pub(crate) fn members(
    entries: &[MembershipEntry],
    now: Timestamp,
    gone_after: Duration,
) -> Vec<Member> {
    let mut endpoints: Vec<SocketAddr> = entries.iter().map(|e| e.address.endpoint()).collect();
    endpoints.sort();
    endpoints.dedup();
    endpoints
        .into_iter()
        .filter_map(|ep| live_entry(entries.iter(), ep, now, gone_after))
        .map(to_member)
        .collect()
}

/// rio's `Member` from an entry. rio lets code outside its crate set `last_seen` only to "now"
/// (`Member::set_last_seen`), so a listed member is seen now: it is listed only while its
/// heartbeats are fresh.
pub(crate) fn to_member(entry: &MembershipEntry) -> Member {
    let ep = entry.address.endpoint();
    let mut m = Member::new(ep.ip().to_string(), ep.port().to_string());
    m.set_active(entry.status == SiloStatus::Active);
    m.set_last_seen();
    m
}

/// A table time as rio's time.
pub(crate) fn to_utc(t: Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.as_millis()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cassandra_membership::{ETag, TableVersion};

    const SEC: Duration = Duration::from_secs(1);

    fn entries_of(s: &MembershipSnapshot) -> Vec<MembershipEntry> {
        s.rows.iter().map(|r| r.entry.clone()).collect()
    }

    fn row(text: &str, status: SiloStatus, alive_ms: i64) -> MembershipRow {
        let mut entry = MembershipEntry::new(
            text.parse().unwrap(),
            status,
            Timestamp::from_millis(alive_ms),
        );
        entry.i_am_alive_time = Timestamp::from_millis(alive_ms);
        MembershipRow {
            entry,
            etag: ETag::random(),
        }
    }

    fn snapshot(rows: Vec<MembershipRow>) -> MembershipSnapshot {
        MembershipSnapshot {
            rows,
            version: TableVersion::absent(),
        }
    }

    #[test]
    fn rio_addresses_parse_or_name_the_bad_part() {
        assert_eq!(
            endpoint("127.0.0.1", "5000").unwrap(),
            "127.0.0.1:5000".parse().unwrap()
        );
        assert_eq!(
            endpoint("::1", "5000").unwrap(),
            "[::1]:5000".parse().unwrap()
        );
        assert!(
            matches!(endpoint("localhost", "1"), Err(RioError::Unknown(m)) if m.contains("ip"))
        );
        assert!(
            matches!(endpoint("0.0.0.0", "-1"), Err(RioError::Unknown(m)) if m.contains("port"))
        );
    }

    #[test]
    fn a_restart_within_the_same_second_gets_a_newer_generation() {
        let now = Timestamp::from_millis(GENERATION_EPOCH_MILLIS + 10_500);
        let ep: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        assert_eq!(next_generation(&snapshot(vec![]), ep, now), 10);
        let s = snapshot(vec![
            row("10.0.0.1:5000@10", SiloStatus::Active, 0),
            row("10.0.0.2:5000@99", SiloStatus::Active, 0),
        ]);
        assert_eq!(next_generation(&s, ep, now), 11);
    }

    #[test]
    fn rio_sees_one_member_per_endpoint_and_never_dead_or_gone_ones() {
        let now = Timestamp::from_millis(100_000);
        let s = snapshot(vec![
            row("10.0.0.1:5000@1", SiloStatus::Active, 99_000), // older incarnation, not yet Dead
            row("10.0.0.1:5000@2", SiloStatus::Joining, 99_500), // the live one
            row("10.0.0.2:5000@1", SiloStatus::Dead, 99_900),   // left
            row("10.0.0.3:5000@1", SiloStatus::Active, 96_000), // stopped heartbeating 4 s ago
        ]);
        let m = members(&entries_of(&s), now, 3 * SEC);
        assert_eq!(m.len(), 1);
        assert_eq!(
            (m[0].ip(), m[0].port(), m[0].active()),
            ("10.0.0.1", "5000", false)
        );
        let ep = "10.0.0.1:5000".parse().unwrap();
        assert_eq!(
            live_row(&s, ep, now, 3 * SEC)
                .unwrap()
                .entry
                .address
                .generation(),
            2
        );
        let current: SiloAddress = "10.0.0.1:5000@2".parse().unwrap();
        assert_eq!(older_incarnations(&s, current).len(), 1);
    }

    #[test]
    fn gone_counts_from_the_latest_sign_of_life() {
        let e = row("10.0.0.1:1@1", SiloStatus::Active, 10_000).entry;
        assert!(!is_gone(&e, Timestamp::from_millis(13_000), 3 * SEC));
        assert!(is_gone(&e, Timestamp::from_millis(13_001), 3 * SEC));
    }

    #[test]
    fn times_convert_at_millisecond_precision() {
        assert_eq!(
            to_utc(Timestamp::from_millis(1_700_000_000_123)).timestamp_millis(),
            1_700_000_000_123
        );
    }
}

//! `GET /members`: the silo's membership view ([`ClusterView`]) as JSON. The field names are
//! part of the service's interface (a dashboard or a script reads them) and stay as documented:
//!
//! | field | meaning |
//! |---|---|
//! | `version` | the table version the view was read at (never goes backwards) |
//! | `read_at` | when that read was sent (RFC 3339, the silo's clock) |
//! | `age_ms` | how old the read is now, in milliseconds |
//! | `stale` | `null` while reads succeed; else `{ since, failed_refreshes, cause, last_error }` |
//! | `ended` | `false` while the silo runs; `true` once it is leaving or was stopped: the view is its last, no longer refreshed (`stale` does not say so) |
//! | `members` | every entry, ordered by address: `address` (`ip:port@generation`), `endpoint`, `generation`, `status` (`Joining`, `Active`, `ShuttingDown`, `Dead`, …), `silo_name`, `host_name`, `start_time`, `i_am_alive_time`, `suspicions` |
//!
//! 503 `{"error": …}` while the silo has not joined (no view yet).

use cassandra_membership::{ClusterView, MembershipEntry, Timestamp};
use serde::Serialize;

/// The JSON body of `GET /members`.
#[derive(Debug, Serialize)]
pub(crate) struct Members {
    version: u64,
    read_at: String,
    age_ms: u128,
    stale: Option<Stale>,
    ended: bool,
    members: Vec<Member>,
}

/// Why the view is no longer refreshed.
#[derive(Debug, Serialize)]
struct Stale {
    since: String,
    failed_refreshes: u32,
    cause: String,
    last_error: String,
}

/// One entry of the view.
#[derive(Debug, Serialize)]
struct Member {
    address: String,
    endpoint: String,
    generation: i32,
    status: String,
    silo_name: String,
    host_name: String,
    start_time: String,
    i_am_alive_time: String,
    suspicions: usize,
}

impl Members {
    /// `view` as read, its age counted to `now`; `ended` once the silo no longer refreshes it.
    pub(crate) fn of(view: &ClusterView, now: Timestamp, ended: bool) -> Members {
        Members {
            version: view.version().version,
            read_at: view.read_at().to_string(),
            age_ms: view.age(now).as_millis(),
            stale: view.stale().map(|s| Stale {
                since: s.since.to_string(),
                failed_refreshes: s.failed_refreshes,
                cause: format!("{:?}", s.cause),
                last_error: s.last_error.clone(),
            }),
            ended,
            members: view.entries().iter().map(Member::of).collect(),
        }
    }
}

impl Member {
    fn of(e: &MembershipEntry) -> Member {
        Member {
            address: e.address.to_string(),
            endpoint: e.address.endpoint().to_string(),
            generation: e.address.generation(),
            status: format!("{:?}", e.status),
            silo_name: e.silo_name.clone(),
            host_name: e.host_name.clone(),
            start_time: e.start_time.to_string(),
            i_am_alive_time: e.i_am_alive_time.to_string(),
            suspicions: e.suspect_times.len(),
        }
    }
}

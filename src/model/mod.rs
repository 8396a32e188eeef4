//! The membership model: silo addresses, statuses, entries, table versions and read snapshots,
//! faithful to the Orleans membership protocol.

mod address;
mod time;

pub use address::SiloAddress;
pub use time::Timestamp;

use std::fmt;

use serde::{Deserialize, Serialize};

/// A silo's status in the membership protocol. The numbers are Orleans' own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SiloStatus {
    /// No status (never stored by the protocol itself).
    None = 0,
    /// Created, not yet joining.
    Created = 1,
    /// Joining the cluster.
    Joining = 2,
    /// A full member.
    Active = 3,
    /// Leaving gracefully.
    ShuttingDown = 4,
    /// Stopping.
    Stopping = 5,
    /// Dead: declared by others or after a graceful leave. Never revives.
    Dead = 6,
}

impl SiloStatus {
    /// Every status, in protocol order.
    pub const ALL: [SiloStatus; 7] = [
        SiloStatus::None,
        SiloStatus::Created,
        SiloStatus::Joining,
        SiloStatus::Active,
        SiloStatus::ShuttingDown,
        SiloStatus::Stopping,
        SiloStatus::Dead,
    ];

    /// The stored number.
    pub const fn code(self) -> i32 {
        self as i32
    }

    /// The status a stored number means, if any.
    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.code() == code)
    }
}

/// One suspicion: which silo suspected this one, and when.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SuspectTime {
    /// The silo that voted.
    pub suspecting_silo: SiloAddress,
    /// When it voted.
    pub time: Timestamp,
}

/// One row of the membership table: everything the protocol knows about a silo incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipEntry {
    /// The silo incarnation this row describes (the row's key).
    pub address: SiloAddress,
    /// Its status.
    pub status: SiloStatus,
    /// Suspicions raised against it, oldest first.
    pub suspect_times: Vec<SuspectTime>,
    /// The gateway (proxy) port; 0 when the silo has none.
    pub proxy_port: u16,
    /// The host's name.
    pub host_name: String,
    /// The silo's name.
    pub silo_name: String,
    /// The silo's role name.
    pub role_name: String,
    /// Update zone.
    pub update_zone: i32,
    /// Fault zone.
    pub fault_zone: i32,
    /// When the silo started.
    pub start_time: Timestamp,
    /// The last "I am alive" time the silo published.
    pub i_am_alive_time: Timestamp,
}

impl MembershipEntry {
    /// A new entry with the given status; names empty, zones 0, both times `now`.
    pub fn new(address: SiloAddress, status: SiloStatus, now: Timestamp) -> Self {
        MembershipEntry {
            address,
            status,
            suspect_times: Vec::new(),
            proxy_port: 0,
            host_name: String::new(),
            silo_name: String::new(),
            role_name: String::new(),
            update_zone: 0,
            fault_zone: 0,
            start_time: now,
            i_am_alive_time: now,
        }
    }

    /// The latest sign of life the table holds for this entry: the latest of its start time,
    /// its I-am-alive time and its latest suspicion. Defunct cleanup compares this with its cutoff.
    pub fn last_activity(&self) -> Timestamp {
        self.suspect_times
            .iter()
            .map(|s| s.time)
            .fold(self.start_time.max(self.i_am_alive_time), Timestamp::max)
    }
}

/// An opaque version tag. Each write of a row or of the table version gets a new one, and a
/// row's tag also changes with every heartbeat that moves its I-am-alive time
/// ([`docs::guarantees`](crate::docs::guarantees), "Heartbeats"), so that a writer can say "only
/// if nothing changed — and the silo did not heartbeat — since I read".
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use cassandra_membership::{
///     InMemoryMembershipTable, MembershipEntry, MembershipTable, SiloStatus, Timestamp,
/// };
/// let table = InMemoryMembershipTable::new("blue");
/// let me = "10.0.0.1:11111@1".parse().unwrap();
/// let entry = MembershipEntry::new(me, SiloStatus::Active, Timestamp::from_millis(1_000));
/// let version = table.read_all().await.unwrap().version;
/// assert!(table.insert_row(&entry, &version.next()).await.unwrap());
/// let before = table.read_row(&me).await.unwrap();
/// table.update_i_am_alive(&me, Timestamp::from_millis(5_000)).await.unwrap();
/// let after = table.read_row(&me).await.unwrap();
/// // The row's tag moved with the heartbeat; the table version did not.
/// assert_ne!(after.rows[0].etag, before.rows[0].etag);
/// assert_eq!(after.version, before.version);
/// # });
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ETag(String);

impl ETag {
    /// The tag of a table version that was never written (before `initialize`, or after the
    /// cluster's data was deleted or expired).
    pub fn absent() -> Self {
        ETag(String::new())
    }

    /// A fresh, random tag.
    pub fn random() -> Self {
        ETag(uuid::Uuid::new_v4().to_string())
    }

    /// Wraps a stored tag.
    pub fn new(tag: impl Into<String>) -> Self {
        ETag(tag.into())
    }

    /// True for [`ETag::absent`].
    pub fn is_absent(&self) -> bool {
        self.0.is_empty()
    }

    /// The tag's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<absent>"
        } else {
            &self.0
        })
    }
}

/// The table version: a number the protocol increments on every membership change, and the
/// tag of the write that set it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableVersion {
    /// The version number.
    pub version: u64,
    /// The tag of the write that produced this version.
    pub etag: ETag,
}

impl TableVersion {
    /// The version a cluster without any stored version reads as.
    pub fn absent() -> Self {
        TableVersion {
            version: 0,
            etag: ETag::absent(),
        }
    }

    /// What a writer passes to move the table on from this version: the next number, and this
    /// version's tag as the condition.
    pub fn next(&self) -> TableVersion {
        TableVersion {
            version: self.version.saturating_add(1),
            etag: self.etag.clone(),
        }
    }
}

/// One entry as read, with its row tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipRow {
    /// The entry.
    pub entry: MembershipEntry,
    /// Its row tag, for [`crate::MembershipTable::update_row`].
    pub etag: ETag,
}

/// What a read returns: entries and the table version, read as one consistent view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipSnapshot {
    /// The entries, ordered by silo address.
    pub rows: Vec<MembershipRow>,
    /// The table version the entries belong to.
    pub version: TableVersion,
}

impl MembershipSnapshot {
    /// The row for `address`, if the snapshot holds it.
    pub fn get(&self, address: &SiloAddress) -> Option<&MembershipRow> {
        self.rows.iter().find(|r| &r.entry.address == address)
    }
}

#[cfg(test)]
mod tests;

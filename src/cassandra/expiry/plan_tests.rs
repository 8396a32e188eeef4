//! The planner's decisions, without a node: partitions are built as the two reads would return
//! them, and planned at a fixed `now`.

use std::collections::BTreeMap;

use scylla::value::CqlTimestamp;
use uuid::Uuid;

use super::*;
use crate::model::{ETag, MembershipEntry, SiloAddress, TableVersion};

const NOW_MS: i64 = 1_700_000_000_000;

/// Writes 100 s, accepts up to 110 s as its own.
const ON: TtlRules = TtlRules {
    expiry_on: true,
    write_ttl: 100,
    tolerance: 10,
};

const OFF: TtlRules = TtlRules {
    expiry_on: false,
    write_ttl: 0,
    tolerance: 10,
};

fn now() -> Timestamp {
    Timestamp::from_millis(NOW_MS)
}

fn ago(seconds: i64) -> Timestamp {
    Timestamp::from_millis(NOW_MS - seconds * 1000)
}

fn silo(port: u16) -> String {
    format!("127.0.0.1:{port}@1")
}

/// One partition as the serial read and the scan see it.
struct Partition {
    read: PartitionRead,
    /// The version's TTL and write time (µs), when there is one.
    version: Option<(Option<i32>, i64)>,
    /// Clustering rows: key, tag, TTL.
    rows: Vec<(String, Option<Uuid>, Option<i32>)>,
    /// The TTL of a row's heartbeat cell, by key.
    heartbeat_ttls: BTreeMap<String, i32>,
}

impl Partition {
    /// A partition whose version carries `ttl` and was written `written_ago` seconds ago.
    fn with_version(ttl: Option<i32>, written_ago: i64) -> Self {
        let tag = Uuid::new_v4();
        Partition {
            read: PartitionRead {
                version: TableVersion {
                    version: 3,
                    etag: ETag::new(tag.to_string()),
                },
                version_etag: Some(tag),
                entries: Vec::new(),
                empty_rows: Vec::new(),
                heartbeats: BTreeMap::new(),
                version_lost: false,
            },
            version: Some((ttl, ago(written_ago).as_millis() * 1000)),
            rows: Vec::new(),
            heartbeat_ttls: BTreeMap::new(),
        }
    }

    fn without_version() -> Self {
        let mut p = Partition::with_version(None, 0);
        p.read.version = TableVersion::absent();
        p.read.version_etag = None;
        p.version = None;
        p
    }

    /// An entry of `status`, started and last alive `alive_ago` seconds ago, its cells
    /// carrying `ttl`.
    fn entry(mut self, port: u16, status: SiloStatus, alive_ago: i64, ttl: Option<i32>) -> Self {
        let address: SiloAddress = silo(port).parse().unwrap();
        let etag = Uuid::new_v4();
        self.read.entries.push(StoredEntry {
            entry: MembershipEntry::new(address, status, ago(alive_ago)),
            etag,
        });
        self.read.version_lost = self.read.version_etag.is_none();
        self.rows.push((silo(port), Some(etag), ttl));
        self
    }

    /// The entry's heartbeat cell: its incarnation (`start_ago`) alive `alive_ago` seconds ago.
    fn heartbeat(mut self, port: u16, start_ago: i64, alive_ago: i64) -> Self {
        let (start, alive) = (ago(start_ago).as_millis(), ago(alive_ago).as_millis());
        self.read.heartbeats.insert(
            silo(port),
            (Some(CqlTimestamp(start)), Some(CqlTimestamp(alive))),
        );
        self
    }

    /// A row left with only its heartbeat cell, which carries `ttl`.
    fn heartbeat_only(mut self, port: u16, ttl: i32) -> Self {
        self.heartbeat_ttls.insert(silo(port), ttl);
        self.marker(port)
    }

    /// A row with only its marker left.
    fn marker(mut self, port: u16) -> Self {
        self.read.empty_rows.push(silo(port));
        self.rows.push((silo(port), None, None));
        self
    }

    /// A row holding cells the serial read cannot decode into an entry.
    fn undecodable(mut self, port: u16, ttl: Option<i32>) -> Self {
        self.rows.push((silo(port), Some(Uuid::new_v4()), ttl));
        self
    }

    fn scan(&self) -> Vec<ScanRow> {
        let (version_etag, version_ttl, version_written) = match self.version {
            Some((ttl, written)) => (self.read.version_etag, ttl, Some(written)),
            None => (None, None, None),
        };
        let row = |silo: Option<String>, etag, etag_ttl| ScanRow {
            heartbeat_ttl: silo
                .as_ref()
                .and_then(|s| self.heartbeat_ttls.get(s).copied()),
            silo,
            etag,
            etag_ttl,
            version_etag,
            version_ttl,
            version_written,
        };
        // Static cells come with every row; alone when there is no row.
        if self.rows.is_empty() && version_etag.is_some() {
            return vec![row(None, None, None)];
        }
        let rows = self.rows.iter();
        rows.map(|(s, e, t)| row(Some(s.clone()), *e, *t)).collect()
    }

    fn plan(self, rules: &TtlRules) -> Plan {
        let scan = self.scan();
        let pk = Pk {
            service_id: "svc",
            cluster_id: "c",
        };
        let rows = PartitionRows {
            pk,
            read: self.read,
            scan,
        };
        plan(rows, now(), rules)
    }
}

/// Each line as (silo, current TTL, action); `None` for the version.
fn lines(plan: &Plan) -> Vec<(Option<String>, Option<u32>, PatchAction)> {
    plan.lines
        .iter()
        .map(|l| (l.silo.clone(), l.current_ttl, l.action))
        .collect()
}

fn rewrite(ttl_seconds: u32) -> PatchAction {
    PatchAction::Rewrite { ttl_seconds }
}

#[test]
fn rows_and_a_version_with_ttls_this_configuration_writes_agree() {
    let plan = Partition::with_version(Some(100), 10)
        .entry(1, SiloStatus::Active, 5, Some(90))
        .entry(2, SiloStatus::Dead, 50, Some(105))
        .plan(&ON);
    assert!(plan.lines.is_empty());
    assert_eq!(
        plan.floor,
        VersionFloor {
            unbounded_rows: false,
            longest_row_ttl: 105,
        }
    );
    // The version must outlive its own write (90 s left) and every row (105 s).
    assert_eq!(plan.version_target, 105);
    assert_eq!(plan.batch_version_ttl(), 105);
    assert!(plan.storage_covers_cleanup());
    assert_eq!(plan.version_patch(), VersionPatch::Leave);
    assert_eq!(plan.version_repair_ttl(100), None);
    assert_eq!(plan.row_patches().count(), 0);
}

#[test]
fn a_dead_row_without_ttl_gets_the_time_left_since_its_last_sign_of_life() {
    let plan = Partition::with_version(None, 30)
        .entry(1, SiloStatus::Dead, 30, None)
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), None, rewrite(70)),
            (None, None, rewrite(70)),
        ]
    );
    assert_eq!(plan.floor.longest_row_ttl, 70);
    assert_eq!(plan.batch_version_ttl(), 70);
    let patches: Vec<_> = plan.row_patches().collect();
    assert!(matches!(
        patches[..],
        [RowPatch::Rewrite { ttl: 70, silo: key, heartbeat: None, .. }] if key == silo(1)
    ));
    assert_eq!(plan.version_patch(), VersionPatch::Rewrite { ttl: 70 });
    assert_eq!(plan.version_repair_ttl(100), Some(70));
    assert!(!plan.storage_covers_cleanup());
}

#[test]
fn a_row_silent_for_longer_than_the_ttl_is_removed_and_the_version_with_it() {
    let plan = Partition::with_version(None, 200)
        .entry(1, SiloStatus::Active, 200, None)
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), None, PatchAction::Remove),
            (None, None, PatchAction::Remove),
        ]
    );
    assert!(matches!(
        plan.row_patches().collect::<Vec<_>>()[..],
        [RowPatch::Remove { .. }]
    ));
    // Every entry the read holds goes: so do the static cells.
    assert_eq!(plan.version_patch(), VersionPatch::DeleteStatics);
    // The version-only repair never removes the version: it gets the write TTL.
    assert_eq!(plan.version_repair_ttl(100), Some(100));
}

#[test]
fn an_old_version_stays_while_an_entry_the_patch_does_not_remove_stays() {
    let plan = Partition::with_version(None, 200)
        .entry(1, SiloStatus::Active, 200, None)
        .entry(2, SiloStatus::Active, 5, Some(90))
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), None, PatchAction::Remove),
            (None, None, rewrite(90)),
        ]
    );
    assert_eq!(plan.version_patch(), VersionPatch::Rewrite { ttl: 90 });
}

#[test]
fn a_row_without_ttl_whose_silo_may_be_live_keeps_no_ttl_and_neither_does_the_version() {
    let plan = Partition::with_version(Some(100), 10)
        .entry(1, SiloStatus::Active, 10, None)
        .entry(2, SiloStatus::Joining, 10, Some(1_000))
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), None, PatchAction::KeepWhileLive),
            (Some(silo(2)), Some(1_000), PatchAction::KeepWhileLive),
            (None, Some(100), rewrite(0)),
        ]
    );
    assert!(plan.floor.unbounded_rows);
    assert_eq!(plan.floor.longest_row_ttl, 1_000);
    assert_eq!(plan.live_kept, HashSet::from([silo(1), silo(2)]));
    assert!(plan.leftovers);
    assert_eq!(plan.batch_version_ttl(), 0);
    assert_eq!(plan.row_patches().count(), 0);
    assert_eq!(plan.version_patch(), VersionPatch::Rewrite { ttl: 0 });
    assert!(!plan.storage_covers_cleanup());

    // A version already without TTL is left as it is.
    let plan = Partition::with_version(None, 10)
        .entry(1, SiloStatus::Active, 10, Some(1_000))
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [(Some(silo(1)), Some(1_000), PatchAction::KeepWhileLive)]
    );
    assert!(plan.leftovers);
    assert_eq!(plan.version_patch(), VersionPatch::Leave);
}

#[test]
fn a_heartbeat_of_the_same_incarnation_keeps_its_silo_alive_and_an_earlier_ones_does_not() {
    let plan = Partition::with_version(None, 10)
        .entry(1, SiloStatus::Active, 200, None)
        .heartbeat(1, 200, 10)
        .entry(2, SiloStatus::Active, 200, None)
        .heartbeat(2, 300, 10)
        .plan(&ON);
    let actions: Vec<_> = plan.lines.iter().map(|l| l.action).collect();
    assert_eq!(
        actions[..2],
        [PatchAction::KeepWhileLive, PatchAction::Remove]
    );
    let heartbeats: Vec<_> = plan
        .row_patches()
        .map(|p| match p {
            RowPatch::Remove { heartbeat, .. } | RowPatch::Rewrite { heartbeat, .. } => heartbeat,
        })
        .collect();
    // The removal is conditioned on the element as read.
    assert_eq!(heartbeats, [plan.read.heartbeats.get(&silo(2)).copied()]);
}

#[test]
fn with_expiry_off_every_ttl_is_taken_back_and_rows_without_one_agree() {
    let plan = Partition::with_version(Some(50), 10)
        .entry(1, SiloStatus::Active, 10, Some(50))
        .entry(2, SiloStatus::Dead, 500, None)
        .plan(&OFF);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), Some(50), rewrite(0)),
            (None, Some(50), rewrite(0)),
        ]
    );
    assert!(!plan.leftovers);
    assert_eq!(plan.version_target, 0);
    assert!(matches!(
        plan.row_patches().collect::<Vec<_>>()[..],
        [RowPatch::Rewrite { ttl: 0, .. }]
    ));

    let plan = Partition::with_version(None, 10)
        .entry(1, SiloStatus::Active, 10, None)
        .plan(&OFF);
    assert!(plan.lines.is_empty());
    assert!(!plan.floor.unbounded_rows);
}

#[test]
fn rows_without_a_version_plan_a_version_with_the_ttl_the_rows_allow() {
    let plan = Partition::without_version()
        .entry(1, SiloStatus::Active, 5, Some(90))
        .plan(&ON);
    assert!(plan.read.version_lost);
    assert_eq!(lines(&plan), [(None, None, rewrite(100))]);
    assert_eq!(plan.version_target, 0);

    let plan = Partition::without_version()
        .entry(1, SiloStatus::Active, 5, None)
        .plan(&ON);
    assert_eq!(
        lines(&plan)[1..],
        [(None, None, rewrite(0))],
        "a row that may never expire: the version gets none"
    );

    let plan = Partition::without_version().marker(1).plan(&OFF);
    assert_eq!(lines(&plan), [(None, None, rewrite(0))]);

    let plan = Partition::without_version().plan(&ON);
    assert!(
        plan.lines.is_empty(),
        "an empty partition has nothing to plan"
    );
    assert!(plan.storage_covers_cleanup());
}

#[test]
fn rows_without_an_entry_are_unreadable_or_leftovers_and_are_never_written() {
    let plan = Partition::with_version(Some(100), 10)
        .marker(1)
        .undecodable(2, Some(500))
        .undecodable(3, None)
        .undecodable(4, Some(100))
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(2)), Some(500), PatchAction::Unreadable),
            (Some(silo(3)), None, PatchAction::Unreadable),
        ]
    );
    assert!(plan.leftovers);
    assert!(!plan.floor.unbounded_rows);
    assert_eq!(plan.row_patches().count(), 0);

    // An unreadable row with a TTL expires by itself: it leaves nothing behind.
    let plan = Partition::with_version(Some(100), 10)
        .undecodable(2, Some(500))
        .plan(&ON);
    assert!(!plan.leftovers);

    let plan = Partition::with_version(None, 10)
        .undecodable(1, Some(50))
        .undecodable(2, None)
        .plan(&OFF);
    assert_eq!(
        lines(&plan),
        [(Some(silo(1)), Some(50), PatchAction::Unreadable)]
    );
}

#[test]
fn the_version_is_given_a_ttl_outliving_its_own_write_and_every_row_within_the_cap() {
    let plan = Partition::with_version(Some(500), 10)
        .entry(1, SiloStatus::Dead, 50, None)
        .entry(2, SiloStatus::Active, 1, Some(105))
        .plan(&ON);
    assert_eq!(
        lines(&plan),
        [
            (Some(silo(1)), None, rewrite(50)),
            (None, Some(500), rewrite(105)),
        ]
    );
    assert_eq!(plan.batch_version_ttl(), 105);

    // A version written ahead of this clock is still capped at what this configuration accepts.
    let plan = Partition::with_version(None, -1_000)
        .entry(1, SiloStatus::Active, 1, Some(90))
        .plan(&ON);
    assert_eq!(lines(&plan), [(None, None, rewrite(110))]);
}

#[test]
fn a_scan_alone_tells_what_the_version_must_outlive() {
    let p = Partition::with_version(Some(100), 10)
        .entry(1, SiloStatus::Active, 5, Some(90))
        .entry(2, SiloStatus::Active, 5, Some(110))
        .marker(3);
    assert_eq!(
        version_floor(&p.scan(), &ON),
        VersionFloor {
            unbounded_rows: false,
            longest_row_ttl: 110,
        }
    );
    let p = p.entry(4, SiloStatus::Active, 5, None);
    assert!(version_floor(&p.scan(), &ON).unbounded_rows);
    let p = Partition::with_version(Some(100), 10).entry(1, SiloStatus::Active, 5, Some(111));
    assert!(version_floor(&p.scan(), &ON).unbounded_rows);
    let static_only = Partition::with_version(None, 10);
    assert_eq!(
        version_floor(&static_only.scan(), &ON),
        VersionFloor::default()
    );
}

fn cell(
    key: &str,
    alive_ago: Option<i64>,
    written: Option<i64>,
    ttl: Option<i32>,
) -> HeartbeatCell {
    let alive = alive_ago.map(|s| CqlTimestamp(ago(s).as_millis()));
    HeartbeatCell {
        key: key.to_owned(),
        value: Some((Some(CqlTimestamp(0)), alive)),
        written,
        ttl,
    }
}

#[test]
fn heartbeat_elements_get_the_time_left_or_go_unless_their_silo_may_be_live() {
    let plan = Partition::with_version(None, 10)
        .entry(1, SiloStatus::Active, 10, None)
        .plan(&ON);
    let patch = |c: &HeartbeatCell| plan.heartbeat_patch(c, now(), &ON);
    let value = |c: &HeartbeatCell| c.value.unwrap();

    assert_eq!(
        patch(&cell(&silo(1), Some(10), Some(7), None)),
        CellPatch::Leave
    );
    assert_eq!(patch(&cell("x", Some(10), None, None)), CellPatch::Leave);
    assert_eq!(
        patch(&cell("x", Some(10), Some(7), Some(110))),
        CellPatch::Leave
    );
    let recent = cell("x", Some(30), Some(7), None);
    assert_eq!(
        patch(&recent),
        CellPatch::Restamp {
            value: value(&recent),
            ttl: 70,
            written: 7,
        }
    );
    let long = cell("x", Some(30), Some(7), Some(1_000));
    assert_eq!(
        patch(&long),
        CellPatch::Restamp {
            value: value(&long),
            ttl: 70,
            written: 7,
        }
    );
    assert_eq!(
        patch(&cell("x", Some(200), Some(7), None)),
        CellPatch::Delete { written: 7 }
    );
    assert_eq!(
        patch(&cell("x", None, Some(7), None)),
        CellPatch::Delete { written: 7 },
        "an element without an I-am-alive time is past any TTL"
    );
    let mut empty = cell("x", Some(10), Some(7), None);
    empty.value = None;
    assert_eq!(patch(&empty), CellPatch::Delete { written: 7 });
}

#[test]
fn with_expiry_off_heartbeat_elements_lose_their_ttl() {
    let plan = Partition::with_version(None, 10).plan(&OFF);
    let with_ttl = cell("x", Some(500), Some(7), Some(50));
    assert_eq!(
        plan.heartbeat_patch(&with_ttl, now(), &OFF),
        CellPatch::Restamp {
            value: with_ttl.value.unwrap(),
            ttl: 0,
            written: 7,
        }
    );
    let without = cell("x", Some(500), Some(7), None);
    assert_eq!(
        plan.heartbeat_patch(&without, now(), &OFF),
        CellPatch::Leave
    );
}

#[test]
fn a_row_left_with_only_a_heartbeat_cell_that_expires_is_no_leftover() {
    // The entry expired a renewal interval before its last heartbeat: storage removes the cell.
    let plan = Partition::with_version(Some(100), 10)
        .heartbeat_only(1, 50)
        .plan(&ON);
    assert!(plan.storage_covers_cleanup(), "a cell with a bounded TTL");
    // A cell that never expires, or a bare marker, is defunct cleanup's.
    let plan = Partition::with_version(Some(100), 10).marker(1).plan(&ON);
    assert!(!plan.storage_covers_cleanup(), "a bare marker");
    let plan = Partition::with_version(Some(100), 10)
        .heartbeat_only(1, i32::MAX)
        .plan(&ON);
    assert!(
        !plan.storage_covers_cleanup(),
        "a TTL longer than any this configuration writes"
    );
}

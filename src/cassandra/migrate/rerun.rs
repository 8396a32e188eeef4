//! What a run does with a cluster the target already holds cells of: decided from the write
//! times of the target's cells against those of the copy (pure, tested without a node).
//!
//! A copy writes each cell stamped with the source cell's own write time, so every cell a copy
//! ever wrote is stamped no later than the newest cell of the source it was read from. A silo
//! running on the target joins it — a conditional write of its entry and the version, stamped
//! with the time of the write, after the copy: a version or entry cell of the target newer than
//! every version and entry cell of the source was written there since. Heartbeat cells do not
//! count: a copy leaves them behind where the source's entry expired first (a 0.2 entry is
//! renewed only every renewal interval, its heartbeat every period), and no silo writes one
//! without having joined. And a copy of the current source holds the source's version, its tag
//! and write time: a target version other than that one, or an entry the source no longer
//! holds, was copied from a source that has changed since.

use scylla::DeserializeRow;
use uuid::Uuid;

use super::plan::{ClusterCopy, CopyWrite};

/// One row of `migrate_read_target.cql`.
#[derive(Debug, DeserializeRow)]
pub(super) struct TargetRow {
    pub(super) silo: Option<String>,
    pub(super) version: Option<i64>,
    pub(super) version_etag: Option<Uuid>,
    pub(super) version_written: Option<i64>,
    pub(super) entry_written: Option<i64>,
    pub(super) heartbeat_written: Option<i64>,
}

/// A copied version as stored: (version, tag, write time µs).
type StoredVersion = (i64, Uuid, i64);

/// What the target holds of one cluster before a run writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TargetState {
    /// The version row's cells.
    pub(super) version: Option<StoredVersion>,
    /// The newest write time (µs) of a version or entry cell; `None`: none.
    pub(super) newest_write: Option<i64>,
    /// The entries it holds (their silo keys).
    pub(super) entries: std::collections::BTreeSet<String>,
    /// It holds a cell of some kind (a heartbeat alone counts here).
    pub(super) any_cell: bool,
}

impl TargetState {
    /// Adds one row as read.
    pub(super) fn add(&mut self, row: &TargetRow) {
        if row.silo.as_deref() == Some("")
            && let (Some(v), Some(tag), Some(written)) =
                (row.version, row.version_etag, row.version_written)
        {
            self.version = Some((v, tag, written));
        }
        let newest = [row.version_written, row.entry_written]
            .into_iter()
            .flatten()
            .max();
        self.newest_write = self.newest_write.max(newest);
        if row.entry_written.is_some()
            && let Some(silo) = row.silo.as_deref().filter(|s| !s.is_empty())
        {
            self.entries.insert(silo.to_owned());
        }
        self.any_cell |= row.version_written.is_some()
            || row.entry_written.is_some()
            || row.heartbeat_written.is_some();
    }
}

/// What to do with one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Rerun {
    /// The target holds nothing of it: copy.
    Copy,
    /// The target holds an earlier copy of the same source (complete, or stopped part-way):
    /// copy again (the same cells at the same write times) and verify.
    Resume,
    /// A cell of the target is newer than every cell of the source: silos wrote there after a
    /// copy. Not copied again: the copy could bring back what they removed.
    TargetMovedOn,
    /// The target holds a copy of the source as it was earlier: not copied over (a copy cannot
    /// take back what was removed since), and not verified. Why, for the operator.
    SourceChanged(String),
}

/// The version a copy writes: (version, tag, write time µs).
fn copied_version(copy: &ClusterCopy) -> Option<StoredVersion> {
    copy.writes.iter().find_map(|w| match w {
        CopyWrite::Version {
            version,
            version_etag,
            written,
            ..
        } => Some((*version, *version_etag, *written)),
        _ => None,
    })
}

/// Decides what to do with a cluster whose copy is `copy`, the target holding `target`.
pub(super) fn decide(target: &TargetState, copy: &ClusterCopy) -> Rerun {
    let Some(newest) = target.newest_write else {
        // Nothing, or heartbeat cells alone (left where a copied entry expired): the copy
        // writes the same cells at the same write times.
        return if target.any_cell {
            Rerun::Resume
        } else {
            Rerun::Copy
        };
    };
    if copy
        .latest_membership_write_micros()
        .is_none_or(|l| newest > l)
    {
        return Rerun::TargetMovedOn;
    }
    // An entry copied earlier that the source no longer holds: removed (or expired) there
    // since; a copy cannot take it back from the target.
    let copied: std::collections::BTreeSet<&str> = copy
        .writes
        .iter()
        .filter_map(|w| match w {
            CopyWrite::Entry { silo, .. } => Some(silo.as_str()),
            _ => None,
        })
        .collect();
    if let Some(gone) = target.entries.iter().find(|e| !copied.contains(e.as_str())) {
        return Rerun::SourceChanged(format!(
            "the target holds entry {gone}, copied earlier, which the source no longer holds \
             (removed or expired there since)"
        ));
    }
    let source = copied_version(copy);
    match (target.version, source) {
        (t, s) if t == s => Rerun::Resume,
        (Some((tv, _, tw)), Some((sv, _, sw))) => Rerun::SourceChanged(format!(
            "the target holds version {tv} (written at {}), copied earlier; the source now holds \
             version {sv} (written at {})",
            at(tw),
            at(sw)
        )),
        (Some((tv, _, tw)), None) => Rerun::SourceChanged(format!(
            "the target holds version {tv} (written at {}), copied earlier; the source has no \
             version any more (expired or lost since)",
            at(tw)
        )),
        (None, _) => Rerun::SourceChanged(
            "the target holds cells of this cluster but no version (expired or deleted there \
             since an earlier copy)"
                .into(),
        ),
    }
}

/// A write time (µs) as RFC 3339.
fn at(micros: i64) -> String {
    crate::model::Timestamp::from_millis(micros.div_euclid(1000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MembershipSnapshot, TableVersion};

    fn copy(version: Option<StoredVersion>, entries_written: &[i64]) -> ClusterCopy {
        let mut writes: Vec<CopyWrite> = version
            .map(|(version, version_etag, written)| CopyWrite::Version {
                version,
                version_etag,
                written,
                ttl: 0,
            })
            .into_iter()
            .collect();
        for (i, w) in entries_written.iter().enumerate() {
            let address: crate::model::SiloAddress = format!("10.0.0.{i}:1@1").parse().unwrap();
            writes.push(CopyWrite::Entry {
                silo: address.to_string(),
                entry: crate::model::MembershipEntry::new(
                    address,
                    crate::model::SiloStatus::Active,
                    crate::model::Timestamp::from_millis(1),
                ),
                etag: Uuid::new_v4(),
                written: *w,
                ttl: 0,
            });
        }
        ClusterCopy {
            writes,
            expected: MembershipSnapshot {
                rows: Vec::new(),
                version: TableVersion::absent(),
            },
            skipped: Vec::new(),
            last_activity: None,
        }
    }

    fn target(version: Option<StoredVersion>, newest: Option<i64>) -> TargetState {
        TargetState {
            version,
            newest_write: newest,
            entries: Default::default(),
            any_cell: newest.is_some(),
        }
    }

    #[test]
    fn an_empty_target_is_copied_and_the_same_copy_is_resumed() {
        let tag = Uuid::new_v4();
        let c = copy(Some((5, tag, 100)), &[90, 150]);
        assert_eq!(decide(&TargetState::default(), &c), Rerun::Copy);
        // Stopped after the first batch: the version alone.
        assert_eq!(
            decide(&target(Some((5, tag, 100)), Some(100)), &c),
            Rerun::Resume
        );
        assert_eq!(
            decide(&target(Some((5, tag, 100)), Some(150)), &c),
            Rerun::Resume
        );
    }

    #[test]
    fn a_target_cell_newer_than_every_source_cell_is_the_silos_and_the_target_moved_on() {
        let tag = Uuid::new_v4();
        let c = copy(Some((5, tag, 100)), &[90, 150]);
        // A silo's conditional write: a new version, later than anything copied.
        assert_eq!(
            decide(&target(Some((6, Uuid::new_v4(), 200)), Some(200)), &c),
            Rerun::TargetMovedOn
        );
        // Its version lost since, its entries newer than the source.
        assert_eq!(decide(&target(None, Some(151)), &c), Rerun::TargetMovedOn);
    }

    #[test]
    fn a_source_changed_since_the_copy_is_named_and_not_copied_over() {
        let old = (5, Uuid::new_v4(), 100);
        let moved = copy(Some((6, Uuid::new_v4(), 300)), &[90, 300]);
        let Rerun::SourceChanged(why) = decide(&target(Some(old), Some(150)), &moved) else {
            panic!("a source whose version moved on since the copy");
        };
        assert!(
            why.contains("version 5") && why.contains("version 6"),
            "{why}"
        );
        // The source's version expired (or was lost) since the copy.
        let gone = copy(None, &[90, 150]);
        assert!(matches!(
            decide(&target(Some(old), Some(150)), &gone),
            Rerun::SourceChanged(_)
        ));
        // The target's version gone while the source kept its own.
        let same = copy(Some(old), &[90, 150]);
        assert!(matches!(
            decide(&target(None, Some(150)), &same),
            Rerun::SourceChanged(_)
        ));
    }

    #[test]
    fn the_version_row_and_the_newest_cell_of_any_row_are_what_counts() {
        let tag = Uuid::new_v4();
        let mut state = TargetState::default();
        state.add(&TargetRow {
            silo: Some(String::new()),
            version: Some(3),
            version_etag: Some(tag),
            version_written: Some(10),
            entry_written: None,
            heartbeat_written: None,
        });
        state.add(&TargetRow {
            silo: Some("10.0.0.1:1@1".into()),
            version: None,
            version_etag: None,
            version_written: None,
            entry_written: Some(7),
            heartbeat_written: Some(12),
        });
        let mut expected = target(Some((3, tag, 10)), Some(10));
        expected.entries.insert("10.0.0.1:1@1".into());
        assert_eq!(
            state, expected,
            "a heartbeat cell's write time does not count"
        );
    }

    /// A copy stopped part-way, then the source's newest entry expired before
    /// its heartbeat (on both tables): the heartbeat cell left on the target is newer than every
    /// cell the source still has, and was taken for silos writing there (verified, exit 0, over
    /// a partial copy).
    #[test]
    fn a_heartbeat_left_where_a_copied_entry_expired_is_not_the_silos() {
        let tag = Uuid::new_v4();
        let c = copy(Some((5, tag, 100)), &[90, 150]);
        let mut t = target(Some((5, tag, 100)), Some(150));
        t.entries.insert("10.0.0.1:1@1".into());
        // The leftover heartbeat (written at 400) is not among the cells counted.
        t.add(&TargetRow {
            silo: Some("10.0.0.9:1@1".into()),
            version: None,
            version_etag: None,
            version_written: None,
            entry_written: None,
            heartbeat_written: Some(400),
        });
        assert_eq!(decide(&t, &c), Rerun::Resume);
        // Heartbeat cells alone: copied again.
        let mut only = TargetState::default();
        only.add(&TargetRow {
            silo: Some("10.0.0.9:1@1".into()),
            version: None,
            version_etag: None,
            version_written: None,
            entry_written: None,
            heartbeat_written: Some(400),
        });
        assert_eq!(decide(&only, &c), Rerun::Resume);
    }

    /// An entry copied earlier and removed from the source since (a 0.2
    /// cleanup, a delete, its TTL) was a mismatch on every run ("run migrate again").
    #[test]
    fn an_entry_the_source_no_longer_holds_is_a_changed_source() {
        let tag = Uuid::new_v4();
        let c = copy(Some((5, tag, 100)), &[90]);
        let mut t = target(Some((5, tag, 100)), Some(100));
        t.entries.insert("10.0.0.0:1@1".into());
        t.entries.insert("10.0.0.1:1@1".into());
        let Rerun::SourceChanged(why) = decide(&t, &c) else {
            panic!("an entry removed from the source since the copy");
        };
        assert!(why.contains("10.0.0.1:1@1"), "{why}");
    }
}

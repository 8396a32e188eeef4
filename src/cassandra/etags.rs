//! The tags a read hands out and a write expects: the version's (a UUID, or absent) and a row's
//! (its UUID with the heartbeat cell the read saw). Text this provider never issued parses
//! to `None`, and so can never match.

use scylla::value::CqlTimestamp;
use uuid::Uuid;

use super::heartbeats::StoredHeartbeat;
use crate::model::ETag;

/// `Some(None)` for the absent tag, `Some(Some(id))` for a tag this provider issued, `None` for
/// anything else (which can never match).
pub(super) fn parse_etag(etag: &ETag) -> Option<Option<Uuid>> {
    if etag.is_absent() {
        Some(None)
    } else {
        Uuid::parse_str(etag.as_str()).ok().map(Some)
    }
}

/// The row etag a read hands out: the row's tag, and the entry's heartbeat cell as the read
/// saw it (`<uuid>` without a heartbeat cell, `<uuid>/<start ms>/<I-am-alive ms>` with one, `-` for a
/// null field). A write decided on the read is conditioned on both (`update_entry.cql`), so a
/// death vote cannot apply once the suspect heartbeat again: heartbeats change that cell, not
/// the row, and a tag of the row alone would not notice.
pub(crate) fn row_etag(etag: Uuid, heartbeat: Option<StoredHeartbeat>) -> ETag {
    let field = |t: Option<CqlTimestamp>| t.map_or_else(|| "-".to_owned(), |t| t.0.to_string());
    match heartbeat {
        None => ETag::new(etag.to_string()),
        Some((start, alive)) => ETag::new(format!("{etag}/{}/{}", field(start), field(alive))),
    }
}

/// The row tag and heartbeat cell a [`row_etag`] names; `None` for a text no read of this
/// provider hands out (which can never match).
pub(crate) fn parse_row_etag(etag: &ETag) -> Option<(Uuid, Option<StoredHeartbeat>)> {
    let field = |f: &str| -> Option<Option<CqlTimestamp>> {
        if f == "-" {
            Some(None)
        } else {
            f.parse::<i64>().ok().map(|ms| Some(CqlTimestamp(ms)))
        }
    };
    let mut parts = etag.as_str().split('/');
    let row = Uuid::parse_str(parts.next()?).ok()?;
    match (parts.next(), parts.next(), parts.next()) {
        (None, _, _) => Some((row, None)),
        (Some(start), Some(alive), None) => Some((row, Some((field(start)?, field(alive)?)))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_etags_round_trip_with_and_without_a_heartbeat_cell() {
        let id = Uuid::new_v4();
        let cases = [
            None,
            Some((Some(CqlTimestamp(1)), Some(CqlTimestamp(-2)))),
            Some((None, Some(CqlTimestamp(3)))),
            Some((None, None)),
        ];
        for hb in cases {
            let etag = row_etag(id, hb);
            assert_eq!(parse_row_etag(&etag), Some((id, hb)), "{etag:?}");
        }
        assert_ne!(row_etag(id, None), row_etag(id, Some((None, None))));
        for bad in [
            "",
            "x",
            "00000000-0000-0000-0000-000000000000/1",
            "00000000-0000-0000-0000-000000000000/1/2/3",
            "00000000-0000-0000-0000-000000000000/a/2",
        ] {
            assert_eq!(parse_row_etag(&ETag::new(bad)), None, "{bad:?}");
        }
    }
}

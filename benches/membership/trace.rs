//! Tombstone cells a statement scanned, as Cassandra's tracing reports them.

use std::time::Duration;

use scylla::client::session::Session;
use scylla::response::query_result::QueryResult;
use scylla::serialize::batch::BatchValues;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::Batch;
use scylla::statement::prepared::PreparedStatement;

use crate::fixture::Res;

/// What Cassandra's tracing says one statement did.
#[derive(Clone, Copy, Default)]
pub(crate) struct Trace {
    pub(crate) tombstones: u64,
    /// The node warned the client of the tombstones it scanned (tombstone_warn_threshold).
    pub(crate) warned: bool,
}

impl std::ops::Add for Trace {
    type Output = Trace;
    fn add(self, o: Trace) -> Trace {
        Trace {
            tombstones: self.tombstones + o.tombstones,
            warned: self.warned || o.warned,
        }
    }
}

/// The tombstone cells a traced statement scanned, from its trace events ("Read 1 live rows
/// and 12000 tombstone cells"), summed over every read it made (a conditional write reads the
/// rows its condition names).
async fn trace_of(s: &Session, res: &QueryResult) -> Res<Trace> {
    let warned = res.warnings().any(|w| w.contains("tombstone"));
    let mut tombstones = 0;
    if let Some(id) = res.tracing_id() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let info = s.get_tracing_info(&id).await?;
        for activity in info.events.into_iter().filter_map(|e| e.activity) {
            if let Some(i) = activity.find(" tombstone cells") {
                tombstones += activity[..i]
                    .rsplit(' ')
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Ok(Trace { tombstones, warned })
}

pub(crate) async fn traced(
    s: &Session,
    st: &PreparedStatement,
    values: impl SerializeRow,
) -> Res<Trace> {
    let mut st = st.clone();
    st.set_tracing(true);
    let res = s.execute_unpaged(&st, values).await?;
    trace_of(s, &res).await
}

pub(crate) async fn traced_batch(s: &Session, b: &Batch, values: impl BatchValues) -> Res<Trace> {
    let mut b = b.clone();
    b.set_tracing(true);
    let res = s.batch(&b, values).await?;
    trace_of(s, &res).await
}

//! Sending statements: the counts of what a table value ran, reads (sent again, once, when they
//! fail for a passing reason), plain writes, and conditional writes, whose outcome is applied,
//! not applied, or ambiguous.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use scylla::client::session::Session;
use scylla::errors::ExecutionError;
use scylla::response::PagingState;
use scylla::response::PagingStateResponse;
use scylla::response::query_result::QueryResult;
use scylla::serialize::batch::BatchValues;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::Batch;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};
use tracing::warn;
use uuid::Uuid;

use super::errors::{may_have_applied, to_error};
use super::{CassandraMembershipTable, Pk};
use crate::error::{MembershipError, Result};

/// How many times a statement of a read is sent when it times out. A read changes nothing we
/// own (a serial read may complete someone's in-flight proposal, which any later read would do
/// too), so a coordinator that was slow or lost is tried once more, most likely through another
/// one: one statement costs the caller at most two request timeouts.
const READ_ATTEMPTS: u32 = 2;

/// Counts of the statements a table value executed, by kind: what each operation costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatementCounts {
    /// Plain reads at the commit level (QUORUM / LOCAL_QUORUM): one round trip each.
    pub reads: u64,
    /// Linearizable reads (SERIAL / LOCAL_SERIAL): each runs a Paxos round.
    pub serial_reads: u64,
    /// Plain writes (heartbeats, heartbeat clean-up): one round trip each.
    pub plain_writes: u64,
    /// Conditional writes (LWT, conditional batches): each runs a Paxos round.
    pub conditional_writes: u64,
}

/// The running counts behind [`StatementCounts`], shared by the tables of one session.
#[derive(Debug, Default)]
pub(super) struct Counters {
    reads: AtomicU64,
    serial_reads: AtomicU64,
    plain_writes: AtomicU64,
    conditional_writes: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> StatementCounts {
        StatementCounts {
            reads: self.reads.load(Ordering::Relaxed),
            serial_reads: self.serial_reads.load(Ordering::Relaxed),
            plain_writes: self.plain_writes.load(Ordering::Relaxed),
            conditional_writes: self.conditional_writes.load(Ordering::Relaxed),
        }
    }

    fn read(&self, serial: bool) -> &AtomicU64 {
        if serial {
            &self.serial_reads
        } else {
            &self.reads
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Whether to send a read again after `err` on attempt `attempt` (sleeping briefly first): a
/// timeout, or a node that has not applied the table yet (`lagging`, see `schema_lag.rs`; the
/// provider only reads tables `initialize` made sure of, so this passes).
async fn retry_read(err: &MembershipError, lagging: bool, attempt: u32) -> bool {
    if attempt >= READ_ATTEMPTS || !(matches!(err, MembershipError::Timeout { .. }) || lagging) {
        return false;
    }
    warn!(error = %err, attempt, "a read failed for a passing reason; sending it again");
    let pause = 250 * u64::from(attempt) + rand::random_range(0..100);
    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    true
}

/// Which partition a read reads: for the tombstones it reports and the error it fails with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scan<'a> {
    /// The partition from its start (a whole read, or its first page): an answer without a
    /// tombstone warning shows the partition below the node's warning threshold.
    Whole(Pk<'a>),
    /// A part of it (a row, a later page, the first live row): a warning counts, its absence
    /// proves nothing.
    Part(Pk<'a>),
    /// Not one partition (the listing of clusters).
    Table,
}

impl<'a> Scan<'a> {
    fn pk(self) -> Option<Pk<'a>> {
        match self {
            Scan::Whole(pk) | Scan::Part(pk) => Some(pk),
            Scan::Table => None,
        }
    }
}

/// What a read answers: the result whose warnings are kept.
trait Answer {
    fn result(&self) -> &QueryResult;
}

impl Answer for QueryResult {
    fn result(&self) -> &QueryResult {
        self
    }
}

impl Answer for (QueryResult, PagingStateResponse) {
    fn result(&self) -> &QueryResult {
        &self.0
    }
}

/// A statement or a batch: what a conditional write sends, with the values it binds.
pub(super) trait Conditional<V> {
    async fn execute(
        &self,
        session: &Session,
        values: V,
    ) -> std::result::Result<QueryResult, ExecutionError>;
}

impl<V: SerializeRow> Conditional<V> for PreparedStatement {
    async fn execute(
        &self,
        session: &Session,
        values: V,
    ) -> std::result::Result<QueryResult, ExecutionError> {
        session.execute_unpaged(self, values).await
    }
}

impl<V: BatchValues> Conditional<V> for Batch {
    async fn execute(
        &self,
        session: &Session,
        values: V,
    ) -> std::result::Result<QueryResult, ExecutionError> {
        session.batch(self, values).await
    }
}

/// What sending a conditional write came back with.
pub(super) enum Sent {
    /// The coordinator answered (see [`CasReply`]).
    Answered(CasReply),
    /// A reply came that cannot be read: the write reached a coordinator, and the reply does not
    /// say whether it applied.
    Unreadable(MembershipError),
    /// It failed after it may have reached a replica ([`may_have_applied`]): it may have
    /// applied, or may still.
    Ambiguous(ExecutionError),
    /// It failed before anything could apply.
    Refused(ExecutionError),
}

impl Sent {
    /// The outcome of a write that needs no more than `[applied]`: an unreadable reply and a
    /// refusal are errors of `operation`.
    pub(super) fn outcome(self, operation: &'static str) -> Result<Outcome> {
        match self {
            Sent::Answered(reply) if reply.applied => Ok(Outcome::Applied),
            Sent::Answered(_) => Ok(Outcome::NotApplied),
            Sent::Unreadable(err) => Err(err),
            Sent::Ambiguous(err) => Ok(Outcome::Ambiguous(Box::new(err))),
            Sent::Refused(err) => Err(to_error(operation, err)),
        }
    }
}

/// A conditional write's outcome.
pub(super) enum Outcome {
    /// `[applied] = true`.
    Applied,
    /// `[applied] = false`: the condition did not hold.
    NotApplied,
    /// No answer tells (see [`Sent::Ambiguous`]).
    Ambiguous(Box<ExecutionError>),
}

impl Outcome {
    /// True only when the write is known to have applied.
    pub(super) fn applied(&self) -> bool {
        matches!(self, Outcome::Applied)
    }
}

/// A conditional write's answer: `[applied]`, and on failure the current values of the
/// conditioned tags (Cassandra returns them after `[applied]`; ScyllaDB returns one row per
/// batch statement with every column), read by column name.
#[derive(Debug, Default)]
pub(super) struct CasReply {
    pub(super) applied: bool,
    /// Every `etag` value the reply carried.
    pub(super) etags: Vec<Uuid>,
    /// Every `version_etag` value the reply carried.
    pub(super) version_etags: Vec<Uuid>,
}

impl CasReply {
    /// True if the write carrying these fresh tags took effect: `[applied]`, or a reply
    /// `[applied] = false` that shows our own tags. Paxos answers that when it completed our
    /// pre-empted proposal before checking the condition again, now against our own write;
    /// the tags are random and issued once, so seeing them proves the write applied.
    pub(super) fn took_effect(&self, row_etag: Option<Uuid>, version_etag: Uuid) -> bool {
        self.applied
            || self.version_etags.contains(&version_etag)
            || row_etag.is_some_and(|e| self.etags.contains(&e))
    }

    fn read(result: QueryResult) -> Result<CasReply> {
        let rows = result.into_rows_result().map_err(|e| {
            MembershipError::corrupt(
                None,
                format!("conditional write returned no [applied] row: {e}"),
            )
        })?;
        let names: Vec<String> = rows
            .column_specs()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        let column = |name: &str| names.iter().position(|n| n == name);
        let (applied_at, etag_at, version_etag_at) =
            (column("[applied]"), column("etag"), column("version_etag"));
        let mut reply = CasReply::default();
        let mut seen_applied = None;
        for row in rows
            .rows::<Row>()
            .map_err(|e| MembershipError::corrupt(None, format!("unreadable [applied] row: {e}")))?
        {
            let row = row.map_err(|e| {
                MembershipError::corrupt(None, format!("unreadable [applied] row: {e}"))
            })?;
            let value = |at: Option<usize>| at.and_then(|i| row.columns.get(i).cloned().flatten());
            // ScyllaDB repeats [applied] in every row; any row names the batch's outcome.
            match value(applied_at.or(Some(0))) {
                Some(CqlValue::Boolean(b)) => seen_applied = Some(b),
                other => {
                    return Err(MembershipError::corrupt(
                        None,
                        format!("unexpected [applied] column: {other:?}"),
                    ));
                }
            }
            if let Some(CqlValue::Uuid(u)) = value(etag_at) {
                reply.etags.push(u);
            }
            if let Some(CqlValue::Uuid(u)) = value(version_etag_at) {
                reply.version_etags.push(u);
            }
        }
        reply.applied = seen_applied
            .ok_or_else(|| MembershipError::corrupt(None, "conditional write returned no rows"))?;
        Ok(reply)
    }
}

impl CassandraMembershipTable {
    /// Sends a read (`send` makes one attempt), again once when it fails for a passing reason.
    /// Cassandra's tombstone warning on an answer is kept for the partition read (see
    /// `tombstones.rs`); a read the node aborted for its tombstones is
    /// [`MembershipError::TooManyTombstones`], never sent again.
    async fn read_with_retry<T: Answer, F>(
        &self,
        operation: &'static str,
        serial: bool,
        scan: Scan<'_>,
        mut send: impl FnMut() -> F,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, ExecutionError>>,
    {
        let mut attempt = 1;
        loop {
            bump(self.shared.counters.read(serial));
            match send().await {
                Ok(r) => {
                    self.scanned(scan, r.result().warnings());
                    return Ok(r);
                }
                Err(e) => {
                    if let (Some(pk), true) = (scan.pk(), super::tombstones::is_overflow(&e)) {
                        warn!(cluster = pk.cluster_id, operation, error = %e, "the node aborted a read of the cluster's partition for its tombstones");
                        return Err(MembershipError::TooManyTombstones {
                            operation,
                            service_id: pk.service_id.to_owned(),
                            cluster_id: pk.cluster_id.to_owned(),
                            last_scanned: self.shared.tombstones.get(pk),
                            source: Box::new(e),
                        });
                    }
                    let err = to_error(operation, e);
                    let lagging = self.unapplied(&err).is_some();
                    if !retry_read(&err, lagging, attempt).await {
                        return Err(err);
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Records what a read of `scan` reported of the tombstones it scanned.
    fn scanned<'a>(&self, scan: Scan<'_>, warnings: impl Iterator<Item = &'a str>) {
        let (pk, whole) = match scan {
            Scan::Whole(pk) => (pk, true),
            Scan::Part(pk) => (pk, false),
            Scan::Table => return,
        };
        let reported = self.shared.tombstones.record(pk, whole, warnings);
        if let Some(n) = reported {
            tracing::debug!(
                cluster = pk.cluster_id,
                tombstones = n,
                "a read reported the tombstones it scanned"
            );
        }
        let after = self.shared.tombstones.get(pk);
        // Emitted on every report, not only on a change: the store is shared by every handle of
        // the table, and another one (an operator's inspection) may have recorded it first.
        if pk.cluster_id == self.cluster_id && pk.service_id == self.service_id() {
            self.metrics.tombstones_scanned(after.unwrap_or(0));
        }
    }

    /// A read of one statement, all its rows in one reply.
    pub(super) async fn exec_read(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        serial: bool,
        scan: Scan<'_>,
    ) -> Result<QueryResult> {
        let session = self.session();
        self.read_with_retry(operation, serial, scan, || {
            session.execute_unpaged(statement, &values)
        })
        .await
    }

    /// One page of a paged read.
    pub(super) async fn read_page(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        paging: PagingState,
        serial: bool,
        scan: Scan<'_>,
    ) -> Result<(QueryResult, PagingStateResponse)> {
        let session = self.session();
        self.read_with_retry(operation, serial, scan, || {
            session.execute_single_page(statement, &values, paging.clone())
        })
        .await
    }

    /// A plain write (a heartbeat cell's write or delete): idempotent, stamped by the
    /// statement, sent once here (the statement's retry policy may repeat it).
    pub(super) async fn exec_plain(
        &self,
        operation: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<()> {
        bump(&self.shared.counters.plain_writes);
        self.session()
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| to_error(operation, e))?;
        Ok(())
    }

    /// Sends a conditional statement or batch, once: a conditional write is never sent twice
    /// (see `retry.rs`); what came back says what is known of its outcome.
    pub(super) async fn send_conditional<V>(
        &self,
        statement: &impl Conditional<V>,
        values: V,
    ) -> Sent {
        bump(&self.shared.counters.conditional_writes);
        match statement.execute(self.session(), values).await {
            Ok(result) => match CasReply::read(result) {
                Ok(reply) => Sent::Answered(reply),
                Err(err) => Sent::Unreadable(err),
            },
            // The round's read (of the condition's cells) was aborted for its tombstones: it
            // never proposed, so it did not apply.
            Err(e) if super::tombstones::is_overflow(&e) => Sent::Refused(e),
            Err(e) if may_have_applied(&e) => Sent::Ambiguous(e),
            Err(e) => Sent::Refused(e),
        }
    }

    /// A conditional write of `operation` whose caller needs only `[applied]` (see
    /// [`Sent::outcome`]).
    pub(super) async fn conditional<V>(
        &self,
        operation: &'static str,
        statement: &impl Conditional<V>,
        values: V,
    ) -> Result<Outcome> {
        self.send_conditional(statement, values)
            .await
            .outcome(operation)
    }
}

#[cfg(test)]
mod tests {
    use scylla::errors::{DbError, ExecutionError, WriteType};
    use scylla::statement::Consistency;

    use super::*;
    use crate::cassandra::errors::tests::{db, unavailable};

    /// The rule each call site applied before the outcome handling was centralised: a reply is
    /// `[applied]` or, unreadable, its error; a failure that may have applied is ambiguous; any
    /// other failure is `to_error(operation, e)`.
    fn old_rule(sent: &str, err: Option<ExecutionError>) -> String {
        match (sent, err) {
            ("applied", _) => "Ok(true)".into(),
            ("not_applied", _) => "Ok(false)".into(),
            ("unreadable", _) => "Err(CorruptData)".into(),
            (_, Some(e)) if may_have_applied(&e) => "Ambiguous".into(),
            (_, Some(e)) => format!("Err({:?})", std::mem::discriminant(&to_error("op", e))),
            _ => unreachable!(),
        }
    }

    fn new_rule(sent: Sent) -> String {
        match sent.outcome("op") {
            Ok(Outcome::Applied) => "Ok(true)".into(),
            Ok(Outcome::NotApplied) => "Ok(false)".into(),
            Ok(Outcome::Ambiguous(_)) => "Ambiguous".into(),
            Err(MembershipError::CorruptData { .. }) => "Err(CorruptData)".into(),
            Err(e) => format!("Err({:?})", std::mem::discriminant(&e)),
        }
    }

    fn errors() -> Vec<fn() -> ExecutionError> {
        vec![
            || ExecutionError::LastAttemptError(db(unavailable())),
            || ExecutionError::LastAttemptError(db(DbError::Unauthorized)),
            || ExecutionError::LastAttemptError(db(DbError::SyntaxError)),
            || ExecutionError::LastAttemptError(db(DbError::Overloaded)),
            || {
                ExecutionError::LastAttemptError(db(DbError::WriteTimeout {
                    consistency: Consistency::Serial,
                    received: 0,
                    required: 1,
                    write_type: WriteType::Cas,
                }))
            },
            || ExecutionError::RequestTimeout(std::time::Duration::from_secs(1)),
            || ExecutionError::EmptyPlan,
        ]
    }

    /// Every driver error, unreadable reply and `[applied]` answer maps as each call site
    /// mapped it before `Sent` / `Outcome` replaced the per-site matches.
    #[test]
    fn the_central_outcome_mapping_is_the_per_site_rule_it_replaced() {
        let reply = |applied| CasReply {
            applied,
            ..CasReply::default()
        };
        assert_eq!(
            new_rule(Sent::Answered(reply(true))),
            old_rule("applied", None)
        );
        assert_eq!(
            new_rule(Sent::Answered(reply(false))),
            old_rule("not_applied", None)
        );
        let corrupt = MembershipError::corrupt(None, "unreadable [applied] row");
        assert_eq!(
            new_rule(Sent::Unreadable(corrupt)),
            old_rule("unreadable", None)
        );
        for make in errors() {
            let sent = if may_have_applied(&make()) {
                Sent::Ambiguous(make())
            } else {
                Sent::Refused(make())
            };
            assert_eq!(
                new_rule(sent),
                old_rule("failed", Some(make())),
                "{:?}",
                make()
            );
        }
    }
}

//! The versioned membership-protocol steps: joining, changing a status, declaring silent silos
//! dead, leaving gracefully. Each is a read → conditional write loop that retries version
//! conflicts, and, within a deadline, reads that give up and calls that time out.
//!
//! [`Silo`](crate::Silo) runs them all. Public are the steps a host running its own loop calls:
//! [`join`], [`set_status`], [`leave`] (or [`join_within`], [`set_status_within`],
//! [`leave_within`] with its own [`ProtocolLimits`]) and [`detection_round`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::error::{MembershipError, Result};
use crate::model::{
    MembershipEntry, MembershipSnapshot, SiloAddress, SiloStatus, SuspectTime, Timestamp,
};
use crate::options::MembershipOptions;
use crate::runtime::jitter;
use crate::runtime::observe::{self, Step};
use crate::runtime::regress::{self, Regression};
use crate::table::MembershipTable;

/// How long the protocol steps may take: each table call, and each step as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolLimits {
    /// The bound on one table call; a call that takes longer fails with
    /// [`MembershipError::Timeout`] (a read) or [`MembershipError::OutcomeUnknown`] (a write).
    pub call_timeout: Duration,
    /// How long one step keeps retrying before it returns the last error (for
    /// [`leave_within`]: the whole leave, both its status changes).
    pub step_deadline: Duration,
}

impl ProtocolLimits {
    /// `table_operation_timeout` (one publish period by default) per call and
    /// `max_join_attempt_time` (5 min by default) per step.
    pub fn from_options(options: &MembershipOptions) -> Self {
        ProtocolLimits {
            call_timeout: options.effective_table_operation_timeout(),
            step_deadline: options.max_join_attempt_time,
        }
    }

    /// The limits of a leave: `table_operation_timeout` per call and `leave_timeout` (60 s by
    /// default) for the whole leave.
    pub fn for_leave(options: &MembershipOptions) -> Self {
        ProtocolLimits {
            call_timeout: options.effective_table_operation_timeout(),
            step_deadline: options.leave_timeout,
        }
    }
}

impl Default for ProtocolLimits {
    fn default() -> Self {
        Self::from_options(&MembershipOptions::default())
    }
}

/// Runs one table call within `limit`. A read that takes longer is a `Timeout`; a write an
/// `OutcomeUnknown` (dropping the future does not withdraw what was sent).
pub(crate) async fn bounded<T>(
    operation: &'static str,
    is_write: bool,
    limit: Duration,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r,
        Err(_) => {
            let source = format!("no answer within {limit:?} (table_operation_timeout)");
            Err(if is_write {
                MembershipError::OutcomeUnknown {
                    operation,
                    detail: "the runtime stopped waiting".into(),
                    source: source.into(),
                }
            } else {
                MembershipError::Timeout {
                    operation,
                    source: source.into(),
                }
            })
        }
    }
}

/// `after` from now, or about thirty years from now when that overflows (an unbounded deadline).
pub(crate) fn deadline_after(after: Duration) -> Instant {
    instant_after(Instant::now(), after)
}

/// `origin + offset`, or about thirty years on when that overflows.
pub(crate) fn instant_after(origin: Instant, offset: Duration) -> Instant {
    origin
        .checked_add(offset)
        .or_else(|| origin.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(origin)
}

/// The bound on one call: the call timeout, cut short by the deadline of the step it is part of.
fn call_limit(call_timeout: Duration, deadline: Instant) -> Duration {
    call_timeout.min(deadline.saturating_duration_since(Instant::now()))
}

/// Errors worth another round: contention, timeouts, unknown outcomes, unavailable storage.
pub(crate) fn retriable(e: &MembershipError) -> bool {
    matches!(
        e,
        MembershipError::Contention { .. }
            | MembershipError::Timeout { .. }
            | MembershipError::OutcomeUnknown { .. }
            | MembershipError::Unavailable { .. }
    )
}

/// Full-jitter exponential backoff: a random pause up to 20 ms × 2^round, at most 2 s, so
/// many writers of one version row spread out instead of colliding again.
pub(crate) async fn pause(round: u32, deadline: Instant) {
    let cap = 20u64.saturating_mul(1 << round.min(7)).min(2_000);
    let pause = Duration::from_millis(jitter::between(1..=cap));
    tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
}

/// Inserts `entry` (retrying version conflicts) with the default limits: see [`join_within`].
pub async fn join(table: &dyn MembershipTable, entry: &MembershipEntry) -> Result<()> {
    join_within(table, entry, &ProtocolLimits::default()).await
}

/// Inserts `entry`, retrying version conflicts, reads that give up and calls that time out until
/// `limits.step_deadline`. Errors with [`MembershipError::EntryExists`] if the address already
/// has a row other than this incarnation's as a join writes it (which an earlier attempt, of
/// this call or of one that answered `OutcomeUnknown`, inserted), or `CorruptData` if that row
/// cannot be read: retrying a join is safe. Each round reads only the address's row and the version, whatever the cluster's size.
pub async fn join_within(
    table: &dyn MembershipTable,
    entry: &MembershipEntry,
    limits: &ProtocolLimits,
) -> Result<()> {
    join_until(
        table,
        entry,
        limits.call_timeout,
        deadline_after(limits.step_deadline),
    )
    .await
}

/// [`join_within`] with a deadline shared with other steps; calls in flight are cut at it.
pub(crate) async fn join_until(
    table: &dyn MembershipTable,
    entry: &MembershipEntry,
    call_timeout: Duration,
    deadline: Instant,
) -> Result<()> {
    let mut rounds = Rounds::new("join", deadline);
    let mut maybe_inserted = false;
    loop {
        // Each call's bound is what is left of the step when it starts: a slow read leaves the
        // write after it only the rest, so the step ends by its deadline.
        let attempt = async {
            // A join needs only the version and whether its own address has a row: `read_row`
            // gives both as one linearizable view (a serial read of the row together with the
            // partition's static version cells), so an insert of ours that applied — even one
            // still in flight at the Paxos level, which a serial read completes — shows here.
            // Unlike `read_all` it costs the same however many silos there are, cannot restart
            // because another join moved the version between its pages, and reports a damaged
            // row at the address instead of skipping it (an insert would then only conflict).
            let t = call_limit(call_timeout, deadline);
            let snapshot = bounded("read_row", false, t, table.read_row(&entry.address)).await?;
            if let Some(row) = snapshot.get(&entry.address) {
                // Our own incarnation as a join writes it (same start time, still the status we
                // inserted): an earlier attempt, of this call or of a call that answered
                // `OutcomeUnknown`, did apply. A row that moved on (ShuttingDown, Dead) is not.
                if (maybe_inserted && row.entry == *entry)
                    || (row.entry.start_time == entry.start_time
                        && row.entry.status == entry.status)
                {
                    return Ok(true);
                }
                return Err(MembershipError::EntryExists {
                    silo: entry.address.to_string(),
                    status: format!("{:?}", row.entry.status),
                });
            }
            bounded(
                "insert_row",
                true,
                call_limit(call_timeout, deadline),
                table.insert_row(entry, &snapshot.version.next()),
            )
            .await
        }
        .await;
        let failed = match attempt {
            Ok(true) => {
                info!(cluster = table.cluster_id(), silo = %entry.address, status = ?entry.status, rounds = rounds.round + 1, "joined");
                return Ok(());
            }
            Ok(false) => {
                observe::conflict(table, Step::Join);
                None
            }
            Err(e) => {
                let e = rounds.retry(e)?;
                maybe_inserted |= matches!(e, MembershipError::OutcomeUnknown { .. });
                debug!(cluster = table.cluster_id(), silo = %entry.address, error = %e, "join round failed; retrying");
                Some(e)
            }
        };
        rounds.next(failed).await?;
    }
}

/// Moves `address`'s entry to `status` (with the I-am-alive time `now`), retrying version
/// conflicts, reads that give up and calls that time out until `max_join_attempt_time`, each
/// call bounded by `table_operation_timeout` (the defaults of [`ProtocolLimits`]). Returns
/// `false` if the entry is missing or already Dead (a Dead entry never revives).
pub async fn set_status(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    status: SiloStatus,
    now: Timestamp,
) -> Result<bool> {
    set_status_within(table, address, status, now, &ProtocolLimits::default()).await
}

/// [`set_status`] within `limits`.
pub async fn set_status_within(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    status: SiloStatus,
    now: Timestamp,
    limits: &ProtocolLimits,
) -> Result<bool> {
    set_status_until(
        table,
        address,
        None,
        status,
        now,
        limits.call_timeout,
        deadline_after(limits.step_deadline),
    )
    .await
}

/// [`set_status`] with a deadline shared with other steps (calls in flight are cut at
/// it); with `start_time`, only that incarnation's row is changed (another's counts as missing).
pub(crate) async fn set_status_until(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    start_time: Option<Timestamp>,
    status: SiloStatus,
    now: Timestamp,
    call_timeout: Duration,
    deadline: Instant,
) -> Result<bool> {
    let mut rounds = Rounds::new("set_status", deadline);
    loop {
        // Each call's bound is what is left of the step when it starts (see `join_until`).
        let attempt = async {
            let t = call_limit(call_timeout, deadline);
            let snapshot = bounded("read_row", false, t, table.read_row(address)).await?;
            let Some(row) = snapshot
                .rows
                .first()
                .filter(|r| start_time.is_none_or(|s| r.entry.start_time == s))
            else {
                return Ok(Some(false));
            };
            if row.entry.status == SiloStatus::Dead {
                return Ok(Some(status == SiloStatus::Dead));
            }
            let mut entry = row.entry.clone();
            entry.status = status;
            entry.i_am_alive_time = entry.i_am_alive_time.max(now);
            let applied = bounded(
                "update_row",
                true,
                call_limit(call_timeout, deadline),
                table.update_row(&entry, &row.etag, &snapshot.version.next()),
            )
            .await?;
            Ok(applied.then_some(true))
        }
        .await;
        let failed = match attempt {
            Ok(Some(done)) => {
                if done {
                    info!(cluster = table.cluster_id(), silo = %address, ?status, "status changed");
                }
                return Ok(done);
            }
            Ok(None) => {
                observe::conflict(table, Step::Status);
                None
            }
            // An unknown outcome is resolved by the next round's read: a write that applied
            // shows as the new status (written again, harmlessly) or as Dead.
            Err(e) => {
                let e = rounds.retry(e)?;
                debug!(cluster = table.cluster_id(), silo = %address, error = %e, "status change round failed; retrying");
                Some(e)
            }
        };
        rounds.next(failed).await?;
    }
}

/// Graceful leave: ShuttingDown, then Dead, each through the versioned protocol, so the other
/// silos see this one left rather than crashed; the whole leave within the default
/// `leave_timeout` (60 s, [`ProtocolLimits::for_leave`]).
pub async fn leave(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    now: Timestamp,
) -> Result<()> {
    leave_within(
        table,
        address,
        now,
        &ProtocolLimits::for_leave(&MembershipOptions::default()),
    )
    .await
}

/// [`leave`] within `limits`: both of its status changes, retries included, end by one
/// deadline, `limits.step_deadline` from the call (each table call bounded by
/// `limits.call_timeout`, cut short at that deadline). Past it, the last error is returned.
pub async fn leave_within(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    now: Timestamp,
    limits: &ProtocolLimits,
) -> Result<()> {
    leave_until(
        table,
        address,
        now,
        limits.call_timeout,
        deadline_after(limits.step_deadline),
    )
    .await
}

/// [`leave_within`] by an absolute `deadline` (the silo's leave counts stopping its tasks in).
pub(crate) async fn leave_until(
    table: &dyn MembershipTable,
    address: &SiloAddress,
    now: Timestamp,
    call_timeout: Duration,
    deadline: Instant,
) -> Result<()> {
    let shutting_down = set_status_until(
        table,
        address,
        None,
        SiloStatus::ShuttingDown,
        now,
        call_timeout,
        deadline,
    )
    .await?;
    if shutting_down {
        set_status_until(
            table,
            address,
            None,
            SiloStatus::Dead,
            now,
            call_timeout,
            deadline,
        )
        .await?;
    }
    Ok(())
}

/// What one failure-detection round saw and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectionRound {
    /// The silos this round declared dead.
    pub declared: Vec<SiloAddress>,
    /// The status of `me`'s own row in the round's read, `None` when it has none: how a silo
    /// learns, within one round, that the others declared it dead or its entry is gone.
    pub own_status: Option<SiloStatus>,
}

/// One round of failure detection from `me`'s point of view, in the style of Orleans' table-based
/// detector: every other Active silo whose I-am-alive time is older than
/// `publish period × missed limit` gets `me`'s suspicion; once it has
/// `num_votes_for_death_declaration` votes that count it is declared Dead. A vote counts while
/// it is fresh (younger than `death_vote_expiration_timeout`, by default the detection horizon)
/// and its voter has a row that is not Dead; the others are dropped from the row. Returns the silos this
/// round declared dead, and `me`'s own row from the same read — no extra round trip. Every
/// table call is bounded by `table_operation_timeout`.
///
/// A silo whose own row is Dead or missing votes no one dead: it is no member. A suspect whose
/// re-read or write fails is skipped (the next round retries it); only the first read failing
/// fails the round.
pub async fn detection_round(
    table: &dyn MembershipTable,
    me: &SiloAddress,
    options: &MembershipOptions,
    now: Timestamp,
) -> Result<DetectionRound> {
    detection_round_reporting(table, me, None, options, now, |_| {}, |_, _| {}).await
}

/// [`detection_round`], handing `me`'s own status to `own` as soon as it is known, before any
/// vote, and each whole-table read to `read` with the time it was sent (the round's first read
/// at `now`, the re-reads before votes later): the silo's view is published from them. With
/// `start_time`, a row of another incarnation at `me` counts as missing.
pub(crate) async fn detection_round_reporting(
    table: &dyn MembershipTable,
    me: &SiloAddress,
    start_time: Option<Timestamp>,
    options: &MembershipOptions,
    now: Timestamp,
    own: impl FnOnce(Option<SiloStatus>),
    mut read: impl FnMut(&MembershipSnapshot, Timestamp),
) -> Result<DetectionRound> {
    let t = options.effective_table_operation_timeout();
    let silence = options.detection_horizon();
    let mut declared = Vec::new();
    // Each vote is stamped when it is written, not when the round began: a round with several
    // suspects and slow storage can outlast a short vote lifetime.
    let round_started = tokio::time::Instant::now();
    let snapshot = bounded("read_all", false, t, table.read_all()).await?;
    read(&snapshot, now);
    let own_row = match snapshot.get(me) {
        Some(r) => Some((r.entry.status, r.entry.start_time)),
        // `read_all` skips a damaged row: only `read_row` tells a missing row from one that
        // cannot be read (an error: the own status stays unknown).
        None => bounded("read_row", false, t, table.read_row(me))
            .await?
            .get(me)
            .map(|r| (r.entry.status, r.entry.start_time)),
    };
    let own_status = own_row
        .filter(|(_, started)| start_time.is_none_or(|s| *started == s))
        .map(|(status, _)| status);
    own(own_status);
    if matches!(own_status, None | Some(SiloStatus::Dead)) {
        return Ok(DetectionRound {
            declared,
            own_status,
        });
    }
    'suspects: for row in &snapshot.rows {
        let e = &row.entry;
        if &e.address == me
            || e.status != SiloStatus::Active
            || e.i_am_alive_time.saturating_add(silence) > now
        {
            continue;
        }
        // A vote that loses its race (another detector's write moved the version between our
        // re-read and our write) is tried again on a fresh read, up to `VOTE_ATTEMPTS` writes:
        // with one attempt a round, two detectors whose rounds coincide every period starved
        // each other's second vote for good.
        let attempts = if regress::on(Regression::OneVoteAttemptARound) {
            1
        } else {
            VOTE_ATTEMPTS
        };
        for attempt in 0..attempts {
            if attempt > 0 {
                pause(attempt, deadline_after(t)).await;
            }
            let reread_at = now.saturating_add(round_started.elapsed());
            let current = match bounded("read_all", false, t, table.read_all()).await {
                Ok(current) => {
                    read(&current, reread_at);
                    current
                }
                // One suspect must not cost the round what it already learned, nor the others'
                // votes.
                Err(err) => {
                    warn!(cluster = table.cluster_id(), silo = %e.address, error = %err, "re-read before a suspicion failed");
                    continue 'suspects;
                }
            };
            // The vote is written on this re-read (conditioned on its version, which any change
            // moves, and on the suspect's row tag, which its heartbeats move), so everything it
            // rests on is judged on it too, not on the round's first read: this silo's own
            // standing, the voters' (declared Dead meanwhile by another detector's overlapping
            // round shows here), and the suspect's silence.
            let still_me = current
                .get(me)
                .filter(|r| start_time.is_none_or(|s| r.entry.start_time == s))
                .is_some_and(|r| r.entry.status != SiloStatus::Dead);
            if !still_me && !regress::on(Regression::VotersFromTheFirstRead) {
                break 'suspects;
            }
            let vote_time = now.saturating_add(round_started.elapsed());
            let Some(now_row) = current.get(&e.address).filter(|r| {
                r.entry.status == SiloStatus::Active
                    && r.entry.i_am_alive_time.saturating_add(silence) <= vote_time
            }) else {
                continue 'suspects;
            };
            let voters_read = if regress::on(Regression::VotersFromTheFirstRead) {
                &snapshot
            } else {
                &current
            };
            let entry = vote(now_row, voters_read, me, &declared, vote_time, options);
            let written = bounded(
                "update_row",
                true,
                t,
                table.update_row(&entry, &now_row.etag, &current.version.next()),
            )
            .await;
            match written {
                Ok(true) if entry.status == SiloStatus::Dead => {
                    info!(cluster = table.cluster_id(), silo = %e.address, by = %me, "declared dead after missed heartbeats");
                    declared.push(e.address);
                    continue 'suspects;
                }
                Ok(true) => {
                    debug!(cluster = table.cluster_id(), silo = %e.address, by = %me, "suspected");
                    continue 'suspects;
                }
                Ok(false) => observe::conflict(table, Step::Vote),
                // The next round re-reads; one silo's vote must not stop the round for the others.
                Err(err) => {
                    warn!(cluster = table.cluster_id(), silo = %e.address, error = %err, "suspicion write failed");
                    continue 'suspects;
                }
            }
        }
    }
    Ok(DetectionRound {
        declared,
        own_status,
    })
}

/// How many writes one detection round makes on one suspect when its votes lose races.
const VOTE_ATTEMPTS: u32 = 3;

/// `me`'s vote on the suspect `row` at `vote_time`: the votes that count kept, one per voter —
/// fresh ones (an older vote was cast on an earlier silence), by voters with a row that is not
/// Dead in `voters_read` nor declared this round (a Dead or removed voter vouches for nothing:
/// its view may be what got it declared dead) — and ours added; Dead once they are enough.
fn vote(
    row: &crate::model::MembershipRow,
    voters_read: &MembershipSnapshot,
    me: &SiloAddress,
    declared: &[SiloAddress],
    vote_time: Timestamp,
    options: &MembershipOptions,
) -> MembershipEntry {
    let mut entry = row.entry.clone();
    let fresh = vote_time.saturating_sub(options.effective_death_vote_expiration_timeout());
    entry.suspect_times.retain(|s| {
        (s.time >= fresh || regress::on(Regression::StaleVotesCount))
            && &s.suspecting_silo != me
            && !declared.contains(&s.suspecting_silo)
            && (regress::on(Regression::DeadVotersCount)
                || voters_read
                    .get(&s.suspecting_silo)
                    .is_some_and(|voter| voter.entry.status != SiloStatus::Dead))
    });
    entry.suspect_times.push(SuspectTime {
        suspecting_silo: *me,
        time: vote_time,
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
    entry
}

/// The rounds of one step: it counts them, pauses between them and ends them at its deadline.
struct Rounds {
    operation: &'static str,
    started: Instant,
    deadline: Instant,
    /// Rounds done before the current one.
    round: u32,
}

impl Rounds {
    fn new(operation: &'static str, deadline: Instant) -> Self {
        Rounds {
            operation,
            started: Instant::now(),
            deadline,
            round: 0,
        }
    }

    /// A round failed with `e`: `Ok(e)` when another round is worth it, `Err(e)` when `e` is
    /// not retriable or the deadline has passed.
    fn retry(&self, e: MembershipError) -> Result<MembershipError> {
        if retriable(&e) && Instant::now() < self.deadline {
            Ok(e)
        } else {
            Err(e)
        }
    }

    /// Before the next round, after one that ended with `failed` (`None`: a version conflict):
    /// a jittered pause. Once the deadline has passed — before the pause or during it — the
    /// step ends with that round's error, or `Contention` after a conflict: not with a round
    /// started on what is left of the deadline (nothing), whose instant timeout would hide
    /// the cause.
    async fn next(&mut self, failed: Option<MembershipError>) -> Result<()> {
        self.round = self.round.saturating_add(1);
        if Instant::now() < self.deadline {
            pause(self.round, self.deadline).await;
            if Instant::now() < self.deadline {
                return Ok(());
            }
        }
        Err(failed.unwrap_or(MembershipError::Contention {
            operation: self.operation,
            attempts: self.round,
            elapsed: self.started.elapsed(),
        }))
    }
}

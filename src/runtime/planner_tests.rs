//! The heartbeat planner's tests (`planner.rs`): horizons, delays, fencing and its lifting.

use super::*;

fn options() -> MembershipOptions {
    MembershipOptions {
        i_am_alive_table_publish_timeout: Duration::from_secs(30),
        ..Default::default()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wall(s: i64) -> Timestamp {
    Timestamp::from_millis(1_000_000 + s * 1000)
}

fn lease(granted: i64, expires: i64, refresh: i64) -> Lease {
    Lease {
        granted_at: wall(granted),
        expires_at: Some(wall(expires)),
        refresh_by: Some(wall(refresh)),
    }
}

fn refreshed(lease: Lease) -> Result<HeartbeatOutcome, MembershipError> {
    Ok(HeartbeatOutcome::Refreshed { lease })
}

/// A planner whose first publish, at monotonic 0 and wall 100, was granted a lease to be
/// refreshed by wall 120 (expiring at 130).
fn granted_at_wall_100(o: &MembershipOptions) -> HeartbeatPlanner {
    let mut p = HeartbeatPlanner::new(o, Duration::ZERO);
    p.on_outcome(
        Duration::ZERO,
        wall(100),
        Duration::ZERO,
        &refreshed(lease(100, 130, 120)),
    );
    p
}

fn err() -> Result<HeartbeatOutcome, MembershipError> {
    Err(MembershipError::config("x", "boom"))
}

/// The cause of the last failure is what the host is shown, while failing and once fenced;
/// a detector that cannot read the own row fences with its own failure's cause.
#[test]
fn the_health_names_the_kind_of_the_last_failure() {
    let o = MembershipOptions::default();
    let mut p = HeartbeatPlanner::new(&o, secs(0));
    let buried = Err(MembershipError::TooManyTombstones {
        operation: "read_row",
        service_id: "s".into(),
        cluster_id: "c".into(),
        last_scanned: None,
        source: "aborted".into(),
    });
    assert!(matches!(
        p.on_outcome(secs(1), wall(1), secs(1), &buried),
        SiloHealth::Failing {
            cause: FailureCause::TooManyTombstones,
            ..
        }
    ));
    let outage = Err(MembershipError::Timeout {
        operation: "update_i_am_alive",
        source: "slow".into(),
    });
    assert!(matches!(
        p.on_outcome(secs(2), wall(2), secs(2), &outage),
        SiloHealth::Failing {
            cause: FailureCause::Outage,
            ..
        }
    ));
    assert!(matches!(
        p.health(secs(500), false),
        SiloHealth::LeaseAtRisk {
            cause: Some(FailureCause::Outage),
            ..
        }
    ));
    let fresh = HeartbeatPlanner::new(&o, secs(0));
    assert!(matches!(
        fresh.shown(secs(1), false, Some(FailureCause::TooManyTombstones)),
        SiloHealth::LeaseAtRisk {
            cause: Some(FailureCause::TooManyTombstones),
            failures: 0,
            ..
        }
    ));
    assert_eq!(fresh.shown(secs(1), false, None), SiloHealth::Starting);
}

#[test]
fn horizons_with_the_defaults() {
    let o = MembershipOptions::default();
    assert_eq!(HeartbeatPlanner::detection_horizon(&o), secs(90));
    assert_eq!(o.longest_heartbeat_gap(), secs(63));
    assert_eq!(HeartbeatPlanner::fencing_margin(&o), secs(27));
    let p = HeartbeatPlanner::new(&o, secs(5));
    assert_eq!(p.fence_at(), secs(68), "63 s after the join's publish");
    // Two missed periods with calls of up to a period: no room (validation refuses it).
    let o2 = o.clone().num_missed_table_i_am_alive_limit(2);
    assert_eq!(HeartbeatPlanner::fencing_margin(&o2), Duration::ZERO);
    // With 1 s calls: 60 s - (33 s + 1 s) leaves more than a period.
    let o2 = o2.table_operation_timeout(Some(secs(1)));
    assert_eq!(HeartbeatPlanner::fencing_margin(&o2), secs(26));
    let o1 = o.num_missed_table_i_am_alive_limit(1);
    assert_eq!(HeartbeatPlanner::fencing_margin(&o1), Duration::ZERO);
}

#[test]
fn the_fence_comes_before_the_detection_horizon_with_ttl_off() {
    let o = options();
    let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
    let h = p.on_outcome(
        secs(10),
        wall(10),
        secs(10),
        &refreshed(Lease::unbounded(wall(10))),
    );
    assert!(matches!(h, SiloHealth::Healthy { .. }));
    assert_eq!(p.fence_at(), secs(73));
    assert!(matches!(
        p.on_outcome(secs(40), wall(40), secs(41), &err()),
        SiloHealth::Failing { failures: 1, .. }
    ));
    assert!(matches!(
        p.health(secs(72), false),
        SiloHealth::Failing { .. }
    ));
    assert_eq!(
        p.health(secs(73), false),
        SiloHealth::LeaseAtRisk {
            lease: Some(Lease::unbounded(wall(10))),
            failures: 1,
            cause: Some(FailureCause::Other),
        }
    );
    // A call in flight at the horizon counts as failed.
    assert!(matches!(
        p.health(secs(73), true),
        SiloHealth::LeaseAtRisk { failures: 2, .. }
    ));
    // Retries never wait past the fence.
    assert_eq!(p.next_delay(secs(72), 0.5), secs(1));
}

#[test]
fn the_fence_is_the_lease_when_it_comes_first_and_a_failed_publish_does_not_move_it() {
    let o = options();
    // Written at wall 100 (monotonic 0); refresh by wall 120: 20 s, before detection's 60 s.
    let mut p = granted_at_wall_100(&o);
    assert_eq!(p.fence_at(), secs(20));
    p.on_outcome(secs(15), wall(115), secs(16), &err());
    assert_eq!(p.fence_at(), secs(20));
    // A lease already due when granted (a renewal that keeps failing) is at risk at once.
    let mut q = HeartbeatPlanner::new(&o, Duration::ZERO);
    let h = q.on_outcome(
        secs(50),
        wall(150),
        secs(50),
        &refreshed(lease(100, 130, 120)),
    );
    assert!(
        matches!(h, SiloHealth::LeaseAtRisk { failures: 0, .. }),
        "{h:?}"
    );
    assert_eq!(q.next_delay(secs(50), 0.5), secs(1), "retried soon");
}

#[test]
fn a_wall_clock_step_moves_no_deadline() {
    let o = options();
    let mut p = granted_at_wall_100(&o);
    // The wall clock jumps back an hour: the next outcomes carry earlier wall times, the
    // monotonic deadline stays.
    p.on_outcome(secs(5), wall(100 - 3600), secs(5), &err());
    assert_eq!(p.fence_at(), secs(20));
    assert!(matches!(
        p.health(secs(20), false),
        SiloHealth::LeaseAtRisk { .. }
    ));
}

#[test]
fn the_detection_horizon_moves_only_as_far_as_the_stored_time() {
    let o = options();
    let mut p = HeartbeatPlanner::new(&o, Duration::ZERO).with_published_wall(wall(100));
    assert_eq!(p.fence_at(), secs(63));
    let ok = refreshed(Lease::unbounded(wall(0)));
    // The wall clock stepped back an hour: nothing newer than wall 100 is stored.
    p.on_outcome(secs(30), wall(100 - 3600 + 30), secs(30), &ok);
    assert_eq!(p.fence_at(), secs(63));
    // A forward step counts no further than the monotonic time that passed.
    p.on_outcome(secs(40), wall(100 + 3600), secs(40), &ok);
    assert_eq!(p.fence_at(), secs(103));
    // Written 5 s past the stored time, 20 s of monotonic time later: 5 s more.
    let mut q = HeartbeatPlanner::new(&o, Duration::ZERO).with_published_wall(wall(100));
    q.on_outcome(secs(20), wall(105), secs(20), &ok);
    assert_eq!(q.fence_at(), secs(68));
}

#[test]
fn delays_stay_within_the_jitter() {
    let p = HeartbeatPlanner::new(&options(), Duration::ZERO);
    let now = Duration::ZERO;
    assert_eq!(p.next_delay(now, 0.0), secs(27));
    assert_eq!(p.next_delay(now, 0.5), secs(30));
    assert!(p.next_delay(now, 0.999) <= secs(33));
}

#[test]
fn failures_back_off_up_to_the_period_and_turn_into_lease_at_risk_at_the_fence() {
    let mut o = options();
    o.num_missed_table_i_am_alive_limit = 10; // detection 300 s: the lease fences first
    let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
    let granted = lease(0, 100, 90);
    p.on_outcome(Duration::ZERO, wall(0), Duration::ZERO, &refreshed(granted));
    let mut delays = Vec::new();
    for i in 1..=6u64 {
        let h = p.on_outcome(secs(i), wall(i as i64), secs(i), &err());
        assert!(matches!(h, SiloHealth::Failing { failures, .. } if failures == i as u32));
        delays.push(p.next_delay(secs(i), 0.5).as_secs());
    }
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 30]);
    let h = p.on_outcome(secs(90), wall(90), secs(90), &err());
    assert_eq!(
        h,
        SiloHealth::LeaseAtRisk {
            lease: Some(granted),
            failures: 7,
            cause: Some(FailureCause::Other),
        }
    );
    assert_eq!(p.next_delay(secs(90), 0.5), secs(1));
    let h = p.on_outcome(
        secs(91),
        wall(91),
        secs(91),
        &refreshed(lease(91, 191, 181)),
    );
    // Published again, but fenced until the own row has been read.
    assert!(matches!(h, SiloHealth::LeaseAtRisk { failures: 0, .. }));
    assert!(p.awaiting_own_row());
    let h = p.on_own_row(secs(91), &Ok(Some(SiloStatus::Active)));
    assert_eq!(
        h,
        SiloHealth::Healthy {
            lease: lease(91, 191, 181)
        }
    );
    assert_eq!(p.failures(), 0);
}

#[test]
fn after_the_fence_only_a_live_own_row_lifts_it() {
    let o = options();
    let mut p = HeartbeatPlanner::new(&o, Duration::ZERO);
    p.on_outcome(secs(64), wall(64), secs(64), &err());
    let ok = refreshed(Lease::unbounded(wall(65)));
    p.on_outcome(secs(65), wall(65), secs(65), &ok);
    // A failed read keeps the fence; the next publish asks again.
    assert!(matches!(
        p.on_own_row(secs(65), &err().map(|_| None)),
        SiloHealth::LeaseAtRisk { failures: 1, .. }
    ));
    assert!(!p.awaiting_own_row());
    p.on_outcome(secs(66), wall(66), secs(66), &ok);
    assert!(p.awaiting_own_row());
    assert_eq!(
        p.on_own_row(secs(66), &Ok(Some(SiloStatus::Dead))),
        SiloHealth::DeclaredDead
    );
    let mut q = HeartbeatPlanner::new(&o, Duration::ZERO);
    q.on_outcome(secs(64), wall(64), secs(64), &ok);
    assert_eq!(q.on_own_row(secs(64), &Ok(None)), SiloHealth::EntryMissing);
}

#[test]
fn the_next_heartbeat_never_waits_past_the_fence() {
    let mut p = HeartbeatPlanner::new(&options(), Duration::ZERO);
    p.on_outcome(
        Duration::ZERO,
        wall(0),
        Duration::ZERO,
        &refreshed(lease(0, 20, 10)),
    );
    assert_eq!(p.next_delay(secs(4), 0.5), secs(6));
}

#[test]
fn extreme_periods_never_panic() {
    let mut o = options();
    o.i_am_alive_table_publish_timeout = Duration::MAX;
    o.heartbeat_retry_backoff = Duration::MAX;
    o.num_missed_table_i_am_alive_limit = u32::MAX;
    let mut p = HeartbeatPlanner::new(&o, Duration::MAX);
    assert!(p.next_delay(Duration::ZERO, 0.999) >= secs(1));
    p.on_outcome(
        Duration::MAX,
        Timestamp::from_millis(i64::MIN),
        Duration::MAX,
        &err(),
    );
    let _ = p.next_delay(Duration::ZERO, 0.5);
    let _ = p.fence_at();
    let s = crate::runtime::cleanup_rules::CleanupSchedule::new(&MembershipOptions {
        defunct_silo_cleanup_period: Some(Duration::MAX),
        defunct_silo_cleanup_jitter: Duration::MAX,
        ..MembershipOptions::default()
    })
    .unwrap();
    let _ = (s.first_delay(1.0), s.next_delay(1.0));
}

#[test]
fn missing_and_dead_entries_are_final() {
    let mut p = HeartbeatPlanner::new(&options(), Duration::ZERO);
    let z = Duration::ZERO;
    assert!(
        p.on_outcome(z, wall(0), z, &Ok(HeartbeatOutcome::NotFound))
            .is_final()
    );
    assert!(
        p.on_outcome(
            z,
            wall(0),
            z,
            &Ok(HeartbeatOutcome::DeclaredDead {
                lease: lease(0, 1, 1)
            })
        )
        .is_final()
    );
}

#[test]
fn the_host_may_serve_until_the_fence_horizon_and_not_while_fenced() {
    let mut p = HeartbeatPlanner::new(&options(), Duration::ZERO);
    assert_eq!(p.serve_until(), Some(secs(63)));
    // Published after the horizon passed: the horizon moves on, but the fence holds until the
    // own row has been read live.
    let ok = refreshed(Lease::unbounded(wall(70)));
    p.on_outcome(secs(70), wall(70), secs(70), &ok);
    assert_eq!(p.serve_until(), None);
    p.on_own_row(secs(70), &Ok(Some(SiloStatus::Active)));
    assert_eq!(p.serve_until(), Some(secs(133)));
}

/// The host's health shows why heartbeats fail, not only which operation failed.
#[test]
fn failing_health_carries_the_errors_cause() {
    let mut p = HeartbeatPlanner::new(&MembershipOptions::default(), secs(0));
    let refused = Err(MembershipError::Unavailable {
        operation: "update_i_am_alive",
        source: Box::new(std::io::Error::from_raw_os_error(111)),
    });
    match p.on_outcome(secs(1), wall(1), secs(1), &refused) {
        SiloHealth::Failing { last_error, .. } => {
            let cause = std::io::Error::from_raw_os_error(111).to_string();
            assert!(last_error.contains(&cause), "{last_error}");
        }
        other => panic!("{other:?}"),
    }
}

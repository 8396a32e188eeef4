//! Options and silo addresses a host gets wrong are refused with an error naming what is wrong,
//! through the public API only.

use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, Clock, Credentials, ManualClock, MembershipError,
    MembershipOptions, SiloAddress, Timestamp,
};

fn option_of(r: cassandra_membership::Result<()>) -> String {
    match r {
        Err(MembershipError::InvalidConfiguration { option, .. }) => option,
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    }
}

#[test]
fn membership_options_that_cannot_work_are_refused() {
    let d = MembershipOptions::default;
    assert_eq!(
        option_of(d().heartbeat_retry_backoff(Duration::ZERO).validate()),
        "heartbeat_retry_backoff"
    );
    assert_eq!(
        option_of(d().num_votes_for_death_declaration(0).validate()),
        "num_votes_for_death_declaration"
    );
    assert_eq!(
        option_of(
            d().death_vote_expiration_timeout(Some(Duration::ZERO))
                .validate()
        ),
        "death_vote_expiration_timeout"
    );
}

#[test]
fn cassandra_options_name_the_full_path_and_never_overflow() {
    let blank = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("   ");
    assert_eq!(option_of(blank.validate()), "cluster_id");
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c")
        .ttl(true);
    o.ttl_renewal_interval = Some(Duration::MAX);
    let r = std::panic::catch_unwind(|| o.validate());
    assert_eq!(
        option_of(r.expect("validate() must not panic")),
        "ttl_renewal_interval"
    );
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c");
    o.membership.defunct_silo_expiration = Duration::ZERO;
    assert_eq!(
        option_of(o.validate()),
        "membership.defunct_silo_expiration"
    );
}

#[test]
fn a_misspelt_credentials_field_is_an_error() {
    assert!(
        toml::from_str::<Credentials>("username = \"u\"\npassword = \"\"\npasword = \"p\"")
            .is_err()
    );
}

#[test]
fn a_manual_clock_never_wraps() {
    let c = ManualClock::new(Timestamp::from_millis(i64::MAX - 5));
    let r = std::panic::catch_unwind(|| c.advance(Duration::from_secs(1)));
    assert!(r.is_ok());
    assert_eq!(c.now(), Timestamp::from_millis(i64::MAX));
}

#[test]
fn only_canonical_silo_addresses_parse() {
    for bad in [
        "10.0.0.7:11111@+7",
        "10.0.0.7:11111@007",
        "10.0.0.7:05@1",
        "[0:0:0:0:0:0:0:1]:11111@1",
        "[::1%0]:11111@1",
    ] {
        assert!(
            matches!(
                bad.parse::<SiloAddress>(),
                Err(MembershipError::InvalidSiloAddress { .. })
            ),
            "{bad:?} parsed as {:?}",
            bad.parse::<SiloAddress>().map(|a| a.to_string())
        );
    }
    let a: SiloAddress = "[::1]:11111@7".parse().unwrap();
    assert_eq!(a.to_string(), "[::1]:11111@7");
}

/// A process that forgot its service or cluster id must not silently join a cluster named
/// "default" that another forgetful process shares: both ids have no default.
#[test]
fn the_service_and_cluster_ids_have_no_default() {
    let reason_of = |o: CassandraClusteringOptions| match o.validate() {
        Err(MembershipError::InvalidConfiguration { option, reason }) => (option, reason),
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    };
    let (option, reason) = reason_of(CassandraClusteringOptions::default());
    assert_eq!(option, "service_id");
    assert!(
        reason.contains("not set") && reason.contains("no default"),
        "{reason}"
    );
    let (option, reason) = reason_of(CassandraClusteringOptions::default().service_id("shop"));
    assert_eq!(option, "cluster_id");
    assert!(reason.contains("not set"), "{reason}");
    let (option, _) = reason_of(CassandraClusteringOptions::default().cluster_id("blue"));
    assert_eq!(option, "service_id");
    CassandraClusteringOptions::default()
        .service_id("shop")
        .cluster_id("blue")
        .validate()
        .unwrap();
}

/// A config file without the ids parses (every other field has its default) and fails
/// validation naming the missing id — the error a host reports, not a serde parse error.
#[test]
fn a_config_file_without_the_ids_parses_and_fails_validation_naming_them() {
    let o: CassandraClusteringOptions =
        toml::from_str("keyspace = \"orleans\"\nttl = true\n").expect("parses");
    assert_eq!(option_of(o.validate()), "service_id");
    let o: CassandraClusteringOptions = toml::from_str("service_id = \"shop\"\n").expect("parses");
    assert_eq!(option_of(o.validate()), "cluster_id");
    let o: CassandraClusteringOptions =
        toml::from_str("service_id = \"shop\"\ncluster_id = \"blue\"\n").unwrap();
    o.validate().unwrap();
    assert_eq!(
        (o.service_id.as_str(), o.cluster_id.as_str()),
        ("shop", "blue")
    );
}

/// `connect` validates before it sends anything: unset ids fail at once, naming the field,
/// even with no node at the contact point.
#[test]
fn connect_refuses_unset_ids_before_connecting() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let o = CassandraClusteringOptions::default()
        .service_id("shop")
        .contact_points(["127.0.0.1:1"]);
    match rt.block_on(cassandra_membership::CassandraMembershipTable::connect(o)) {
        Err(MembershipError::InvalidConfiguration { option, .. }) => {
            assert_eq!(option, "cluster_id")
        }
        other => panic!("expected InvalidConfiguration, got {other:?}"),
    }
}

/// `is_transient()` is "the same call may simply be sent again": an outcome that is not known
/// may have applied, so it is not transient (the docs forbid the blind retry).
#[test]
fn an_unknown_outcome_is_not_transient() {
    let unknown = MembershipError::OutcomeUnknown {
        operation: "insert_row",
        detail: "injected".into(),
        source: "injected".into(),
    };
    assert!(!unknown.is_transient());
    assert!(unknown.is_outcome_unknown());
    for transient in [
        MembershipError::Timeout {
            operation: "read_all",
            source: "injected".into(),
        },
        MembershipError::Unavailable {
            operation: "read_all",
            source: "injected".into(),
        },
        MembershipError::Contention {
            operation: "read_all",
            attempts: 8,
            elapsed: Duration::from_secs(1),
        },
    ] {
        assert!(transient.is_transient(), "{transient:?}");
        assert!(!transient.is_outcome_unknown(), "{transient:?}");
    }
    let missing = MembershipError::KeyspaceMissing {
        keyspace: "orleans".into(),
    };
    assert!(!missing.is_transient() && !missing.is_outcome_unknown());
}

/// A missing keyspace says which, and what to do: create it, or (development) let
/// `initialize` create it.
#[test]
fn a_missing_keyspace_says_what_to_do() {
    let text = MembershipError::KeyspaceMissing {
        keyspace: "orleans".into(),
    }
    .to_string();
    assert!(text.contains("\"orleans\" does not exist"), "{text}");
    assert!(text.contains("create it"), "{text}");
    assert!(text.contains("create_keyspace_with_replication"), "{text}");
    assert!(!text.contains("schema mismatch"), "{text}");
}

/// Orleans' `MaxDefunctSiloEntries`: a count (default 25), `"off"` to keep every Dead entry; a
/// negative count reaches `validate`, which names the option (as Orleans' validator does).
#[test]
fn max_defunct_silo_entries_is_a_count_or_off_and_a_negative_one_is_refused_by_name() {
    assert_eq!(
        MembershipOptions::default().max_defunct_silo_entries,
        Some(25)
    );
    let o: MembershipOptions = toml::from_str("max_defunct_silo_entries = 0").unwrap();
    assert_eq!(o.max_defunct_silo_entries, Some(0));
    o.validate().unwrap();
    let o: MembershipOptions = toml::from_str("max_defunct_silo_entries = \"off\"").unwrap();
    assert_eq!(o.max_defunct_silo_entries, None);
    o.validate().unwrap();
    let negative: MembershipOptions = toml::from_str("max_defunct_silo_entries = -1")
        .expect("a negative count parses, so that validate can name it");
    assert_eq!(option_of(negative.validate()), "max_defunct_silo_entries");
    assert_eq!(
        option_of(
            MembershipOptions::default()
                .max_defunct_silo_entries(Some(-3))
                .validate()
        ),
        "max_defunct_silo_entries"
    );
    let mut o = CassandraClusteringOptions::default()
        .keyspace("ks")
        .service_id("svc")
        .cluster_id("c");
    o.membership.max_defunct_silo_entries = Some(-1);
    assert_eq!(
        option_of(o.validate()),
        "membership.max_defunct_silo_entries"
    );
    for wrong in ["\"soon\"", "2.5", "true"] {
        assert!(
            toml::from_str::<MembershipOptions>(&format!("max_defunct_silo_entries = {wrong}"))
                .is_err(),
            "{wrong} is no count"
        );
    }
    let back =
        toml::to_string(&MembershipOptions::default().max_defunct_silo_entries(None)).unwrap();
    assert!(
        back.contains("max_defunct_silo_entries = \"off\""),
        "{back}"
    );
    let back = toml::to_string(&MembershipOptions::default()).unwrap();
    assert!(back.contains("max_defunct_silo_entries = 25"), "{back}");
}

/// A `password_file` that is a FIFO no one writes (a secrets agent not there yet): `connect`
/// answers within `connect_timeout`, and the runtime it ran on drops at once — the read must not
/// sit in the runtime's blocking pool, which a runtime's drop waits for (the CLI and
/// the service hung at exit).
#[test]
fn a_password_fifo_no_one_writes_bounds_connect_and_never_pins_the_runtime() {
    let _one = FIFO_TESTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = std::env::temp_dir().join(format!("cm-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("password");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    // Nothing listens there: the connect would fail fast, after the password.
    let mut options = CassandraClusteringOptions::default()
        .contact_points(["127.0.0.1:1"])
        .connect_timeout(Duration::from_secs(1));
    options.service_id = "svc".into();
    options.cluster_id = "c".into();
    options.credentials = Some(Credentials::from_file("app", &fifo));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(cassandra_membership::CassandraMembershipTable::connect(
            options,
        ));
        let answered = started.elapsed();
        drop(rt);
        let _ = tx.send((r.err().map(|e| e.to_string()), answered, started.elapsed()));
    });
    let (err, answered, dropped) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("connect (or the runtime's drop) still waiting on the FIFO after 10 s");
    // The reading thread is still blocked on the FIFO: a write ends it (and its entry).
    // (O_NONBLOCK: never waits, whether a reader is there or not.)
    use std::os::unix::fs::OpenOptionsExt;
    let released = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(0o4000)
        .open(&fifo);
    drop(released);
    let _ = std::fs::remove_dir_all(&dir);
    let err = err.expect("connect succeeded with no node");
    assert!(
        answered < Duration::from_millis(1_900),
        "answered after {answered:?}"
    );
    assert!(
        dropped < answered + Duration::from_millis(500),
        "the runtime's drop waited: {dropped:?}"
    );
    assert!(
        err.contains("password_file") && err.contains("connect_timeout"),
        "{err}"
    );
}

/// The FIFO tests count this process's reading threads: one at a time.
static FIFO_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The threads named `cassandra-membership-password-file` of this process.
fn password_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter(|t| {
                    t.as_ref().is_ok_and(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.starts_with("cassandra-membe"))
                    })
                })
                .count()
        })
        .unwrap_or(0)
}

/// A host retrying `connect` while the secrets agent is not there yet: each
/// timed-out attempt left a thread blocked on the FIFO, and when the agent wrote once a stale
/// thread took the password while the live attempt read an empty file (`InvalidConfiguration`,
/// which a host does not retry). One read per path is in flight; the live attempt gets it.
#[test]
fn connects_retried_on_a_password_fifo_share_one_read_and_the_live_one_gets_the_password() {
    use std::io::Write;
    let _one = FIFO_TESTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = password_threads();
    let dir = std::env::temp_dir().join(format!("cm-fifo-retry-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("password");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    let options = |timeout: Duration| {
        let mut o = CassandraClusteringOptions::default()
            .contact_points(["127.0.0.1:1"])
            .connect_timeout(timeout);
        o.service_id = "svc".into();
        o.cluster_id = "c".into();
        o.credentials = Some(Credentials::from_file("app", &fifo));
        o
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let connect = |timeout| {
        rt.block_on(cassandra_membership::CassandraMembershipTable::connect(
            options(timeout),
        ))
        .expect_err("connect succeeded with no node")
    };
    for _ in 0..5 {
        let e = connect(Duration::from_millis(200));
        assert!(e.to_string().contains("connect_timeout"), "{e}");
    }
    let readers = password_threads().saturating_sub(before);
    // The agent arrives and writes the password once, while the next attempt waits.
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut f = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            f.write_all(b"s3cret-password\n").unwrap();
        })
    };
    let e = connect(Duration::from_secs(3));
    writer.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        readers <= 1,
        "{readers} threads blocked on one FIFO after 5 attempts"
    );
    let text = e.to_string();
    assert!(!text.contains("s3cret"), "the password in an error: {text}");
    // It got the password and went on to the (absent) node.
    assert!(
        matches!(e, MembershipError::Unavailable { .. }) && !text.contains("password_file"),
        "{e:?}"
    );
}

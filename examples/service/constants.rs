//! What the service promises its deployment: the port, the paths the probes and clients use,
//! and its time bounds. deploy/kubernetes.yaml is checked against these (tests/service_deploy.rs
//! includes this file), so the manifest and the service cannot drift apart.

use std::time::Duration;

/// The port the service listens on in its pod (`--listen 0.0.0.0:8080`).
pub(crate) const PORT: u16 = 8080;
/// Readiness: 200 while the silo may serve.
pub(crate) const READYZ: &str = "/readyz";
/// Liveness (and the startup probe): 200 while the silo's health is not final.
pub(crate) const LIVEZ: &str = "/livez";
/// The service's work: 200 while serving, 503 while fenced.
pub(crate) const WORK: &str = "/work";
/// The silo's membership view as JSON.
pub(crate) const MEMBERS: &str = "/members";
/// How long the server drains its open connections after a signal (the leave runs meanwhile).
pub(crate) const DRAIN: Duration = Duration::from_secs(10);
/// How long a join a signal interrupted may still take before it is dropped.
pub(crate) const JOIN_GRACE: Duration = Duration::from_secs(10);
/// The pod's `terminationGracePeriodSeconds`: above the longest shutdown — a join a signal
/// interrupted ([`JOIN_GRACE`]), then the leave (`leave_timeout`, at most
/// [`MAX_LEAVE_TIMEOUT`], whatever the per-call timeouts) and the read after it
/// ([`AFTER_LEAVE_READ`]) with the drain ([`DRAIN`]) alongside — with room to spare.
pub(crate) const TERMINATION_GRACE: Duration = Duration::from_secs(90);
/// The longest `leave_timeout` the service accepts: with the read after it, the drain and an
/// interrupted join it stays under [`TERMINATION_GRACE`] (a longer one is refused at start, exit 2).
pub(crate) const MAX_LEAVE_TIMEOUT: Duration = Duration::from_secs(60);
/// The options key of the Cassandra password (`SERVICE_CASSANDRA__CREDENTIALS__PASSWORD`): read
/// from the environment as a string, whatever it looks like, and never quoted in an error.
pub(crate) const PASSWORD_KEY: &str = "cassandra.credentials.password";
/// How long the service reads its entry after a leave, to print its status (the leave's
/// writes are bounded by `leave_timeout`; this read by this).
pub(crate) const AFTER_LEAVE_READ: Duration = Duration::from_secs(5);
/// The environment variable Kubernetes' downward API fills with the pod's IP.
pub(crate) const POD_IP: &str = "POD_IP";
/// The prefix of the service's environment overrides (`SERVICE_LISTEN`,
/// `SERVICE_CASSANDRA__KEYSPACE`, …).
pub(crate) const ENV_PREFIX: &str = "SERVICE_";

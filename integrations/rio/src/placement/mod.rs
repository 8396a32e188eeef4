//! [`CassandraObjectPlacement`]: rio's `ObjectPlacement` on Cassandra, one conditional write per
//! placement so that two servers racing for one object never both win.

mod bind;
mod expiry;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cassandra_membership::Timestamp;
use rio_rs::ObjectId;
use rio_rs::errors::ObjectPlacementError;
use rio_rs::object_placement::{ObjectPlacement, ObjectPlacementItem};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlTimestamp, CqlValue};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use self::bind::{
    DeleteValues, IndexValues, MoveValues, ObjectKey, PlaceValues, ServerKey, UnindexValues,
};
use self::expiry::{placement_ttl_seconds, renew};
use crate::CassandraMembershipStorage;
use crate::cql::{self, Cql};
use crate::error::{RioStoreError, RioStoreResult};
use crate::mapping::endpoint;

/// Where the placement store keeps its rows (in the membership table's keyspace).
///
/// ```
/// use cassandra_membership_rio::PlacementOptions;
/// let o: PlacementOptions = toml::from_str("table = \"placements\"").unwrap();
/// assert_eq!(o.table, "placements");
/// assert_eq!(o.server_table, "rio_placements_by_server");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PlacementOptions {
    /// Object → server, one partition per object. Default `rio_placements`.
    pub table: String,
    /// Server → its objects, one partition per server (for `clean_server` and renewals).
    /// Default `rio_placements_by_server`.
    pub server_table: String,
}

impl Default for PlacementOptions {
    fn default() -> Self {
        PlacementOptions {
            table: "rio_placements".to_owned(),
            server_table: "rio_placements_by_server".to_owned(),
        }
    }
}

impl PlacementOptions {
    /// Checks both table names; the error names the one at fault.
    pub fn validate(&self) -> RioStoreResult<()> {
        cql::validate_table("table", &self.table)?;
        cql::validate_table("server_table", &self.server_table)?;
        if self.table == self.server_table {
            return Err(RioStoreError::config(
                "server_table",
                "must differ from `table`",
            ));
        }
        Ok(())
    }
}

/// rio's [`ObjectPlacement`] on Cassandra, beside the membership table of a
/// [`CassandraMembershipStorage`] (same session, keyspace and cluster).
///
/// - **At most one server per object.** `update` is a conditional insert (`IF NOT EXISTS`, a
///   Paxos round on the object's own partition): of two servers racing to place one object,
///   exactly one wins; the other gets an error and activates nothing. An existing placement on
///   a server that is gone (no I-am-alive for `gone_after`; merely inactive is not enough, see
///   MAPPING.md) is taken over conditionally on that owner (`IF server = …`), so a concurrent
///   takeover by a third server also has one winner.
/// - **Fenced servers serve nothing.** `lookup` and `update` refuse while this process's member
///   may not serve ([`CassandraMembershipStorage::fenced`]), and while the placement renewals
///   have failed for longer than their margin: rio looks the object up before every request,
///   so a fenced server handles no request.
/// - **Expiry with the membership table.** With storage-side expiry on, every row carries the
///   membership table's write TTL plus the adapter's `gone_after` plus two renewal intervals,
///   and this value renews the rows it placed every renewal interval while its member is not
///   final: a placement never expires before its server's entry could, and is gone at most that
///   TTL after its server stopped.
///
/// Clones share one set of placements and one renewal task (stopped when the last is dropped).
#[derive(Clone)]
pub struct CassandraObjectPlacement {
    inner: Arc<Inner>,
}

struct Inner {
    cql: Cql,
    service_id: String,
    cluster_id: String,
    tables: PlacementOptions,
    statements: Statements,
    storage: CassandraMembershipStorage,
    /// The TTL of every row, seconds; 0 without expiry.
    ttl: i32,
    /// The objects this value placed (or adopted), by (kind, id).
    placed: Mutex<HashMap<(String, String), Placed>>,
    renewer: Mutex<Option<JoinHandle<()>>>,
    /// With expiry: how long after its last renewal a placement is still sure to be stored (the
    /// margin its TTL has beyond the entry's).
    renewal_margin: Option<Duration>,
}

/// A placement this value renews.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    /// The server it names (this process's).
    pub(crate) server: String,
    /// Its `placed_at`, written again by every renewal.
    pub(crate) at: Timestamp,
    /// When the last write that gave it a fresh TTL started (placing, adopting or renewing).
    pub(crate) renewed: tokio::time::Instant,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(r) = self.renewer.get_mut()
            && let Some(task) = r.take()
        {
            task.abort();
        }
    }
}

struct Statements {
    place: PreparedStatement,
    move_placement: PreparedStatement,
    lookup: PreparedStatement,
    lookup_serial: PreparedStatement,
    delete: PreparedStatement,
    index: PreparedStatement,
    unindex: PreparedStatement,
    read_server: PreparedStatement,
}

impl fmt::Debug for CassandraObjectPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CassandraObjectPlacement")
            .field("cluster_id", &self.inner.cluster_id)
            .field("tables", &self.inner.tables)
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// rio's `ip:port` server text as an endpoint (`None` when it is not one).
fn parse_server(server: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = server.rsplit_once(':')?;
    endpoint(ip, port).ok()
}

fn object_name(kind: &str, id: &str) -> String {
    format!("{kind}/{id}")
}

impl CassandraObjectPlacement {
    /// The placement store of `storage`'s cluster: creates its two tables if missing (in the
    /// membership keyspace), prepares its statements and, with storage-side expiry on, starts
    /// renewing the placements it makes. Fails with `InvalidConfiguration` when `storage` is not
    /// on a [`CassandraMembershipTable`](cassandra_membership::CassandraMembershipTable).
    #[tracing::instrument(skip(storage), err)]
    pub async fn connect(
        storage: &CassandraMembershipStorage,
        options: PlacementOptions,
    ) -> RioStoreResult<Self> {
        options.validate()?;
        let Some((session, membership)) = storage.cassandra() else {
            return Err(RioStoreError::config(
                "storage",
                "the placement store needs a membership storage on Cassandra (`connect` or `with_cassandra_table`)",
            ));
        };
        let cql = Cql::new(Arc::clone(session), membership, cql::Keyed::Cluster);
        cql.ddl(cql::CREATE_PLACEMENTS, &options.table).await?;
        cql.ddl(cql::CREATE_PLACEMENTS_BY_SERVER, &options.server_table)
            .await?;
        let (t, s) = (options.table.as_str(), options.server_table.as_str());
        let statements = Statements {
            place: cql.prepare(cql::PLACE, t, false).await?,
            move_placement: cql.prepare(cql::MOVE_PLACEMENT, t, false).await?,
            lookup: cql.prepare(cql::LOOKUP_PLACEMENT, t, false).await?,
            lookup_serial: cql.prepare(cql::LOOKUP_PLACEMENT, t, true).await?,
            delete: cql.prepare(cql::DELETE_PLACEMENT, t, false).await?,
            index: cql.prepare(cql::INDEX_PLACEMENT, s, false).await?,
            unindex: cql.prepare(cql::UNINDEX_PLACEMENT, s, false).await?,
            read_server: cql.prepare(cql::READ_SERVER_PLACEMENTS, s, false).await?,
        };
        let ttl = placement_ttl_seconds(
            membership,
            storage.options().gone_after(),
            Timestamp::now().as_millis() / 1000,
        );
        let renewal = (ttl > 0).then(|| Duration::from_secs(membership.renewal_seconds()));
        // A placement outlives its entry by gone_after + one interval when renewed on time.
        let renewal_margin = renewal.map(|r| r + storage.options().gone_after());
        let placement = CassandraObjectPlacement {
            inner: Arc::new(Inner {
                cql,
                service_id: membership.service_id.clone(),
                cluster_id: membership.cluster_id.clone(),
                tables: options,
                statements,
                storage: storage.clone(),
                ttl,
                placed: Mutex::default(),
                renewer: Mutex::default(),
                renewal_margin,
            }),
        };
        if let Some(every) = renewal {
            let task = tokio::spawn(renew(Arc::downgrade(&placement.inner), every));
            *placement.renewer() = Some(task);
        }
        Ok(placement)
    }

    fn renewer(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.inner.renewer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn placed(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Placed>> {
        // Single inserts and removes: a panic while holding it leaves the map consistent.
        self.inner.placed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TTL each placement row is written with (`None` without storage-side expiry).
    pub fn ttl(&self) -> Option<Duration> {
        (self.inner.ttl > 0).then(|| Duration::from_secs(self.inner.ttl.unsigned_abs().into()))
    }

    /// The placement store's tables.
    pub fn options(&self) -> &PlacementOptions {
        &self.inner.tables
    }

    fn object_key<'a>(&'a self, kind: &'a str, id: &'a str) -> ObjectKey<'a> {
        ObjectKey {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            object_kind: kind,
            object_id: id,
        }
    }

    fn check_fence(&self) -> RioStoreResult<()> {
        if let Some((server, health)) = self.inner.storage.fenced() {
            return Err(RioStoreError::Fenced {
                server: server.to_string(),
                health: format!("{health:?}"),
            });
        }
        Ok(())
    }

    /// A placement whose renewals kept failing may lapse while this server still hosts its
    /// object: that object is not served until a renewal succeeds. Per object: one placement
    /// whose renewal fails (or a pass too long to finish in time) fences no other.
    fn check_renewed(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        let Some(margin) = self.inner.renewal_margin else {
            return Ok(());
        };
        let since = self
            .placed()
            .get(&(kind.to_owned(), id.to_owned()))
            .filter(|p| p.server == server)
            .map(|p| p.renewed.elapsed());
        match since {
            Some(since) if since > margin => Err(RioStoreError::Fenced {
                server: server.to_owned(),
                health: format!(
                    "the renewal of {} is overdue by {:?}",
                    object_name(kind, id),
                    since - margin
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The server `kind/id` is placed on, if any. Refused while this process is fenced.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id), err)]
    pub async fn lookup_server(&self, kind: &str, id: &str) -> RioStoreResult<Option<String>> {
        self.check_fence()?;
        let server = self.read_server(kind, id, false).await?;
        if let Some(s) = &server
            && self.inner.ttl > 0
            && parse_server(s).is_some_and(|ep| self.inner.storage.is_own(ep))
        {
            let known = self
                .placed()
                .get(&(kind.to_owned(), id.to_owned()))
                .is_some_and(|p| p.server == *s);
            if known {
                self.check_renewed(kind, id, s)?;
            } else {
                self.adopt(kind, id, s).await?;
            }
        }
        Ok(server)
    }

    /// A placement naming this process's server that this value did not make (a restart at
    /// the same address, or a placement whose answer was lost): rio serves it without calling
    /// `update`, so it is renewed at once (its remaining TTL is unknown) and from then on, or
    /// it would expire while served.
    async fn adopt(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        let started = tokio::time::Instant::now();
        let at = Timestamp::now();
        if self.renew_one(kind, id, server, at).await? {
            debug!(object = %object_name(kind, id), "placement naming this server adopted for renewal");
            self.placed().insert(
                (kind.to_owned(), id.to_owned()),
                Placed {
                    server: server.to_owned(),
                    at,
                    renewed: started,
                },
            );
            Ok(())
        } else {
            Err(RioStoreError::PlacedElsewhere {
                object: object_name(kind, id),
                owner: "another server (it changed meanwhile)".to_owned(),
            })
        }
    }

    async fn read_server(
        &self,
        kind: &str,
        id: &str,
        serial: bool,
    ) -> RioStoreResult<Option<String>> {
        let s = &self.inner.statements;
        let statement = if serial { &s.lookup_serial } else { &s.lookup };
        let rows = self
            .inner
            .cql
            .read("lookup placement", statement, self.object_key(kind, id))
            .await?;
        let row = rows
            .maybe_first_row::<(Option<String>, Option<CqlTimestamp>)>()
            .map_err(|e| RioStoreError::CorruptData {
                table: self.inner.tables.table.clone(),
                detail: e.to_string(),
            })?;
        Ok(row.and_then(|(server, _)| server))
    }

    /// Places `kind/id` on `server`, unless another server that is not gone holds it: exactly
    /// one of several servers placing one object at once succeeds; the others get
    /// [`RioStoreError::PlacedElsewhere`] (or `Fenced` when this process is fenced).
    /// Placing it again on the server that holds it succeeds and writes nothing.
    ///
    /// Gives up with [`RioStoreError::OutcomeUnknown`] after the fence's serve window
    /// (`gone_after` − one heartbeat period): rio holds its placement lock meanwhile, so every
    /// lookup of the server waits for it, and no placement is worth longer than the server may
    /// serve without a fresh heartbeat. A placement written nonetheless names this server and
    /// is adopted by the next lookup.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id), err)]
    pub async fn place(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        let o = self.inner.storage.options();
        let window = o.gone_after().saturating_sub(o.heartbeat_period);
        match tokio::time::timeout(window, self.place_now(kind, id, server)).await {
            Ok(placed) => placed,
            Err(_) => Err(RioStoreError::OutcomeUnknown {
                operation: "place",
                source: format!("no decision within {window:?} (gone_after − one period)").into(),
            }),
        }
    }

    async fn place_now(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        self.check_fence()?;
        let now = Timestamp::now();
        let started = tokio::time::Instant::now();
        // The index row first: a placement is never without it, so `clean_server` finds it.
        self.index(kind, id, server).await?;
        let values = PlaceValues {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            object_kind: kind,
            object_id: id,
            server,
            placed_at: CqlTimestamp(now.as_millis()),
            ttl: self.inner.ttl,
        };
        // A few rounds at most: each lost round means another server changed the row.
        for _ in 0..4 {
            let owner = match self
                .inner
                .cql
                .conditional("place", &self.inner.statements.place, &values)
                .await
            {
                Ok(reply) if reply.applied => {
                    return self.placed_on(kind, id, server, now, started);
                }
                Ok(reply) => match reply.current("server") {
                    Some(CqlValue::Text(owner)) => owner.clone(),
                    // A row without a server (a half-expired one): taken over below.
                    _ => String::new(),
                },
                Err(e @ RioStoreError::OutcomeUnknown { .. }) => {
                    // Settled by a linearizable read: the row names us exactly when it applied.
                    match self.read_server(kind, id, true).await {
                        Ok(Some(s)) if s == server => {
                            return self.placed_on(kind, id, server, now, started);
                        }
                        Ok(Some(s)) => s,
                        Ok(None) => continue,
                        Err(_) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            if owner == server {
                return self.placed_on(kind, id, server, now, started);
            }
            if !owner.is_empty() && self.owner_may_be_serving(&owner).await? {
                self.unindex(kind, id, server).await.ok();
                return Err(RioStoreError::PlacedElsewhere {
                    object: object_name(kind, id),
                    owner,
                });
            }
            // The owner is gone (rio calls `clean_server` first; a placement it missed is
            // taken over here), conditionally on it still being the owner.
            let moved = MoveValues {
                service_id: &self.inner.service_id,
                cluster_id: &self.inner.cluster_id,
                object_kind: kind,
                object_id: id,
                server,
                placed_at: CqlTimestamp(now.as_millis()),
                // A row without a server (its cells expired before its row marker: written
                // with different TTLs) is taken over on `server = null`, which `''` never
                // matches.
                previous: (!owner.is_empty()).then_some(owner.as_str()),
                ttl: self.inner.ttl,
            };
            match self
                .inner
                .cql
                .conditional(
                    "take over placement",
                    &self.inner.statements.move_placement,
                    &moved,
                )
                .await
            {
                Ok(reply) if reply.applied => {
                    info!(object = %object_name(kind, id), previous = %owner, "placement taken over from a gone server");
                    return self.placed_on(kind, id, server, now, started);
                }
                Ok(_) => debug!("another server changed the placement first: reading again"),
                Err(RioStoreError::OutcomeUnknown { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.unindex(kind, id, server).await.ok();
        match self.read_server(kind, id, true).await? {
            Some(s) if s == server => self.placed_on(kind, id, server, now, started),
            owner => Err(RioStoreError::PlacedElsewhere {
                object: object_name(kind, id),
                owner: owner.unwrap_or_default(),
            }),
        }
    }

    fn placed_on(
        &self,
        kind: &str,
        id: &str,
        server: &str,
        at: Timestamp,
        started: tokio::time::Instant,
    ) -> RioStoreResult<()> {
        // Remembered only to be renewed: without expiry the map would only grow (`remove`
        // reads the holder instead).
        if self.inner.ttl > 0 {
            self.placed().insert(
                (kind.to_owned(), id.to_owned()),
                Placed {
                    server: server.to_owned(),
                    at,
                    renewed: started,
                },
            );
        }
        // A place that took long (rio holds its placement lock meanwhile) may end after this
        // server was fenced: then it serves nothing, though the placement stays its own.
        self.check_fence()
    }

    /// True while the process named by `owner` (`ip:port`) may still serve its objects: it is
    /// not gone. A placement is taken over, or removed by `clean_server`, only once its owner
    /// is gone: rio asks for both as soon as the owner is merely inactive, which it may be while
    /// still serving (MAPPING.md, "Taking over a placement").
    async fn owner_may_be_serving(&self, owner: &str) -> RioStoreResult<bool> {
        let Some(ep) = parse_server(owner) else {
            return Ok(false);
        };
        self.inner
            .storage
            .may_be_serving(ep)
            .await
            .map_err(|e| RioStoreError::Cassandra {
                operation: "owner liveness",
                source: e.to_string().into(),
            })
    }

    async fn index(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        let values = IndexValues {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            server,
            object_kind: kind,
            object_id: id,
            ttl: self.inner.ttl,
        };
        self.inner
            .cql
            .plain("index placement", &self.inner.statements.index, values)
            .await
    }

    async fn unindex(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<()> {
        let values = UnindexValues {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            server,
            object_kind: kind,
            object_id: id,
        };
        self.inner
            .cql
            .plain("unindex placement", &self.inner.statements.unindex, values)
            .await
    }

    /// Deletes the placement of `kind/id` if `server` holds it (conditional), and its index
    /// row. True when it deleted it.
    async fn unplace(&self, kind: &str, id: &str, server: &str) -> RioStoreResult<bool> {
        let values = DeleteValues {
            service_id: &self.inner.service_id,
            cluster_id: &self.inner.cluster_id,
            object_kind: kind,
            object_id: id,
            server,
        };
        let mut attempts = 0;
        let deleted = loop {
            attempts += 1;
            match self
                .inner
                .cql
                .conditional("delete placement", &self.inner.statements.delete, &values)
                .await
            {
                Ok(reply) => break reply.applied,
                // Settled by a linearizable read: still ours means it did not apply, and never
                // will (the read completes or supersedes it): sent again.
                Err(e @ RioStoreError::OutcomeUnknown { .. }) => {
                    match self.read_server(kind, id, true).await {
                        Ok(Some(s)) if s == server => {
                            if attempts >= 3 {
                                return Err(e);
                            }
                            debug!(
                                "the delete whose answer was lost did not apply: sending it again"
                            );
                        }
                        Ok(_) => break true,
                        Err(_) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        self.unindex(kind, id, server).await?;
        let key = (kind.to_owned(), id.to_owned());
        let mut placed = self.placed();
        if placed.get(&key).is_some_and(|p| p.server == server) {
            placed.remove(&key);
        }
        Ok(deleted)
    }

    /// Removes every placement held by `server` once it is gone (rio calls this for a server
    /// it found inactive, which may still be serving: then it removes nothing): each
    /// conditionally on `server` still holding it, so an object already re-placed elsewhere
    /// stays. Returns how many it removed.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id), err)]
    pub async fn clean(&self, server: &str) -> RioStoreResult<usize> {
        if self.owner_may_be_serving(server).await? {
            debug!(server, "inactive but not gone: its placements stay");
            return Ok(0);
        }
        let objects = self
            .inner
            .cql
            .read_all_pages(
                "read server placements",
                &self.inner.statements.read_server,
                ServerKey {
                    service_id: &self.inner.service_id,
                    cluster_id: &self.inner.cluster_id,
                    server,
                },
                |rows| {
                    let corrupt = |detail: String| RioStoreError::CorruptData {
                        table: self.inner.tables.server_table.clone(),
                        detail,
                    };
                    rows.rows::<(String, String)>()
                        .map_err(|e| corrupt(e.to_string()))?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| corrupt(e.to_string()))
                },
            )
            .await?;
        let mut removed = 0;
        for (kind, id) in objects {
            if self.unplace(&kind, &id, server).await? {
                removed += 1;
            }
        }
        if removed > 0 {
            info!(server, removed, "placements of a server removed");
        }
        Ok(removed)
    }

    /// Removes the placement of `kind/id` if this process's server holds it (rio calls this on
    /// the server whose activation ends: a stale activation elsewhere must not delete the live
    /// holder's placement), conditionally on that holder. True when one was removed.
    #[tracing::instrument(skip(self), fields(cluster = %self.inner.cluster_id), err)]
    pub async fn unassign(&self, kind: &str, id: &str) -> RioStoreResult<bool> {
        let known = self
            .placed()
            .get(&(kind.to_owned(), id.to_owned()))
            .map(|p| p.server.clone());
        let holder = match known {
            Some(s) => Some(s),
            None => self
                .read_server(kind, id, false)
                .await?
                .filter(|s| parse_server(s).is_some_and(|ep| self.inner.storage.is_own(ep))),
        };
        match holder {
            Some(server) => self.unplace(kind, id, &server).await,
            None => Ok(false),
        }
    }

    /// How many placements this value made (or adopted) and still renews (none without
    /// storage-side expiry).
    pub fn placed_count(&self) -> usize {
        self.placed().len()
    }
}

fn rio_error(e: RioStoreError) -> ObjectPlacementError {
    // rio shows this error as "upstream error" only: the log keeps the cause.
    warn!(error = %e.chain(), "placement refused or failed");
    ObjectPlacementError::Upstream(e.chain())
}

#[async_trait]
impl ObjectPlacement for CassandraObjectPlacement {
    async fn update(&self, item: ObjectPlacementItem) -> Result<(), ObjectPlacementError> {
        let ObjectId(kind, id) = &item.object_id;
        match &item.server_address {
            // rio places an object on the server the request reached, and its server accepts
            // requests before its provider has pushed its member: until then nobody can see
            // it, fence it, or take its objects over once it stops.
            Some(server)
                if !parse_server(server).is_some_and(|ep| self.inner.storage.is_own(ep)) =>
            {
                Err(rio_error(RioStoreError::Fenced {
                    server: server.clone(),
                    health: "not a member yet (its provider has not pushed it)".to_owned(),
                }))
            }
            Some(server) => self.place(kind, id, server).await.map_err(rio_error),
            None => self.unassign(kind, id).await.map(drop).map_err(rio_error),
        }
    }

    async fn lookup(&self, object_id: &ObjectId) -> Result<Option<String>, ObjectPlacementError> {
        self.lookup_server(&object_id.0, &object_id.1)
            .await
            .map_err(rio_error)
    }

    async fn clean_server(&self, address: String) -> Result<(), ObjectPlacementError> {
        self.clean(&address).await.map(drop).map_err(rio_error)
    }

    async fn remove(&self, object_id: &ObjectId) -> Result<(), ObjectPlacementError> {
        // rio's admin `Shutdown` ends `Server::run` on any error here: a transient one is
        // tried again a few times first (each attempt is conditional on this server holding
        // the object, so repeating it is safe).
        let mut attempt = 0u64;
        loop {
            attempt += 1;
            match self.unassign(&object_id.0, &object_id.1).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_transient() && attempt < 3 => {
                    debug!(error = %e.chain(), attempt, "remove failed: trying again");
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
                Err(e) => return Err(rio_error(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        let mut o = PlacementOptions::default();
        o.validate().unwrap();
        o.table = "bad-name".into();
        assert!(
            matches!(o.validate(), Err(RioStoreError::InvalidConfiguration { option, .. }) if option == "table")
        );
        let o = PlacementOptions {
            server_table: "rio_placements".into(),
            ..Default::default()
        };
        assert!(o.validate().is_err());
    }
}

//! [`CassandraState`]: rio's `StateLoader` / `StateSaver` on Cassandra, with a version check so
//! two activations of one object never overwrite each other's state silently.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cassandra_membership::Timestamp;
use cassandra_membership::cassandra::MAX_TTL_SECONDS;
use rio_rs::errors::LoadStateError;
use rio_rs::state::{StateLoader, StateSaver};
use scylla::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlTimestamp, CqlValue};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::CassandraMembershipStorage;
use crate::cql::{self, Cql};
use crate::error::{RioStoreError, RioStoreResult};

/// Where and how long the state store keeps states (in the membership table's keyspace).
///
/// ```
/// use std::time::Duration;
/// use cassandra_membership_rio::StateOptions;
/// let o: StateOptions = toml::from_str("ttl = \"1h\"").unwrap();
/// assert_eq!(o.ttl, Some(Duration::from_secs(3600)));
/// assert_eq!(o.table, "rio_state");
/// o.validate().unwrap();
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StateOptions {
    /// The table, one partition per (object kind, object id, state type). Default `rio_state`.
    pub table: String,
    /// How long a state lives after its last save (`None`, the default: forever). Only for
    /// state that may be lost when its object is not saved for that long (sessions, caches, a
    /// demo that must leave nothing behind): it counts from the last save, not from the last
    /// time the cluster ran.
    #[serde(with = "humantime_serde")]
    pub ttl: Option<Duration>,
}

impl Default for StateOptions {
    fn default() -> Self {
        StateOptions {
            table: "rio_state".to_owned(),
            ttl: None,
        }
    }
}

impl StateOptions {
    /// Checks the table name and the TTL (1 s to 20 years, whole seconds are used).
    pub fn validate(&self) -> RioStoreResult<()> {
        cql::validate_table("table", &self.table)?;
        if let Some(ttl) = self.ttl
            && (ttl < Duration::from_secs(1) || ttl.as_secs() > MAX_TTL_SECONDS)
        {
            return Err(RioStoreError::config(
                "ttl",
                format!("{ttl:?} is outside 1 s ..= {MAX_TTL_SECONDS} s"),
            ));
        }
        Ok(())
    }

    fn ttl_seconds(&self) -> i32 {
        self.ttl
            .map_or(0, |t| i32::try_from(t.as_secs().max(1)).unwrap_or(i32::MAX))
    }
}

/// rio's [`StateLoader`] and [`StateSaver`] on Cassandra: each state (object kind, object id,
/// state type) is one row holding its JSON (what rio's SQL backends store) and a version.
///
/// **No silent overwrite.** A value remembers the version it loaded or last saved of each state
/// and saves conditionally on it (`IF version = …`); the first save of a state that it never saw
/// is conditional on there being none (`IF version = null`). So when two activations of one object exist at once (one on a
/// server that was taken for dead), the first save wins and the other gets
/// [`RioStoreError::StateConflict`] (rio: `LoadStateError::Unknown`) — it must reload before it
/// saves again, and a new activation does. A save whose answer is lost is settled by a serial
/// read: each write carries a fresh `write_id`, so the store recognises its own.
///
/// Keyed by the service id, not the cluster id: state outlives a cluster, like Orleans' grain
/// state. Share one value per server (rio's `AppData`); clones share the versions.
#[derive(Clone)]
pub struct CassandraState {
    inner: Arc<Inner>,
}

struct Inner {
    cql: Cql,
    service_id: String,
    options: StateOptions,
    load: PreparedStatement,
    insert: PreparedStatement,
    update: PreparedStatement,
    /// The membership whose fence a save respects.
    storage: CassandraMembershipStorage,
    /// The version each state had when this value last loaded or saved it (`None`: absent).
    versions: Mutex<HashMap<StateKey, Option<i64>>>,
}

type StateKey = (String, String, String);

impl fmt::Debug for CassandraState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CassandraState")
            .field("service_id", &self.inner.service_id)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

#[derive(SerializeRow)]
struct Key<'a> {
    service_id: &'a str,
    object_kind: &'a str,
    object_id: &'a str,
    state_type: &'a str,
}

#[derive(SerializeRow)]
struct InsertValues<'a> {
    service_id: &'a str,
    object_kind: &'a str,
    object_id: &'a str,
    state_type: &'a str,
    version: i64,
    state: &'a [u8],
    write_id: Uuid,
    written_at: CqlTimestamp,
    ttl: i32,
}

#[derive(SerializeRow)]
struct UpdateValues<'a> {
    service_id: &'a str,
    object_kind: &'a str,
    object_id: &'a str,
    state_type: &'a str,
    version: i64,
    state: &'a [u8],
    write_id: Uuid,
    written_at: CqlTimestamp,
    expected: i64,
    ttl: i32,
}

/// A state as stored: its version, JSON and the id of the write that stored it.
struct Stored {
    version: i64,
    state: Vec<u8>,
    write_id: Option<Uuid>,
}

impl CassandraState {
    /// The state store beside `storage`'s membership table (same session and keyspace):
    /// creates its table if missing and prepares its statements. Fails with
    /// `InvalidConfiguration` when `storage` is not on Cassandra.
    #[tracing::instrument(skip(storage), err)]
    pub async fn connect(
        storage: &CassandraMembershipStorage,
        options: StateOptions,
    ) -> RioStoreResult<Self> {
        options.validate()?;
        let Some((session, membership)) = storage.cassandra() else {
            return Err(RioStoreError::config(
                "storage",
                "the state store needs a membership storage on Cassandra (`connect` or `with_cassandra_table`)",
            ));
        };
        let cql = Cql::new(Arc::clone(session), membership, cql::Keyed::Service);
        cql.ddl(cql::CREATE_STATE, &options.table).await?;
        let t = options.table.as_str();
        Ok(CassandraState {
            inner: Arc::new(Inner {
                load: cql.prepare(cql::LOAD_STATE, t, true).await?,
                insert: cql.prepare(cql::INSERT_STATE, t, false).await?,
                update: cql.prepare(cql::UPDATE_STATE, t, false).await?,
                cql,
                service_id: membership.service_id.clone(),
                options,
                storage: storage.clone(),
                versions: Mutex::default(),
            }),
        })
    }

    /// The store's options.
    pub fn options(&self) -> &StateOptions {
        &self.inner.options
    }

    fn versions(&self) -> std::sync::MutexGuard<'_, HashMap<StateKey, Option<i64>>> {
        // Single inserts: a panic while holding it leaves the map consistent.
        self.inner
            .versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The version of `kind/id`'s `state_type` this value last loaded or saved (`None` if it
    /// never did; `Some(None)` if it was absent then).
    pub fn known_version(&self, kind: &str, id: &str, state_type: &str) -> Option<Option<i64>> {
        self.versions()
            .get(&(kind.to_owned(), id.to_owned(), state_type.to_owned()))
            .copied()
    }

    async fn read(&self, kind: &str, id: &str, state_type: &str) -> RioStoreResult<Option<Stored>> {
        let key = Key {
            service_id: &self.inner.service_id,
            object_kind: kind,
            object_id: id,
            state_type,
        };
        let rows = self
            .inner
            .cql
            .read("load state", &self.inner.load, key)
            .await?;
        let row = rows
            .maybe_first_row::<(Option<i64>, Option<Vec<u8>>, Option<Uuid>)>()
            .map_err(|e| self.corrupt(e.to_string()))?;
        Ok(match row {
            // A row whose cells expired before its row marker (saves with different TTLs) holds
            // no state: absent, and the first save's `IF version = null` takes it.
            None | Some((None, None, _)) => None,
            Some((Some(version), Some(state), write_id)) => Some(Stored {
                version,
                state,
                write_id,
            }),
            Some(_) => return Err(self.corrupt("a state row without version or state".into())),
        })
    }

    /// One conditional save: an insert when no version is expected, else an update on it.
    #[allow(clippy::too_many_arguments)]
    async fn send_save(
        &self,
        kind: &str,
        id: &str,
        state_type: &str,
        json: &[u8],
        expected: Option<i64>,
        version: i64,
        write_id: Uuid,
        ttl: i32,
    ) -> RioStoreResult<cql::CasReply> {
        let written_at = CqlTimestamp(Timestamp::now().as_millis());
        match expected {
            None => {
                let values = InsertValues {
                    service_id: &self.inner.service_id,
                    object_kind: kind,
                    object_id: id,
                    state_type,
                    version,
                    state: json,
                    write_id,
                    written_at,
                    ttl,
                };
                self.inner
                    .cql
                    .conditional("insert state", &self.inner.insert, values)
                    .await
            }
            Some(expected) => {
                let values = UpdateValues {
                    service_id: &self.inner.service_id,
                    object_kind: kind,
                    object_id: id,
                    state_type,
                    version,
                    state: json,
                    write_id,
                    written_at,
                    expected,
                    ttl,
                };
                self.inner
                    .cql
                    .conditional("save state", &self.inner.update, values)
                    .await
            }
        }
    }

    fn corrupt(&self, detail: String) -> RioStoreError {
        RioStoreError::CorruptData {
            table: self.inner.options.table.clone(),
            detail,
        }
    }

    /// Loads `kind/id`'s `state_type` (linearizable read) and remembers its version for the
    /// next save; `None` when there is none.
    #[tracing::instrument(skip(self), fields(service = %self.inner.service_id), err)]
    pub async fn load_versioned<T: DeserializeOwned>(
        &self,
        kind: &str,
        id: &str,
        state_type: &str,
    ) -> RioStoreResult<Option<(T, i64)>> {
        let key = (kind.to_owned(), id.to_owned(), state_type.to_owned());
        // Whatever this value knew of the state is stale once a load fails: rio then starts the
        // object from its default state, whose save must be refused (an insert on an existing
        // state), not applied on the version an earlier activation loaded.
        let stored = match self.read(kind, id, state_type).await {
            Ok(stored) => stored,
            Err(e) => {
                self.versions().remove(&key);
                return Err(e);
            }
        };
        let Some(stored) = stored else {
            self.versions().insert(key, None);
            return Ok(None);
        };
        let value = serde_json::from_slice(&stored.state).map_err(|source| {
            self.versions().remove(&key);
            RioStoreError::Serialization {
                object: format!("{kind}/{id}"),
                state_type: state_type.to_owned(),
                source,
            }
        })?;
        self.versions().insert(key, Some(stored.version));
        Ok(Some((value, stored.version)))
    }

    /// Saves `data` as `kind/id`'s `state_type`, conditionally on the version this value last
    /// loaded or saved (or on there being none, if it never saw one); returns the new version.
    /// [`RioStoreError::StateConflict`] when another writer was first: nothing was written;
    /// [`RioStoreError::Fenced`] while this process's member may not serve.
    #[tracing::instrument(skip(self, data), fields(service = %self.inner.service_id), err)]
    pub async fn save_versioned<T: Serialize + ?Sized>(
        &self,
        kind: &str,
        id: &str,
        state_type: &str,
        data: &T,
    ) -> RioStoreResult<i64> {
        let json = serde_json::to_vec(data).map_err(|source| RioStoreError::Serialization {
            object: format!("{kind}/{id}"),
            state_type: state_type.to_owned(),
            source,
        })?;
        // A late save from a server at risk (or final) could win the version check against the
        // object's next holder, making that one the loser: refused, nothing written.
        if let Some((server, health)) = self.inner.storage.fenced() {
            return Err(RioStoreError::Fenced {
                server: server.to_string(),
                health: format!("{health:?}"),
            });
        }
        let key = (kind.to_owned(), id.to_owned(), state_type.to_owned());
        let expected = self.versions().get(&key).copied().flatten();
        let version = expected.map_or(1, |v| v.saturating_add(1));
        let ttl = self.inner.options.ttl_seconds();
        // Sent again only when a serial read proved the previous attempt did not apply.
        let mut attempts = 0;
        let found = loop {
            attempts += 1;
            let write_id = Uuid::new_v4();
            let sent = self
                .send_save(
                    kind, id, state_type, &json, expected, version, write_id, ttl,
                )
                .await;
            match sent {
                Ok(reply) if reply.applied => {
                    self.versions().insert(key, Some(version));
                    return Ok(version);
                }
                Ok(reply) => match reply.current("version") {
                    Some(CqlValue::BigInt(v)) => break Some(*v),
                    _ => break None,
                },
                Err(e @ RioStoreError::OutcomeUnknown { .. }) => {
                    // A serial read completes or supersedes the write: its id says whether it
                    // applied; the version it expected, still there, says it never will.
                    match self.read(kind, id, state_type).await {
                        Ok(Some(s)) if s.write_id == Some(write_id) => {
                            debug!("the save whose answer was lost applied");
                            self.versions().insert(key, Some(version));
                            return Ok(version);
                        }
                        Ok(s) if s.as_ref().map(|s| s.version) == expected => {
                            if attempts >= 3 {
                                return Err(e); // proven not applied: the caller may retry
                            }
                            debug!(
                                "the save whose answer was lost did not apply: sending it again"
                            );
                        }
                        // Another writer holds the very version this save would have written:
                        // this one, conditional on the version before, never applies.
                        Ok(Some(s)) if s.version == version => break Some(s.version),
                        // Beyond it (another writer may have saved on top of this save), or
                        // gone (expired): whether this save applied is not known.
                        Ok(_) => return Err(e),
                        Err(_) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        let conflict = RioStoreError::StateConflict {
            object: format!("{kind}/{id}"),
            state_type: state_type.to_owned(),
            expected,
            found,
        };
        warn!(error = %conflict, "state not saved: another activation wrote it first");
        Err(conflict)
    }
}

fn rio_error(e: RioStoreError) -> LoadStateError {
    match e {
        RioStoreError::Serialization { .. } => {
            warn!(error = %e.chain(), "state (de)serialization failed");
            LoadStateError::DeserializationError
        }
        e => {
            // rio's error has no room for the cause: the log keeps it.
            warn!(error = %e.chain(), "state store call failed");
            LoadStateError::Unknown
        }
    }
}

#[async_trait]
impl<T: DeserializeOwned> StateLoader<T> for CassandraState {
    async fn load(
        &self,
        object_kind: &str,
        object_id: &str,
        state_type: &str,
    ) -> Result<T, LoadStateError> {
        match self
            .load_versioned(object_kind, object_id, state_type)
            .await
        {
            Ok(Some((value, _))) => Ok(value),
            Ok(None) => Err(LoadStateError::ObjectNotFound),
            Err(e) => Err(rio_error(e)),
        }
    }
}

#[async_trait]
impl<T: Serialize + Send + Sync> StateSaver<T> for CassandraState {
    async fn save(
        &self,
        object_kind: &str,
        object_id: &str,
        state_type: &str,
        data: &T,
    ) -> Result<(), LoadStateError> {
        self.save_versioned(object_kind, object_id, state_type, data)
            .await
            .map(drop)
            .map_err(rio_error)
    }
}

//! rio's [`MembershipStorage`] trait on [`CassandraMembershipStorage`]: each call maps onto the
//! storage's own methods (`mod.rs`), its errors onto rio's.

use async_trait::async_trait;
use cassandra_membership::MembershipError;
use chrono::{DateTime, Utc};
use rio_rs::cluster::storage::{Member, MembershipResult, MembershipStorage, MembershipUnitResult};
use rio_rs::errors::MembershipError as RioError;

use super::CassandraMembershipStorage;
use crate::mapping::endpoint;

fn upstream(e: MembershipError) -> RioError {
    // rio's error carries text only; the library's `Display` already includes the causes, each
    // once (walking `source()` too printed each of them again).
    RioError::Upstream(e.to_string())
}

#[async_trait]
impl MembershipStorage for CassandraMembershipStorage {
    async fn push(&self, member: Member) -> MembershipUnitResult {
        let ep = endpoint(member.ip(), member.port())?;
        self.push_member(ep, member.active())
            .await
            .map(drop)
            .map_err(upstream)
    }

    async fn remove(&self, ip: &str, port: &str) -> MembershipUnitResult {
        let ep = endpoint(ip, port)?;
        self.remove_member(ep).await.map(drop).map_err(upstream)
    }

    async fn set_is_active(&self, ip: &str, port: &str, is_active: bool) -> MembershipUnitResult {
        let ep = endpoint(ip, port)?;
        self.set_member_active(ep, is_active)
            .await
            .map_err(upstream)
    }

    async fn members(&self) -> MembershipResult<Vec<Member>> {
        self.list_members().await.map_err(upstream)
    }

    async fn notify_failure(&self, ip: &str, port: &str) -> MembershipUnitResult {
        let ep = endpoint(ip, port)?;
        self.record_failure(ep).await.map_err(upstream)
    }

    async fn member_failures(&self, ip: &str, port: &str) -> MembershipResult<Vec<DateTime<Utc>>> {
        let ep = endpoint(ip, port)?;
        self.failures_of(ep).await.map_err(upstream)
    }
}

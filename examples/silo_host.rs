//! One silo host as a process: joins a cluster on Cassandra, heartbeats, runs failure detection,
//! prints each change of its health as a line of JSON, stops serving when the cluster declared it
//! dead (or its entry is gone), and leaves gracefully on SIGTERM / Ctrl-C. The three-node fault
//! suite runs several of these and kills, pauses and resumes them.
//!
//!     cargo run --example silo_host -- --contact-points 127.0.0.1:9042 --cluster c1 --port 11111
//!
//! Options: `--contact-points A,B` `--keyspace K` (created with replication factor `--rf N`,
//! default 1) `--cluster C` `--port P` `--period-ms MS` (publish period, default 1000).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, MembershipOptions, Silo, SiloAddress,
    SiloHealth, Timestamp,
};
use tokio::signal::unix::{SignalKind, signal};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn event(kind: &str, detail: &str) {
    // One line per event, flushed at once: the parent reads them as they come.
    println!(
        "{{\"at_ms\":{},\"event\":\"{kind}\",\"detail\":\"{}\"}}",
        Timestamp::now().as_millis(),
        detail.replace('\\', "\\\\").replace('"', "\\\"")
    );
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let contact = arg(&args, "--contact-points").unwrap_or_else(|| "127.0.0.1:9042".into());
    let keyspace = arg(&args, "--keyspace").unwrap_or_else(|| "cm_hosts".into());
    let rf: u32 = arg(&args, "--rf").map_or(Ok(1), |v| v.parse())?;
    let cluster = arg(&args, "--cluster").ok_or("--cluster is required")?;
    let port: u16 = arg(&args, "--port").ok_or("--port is required")?.parse()?;
    let period = Duration::from_millis(arg(&args, "--period-ms").map_or(Ok(1000), |v| v.parse())?);

    let mut membership = MembershipOptions::default();
    membership.i_am_alive_table_publish_timeout = period;
    membership.num_missed_table_i_am_alive_limit = 3;
    membership.defunct_silo_cleanup_period = None;
    let options = CassandraClusteringOptions::default()
        .keyspace(keyspace)
        .service_id("hosts")
        .cluster_id(cluster)
        .contact_points(contact.split(',').map(str::to_owned))
        .create_keyspace_simple(rf)
        .request_timeout(Duration::from_secs(5))
        .membership(membership);
    let table = Arc::new(CassandraMembershipTable::connect(options).await?);
    let generation = i32::try_from(Timestamp::now().as_millis() / 1000 % 1_000_000_000)?;
    let address = SiloAddress::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        generation,
    )?;
    let silo = Silo::join(table, address).await?;
    event("joined", &address.to_string());

    let mut health = silo.health();
    let mut term = signal(SignalKind::terminate())?;
    loop {
        tokio::select! {
            changed = health.changed() => {
                if changed.is_err() {
                    break;
                }
                let now = health.borrow().clone();
                event("health", &format!("{now:?}"));
                if matches!(now, SiloHealth::DeclaredDead | SiloHealth::EntryMissing) {
                    // The cluster no longer counts this silo: stop serving at once, write nothing.
                    event("stopped", "declared dead by the cluster");
                    silo.crash();
                    return Ok(());
                }
                if now.is_final() {
                    break;
                }
            }
            _ = term.recv() => {
                event("leaving", "SIGTERM");
                silo.leave().await?;
                event("left", "");
                return Ok(());
            }
            _ = tokio::signal::ctrl_c() => {
                event("leaving", "Ctrl-C");
                silo.leave().await?;
                event("left", "");
                return Ok(());
            }
        }
    }
    event("stopped", &format!("{:?}", health.borrow().clone()));
    Ok(())
}

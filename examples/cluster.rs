//! A cluster's life in under a minute: silos join and heartbeat, one crashes and is declared dead
//! by the others through the protocol (a survivor's view shows it), its entry expires, one leaves
//! gracefully, then every silo stops and the whole cluster disappears from storage by itself.
//!
//!     cargo run --example cluster                              # on the in-memory table
//!     cargo run --example cluster -- --cassandra 127.0.0.1:9042   # on Cassandra, TTL on

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cassandra_membership::{
    CassandraClusteringOptions, CassandraMembershipTable, ClusterView, InMemoryMembershipTable,
    MembershipOptions, MembershipTable, Silo, SiloAddress, SiloStatus, Timestamp,
    TtlMismatchPolicy,
};

const TTL: Duration = Duration::from_secs(8);

fn options() -> MembershipOptions {
    let mut o = MembershipOptions::default();
    o.i_am_alive_table_publish_timeout = Duration::from_secs(1);
    o.num_missed_table_i_am_alive_limit = 3;
    o.defunct_silo_expiration = TTL;
    o
}

async fn table(args: &[String]) -> Result<Arc<dyn MembershipTable>, Box<dyn std::error::Error>> {
    let cluster = format!("demo-{}", Timestamp::now().as_millis());
    match args.iter().position(|a| a == "--cassandra") {
        None => {
            println!(
                "storage: the in-memory table, entries expire {TTL:?} after their last heartbeat"
            );
            Ok(Arc::new(
                InMemoryMembershipTable::new(cluster)
                    .with_expiry(TTL)
                    .with_options(options()),
            ))
        }
        Some(i) => {
            let contact = args
                .get(i + 1)
                .cloned()
                .unwrap_or_else(|| "127.0.0.1:9042".into());
            let mut o = CassandraClusteringOptions::default()
                .keyspace("cm_demo")
                .service_id("demo")
                .cluster_id(cluster)
                .contact_points([contact.clone()])
                .table("membership_demo")
                .create_keyspace_simple(1)
                .ttl(true)
                .ttl_mismatch(TtlMismatchPolicy::Patch)
                .membership(options());
            o.ttl_renewal_interval = Some(Duration::from_secs(1));
            println!(
                "storage: Cassandra at {contact}, table cm_demo.membership_demo, TTL {TTL:?} (+ up to 2 s slack)"
            );
            Ok(Arc::new(CassandraMembershipTable::connect(o).await?))
        }
    }
}

fn name(a: &SiloAddress) -> String {
    format!("silo-{}", a.endpoint().port() - 11110)
}

async fn show(
    table: &dyn MembershipTable,
    started: Instant,
    title: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let s = table.read_all().await?;
    let now = Timestamp::now();
    println!(
        "\n[{:>5.1}s] {title} — table version {}",
        started.elapsed().as_secs_f64(),
        s.version.version
    );
    if s.rows.is_empty() {
        println!("         (no entries)");
    }
    for r in &s.rows {
        let e = &r.entry;
        let voters: Vec<_> = e
            .suspect_times
            .iter()
            .map(|v| name(&v.suspecting_silo))
            .collect();
        println!(
            "         {:<7} {:<13} last I-am-alive {:>4.1}s ago{}",
            name(&e.address),
            format!("{:?}", e.status),
            now.duration_since(e.i_am_alive_time).as_secs_f64(),
            if voters.is_empty() {
                String::new()
            } else {
                format!("  suspected by {}", voters.join(", "))
            }
        );
    }
    Ok(())
}

/// What a silo's view holds: the members it would split work between, and the gateways.
fn show_view(view: &ClusterView, started: Instant, title: &str) {
    println!(
        "\n[{:>5.1}s] {title} — its view: table version {}, read {:.1}s ago{}",
        started.elapsed().as_secs_f64(),
        view.version().version,
        view.age(Timestamp::now()).as_secs_f64(),
        if view.is_stale() { ", STALE" } else { "" }
    );
    for e in view.entries() {
        println!("         {:<7} {:?}", name(&e.address), e.status);
    }
    let active: Vec<_> = view.active().map(|e| name(&e.address)).collect();
    let gateways: Vec<_> = view.gateways().map(|g| g.to_string()).collect();
    println!("         active: {}", active.join(", "));
    println!("         gateways: {}", gateways.join(", "));
}

async fn status_of(table: &dyn MembershipTable, a: &SiloAddress) -> Option<SiloStatus> {
    table
        .read_row(a)
        .await
        .ok()?
        .rows
        .first()
        .map(|r| r.entry.status)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let table = table(&args).await?;
    let started = Instant::now();
    let generation = (Timestamp::now().as_millis() / 1000) as i32;

    println!(
        "\n== 4 silos join (heartbeat every 1 s; silent for 3 periods = suspect; 2 votes = dead)"
    );
    let mut silos = Vec::new();
    for n in 1..=4u16 {
        let address = SiloAddress::new(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 11110 + n),
            generation,
        )?;
        let silo = Silo::builder(Arc::clone(&table), address)
            .silo_name(format!("silo-{n}"))
            .host_name("localhost")
            .proxy_port(30000 + n)
            .join()
            .await?;
        silos.push(silo);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    show(
        table.as_ref(),
        started,
        "all four are Active and heartbeating",
    )
    .await?;

    println!("\n== silo-4 crashes: no graceful leave, its heartbeats just stop");
    let crashed = silos.pop().expect("four silos");
    let crashed_address = crashed.address();
    crashed.crash();
    let crashed_at = Instant::now();
    while status_of(table.as_ref(), &crashed_address).await != Some(SiloStatus::Dead) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if crashed_at.elapsed() > Duration::from_secs(20) {
            return Err("silo-4 was never declared dead".into());
        }
    }
    show(
        table.as_ref(),
        started,
        &format!(
            "the others declared silo-4 Dead {:.1}s after it crashed",
            crashed_at.elapsed().as_secs_f64()
        ),
    )
    .await?;

    // A survivor learns it from its own view, at no statement of its own: within one period.
    let mut view = silos[0].view();
    tokio::time::timeout(
        Duration::from_secs(5),
        view.wait_for(|v| v.is_dead(&crashed_address)),
    )
    .await
    .map_err(|_| "silo-1's view never showed silo-4 Dead")??;
    show_view(
        &view.borrow(),
        started,
        &format!(
            "silo-1 sees silo-4 Dead {:.1}s after it crashed",
            crashed_at.elapsed().as_secs_f64()
        ),
    );

    println!("\n== nobody writes silo-4's entry any more: storage expires it after the TTL");
    let dead_at = Instant::now();
    while status_of(table.as_ref(), &crashed_address).await.is_some() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if dead_at.elapsed() > TTL + Duration::from_secs(10) {
            return Err("silo-4's entry never expired".into());
        }
    }
    show(
        table.as_ref(),
        started,
        &format!(
            "silo-4's entry expired {:.1}s after its last write",
            dead_at.elapsed().as_secs_f64()
        ),
    )
    .await?;

    println!(
        "\n== silo-3 leaves gracefully: ShuttingDown, then Dead, through the versioned protocol"
    );
    let leaving = silos.pop().expect("three silos");
    leaving.leave().await?;
    show(table.as_ref(), started, "silo-3 left").await?;

    println!("\n== every silo stops: no process of this cluster runs any more");
    for s in silos {
        s.crash();
    }
    let stopped = Instant::now();
    loop {
        let s = table.read_all().await?;
        if s.rows.is_empty() && s.version.etag.is_absent() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        if stopped.elapsed() > TTL + Duration::from_secs(10) {
            return Err("the cluster never disappeared".into());
        }
    }
    show(
        table.as_ref(),
        started,
        &format!(
            "the whole cluster — entries and version — disappeared {:.1}s after the last silo stopped",
            stopped.elapsed().as_secs_f64()
        ),
    )
    .await?;
    println!("\ndone in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

//! `NatsCluster` against real nats-server processes: three nodes with JetStream, a
//! replicated stream, its leader killed, the node restarted.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use weir_testkit::NatsCluster;

const TIMEOUT: Duration = Duration::from_secs(15);

async fn connect(urls: &[String]) -> async_nats::Client {
    let addrs: Vec<async_nats::ServerAddr> = urls.iter().map(|u| u.parse().expect("url")).collect();
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .connect(addrs)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_leaders_and_survive_a_killed_stream_leader() {
    let cluster = NatsCluster::start(3).expect("cluster starts");
    assert_eq!(cluster.len(), 3);
    let ports: Vec<_> = (0..3).map(|i| cluster.ports(i)).collect();
    let mut all: Vec<u16> = ports
        .iter()
        .flat_map(|p| [p.client, p.cluster, p.monitoring])
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        9,
        "every node has its own three ports: {ports:?}"
    );

    let meta = cluster.wait_meta_leader(TIMEOUT).expect("meta leader");
    assert!(meta < 3);
    assert_eq!(cluster.meta_leader().as_deref(), Some(cluster.name(meta)));

    // A 3-replica stream, created through node 0.
    let client = connect(&cluster.urls()).await;
    let js = jetstream::new(client.clone());
    js.create_stream(stream::Config {
        name: "T".into(),
        subjects: vec!["t.>".into()],
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .expect("R3 stream");
    let leader = cluster
        .wait_stream_leader("T", TIMEOUT)
        .expect("stream leader");
    // The JetStream API agrees with the monitoring view.
    let mut info_stream = js.get_stream("T").await.expect("stream");
    let info = info_stream.info().await.expect("info");
    let api_leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .unwrap_or_default();
    assert_eq!(api_leader, cluster.name(leader));

    // Kill the stream's leader: another node takes over and the stream keeps working.
    let killed_at = Instant::now();
    cluster.node(leader).kill().expect("kill");
    assert!(!cluster.node(leader).is_running());
    let deadline = Instant::now() + TIMEOUT;
    let new_leader = loop {
        if let Some(i) = cluster.stream_leader("T")
            && i != leader
        {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "no new stream leader after the kill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "stream leader {} killed; {} leads after {:?}",
        cluster.name(leader),
        cluster.name(new_leader),
        killed_at.elapsed()
    );
    let survivor = connect(&[cluster.node(new_leader).url().to_owned()]).await;
    let ack = jetstream::new(survivor)
        .publish("t.x", "after".into())
        .await
        .expect("publish")
        .await
        .expect("ack from the surviving majority");
    assert!(ack.sequence >= 1);

    // Restart: the node rejoins on the same ports and the cluster agrees on a meta
    // leader again among all three.
    cluster.node(leader).restart().expect("restart");
    assert_eq!(cluster.ports(leader), ports[leader]);
    cluster
        .wait_meta_leader(TIMEOUT)
        .expect("meta leader after restart");

    // A paused node is skipped by the leader queries instead of blocking them.
    let other = (leader + 1) % 3;
    cluster.node(other).pause().expect("pause");
    let started = Instant::now();
    assert!(cluster.meta_leader().is_some());
    assert!(started.elapsed() < Duration::from_secs(2));
    cluster.node(other).resume().expect("resume");
}

//! weir computes stream partitions itself (`weir_protocol::partition_of`) and relies on
//! getting exactly the answer nats-server's subject mapping `{{partition(16,1)}}` gives,
//! so that a producer that computes the partition and one that lets the server map plain
//! subjects land every stream on the same worker. This test asks the real server for
//! well over a thousand ids, covering the whole stream-id alphabet.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use weir_protocol::stream_id::MAX_STREAM_ID_LEN;
use weir_protocol::{StreamId, partition_of};
use weir_testkit::{NatsServer, NatsServerOptions};

const PARTITIONS: u32 = 16;
const RANDOM_IDS: usize = 1_500;
const SEED: u64 = 0x5745_4952; // "WEIR"

/// Every character a stream id may contain.
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:=@+";

/// Ids of the shapes weir meets, plus edge cases of the alphabet and length.
fn fixed_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "call-42",
        "CA1234567890abcdef1234567890abcdef",
        "3f2b8c1e-9d4a-4b7e-8f00-123456789abc",
        "tenant:call=7",
        "a_b+c@d",
        "-",
        "_",
        ":",
        "=",
        "@",
        "+",
        "0",
        "Z",
        "-_:=@+",
        "+@=:_-",
        "user@example:room=1+2",
    ]
    .map(String::from)
    .to_vec();
    ids.push("x".repeat(MAX_STREAM_ID_LEN));
    ids.push("+".repeat(MAX_STREAM_ID_LEN));
    ids
}

fn random_ids(rng: &mut StdRng, count: usize) -> Vec<String> {
    (0..count)
        .map(|_| {
            let len = rng.random_range(1..=48);
            (0..len)
                .map(|_| char::from(*ALPHABET.choose(rng).expect("non-empty alphabet")))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_partition_mapping_agrees_with_partition_of() {
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(
            r#"mappings = { "agree.*": "agree.{{partition(16,1)}}.{{wildcard(1)}}" }"#.into(),
        ),
        ..Default::default()
    })
    .expect("nats-server with a partition mapping");
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_millis(500))
            .ping_interval(Duration::from_secs(1))
            .connect(server.url()),
    )
    .await
    .expect("connect within 5 s")
    .expect("connect");

    let partitions = NonZeroU32::new(PARTITIONS).expect("16 is not zero");
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut expected: HashMap<String, u32> = HashMap::new();
    for id in fixed_ids()
        .into_iter()
        .chain(random_ids(&mut rng, RANDOM_IDS))
    {
        let stream = StreamId::parse(&id).expect("generated ids are valid stream ids");
        expected.insert(id, partition_of(&stream, partitions));
    }
    assert!(
        expected.len() >= 1_000,
        "only {} distinct ids",
        expected.len()
    );
    // Every partition is hit, so the comparison is not vacuous for any of them.
    let mut per_partition: BTreeMap<u32, usize> = BTreeMap::new();
    for p in expected.values() {
        *per_partition.entry(*p).or_default() += 1;
    }
    assert_eq!(
        per_partition.len(),
        PARTITIONS as usize,
        "{per_partition:?}"
    );

    // Subscribe and publish on one connection: the server handles SUB before the PUBs.
    let mut sub = client.subscribe("agree.*.*").await.expect("subscribe");
    for id in expected.keys() {
        client
            .publish(format!("agree.{id}"), id.clone().into())
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");

    let mut seen: HashMap<String, u32> = HashMap::with_capacity(expected.len());
    let collect = async {
        while seen.len() < expected.len() {
            let Some(msg) = sub.next().await else { break };
            let mut tokens = msg.subject.as_str().splitn(3, '.');
            let (Some("agree"), Some(partition), Some(id)) =
                (tokens.next(), tokens.next(), tokens.next())
            else {
                panic!("unexpected subject {:?}", msg.subject);
            };
            let partition: u32 = partition
                .parse()
                .unwrap_or_else(|_| panic!("partition token of {:?}", msg.subject));
            assert_eq!(
                msg.payload.as_ref(),
                id.as_bytes(),
                "the mapped subject keeps the id"
            );
            assert!(
                seen.insert(id.to_owned(), partition).is_none(),
                "{id} delivered twice"
            );
        }
    };
    tokio::time::timeout(Duration::from_secs(20), collect)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "only {} of {} mapped messages arrived within 20 s",
                seen.len(),
                expected.len()
            )
        });

    let disagreements: Vec<String> = expected
        .iter()
        .filter_map(|(id, mine)| {
            let server_side = seen.get(id);
            (server_side != Some(mine))
                .then(|| format!("{id:?}: partition_of = {mine}, server = {server_side:?}"))
        })
        .collect();
    assert!(
        disagreements.is_empty(),
        "{} of {} ids disagree, e.g.:\n{}",
        disagreements.len(),
        expected.len(),
        disagreements
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

//! Cost of the door's capacity decision (`weir_audio_ingress::capacity::Fleet`), in ns
//! per admission: `decide` + `hold` + `release` of one stream, with 16 workers of 64
//! slots announcing (static ownership, 64 partitions) and `HELD` streams already held,
//! as at 1,000 live streams on one ingress. In memory, one mutex in the service.
//!
//! `cargo bench -p weir-audio-ingress --bench capacity`
//!
//! Median, p99 and max over 20,000 admissions, after 2,000 to warm up.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use weir_audio_ingress::capacity::{Decision, Fleet, FleetSettings};
use weir_protocol::StreamId;
use weir_protocol::capacity::{Announcement, OwnershipKind, VERSION};

const WORKERS: u32 = 16;
const PARTITIONS: u32 = 64;
const HELD: usize = 1_000;
const SAMPLES: usize = 20_000;

fn announcement(w: u32) -> Announcement {
    Announcement {
        v: VERSION,
        worker: format!("w{w}"),
        instance: "i".into(),
        seq: 1,
        sent_at_ms: 0,
        interval_ms: 1_000,
        subject: "audio.{partition}.{stream}".into(),
        partitions_total: PARTITIONS,
        ownership: OwnershipKind::Static,
        lease_bucket: None,
        partitions: (0..PARTITIONS).filter(|p| p % WORKERS == w).collect(),
        max_streams: 1_000,
        live_streams: 40,
        lag_ms: 0,
        rtf_p95: 0.4,
        streams: Vec::new(),
        streams_truncated: true,
    }
}

fn main() {
    let mut fleet = Fleet::new(FleetSettings {
        subject: "audio.{partition}.{stream}".into(),
        partitions: NonZeroU32::new(PARTITIONS).expect("n"),
        max_lag: Duration::from_millis(500),
    });
    let now = Instant::now();
    for w in 0..WORKERS {
        fleet.accept(announcement(w), now).expect("accepted");
    }
    let mut keep = Vec::new();
    for i in 0..HELD {
        let id = StreamId::parse(&format!("live-{i}")).expect("id");
        let Decision::Admit(w) = fleet.decide(&id, now) else {
            panic!("admitted")
        };
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        fleet.hold(&id, w, tx);
        keep.push(rx);
    }
    let ids: Vec<StreamId> = (0..SAMPLES + 2_000)
        .map(|i| StreamId::parse(&format!("new-{i}")).expect("id"))
        .collect();
    let mut ns = Vec::with_capacity(SAMPLES);
    for (i, id) in ids.iter().enumerate() {
        let start = Instant::now();
        let d = black_box(fleet.decide(id, now));
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let worker = match d {
            Decision::Admit(w) => w,
            Decision::Refuse(refused) => refused.worker,
        };
        let token = fleet.hold(id, worker, tx);
        fleet.release(id.as_str(), token);
        let elapsed = start.elapsed();
        if i >= 2_000 {
            ns.push(elapsed.as_nanos() as u64);
        }
    }
    ns.sort_unstable();
    println!(
        "capacity admission ({WORKERS} workers, {HELD} held): median {} ns, p99 {} ns, max {} ns over {SAMPLES}",
        ns[SAMPLES / 2],
        ns[SAMPLES * 99 / 100],
        ns[SAMPLES - 1]
    );
}

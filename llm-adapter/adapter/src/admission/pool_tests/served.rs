//! Which backend served (`Weir-Backend` on the answer) and a failed-over request counted
//! once: a call retried on another backend after a stall is one start in
//! `weir_llm_inference_started_total` (and one stream, one `started` event), the move
//! one failover of the backend left.

use super::*;
use weir_protocol::llm::headers::BACKEND;

/// The `Weir-Backend` of an answer.
fn served_by(o: &Outcome) -> Option<&str> {
    let reply = o.result.as_ref().ok()?;
    let mut named = reply.headers.iter().filter(|(n, _)| n == BACKEND);
    let (_, v) = named.next()?;
    assert!(named.next().is_none(), "one Weir-Backend: {reply:?}");
    Some(v.as_str())
}

#[tokio::test(start_paused = true)]
async fn a_unary_call_retried_after_a_stall_counts_one_start_and_names_its_backend() {
    let (backends, h) = sims(&[100, 100]);
    let a = start(pool_cfg(&[("a", 1), ("b", 1)], health()), backends);
    warm(&a, 2).await;
    let before = a.stats().started;
    assert_eq!(before, 2);
    h[0].pause();
    let sub = Submission::new("r").budget(Duration::from_secs(3));
    let (_, rx) = a.call(sub).await;
    let o = answer(rx).await;
    assert_eq!(o.code(), "ok", "{o:?}");
    assert_eq!(
        (started(&h[0]), started(&h[1])),
        (2, 2),
        "tried on a, then on b"
    );
    assert_eq!(a.stats().started, before + 1, "one request, one start");
    assert_eq!(a.backends()[0].failovers, 1, "the retry is a failover of a");
    assert_eq!(served_by(&o), Some("b"));
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_retried_after_a_stall_counts_one_stream_and_one_started_event() {
    let (a, h) = stream_pool().await;
    let before = a.stats();
    h[0].pause();
    let out = Arc::new(Chunks::default());
    let sub = Submission::new("s")
        .budget(Duration::from_secs(3))
        .stream(out.clone());
    let (_, rx) = a.call(sub).await;
    let o = answer(rx).await;
    assert_eq!(o.code(), "ok", "{o:?}");
    assert_eq!(started(&h[1]), 2, "retried on b");
    let after = a.stats();
    assert_eq!(after.started, before.started + 1);
    assert_eq!(after.stream.started, before.stream.started + 1);
    assert_eq!(*out.started.lock().expect("lock"), 1, "one `started` event");
    assert_eq!(a.backends()[0].failovers, 1);
    assert_eq!(served_by(&o), Some("b"), "on the stream's end");
    a.shutdown().await;
}

/// Replies with a `Weir-Backend` of its own, in another case.
struct Named;

impl Backend for Named {
    fn name(&self) -> &'static str {
        "named"
    }

    fn call(&self, _: BackendRequest) -> Call {
        Box::pin(async {
            let mut r = BackendReply::body("x");
            r.headers.push(("weir-backend".into(), "liar".into()));
            r.headers.push(("X-Own".into(), "kept".into()));
            Ok(r)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_single_backend_is_named_default_and_a_backends_own_name_is_replaced() {
    let a = Admission::start_pool(
        AdmissionConfig::default(),
        vec![Arc::new(Named)],
        Arc::new(ChannelSink),
        Tracer::disabled(),
    );
    let o = answer(a.call(Submission::new("q")).await.1).await;
    assert_eq!(served_by(&o), Some("default"));
    let reply = o.result.as_ref().expect("ok");
    let names: Vec<&str> = reply.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["X-Own", BACKEND], "the backend's own one is gone");
    // A refusal names no backend.
    let o = answer(
        a.call(Submission::new("late").budget(Duration::ZERO))
            .await
            .1,
    )
    .await;
    assert!(o.result.is_err() && served_by(&o).is_none(), "{o:?}");
    a.shutdown().await;
}

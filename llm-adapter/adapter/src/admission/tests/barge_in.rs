//! Paused-clock tests of session interrupt (barge-in): a session cancel and a
//! superseding request (`state/barge_in.rs`).

use super::*;

fn in_session(body: &str, session: &str, id: &str) -> Submission {
    Submission::new(body.to_owned())
        .session(session)
        .request_id(id)
}

#[tokio::test(start_paused = true)]
async fn session_cancel_answers_each_queued_and_running_request_once_before_it_returns() {
    let mut c = cfg(2, 16);
    c.session.ordering = false;
    c.session.pending_cap = NonZeroUsize::new(10);
    let sim = SimBackend::fixed(Duration::from_secs(10));
    let h = sim.handle();
    let a = start(c, sim);
    let mut rxs = Vec::new();
    for id in ["a", "b", "c", "d"] {
        let (ad, rx) = a.call(in_session("x", "s1", id)).await;
        assert_eq!(ad, Admitted::Queued);
        rxs.push(rx);
    }
    let (_, other) = a.call(in_session("x", "s2", "e")).await;
    settle().await;
    assert_eq!(h.stats().in_progress, 2, "a and b run, c, d and e wait");

    let r = a.cancel_session("s1").await;
    assert_eq!((r.queued, r.running, r.unsettled), (2, 2, 0));
    assert_eq!(r.running_ids, vec!["a", "b"]);
    assert_eq!(r.queued_ids, vec!["c", "d"]);
    // On return every one of them is answered (abort before acknowledgement), and the
    // backend saw both running calls dropped.
    assert_eq!(h.stats().aborted, 2);
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let out = rx
            .try_recv()
            .expect("answered before cancel_session returned");
        assert_eq!(out.error_code(), Some(ErrorCode::Cancelled));
        assert_eq!(out.inference_time.is_some(), i < 2, "a and b had started");
    }
    // Nothing left of s1; s2 is untouched and now runs.
    let again = a.cancel_session("s1").await;
    assert_eq!(again.total(), 0);
    settle().await;
    assert_eq!(h.stats().in_progress, 1);
    assert_eq!(code(other).await, None);
    let s = a.stats();
    let i = &s.interrupts;
    assert_eq!(
        (
            i.session_cancels,
            i.supersedes,
            i.cancelled_queued,
            i.cancelled_running
        ),
        (2, 0, 2, 2),
        "both cancels counted in /v1/stats, and what the first one cancelled"
    );
    assert_eq!(s.slots_acquired, s.slots_released);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_by_request_id_returns_once_the_running_call_is_answered() {
    let sim = SimBackend::fixed(Duration::from_secs(10));
    let h = sim.handle();
    let a = start(cfg(1, 4), sim);
    let (_, mut rx) = a.call(Submission::new("x").request_id("r")).await;
    settle().await;
    assert_eq!(h.stats().in_progress, 1);
    assert_eq!(a.cancel("r").await, CancelResult::Running);
    assert_eq!(
        h.stats().in_progress,
        0,
        "the backend call was dropped at once"
    );
    let out = rx.try_recv().expect("answered before cancel returned");
    assert_eq!(out.error_code(), Some(ErrorCode::Cancelled));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_superseding_request_runs_at_once_under_session_ordering_and_a_cap() {
    let mut c = cfg(1, 16);
    c.session.ordering = true;
    c.session.pending_cap = NonZeroUsize::new(2);
    let script = Script::default();
    let a = start(c, script.clone());
    let (_, old_running) = a.call(in_session("ok:10000:1", "s1", "r1")).await;
    let (_, old_queued) = a.call(in_session("ok:10000:2", "s1", "r2")).await;
    settle().await;
    let t0 = Instant::now();
    let r = a.supersede("s1", Some("r3")).await;
    assert_eq!((r.running, r.queued), (1, 1));
    assert_eq!(r.ids().collect::<Vec<_>>(), vec!["r1", "r2"]);
    // The session is free: the new request is admitted (the cap of 2 is not hit) and
    // starts at once (it does not wait behind r1 under session ordering).
    let (ad, new) = a.call(in_session("ok:100:3", "s1", "r3")).await;
    assert_eq!(ad, Admitted::Queued);
    let out = answer(new).await;
    assert_eq!(out.error_code(), None);
    assert_eq!(out.queue_time, Duration::ZERO);
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
    for (rx, stage) in [(old_running, "running"), (old_queued, "queued")] {
        let out = answer(rx).await;
        let err = out.result.as_ref().expect_err("superseded");
        assert_eq!(err.code, ErrorCode::Cancelled);
        assert!(
            err.message.contains("superseded by request r3") && err.message.contains(stage),
            "{}",
            err.message
        );
    }
    assert_eq!(script.calls(), vec!["ok:10000:1", "ok:100:3"]);
    // Superseding a session with nothing in it cancels nothing.
    assert_eq!(a.supersede("s1", None).await.total(), 0);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_stream_publishes_no_chunk_after_the_cancel_returns() {
    let a = start(cfg(1, 4), sim_stream(100, 10.0));
    let rec = Arc::new(Recorder::default());
    let (_, rx) = a
        .call(in_session(r#"{"max_tokens":10}"#, "s1", "st").stream(rec.clone()))
        .await;
    // First token at 100 ms, then one every 100 ms: three chunks by 350 ms.
    sleep(Duration::from_millis(350)).await;
    let before = rec
        .names()
        .iter()
        .filter(|n| n.starts_with("chunk"))
        .count();
    assert!(before >= 2, "{:?}", rec.names());
    let r = a.cancel_session("s1").await;
    assert_eq!((r.running, r.queued), (1, 0));
    let at_ack = rec.names().len();
    sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rec.names().len(),
        at_ack,
        "nothing after the acknowledgement"
    );
    assert_eq!(code(rx).await, Some(ErrorCode::Cancelled));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_retried_superseding_request_joins_its_first_copy_instead_of_cancelling_it() {
    let sim = SimBackend::fixed(Duration::from_millis(500));
    let h = sim.handle();
    let a = start(cfg(1, 8), sim);
    let (_, older) = a.call(in_session("x", "s1", "r1")).await;
    settle().await;
    assert_eq!(a.supersede("s1", Some("r2")).await.running, 1);
    let (_, first) = a.call(in_session("y", "s1", "r2")).await;
    settle().await;
    // The retry (same id, same body) supersedes nothing of its own and joins.
    let r = a.supersede("s1", Some("r2")).await;
    assert_eq!(r.total(), 0);
    let (ad, retry) = a.call(in_session("y", "s1", "r2")).await;
    assert_eq!(ad, Admitted::Joined);
    assert_eq!(code(older).await, Some(ErrorCode::Cancelled));
    assert_eq!(code(first).await, None);
    assert_eq!(code(retry).await, None);
    assert_eq!((h.stats().started, h.stats().aborted), (2, 1));
    a.shutdown().await;
}

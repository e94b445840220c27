//! Priority classes over a real nats-server: `Weir-Priority` decoded in any case, an
//! invalid value refused `invalid_request` naming the header (and changing nothing: a
//! superseding request with a bad class cancels nothing), `limits[].priority` giving
//! a key's requests their class, the classes counted in the stats and listed in the
//! capabilities document.

use crate::common;

use std::time::Duration;

use async_nats::HeaderMap;
use common::{Rig, STEP, eventually};
use weir_llm_client::LlmClient;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, Priority};

/// A raw request with `headers` (and an empty body) to `llm.infer`.
async fn raw(client: &async_nats::Client, headers: &[(&str, &str)]) -> async_nats::Message {
    let mut hm = HeaderMap::new();
    for (k, v) in headers {
        hm.insert(*k, *v);
    }
    let req = async_nats::Request::new()
        .headers(hm)
        .timeout(Some(STEP))
        .inbox(client.new_inbox());
    tokio::time::timeout(STEP, client.send_request("llm.infer".to_owned(), req))
        .await
        .expect("in time")
        .expect("reply")
}

fn error_code(m: &async_nats::Message) -> Option<&str> {
    m.headers.as_ref()?.get(h::ERROR_CODE).map(|v| v.as_str())
}

#[tokio::test]
async fn an_invalid_priority_is_refused_naming_the_header_and_changes_nothing() {
    let mut rig = Rig::with_sim("workers = 1", Duration::from_millis(500)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let running = {
        let llm = llm.clone();
        tokio::spawn(async move {
            llm.request("x")
                .session("s1")
                .request_id("r1")
                .timeout(STEP)
                .send()
                .await
        })
    };
    eventually(STEP, || rig.sim().stats().in_progress == 1).await;
    let cases: [&[(&str, &str)]; 4] = [
        &[(h::PRIORITY, "urgent")],
        &[(h::PRIORITY, "")],
        &[(h::PRIORITY, "batch, interactive")],
        // A superseding request with a bad class supersedes nothing.
        &[
            (h::SESSION_ID, "s1"),
            (h::SUPERSEDE, "session"),
            (h::PRIORITY, "low"),
        ],
    ];
    for headers in cases {
        let m = raw(&rig.caller, headers).await;
        assert_eq!(error_code(&m), Some("invalid_request"), "{headers:?}");
        let body: ErrorBody = serde_json::from_slice(&m.payload).expect("error body");
        assert!(
            body.message.contains(h::PRIORITY),
            "names the header: {}",
            body.message
        );
    }
    let done = tokio::time::timeout(STEP, running)
        .await
        .expect("in time")
        .expect("join");
    assert!(done.is_ok(), "the running request is untouched: {done:?}");
    let st = rig.sim().stats();
    assert_eq!((st.started, st.aborted, st.completed), (1, 0, 1));
    let stats = rig.adapter().stats();
    assert_eq!(stats.priority["interactive"].admitted, 1);
    assert_eq!(stats.priority["batch"].admitted, 0);
    rig.shutdown().await;
}

#[tokio::test]
async fn the_header_in_any_case_or_the_keys_class_decides_and_is_counted() {
    let config = "workers = 1\n[[limits]]\nkey = \"client\"\nlimit = 10\npriority = \"batch\"";
    let mut rig = Rig::with_sim(config, Duration::from_millis(5)).await;
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[(h::PRIORITY, " BATCH ")], "batch"),
        (&[(h::CLIENT_KEY, "etl")], "batch"),
        (
            &[(h::CLIENT_KEY, "etl"), (h::PRIORITY, "Interactive")],
            "interactive",
        ),
        (&[], "interactive"),
    ];
    for (headers, class) in cases {
        let before = rig.adapter().stats().priority[class].admitted;
        let m = raw(&rig.caller, headers).await;
        assert_eq!(error_code(&m), None, "{headers:?}");
        let after = rig.adapter().stats().priority[class].admitted;
        assert_eq!(after, before + 1, "{headers:?} is {class}");
    }
    // The client sends it too.
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let before = rig.adapter().stats().priority["batch"].admitted;
    let reply = llm
        .request("x")
        .priority(Priority::Batch)
        .timeout(STEP)
        .send()
        .await;
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(rig.adapter().stats().priority["batch"].admitted, before + 1);
    let caps = rig.adapter().capabilities();
    assert_eq!(caps["headers"]["priority"], h::PRIORITY);
    assert_eq!(caps["limits"][0]["priority"], "batch");
    assert_eq!(caps["priority"]["batch_delay_ms"], 2000);
    assert_eq!(caps["priority"]["default"], "interactive");
    rig.shutdown().await;
}

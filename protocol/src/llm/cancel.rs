//! The replies of the adapter's cancel endpoint (`llm.cancel`): [`CancelReply`] for a
//! cancel by request id (`Weir-Cancel`), [`SessionCancelReply`] for a cancel of a whole
//! session (`Weir-Cancel-Session`).

use serde::{Deserialize, Serialize};

/// Reply of the cancel endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CancelReply {
    /// The request id.
    pub request_id: String,
    /// `queued`, `running` or `not_found`.
    pub result: String,
}

/// Reply of the cancel endpoint to a session cancel (`Weir-Cancel-Session`): what was
/// cancelled. Sent once every running request of the session has been aborted at the
/// backend and answered, so that nothing of theirs reaches a caller after it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionCancelReply {
    /// The session.
    pub session: String,
    /// `cancelled` (at least one request was) or `not_found` (none queued or running).
    pub result: String,
    /// Requests cancelled: `queued + running`.
    pub cancelled: u64,
    /// Queued requests answered `cancelled`.
    pub queued: u64,
    /// Running requests aborted at the backend and answered `cancelled`.
    pub running: u64,
    /// The request ids of the queued ones (requests without an id are only counted).
    pub queued_ids: Vec<String>,
    /// The request ids of the running ones (requests without an id are only counted).
    pub running_ids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cancel_reply_is_two_string_fields() {
        let r: CancelReply =
            serde_json::from_str(r#"{"request_id":"r1","result":"queued"}"#).expect("json");
        assert_eq!(r.result, "queued");
        assert_eq!(
            serde_json::to_string(&r).expect("json"),
            r#"{"request_id":"r1","result":"queued"}"#
        );
    }

    #[test]
    fn the_session_cancel_reply_lists_ids_by_stage() {
        let r = SessionCancelReply {
            session: "s1".into(),
            result: "cancelled".into(),
            cancelled: 3,
            queued: 2,
            running: 1,
            queued_ids: vec!["r2".into()],
            running_ids: vec!["r1".into()],
        };
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(
            text,
            r#"{"session":"s1","result":"cancelled","cancelled":3,"queued":2,"running":1,"queued_ids":["r2"],"running_ids":["r1"]}"#
        );
        let back: SessionCancelReply = serde_json::from_str(&text).expect("json");
        assert_eq!(back, r);
    }
}

//! The reply of the adapter's cancel endpoint (`llm.cancel`).

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
}

//! weir's wire contracts: bytes and names only — no tokio, no NATS.
//!
//! - [`audio`]: the deployed `frame`/`end` packet codec and the versioned extensions
//!   (headers and opt-in packet types) that an old consumer never trips over.
//! - [`stream_id`]: stream ids as safe NATS subject tokens.
//! - [`partition`]: the FNV-1a shard key (identical to nats-server `partition()`) and
//!   subject templates.
//! - [`capacity`]: what a recognition worker announces about its capacity, and the
//!   notice of a stream it refused.
//! - [`llm`]: the LLM adapter's header names, the deployed JSON envelope and the error
//!   catalog.
//! - [`admin`]: the services' ready line and the ingress's `/v1/stats` snapshot, written
//!   by the services and read by the load test;
//! - `schema` (feature `schema`): the JSON Schemas of these contracts, generated from
//!   the types (`protocol/schemas/`).
//! - [`WireName`]: `ALL`, `as_str` and `from_wire` of a fieldless enum whose variants have stable
//!   wire names, derived with strum (the protocol's codes and reasons; also the label
//!   enums of the services, the consumer and the load test).
//!
//! Everything that decodes network input returns a typed error with a `kind()`; nothing
//! here panics on input.

/// A fieldless enum whose variants have stable wire names (header values, JSON strings,
/// metric labels), written once: as the variant names. Such an enum derives
/// `strum::IntoStaticStr`, `strum::Display` and `strum::VariantArray` with
/// `#[strum(serialize_all = "snake_case")]` (the rule of its serde `rename_all`; a name
/// that is not the variant's is renamed for both), and gets this trait from the blanket
/// impl. Each crate's tests check that `as_str` is the serde name of every variant.
pub trait WireName: Copy + strum::VariantArray + Into<&'static str> {
    /// Every variant, in declaration order.
    const ALL: &'static [Self] = Self::VARIANTS;

    /// The stable wire name.
    fn as_str(self) -> &'static str {
        self.into()
    }

    /// The variant whose wire name is exactly `name`; `None` for any other string
    /// (total: a name this build does not know is not an error here).
    fn from_wire(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == name)
    }
}

impl<T: Copy + strum::VariantArray + Into<&'static str>> WireName for T {}

pub mod admin;
pub mod audio;
pub mod capacity;
pub mod llm;
pub mod partition;
#[cfg(feature = "schema")]
pub mod schema;
pub mod stream_id;

pub use partition::{SubjectTemplate, fnv1a_32, partition_of};
pub use stream_id::{StreamId, StreamIdError};

#[cfg(test)]
mod tests {
    use super::WireName;
    use crate::audio::extension::{EndReason, OverloadReason, PossibleLossReason};
    use crate::audio::{DecodeErrorKind, GapReason};
    use crate::llm::error::ErrorCode;
    use crate::llm::headers::AdmissionPolicy;
    use crate::llm::stream::StreamEvent;

    /// `as_str` and `Display` of every variant, in declaration order.
    fn names<T: WireName + std::fmt::Display>() -> Vec<&'static str> {
        let names: Vec<_> = T::ALL.iter().map(|v| v.as_str()).collect();
        let shown: Vec<_> = T::ALL.iter().map(|v| v.to_string()).collect();
        assert_eq!(names, shown);
        names
    }

    /// The serde name of every variant, in declaration order.
    fn serde_names<T: WireName + serde::Serialize>() -> Vec<String> {
        let name = |v| match serde_json::to_value(v) {
            Ok(serde_json::Value::String(s)) => s,
            other => panic!("not a string: {other:?}"),
        };
        T::ALL.iter().map(name).collect()
    }

    #[test]
    fn wire_names_are_the_serde_names() {
        assert_eq!(names::<ErrorCode>(), serde_names::<ErrorCode>());
        assert_eq!(names::<GapReason>(), serde_names::<GapReason>());
        assert_eq!(names::<EndReason>(), serde_names::<EndReason>());
        let overload = ["queue_full", "max_age", "publish_timeout", "rate", "other"];
        assert_eq!(names::<OverloadReason>(), overload);
        assert_eq!(overload, serde_names::<OverloadReason>().as_slice());
        let loss = names::<PossibleLossReason>();
        assert_eq!(loss, serde_names::<PossibleLossReason>());
    }

    #[test]
    fn wire_names_without_serde_are_unchanged() {
        assert_eq!(names::<AdmissionPolicy>(), ["enqueue", "reject"]);
        let events = ["queued", "started", "chunk", "end", "error"];
        assert_eq!(names::<StreamEvent>(), events);
        let kinds = [
            "truncated",
            "meta_length_out_of_range",
            "meta_too_large",
            "invalid_utf8",
            "invalid_json",
            "missing_field",
            "unknown_type",
            "invalid_seq",
            "unsupported_sample_rate",
            "unsupported_sample_width",
            "unsupported_channels",
            "partial_sample",
            "pcm_too_large",
            "unexpected_pcm",
            "invalid_gap",
            "session_id_too_long",
        ];
        assert_eq!(names::<DecodeErrorKind>(), kinds);
    }
}

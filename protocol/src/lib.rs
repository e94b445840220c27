//! weir's wire contracts: bytes and names only — no tokio, no NATS.
//!
//! - [`audio`]: the deployed `frame`/`end` packet codec and the versioned extensions
//!   (headers and opt-in packet types) that an old consumer never trips over.
//! - [`stream_id`]: stream ids as safe NATS subject tokens.
//! - [`partition`]: the FNV-1a shard key (identical to nats-server `partition()`) and
//!   subject templates.
//! - [`llm`]: the LLM adapter's header names, the deployed JSON envelope and the error
//!   catalog.
//! - [`admin`]: the services' ready line and the ingress's `/v1/stats` snapshot, written
//!   by the services and read by the load test;
//! - [`error`]: the one error shape of weir's operations (`Error<Kind>`, the cause kept).
//! - [`wire_names!`]: a fieldless enum whose variants have stable wire names, with
//!   `ALL`, `as_str` and `Display` generated from one table (the protocol's codes and
//!   reasons; also the label enums of the services, the consumer and the load test).
//!
//! Everything that decodes network input returns a typed error with a `kind()`; nothing
//! here panics on input.

/// Declares a fieldless enum whose variants have stable wire names (header values,
/// JSON strings, metric labels) from one table, so that a name is written once: the
/// enum, `ALL` (every variant, in declaration order), `as_str` and `Display` (the
/// name). An enum that also derives serde must name its variants as the table does
/// (through its `rename_all`).
#[macro_export]
macro_rules! wire_names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [Self; [$($wire),+].len()] = [$(Self::$variant),+];

            /// The stable wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $wire),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod admin;
pub mod audio;
pub mod error;
pub mod llm;
pub mod partition;
pub mod stream_id;

pub use error::Error;
pub use partition::{SubjectTemplate, fnv1a_32, partition_of};
pub use stream_id::{StreamId, StreamIdError};

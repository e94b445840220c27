//! The `[telephony]` section: the telephony door ([`crate::telephony`]).
//!
//! Invariants: `telephony.subject_prefix` is a usable subject prefix (no wildcard, no
//! empty token); every number is inside the range of [`TELEPHONY_KEYS`]; the bot-audio
//! age bound covers the byte bound's audio (a reply queued whole plays out before it
//! could age out); the defaults validate.

use std::time::Duration;

use weir_service::config::{Range, whole_ms as ms};

use super::{ConfigError, ConfigErrorKind, int_in, subject_prefix};
use crate::telephony::TelephonyConfig;
use weir_audio_telephony::outbound::OutboundConfig;

/// Bytes of 16 kHz mono s16le PCM per millisecond.
const PCM_BYTES_PER_MS: u64 = 32;

weir_service::config_section! {
    /// The `[telephony]` keys as read from the layers.
    #[derive(Debug)]
    pub(super) struct TelephonySection, TELEPHONY_KEYS = "telephony.";
    {
        subject_prefix: String = "weir.voice".to_owned(),
            Range::text("a subject prefix without wildcards"),
            "subjects of a call's return path: bot audio in on `<prefix>.out.<stream>`, \
            `clear` on `<prefix>.ctl.<stream>`, the call's events on `<prefix>.events.<stream>`";
        // Three 20 ms chunks.
        reorder_window_ms: u64 = 60, Range::ms(0, 1000),
            "how long a carrier chunk waits for a missing earlier one before the missing \
            one is declared a gap (reason `source`); chunks are never published out of order";
        start_timeout_ms: u64 = 5_000, Range::ms(100, 60000),
            "a carrier connection that sends no `start` within this is closed (1008 \
            `start_timeout`); nothing is opened before `start`";
        // 15 s of 16 kHz PCM: a long reply sent at once.
        out_max_bytes: u64 = 480_000,
            Range::int(65536, 16777216).note("; at least one bot-audio message (64 KiB)"),
            "bound of a call's queued bot audio (bytes of 16 kHz PCM; 32,000 a second); \
            audio arriving over it is refused and told (`overload` event)";
        // 64 MiB: about 140 calls with a full 15 s queue at once (a call typically holds
        // a sentence).
        out_max_total_bytes: u64 = 64 << 20,
            Range::int(65536, 17179869184).note("; at least `telephony.out_max_bytes`"),
            "bound of every call's queued bot audio together (bytes of PCM); a message that \
            would exceed it is refused and told as the per-call bound's (`overload`, reason \
            `total_full`)";
        // A little over the byte bound's 15 s, so that a reply sent at once plays out.
        out_max_age_ms: u64 = 20_000,
            Range::ms(1000, 600000).note("; at least the audio `telephony.out_max_bytes` holds"),
            "bot audio not sent to the carrier within this of its arrival is dropped and \
            told (`overload` event, reason `max_age`): only a carrier that stops reading \
            makes audio this old";
        // Two frames ahead, against jitter at the carrier.
        out_lead_ms: u64 = 40, Range::ms(0, 1000),
            "how far ahead of real time bot audio is sent to the carrier (its jitter \
            buffer); what a `clear` cannot take back from the door";
    }
}

impl Default for TelephonyConfig {
    /// The documented defaults: the keys' defaults, validated.
    fn default() -> Self {
        super::valid_default(TelephonySection::default().validate())
    }
}

impl TelephonySection {
    /// The typed settings, or the refusal naming the key.
    pub(super) fn validate(&self) -> Result<TelephonyConfig, ConfigError> {
        subject_prefix("telephony.subject_prefix", &self.subject_prefix)?;
        let millis = |key, v| int_in(key, v).map(Duration::from_millis);
        let out_max_bytes = int_in("telephony.out_max_bytes", self.out_max_bytes)?;
        let out_max_age = millis("telephony.out_max_age_ms", self.out_max_age_ms)?;
        let total = int_in("telephony.out_max_total_bytes", self.out_max_total_bytes)?;
        if total < out_max_bytes {
            return Err(ConfigError::new(
                "telephony.out_max_total_bytes",
                ConfigErrorKind::Conflict,
                format!(
                    "{total} is below telephony.out_max_bytes = {out_max_bytes}: one call could \
                     never fill its own bound"
                ),
            ));
        }
        let queued_ms = out_max_bytes / PCM_BYTES_PER_MS;
        if ms(out_max_age) < queued_ms {
            return Err(ConfigError::new(
                "telephony.out_max_age_ms",
                ConfigErrorKind::Conflict,
                format!(
                    "{} ms is shorter than the {queued_ms} ms of audio telephony.out_max_bytes = \
                     {out_max_bytes} holds: a reply queued whole would age out while it plays",
                    ms(out_max_age)
                ),
            ));
        }
        Ok(TelephonyConfig {
            subject_prefix: self.subject_prefix.clone(),
            reorder_window: millis("telephony.reorder_window_ms", self.reorder_window_ms)?,
            start_timeout: millis("telephony.start_timeout_ms", self.start_timeout_ms)?,
            out: OutboundConfig {
                max_bytes: out_max_bytes as usize,
                max_age: out_max_age,
                lead: millis("telephony.out_lead_ms", self.out_lead_ms)?,
            },
            out_max_total_bytes: total as usize,
        })
    }
}

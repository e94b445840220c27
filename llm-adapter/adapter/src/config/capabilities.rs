//! The capabilities document of a [`Config`].

use serde_json::{Value, json};
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;

use super::*;

impl Config {
    /// The capabilities document: every limit (`null` when disabled), the subjects and
    /// the header names. Served on the capabilities subject and `/v1/capabilities`.
    pub fn capabilities(&self) -> Value {
        json!({
            "service": {
                "name": self.service.name,
                "version": self.service.version,
                "queue_group": self.service.queue_group,
                "subject": self.service.subject,
                "cancel_subject": self.service.cancel_subject,
                "capabilities_subject": self.service.capabilities_subject,
                "limits_subject": self.service.limits_subject,
                "status_subject": self.service.status_subject,
            },
            "stream": {
                "chunk_interval_ms": ms(self.admission.stream.interval),
                "chunk_max_bytes": self.admission.stream.max_bytes,
                "window": self.stream.window,
                "ack_timeout_ms": ms(self.stream.ack_timeout),
            },
            "mode": self.admission.mode,
            "workers": self.admission.workers.get(),
            "queue_capacity": self.admission.queue_capacity.get(),
            "session": {
                "pending_cap": self.admission.session.pending_cap.map(NonZeroUsize::get),
                "ordering": self.admission.session.ordering,
            },
            "limits": self.admission.limits.iter().map(limit_doc).collect::<Vec<_>>(),
            "deadline": self.deadline_doc(),
            "queue_order": self.admission.queue_order,
            "estimator": {
                "initial_ms": self.admission.estimator.initial.map(ms),
                "window": self.admission.estimator.window,
                "half_life": self.admission.estimator.half_life,
                "quantile": self.admission.estimator.quantile,
            },
            "idempotency": self.admission.idempotency.map(|i| json!({
                "window_ms": ms(i.window),
                "max_entries": i.max_entries.get(),
                "max_bytes": i.max_bytes.get(),
            })),
            "backend": {
                "kind": self.backend.kind.name(),
                "timeout_ms": ms(self.backend.timeout),
            },
            "backends": self.backends.iter().map(|m| json!({
                "name": m.name,
                "kind": m.backend.kind.name(),
                "slots": m.slots.get(),
                "timeout_ms": ms(m.backend.timeout),
                "weight": m.weight,
            })).collect::<Vec<_>>(),
            "pool": (!self.backends.is_empty()).then(|| json!({
                "eject_after_errors": self.admission.health.eject_after_errors,
                "stall_factor": self.admission.health.stall_factor,
                "stall_floor_ms": ms(self.admission.health.stall_floor),
                "backoff_base_ms": ms(self.admission.health.backoff_base),
                "backoff_max_ms": ms(self.admission.health.backoff_max),
            })),
            "priority": {
                "classes": ["interactive", "batch"],
                "default": "interactive",
                "batch_delay_ms": ms(self.admission.priority.batch_delay),
            },
            "shutdown_grace_ms": ms(self.admission.shutdown_grace),
            "intake": self.intake_doc(),
            "headers": headers_doc(),
        })
    }

    /// `deadline`: defaults, bounds and how the start budget is set.
    fn deadline_doc(&self) -> Value {
        json!({
            "default_ms": self.admission.deadline.default.map(ms),
            "max_ms": ms(self.admission.deadline.max),
            "min_start_budget_ms": self.admission.deadline.min_start_budget.map(ms),
            "start_budget": if self.admission.deadline.min_start_budget.is_some() { "fixed" } else { "adaptive" },
            "reply_margin_ms": ms(self.admission.deadline.reply_margin),
            "predict": self.admission.deadline.predict,
            "overtake_share_pct": self.admission.deadline.overtake_share_pct,
        })
    }

    /// `intake`: core NATS, or the JetStream stream and consumer.
    fn intake_doc(&self) -> Value {
        match &self.intake {
            Intake::Core => json!({"kind": "core"}),
            Intake::JetStream(j) => json!({
                "kind": "jetstream",
                "stream": j.stream,
                "subject": j.subject,
                "consumer": j.consumer,
                "ack_wait_ms": ms(j.ack_wait),
                "max_ack_pending": j.max_ack_pending.get(),
                "duplicate_window_ms": ms(j.duplicate_window),
                "forward": j.forward,
                "reply_to_header": weir_protocol::llm::headers::REPLY_TO,
            }),
        }
    }
}

/// One entry of `limits`: a per-key limit, its busy policy and token budget.
fn limit_doc(l: &KeyLimit) -> Value {
    let (on_busy, max_wait_ms, max_waiters) = match l.on_busy {
        OnBusy::Reject => ("reject", None, None),
        OnBusy::Wait {
            max_wait,
            max_waiters,
        } => ("wait", Some(ms(max_wait)), Some(max_waiters)),
    };
    json!({
        "name": l.name,
        "key": l.key.describe(),
        "limit": l.limit.get(),
        "on_busy": on_busy,
        "max_wait_ms": max_wait_ms,
        "max_waiters": max_waiters,
        "tokens_per_minute": l.tokens.map(|t| t.tokens_per_minute.get()),
        "default_max_tokens": l.tokens.map(|t| t.default_max_tokens),
        "priority": l.priority.map(|p| p.as_str()),
    })
}

/// `headers`: the names of the request, reply and stream headers.
fn headers_doc() -> Value {
    json!({
        "request_id": h::REQUEST_ID,
        "session_id": h::SESSION_ID,
        "deadline_ms": h::DEADLINE_MS,
        "timeout_ms": h::TIMEOUT_MS,
        "admission": h::ADMISSION,
        "client_key": h::CLIENT_KEY,
        "cancel": h::CANCEL,
        "cancel_session": h::CANCEL_SESSION,
        "supersede": h::SUPERSEDE,
        "priority": h::PRIORITY,
        "superseded": h::SUPERSEDED,
        "superseded_ids": h::SUPERSEDED_IDS,
        "queue_ms": h::QUEUE_MS,
        "inference_ms": h::INFERENCE_MS,
        "backend": h::BACKEND,
        "error_code": h::ERROR_CODE,
        "stream": weir_protocol::llm::stream::STREAM,
        "stream_event": weir_protocol::llm::stream::STREAM_EVENT,
        "stream_seq": weir_protocol::llm::stream::STREAM_SEQ,
    })
}

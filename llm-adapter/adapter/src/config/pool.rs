//! The backend pool's configuration: `[[backends]]` (each a name, a kind with its
//! sub-table as under `[backend]`, slots, a timeout and a weight) and `[pool]` (health).
//!
//! Invariants:
//! - `[backend]` and `[[backends]]` are exclusive; with `[[backends]]`, `workers` is the
//!   sum of the slots and may not be set;
//! - names are unique and safe (`A-Z a-z 0-9 - _`, 1..=64): they go into metric labels;
//! - every refusal names the element's key (`backends[1].name`, `backends[0].sim.seed`).

use std::num::NonZeroUsize;

use weir_service::config::{Layers, Origin};

use super::raw::{RawPool, RawPoolBackend, SECTIONS};
use super::*;

/// Most `[[backends]]` entries.
pub const MAX_BACKENDS: usize = 64;

/// Longest backend name.
const MAX_BACKEND_NAME: usize = 64;

/// One backend of `[[backends]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolMember {
    /// Its name (metrics, stats, capabilities).
    pub name: String,
    /// Concurrent calls.
    pub slots: NonZeroUsize,
    /// Cost of a call here (lower is preferred among backends in time).
    pub weight: u32,
    /// Its kind and timeout, as a `[backend]`.
    pub backend: BackendConfig,
}

/// Validates `[[backends]]`: empty when there is none.
pub(super) fn members(raw: &[RawPoolBackend]) -> Result<Vec<PoolMember>, ConfigError> {
    let one = |b: &RawPoolBackend, n: usize| {
        let key = |field: &str| format!("backends[{n}].{field}");
        validate::safe_name(&key("name"), &b.name, MAX_BACKEND_NAME)?;
        Ok(PoolMember {
            name: b.name.clone(),
            backend: b.backend.validate_at(&format!("backends[{n}]."))?,
            slots: count(&key("slots"), b.slots)?,
            weight: int32(&key("weight"), b.weight)?,
        })
    };
    validate::named_elements("backends", "backend", MAX_BACKENDS, raw, one, |m| &m.name)
}

impl RawPool {
    pub(super) fn validate(&self) -> Result<HealthConfig, ConfigError> {
        let base = millis("pool.backoff_base_ms", self.backoff_base_ms)?;
        let max = millis("pool.backoff_max_ms", self.backoff_max_ms)?;
        if max < base {
            return Err(invalid(
                "pool.backoff_max_ms",
                format!(
                    "{} is below pool.backoff_base_ms ({})",
                    max.as_millis(),
                    base.as_millis()
                ),
            ));
        }
        Ok(HealthConfig {
            eject_after_errors: int32("pool.eject_after_errors", self.eject_after_errors)?,
            stall_factor: int32("pool.stall_factor", self.stall_factor)?,
            stall_floor: millis("pool.stall_floor_ms", self.stall_floor_ms)?,
            backoff_base: base,
            backoff_max: max,
        })
    }
}

/// The pool's slots as the admission core sees them.
pub(super) fn slots(members: &[PoolMember]) -> Vec<PoolSlots> {
    members
        .iter()
        .map(|m| PoolSlots {
            name: m.name.clone(),
            slots: m.slots,
            timeout: m.backend.timeout,
            weight: m.weight,
        })
        .collect()
}

/// With `[[backends]]`, a key of `[backend]` (or `workers`) set anywhere is refused:
/// the two ways of naming the backends are exclusive.
pub(super) fn exclusive(layers: &Layers, pool: &[RawPoolBackend]) -> Result<(), ConfigError> {
    if pool.is_empty() {
        return Ok(());
    }
    let set = |key: &str| !matches!(layers.origin(key), Origin::Default);
    if set("workers") {
        return Err(invalid(
            "workers",
            "set together with [[backends]]: the workers are the backends' slots",
        ));
    }
    let backend_keys = SECTIONS
        .iter()
        .filter(|s| matches!(s.name, "backend" | "sim" | "openai" | "backend_nats"))
        .flat_map(|s| s.docs().map(|d| d.name));
    for key in backend_keys {
        if set(key) {
            return Err(invalid(
                key,
                "[backend] and [[backends]] are exclusive: describe every backend under \
                 [[backends]]",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_toml_str(text).expect_err("refused")
    }

    const TWO: &str = "[[backends]]\nname = \"a\"\nslots = 2\n[backends.sim]\nlatency_ms = 50\n\
                       [[backends]]\nname = \"b-2\"\nkind = \"nats\"\nslots = 3\ntimeout_ms = 500\n\
                       weight = 4\n[backends.nats]\nsubject = \"llm.b\"\n";

    #[test]
    fn backends_parse_into_the_pool_and_the_workers_are_their_slots() {
        let c = Config::from_toml_str(TWO).expect("valid");
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[0].name, "a");
        assert_eq!(c.backends[0].slots.get(), 2);
        assert_eq!(c.backends[0].weight, 1, "weight defaults to 1");
        let BackendKind::Sim(sim) = c.backends[0].backend.kind else {
            panic!("sim expected");
        };
        assert_eq!(sim.latency, Latency::Fixed(Duration::from_millis(50)));
        assert_eq!(c.backends[1].backend.kind.name(), "nats");
        assert_eq!(c.backends[1].backend.timeout, Duration::from_millis(500));
        assert_eq!(c.backends[1].weight, 4);
        assert_eq!(c.admission.workers.get(), 5);
        assert_eq!(c.admission.pool.len(), 2);
        assert_eq!(c.admission.pool[1].timeout, Duration::from_millis(500));
        assert_eq!(c.admission.health, HealthConfig::default());
    }

    #[test]
    fn a_backend_timeout_above_the_longest_deadline_is_a_warning_naming_it() {
        let c = Config::from_toml_str(
            "[[backends]]\nname = \"a\"\nslots = 1\n[[backends]]\nname = \"b\"\nslots = 1\n\
             timeout_ms = 200000\n",
        )
        .expect("valid");
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].keys()[0], "backends[1].timeout_ms", "{w:?}");
    }

    #[test]
    fn the_capabilities_list_the_pool() {
        let v = Config::from_toml_str(TWO).expect("valid").capabilities();
        assert_eq!(v["backends"][1]["name"], "b-2");
        assert_eq!(v["backends"][1]["kind"], "nats");
        assert_eq!(v["backends"][1]["slots"], 3);
        assert_eq!(v["backends"][1]["timeout_ms"], 500);
        assert_eq!(v["backends"][1]["weight"], 4);
        assert_eq!(v["pool"]["stall_factor"], 3);
        assert_eq!(v["workers"], 5);
        let v = Config::default().capabilities();
        assert_eq!(v["backends"], serde_json::json!([]));
        assert!(v["pool"].is_null());
    }

    #[test]
    fn a_single_backend_is_unchanged() {
        let c = Config::from_toml_str("workers = 3\n[backend]\nkind = \"sim\"\n").expect("valid");
        assert!(c.backends.is_empty());
        assert!(c.admission.pool.is_empty());
        assert_eq!(c.admission.workers.get(), 3);
        assert_eq!(Config::default().admission.health, HealthConfig::default());
    }

    #[test]
    fn bad_backend_lists_are_refused_naming_the_key() {
        let two =
            |second: &str| format!("[[backends]]\nname = \"a\"\nslots = 1\n[[backends]]\n{second}");
        assert_eq!(
            err(&two("name = \"a\"\nslots = 1")).key(),
            "backends[1].name"
        );
        assert_eq!(
            err(&two("name = \"b\"\nslots = 0")).key(),
            "backends[1].slots"
        );
        assert_eq!(err(&two("name = \"b\"")).key(), "backends[1].slots");
        assert_eq!(err(&two("slots = 1")).key(), "backends[1].name");
        assert_eq!(
            err(&two("name = \"b c\"\nslots = 1")).key(),
            "backends[1].name"
        );
        let e = err(&two("name = \"b\"\nslots = 1\nkind = \"grpc\""));
        assert_eq!(e.key(), "backends[1].kind", "{e}");
        let e = err(&two("name = \"b\"\nslots = 1\nkind = \"nats\""));
        assert_eq!(e.key(), "backends[1].nats.subject", "{e}");
        let e = err(&two("name = \"b\"\nslots = 1\n[backends.sim]\nmin_ms = 3"));
        assert_eq!(e.key(), "backends[1].sim.min_ms", "{e}");
        let e = err(&two("name = \"b\"\nslots = 1\nweight = 0"));
        assert_eq!(e.key(), "backends[1].weight", "{e}");
        let e = err(&format!(
            "[backend]\nkind = \"sim\"\n{}",
            two("name = \"b\"\nslots = 1")
        ));
        assert_eq!(e.key(), "backend.kind", "{e}");
        assert!(e.to_string().contains("exclusive"), "{e}");
        let e = err(&format!("workers = 4\n{}", two("name = \"b\"\nslots = 1")));
        assert_eq!(e.key(), "workers", "{e}");
        let e = err("[pool]\nbackoff_base_ms = 5000\nbackoff_max_ms = 1000\n");
        assert_eq!(e.key(), "pool.backoff_max_ms", "{e}");
    }

    #[test]
    fn a_nats_cancel_subject_is_optional_and_validated_like_the_subject() {
        let nats = |table: &str, extra: &str| format!("{table}\nsubject = \"llm.b\"\n{extra}");
        let single = |extra: &str| {
            format!(
                "[backend]\nkind = \"nats\"\n{}",
                nats("[backend.nats]", extra)
            )
        };
        let cancel_of = |c: &Config| match &c.backend.kind {
            BackendKind::Nats(n) => n.cancel_subject.clone(),
            _ => panic!("nats expected"),
        };
        let c = Config::from_toml_str(&single("")).expect("valid");
        assert_eq!(cancel_of(&c), None, "none by default");
        let c = Config::from_toml_str(&single("cancel_subject = \"llm.b.cancel\"")).expect("valid");
        assert_eq!(cancel_of(&c).as_deref(), Some("llm.b.cancel"));
        for bad in ["llm.*", "llm.>", "two words", "llm..b", "llm.b"] {
            let e = err(&single(&format!("cancel_subject = \"{bad}\"")));
            assert_eq!(e.key(), "backend.nats.cancel_subject", "{bad}: {e}");
        }
        let pool = format!(
            "[[backends]]\nname = \"a\"\nslots = 1\n[[backends]]\nname = \"b\"\nslots = 1\n\
             kind = \"nats\"\n{}",
            nats("[backends.nats]", "cancel_subject = \"llm.>\"")
        );
        assert_eq!(err(&pool).key(), "backends[1].nats.cancel_subject");
        let c = Config::from_toml_str(&pool.replace("llm.>", "llm.stop")).expect("valid");
        let BackendKind::Nats(n) = &c.backends[1].backend.kind else {
            panic!("nats expected");
        };
        assert_eq!(n.cancel_subject.as_deref(), Some("llm.stop"));
    }
}

//! Validation of the raw sections into the typed configuration: every refusal names
//! the full key; numbers are checked against the typed ranges of [`super::SECTIONS`].

use std::collections::BTreeSet;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use super::raw::*;
use super::*;

impl RawConfig {
    /// Validates every value into the typed settings; a refusal names the key.
    pub(super) fn validate(self) -> Result<Config, ConfigError> {
        let backends = pool::members(&self.backends)?;
        let workers = match backends
            .iter()
            .map(|m| m.slots.get())
            .reduce(usize::saturating_add)
        {
            // A pool: the workers are the backends' slots.
            Some(slots) => NonZeroUsize::new(slots).unwrap_or(NonZeroUsize::MIN),
            None => count("workers", self.workers)?,
        };
        let queue_capacity = count("queue_capacity", self.queue_capacity)?;
        let nats = self.nats.validate(queue_capacity.get())?;
        let single = self.backend.validate_at("backend.")?;
        let backend = backends.first().map_or(single, |m| m.backend.clone());
        let backend_timeout =
            (backends.iter().map(|m| m.backend.timeout).max()).unwrap_or(backend.timeout);
        Ok(Config {
            admission: AdmissionConfig {
                workers,
                queue_capacity,
                mode: self.mode,
                session: SessionConfig {
                    pending_cap: NonZeroUsize::new(size(
                        "session.pending_cap",
                        self.session.pending_cap,
                    )?),
                    ordering: self.session.ordering,
                },
                limits: self.limits()?,
                deadline: self.deadline.validate()?,
                queue_order: self.queue_order,
                estimator: self.estimator.validate()?,
                idempotency: self.idempotency.validate()?,
                backend_timeout,
                pool: pool::slots(&backends),
                health: self.pool.validate()?,
                priority: crate::admission::PriorityConfig {
                    batch_delay: millis("priority.batch_delay_ms", self.priority.batch_delay_ms)?,
                },
                shutdown_grace: millis("shutdown_grace_ms", self.shutdown_grace_ms)?,
                max_reply_bytes: usize::MAX,
                stream: crate::admission::StreamSettings {
                    interval: millis("stream.chunk_interval_ms", self.stream.chunk_interval_ms)?,
                    max_bytes: size("stream.chunk_max_bytes", self.stream.chunk_max_bytes)?,
                },
            },
            backend,
            backends,
            service: self.service.validate()?,
            admin: self.admin.validate()?,
            trace: TraceConfig {
                log: self.trace.log,
                subject: optional_subject("trace.subject", &self.trace.subject)?,
                buffer: count("trace.buffer", self.trace.buffer)?,
            },
            stream: StreamConfig {
                window: size("stream.window", self.stream.window)?,
                ack_timeout: match self.stream.ack_timeout_ms {
                    Some(v) => millis("stream.ack_timeout_ms", v)?,
                    None => nats.publish_timeout,
                },
            },
            intake: match (self.intake, self.jetstream.validate(workers)?) {
                (IntakeKind::Core, _) => Intake::Core,
                (IntakeKind::JetStream, js) => Intake::JetStream(Box::new(js)),
            },
            nats,
            log: self.log.validate()?,
        })
    }

    fn limits(&self) -> Result<Vec<KeyLimit>, ConfigError> {
        let one = |l: &RawLimit, n: usize| {
            let key_of = |field: &str| format!("limits[{n}].{field}");
            let key = KeySource::parse(&key_of("key"), &l.key)?;
            let name = set(&l.name).map_or_else(|| key.describe(), str::to_owned);
            name_check(&key_of("name"), &name)?;
            Ok(KeyLimit {
                name,
                key,
                limit: count(&key_of("limit"), l.limit)?,
                on_busy: match l.on_busy {
                    OnBusyKind::Reject => OnBusy::Reject,
                    OnBusyKind::Wait => OnBusy::Wait {
                        max_wait: millis(&key_of("max_wait_ms"), l.max_wait_ms)?,
                        max_waiters: size(&key_of("max_waiters"), l.max_waiters)?,
                    },
                },
                tokens: l.token_budget(&key_of)?,
                priority: set(&l.priority)
                    .map(|p| {
                        crate::admission::Priority::parse(p).map_err(|_| {
                            invalid(
                                key_of("priority"),
                                format!("{p:?}: expected `interactive` or `batch`"),
                            )
                        })
                    })
                    .transpose()?,
            })
        };
        named_elements("limits", "limit", MAX_LIMITS, &self.limits, one, |l| {
            &l.name
        })
    }
}

/// The elements of the array `key` (at most `max` of them), each validated by `one`; a
/// name (`name_of`) used twice is refused at `key[n].name`.
pub(super) fn named_elements<R, T>(
    key: &str,
    what: &str,
    max: usize,
    raw: &[R],
    one: impl Fn(&R, usize) -> Result<T, ConfigError>,
    name_of: impl Fn(&T) -> &str,
) -> Result<Vec<T>, ConfigError> {
    if raw.len() > max {
        return Err(invalid(key, format!("at most {max} {what}s")));
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (n, r) in raw.iter().enumerate() {
        let t = one(r, n)?;
        if !names.insert(name_of(&t).to_owned()) {
            let message = format!("duplicate {what} name {:?}", name_of(&t));
            return Err(invalid(format!("{key}[{n}].name"), message));
        }
        out.push(t);
    }
    Ok(out)
}

impl RawLimit {
    /// The token budget of this limit (`key_of` names its keys), `None` when
    /// `tokens_per_minute` is 0.
    fn token_budget(
        &self,
        key_of: &dyn Fn(&str) -> String,
    ) -> Result<Option<TokenBudget>, ConfigError> {
        let tpm = int(&key_of("tokens_per_minute"), self.tokens_per_minute)?;
        if tpm == 0 {
            return Ok(None);
        }
        let default_max_tokens = int(&key_of("default_max_tokens"), self.default_max_tokens)?;
        if default_max_tokens > tpm {
            return Err(invalid(
                key_of("default_max_tokens"),
                format!(
                    "{default_max_tokens} is larger than {} ({tpm}): a request without \
                     max_tokens would need more than a full budget; set it to at most {tpm}",
                    key_of("tokens_per_minute")
                ),
            ));
        }
        Ok(Some(TokenBudget {
            tokens_per_minute: NonZeroU64::new(tpm).unwrap_or(NonZeroU64::MIN),
            default_max_tokens,
            max_keys: count(&key_of("max_token_keys"), self.max_token_keys)?,
        }))
    }
}

impl RawDeadline {
    pub(super) fn validate(&self) -> Result<DeadlineConfig, ConfigError> {
        let max = millis("deadline.max_ms", self.max_ms)?;
        let default = int("deadline.default_ms", self.default_ms)?;
        if default > self.max_ms {
            return Err(invalid(
                "deadline.default_ms",
                format!("{default} is larger than deadline.max_ms ({})", self.max_ms),
            ));
        }
        Ok(DeadlineConfig {
            default: (default > 0).then(|| Duration::from_millis(default)),
            max,
            min_start_budget: self
                .min_start_budget_ms
                .map(|v| millis("deadline.min_start_budget_ms", v))
                .transpose()?,
            reply_margin: millis("deadline.reply_margin_ms", self.reply_margin_ms)?,
            predict: self.predict,
            overtake_share_pct: u8::try_from(int(
                "deadline.overtake_share_pct",
                self.overtake_share_pct,
            )?)
            .unwrap_or(90),
        })
    }
}

impl RawEstimator {
    pub(super) fn validate(&self) -> Result<EstimatorConfig, ConfigError> {
        let initial = int("estimator.initial_ms", self.initial_ms)?;
        let window = size("estimator.window", self.window)?;
        let half_life = int("estimator.half_life", self.half_life)?;
        if half_life > self.window {
            return Err(invalid(
                "estimator.half_life",
                format!("{half_life} is larger than estimator.window ({window})"),
            ));
        }
        Ok(EstimatorConfig {
            initial: (initial > 0).then(|| Duration::from_millis(initial)),
            window,
            half_life: half_life as f64,
            quantile: decimal("estimator.quantile", self.quantile)?,
        })
    }
}

impl RawIdempotency {
    pub(super) fn validate(&self) -> Result<Option<IdempotencyConfig>, ConfigError> {
        let cfg = IdempotencyConfig {
            window: millis("idempotency.window_ms", self.window_ms)?,
            max_entries: count("idempotency.max_entries", self.max_entries)?,
            max_bytes: count("idempotency.max_bytes", self.max_bytes)?,
        };
        Ok(self.enabled.then_some(cfg))
    }
}

impl RawBackend {
    /// Validates the backend whose keys start with `p` (`backend.`, `backends[2].`).
    /// Every backend section is validated, whichever is selected, so a file may keep
    /// several and switch with `kind` (e.g. `WEIR_LLM_BACKEND__KIND=openai`).
    pub(super) fn validate_at(&self, p: &str) -> Result<BackendConfig, ConfigError> {
        let timeout = millis(&format!("{p}timeout_ms"), self.timeout_ms)?;
        let sim = self.sim.validate_at(&format!("{p}sim."))?;
        let openai = self.openai.validate_at(&format!("{p}openai."))?;
        let nats_subject = optional_subject(&format!("{p}nats.subject"), &self.nats.subject)?;
        let cancel_key = format!("{p}nats.cancel_subject");
        let cancel_subject = optional_subject(&cancel_key, &self.nats.cancel_subject)?;
        if cancel_subject.is_some() && cancel_subject == nats_subject {
            return Err(invalid(cancel_key, "must differ from the `subject`"));
        }
        let kind = match self.kind {
            BackendName::Sim => BackendKind::Sim(sim),
            BackendName::OpenAi => BackendKind::OpenAi(openai),
            BackendName::Nats => BackendKind::Nats(NatsBackendConfig {
                subject: nats_subject.ok_or_else(|| {
                    invalid(
                        format!("{p}nats.subject"),
                        format!("required when {p}kind = \"nats\""),
                    )
                })?,
                cancel_subject,
            }),
        };
        Ok(BackendConfig { timeout, kind })
    }
}

impl RawSim {
    /// Validates the sub-table whose keys start with `p` (`backend.sim.`,
    /// `backends[2].sim.`).
    pub(super) fn validate_at(&self, p: &str) -> Result<SimConfig, ConfigError> {
        let key = |field: &str| format!("{p}{field}");
        let latency = int(&key("latency_ms"), self.latency_ms)?;
        // A bound of another distribution would be ignored: refused instead.
        let unused = match self.distribution {
            Distribution::Fixed => vec![
                ("min_ms", self.min_ms),
                ("max_ms", self.max_ms),
                ("p99_ms", self.p99_ms),
            ],
            Distribution::Uniform => vec![("p99_ms", self.p99_ms)],
            Distribution::LogNormal => vec![("min_ms", self.min_ms), ("max_ms", self.max_ms)],
        };
        if let Some((field, _)) = unused.iter().find(|(_, v)| v.is_some()) {
            return Err(invalid(
                key(field),
                "set, but backend.sim.distribution does not use it",
            ));
        }
        let latency = match self.distribution {
            Distribution::Fixed => Latency::Fixed(Duration::from_millis(latency)),
            Distribution::Uniform => {
                let min = int(&key("min_ms"), self.min_ms.unwrap_or(0))?;
                let max = int(&key("max_ms"), self.max_ms.unwrap_or(latency.max(min)))?;
                if max < min {
                    return Err(invalid(
                        key("max_ms"),
                        format!("{max} is below min_ms {min}"),
                    ));
                }
                Latency::Uniform {
                    min: Duration::from_millis(min),
                    max: Duration::from_millis(max),
                }
            }
            Distribution::LogNormal => {
                let p99 = int(
                    &key("p99_ms"),
                    self.p99_ms.unwrap_or(latency.saturating_mul(3)),
                )?;
                if p99 < latency {
                    return Err(invalid(
                        key("p99_ms"),
                        format!("{p99} is below the median latency_ms {latency}"),
                    ));
                }
                Latency::LogNormal {
                    median: Duration::from_millis(latency),
                    p99: Duration::from_millis(p99),
                }
            }
        };
        Ok(SimConfig {
            latency,
            error_rate: decimal(&key("error_rate"), self.error_rate)?,
            seed: int(&key("seed"), self.seed)?,
            stream: SimStream {
                first_token: millis(&key("first_token_ms"), self.first_token_ms)?,
                tokens: int32(&key("tokens"), self.tokens)?,
                tokens_per_second: decimal(&key("tokens_per_second"), self.tokens_per_second)?,
            },
        })
    }
}

impl RawOpenAi {
    /// Validates the sub-table whose keys start with `p` (`backend.openai.`,
    /// `backends[2].openai.`).
    pub(super) fn validate_at(&self, p: &str) -> Result<OpenAiConfig, ConfigError> {
        let key = |field: &str| format!("{p}{field}");
        let base_url = &self.base_url;
        let host = base_url
            .strip_prefix("https://")
            .or_else(|| base_url.strip_prefix("http://"));
        if host.is_none_or(|h| h.trim_end_matches('/').is_empty()) {
            return Err(invalid(
                key("base_url"),
                format!("expected http://host:port or https://host[:port], got {base_url:?}"),
            ));
        }
        let tls_ca_file = set(&self.tls_ca_file).map(PathBuf::from);
        let tls_cert_file = set(&self.tls_cert_file).map(PathBuf::from);
        let tls_key_file = set(&self.tls_key_file).map(PathBuf::from);
        if tls_cert_file.is_some() != tls_key_file.is_some() {
            let missing = if tls_cert_file.is_some() {
                key("tls_key_file")
            } else {
                key("tls_cert_file")
            };
            return Err(invalid(
                missing,
                "tls_cert_file and tls_key_file go together",
            ));
        }
        if !base_url.starts_with("https://")
            && let Some(k) = [
                ("tls_ca_file", tls_ca_file.is_some()),
                ("tls_cert_file", tls_cert_file.is_some()),
            ]
            .into_iter()
            .find_map(|(k, set)| set.then_some(k))
        {
            return Err(invalid(
                key(k),
                "set, but base_url is not https:// (it would be ignored)",
            ));
        }
        if !self.path.starts_with('/') {
            return Err(invalid(key("path"), "must start with '/'"));
        }
        Ok(OpenAiConfig {
            base_url: base_url.trim_end_matches('/').to_owned(),
            path: self.path.clone(),
            api_key_env: set(&self.api_key_env).map(str::to_owned),
            connect_timeout: millis(&key("connect_timeout_ms"), self.connect_timeout_ms)?,
            pool_max_idle_per_host: size(
                &key("pool_max_idle_per_host"),
                self.pool_max_idle_per_host,
            )?,
            pool_idle_timeout: millis(&key("pool_idle_timeout_ms"), self.pool_idle_timeout_ms)?,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
        })
    }
}

impl RawNats {
    pub(super) fn validate(&self, queue_capacity: usize) -> Result<AdapterNats, ConfigError> {
        let mut client = self.common.validate(adapter_nats_defaults())?;
        client.subscription_capacity = Some(self.subscription_capacity(queue_capacity)?);
        Ok(AdapterNats {
            client,
            publish_timeout: millis("nats.publish_timeout_ms", self.publish_timeout_ms)?,
        })
    }

    /// `nats.subscription_capacity`: by default `queue_capacity` +
    /// `nats.expected_burst`, so that a burst of that many requests arriving at once is
    /// buffered by the client and answered (a refusal is fast; a message the client
    /// drops gets no answer at all). Set explicitly, it must hold at least
    /// `queue_capacity` messages.
    fn subscription_capacity(&self, queue_capacity: usize) -> Result<usize, ConfigError> {
        let burst = size("nats.expected_burst", self.expected_burst)?;
        let Some(explicit) = self.subscription_capacity else {
            return Ok(queue_capacity.saturating_add(burst).max(16));
        };
        let cap = size("nats.subscription_capacity", explicit)?;
        if cap < queue_capacity {
            return Err(invalid(
                "nats.subscription_capacity",
                format!(
                    "{cap} is smaller than queue_capacity ({queue_capacity}): the client would \
                     drop requests (no answer) before the queue refuses them; use at least \
                     queue_capacity + the largest burst expected"
                ),
            ));
        }
        Ok(cap)
    }
}

impl ServiceConfig {
    /// The same keys, checked.
    pub(super) fn validate(&self) -> Result<Self, ConfigError> {
        stream_name("service.name", &self.name)?;
        if !is_semver(&self.version) {
            return Err(invalid(
                "service.version",
                format!(
                    "expected a semantic version like 1.2.3, got {:?}",
                    self.version
                ),
            ));
        }
        name_check("service.queue_group", &self.queue_group)?;
        let subjects = [
            ("service.subject", &self.subject),
            ("service.cancel_subject", &self.cancel_subject),
            ("service.capabilities_subject", &self.capabilities_subject),
            ("service.limits_subject", &self.limits_subject),
            ("service.status_subject", &self.status_subject),
        ];
        for (key, s) in subjects {
            subject(key, s.clone(), true)?;
        }
        let distinct: BTreeSet<&String> = subjects.iter().map(|(_, s)| *s).collect();
        if distinct.len() != subjects.len() {
            return Err(invalid(
                "service.subject",
                "the five service subjects must differ",
            ));
        }
        Ok(self.clone())
    }
}

impl RawAdmin {
    pub(super) fn validate(&self) -> Result<AdminConfig, ConfigError> {
        let common = self.common.validate()?;
        Ok(AdminConfig {
            listen: common.listen,
            max_connections: common.max_connections,
            header_timeout: millis("admin.header_timeout_ms", self.header_timeout_ms)?,
            idle_timeout: millis("admin.idle_timeout_ms", self.idle_timeout_ms)?,
            request_limits: common.request_limits,
        })
    }
}

impl RawJetStream {
    /// `[jetstream]`, read and validated whatever `intake` says (so that a file can
    /// keep it and switch with `WEIR_LLM_INTAKE`).
    pub(super) fn validate(&self, workers: NonZeroUsize) -> Result<JetStreamIntake, ConfigError> {
        stream_name("jetstream.stream", &self.stream)?;
        let subject_s = subject("jetstream.subject", self.subject.clone(), false)?;
        stream_name("jetstream.consumer", &self.consumer)?;
        let ack_wait = millis("jetstream.ack_wait_ms", self.ack_wait_ms)?;
        let progress_interval = millis(
            "jetstream.progress_interval_ms",
            self.progress_interval_ms.unwrap_or(self.ack_wait_ms / 3),
        )?;
        if progress_interval >= ack_wait {
            return Err(invalid(
                "jetstream.progress_interval_ms",
                format!(
                    "{} must be below jetstream.ack_wait_ms ({})",
                    progress_interval.as_millis(),
                    ack_wait.as_millis()
                ),
            ));
        }
        let max_ack_pending = count(
            "jetstream.max_ack_pending",
            self.max_ack_pending.unwrap_or(workers.get() as u64),
        )?;
        if max_ack_pending < workers {
            return Err(invalid(
                "jetstream.max_ack_pending",
                format!(
                    "{max_ack_pending} is below workers ({workers}): the replica could never fill its workers"
                ),
            ));
        }
        stream_name("jetstream.session_bucket", &self.session_bucket)?;
        let reply_bucket = set(&self.reply_bucket).map(|b| {
            stream_name("jetstream.reply_bucket", b)?;
            if b == self.session_bucket {
                let message = "must differ from jetstream.session_bucket";
                return Err(invalid("jetstream.reply_bucket", message));
            }
            Ok(b.to_owned())
        });
        let reply_bucket = reply_bucket.transpose()?;
        Ok(JetStreamIntake {
            stream: self.stream.clone(),
            subject: subject_s,
            consumer: self.consumer.clone(),
            ack_wait,
            progress_interval,
            max_ack_pending,
            max_deliver: count("jetstream.max_deliver", self.max_deliver)?,
            duplicate_window: millis("jetstream.duplicate_window_ms", self.duplicate_window_ms)?,
            max_messages: count("jetstream.max_messages", self.max_messages)?,
            max_bytes: count("jetstream.max_bytes", self.max_bytes)?,
            replicas: count("jetstream.replicas", self.replicas)?,
            file_storage: self.storage == Storage::File,
            session_bucket: self.session_bucket.clone(),
            reply_bucket,
            forward: self.forward,
        })
    }
}

/// A stream, consumer or bucket name: `A-Z a-z 0-9 - _` (no dots, spaces or wildcards,
/// which JetStream refuses in names).
fn stream_name(key: &str, s: &str) -> Result<(), ConfigError> {
    safe_name(key, s, MAX_NAME_LEN)
}

/// 1..=`max` of `A-Z a-z 0-9 - _` (also safe as a metric label).
pub(super) fn safe_name(key: &str, s: &str, max: usize) -> Result<(), ConfigError> {
    let safe = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if s.is_empty() || s.len() > max || !s.bytes().all(safe) {
        return Err(invalid(
            key,
            format!("expected 1..={max} of A-Z a-z 0-9 - _, got {s:?}"),
        ));
    }
    Ok(())
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// An optional subject without wildcards (`""` = none).
fn optional_subject(key: &str, s: &str) -> Result<Option<String>, ConfigError> {
    set(s)
        .map(|s| subject(key, s.to_owned(), false))
        .transpose()
}

/// Validates a subject; wildcards only where `wildcards` (endpoint subjects).
fn subject(key: &str, s: String, wildcards: bool) -> Result<String, ConfigError> {
    let bad = s.is_empty()
        || s.len() > 256
        || s.split('.').any(|t| {
            t.is_empty()
                || t.bytes().any(|b| !(b'!'..=b'~').contains(&b))
                || (!wildcards && (t == "*" || t == ">"))
        });
    if bad {
        return Err(invalid(
            key,
            format!(
                "expected a NATS subject of non-empty dot-separated tokens without spaces{}, got {s:?}",
                if wildcards { "" } else { " or wildcards" }
            ),
        ));
    }
    Ok(s)
}

fn name_check(key: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > MAX_NAME_LEN || s.bytes().any(|b| !(b'!'..=b'~').contains(&b)) {
        return Err(invalid(
            key,
            format!("expected 1..={MAX_NAME_LEN} visible ASCII characters, got {s:?}"),
        ));
    }
    Ok(())
}

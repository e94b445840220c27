//! `[nats]`: the connection keys of every weir client, once.
//!
//! Invariants: the keys, their defaults (from a [`NatsConfig`]), ranges and meanings
//! are the same in every binary ([`NATS_KEYS`]); a refusal names the key as
//! `nats.<field>`; `Debug` never prints a password, token or NKey seed.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::config::{ConfigError, ConfigErrorKind, Range, set, whole_ms as ms};
use crate::nats::{MAX_INBOX_PREFIX_LEN, MAX_INBOX_PREFIX_TOKENS, NatsAuth, NatsConfig, NatsTls};

crate::config_section! {
    /// The `[nats]` keys as read, before validation. An empty string is unset.
    #[derive(PartialEq, Eq)]
    pub struct NatsSection, NATS_KEYS = "nats.";
    /// The keys whose defaults are `config` (a binary's [`NatsConfig::named`], with
    /// its own client name and capacity); no credentials.
    pub fn from_config(config: &NatsConfig);
    {
        url: String = config.url_list(),
            Range::text("`nats://`, `tls://`, `ws://` URLs, comma-separated"),
            "NATS server(s), tried in turn; each URL parsed on its own (`--nats-url` too)";
        name: String = config.name.clone(), Range::Any,
            "client name shown by the server (empty: the binary's)";
        user: String = String::new(),
            Range::text("with `nats.password`; one authentication method"),
            "user name (secrets show as `<redacted>` in `Debug` output and logs)";
        password: String = String::new(), Range::text("with `nats.user`"), "password";
        token: String = String::new(), Range::text("one authentication method"), "token";
        nkey: String = String::new(),
            Range::text("an NKey user seed (`SU...`); one authentication method"), "NKey seed";
        creds_file: String = String::new(),
            Range::text("an existing file; one authentication method"),
            "credentials file (JWT + NKey seed)";
        tls_required: bool = config.tls.required, Range::Any, "require TLS";
        tls_ca_file: String = String::new(), Range::text("an existing PEM file"),
            "CA certificates trusted for the server";
        tls_cert_file: String = String::new(),
            Range::text("an existing PEM file; with `nats.tls_key_file`"),
            "client certificate (mutual TLS)";
        tls_key_file: String = String::new(),
            Range::text("an existing PEM file; with `nats.tls_cert_file`"),
            "private key of the client certificate";
        inbox_prefix: String = config.inbox_prefix.clone(),
            Range::text("1..=8 tokens of `A-Z a-z 0-9 _ -`, dot-separated, ≤ 128 bytes"),
            "prefix of every inbox (reply subject) the client makes, `<prefix>.<unique>`: the \
            NATS user's own, e.g. `_INBOX.ingress`, `_INBOX.llm-adapter` \
            (deploy/nats-server.conf)";
        // Below 100 ms no real network connects; above 60 s a reconnect that tries a hung
        // node first stalls for a minute.
        connection_timeout_ms: u64 = ms(config.connection_timeout), Range::ms(100, 60_000),
            "bound on connecting to one server (a reconnect that tries a hung node first \
            waits this long)";
        ping_interval_ms: u64 = ms(config.ping_interval), Range::ms(100, 600_000),
            "PING interval: a silent server is declared dead after 2–3 of these (4–6 s for a \
            hung node at the default); see \
            [operations.md](operations.md#ingress-and-adapter-on-a-cluster)";
        client_capacity: u64 = config.client_capacity as u64, Range::int(16, 1_048_576),
            "messages the NATS client buffers (shared by every stream or reply) before a \
            publish waits";
        retry_initial_connect: bool = config.retry_initial_connect, Range::Any,
            "start even when no server answers yet and keep trying in the background \
            (`/readyz` 503 until connected); `false`: exit 1 if the first connection fails";
    }
}

impl Default for NatsSection {
    fn default() -> Self {
        Self::from_config(&NatsConfig::named(""))
    }
}

impl fmt::Debug for NatsSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("NatsSection")
            .field("url", &self.url)
            .field("name", &self.name)
            .field("user", &self.user)
            .field("password", &secret(&self.password))
            .field("token", &secret(&self.token))
            .field("nkey", &secret(&self.nkey))
            .field("creds_file", &self.creds_file)
            .field("tls_required", &self.tls_required)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("connection_timeout_ms", &self.connection_timeout_ms)
            .field("ping_interval_ms", &self.ping_interval_ms)
            .field("client_capacity", &self.client_capacity)
            .field("retry_initial_connect", &self.retry_initial_connect)
            .finish()
    }
}

impl NatsSection {
    /// Validates the keys into `base` (which keeps what the section has no key for:
    /// `subscription_capacity`), with the invariants of [`NatsConfig`]. An empty string
    /// is unset: the base's URLs and inbox prefix stay. A refusal names `nats.<field>`.
    pub fn validate(&self, base: NatsConfig) -> Result<NatsConfig, ConfigError> {
        let range = |field: &str| crate::config::keys::range_of(NATS_KEYS, &key(field));
        let connection_timeout = range("connection_timeout_ms")
            .millis(&key("connection_timeout_ms"), self.connection_timeout_ms)?;
        let ping_interval =
            range("ping_interval_ms").millis(&key("ping_interval_ms"), self.ping_interval_ms)?;
        let client_capacity =
            range("client_capacity").size(&key("client_capacity"), self.client_capacity)?;
        let urls = match set(&self.url) {
            Some(list) => urls(list)?,
            None => base.urls,
        };
        let auth = self.auth()?;
        let client_cert = together(
            ("tls_cert_file", file("tls_cert_file", &self.tls_cert_file)?),
            ("tls_key_file", file("tls_key_file", &self.tls_key_file)?),
        )?;
        let tls = NatsTls {
            required: self.tls_required,
            ca_file: file("tls_ca_file", &self.tls_ca_file)?,
            client_cert,
        };
        let inbox_prefix = match set(&self.inbox_prefix) {
            Some(prefix) => inbox_prefix(prefix)?,
            None => base.inbox_prefix,
        };
        Ok(NatsConfig {
            urls,
            name: set(&self.name).map_or(base.name, str::to_owned),
            auth,
            tls,
            connection_timeout,
            ping_interval,
            client_capacity,
            subscription_capacity: base.subscription_capacity,
            retry_initial_connect: self.retry_initial_connect,
            inbox_prefix,
        })
    }

    /// The one authentication method set, or none.
    fn auth(&self) -> Result<NatsAuth, ConfigError> {
        let mut methods: Vec<(&str, NatsAuth)> = Vec::new();
        if let Some((user, password)) =
            together(("user", set(&self.user)), ("password", set(&self.password)))?
        {
            let (user, password) = (user.to_owned(), password.to_owned());
            methods.push(("user", NatsAuth::UserPassword { user, password }));
        }
        if let Some(t) = set(&self.token) {
            methods.push(("token", NatsAuth::Token(t.to_owned())));
        }
        if let Some(seed) = set(&self.nkey) {
            if !seed.starts_with("SU") {
                return Err(refuse(
                    "nkey",
                    ConfigErrorKind::Invalid,
                    "expected a user NKey seed (starting with SU)",
                ));
            }
            methods.push(("nkey", NatsAuth::NKey(seed.to_owned())));
        }
        if let Some(path) = file("creds_file", &self.creds_file)? {
            methods.push(("creds_file", NatsAuth::CredsFile(path)));
        }
        if let [(_, _), (second, _), ..] = methods.as_slice() {
            let names: Vec<&str> = methods.iter().map(|(k, _)| *k).collect();
            return Err(refuse(
                second,
                ConfigErrorKind::Conflict,
                format!(
                    "one authentication method at a time; set: {}",
                    names.join(", ")
                ),
            ));
        }
        Ok(methods.pop().map_or(NatsAuth::None, |(_, a)| a))
    }
}

/// `nats.<field>`.
fn key(field: &str) -> String {
    format!("nats.{field}")
}

/// A refusal of `nats.<field>`.
fn refuse(field: &str, kind: ConfigErrorKind, message: impl Into<String>) -> ConfigError {
    ConfigError::new(key(field), kind, message)
}

/// A comma-separated list of server URLs, each parsed on its own (async-nats reads one
/// string as one address).
fn urls(list: &str) -> Result<Vec<String>, ConfigError> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        let why = "at least one URL is required";
        return Err(refuse("url", ConfigErrorKind::Missing, why));
    }
    for u in &urls {
        u.parse::<async_nats::ServerAddr>().map_err(|e| {
            let why = format!("{u:?} is not a NATS URL: {e}");
            refuse("url", ConfigErrorKind::Invalid, why)
        })?;
    }
    Ok(urls)
}

/// A named file that exists (unset when empty).
fn file(field: &str, path: &str) -> Result<Option<PathBuf>, ConfigError> {
    match set(path).map(Path::new) {
        None => Ok(None),
        Some(p) if p.is_file() => Ok(Some(p.to_path_buf())),
        Some(p) => Err(refuse(
            field,
            ConfigErrorKind::Invalid,
            format!("{} is not a readable file", p.display()),
        )),
    }
}

/// Two keys that go together: both or neither; one alone names the other as missing.
fn together<A, B>(
    (a_field, a): (&str, Option<A>),
    (b_field, b): (&str, Option<B>),
) -> Result<Option<(A, B)>, ConfigError> {
    let missing = |field: &str, with: &str| {
        let why = format!("required with nats.{with}");
        refuse(field, ConfigErrorKind::Missing, why)
    };
    match (a, b) {
        (Some(a), Some(b)) => Ok(Some((a, b))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(missing(b_field, a_field)),
        (None, Some(_)) => Err(missing(a_field, b_field)),
    }
}

/// An inbox prefix: a literal subject of 1..=[`MAX_INBOX_PREFIX_TOKENS`] tokens of
/// `A-Z a-z 0-9 _ -`, at most [`MAX_INBOX_PREFIX_LEN`] bytes.
fn inbox_prefix(prefix: &str) -> Result<String, ConfigError> {
    let invalid = |why: String| refuse("inbox_prefix", ConfigErrorKind::Invalid, why);
    if prefix.len() > MAX_INBOX_PREFIX_LEN {
        return Err(invalid(format!(
            "{} bytes; at most {MAX_INBOX_PREFIX_LEN}",
            prefix.len()
        )));
    }
    let tokens: Vec<&str> = prefix.split('.').collect();
    if tokens.len() > MAX_INBOX_PREFIX_TOKENS {
        return Err(invalid(format!(
            "{prefix:?} has {} tokens; at most {MAX_INBOX_PREFIX_TOKENS}",
            tokens.len()
        )));
    }
    let safe = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    if let Some(bad) = tokens.iter().find(|t| !safe(t)) {
        return Err(invalid(format!(
            "{prefix:?}: token {bad:?} is not 1 or more of A-Z a-z 0-9 _ - (a literal \
             subject such as `_INBOX.caller`, no wildcard)"
        )));
    }
    Ok(prefix.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> NatsSection {
        NatsSection::from_config(&NatsConfig::named("t"))
    }

    #[test]
    fn the_defaults_validate_to_the_config_they_came_from() {
        let base = NatsConfig::named("t");
        assert_eq!(section().validate(base.clone()), Ok(base));
    }

    #[test]
    fn refusals_name_the_qualified_key_and_the_range() {
        let e = NatsSection {
            connection_timeout_ms: 99,
            ..section()
        }
        .validate(NatsConfig::named("t"))
        .expect_err("too short");
        assert_eq!(e.key(), "nats.connection_timeout_ms");
        assert_eq!(e.allowed(), Some("100..=60000 ms"));
        let e = NatsSection {
            token: "t".into(),
            nkey: "SUAK".into(),
            ..section()
        }
        .validate(NatsConfig::named("t"))
        .expect_err("two methods");
        assert_eq!(
            (e.key(), e.kind()),
            ("nats.nkey", ConfigErrorKind::Conflict)
        );
    }

    /// The section with `edit` applied, validated against the defaults.
    fn validated(edit: impl FnOnce(&mut NatsSection)) -> Result<NatsConfig, ConfigError> {
        let mut s = section();
        edit(&mut s);
        s.validate(NatsConfig::named("t"))
    }

    /// The refused key (without `nats.`) and the kind.
    fn refused(edit: impl FnOnce(&mut NatsSection)) -> (String, ConfigErrorKind) {
        let e = validated(edit).expect_err("refused");
        (e.key().trim_start_matches("nats.").to_owned(), e.kind())
    }

    #[test]
    fn a_url_list_is_split_and_each_url_checked() {
        let c = validated(|s| s.url = " nats://h:1 , nats://h:2,".into()).expect("valid");
        assert_eq!(c.urls, ["nats://h:1", "nats://h:2"]);
        let bad_port = refused(|s| s.url = "nats://h:notaport".into());
        assert_eq!(bad_port, ("url".into(), ConfigErrorKind::Invalid));
        let commas = refused(|s| s.url = " , ".into());
        assert_eq!(commas, ("url".into(), ConfigErrorKind::Missing));
        // No URL given: the base's.
        let c = validated(|s| s.url.clear()).expect("valid");
        assert_eq!(c.urls, [crate::nats::DEFAULT_URL]);
    }

    #[test]
    fn exactly_one_authentication_method() {
        let e = validated(|s| (s.token, s.nkey) = ("t".into(), "SUAK".into()))
            .expect_err("two methods");
        assert_eq!(
            (e.key(), e.kind()),
            ("nats.nkey", ConfigErrorKind::Conflict)
        );
        assert!(e.message().contains("token, nkey"), "{e}");
        let user_alone = refused(|s| s.user = "u".into());
        assert_eq!(user_alone, ("password".into(), ConfigErrorKind::Missing));
        let public_key = refused(|s| s.nkey = "UAB".into());
        assert_eq!(public_key, ("nkey".into(), ConfigErrorKind::Invalid));
        // Empty values are absent (an unset environment variable exported empty).
        let c = validated(|s| s.token = "t".into()).expect("one method");
        assert_eq!(c.auth, NatsAuth::Token("t".into()));
    }

    #[test]
    fn files_must_exist_and_certificate_goes_with_key() {
        let missing = refused(|s| s.creds_file = "/nonexistent/weir.creds".into());
        assert_eq!(missing, ("creds_file".into(), ConfigErrorKind::Invalid));
        let file = std::env::current_exe().expect("exe");
        let path = file.display().to_string();
        let no_key = refused(|s| s.tls_cert_file = path.clone());
        assert_eq!(no_key, ("tls_key_file".into(), ConfigErrorKind::Missing));
        let c = validated(|s| {
            s.tls_required = true;
            (s.tls_cert_file, s.tls_key_file) = (path.clone(), path.clone());
        })
        .expect("valid");
        assert!(c.tls.required);
        assert_eq!(c.tls.client_cert, Some((file.clone(), file)));
    }

    #[test]
    fn the_inbox_prefix_is_a_literal_subject_of_safe_tokens() {
        let default = crate::nats::DEFAULT_INBOX_PREFIX;
        for ok in [
            "_INBOX.caller",
            "_INBOX.llm-adapter",
            "replies",
            "a.b-c.D_9",
        ] {
            let c = validated(|s| s.inbox_prefix = ok.into()).expect(ok);
            assert_eq!(c.inbox_prefix, ok);
        }
        let long = "a".repeat(MAX_INBOX_PREFIX_LEN + 1);
        let many = ["a"; MAX_INBOX_PREFIX_TOKENS + 1].join(".");
        for bad in [
            "_INBOX.>",
            "_INBOX.*",
            "_INBOX.",
            ".x",
            "a..b",
            "a b",
            "caf\u{e9}",
            "$SRV",
            &long,
            &many,
        ] {
            let e = refused(|s| s.inbox_prefix = bad.into());
            assert_eq!(
                e,
                ("inbox_prefix".into(), ConfigErrorKind::Invalid),
                "{bad}"
            );
        }
        // Empty is absent: the base's prefix stays.
        let c = validated(|s| s.inbox_prefix.clear()).expect("valid");
        assert_eq!(c.inbox_prefix, default);
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let s = NatsSection {
            user: "alice".into(),
            password: "pw-secret".into(),
            token: "tok-secret".into(),
            nkey: "SUsecret".into(),
            ..section()
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("alice"), "{shown}");
    }
}

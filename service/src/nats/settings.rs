//! The NATS connection settings both services (and the ingress's `tap`) use, validated
//! once.
//!
//! Invariants of a [`NatsConfig`] built by [`NatsInput::validate`]:
//! - at least one URL, each one a valid NATS address (a comma-separated list is split
//!   here: async-nats reads one string as one address);
//! - at most one authentication method ([`NatsAuth`]): the client would otherwise send
//!   several and the server would pick one the operator did not choose;
//! - a password goes with a user, a client key with a client certificate;
//! - every file named (credentials, CA, certificate, key) exists when validated;
//! - the inbox prefix is a literal subject of 1..=[`MAX_INBOX_PREFIX_TOKENS`] tokens of
//!   `A-Z a-z 0-9 _ -` (no wildcard, no empty token, at most [`MAX_INBOX_PREFIX_LEN`]
//!   bytes): every reply subject the client makes starts with it, and server
//!   permissions (`_INBOX.caller.>`) are written against it;
//! - `Debug` never prints a password, token or NKey seed (configuration is logged and
//!   printed in errors).
//!
//! The loaders (the ingress's flat `nats_*` keys, the adapter's `[nats]` table, the
//! tap's flags) read the values and their ranges; [`FieldError::field`] names the key's
//! last part (`user`, `tls_key_file`) for them to qualify.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the client authenticates (at most one method).
#[derive(Clone, PartialEq, Eq, Default)]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// User and password.
    UserPassword {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An NKey seed (`SU...`).
    NKey(String),
    /// A `.creds` file (JWT + seed).
    CredsFile(PathBuf),
}

impl fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user:?}, <redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::NKey(_) => f.write_str("NKey(<redacted>)"),
            Self::CredsFile(p) => write!(f, "CredsFile({p:?})"),
        }
    }
}

/// TLS towards the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatsTls {
    /// Require TLS even if the server does not ask for it.
    pub required: bool,
    /// Extra root CA file, PEM.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key, PEM.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The validated connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs, tried in turn.
    pub urls: Vec<String>,
    /// Client name shown by the server.
    pub name: String,
    /// Authentication.
    pub auth: NatsAuth,
    /// TLS.
    pub tls: NatsTls,
    /// Timeout of one connection attempt.
    pub connection_timeout: Duration,
    /// PING interval; a dead server is noticed after 2–3 of these.
    pub ping_interval: Duration,
    /// async-nats command channel capacity: messages the client buffers while the
    /// server is slow or gone before `publish` blocks.
    pub client_capacity: usize,
    /// Messages buffered per subscription before the client drops them (slow
    /// consumer); `None`: the async-nats default (65,536).
    pub subscription_capacity: Option<usize>,
    /// Start even when no server answers yet and keep trying in the background (the
    /// service reports not-ready until connected); `false`: the first connection must
    /// succeed.
    pub retry_initial_connect: bool,
    /// Prefix of every inbox (reply subject) the client makes: `<prefix>.<unique>`.
    /// One prefix per NATS user lets the server allow each user only its own replies
    /// (deploy/nats-server.conf). Default [`DEFAULT_INBOX_PREFIX`].
    pub inbox_prefix: String,
}

/// The inbox prefix of every NATS client unless configured.
pub const DEFAULT_INBOX_PREFIX: &str = "_INBOX";

/// Longest inbox prefix accepted, in bytes.
pub const MAX_INBOX_PREFIX_LEN: usize = 128;

/// Most tokens an inbox prefix may have.
pub const MAX_INBOX_PREFIX_TOKENS: usize = 8;

/// Checks an inbox prefix (see the module invariants).
pub fn parse_inbox_prefix(prefix: &str) -> Result<String, FieldError> {
    let invalid = |why: String| FieldError::new("inbox_prefix", FieldErrorKind::Invalid, why);
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

/// The default server.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

impl NatsConfig {
    /// The defaults both services share, under the client name `name`: the local
    /// server, connect timeout and ping interval 2 s (a hung node costs seconds, not
    /// the 20–30 s of async-nats's defaults), 1,024 buffered commands, and the first
    /// connection retried in the background.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            urls: vec![DEFAULT_URL.to_owned()],
            name: name.into(),
            auth: NatsAuth::None,
            tls: NatsTls::default(),
            connection_timeout: Duration::from_secs(2),
            ping_interval: Duration::from_secs(2),
            client_capacity: 1024,
            subscription_capacity: None,
            retry_initial_connect: true,
            inbox_prefix: DEFAULT_INBOX_PREFIX.to_owned(),
        }
    }

    /// Settings for tests and local tools: `url`, short timeouts (connect 500 ms,
    /// ping 1 s), and the first connection must succeed.
    pub fn for_url(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            connection_timeout: Duration::from_millis(500),
            ping_interval: Duration::from_secs(1),
            retry_initial_connect: false,
            ..Self::named(name)
        }
    }

    /// The URLs as one comma-separated string, for messages.
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }
}

/// The connection keys as a loader read them, before validation. Absent keys are
/// `None`; empty strings count as absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct NatsInput<'a> {
    /// Comma-separated URLs (`None`: keep the base's).
    pub url: Option<&'a str>,
    /// User (with `password`).
    pub user: Option<&'a str>,
    /// Password (with `user`).
    pub password: Option<&'a str>,
    /// Token.
    pub token: Option<&'a str>,
    /// NKey seed.
    pub nkey: Option<&'a str>,
    /// Credentials file.
    pub creds_file: Option<&'a Path>,
    /// Require TLS.
    pub tls_required: bool,
    /// Extra root CA file.
    pub tls_ca_file: Option<&'a Path>,
    /// Client certificate (with `tls_key_file`).
    pub tls_cert_file: Option<&'a Path>,
    /// Client key (with `tls_cert_file`).
    pub tls_key_file: Option<&'a Path>,
    /// Inbox prefix (`None`: keep the base's).
    pub inbox_prefix: Option<&'a str>,
}

/// Why a connection key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// A key required by another is missing (a password without a user).
    Missing,
    /// A value is malformed: not a NATS URL, not an NKey seed, not a file.
    Invalid,
    /// Two keys exclude each other (two authentication methods).
    Conflict,
}

/// A refused connection key: `field` is the key's last part (`url`, `password`), for
/// the loader to qualify (`nats_password`, `nats.password`, `--password`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The refused key's last part.
    pub field: &'static str,
    /// Why.
    pub kind: FieldErrorKind,
    /// For humans.
    pub message: String,
}

impl FieldError {
    fn new(field: &'static str, kind: FieldErrorKind, message: impl Into<String>) -> Self {
        Self {
            field,
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

fn present<T: AsRef<str> + ?Sized>(v: Option<&T>) -> Option<&T> {
    v.filter(|s| !s.as_ref().is_empty())
}

fn present_path(v: Option<&Path>) -> Option<&Path> {
    v.filter(|p| !p.as_os_str().is_empty())
}

fn existing(field: &'static str, path: Option<&Path>) -> Result<Option<PathBuf>, FieldError> {
    match present_path(path) {
        None => Ok(None),
        Some(p) if p.is_file() => Ok(Some(p.to_path_buf())),
        Some(p) => Err(FieldError::new(
            field,
            FieldErrorKind::Invalid,
            format!("{} is not a readable file", p.display()),
        )),
    }
}

/// Two keys that go together: both or neither; one alone names the other as missing.
fn together<A, B>(
    (a_field, a): (&'static str, Option<A>),
    (b_field, b): (&'static str, Option<B>),
) -> Result<Option<(A, B)>, FieldError> {
    let missing = |field: &'static str, with: &str| {
        FieldError::new(
            field,
            FieldErrorKind::Missing,
            format!("required with {with}"),
        )
    };
    match (a, b) {
        (Some(a), Some(b)) => Ok(Some((a, b))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(missing(b_field, a_field)),
        (None, Some(_)) => Err(missing(a_field, b_field)),
    }
}

/// Splits a comma-separated list and checks each URL.
pub fn parse_urls(list: &str) -> Result<Vec<String>, FieldError> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(FieldError::new(
            "url",
            FieldErrorKind::Missing,
            "at least one URL is required",
        ));
    }
    for u in &urls {
        u.parse::<async_nats::ServerAddr>().map_err(|e| {
            FieldError::new(
                "url",
                FieldErrorKind::Invalid,
                format!("{u:?} is not a NATS URL: {e}"),
            )
        })?;
    }
    Ok(urls)
}

impl NatsInput<'_> {
    /// `base` with the URLs, authentication, TLS and inbox prefix of this input,
    /// validated (see the module invariants); `base` keeps its name, timeouts and
    /// capacities.
    pub fn validate(&self, base: NatsConfig) -> Result<NatsConfig, FieldError> {
        let urls = match present(self.url) {
            Some(list) => parse_urls(list)?,
            None => base.urls,
        };
        let auth = self.auth()?;
        let client_cert = together(
            (
                "tls_cert_file",
                existing("tls_cert_file", self.tls_cert_file)?,
            ),
            ("tls_key_file", existing("tls_key_file", self.tls_key_file)?),
        )?;
        let tls = NatsTls {
            required: self.tls_required,
            ca_file: existing("tls_ca_file", self.tls_ca_file)?,
            client_cert,
        };
        let inbox_prefix = match present(self.inbox_prefix) {
            Some(p) => parse_inbox_prefix(p)?,
            None => base.inbox_prefix,
        };
        Ok(NatsConfig {
            urls,
            auth,
            tls,
            inbox_prefix,
            ..base
        })
    }

    fn auth(&self) -> Result<NatsAuth, FieldError> {
        let mut methods: Vec<(&'static str, NatsAuth)> = Vec::new();
        if let Some((user, password)) = together(
            ("user", present(self.user)),
            ("password", present(self.password)),
        )? {
            methods.push((
                "user",
                NatsAuth::UserPassword {
                    user: user.to_owned(),
                    password: password.to_owned(),
                },
            ));
        }
        if let Some(t) = present(self.token) {
            methods.push(("token", NatsAuth::Token(t.to_owned())));
        }
        if let Some(seed) = present(self.nkey) {
            if !seed.starts_with("SU") {
                return Err(FieldError::new(
                    "nkey",
                    FieldErrorKind::Invalid,
                    "expected a user NKey seed (starting with SU)",
                ));
            }
            methods.push(("nkey", NatsAuth::NKey(seed.to_owned())));
        }
        if let Some(path) = existing("creds_file", self.creds_file)? {
            methods.push(("creds_file", NatsAuth::CredsFile(path)));
        }
        if methods.len() > 1 {
            let names: Vec<&str> = methods.iter().map(|(k, _)| *k).collect();
            return Err(FieldError::new(
                methods[1].0,
                FieldErrorKind::Conflict,
                format!(
                    "one authentication method at a time; set: {}",
                    names.join(", ")
                ),
            ));
        }
        Ok(methods.pop().map_or(NatsAuth::None, |(_, a)| a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> NatsConfig {
        NatsConfig::named("t")
    }

    #[test]
    fn a_url_list_is_split_and_each_url_checked() {
        let c = NatsInput {
            url: Some(" nats://h:1 , nats://h:2,"),
            ..NatsInput::default()
        }
        .validate(base())
        .expect("valid");
        assert_eq!(c.urls, ["nats://h:1", "nats://h:2"]);
        let e = parse_urls("nats://h:notaport").expect_err("bad port");
        assert_eq!((e.field, e.kind), ("url", FieldErrorKind::Invalid));
        let e = parse_urls(" , ").expect_err("empty");
        assert_eq!(e.kind, FieldErrorKind::Missing);
        // No URL given: the base's.
        let c = NatsInput::default().validate(base()).expect("valid");
        assert_eq!(c.urls, [DEFAULT_URL]);
    }

    #[test]
    fn exactly_one_authentication_method() {
        let e = NatsInput {
            token: Some("t"),
            nkey: Some("SUAK"),
            ..NatsInput::default()
        }
        .validate(base())
        .expect_err("two methods");
        assert_eq!((e.field, e.kind), ("nkey", FieldErrorKind::Conflict));
        assert!(e.message.contains("token, nkey"), "{e}");
        let e = NatsInput {
            user: Some("u"),
            ..NatsInput::default()
        }
        .validate(base())
        .expect_err("user alone");
        assert_eq!((e.field, e.kind), ("password", FieldErrorKind::Missing));
        let e = NatsInput {
            nkey: Some("UAB"),
            ..NatsInput::default()
        }
        .validate(base())
        .expect_err("a public key is not a seed");
        assert_eq!(e.field, "nkey");
        // Empty values are absent (an unset environment variable exported empty).
        let c = NatsInput {
            user: Some(""),
            token: Some("t"),
            ..NatsInput::default()
        }
        .validate(base())
        .expect("one method");
        assert_eq!(c.auth, NatsAuth::Token("t".into()));
    }

    #[test]
    fn files_must_exist_and_certificate_goes_with_key() {
        let missing = Path::new("/nonexistent/weir.creds");
        let e = NatsInput {
            creds_file: Some(missing),
            ..NatsInput::default()
        }
        .validate(base())
        .expect_err("missing file");
        assert_eq!((e.field, e.kind), ("creds_file", FieldErrorKind::Invalid));
        let file = std::env::current_exe().expect("exe");
        let e = NatsInput {
            tls_cert_file: Some(&file),
            ..NatsInput::default()
        }
        .validate(base())
        .expect_err("no key");
        assert_eq!(e.field, "tls_key_file");
        let c = NatsInput {
            tls_required: true,
            tls_cert_file: Some(&file),
            tls_key_file: Some(&file),
            ..NatsInput::default()
        }
        .validate(base())
        .expect("valid");
        assert!(c.tls.required);
        assert_eq!(c.tls.client_cert, Some((file.clone(), file)));
    }

    #[test]
    fn the_inbox_prefix_is_a_literal_subject_of_safe_tokens() {
        let c = NatsInput::default().validate(base()).expect("valid");
        assert_eq!(c.inbox_prefix, DEFAULT_INBOX_PREFIX);
        for ok in [
            "_INBOX.caller",
            "_INBOX.llm-adapter",
            "replies",
            "a.b-c.D_9",
        ] {
            let c = NatsInput {
                inbox_prefix: Some(ok),
                ..NatsInput::default()
            }
            .validate(base())
            .expect(ok);
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
            long.as_str(),
            many.as_str(),
        ] {
            let e = NatsInput {
                inbox_prefix: Some(bad),
                ..NatsInput::default()
            }
            .validate(base())
            .expect_err(bad);
            assert_eq!((e.field, e.kind), ("inbox_prefix", FieldErrorKind::Invalid));
        }
        // Empty is absent: the base's prefix stays.
        let c = NatsInput {
            inbox_prefix: Some(""),
            ..NatsInput::default()
        }
        .validate(base())
        .expect("valid");
        assert_eq!(c.inbox_prefix, DEFAULT_INBOX_PREFIX);
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        for auth in [
            NatsAuth::UserPassword {
                user: "alice".into(),
                password: "hunter2-secret".into(),
            },
            NatsAuth::Token("tok-secret".into()),
            NatsAuth::NKey("SUAKSEEDsecret".into()),
        ] {
            let c = NatsConfig { auth, ..base() };
            let shown = format!("{c:?}");
            assert!(!shown.contains("secret"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
        }
    }
}

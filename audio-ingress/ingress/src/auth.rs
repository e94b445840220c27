//! Producer authentication (optional, `auth_required = true`): a signed token (JWT,
//! HS256 with a shared secret or EdDSA with an Ed25519 public key) checked before the
//! WebSocket upgrade. The token comes in `Authorization: Bearer <token>` or, for
//! browsers, the query parameter `access_token` (the header wins); its claims (`exp`,
//! `nbf`, exactly one of `stream` and `stream_prefix`, `max_rate`) and the answers (no
//! token or a bad one: 401 `unauthorized`; out of scope: 403 `forbidden`) are
//! docs/audio-ingress.md § Producer authentication. Nothing is opened for a refused
//! request.
//!
//! Invariants: the secret and the tokens are never logged nor shown by `Debug`; only
//! the configured algorithm is accepted (a token cannot choose `none` or switch from
//! EdDSA to HS256); every check is synchronous and bounded (no network, no clock but
//! the system's for `exp` and `nbf`).

use std::fmt;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Shortest HS256 secret accepted: 32 bytes (the hash size; RFC 7518 §3.2).
pub const MIN_HS256_SECRET_BYTES: usize = 32;

/// The verification key of the configuration.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthKey {
    /// `auth_hs256_secret`.
    Hs256(Vec<u8>),
    /// `auth_eddsa_public_key`: the 32-byte Ed25519 public key.
    EdDsa([u8; 32]),
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        match self {
            Self::Hs256(_) => f.write_str("Hs256(<redacted>)"),
            Self::EdDsa(_) => f.write_str("EdDsa(<public key>)"),
        }
    }
}

/// Validated authentication settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// The key.
    pub key: AuthKey,
    /// Clock skew allowed on `exp` and `nbf`, seconds (`auth_leeway_s`).
    pub leeway_s: u64,
}

/// The token's claims.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// The one stream id allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// The prefix of the stream ids allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_prefix: Option<String>,
    /// Rate class: this stream's `max_rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate: Option<f64>,
}

/// What a valid token grants for the stream it was checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The token's `max_rate`, in thousandths of real time, if it has one.
    pub max_rate_permille: Option<u32>,
    /// A digest of the token's scope (`stream` or `stream_prefix`): a stream's resume
    /// token is bound to it, so only a producer token of the same scope resumes it (a
    /// refreshed token does; another tenant's, or an expired one, does not).
    pub scope: [u8; 8],
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token in the header nor the query.
    #[error("a producer token is required (Authorization: Bearer, or ?access_token=)")]
    Missing,
    /// The token does not verify or its claims are malformed.
    #[error("invalid producer token: {0}")]
    Invalid(String),
    /// The token is valid but does not cover this stream.
    #[error("the producer token does not cover stream {0:?}")]
    OutOfScope(String),
}

impl AuthError {
    /// The metric label and JSON error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing | Self::Invalid(_) => "unauthorized",
            Self::OutOfScope(_) => "forbidden",
        }
    }
}

/// Why a key cannot check or mint tokens.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The build has no JWT crypto provider.
    #[error("no JWT crypto provider compiled in")]
    NoCryptoProvider,
    /// The key was refused, or a token could not be encoded with it.
    #[error("{0}")]
    Jwt(#[from] jsonwebtoken::errors::Error),
}

/// `Err` when no JWT crypto provider is compiled in.
fn crypto_provider() -> Result<(), KeyError> {
    match jsonwebtoken::crypto::CryptoProvider::try_get_default() {
        Some(_) => Ok(()),
        None => Err(KeyError::NoCryptoProvider),
    }
}

/// A token's `max_rate` in thousandths of real time; `None` outside 1.0..=1000.
pub fn max_rate_permille(max_rate: f64) -> Option<u32> {
    (max_rate.is_finite() && (1.0..=1000.0).contains(&max_rate))
        .then(|| (max_rate * 1000.0).round() as u32)
}

/// Checks producer tokens.
pub struct Authenticator {
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// The authenticator of a validated configuration.
    pub fn new(config: &AuthConfig) -> Result<Self, KeyError> {
        crypto_provider()?;
        let (key, alg) = match &config.key {
            AuthKey::Hs256(secret) => (DecodingKey::from_secret(secret)?, Algorithm::HS256),
            AuthKey::EdDsa(public) => (
                DecodingKey::from_ed_components(&b64url(public))?,
                Algorithm::EdDSA,
            ),
        };
        let mut validation = Validation::new(alg);
        validation.leeway = config.leeway_s;
        // jsonwebtoken checks `nbf` only when asked: a token minted for later must not
        // open a stream now (same leeway as `exp`; a malformed `nbf` is refused).
        validation.validate_nbf = true;
        validation.validate_aud = false;
        Ok(Self { key, validation })
    }

    /// Checks `token` (`None`: none was sent) for `stream_id`.
    pub fn check(&self, token: Option<&str>, stream_id: &str) -> Result<Grant, AuthError> {
        let token = token.ok_or(AuthError::Missing)?;
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| AuthError::Invalid(e.to_string()))?;
        let c = data.claims;
        let covered = match (&c.stream, &c.stream_prefix) {
            (Some(id), None) => id == stream_id,
            (None, Some(prefix)) if !prefix.is_empty() => stream_id.starts_with(prefix.as_str()),
            _ => {
                return Err(AuthError::Invalid(
                    "exactly one of `stream` and a non-empty `stream_prefix` is required".into(),
                ));
            }
        };
        let max_rate_permille = match c.max_rate.map(max_rate_permille) {
            Some(None) => {
                return Err(AuthError::Invalid(
                    "`max_rate` must be a number in 1.0..=1000".into(),
                ));
            }
            checked => checked.flatten(),
        };
        if !covered {
            return Err(AuthError::OutOfScope(stream_id.to_owned()));
        }
        let scope = match (&c.stream, &c.stream_prefix) {
            (Some(id), _) => crate::resume::token::digest8(&[b"stream", id.as_bytes()]),
            (None, Some(p)) => crate::resume::token::digest8(&[b"stream_prefix", p.as_bytes()]),
            (None, None) => [0; 8],
        };
        Ok(Grant {
            max_rate_permille,
            scope,
        })
    }
}

/// The token of a request: `Authorization: Bearer <t>` first, else `access_token`.
pub fn token_of<'a>(authorization: Option<&'a str>, query: Option<&'a str>) -> Option<&'a str> {
    authorization
        .and_then(|h| {
            let (scheme, rest) = h.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty())
        .or(query)
}

/// Signing material for [`mint`].
pub enum SigningKey<'a> {
    /// HS256 with this secret.
    Hs256(&'a [u8]),
    /// EdDSA with this 32-byte Ed25519 seed (private key).
    EdDsa(&'a [u8; 32]),
}

/// Mints a token (the `audio-ingress token` subcommand and tests): `claims` is
/// usually [`Claims`]; tests pass other JSON to probe the checks.
pub fn mint<C: Serialize>(key: SigningKey<'_>, claims: &C) -> Result<String, KeyError> {
    crypto_provider()?;
    let (key, alg) = match key {
        SigningKey::Hs256(secret) => (EncodingKey::from_secret(secret)?, Algorithm::HS256),
        SigningKey::EdDsa(seed) => {
            // PKCS#8 v1 wrapping of an Ed25519 seed (RFC 8410): a fixed 16-byte prefix.
            let mut der = ED25519_PKCS8_PREFIX.to_vec();
            der.extend_from_slice(seed);
            (EncodingKey::from_ed_der(&der), Algorithm::EdDSA)
        }
    };
    Ok(jsonwebtoken::encode(&Header::new(alg), claims, &key)?)
}

const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Base64url without padding (the JWT alphabet).
pub fn b64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url (padding optional).
pub fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim().trim_end_matches('='))
        .ok()
}

/// The Ed25519 public key of a 32-byte seed (for `audio-ingress token`: what to put in
/// `auth_eddsa_public_key`).
pub fn ed25519_public_key(seed: &[u8; 32]) -> [u8; 32] {
    ed25519_dalek::SigningKey::from_bytes(seed)
        .verifying_key()
        .to_bytes()
}

/// Seconds since the Unix epoch (for minting).
pub fn unix_now_s() -> u64 {
    weir_service::clock::unix_ms_now() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hs() -> Authenticator {
        Authenticator::new(&AuthConfig {
            key: AuthKey::Hs256(SECRET.to_vec()),
            leeway_s: 0,
        })
        .expect("authenticator")
    }

    fn claims(stream: Option<&str>, prefix: Option<&str>, exp_in: i64) -> Claims {
        Claims {
            exp: (unix_now_s() as i64 + exp_in) as u64,
            stream: stream.map(str::to_owned),
            stream_prefix: prefix.map(str::to_owned),
            max_rate: None,
        }
    }

    fn hs_token(c: &Claims) -> String {
        mint(SigningKey::Hs256(SECRET), c).expect("mint")
    }

    #[test]
    fn scope_exact_and_prefix() {
        let a = hs();
        let t = hs_token(&claims(Some("call-1"), None, 60));
        assert!(a.check(Some(&t), "call-1").is_ok());
        assert_eq!(
            a.check(Some(&t), "call-2"),
            Err(AuthError::OutOfScope("call-2".into()))
        );
        let t = hs_token(&claims(None, Some("tenant-a."), 60));
        // Dots are not allowed in stream ids; a prefix is any string prefix.
        let t2 = hs_token(&claims(None, Some("tenant-a-"), 60));
        assert!(a.check(Some(&t2), "tenant-a-7").is_ok());
        assert_eq!(
            a.check(Some(&t2), "tenant-b-7").map_err(|e| e.code()),
            Err("forbidden")
        );
        assert!(a.check(Some(&t), "tenant-a-7").is_err());
    }

    #[test]
    fn missing_expired_forged_and_malformed_are_unauthorized() {
        let a = hs();
        assert_eq!(a.check(None, "s"), Err(AuthError::Missing));
        let expired = hs_token(&claims(Some("s"), None, -120));
        assert_eq!(
            a.check(Some(&expired), "s").map_err(|e| e.code()),
            Err("unauthorized")
        );
        let other = mint(
            SigningKey::Hs256(b"another secret, also 32 bytes long!"),
            &claims(Some("s"), None, 60),
        )
        .expect("mint");
        assert!(matches!(
            a.check(Some(&other), "s"),
            Err(AuthError::Invalid(_))
        ));
        for junk in ["", "a.b.c", "not a token", "....", "eyJ.eyJ.x"] {
            assert!(
                matches!(a.check(Some(junk), "s"), Err(AuthError::Invalid(_))),
                "{junk}"
            );
        }
        let both = hs_token(&claims(Some("s"), Some("s"), 60));
        assert!(matches!(
            a.check(Some(&both), "s"),
            Err(AuthError::Invalid(_))
        ));
        let neither = hs_token(&claims(None, None, 60));
        assert!(matches!(
            a.check(Some(&neither), "s"),
            Err(AuthError::Invalid(_))
        ));
        let empty_prefix = hs_token(&claims(None, Some(""), 60));
        assert!(matches!(
            a.check(Some(&empty_prefix), "s"),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn a_token_is_refused_before_its_nbf_beyond_the_leeway() {
        let a = Authenticator::new(&AuthConfig {
            key: AuthKey::Hs256(SECRET.to_vec()),
            leeway_s: 5,
        })
        .expect("authenticator");
        let now = unix_now_s();
        let with_nbf = |nbf: serde_json::Value| {
            let c = serde_json::json!({"exp": now + 7200, "stream": "s", "nbf": nbf});
            mint(SigningKey::Hs256(SECRET), &c).expect("mint")
        };
        for (nbf, ok) in [
            (serde_json::json!(now + 3600), false),
            (serde_json::json!(now + 60), false),
            (serde_json::json!("tomorrow"), false),
            (serde_json::json!(now + 5), true),
            (serde_json::json!(now), true),
            (serde_json::json!(now - 3600), true),
        ] {
            let r = a.check(Some(&with_nbf(nbf.clone())), "s");
            assert_eq!(r.is_ok(), ok, "nbf {nbf}: {r:?}");
            if !ok {
                assert_eq!(r.map_err(|e| e.code()), Err("unauthorized"), "nbf {nbf}");
            }
        }
    }

    #[test]
    fn an_unsigned_or_other_algorithm_token_is_refused() {
        let a = hs();
        // alg "none": header {"alg":"none"}, no signature.
        let none = format!(
            "{}.{}.",
            b64url(br#"{"alg":"none","typ":"JWT"}"#),
            b64url(format!(r#"{{"exp":{},"stream":"s"}}"#, unix_now_s() + 60).as_bytes())
        );
        assert!(matches!(
            a.check(Some(&none), "s"),
            Err(AuthError::Invalid(_))
        ));
        // EdDSA-signed token against an HS256 configuration.
        let seed = [7u8; 32];
        let ed = mint(SigningKey::EdDsa(&seed), &claims(Some("s"), None, 60)).expect("mint");
        assert!(matches!(
            a.check(Some(&ed), "s"),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn eddsa_tokens_verify_with_the_public_key_only() {
        let seed = [42u8; 32];
        let a = Authenticator::new(&AuthConfig {
            key: AuthKey::EdDsa(ed25519_public_key(&seed)),
            leeway_s: 0,
        })
        .expect("authenticator");
        let t = mint(SigningKey::EdDsa(&seed), &claims(None, Some("p-"), 60)).expect("mint");
        assert!(a.check(Some(&t), "p-1").is_ok());
        let other = mint(
            SigningKey::EdDsa(&[43u8; 32]),
            &claims(None, Some("p-"), 60),
        )
        .expect("mint");
        assert!(matches!(
            a.check(Some(&other), "p-1"),
            Err(AuthError::Invalid(_))
        ));
        // An HS256 token signed with the public key as the secret (key confusion).
        let confused = mint(
            SigningKey::Hs256(&ed25519_public_key(&seed)),
            &claims(None, Some("p-"), 60),
        )
        .expect("mint");
        assert!(matches!(
            a.check(Some(&confused), "p-1"),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn rate_class_is_carried_and_bounded() {
        let a = hs();
        let mut c = claims(Some("s"), None, 60);
        c.max_rate = Some(1.2);
        let g = a.check(Some(&hs_token(&c)), "s").expect("valid");
        assert_eq!(g.max_rate_permille, Some(1200));
        c.max_rate = Some(0.5);
        assert!(matches!(
            a.check(Some(&hs_token(&c)), "s"),
            Err(AuthError::Invalid(_))
        ));
    }

    #[test]
    fn token_from_header_first_then_query() {
        assert_eq!(token_of(Some("Bearer abc"), Some("q")), Some("abc"));
        assert_eq!(token_of(Some("bearer  abc "), None), Some("abc"));
        assert_eq!(token_of(Some("Basic abc"), Some("q")), Some("q"));
        assert_eq!(token_of(None, Some("q")), Some("q"));
        assert_eq!(token_of(Some("Bearer "), None), None);
        assert_eq!(token_of(None, None), None);
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let c = AuthConfig {
            key: AuthKey::Hs256(SECRET.to_vec()),
            leeway_s: 5,
        };
        let shown = format!("{c:?} {:?}", hs());
        assert!(!shown.contains("0123456789"), "{shown}");
    }
}

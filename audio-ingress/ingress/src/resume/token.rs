//! Resume tokens: opaque to the producer, checked without a lookup.
//!
//! A token is `base64url(instance ‖ scope ‖ id_hash ‖ mac)` (8 + 8 + 8 + 16 bytes, 54
//! characters): `instance` names the stream instance (random), `scope` binds it to the
//! producer token's scope (zero when authentication is off), `id_hash` to the stream
//! id, and `mac` is HMAC-SHA256 over the first three under a key drawn when the
//! process starts, cut to 16 bytes.
//!
//! Invariants: a token this process did not mint fails [`Minter::open`] (a forged one,
//! or one from before a restart: the key is gone); a token of another stream still
//! verifies, so the refusal can say so ([`Opened::id_matches`]); nothing here panics on
//! input, whatever its length or alphabet.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

const INSTANCE: usize = 8;
const SCOPE: usize = 8;
const ID_HASH: usize = 8;
const MAC: usize = 16;
const BODY: usize = INSTANCE + SCOPE + ID_HASH;
const TOKEN_BYTES: usize = BODY + MAC;
/// Characters of a token: 40 bytes in unpadded base64url.
const TOKEN_CHARS: usize = 54;

/// The first 8 bytes of SHA-256 of `parts`, each length-prefixed.
pub fn digest8(parts: &[&[u8]]) -> [u8; 8] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    let full = h.finalize();
    full[..8].try_into().unwrap_or_default()
}

/// Mints and opens the tokens of one process.
pub struct Minter {
    key: [u8; 32],
}

impl std::fmt::Debug for Minter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.write_str("Minter(<key>)")
    }
}

/// What a token says, once its MAC verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The stream instance.
    pub instance: u64,
    /// The producer token's scope it is bound to.
    pub scope: [u8; 8],
    id_hash: [u8; 8],
}

impl Opened {
    /// Whether the token was minted for stream `id`.
    pub fn id_matches(&self, id: &str) -> bool {
        self.id_hash == digest8(&[id.as_bytes()])
    }
}

impl Minter {
    /// A minter with a fresh random key; `None` when the OS has no randomness.
    pub fn new() -> Option<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).ok()?;
        Some(Self { key })
    }

    /// A minter with a fixed key (tests).
    pub fn with_key(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// The HMAC of `body` (its first [`MAC`] bytes are the token's tag).
    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes a key of any length; 32 bytes cannot fail.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        m.update(b"weir-resume-v1");
        m.update(body);
        m
    }

    /// The token of stream instance `instance` of stream `id`, bound to `scope`.
    pub fn mint(&self, id: &str, instance: u64, scope: [u8; 8]) -> String {
        let mut bytes = [0u8; TOKEN_BYTES];
        bytes[..INSTANCE].copy_from_slice(&instance.to_be_bytes());
        bytes[INSTANCE..INSTANCE + SCOPE].copy_from_slice(&scope);
        bytes[INSTANCE + SCOPE..BODY].copy_from_slice(&digest8(&[id.as_bytes()]));
        let mac = self.mac(&bytes[..BODY]).finalize().into_bytes();
        bytes[BODY..].copy_from_slice(&mac[..MAC]);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Verifies `token`: `None` unless this minter made it.
    pub fn open(&self, token: &str) -> Option<Opened> {
        // Anything of another length is refused before decoding.
        if token.len() != TOKEN_CHARS {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(token).ok()?;
        let bytes: [u8; TOKEN_BYTES] = bytes.try_into().ok()?;
        // Constant time: a forger learns nothing from how long the refusal took.
        self.mac(&bytes[..BODY])
            .verify_truncated_left(&bytes[BODY..])
            .ok()?;
        Some(Opened {
            instance: u64::from_be_bytes(bytes[..INSTANCE].try_into().ok()?),
            scope: bytes[INSTANCE..INSTANCE + SCOPE].try_into().ok()?,
            id_hash: bytes[INSTANCE + SCOPE..BODY].try_into().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_opens_for_its_stream_only() {
        let m = Minter::with_key([7; 32]);
        let t = m.mint("call-1", 42, [1; 8]);
        assert_eq!(t.len(), TOKEN_CHARS);
        let o = m.open(&t).expect("opens");
        assert_eq!((o.instance, o.scope), (42, [1; 8]));
        assert!(o.id_matches("call-1"));
        assert!(!o.id_matches("call-2"));
    }

    #[test]
    fn forged_tampered_and_foreign_tokens_do_not_open() {
        let m = Minter::with_key([7; 32]);
        let t = m.mint("call-1", 42, [0; 8]);
        // Another process's key (e.g. before a restart).
        assert!(Minter::with_key([8; 32]).open(&t).is_none());
        // Any one character changed.
        for i in 0..t.len() {
            let mut b = t.clone().into_bytes();
            b[i] = if b[i] == b'A' { b'B' } else { b'A' };
            let s = String::from_utf8(b).expect("ascii");
            assert!(m.open(&s).is_none() || s == t, "position {i}");
        }
        for bad in [
            "",
            "x",
            "é",
            &"A".repeat(54),
            &"A".repeat(4096),
            &t[..53],
            "!!!!",
        ] {
            assert!(m.open(bad).is_none(), "{bad:?}");
        }
    }
}

//! The query string of the WebSocket upgrade request, parsed strictly: each parameter
//! is percent-decoded to bytes and must then be valid UTF-8 (a `%ff` is refused, not
//! turned into U+FFFD), and a parameter weir reads may be given at most once.
//!
//! Pure: no I/O. Unknown parameters are ignored (a browser client may add its own).

/// The parameters weir reads from the upgrade request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeQuery {
    /// `session_id` (empty counts as absent).
    pub session_id: Option<String>,
    /// `access_token`: a producer token for browsers, which cannot set headers.
    pub access_token: Option<String>,
    /// `resume_token`: the token of a stream this request resumes ([`crate::resume`]).
    pub resume_token: Option<String>,
    /// `last_seq`: the last seq the producer knows the door took (a resume).
    pub last_seq: Option<u64>,
    /// `next_seq`: the seq of the producer's next frame (a resume).
    pub next_seq: Option<u64>,
}

/// Why a query string was refused (the message names the parameter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct QueryError(pub String);

impl UpgradeQuery {
    /// Parses `raw` (the part after `?`, if any).
    pub fn parse(raw: Option<&str>) -> Result<Self, QueryError> {
        let mut q = Self::default();
        let Some(raw) = raw else {
            return Ok(q);
        };
        let mut seen = [false; 5];
        let (mut last_seq, mut next_seq) = (None, None);
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(k).map_err(|e| QueryError(format!("a parameter name {e}")))?;
            let (i, slot) = match key.as_str() {
                "session_id" => (0, &mut q.session_id),
                "access_token" => (1, &mut q.access_token),
                "resume_token" => (2, &mut q.resume_token),
                "last_seq" => (3, &mut last_seq),
                "next_seq" => (4, &mut next_seq),
                _ => continue,
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(QueryError(format!("{key} is given more than once")));
            }
            let value = decode(v).map_err(|e| QueryError(format!("{key} {e}")))?;
            if !value.is_empty() {
                *slot = Some(value);
            }
        }
        q.last_seq = seq_param("last_seq", last_seq)?;
        q.next_seq = seq_param("next_seq", next_seq)?;
        Ok(q)
    }
}

/// A sequence-number parameter: a decimal integer (at most 2^53, what a JSON number
/// in a browser holds exactly).
fn seq_param(key: &str, value: Option<String>) -> Result<Option<u64>, QueryError> {
    const MAX: u64 = 1 << 53;
    value
        .map(|v| {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n <= MAX && v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| QueryError(format!("{key} must be an integer in 0..={MAX}")))
        })
        .transpose()
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space) to bytes, then UTF-8.
fn decode(s: &str) -> Result<String, &'static str> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3).ok_or("has a truncated %-escape")?;
                let digit = |c: u8| char::from(c).to_digit(16).ok_or("has a malformed %-escape");
                out.push((digit(hex[0])? << 4 | digit(hex[1])?) as u8);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "is not valid UTF-8 once percent-decoded")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(raw: &str) -> Result<Option<String>, QueryError> {
        UpgradeQuery::parse(Some(raw)).map(|q| q.session_id)
    }

    #[test]
    fn decodes_percent_and_plus() {
        assert_eq!(
            session("session_id=a%20b+c").expect("ok").as_deref(),
            Some("a b c")
        );
        assert_eq!(
            session("session_id=s%C3%A9").expect("ok").as_deref(),
            Some("sé")
        );
        assert_eq!(
            session("x=1&session_id=s").expect("ok").as_deref(),
            Some("s")
        );
        assert_eq!(session("session_id=").expect("ok"), None);
        assert_eq!(
            UpgradeQuery::parse(None).expect("ok"),
            UpgradeQuery::default()
        );
    }

    #[test]
    fn invalid_utf8_is_refused_not_replaced() {
        let e = session("session_id=%ff").expect_err("refused");
        assert!(e.0.contains("session_id") && e.0.contains("UTF-8"), "{e}");
        assert!(session("session_id=%ff%fe").is_err());
    }

    #[test]
    fn a_duplicate_is_refused() {
        let e = session("session_id=a&session_id=b").expect_err("refused");
        assert!(e.0.contains("more than once"), "{e}");
        // Even when the first was empty.
        assert!(session("session_id=&session_id=b").is_err());
    }

    #[test]
    fn malformed_escapes_are_refused() {
        assert!(session("session_id=%").is_err());
        assert!(session("session_id=%4").is_err());
        assert!(session("session_id=%zz").is_err());
        // Garbage in an unknown parameter's value is not weir's business.
        assert!(session("other=%zz&session_id=a").is_ok());
    }

    #[test]
    fn resume_parameters_are_parsed_strictly() {
        let q = UpgradeQuery::parse(Some("resume_token=abc&last_seq=10&next_seq=12")).expect("ok");
        assert_eq!(q.resume_token.as_deref(), Some("abc"));
        assert_eq!((q.last_seq, q.next_seq), (Some(10), Some(12)));
        for bad in [
            "last_seq=-1",
            "last_seq=1.5",
            "last_seq=+1",
            "next_seq=x",
            "next_seq=99999999999999999999",
            "next_seq=9007199254740993",
            "last_seq=1&last_seq=2",
            "resume_token=a&resume_token=b",
        ] {
            let e = UpgradeQuery::parse(Some(bad)).expect_err(bad);
            assert!(
                e.0.contains("seq") || e.0.contains("resume_token"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        for s in [
            "%",
            "%%",
            "&&&",
            "=&=",
            "session_id",
            "session_id=%e2%82",
            "é=%",
        ] {
            let _ = UpgradeQuery::parse(Some(s));
        }
    }
}

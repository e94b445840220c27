//! A raw NATS client protocol connection, for hostile-input tests: it writes bytes no
//! NATS client library would (a non-UTF-8 subject or reply subject, a header block that
//! is not one), which nats-server relays unchecked to every subscriber.
//!
//! Blocking and short: every read is bounded by [`IO_TIMEOUT`], so it is fine to call
//! from an async test.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::error::{Error, ErrorKind};

/// Bound on each read and write of the raw connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The malformed messages a hostile publisher can send to `subject` (which must not
/// contain a wildcard): a non-UTF-8 reply subject, a header block that is not one
/// (no `NATS/1.0` line, a non-UTF-8 byte), and a non-UTF-8 header value in an
/// otherwise valid block. Each is framed correctly, so the server relays it.
pub fn malformed_messages(subject: &str) -> Vec<Vec<u8>> {
    // `HPUB` of the header block `block` and the body `{}`.
    let hpub = |block: &[u8]| {
        let (h, all) = (block.len(), block.len() + 2);
        let mut m = format!("HPUB {subject} _INBOX.x {h} {all}\r\n").into_bytes();
        m.extend_from_slice(block);
        m.extend_from_slice(b"{}\r\n");
        m
    };
    vec![
        non_utf8_subject(&format!("{subject} _INBOX")),
        // Header bytes that are not a `NATS/1.0` version line.
        hpub(b"GARBAGE\xff\r\n\r\n"),
        hpub(b"NATS/1.0\r\nWeir-Request-Id: \xff\r\n\r\n"),
    ]
}

/// `PUB <prefix>.<0xff 0xfe> 2`: a non-UTF-8 last token under `prefix`, reaching every
/// subscriber of `prefix.*` or `prefix.>`.
pub fn non_utf8_subject(prefix: &str) -> Vec<u8> {
    let mut m = format!("PUB {prefix}.").into_bytes();
    m.extend_from_slice(b"\xff\xfe 2\r\n{}\r\n");
    m
}

/// One raw connection to a nats-server, past `CONNECT`.
pub struct RawConnection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RawConnection {
    /// Connects to `127.0.0.1:port`, reads `INFO` and sends `CONNECT` (headers on,
    /// verbose off; with `user` and password when given).
    pub fn connect(port: u16, user: Option<(&str, &str)>) -> Result<Self, Error> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Io, format!("raw NATS connection: {e}"));
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
        stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        let writer = stream.try_clone().map_err(io)?;
        let mut conn = Self {
            reader: BufReader::new(stream),
            writer,
        };
        let info = conn.read_line()?;
        if !info.starts_with("INFO") {
            return Err(Error::new(
                ErrorKind::Io,
                format!("expected INFO, got {info:?}"),
            ));
        }
        let connect = match user {
            Some((u, p)) => format!(
                "CONNECT {{\"verbose\":false,\"headers\":true,\"user\":\"{u}\",\"pass\":\"{p}\"}}\r\n"
            ),
            None => "CONNECT {\"verbose\":false,\"headers\":true}\r\n".to_owned(),
        };
        conn.send(connect.as_bytes())?;
        Ok(conn)
    }

    /// Writes `bytes` verbatim.
    pub fn send(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.writer
            .write_all(bytes)
            .map_err(|e| Error::new(ErrorKind::Io, format!("raw NATS write: {e}")))
    }

    /// Sends `PING` and returns every line the server wrote up to its `PONG` (an
    /// `-ERR 'Permissions Violation ...'` among them when a publish was refused).
    pub fn ping(&mut self) -> Result<String, Error> {
        self.send(b"PING\r\n")?;
        let mut seen = String::new();
        loop {
            let line = self.read_line()?;
            seen.push_str(&line);
            if line.starts_with("PONG") {
                return Ok(seen);
            }
        }
    }

    fn read_line(&mut self) -> Result<String, Error> {
        let mut raw = Vec::new();
        let n = self
            .reader
            .read_until(b'\n', &mut raw)
            .map_err(|e| Error::new(ErrorKind::Io, format!("raw NATS read: {e}")))?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::Io,
                "raw NATS connection closed by the server",
            ));
        }
        Ok(String::from_utf8_lossy(&raw).into_owned())
    }
}

/// Connects, sends every message of `messages`, then `PING`; returns what the server
/// answered up to its `PONG`.
pub fn publish(
    port: u16,
    user: Option<(&str, &str)>,
    messages: &[Vec<u8>],
) -> Result<String, Error> {
    let mut conn = RawConnection::connect(port, user)?;
    for m in messages {
        conn.send(m)?;
    }
    conn.ping()
}

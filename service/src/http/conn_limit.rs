//! The connection cap of one HTTP listener: at most `max` open connections in all, and
//! at most `per_ip` from one client address (IPv4 address, or IPv6 /64 prefix: one
//! IPv6 host usually owns a whole /64).
//!
//! Pure and synchronous (no I/O, no clock); [`super::serve`] asks for a
//! [`ConnPermit`] for each accepted TCP connection and refuses the connection at once
//! when none is granted, so the listener never waits and a flood cannot fill the
//! kernel's accept queue behind a full cap.
//!
//! Invariants: `open() <= max`, and for every address `open_from(ip) <= per_ip`; a
//! permit is released exactly once, by `Drop` (it lives inside the connection's I/O
//! object, so an upgraded WebSocket keeps its slot until the socket is closed); the
//! per-address map holds only addresses with at least one open connection, so it is
//! bounded by `max` entries.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnRefused {
    /// `max` connections are open on this listener.
    #[error("{max} connections are open on this listener")]
    Full {
        /// The cap.
        max: usize,
    },
    /// `per_ip` connections are open from this client address.
    #[error("{max} connections are open from this client address")]
    PerIp {
        /// The per-address cap.
        max: usize,
    },
}

impl ConnRefused {
    /// The metric label (`reason`).
    pub fn as_label(self) -> &'static str {
        match self {
            Self::Full { .. } => "max_connections",
            Self::PerIp { .. } => "per_ip",
        }
    }
}

/// The key a client address is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    V4([u8; 4]),
    /// The /64 prefix.
    V6([u8; 8]),
}

impl Client {
    fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let o = v6.octets();
                Self::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    open: usize,
    by_client: HashMap<Client, usize>,
}

#[derive(Debug)]
struct Inner {
    listener: &'static str,
    open_gauge: &'static str,
    max: usize,
    per_ip: usize,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The critical sections only do arithmetic: a poisoned lock holds valid counts.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The cap of one listener (cheap to clone; clones share the counts).
#[derive(Debug, Clone)]
pub struct ConnLimiter {
    inner: Arc<Inner>,
}

impl ConnLimiter {
    /// A cap of `max` connections, `per_ip` from one address (both at least 1;
    /// `per_ip` is clamped to `max`). The open count is the gauge `open_gauge`, labelled
    /// `listener` = `listener` (`ws`, `admin`).
    pub fn new(
        listener: &'static str,
        open_gauge: &'static str,
        max: usize,
        per_ip: usize,
    ) -> Self {
        let max = max.max(1);
        Self {
            inner: Arc::new(Inner {
                listener,
                open_gauge,
                max,
                per_ip: per_ip.clamp(1, max),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// A permit for one connection from `ip`, or why not.
    pub fn try_acquire(&self, ip: IpAddr) -> Result<ConnPermit, ConnRefused> {
        let client = Client::of(ip);
        let open = {
            let mut s = self.inner.lock();
            if s.open >= self.inner.max {
                return Err(ConnRefused::Full {
                    max: self.inner.max,
                });
            }
            let from = s.by_client.entry(client).or_insert(0);
            if *from >= self.inner.per_ip {
                return Err(ConnRefused::PerIp {
                    max: self.inner.per_ip,
                });
            }
            *from += 1;
            s.open += 1;
            s.open
        };
        metrics::gauge!(self.inner.open_gauge, super::LABEL_LISTENER => self.inner.listener)
            .set(open as f64);
        Ok(ConnPermit {
            inner: Arc::clone(&self.inner),
            client,
        })
    }

    /// Open connections (permits alive).
    pub fn open(&self) -> usize {
        self.inner.lock().open
    }

    /// Open connections from `ip` (its /64 for IPv6).
    pub fn open_from(&self, ip: IpAddr) -> usize {
        self.inner
            .lock()
            .by_client
            .get(&Client::of(ip))
            .copied()
            .unwrap_or(0)
    }

    /// Distinct client addresses with an open connection.
    pub fn clients(&self) -> usize {
        self.inner.lock().by_client.len()
    }
}

/// One open connection's slot; released when dropped.
#[derive(Debug)]
pub struct ConnPermit {
    inner: Arc<Inner>,
    client: Client,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let open = {
            let mut s = self.inner.lock();
            s.open = s.open.saturating_sub(1);
            if let Some(n) = s.by_client.get_mut(&self.client) {
                *n -= 1;
                if *n == 0 {
                    s.by_client.remove(&self.client);
                }
            }
            s.open
        };
        metrics::gauge!(self.inner.open_gauge, super::LABEL_LISTENER => self.inner.listener)
            .set(open as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn global_cap_holds_and_releases_exactly_once() {
        let l = ConnLimiter::new("test", "test_open", 3, 3);
        let a = l.try_acquire(ip("10.0.0.1")).expect("1");
        let b = l.try_acquire(ip("10.0.0.2")).expect("2");
        let c = l.try_acquire(ip("10.0.0.3")).expect("3");
        assert_eq!(
            l.try_acquire(ip("10.0.0.4")).expect_err("refused"),
            ConnRefused::Full { max: 3 }
        );
        assert_eq!(l.open(), 3);
        drop(b);
        assert_eq!(l.open(), 2);
        let d = l.try_acquire(ip("10.0.0.4")).expect("room again");
        drop((a, c, d));
        assert_eq!(l.open(), 0);
        assert_eq!(l.clients(), 0, "the per-address map forgets closed clients");
    }

    #[test]
    fn one_address_cannot_take_more_than_per_ip() {
        let l = ConnLimiter::new("test", "test_open", 10, 2);
        let _a = l.try_acquire(ip("10.0.0.1")).expect("1");
        let _b = l.try_acquire(ip("10.0.0.1")).expect("2");
        assert_eq!(
            l.try_acquire(ip("10.0.0.1")).expect_err("refused"),
            ConnRefused::PerIp { max: 2 }
        );
        // Others still get in.
        let _c = l.try_acquire(ip("10.0.0.2")).expect("other address");
        assert_eq!(l.open_from(ip("10.0.0.1")), 2);
        assert_eq!(l.open(), 3);
    }

    #[test]
    fn ipv6_counts_per_slash_64_and_mapped_v4_as_v4() {
        let l = ConnLimiter::new("test", "test_open", 10, 1);
        let _a = l
            .try_acquire(ip("2001:db8:1:2::1"))
            .expect("first of the /64");
        assert!(
            l.try_acquire(ip("2001:db8:1:2:ffff::9")).is_err(),
            "same /64"
        );
        let _b = l.try_acquire(ip("2001:db8:1:3::1")).expect("another /64");
        let _c = l.try_acquire(ip("192.0.2.7")).expect("v4");
        assert!(
            l.try_acquire(ip("::ffff:192.0.2.7")).is_err(),
            "mapped = v4"
        );
    }

    #[test]
    fn per_ip_is_clamped_to_max_and_zero_means_one() {
        let l = ConnLimiter::new("test", "test_open", 0, 0);
        let _a = l.try_acquire(ip("10.0.0.1")).expect("max 0 is 1");
        assert_eq!(
            l.try_acquire(ip("10.0.0.2")).expect_err("refused"),
            ConnRefused::Full { max: 1 }
        );
    }
}

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
//!
//! Eviction ([`ConnLimiter::evict_silent_when_full`], the admin ports): a connection
//! that is waiting for a request head (before its first request and between
//! requests) is *silent*. When the cap is full, a new connection takes the slot of the
//! silent connection that has waited longest: that one is counted out at once and told
//! to close ([`SlotHandle::evicted`]). So silent connections cannot keep a health probe
//! out; one that sends its head in time is never evicted while it is being answered.
//! A slot is counted out exactly once, by the eviction or by `Drop`.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::sync::locked;

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

/// The key a client address is counted under: an IPv4 address (an IPv4-mapped IPv6
/// address counts as IPv4), or an IPv6 /64 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// An IPv4 address.
    V4([u8; 4]),
    /// The /64 prefix.
    V6([u8; 8]),
}

impl Client {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> Self {
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
    /// Connections waiting for a request head, oldest first (only when evicting).
    silent: BTreeMap<u64, Arc<Slot>>,
    next_id: u64,
}

impl State {
    fn count_out(&mut self, client: Client) {
        self.open = self.open.saturating_sub(1);
        if let Some(n) = self.by_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.by_client.remove(&client);
            }
        }
    }
}

/// One connection's place, as the limiter sees it.
#[derive(Debug)]
struct Slot {
    id: u64,
    client: Client,
    /// Set (under the state lock) when another connection took this slot.
    evicted: AtomicBool,
    notify: Notify,
}

#[derive(Debug)]
struct Inner {
    listener: &'static str,
    open_gauge: &'static str,
    max: usize,
    per_ip: usize,
    evict_silent: bool,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The critical sections only do arithmetic: a poisoned lock holds valid counts.
        locked(&self.state)
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
                evict_silent: false,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// When the cap is full, a new connection takes the slot of the connection that
    /// has waited longest for a request head (see the module docs). Call before the
    /// limiter is cloned or used.
    #[must_use]
    pub fn evict_silent_when_full(mut self) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.evict_silent = true;
        }
        self
    }

    /// A permit for one connection from `ip`, or why not.
    pub fn try_acquire(&self, ip: IpAddr) -> Result<ConnPermit, ConnRefused> {
        let client = Client::of(ip);
        let (open, slot) = {
            let mut s = self.inner.lock();
            if s.by_client.get(&client).copied().unwrap_or(0) >= self.inner.per_ip
                && s.open < self.inner.max
            {
                return Err(ConnRefused::PerIp {
                    max: self.inner.per_ip,
                });
            }
            if s.open >= self.inner.max {
                let victim = if self.inner.evict_silent {
                    s.silent.pop_first().map(|(_, slot)| slot)
                } else {
                    None
                };
                let Some(victim) = victim else {
                    return Err(ConnRefused::Full {
                        max: self.inner.max,
                    });
                };
                victim.evicted.store(true, Ordering::Relaxed);
                s.count_out(victim.client);
                victim.notify.notify_one();
            }
            let from = s.by_client.entry(client).or_insert(0);
            if *from >= self.inner.per_ip {
                return Err(ConnRefused::PerIp {
                    max: self.inner.per_ip,
                });
            }
            *from += 1;
            s.open += 1;
            let id = s.next_id;
            s.next_id += 1;
            let slot = Arc::new(Slot {
                id,
                client,
                evicted: AtomicBool::new(false),
                notify: Notify::new(),
            });
            if self.inner.evict_silent {
                s.silent.insert(id, Arc::clone(&slot));
            }
            (s.open, slot)
        };
        metrics::gauge!(self.inner.open_gauge, super::LABEL_LISTENER => self.inner.listener)
            .set(open as f64);
        Ok(ConnPermit {
            handle: SlotHandle {
                inner: Arc::clone(&self.inner),
                slot,
            },
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
    handle: SlotHandle,
}

impl ConnPermit {
    /// What the connection's task tells the limiter, and hears from it.
    pub fn handle(&self) -> SlotHandle {
        self.handle.clone()
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let SlotHandle { inner, slot } = &self.handle;
        let open = {
            let mut s = inner.lock();
            s.silent.remove(&slot.id);
            if slot.evicted.load(Ordering::Relaxed) {
                // Already counted out by the eviction.
                return;
            }
            s.count_out(slot.client);
            s.open
        };
        metrics::gauge!(inner.open_gauge, super::LABEL_LISTENER => inner.listener).set(open as f64);
    }
}

/// A connection's view of its slot: whether it waits for a request head, and whether
/// it was evicted.
#[derive(Debug, Clone)]
pub struct SlotHandle {
    inner: Arc<Inner>,
    slot: Arc<Slot>,
}

impl SlotHandle {
    /// A request head arrived: not silent until it is answered.
    pub fn request_started(&self) {
        if self.inner.evict_silent {
            self.inner.lock().silent.remove(&self.slot.id);
        }
    }

    /// The request was answered: silent again, waiting for the next head.
    pub fn request_answered(&self) {
        if self.inner.evict_silent {
            let mut s = self.inner.lock();
            if !self.slot.evicted.load(Ordering::Relaxed) {
                s.silent.insert(self.slot.id, Arc::clone(&self.slot));
            }
        }
    }

    /// Resolves when another connection took this slot (never without eviction).
    pub async fn evicted(&self) {
        self.slot.notify.notified().await;
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
    fn a_full_evicting_cap_takes_the_slot_of_the_longest_silent_connection() {
        let l = ConnLimiter::new("test", "test_open", 2, 2).evict_silent_when_full();
        let a = l.try_acquire(ip("10.0.0.1")).expect("a");
        let b = l.try_acquire(ip("10.0.0.1")).expect("b");
        // `a` is being answered: not silent; `b` is, so `b` goes.
        a.handle().request_started();
        let c = l.try_acquire(ip("10.0.0.2")).expect("c takes b's slot");
        assert_eq!(l.open(), 2);
        assert_eq!(l.open_from(ip("10.0.0.1")), 1);
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let bh = b.handle();
        let evicted = std::pin::pin!(bh.evicted());
        assert!(evicted.poll(&mut cx).is_ready(), "b is told to close");
        drop(b);
        assert_eq!(l.open(), 2, "b's drop does not count it out twice");
        // `c` is silent now, `a` busy: the next one takes `c`'s slot.
        let _d = l.try_acquire(ip("10.0.0.3")).expect("d");
        drop(c);
        assert_eq!(l.open(), 2);
        // Nobody silent: refused.
        a.handle().request_started();
        _d.handle().request_started();
        assert_eq!(
            l.try_acquire(ip("10.0.0.4")).expect_err("nobody silent"),
            ConnRefused::Full { max: 2 }
        );
        drop((a, _d));
        assert_eq!(l.open(), 0);
        assert_eq!(l.clients(), 0);
    }

    #[test]
    fn without_eviction_a_full_cap_refuses_even_silent_connections() {
        let l = ConnLimiter::new("test", "test_open", 1, 1);
        let _a = l.try_acquire(ip("10.0.0.1")).expect("a");
        assert!(l.try_acquire(ip("10.0.0.2")).is_err());
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

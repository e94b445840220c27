//! The WHIP resources and their caps: at most `whip_max_sessions` in all, and at most
//! `whip_max_sessions_per_ip` from one client address (IPv4 address or IPv6 /64, the
//! grouping of the connection cap, `weir_service::http::Client`).
//!
//! Invariants: `len() <= max`; for every client, its count equals its entries, and is
//! at most `per_ip`; a client with no entry has no count (the map is bounded by
//! `max`); an entry is removed, and its client's count lowered, exactly once, by its
//! [`SessionSlot`]'s `Drop`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use weir_service::http::Client;
use weir_service::sync::locked;

use super::Entry;

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// `max` sessions are active.
    All(usize),
    /// `per_ip` sessions are active from this client.
    PerIp(usize),
}

/// The entries and the per-client counts, under one lock.
#[derive(Default)]
pub(crate) struct Table {
    entries: HashMap<String, (Client, Entry)>,
    by_client: HashMap<Client, usize>,
}

impl Table {
    /// The entry of resource `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key).map(|(_, e)| e)
    }

    /// Every entry, by resource key.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> {
        self.entries.iter().map(|(k, (_, e))| (k, e))
    }

    /// Active sessions.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// No active session.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn from(&self, client: Client) -> usize {
        self.by_client.get(&client).copied().unwrap_or(0)
    }
}

/// The WHIP resources, bounded by `whip_max_sessions` and `whip_max_sessions_per_ip`.
pub(crate) struct Sessions {
    table: Mutex<Table>,
    pub(crate) max: usize,
    pub(crate) per_ip: usize,
}

impl Sessions {
    pub(crate) fn new(max: usize, per_ip: usize) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            max,
            per_ip: per_ip.clamp(1, max.max(1)),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Table> {
        // The critical sections only insert and remove: a poisoned lock holds a valid
        // table.
        locked(&self.table)
    }

    /// Whether `client` could have one more session now (the check before an offer's
    /// body is read; [`Sessions::reserve`] checks again).
    pub(crate) fn room_for(&self, client: Client) -> Result<(), Full> {
        let t = self.lock();
        self.check(&t, client)
    }

    fn check(&self, t: &Table, client: Client) -> Result<(), Full> {
        if t.len() >= self.max {
            return Err(Full::All(self.max));
        }
        if t.from(client) >= self.per_ip {
            return Err(Full::PerIp(self.per_ip));
        }
        Ok(())
    }

    /// Registers `entry` as resource `key` of `client`, or says which cap is full.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        client: Client,
        key: String,
        entry: Entry,
    ) -> Result<SessionSlot, Full> {
        let mut t = self.lock();
        self.check(&t, client)?;
        *t.by_client.entry(client).or_insert(0) += 1;
        t.entries.insert(key.clone(), (client, entry));
        Ok(SessionSlot {
            sessions: Arc::clone(self),
            key,
        })
    }
}

/// A session's place under the caps, released (the resource removed) on `Drop`.
/// Owned by the driver's session, so it is freed exactly once, when the session's
/// ICE/DTLS is gone.
pub(crate) struct SessionSlot {
    sessions: Arc<Sessions>,
    key: String,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut t = self.sessions.lock();
        if let Some((client, _)) = t.entries.remove(&self.key)
            && let Some(n) = t.by_client.get_mut(&client)
        {
            *n -= 1;
            if *n == 0 {
                t.by_client.remove(&client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use tokio::sync::mpsc;

    use super::*;

    fn entry() -> Entry {
        Entry {
            stream_id: weir_protocol::StreamId::parse("s").expect("id"),
            stop: mpsc::channel(1).0,
            ended: Arc::new(AtomicBool::new(false)),
            counters: Arc::default(),
        }
    }

    fn client(ip: &str) -> Client {
        Client::of(ip.parse().expect("ip"))
    }

    #[test]
    fn one_client_gets_at_most_per_ip_and_others_still_get_in() {
        let s = Arc::new(Sessions::new(4, 2));
        let a = client("10.0.0.1");
        let s1 = s.reserve(a, "1".into(), entry()).expect("1");
        let _s2 = s.reserve(a, "2".into(), entry()).expect("2");
        assert_eq!(s.room_for(a), Err(Full::PerIp(2)));
        assert!(s.reserve(a, "3".into(), entry()).is_err());
        // The same /64 counts as one client.
        let v6 = client("2001:db8::1");
        let _s4 = s.reserve(v6, "4".into(), entry()).expect("4");
        let _s5 = s
            .reserve(client("2001:db8::2"), "5".into(), entry())
            .expect("5");
        assert_eq!(
            s.reserve(client("2001:db8::3"), "6".into(), entry()).err(),
            Some(Full::All(4))
        );
        drop(s1);
        assert_eq!(s.room_for(a), Ok(()), "a slot back");
        assert_eq!(s.lock().len(), 3);
    }

    #[test]
    fn released_slots_leave_no_count_behind() {
        let s = Arc::new(Sessions::new(2, 1));
        let slot = s
            .reserve(client("10.0.0.1"), "1".into(), entry())
            .expect("1");
        drop(slot);
        assert!(s.lock().is_empty());
        assert!(s.lock().by_client.is_empty());
    }
}

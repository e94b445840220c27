//! Resumable streams: a producer whose connection drops gets its stream back.
//!
//! A stream opened at a door is **attached** to that connection ([`Attachment`]). When
//! the connection drops without an `end`, the attachment is dropped and the stream is
//! **parked** here for `resume_window_ms`: its publisher keeps draining, its registry
//! slot, capacity ticket and bounds stay. A producer that reconnects with the stream's
//! token ([`token`]) **claims** it ([`Resume::claim`]) and attaches it to the new
//! connection: the same stream instance, seq continuing. Past the window the parked
//! stream is dropped: it ends with `producer_gone`, as a dropped connection did before.
//!
//! A claim while another connection still holds the stream (the door has not noticed
//! that the old one died, or a second producer) revokes that attachment: its connection
//! closes (`taken_over`) and hands the stream back here, and the newest claim takes it.
//! Claims are numbered per stream; only the latest may take it, so two racing resumes
//! leave exactly one producer.
//!
//! Invariants:
//! - The stream ([`Held`]: handle and capacity ticket) is in exactly one place: an
//!   [`Attachment`], a [`Claimed`], or parked in the table. Every move happens under the
//!   table's lock; dropping an attachment or a claim parks the stream (never loses it).
//! - A parked stream ends exactly once: by its expiry (`producer_gone`), by a fresh
//!   open of its id ([`Resume::evict_parked`]), or at shutdown. A stream that ends at
//!   its door ([`Attachment::end`]) leaves the table at once.
//! - Refusals are distinct: a token this process did not mint, another stream's token,
//!   another producer scope's, an expired window, a stream that ended (remembered for
//!   [`TOMB_TTL`], at most [`MAX_TOMBS`]), a claim that lost to a newer one.
//! - With `resume_window_ms = 0` nothing is minted nor parked: a dropped attachment ends
//!   its stream at once.

pub mod admit;
pub mod token;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::Notify;
use tokio::time::Instant;
use weir_audio_producer::stream::{Position, StreamHandle, StreamView};
use weir_protocol::StreamId;
use weir_service::shutdown::CancellationToken;
use weir_service::sync::locked;

use crate::capacity::Ticket;
use crate::metrics as m;
use token::Minter;

/// How long a claim waits for the connection holding the stream to let go of it.
pub const TAKEOVER_BOUND: Duration = Duration::from_secs(3);
/// How long an ended stream's token is remembered (for a distinct refusal).
pub const TOMB_TTL: Duration = Duration::from_secs(600);
/// At most this many ended streams are remembered.
pub const MAX_TOMBS: usize = 65_536;

/// A stream in someone's hands: the producer core's handle and the capacity slot.
pub struct Held {
    /// The producer's end of the stream.
    pub handle: StreamHandle,
    /// The recognition-capacity slot (held until the stream finished).
    pub ticket: Ticket,
}

impl Held {
    /// Lets go of the stream: it ends (`producer_gone`, unless it was already ending)
    /// and its capacity slot is kept until it finished, as a door does.
    pub fn release(self) {
        let status = self.handle.status();
        drop(self.handle);
        crate::door::release_when_finished(self.ticket, status);
    }
}

/// Why a resume was refused. Each has its own code ([`Self::code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeRefusal {
    /// Not a token this process minted.
    #[error(
        "not a resume token this ingress issued (forged, malformed, or issued before a restart); open a new stream"
    )]
    Invalid,
    /// A token of another stream id.
    #[error("the resume token belongs to another stream")]
    OtherStream,
    /// A token bound to another producer token's scope.
    #[error("the resume token belongs to another producer (its producer token's scope differs)")]
    OtherScope,
    /// The stream was not resumed in time and ended.
    #[error("the stream was not resumed within resume_window_ms and ended (producer_gone)")]
    Expired,
    /// The stream ended otherwise.
    #[error("the stream already ended ({0}); its token cannot resume it")]
    Ended(&'static str),
    /// `last_seq` above the door's.
    #[error("last_seq = {claimed} is ahead of the last frame the door took ({door})")]
    Ahead {
        /// What the producer claimed.
        claimed: u64,
        /// The door's seq.
        door: u64,
    },
    /// `next_seq` not above the door's seq, or more lost frames than the time away allows.
    #[error("{0}")]
    BadSeq(String),
    /// A newer resume with the same token took the stream.
    #[error("a newer resume with this token took the stream")]
    Superseded,
    /// The connection holding the stream did not let go of it within the bound.
    #[error("the connection holding the stream did not let go of it in time; retry")]
    Busy,
}

impl ResumeRefusal {
    /// The error code of the JSON body.
    pub fn code(&self) -> &'static str {
        self.answer().1
    }

    /// The HTTP status of the refusal and the error code of its JSON body.
    pub fn answer(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Invalid => (StatusCode::UNAUTHORIZED, "resume_invalid"),
            Self::OtherStream | Self::OtherScope => (StatusCode::FORBIDDEN, "resume_mismatch"),
            Self::Expired => (StatusCode::GONE, "resume_expired"),
            Self::Ended(_) => (StatusCode::GONE, "resume_ended"),
            Self::Ahead { .. } => (StatusCode::CONFLICT, "resume_ahead"),
            Self::BadSeq(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Self::Superseded => (StatusCode::CONFLICT, "taken_over"),
            Self::Busy => (StatusCode::SERVICE_UNAVAILABLE, "resume_busy"),
        }
    }
}

/// Why a remembered stream can no longer be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tomb {
    Expired,
    Ended(&'static str),
}

/// Ended stream instances, bounded in count and age.
#[derive(Default)]
struct Tombs {
    by_instance: HashMap<u64, Tomb>,
    order: VecDeque<(Instant, u64)>,
}

impl Tombs {
    fn bury(&mut self, instance: u64, tomb: Tomb, now: Instant) {
        while let Some(&(at, old)) = self.order.front() {
            if self.order.len() < MAX_TOMBS && now.saturating_duration_since(at) < TOMB_TTL {
                break;
            }
            self.order.pop_front();
            self.by_instance.remove(&old);
        }
        if self.by_instance.insert(instance, tomb).is_none() {
            self.order.push_back((now, instance));
        }
    }

    /// The refusal for a token of a stream no longer in the table. A valid token of a
    /// stream not remembered (ended longer ago than the tombs keep) reads as expired.
    fn refusal(&self, instance: u64) -> ResumeRefusal {
        match self.by_instance.get(&instance) {
            Some(Tomb::Ended(reason)) => ResumeRefusal::Ended(reason),
            Some(Tomb::Expired) | None => ResumeRefusal::Expired,
        }
    }
}

enum State {
    /// A connection holds the stream; cancelling `revoke` asks it to let go.
    Attached { revoke: CancellationToken },
    /// Nobody holds it; it ends at `deadline` unless claimed.
    Parked {
        held: Held,
        park: u64,
        deadline: Instant,
    },
    /// A claim took it and is checking the producer's position.
    Moving,
}

struct Entry {
    instance: u64,
    /// The stream, read-only: a claim checks the producer's position against it
    /// before it revokes the connection that holds the stream.
    view: StreamView,
    token: Arc<str>,
    /// Number of the latest attachment or claim; only that one may take the stream.
    claim: u64,
    state: State,
}

struct Inner {
    entries: HashMap<StreamId, Entry>,
    tombs: Tombs,
    parks: u64,
}

impl Inner {
    /// Takes the stream of `id` out of the table when it is parked and `ours` accepts
    /// its entry, remembering it as `tomb`.
    fn unpark(&mut self, id: &StreamId, tomb: Tomb, ours: impl Fn(&Entry) -> bool) -> Option<Held> {
        let parked = |e: &Entry| matches!(e.state, State::Parked { .. }) && ours(e);
        if !self.entries.get(id).is_some_and(parked) {
            return None;
        }
        let e = self.entries.remove(id)?;
        self.tombs.bury(e.instance, tomb, Instant::now());
        match e.state {
            State::Parked { held, .. } => Some(held),
            _ => None,
        }
    }
}

/// The resumable streams of one ingress (both doors).
pub struct Resume {
    window: Duration,
    minter: Minter,
    inner: Mutex<Inner>,
    /// Notified on every change of a stream's state (a claim waits on it).
    changed: Notify,
}

impl Resume {
    /// The table for `window` (`resume_window_ms`); zero: resume off. `None` when the
    /// OS has no randomness for the token key.
    pub fn new(window: Duration) -> Option<Arc<Self>> {
        Some(Arc::new(Self {
            window,
            minter: Minter::new()?,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                tombs: Tombs::default(),
                parks: 0,
            }),
            changed: Notify::new(),
        }))
    }

    /// `resume_window_ms`.
    pub fn window(&self) -> Duration {
        self.window
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        locked(&self.inner)
    }

    /// Attaches a newly opened stream to its connection; mints its token when resume
    /// is on. `scope`: the producer token's scope ([`crate::auth::Grant::scope`]), zero
    /// without authentication.
    pub fn attach_new(self: &Arc<Self>, id: StreamId, scope: [u8; 8], held: Held) -> Attachment {
        let mut att = Attachment {
            slot: Slot {
                resume: Arc::clone(self),
                id,
                instance: 0,
                claim: 0,
                token: None,
                deadline: None,
                held: Some(held),
            },
            revoke: CancellationToken::new(),
        };
        // Resume off (`resume_window_ms` = 0).
        if self.window.is_zero() {
            return att;
        }
        let mut b = [0u8; 8];
        if getrandom::fill(&mut b).is_err() {
            // No randomness: the stream is simply not resumable.
            return att;
        }
        let instance = u64::from_be_bytes(b);
        let token: Arc<str> = self
            .minter
            .mint(att.slot.id.as_str(), instance, scope)
            .into();
        let view = att.handle().view();
        let replaced = {
            let mut inner = self.lock();
            let old = inner.entries.insert(
                att.slot.id.clone(),
                Entry {
                    instance,
                    view,
                    token: Arc::clone(&token),
                    claim: 1,
                    state: State::Attached {
                        revoke: att.revoke.clone(),
                    },
                },
            );
            old.inspect(|e| {
                inner
                    .tombs
                    .bury(e.instance, Tomb::Ended("replaced"), Instant::now());
            })
        };
        // A stale entry (cannot happen while the registry refuses an active id; kept
        // safe): its stream, if parked, ends outside the lock.
        if let Some(Entry {
            state: State::Parked { held, .. },
            ..
        }) = replaced
        {
            held.release();
        }
        self.changed.notify_waiters();
        att.slot.instance = instance;
        att.slot.claim = 1;
        att.slot.token = Some(token);
        att
    }

    /// A fresh open of `id` (no token) while `id` is parked: the parked stream ends
    /// (`producer_gone`) so that a producer without resume support can open it again,
    /// as before resume existed. Returns a view of the ended stream to wait for (its
    /// publisher must release the id); `None` when `id` was not parked.
    pub fn evict_parked(&self, id: &StreamId) -> Option<StreamView> {
        let held = self.lock().unpark(id, Tomb::Ended("replaced"), |_| true)?;
        self.changed.notify_waiters();
        metrics::counter!(m::RESUME_PARKED_ENDED_TOTAL, m::LABEL_REASON => "replaced").increment(1);
        let view = held.handle.view();
        held.release();
        Some(view)
    }

    /// Claims stream `id` with `token` for a reconnecting producer of `scope`:
    /// `precheck` judges the producer's claim against where the stream stands now; only
    /// then is the connection holding it, if any, revoked — a resume the door would
    /// refuse never cuts off the live producer. Then waits (at most
    /// [`TAKEOVER_BOUND`]) until the stream is parked and this is still the latest claim.
    pub async fn claim(
        self: &Arc<Self>,
        id: &StreamId,
        token: &str,
        scope: [u8; 8],
        precheck: impl FnOnce(Position) -> Result<(), ResumeRefusal>,
    ) -> Result<Claimed, ResumeRefusal> {
        let opened = self.minter.open(token).ok_or(ResumeRefusal::Invalid)?;
        if !opened.id_matches(id.as_str()) {
            return Err(ResumeRefusal::OtherStream);
        }
        if opened.scope != scope {
            return Err(ResumeRefusal::OtherScope);
        }
        let instance = opened.instance;
        let view = {
            let inner = self.lock();
            match inner.entries.get(id).filter(|e| e.instance == instance) {
                Some(e) => e.view.clone(),
                None => return Err(inner.tombs.refusal(instance)),
            }
        };
        // Outside the table's lock (the position takes the stream's). The door's seq
        // only grows, so a claim refused here would be refused later too.
        precheck(view.position())?;
        let mine = {
            let mut inner = self.lock();
            let Some(e) = inner.entries.get_mut(id).filter(|e| e.instance == instance) else {
                return Err(inner.tombs.refusal(instance));
            };
            e.claim += 1;
            if let State::Attached { revoke } = &e.state {
                revoke.cancel();
            }
            e.claim
        };
        // A claim that lost the race must not leave the earlier claimant waiting.
        self.changed.notify_waiters();
        let until = Instant::now() + TAKEOVER_BOUND;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                let Some(e) = inner.entries.get_mut(id).filter(|e| e.instance == instance) else {
                    return Err(inner.tombs.refusal(instance));
                };
                if e.claim != mine {
                    return Err(ResumeRefusal::Superseded);
                }
                if let State::Parked { deadline, .. } = e.state {
                    let State::Parked { held, .. } = std::mem::replace(&mut e.state, State::Moving)
                    else {
                        unreachable!("matched above")
                    };
                    return Ok(Claimed(Slot {
                        resume: Arc::clone(self),
                        id: id.clone(),
                        instance,
                        claim: mine,
                        token: Some(Arc::clone(&e.token)),
                        deadline: Some(deadline),
                        held: Some(held),
                    }));
                }
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return Err(ResumeRefusal::Busy);
            }
        }
    }

    /// Ends every parked stream (shutdown): their streams end with `producer_gone`
    /// unless the shutdown closed them first.
    pub fn clear(&self) {
        let parked: Vec<Held> = {
            let mut inner = self.lock();
            let ids: Vec<StreamId> = inner.entries.keys().cloned().collect();
            ids.iter()
                .filter_map(|id| inner.unpark(id, Tomb::Ended("shutdown"), |_| true))
                .collect()
        };
        self.changed.notify_waiters();
        parked.into_iter().for_each(Held::release);
    }

    /// Parks `held` for the stream instance `instance` of `id` until `deadline`
    /// (called by a dropped attachment or claim). The stream ends at once when resume
    /// is off, the entry is gone, or a newer instance took the id.
    fn park(self: &Arc<Self>, id: &StreamId, instance: u64, held: Held, deadline: Instant) {
        let parked = {
            let mut inner = self.lock();
            inner.parks += 1;
            let park = inner.parks;
            match inner.entries.get_mut(id).filter(|e| e.instance == instance) {
                Some(e) => {
                    e.state = State::Parked {
                        held,
                        park,
                        deadline,
                    };
                    Ok(park)
                }
                None => Err(held),
            }
        };
        self.changed.notify_waiters();
        let park = match parked {
            Ok(park) => park,
            Err(held) => {
                // Ends now (`producer_gone`): nobody can resume it any more.
                held.release();
                return;
            }
        };
        metrics::counter!(m::RESUME_PARKED_TOTAL).increment(1);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.expire(id, instance, park);
            return;
        };
        let me = Arc::clone(self);
        let id = id.clone();
        rt.spawn(async move {
            tokio::time::sleep_until(deadline).await;
            me.expire(&id, instance, park);
        });
    }

    /// The window of parked stream `id` ran out: it ends (`producer_gone`), unless it
    /// was claimed (or parked again) meanwhile.
    fn expire(&self, id: &StreamId, instance: u64, park: u64) {
        let ours = |e: &Entry| {
            e.instance == instance && matches!(e.state, State::Parked { park: p, .. } if p == park)
        };
        let Some(held) = self.lock().unpark(id, Tomb::Expired, ours) else {
            return;
        };
        self.changed.notify_waiters();
        metrics::counter!(m::RESUME_PARKED_ENDED_TOTAL, m::LABEL_REASON => "expired").increment(1);
        held.release();
    }

    /// The stream of `id` (instance `instance`) ended at its door: it leaves the table.
    fn ended(&self, id: &StreamId, instance: u64, reason: &'static str) {
        {
            let mut inner = self.lock();
            if inner
                .entries
                .get(id)
                .is_some_and(|e| e.instance == instance)
            {
                inner.entries.remove(id);
            }
            inner
                .tombs
                .bury(instance, Tomb::Ended(reason), Instant::now());
        }
        self.changed.notify_waiters();
    }

    /// Attaches a claimed stream to the claimant's connection.
    fn attach_claimed(
        &self,
        id: &StreamId,
        instance: u64,
        claim: u64,
    ) -> Option<CancellationToken> {
        let mut inner = self.lock();
        let e = inner
            .entries
            .get_mut(id)
            .filter(|e| e.instance == instance && e.claim == claim)?;
        let revoke = CancellationToken::new();
        e.state = State::Attached {
            revoke: revoke.clone(),
        };
        Some(revoke)
    }
}

/// What an [`Attachment`] and a [`Claimed`] hold: the stream and its place in the
/// table. Dropped while it holds the stream, it parks it until `deadline` (`None`: the
/// resume window from now on) or, resume off (no token), ends it (`producer_gone`).
struct Slot {
    resume: Arc<Resume>,
    id: StreamId,
    instance: u64,
    claim: u64,
    token: Option<Arc<str>>,
    deadline: Option<Instant>,
    held: Option<Held>,
}

/// Never called: an attachment or a claim holds its stream until resolved or dropped.
fn vacant<T>() -> T {
    unreachable!("an attachment or a claim holds its stream until resolved or dropped")
}

impl Slot {
    fn handle(&self) -> &StreamHandle {
        &self.held.as_ref().unwrap_or_else(vacant).handle
    }

    /// The stream ends at its door (`reason`): it leaves the table.
    fn end(&mut self, reason: &'static str) -> Held {
        let held = self.held.take();
        if self.token.is_some() {
            self.resume.ended(&self.id, self.instance, reason);
        }
        held.unwrap_or_else(vacant)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        if self.token.is_none() {
            // Resume off: the stream ends now (`producer_gone`).
            return held.release();
        }
        let deadline = self
            .deadline
            .unwrap_or_else(|| Instant::now() + self.resume.window);
        self.resume.park(&self.id, self.instance, held, deadline);
    }
}

/// A stream attached to one connection. Dropping it parks the stream (resume on) or
/// ends it (`producer_gone`); [`Self::end`] takes it out for a door that ends it.
pub struct Attachment {
    slot: Slot,
    revoke: CancellationToken,
}

impl Attachment {
    /// The stream's handle.
    pub fn handle(&self) -> &StreamHandle {
        self.slot.handle()
    }

    /// The handle and the ticket, both mutably (a door's loop waits on the ticket
    /// while it pushes into the handle).
    pub fn parts(&mut self) -> (&mut StreamHandle, &mut Ticket) {
        let held = self.slot.held.as_mut().unwrap_or_else(vacant);
        (&mut held.handle, &mut held.ticket)
    }

    /// The resume token (`None`: resume off).
    pub fn token(&self) -> Option<&str> {
        self.slot.token.as_deref()
    }

    /// Resolves when a resume on another connection claimed the stream: let go of it
    /// (drop the attachment) and close this connection (`taken_over`). Owns what it
    /// waits on, so it can be awaited beside the attachment's other parts.
    pub fn revoked(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let revoke = self.revoke.clone();
        let resumable = self.slot.token.is_some();
        async move {
            if !resumable {
                std::future::pending::<()>().await;
            }
            revoke.cancelled().await;
        }
    }

    /// The stream ends at this door (`reason`): it leaves the table; the caller finishes
    /// it with the returned handle and ticket.
    pub fn end(mut self, reason: &'static str) -> Held {
        self.slot.end(reason)
    }
}

/// A stream a resume took out of the table, while the door checks the producer's
/// position. [`Self::attach`] gives it to the new connection; dropped, the stream is
/// parked again (its window unchanged); [`Self::end`] ends it.
pub struct Claimed(Slot);

impl Claimed {
    /// The stream's handle.
    pub fn handle(&self) -> &StreamHandle {
        self.0.handle()
    }

    /// Attaches the stream to the claimant's connection; `Err` (the stream parked
    /// again) when a newer claim came meanwhile.
    pub fn attach(self) -> Result<Attachment, ResumeRefusal> {
        let Claimed(mut slot) = self;
        let revoke = slot
            .resume
            .attach_claimed(&slot.id, slot.instance, slot.claim)
            .ok_or(ResumeRefusal::Superseded)?;
        // From now on a drop parks it for a whole window again.
        slot.deadline = None;
        Ok(Attachment { slot, revoke })
    }

    /// The stream cannot go on (it ended meanwhile): it leaves the table.
    pub fn end(mut self, reason: &'static str) {
        self.0.end(reason).release();
    }
}

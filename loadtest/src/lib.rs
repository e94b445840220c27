//! weir's load test: the proof that bounding the *input* works.
//!
//! It drives the audio ingress (a separate process, so its RSS is its own) with
//! synthetic WebSocket producers at the real 20 ms cadence, runs a simulated
//! recognition fleet on weir's consumer core and an LLM request generator, injects
//! faults (NATS paused or restarted, backends stalled, producers vanishing, LLM
//! overload), samples everything every 100 ms, and reports weir's bounded design beside
//! the naive deployed shape (a task per frame behind a semaphore).
//!
//! Modules, in data-flow order: [`speech`] → [`producers`] → (ingress process:
//! [`ingress`], or [`naive`]) → NATS → [`fleet`]; [`llm`] on the side; [`sample`] every
//! 100 ms; [`timeliness`] in the fleet; [`accounting`], [`report`], [`plot`] at the end;
//! [`scenario`] ties a run together, [`app`] the whole session, [`cli`] the flags;
//! [`error`] is the one error type.
//! The failover scenarios ([`scenario::failover`]) run [`lease_worker`] processes on a
//! 3-node cluster and audit their logs with [`lease_audit`]. The recognition-capacity
//! scenarios ([`scenario::asr`]) model recognisers as GPU time ([`gpu`]): in-process
//! ([`fleet`], [`naive::asr`]) or as [`asr_worker`] processes. `producer-flap`
//! ([`scenario::flap`]) cuts every producer's TCP connection again and again, resumes
//! (or reopens) the streams, and audits every packet on NATS per call.
//!
//! Invariants that hold across the crate:
//! - only loopback addresses are ever targeted;
//! - every loop is bounded in count and in time, every wait has a timeout;
//! - child processes (ingress, nats-server) are killed on every exit path;
//! - figures are measured, never invented: what could not be measured is `null` or a
//!   note, and frame accounting explains every frame that is not where it should be.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod accounting;
pub mod app;
pub mod asr_worker;
pub mod cli;
pub mod counters;
pub mod error;
pub mod fleet;
pub mod gpu;
pub mod ingress;
pub mod lease_audit;
pub mod lease_worker;
pub mod llm;
pub mod naive;
pub mod plot;
pub mod producers;
pub mod report;
pub mod sample;
pub mod scenario;
pub mod speech;
pub mod stats;
pub mod timeliness;

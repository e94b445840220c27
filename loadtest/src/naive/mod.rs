//! The naive designs, faithful to the deployed shape, run beside weir's for comparison.
//!
//! - [`audio`]: a task per audio frame behind a per-stream semaphore of 3 publishes,
//!   no timeout, no byte or age bound — served as a separate process (the hidden
//!   `loadtest naive-ingress` subcommand) so that its RSS is its own.
//! - [`asr`]: the deployed recogniser — a wildcard subscriber with an unbounded RAM
//!   buffer per stream feeding the GPU model — in-process (`asr-shortfall`).
//! - [`llm`]: a task per LLM request message behind a semaphore of the backend's
//!   concurrency, no queue bound, no deadline check — in-process.

pub mod asr;
pub mod audio;
pub mod llm;

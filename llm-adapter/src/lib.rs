//! weir LLM adapter (work in progress).
#![forbid(unsafe_code)]

pub mod admission;
pub mod backend;
pub mod config;
pub mod metrics;
pub mod trace;

//! Wire helpers from `weir-protocol` for Python code that publishes or routes streams
//! itself (a producer of its own, a test): the one implementation of the rules, never a
//! copy in Python.

use std::num::NonZeroU32;

use pyo3::prelude::*;
use weir_protocol::partition::MAX_PARTITIONS;
use weir_protocol::{StreamId, partition_of as protocol_partition_of};

use crate::errors::WeirErr;

/// `weir.partition_of(stream_id, partitions)`: the partition a stream id belongs to
/// (`FNV-1a-32(stream_id) mod partitions`, docs/protocol.md), as the producer and the
/// consumer core compute it. `ConfigError` for an invalid stream id
/// (`invalid_stream_id`) or a partition count outside 1..=4096 (`invalid_config`).
#[pyfunction]
pub fn partition_of(stream_id: &str, partitions: i64) -> PyResult<u32> {
    let id = StreamId::parse(stream_id).map_err(|e| {
        WeirErr::config("invalid_stream_id", format!("stream id {stream_id:?}: {e}"))
            .with("key", "stream_id")
    })?;
    let count = u32::try_from(partitions)
        .ok()
        .filter(|n| *n <= MAX_PARTITIONS)
        .and_then(NonZeroU32::new)
        .ok_or_else(|| {
            WeirErr::config(
                "invalid_config",
                format!("partitions = {partitions}: 1..={MAX_PARTITIONS}"),
            )
            .with("key", "partitions")
        })?;
    Ok(protocol_partition_of(&id, count))
}

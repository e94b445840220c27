//! shutdown (being written).

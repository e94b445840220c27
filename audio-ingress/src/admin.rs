//! admin (being written).

//! ws (being written).

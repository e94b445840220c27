//! Audio packets (placeholder while the codec is written).

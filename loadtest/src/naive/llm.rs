//! The naive LLM front (placeholder until the LLM side is integrated).

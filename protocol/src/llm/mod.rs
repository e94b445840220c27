//! The LLM adapter's contract (owned by the llm-adapter work; placeholder).

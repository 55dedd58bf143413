//! Logging set-up: human or JSON, filtered by RUST_LOG.

//! The embedded pod store used when no cluster is configured.

//! Crash-safe lease persistence: one record per lease, atomic writes, quarantine of corrupt records.

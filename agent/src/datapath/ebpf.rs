//! Loads the embedded eBPF object, attaches it, and reads its ring buffer.

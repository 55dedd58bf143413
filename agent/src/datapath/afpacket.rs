//! AF_PACKET receive path with a classic BPF filter: the fallback when the eBPF program cannot attach.

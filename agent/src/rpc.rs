//! The agent-socket protocol shared by the daemon and the CNI shim.

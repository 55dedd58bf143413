//! Raw AF_PACKET sender opened inside the target network namespace.

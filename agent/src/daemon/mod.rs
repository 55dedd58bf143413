//! The agent daemon: socket API, lease tasks, recovery and shutdown.

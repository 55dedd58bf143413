//! `DHCPv6` client tests in virtual time against a small test server.

mod fuzz;
mod server;
mod timing;
mod transitions;

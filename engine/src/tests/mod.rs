//! Client tests in virtual time against a small test server.

mod interop;
mod malformed;
mod options;
mod prop;
mod server;
mod sim;
mod transitions;

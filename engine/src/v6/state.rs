//! Client states. RFC 8415 names no state machine; each state is named
//! after the exchange it waits on and cites the section that defines it.

use std::fmt;

/// Where the `DHCPv6` client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting out the random `SOL_MAX_DELAY` before the first SOLICIT
    /// (§18.2.1).
    Init,
    /// SOLICIT sent; collecting ADVERTISEs (§18.2.1, §18.2.9), or a REPLY
    /// with Rapid Commit.
    Soliciting,
    /// REQUEST sent to the chosen server (§18.2.2), or to the server that
    /// answered `NoBinding` (§18.2.10.1).
    Requesting,
    /// CONFIRM sent for a resumed lease (§18.2.3).
    Confirming,
    /// Lease held; T1 starts RENEWING (§18.2.4).
    Bound,
    /// RENEW sent to the leasing server (§18.2.4); T2 starts REBINDING.
    Renewing,
    /// REBIND sent to all servers (§18.2.5); the end of the valid lifetime
    /// loses the lease.
    Rebinding,
    /// RELEASE sent (§18.2.7); the address is no longer used.
    Releasing,
    /// DECLINE sent after duplicate address detection failed (§18.2.8).
    Declining,
    /// Released; the client is finished until restarted.
    Released,
    /// No lease within the acquisition deadline; idle until restarted.
    Failed,
}

impl State {
    /// Bounded label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            State::Init => "init",
            State::Soliciting => "soliciting",
            State::Requesting => "requesting",
            State::Confirming => "confirming",
            State::Bound => "bound",
            State::Renewing => "renewing",
            State::Rebinding => "rebinding",
            State::Releasing => "releasing",
            State::Declining => "declining",
            State::Released => "released",
            State::Failed => "failed",
        }
    }

    /// Whether an exchange is open and server messages are expected.
    pub fn expects_reply(self) -> bool {
        !matches!(
            self,
            State::Init | State::Bound | State::Released | State::Failed
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

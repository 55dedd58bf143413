//! Client states, named after RFC 2131 §4.4 (Figure 5).

use std::fmt;

/// Where the client is in the RFC 2131 state diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// INIT (RFC 2131 §4.4.1): no lease; waiting to send DHCPDISCOVER (after
    /// a NAK backoff, a DECLINE or an initial random delay).
    Init,
    /// SELECTING (§4.4.1): DHCPDISCOVER sent, waiting for the first valid
    /// DHCPOFFER.
    Selecting,
    /// REQUESTING (§4.4.1): DHCPREQUEST for the chosen offer sent (broadcast,
    /// with options 50 and 54), waiting for DHCPACK/DHCPNAK.
    Requesting,
    /// INIT-REBOOT (§4.4.2): knows an address from a previous lease; waiting
    /// to send DHCPREQUEST for it.
    InitReboot,
    /// REBOOTING (§4.4.2): DHCPREQUEST with option 50 broadcast, waiting for
    /// DHCPACK/DHCPNAK; silence falls back to INIT.
    Rebooting,
    /// BOUND (§4.4.1): lease held; T1 starts RENEWING.
    Bound,
    /// RENEWING (§4.4.5): DHCPREQUEST unicast to the leasing server from the
    /// leased address; T2 starts REBINDING.
    Renewing,
    /// REBINDING (§4.4.5): DHCPREQUEST broadcast to any server; expiry
    /// returns to INIT.
    Rebinding,
    /// DHCPRELEASE sent (§4.4.6); the client is finished.
    Released,
    /// The acquisition deadline passed without reaching BOUND; the client is
    /// idle until [`Client::restart`](crate::Client::restart).
    Failed,
}

impl State {
    /// Bounded label for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            State::Init => "init",
            State::Selecting => "selecting",
            State::Requesting => "requesting",
            State::InitReboot => "init-reboot",
            State::Rebooting => "rebooting",
            State::Bound => "bound",
            State::Renewing => "renewing",
            State::Rebinding => "rebinding",
            State::Released => "released",
            State::Failed => "failed",
        }
    }

    /// Whether the client holds a lease in this state.
    pub fn has_lease(self) -> bool {
        matches!(self, State::Bound | State::Renewing | State::Rebinding)
    }

    /// Whether a transaction (an xid) is open and replies are expected.
    pub fn expects_reply(self) -> bool {
        matches!(
            self,
            State::Selecting
                | State::Requesting
                | State::Rebooting
                | State::Renewing
                | State::Rebinding
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

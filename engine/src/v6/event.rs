//! What the `DHCPv6` client reports to its driver.

use std::time::Duration;

use dhcproto::v6::Status;

use super::lease::Lease;
use super::validate::DropReason;

/// Something the driver must act on (configure, log, persist).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A new lease.
    Bound(Lease),
    /// The lease was extended with the same address and configuration.
    Renewed(Lease),
    /// A renewal, rebind or re-request returned a different lease.
    Changed { old: Lease, new: Lease },
    /// The lease is gone; stop using the address.
    Lost { reason: LostReason },
    /// The RELEASE exchange ended (answered or retransmitted out).
    Released,
    /// No lease within the acquisition deadline.
    Failed(AcquireError),
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The valid lifetime ended (no answer to RENEW or REBIND).
    Expired,
    /// A server said the address is not on this link (§18.2.10.1).
    NotOnLink,
    /// A server listed the address with a valid lifetime of 0.
    Withdrawn,
    /// The server had no binding and the REQUEST for it went unanswered.
    NoBinding,
    /// The caller declined the address (duplicate address detection failed).
    Declined,
}

impl LostReason {
    /// Bounded label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::NotOnLink => "not_on_link",
            LostReason::Withdrawn => "withdrawn",
            LostReason::NoBinding => "no_binding",
            LostReason::Declined => "declined",
        }
    }
}

/// Why an acquisition failed: what was sent and what came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no DHCPv6 lease after {:.1}s: sent {solicits_sent} SOLICIT and {requests_sent} REQUEST; \
     heard {advertises} ADVERTISE, {dropped} invalid message(s){}",
    elapsed.as_secs_f64(),
    last_drop.map(|r| format!(" (last: {r})")).unwrap_or_default()
)]
pub struct AcquireError {
    pub elapsed: Duration,
    pub solicits_sent: u32,
    pub requests_sent: u32,
    /// Valid ADVERTISEs heard.
    pub advertises: u32,
    /// Messages for this client that were dropped.
    pub dropped: u64,
    pub last_drop: Option<DropReason>,
    /// The last non-success status a server sent.
    pub last_status: Option<Status>,
}

impl AcquireError {
    /// Bounded label summarising what was heard, for metrics.
    pub fn label(&self) -> &'static str {
        if self.last_status.is_some() {
            "status"
        } else if self.advertises > 0 {
            "no_reply"
        } else if self.dropped > 0 {
            "invalid_replies"
        } else {
            "no_advertise"
        }
    }
}

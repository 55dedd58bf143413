//! What the client reports to its driver.

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::lease::Lease;
use crate::validate::DropReason;

/// Something the driver must act on (configure, log, persist).
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "events are rare (one per lease change) and plain fields keep matching simple"
)]
pub enum Event {
    /// A new lease (from SELECTING/REQUESTING or REBOOTING).
    Bound(Lease),
    /// The lease was extended with the same configuration.
    Renewed(Lease),
    /// A renewal/rebind returned a different configuration.
    Changed { old: Lease, new: Lease },
    /// The lease is gone; stop using the address.
    Lost { reason: LostReason },
    /// A server refused the request (option 56 text, sanitised, if sent).
    Nak {
        server: Ipv4Addr,
        message: Option<String>,
    },
    /// No lease within the acquisition deadline.
    Failed(AcquireError),
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The lease time ran out in RENEWING/REBINDING (or before a resume).
    Expired,
    /// A server refused the renewal/rebind with DHCPNAK.
    Nak { server: Ipv4Addr },
    /// The caller declined the address.
    Declined,
}

impl LostReason {
    /// Bounded label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::Nak { .. } => "nak",
            LostReason::Declined => "declined",
        }
    }
}

/// An offer heard during an acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeardOffer {
    pub server: Ipv4Addr,
    pub address: Ipv4Addr,
}

/// A NAK heard during an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeardNak {
    pub server: Ipv4Addr,
    pub message: Option<String>,
}

/// Why acquisition failed: what was sent, to whom, and what came back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct AcquireError {
    /// Time from the start of the acquisition to the deadline.
    pub elapsed: Duration,
    pub discovers_sent: u32,
    pub requests_sent: u32,
    /// Servers a REQUEST was addressed to (option 54), in order; an
    /// INIT-REBOOT request is addressed to no server in particular.
    pub servers_requested: Vec<Ipv4Addr>,
    /// Valid offers heard (bounded to the first 16).
    pub offers: Vec<HeardOffer>,
    /// NAKs heard (bounded to the first 16).
    pub naks: Vec<HeardNak>,
    /// Replies for this client that were dropped as invalid.
    pub dropped: u64,
    /// The last reason a reply was dropped.
    pub last_drop: Option<DropReason>,
}

impl AcquireError {
    /// Whether nothing at all came back.
    pub fn heard_nothing(&self) -> bool {
        self.offers.is_empty() && self.naks.is_empty() && self.dropped == 0
    }

    /// What was heard, summarised: the first of NAKs, offers, invalid
    /// replies, or nothing.
    pub fn heard(&self) -> Heard {
        if !self.naks.is_empty() {
            Heard::Nak
        } else if !self.offers.is_empty() {
            Heard::OffersWithoutAck
        } else if self.dropped > 0 {
            Heard::InvalidReplies
        } else {
            Heard::Nothing
        }
    }

    /// Bounded label summarising what was heard, for metrics.
    pub fn label(&self) -> &'static str {
        match self.heard() {
            Heard::Nak => "nak",
            Heard::OffersWithoutAck => "no_ack",
            Heard::InvalidReplies => "invalid_replies",
            Heard::Nothing => "no_reply",
        }
    }
}

/// What a failed acquisition heard, summarised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// At least one DHCPNAK.
    Nak,
    /// Offers, but no ACK for the request that followed.
    OffersWithoutAck,
    /// Only replies that failed validation.
    InvalidReplies,
    /// Nothing at all.
    Nothing,
}

fn servers(list: impl Iterator<Item = Ipv4Addr>) -> String {
    let mut v: Vec<Ipv4Addr> = Vec::new();
    for s in list {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no DHCP lease after {:.1}s: sent {} DISCOVER and {} REQUEST",
            self.elapsed.as_secs_f64(),
            self.discovers_sent,
            self.requests_sent
        )?;
        if !self.servers_requested.is_empty() {
            write!(
                f,
                " (requested from {})",
                servers(self.servers_requested.iter().copied())
            )?;
        }
        if self.heard_nothing() {
            return f.write_str("; heard nothing");
        }
        f.write_str("; heard")?;
        let mut sep = " ";
        if !self.offers.is_empty() {
            write!(
                f,
                "{sep}{} offer(s) from {}",
                self.offers.len(),
                servers(self.offers.iter().map(|o| o.server))
            )?;
            sep = ", ";
        }
        if !self.naks.is_empty() {
            write!(
                f,
                "{sep}{} NAK(s) from {}",
                self.naks.len(),
                servers(self.naks.iter().map(|n| n.server))
            )?;
            if let Some(m) = self.naks.iter().rev().find_map(|n| n.message.as_deref()) {
                write!(f, " (last: {m:?})")?;
            }
            sep = ", ";
        }
        if self.dropped > 0 {
            write!(f, "{sep}{} invalid reply(ies)", self.dropped)?;
            if let Some(r) = self.last_drop {
                write!(f, " (last: {r})")?;
            }
        }
        Ok(())
    }
}

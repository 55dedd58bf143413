//! Counters exposed by the `DHCPv6` client (the driver turns them into
//! metrics).

use dhcproto::v6::Status;

use super::message::MessageKind;
use super::validate::DropReason;
use crate::tally::Tally;

/// Status codes counted one by one; any other lands in `other`.
const STATUSES: [Status; 6] = [
    Status::UnspecFail,
    Status::NoAddrsAvail,
    Status::NoBinding,
    Status::NotOnLink,
    Status::UseMulticast,
    Status::NoPrefixAvail,
];

/// Monotonic counters for one client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Transmissions that repeated an earlier message (same xid).
    pub retransmits: u64,
    pub advertises_received: u64,
    pub replies_received: u64,
    /// Leases obtained by SOLICIT/REQUEST or Rapid Commit.
    pub leases_bound: u64,
    /// Of `leases_bound`, through Rapid Commit.
    pub rapid_commits: u64,
    /// Successful RENEW/REBIND (or `NoBinding` → REQUEST) exchanges.
    pub renewals: u64,
    /// Of `renewals`, those answered to REBIND.
    pub rebinds: u64,
    pub expirations: u64,
    /// REQUEST exchanges that ran out of retransmissions.
    pub request_timeouts: u64,
    pub acquisitions_failed: u64,
    /// Optional options dropped from accepted messages because they were
    /// malformed.
    pub malformed_options: u64,
    /// Messages that could not be encoded (never expected).
    pub encode_errors: u64,
    sent: [u64; 7],
    dropped: Tally<DropReason, { DropReason::ALL.len() }>,
    statuses: [u64; STATUSES.len() + 1],
}

fn kind_index(k: MessageKind) -> usize {
    match k {
        MessageKind::Solicit => 0,
        MessageKind::Request => 1,
        MessageKind::Confirm => 2,
        MessageKind::Renew => 3,
        MessageKind::Rebind => 4,
        MessageKind::Release => 5,
        MessageKind::Decline => 6,
    }
}

impl ClientStats {
    pub(crate) fn count_sent(&mut self, kind: MessageKind) {
        self.sent[kind_index(kind)] += 1;
    }

    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        self.dropped.count(reason);
    }

    pub(crate) fn count_status(&mut self, status: Status) {
        let i = STATUSES
            .iter()
            .position(|s| *s == status)
            .unwrap_or(STATUSES.len());
        self.statuses[i] += 1;
    }

    /// Messages of `kind` sent, retransmissions included.
    pub fn sent(&self, kind: MessageKind) -> u64 {
        self.sent[kind_index(kind)]
    }

    /// Server messages dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get(reason)
    }

    /// All server messages dropped.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.total()
    }

    /// Non-zero drop counters by reason.
    pub fn dropped_by_reason(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        self.dropped.nonzero()
    }

    /// Times `status` was received (top level or in our IA). Only the six
    /// statuses a client acts on are counted by name; 0 for any other (see
    /// [`ClientStats::status_other`]).
    pub fn status(&self, status: Status) -> u64 {
        STATUSES
            .iter()
            .position(|s| *s == status)
            .map_or(0, |i| self.statuses[i])
    }

    /// Non-success status codes other than the six counted by name.
    pub fn status_other(&self) -> u64 {
        self.statuses[STATUSES.len()]
    }
}

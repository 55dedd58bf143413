//! Counters exposed by the client (the driver turns them into metrics).

use crate::lease::LeaseOption;
use crate::tally::Tally;
use crate::validate::DropReason;

/// Monotonic counters for one client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub discovers_sent: u64,
    pub requests_sent: u64,
    pub declines_sent: u64,
    pub releases_sent: u64,
    /// Transmissions that repeated an earlier message (same xid).
    pub retransmits: u64,
    pub offers_received: u64,
    pub acks_received: u64,
    pub naks_received: u64,
    /// Leases obtained from SELECTING/REQUESTING or REBOOTING.
    pub leases_bound: u64,
    /// Successful RENEWING/REBINDING exchanges.
    pub renewals: u64,
    /// Of `renewals`, those that completed in REBINDING.
    pub rebinds: u64,
    pub expirations: u64,
    /// REBOOTING gave up on the old address (silence) and went to INIT.
    pub reboot_fallbacks: u64,
    /// REQUESTING got no answer and restarted from INIT.
    pub request_timeouts: u64,
    pub acquisitions_failed: u64,
    /// T1/T2 missing in an ACK (defaults used).
    pub lease_times_missing: u64,
    /// T1/T2 zero in an ACK (defaults used).
    pub lease_times_zero: u64,
    /// T1 ≥ T2 or T2 ≥ lease time in an ACK (corrected).
    pub lease_times_inconsistent: u64,
    /// ACKs whose lease time was below [`crate::lease::MIN_LEASE_SECS`]
    /// (raised to it).
    pub lease_times_raised: u64,
    /// ACKs without option 1 (classful prefix used).
    pub subnet_mask_missing: u64,
    /// ACKs whose option 3 was ignored because option 121 was present.
    pub routers_ignored_for_121: u64,
    /// Routes refused by the route policy (`TunnelVision`, protected prefixes,
    /// count limit, default route).
    pub routes_rejected: u64,
    /// Stored leases whose fields had to be repaired on resume.
    pub stored_lease_repairs: u64,
    /// Messages that could not be encoded (never expected).
    pub encode_errors: u64,
    dropped: Tally<DropReason, { DropReason::ALL.len() }>,
    malformed: Tally<LeaseOption, { LeaseOption::ALL.len() }>,
}

impl ClientStats {
    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        self.dropped.count(reason);
    }

    pub(crate) fn count_malformed(&mut self, option: LeaseOption) {
        self.malformed.count(option);
    }

    /// Times `option` was dropped from an accepted OFFER or ACK because it
    /// was malformed (the lease went ahead without it).
    pub fn malformed(&self, option: LeaseOption) -> u64 {
        self.malformed.get(option)
    }

    /// Malformed optional options dropped, all options together.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.total()
    }

    /// Non-zero malformed-option counters by option.
    pub fn malformed_by_option(&self) -> impl Iterator<Item = (LeaseOption, u64)> + '_ {
        self.malformed.nonzero()
    }

    /// Replies dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get(reason)
    }

    /// All replies dropped.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.total()
    }

    /// Non-zero drop counters by reason.
    pub fn dropped_by_reason(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        self.dropped.nonzero()
    }
}

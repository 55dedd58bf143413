//! `DHCPv6` client configuration: the DUID and IAID, the retransmission
//! parameters of RFC 8415 §7.6, and what to do with a resumed lease.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// DUID type codes (RFC 8415 §11.1).
const DUID_LLT: u16 = 1;
const DUID_LL: u16 = 3;
/// Hardware type Ethernet (IANA ARP hardware types), as in `DUID-LL`/LLT.
const HTYPE_ETHERNET: u16 = 1;
/// Longest DUID: 2 octets of type and at most 128 of identifier (RFC 8415 §11.1).
pub const MAX_DUID_LEN: usize = 130;

/// How the client identifies itself (the Client Identifier option, RFC 8415
/// §21.2, carries this DUID in every message; servers key bindings on it and
/// the IAID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DuidKind {
    /// `DUID-LL` (type 3, RFC 8415 §11.4) from the workload's MAC — the
    /// default. It holds nothing but the MAC, so the same workload presents
    /// the same DUID after an agent restart, on another node after a
    /// migration, and from any agent that manages it: the server sees one
    /// client and keeps its binding. (`DUID-LLT` would carry the time the DUID
    /// was first made, which an agent cannot know for a workload it did not
    /// create; `DUID-EN` and `DUID-UUID` would need state kept somewhere.)
    #[default]
    LinkLayer,
    /// `DUID-LLT` (type 1, RFC 8415 §11.2): the MAC with the given time
    /// (seconds since 2000-01-01 UTC, mod 2^32), for networks whose servers
    /// expect it. The caller keeps `time` stable.
    LinkLayerTime { time: u32 },
    /// `DUID-EN` (type 2, RFC 8415 §11.3): enterprise number and identifier.
    Enterprise { enterprise: u32, id: Vec<u8> },
    /// A DUID given whole (type included), sent as-is.
    Raw(Vec<u8>),
}

impl DuidKind {
    /// The DUID octets for a workload with MAC `mac`.
    ///
    /// DUIDs are opaque octet strings to dhcproto (`ClientId(Vec<u8>)`);
    /// its `Duid` helpers take an IPv6 address where the link-layer types
    /// want a MAC, so the two fixed layouts are written here.
    pub fn bytes(&self, mac: [u8; 6]) -> Vec<u8> {
        match self {
            DuidKind::LinkLayer => {
                let mut v = Vec::with_capacity(10);
                v.extend_from_slice(&DUID_LL.to_be_bytes());
                v.extend_from_slice(&HTYPE_ETHERNET.to_be_bytes());
                v.extend_from_slice(&mac);
                v
            }
            DuidKind::LinkLayerTime { time } => {
                let mut v = Vec::with_capacity(14);
                v.extend_from_slice(&DUID_LLT.to_be_bytes());
                v.extend_from_slice(&HTYPE_ETHERNET.to_be_bytes());
                v.extend_from_slice(&time.to_be_bytes());
                v.extend_from_slice(&mac);
                v
            }
            DuidKind::Enterprise { enterprise, id } => {
                dhcproto::v6::duid::Duid::enterprise(*enterprise, id)
                    .as_ref()
                    .to_vec()
            }
            DuidKind::Raw(b) => b.clone(),
        }
    }
}

/// The IAID of the one `IA_NA` of an attachment (RFC 8415 §12: unique per
/// IA type among the client's IAs and stable across restarts).
///
/// Default: the low 32 bits of the workload's MAC (octets 2..6, big
/// endian). Each attachment has its own MAC, so the IAID differs between
/// attachments of one workload, and it is the same after an agent restart or
/// a migration without anything stored. An explicit value overrides it.
pub fn iaid_from_mac(mac: [u8; 6]) -> u32 {
    u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]])
}

/// Retransmission parameters of one message type (RFC 8415 §15): initial
/// retransmission time, maximum retransmission time, maximum retransmission
/// count and maximum retransmission duration (zero = no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    pub irt: Duration,
    pub mrt: Duration,
    pub mrc: u32,
    pub mrd: Duration,
}

impl Timing {
    const fn secs(irt: u64, mrt: u64, mrc: u32, mrd: u64) -> Timing {
        Timing {
            irt: Duration::from_secs(irt),
            mrt: Duration::from_secs(mrt),
            mrc,
            mrd: Duration::from_secs(mrd),
        }
    }
}

/// Transmission and retransmission parameters, defaults from RFC 8415 §7.6.
/// For RENEW the duration limit is the time left until T2 and for REBIND the
/// time left until the valid lifetime ends (§18.2.4, §18.2.5), whatever
/// `mrd` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Timeouts {
    /// `SOL_MAX_DELAY`: the first SOLICIT waits a uniform random time in
    /// `[0, sol_max_delay]` (§18.2.1). Default 1 s; 0 sends at once.
    pub sol_max_delay: Duration,
    /// `SOL_TIMEOUT` 1 s, `SOL_MAX_RT` 3600 s, no count or duration limit.
    pub solicit: Timing,
    /// `REQ_TIMEOUT` 1 s, `REQ_MAX_RT` 30 s, `REQ_MAX_RC` 10.
    pub request: Timing,
    /// `CNF_TIMEOUT` 1 s, `CNF_MAX_RT` 4 s, `CNF_MAX_RD` 10 s.
    pub confirm: Timing,
    /// `REN_TIMEOUT` 10 s, `REN_MAX_RT` 600 s.
    pub renew: Timing,
    /// `REB_TIMEOUT` 10 s, `REB_MAX_RT` 600 s.
    pub rebind: Timing,
    /// `REL_TIMEOUT` 1 s, `REL_MAX_RC` 4.
    pub release: Timing,
    /// `DEC_TIMEOUT` 1 s, `DEC_MAX_RC` 4.
    pub decline: Timing,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            sol_max_delay: Duration::from_secs(1),
            solicit: Timing::secs(1, 3600, 0, 0),
            request: Timing::secs(1, 30, 10, 0),
            confirm: Timing::secs(1, 4, 0, 10),
            renew: Timing::secs(10, 600, 0, 0),
            rebind: Timing::secs(10, 600, 0, 0),
            release: Timing::secs(1, 0, 4, 0),
            decline: Timing::secs(1, 0, 4, 0),
        }
    }
}

/// What [`Client::resume`](super::Client::resume) does first with a lease
/// that is still valid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResumeMode {
    /// REBIND at once (RFC 8415 §18.2.5) — the default. An agent restart
    /// does not move the workload, but the agent cannot know what the server
    /// did while it was away: REBIND asks any server to confirm *and* extend
    /// the binding in one exchange, a server that lost it answers `NoBinding`
    /// (then the client REQUESTs it again), and its duration limit is the end
    /// of the valid lifetime, so an unreachable server costs nothing before
    /// the lease would have ended anyway.
    #[default]
    Rebind,
    /// CONFIRM (RFC 8415 §18.2.3): asks only whether the address is still on
    /// link. Success keeps the stored lease and its timers, `NotOnLink`
    /// restarts from SOLICIT, and silence for `CNF_MAX_RD` keeps the lease
    /// (§18.2.3: "the client SHOULD continue to use" it). Lifetimes are not
    /// extended; the next RENEW does that at T1.
    Confirm,
}

/// Everything the `DHCPv6` client needs. `Default` gives the documented
/// defaults with an all-zero MAC the caller must set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientConfig {
    /// The workload's MAC on this attachment (DUID and default IAID).
    pub mac: [u8; 6],
    /// DUID type. Default `DUID-LL` from `mac`.
    pub duid: DuidKind,
    /// IAID of the `IA_NA`; default [`iaid_from_mac`].
    pub iaid: Option<u32>,
    /// Put Rapid Commit (RFC 8415 §21.14) on SOLICIT: a server that
    /// supports it answers with a REPLY and the lease is bound in two
    /// messages. Default off (the NAD enables it).
    pub rapid_commit: bool,
    /// Options asked for in the Option Request option (§21.7). Default DNS
    /// servers (23) and domain search list (24).
    pub request_options: Vec<u16>,
    /// Retransmission parameters.
    pub timeouts: Timeouts,
    /// Deadline to reach a lease from the first SOLICIT; `None` retries
    /// forever, as RFC 8415 has SOLICIT do. Default 30 s (a CNI ADD waits).
    pub acquire_timeout: Option<Duration>,
    /// First exchange for a resumed, still-valid lease.
    pub resume: ResumeMode,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            mac: [0; 6],
            duid: DuidKind::LinkLayer,
            iaid: None,
            rapid_commit: false,
            request_options: vec![23, 24],
            timeouts: Timeouts::default(),
            acquire_timeout: Some(Duration::from_secs(30)),
            resume: ResumeMode::Rebind,
        }
    }
}

/// A configuration the client cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("mac {0:02x?} is not a unicast MAC address")]
    BadMac([u8; 6]),
    #[error("DUID must be 3..={MAX_DUID_LEN} bytes, got {len}")]
    BadDuid { len: usize },
    #[error("timeouts.{field}.irt must be non-zero")]
    ZeroIrt { field: &'static str },
    #[error("acquire_timeout must be non-zero")]
    ZeroAcquireTimeout,
}

impl ClientConfig {
    /// The DUID sent in the Client Identifier option.
    pub fn client_duid(&self) -> Vec<u8> {
        self.duid.bytes(self.mac)
    }

    /// The IAID of the `IA_NA`.
    pub fn client_iaid(&self) -> u32 {
        self.iaid.unwrap_or_else(|| iaid_from_mac(self.mac))
    }

    /// Check the configuration; [`Client::new`](super::Client::new) clamps
    /// instead of failing, so call this first for user input.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.mac == [0; 6] || self.mac[0] & 1 == 1 {
            return Err(ConfigError::BadMac(self.mac));
        }
        let len = self.client_duid().len();
        if !(3..=MAX_DUID_LEN).contains(&len) {
            return Err(ConfigError::BadDuid { len });
        }
        let t = &self.timeouts;
        for (field, timing) in [
            ("solicit", t.solicit),
            ("request", t.request),
            ("confirm", t.confirm),
            ("renew", t.renew),
            ("rebind", t.rebind),
            ("release", t.release),
            ("decline", t.decline),
        ] {
            if timing.irt.is_zero() {
                return Err(ConfigError::ZeroIrt { field });
            }
        }
        if self.acquire_timeout.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::ZeroAcquireTimeout);
        }
        Ok(())
    }

    /// Clamp values so the engine never spins: IRTs of at least 10 ms, a
    /// DUID the wire can carry.
    pub(crate) fn normalize(&mut self) {
        let floor = Duration::from_millis(10);
        let t = &mut self.timeouts;
        for timing in [
            &mut t.solicit,
            &mut t.request,
            &mut t.confirm,
            &mut t.renew,
            &mut t.rebind,
            &mut t.release,
            &mut t.decline,
        ] {
            timing.irt = timing.irt.max(floor);
        }
        if let Some(d) = &mut self.acquire_timeout {
            *d = (*d).max(floor);
        }
        if !(3..=MAX_DUID_LEN).contains(&self.client_duid().len()) {
            self.duid = DuidKind::LinkLayer;
        }
        self.request_options.truncate(64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x42, 0xac, 0x11, 0x00, 0x07];

    #[test]
    fn duid_ll_is_type_3_ethernet_and_the_mac() {
        assert_eq!(
            DuidKind::LinkLayer.bytes(MAC),
            [0, 3, 0, 1, 0x02, 0x42, 0xac, 0x11, 0x00, 0x07]
        );
        assert_eq!(
            DuidKind::LinkLayerTime { time: 0x0102_0304 }.bytes(MAC),
            [0, 1, 0, 1, 1, 2, 3, 4, 0x02, 0x42, 0xac, 0x11, 0x00, 0x07]
        );
        assert_eq!(
            DuidKind::Enterprise {
                enterprise: 32473,
                id: vec![9, 9]
            }
            .bytes(MAC),
            [0, 2, 0, 0, 0x7e, 0xd9, 9, 9]
        );
        assert_eq!(DuidKind::Raw(vec![0, 4, 1]).bytes(MAC), [0, 4, 1]);
    }

    #[test]
    fn iaid_is_the_low_32_bits_of_the_mac_unless_set() {
        let mut c = ClientConfig {
            mac: MAC,
            ..ClientConfig::default()
        };
        assert_eq!(c.client_iaid(), 0xac11_0007);
        c.iaid = Some(7);
        assert_eq!(c.client_iaid(), 7);
    }

    #[test]
    fn defaults_are_rfc_8415_section_7_6() {
        let t = Timeouts::default();
        let s = Duration::from_secs;
        assert_eq!(t.sol_max_delay, s(1));
        assert_eq!(
            (t.solicit.irt, t.solicit.mrt, t.solicit.mrc),
            (s(1), s(3600), 0)
        );
        assert_eq!(
            (t.request.irt, t.request.mrt, t.request.mrc),
            (s(1), s(30), 10)
        );
        assert_eq!(
            (t.confirm.irt, t.confirm.mrt, t.confirm.mrd),
            (s(1), s(4), s(10))
        );
        assert_eq!((t.renew.irt, t.renew.mrt), (s(10), s(600)));
        assert_eq!((t.rebind.irt, t.rebind.mrt), (s(10), s(600)));
        assert_eq!((t.release.irt, t.release.mrc), (s(1), 4));
        assert_eq!((t.decline.irt, t.decline.mrc), (s(1), 4));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = ClientConfig::default();
        assert_eq!(c.validate(), Err(ConfigError::BadMac([0; 6])));
        c.mac = MAC;
        assert_eq!(c.validate(), Ok(()));
        c.duid = DuidKind::Raw(vec![1]);
        assert_eq!(c.validate(), Err(ConfigError::BadDuid { len: 1 }));
        c.normalize();
        assert_eq!(c.duid, DuidKind::LinkLayer);
        c.timeouts.renew.irt = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::ZeroIrt { field: "renew" }));
    }
}

//! Client configuration: every timeout and retry count, the options sent,
//! the route policy; each default is documented on its field.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::routes::RoutePolicy;

/// Option 61 client identifier (RFC 2132 §9.14).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientId {
    /// Type 1 (Ethernet) followed by `chaddr` — the default.
    #[default]
    Mac,
    /// Raw bytes, sent as-is (first byte is the type). Must be 2..=255 bytes.
    Raw(Vec<u8>),
    /// Do not send option 61.
    None,
}

impl ClientId {
    /// The option payload for `chaddr`, if any.
    pub fn bytes(&self, chaddr: [u8; 6]) -> Option<Vec<u8>> {
        match self {
            ClientId::Mac => {
                let mut v = Vec::with_capacity(7);
                v.push(1);
                v.extend_from_slice(&chaddr);
                Some(v)
            }
            ClientId::Raw(b) => Some(b.clone()),
            ClientId::None => None,
        }
    }
}

/// Retransmission and retry parameters.
///
/// RFC 2131 §4.1: the first retransmission after 4 s, doubling up to 64 s, each
/// randomised by ±1 s. §4.4.5: in RENEWING/REBINDING wait half the remaining
/// time to T2/expiry, at least 60 s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Retransmit {
    /// First retransmission delay. Default 4 s.
    pub initial: Duration,
    /// Cap on the doubled delay. Default 64 s.
    pub max_interval: Duration,
    /// Uniform randomisation added to every delay, in `[-jitter, +jitter]`.
    /// Default 1 s. The result never drops below half the base delay.
    pub jitter: Duration,
    /// REQUEST transmissions in REQUESTING before falling back to INIT
    /// (RFC 2131 §4.4.1). Default 4.
    pub request_attempts: u32,
    /// REQUEST transmissions in REBOOTING before falling back to INIT (RFC
    /// 2131 §3.2 step 4 lets the client give up on the old address). Default 2.
    pub reboot_attempts: u32,
    /// Minimum retransmission interval in RENEWING/REBINDING (RFC 2131
    /// §4.4.5). Default 60 s.
    pub renew_min_interval: Duration,
    /// Delay before DISCOVER after a second consecutive NAK; it doubles with
    /// each further NAK up to `nak_backoff_max`, randomised to 50–100 %. The
    /// first NAK restarts at once (RFC 2131 §3.1 step 5). Default 50 ms:
    /// two NAKs in a row are most often clients colliding on an address a
    /// server without conflict detection offered to both, and a server that
    /// NAKs everything is still slowed to the cap within a few seconds.
    pub nak_backoff_initial: Duration,
    /// Cap for the NAK backoff. Default 4 s.
    pub nak_backoff_max: Duration,
    /// Wait after sending DHCPDECLINE before restarting (RFC 2131 §3.1 step
    /// 5: at least ten seconds). Default 10 s.
    pub decline_delay: Duration,
    /// Random delay before the very first DISCOVER, uniform in
    /// `[0, init_delay_max]` (RFC 2131 §4.4.1 suggests 1–10 s to desynchronise
    /// a cold start; pods want their address at once). Default 0.
    pub init_delay_max: Duration,
    /// T1 is moved earlier by a uniform random amount up to this share of
    /// T1, in per mille (RFC 2131 §4.4.5: T1 and T2 "SHOULD be chosen with
    /// some random 'fuzz' around a fixed value, to avoid synchronization of
    /// client reacquisition"). Only earlier, never later: the server's T1 is
    /// when it expects the renewal, and renewing early costs one message.
    /// Default 50 (up to 5 % early; 90 s of a 30-minute T1). 0 renews at
    /// exactly T1; values above 500 are taken as 500.
    pub renew_fuzz_permille: u32,
}

impl Default for Retransmit {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(4),
            max_interval: Duration::from_secs(64),
            jitter: Duration::from_secs(1),
            request_attempts: 4,
            reboot_attempts: 2,
            renew_min_interval: Duration::from_mins(1),
            nak_backoff_initial: Duration::from_millis(50),
            nak_backoff_max: Duration::from_secs(4),
            decline_delay: Duration::from_secs(10),
            init_delay_max: Duration::ZERO,
            renew_fuzz_permille: 50,
        }
    }
}

/// What the client does once BOUND.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Renew at T1, rebind at T2, reacquire on expiry, forever (pods).
    #[default]
    Maintain,
    /// Stop at BOUND: no timers afterwards (VMs run their own client).
    OneShot,
}

/// What [`Client::resume`](crate::Client::resume) does with an expired lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpiredLeasePolicy {
    /// INIT-REBOOT asking for the old address (RFC 2131 §3.2). Default.
    #[default]
    Reboot,
    /// Start over in INIT (DISCOVER, with the old address as a hint).
    Discover,
}

/// Everything the client needs. All fields public; `Default` gives the
/// documented defaults (with an all-zero `chaddr` the caller must set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientConfig {
    /// Hardware address (sent in `chaddr`, checked in every reply).
    pub chaddr: [u8; 6],
    /// Option 61. Default type 1 + MAC.
    pub client_id: ClientId,
    /// Option 12 (the pod name). Default none.
    pub hostname: Option<String>,
    /// Start in INIT-REBOOT asking for this address (restart, VM migration).
    pub requested_ip: Option<Ipv4Addr>,
    /// With `requested_ip`: the server whose offer of that address an
    /// earlier client's REQUEST accepted (a client stopped with its REQUEST
    /// out, whose successor asks again). That server may have committed the
    /// lease, so a client released before any answer gives the address back
    /// to it (see [`crate::Client::release`]).
    pub requested_from: Option<Ipv4Addr>,
    /// Retransmission parameters.
    pub retransmit: Retransmit,
    /// Overall deadline to reach BOUND from INIT/INIT-REBOOT. Default 30 s.
    pub acquire_timeout: Duration,
    /// DISCOVER transmissions in one SELECTING before the acquisition fails
    /// early (like the upstream plugin's `-resendmax`); 0 = unlimited,
    /// bounded by `acquire_timeout` only. Default 0. (Here rather than in
    /// [`Retransmit`], which callers may build field by field.)
    pub discover_attempts: u32,
    /// Option 121/3 policy.
    pub route_policy: RoutePolicy,
    /// Maintain the lease or stop at BOUND.
    pub mode: Mode,
    /// Option 57. Default 1500 (values below 576 are raised to 576).
    pub max_message_size: u16,
    /// Set the BROADCAST flag in DISCOVER/REQUEST so servers broadcast
    /// replies. Default `false`: xdhcp captures replies at layer 2, so the
    /// unicast reply to `yiaddr`/`chaddr` reaches it without an address.
    pub broadcast_flag: bool,
    /// Policy for expired leases on resume. Default INIT-REBOOT.
    pub expired_lease: ExpiredLeasePolicy,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            chaddr: [0; 6],
            client_id: ClientId::Mac,
            hostname: None,
            requested_ip: None,
            requested_from: None,
            retransmit: Retransmit::default(),
            acquire_timeout: Duration::from_secs(30),
            discover_attempts: 0,
            route_policy: RoutePolicy::default(),
            mode: Mode::Maintain,
            max_message_size: 1500,
            broadcast_flag: false,
            expired_lease: ExpiredLeasePolicy::Reboot,
        }
    }
}

/// A configuration the client cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("chaddr {0:02x?} is not a unicast MAC address")]
    BadChaddr([u8; 6]),
    #[error("client id must be 2..=255 bytes, got {len}")]
    BadClientId { len: usize },
    #[error("hostname must be 1..=255 bytes, got {len}")]
    BadHostname { len: usize },
    #[error("requested address {0} is not a unicast address")]
    BadRequestedIp(Ipv4Addr),
    #[error("retransmit.{field} must be non-zero")]
    ZeroInterval { field: &'static str },
    #[error("retransmit.max_interval ({max:?}) is below retransmit.initial ({initial:?})")]
    CapBelowInitial { initial: Duration, max: Duration },
    #[error("acquire_timeout must be non-zero")]
    ZeroAcquireTimeout,
}

impl ClientConfig {
    /// Check the configuration. [`Client::new`](crate::Client::new) never
    /// fails: it applies the same rules by clamping, so call this first when
    /// the configuration comes from a user.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.chaddr == [0; 6] || self.chaddr[0] & 1 == 1 {
            return Err(ConfigError::BadChaddr(self.chaddr));
        }
        if let ClientId::Raw(b) = &self.client_id
            && !(2..=255).contains(&b.len())
        {
            return Err(ConfigError::BadClientId { len: b.len() });
        }
        if let Some(h) = &self.hostname
            && !(1..=255).contains(&h.len())
        {
            return Err(ConfigError::BadHostname { len: h.len() });
        }
        if let Some(ip) = self.requested_ip
            && !crate::validate::is_unicast(ip)
        {
            return Err(ConfigError::BadRequestedIp(ip));
        }
        let r = &self.retransmit;
        if r.initial.is_zero() {
            return Err(ConfigError::ZeroInterval { field: "initial" });
        }
        if r.max_interval < r.initial {
            return Err(ConfigError::CapBelowInitial {
                initial: r.initial,
                max: r.max_interval,
            });
        }
        if r.renew_min_interval.is_zero() {
            return Err(ConfigError::ZeroInterval {
                field: "renew_min_interval",
            });
        }
        if self.acquire_timeout.is_zero() {
            return Err(ConfigError::ZeroAcquireTimeout);
        }
        Ok(())
    }

    /// Clamp values so the engine never spins or sends malformed options.
    pub(crate) fn normalize(&mut self) {
        let r = &mut self.retransmit;
        r.initial = r.initial.max(Duration::from_millis(10));
        r.max_interval = r.max_interval.max(r.initial);
        r.renew_min_interval = r.renew_min_interval.max(Duration::from_millis(10));
        r.request_attempts = r.request_attempts.max(1);
        r.reboot_attempts = r.reboot_attempts.max(1);
        r.nak_backoff_max = r.nak_backoff_max.max(r.nak_backoff_initial);
        self.acquire_timeout = self.acquire_timeout.max(Duration::from_millis(10));
        self.max_message_size = self.max_message_size.max(576);
        if let ClientId::Raw(b) = &mut self.client_id {
            if b.len() < 2 {
                self.client_id = ClientId::Mac;
            } else {
                b.truncate(255);
            }
        }
        if let Some(h) = &mut self.hostname {
            if h.is_empty() {
                self.hostname = None;
            } else if h.len() > 255 {
                let mut cut = 255;
                while !h.is_char_boundary(cut) {
                    cut -= 1;
                }
                h.truncate(cut);
            }
        }
        if self
            .requested_ip
            .is_some_and(|ip| !crate::validate::is_unicast(ip))
        {
            self.requested_ip = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = ClientConfig::default();
        assert_eq!(c.acquire_timeout, Duration::from_secs(30));
        assert_eq!(c.retransmit.initial, Duration::from_secs(4));
        assert_eq!(c.retransmit.max_interval, Duration::from_secs(64));
        assert_eq!(c.retransmit.jitter, Duration::from_secs(1));
        assert_eq!(c.retransmit.renew_min_interval, Duration::from_mins(1));
        assert_eq!(c.retransmit.nak_backoff_initial, Duration::from_millis(50));
        assert_eq!(c.retransmit.nak_backoff_max, Duration::from_secs(4));
        assert_eq!(c.max_message_size, 1500);
        assert_eq!(
            c.client_id.bytes([2, 0, 0, 0, 0, 1]).unwrap(),
            [1, 2, 0, 0, 0, 0, 1]
        );
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = ClientConfig::default();
        assert_eq!(c.validate(), Err(ConfigError::BadChaddr([0; 6])));
        c.chaddr = [2, 0, 0, 0, 0, 1];
        assert_eq!(c.validate(), Ok(()));
        c.hostname = Some(String::new());
        assert_eq!(c.validate(), Err(ConfigError::BadHostname { len: 0 }));
        c.hostname = Some("pod".into());
        c.retransmit.max_interval = Duration::from_secs(1);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::CapBelowInitial { .. })
        ));
        c.retransmit.max_interval = Duration::from_secs(64);
        c.client_id = ClientId::Raw(vec![1]);
        assert_eq!(c.validate(), Err(ConfigError::BadClientId { len: 1 }));
        c.normalize();
        assert_eq!(c.client_id, ClientId::Mac);
        c.hostname = Some("é".repeat(200));
        c.normalize();
        assert!(c.hostname.as_ref().unwrap().len() <= 255);
    }
}

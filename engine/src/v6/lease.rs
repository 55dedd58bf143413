//! The `DHCPv6` lease: one address of the attachment's `IA_NA`, its lifetimes
//! and T1/T2 (RFC 8415 §21.4, §21.6), and how they come out of a REPLY.

use std::net::Ipv6Addr;
use std::time::Duration;

use dhcproto::v6::{DhcpOption, IANA, Status};
use serde::{Deserialize, Serialize};

use super::validate::{self, DropReason};

/// 0xffffffff: an infinite lifetime or T1/T2 (RFC 8415 §7.7).
pub const INFINITY: u32 = u32::MAX;

/// A lease on one address, everything the driver needs to configure,
/// persist and renew it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub address: Ipv6Addr,
    /// IAID of the `IA_NA` the address came in.
    pub iaid: u32,
    /// The server's DUID (Server Identifier), used to RENEW with it.
    pub server_id: Vec<u8>,
    /// Server Unicast address (§21.12), if the server allows unicast.
    pub server_unicast: Option<Ipv6Addr>,
    /// Preferred and valid lifetimes, seconds ([`INFINITY`] = forever).
    pub preferred_secs: u32,
    pub valid_secs: u32,
    /// T1 and T2 in effect, seconds, after the RFC defaults for 0.
    pub t1_secs: u32,
    pub t2_secs: u32,
    pub dns_servers: Vec<Ipv6Addr>,
    pub domain_search: Vec<String>,
    /// Wall-clock time (Unix ms) the exchange that got the lease started;
    /// lifetimes count from it.
    pub acquired_unix_ms: u64,
    /// Where the REPLY that bound or last extended the lease came from, as
    /// the client's link saw it: the server, or on a relayed network the
    /// relay agent that forwarded it (RFC 8415 §19.2). `None` in leases
    /// recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_source: Option<Source>,
}

/// The sender of a REPLY on the client's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    /// Its IPv6 source address (the server's, or the relay agent's on
    /// this link; a link-local one as a rule).
    pub ip: Ipv6Addr,
    /// Its Ethernet source, when the receive path saw the frame (`None`
    /// from a UDP socket, which hides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<[u8; 6]>,
}

impl Source {
    /// The sender `ip`, with the Ethernet source `mac` if it is one a
    /// station sends from (not zero, broadcast or multicast: a driver
    /// without link-layer information).
    pub fn new(ip: Ipv6Addr, mac: Option<[u8; 6]>) -> Self {
        Self {
            ip,
            mac: mac.filter(|m| *m != [0; 6] && m[0] & 1 == 0),
        }
    }
}

impl Lease {
    pub fn is_infinite(&self) -> bool {
        self.valid_secs == INFINITY
    }

    /// Same address and configuration (not the times).
    pub fn same_config(&self, other: &Lease) -> bool {
        self.address == other.address
            && self.server_id == other.server_id
            && self.dns_servers == other.dns_servers
            && self.domain_search == other.domain_search
    }
}

/// `secs` as a duration, `None` for infinity.
pub fn finite(secs: u32) -> Option<Duration> {
    (secs != INFINITY).then(|| Duration::from_secs(u64::from(secs)))
}

/// One address of an `IA_NA`, as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IaAddress {
    pub address: Ipv6Addr,
    pub preferred: u32,
    pub valid: u32,
}

/// What an `IA_NA` says, after RFC 8415's discard rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IaView {
    pub t1: u32,
    pub t2: u32,
    /// Status Code inside the IA; `None` is Success.
    pub status: Option<Status>,
    /// Addresses with preferred ≤ valid (others are discarded, §21.6).
    pub addresses: Vec<IaAddress>,
}

impl IaView {
    /// Read an `IA_NA`. `None` when T1 > T2 with both non-zero: §21.4 has the
    /// client discard the `IA_NA` as though it had not been sent.
    pub fn of(ia: &IANA) -> Option<IaView> {
        if ia.t1 > ia.t2 && ia.t2 != 0 {
            return None;
        }
        let mut status = None;
        let mut addresses = Vec::new();
        for opt in ia.opts.iter() {
            match opt {
                DhcpOption::StatusCode(s) if status.is_none() => status = Some(s.status),
                DhcpOption::IAAddr(a) if a.preferred_life <= a.valid_life => {
                    addresses.push(IaAddress {
                        address: a.addr,
                        preferred: a.preferred_life,
                        valid: a.valid_life,
                    });
                }
                _ => {}
            }
        }
        Some(IaView {
            t1: ia.t1,
            t2: ia.t2,
            status: status.filter(|s| *s != Status::Success),
            addresses,
        })
    }

    /// The address to hold: `prefer` if it is offered with a non-zero valid
    /// lifetime, else the first usable one.
    pub fn pick(&self, prefer: Option<Ipv6Addr>) -> Option<IaAddress> {
        let usable = |a: &&IaAddress| a.valid != 0 && validate::is_usable(a.address);
        self.addresses
            .iter()
            .filter(usable)
            .find(|a| Some(a.address) == prefer)
            .or_else(|| self.addresses.iter().find(usable))
            .copied()
    }

    /// Whether `address` is listed with a valid lifetime of 0 (the server
    /// withdraws it, §18.2.10.1).
    pub fn withdraws(&self, address: Ipv6Addr) -> bool {
        self.addresses
            .iter()
            .any(|a| a.address == address && a.valid == 0)
    }
}

/// T1 and T2 in effect: the server's values, or for 0 the RFC 8415 §14.2
/// recommendation of 0.5 and 0.8 times the preferred lifetime; T1 never
/// above T2 and neither above the valid lifetime.
pub fn effective_times(t1: u32, t2: u32, preferred: u32, valid: u32) -> (u32, u32) {
    let of_pref = |num: u64, den: u64| {
        if preferred == INFINITY {
            INFINITY
        } else {
            (u64::from(preferred) * num / den) as u32
        }
    };
    let t1 = if t1 == 0 { of_pref(1, 2) } else { t1 };
    let t2 = if t2 == 0 { of_pref(4, 5) } else { t2 };
    let t2 = t2.min(valid);
    (t1.min(t2), t2)
}

/// Build the lease for `addr` from a message that carried it.
pub fn build(
    msg: &validate::ServerMessage,
    view: &IaView,
    iaid: u32,
    addr: IaAddress,
    acquired_unix_ms: u64,
) -> Result<Lease, DropReason> {
    let server_id = msg.server_id.clone().ok_or(DropReason::MissingServerId)?;
    let (t1, t2) = effective_times(view.t1, view.t2, addr.preferred, addr.valid);
    Ok(Lease {
        address: addr.address,
        iaid,
        server_id,
        server_unicast: msg.server_unicast.filter(|a| validate::is_usable(*a)),
        preferred_secs: addr.preferred,
        valid_secs: addr.valid,
        t1_secs: t1,
        t2_secs: t2,
        dns_servers: msg.dns_servers.clone(),
        domain_search: msg.domain_search.clone(),
        acquired_unix_ms,
        server_source: None,
    })
}

#[cfg(test)]
mod tests {
    use dhcproto::v6::{DhcpOptions, IAAddr, StatusCode};

    use super::*;

    fn addr(s: &str, preferred: u32, valid: u32) -> DhcpOption {
        DhcpOption::IAAddr(IAAddr {
            addr: s.parse().unwrap(),
            preferred_life: preferred,
            valid_life: valid,
            opts: DhcpOptions::new(),
        })
    }

    #[test]
    fn zero_t1_t2_default_to_half_and_four_fifths_of_preferred() {
        assert_eq!(effective_times(0, 0, 1000, 2000), (500, 800));
        assert_eq!(effective_times(300, 0, 1000, 2000), (300, 800));
        assert_eq!(
            effective_times(0, 0, INFINITY, INFINITY),
            (INFINITY, INFINITY)
        );
        // T2 never beyond the valid lifetime, T1 never beyond T2.
        assert_eq!(effective_times(900, 1900, 1000, 1200), (900, 1200));
        assert_eq!(effective_times(0, 100, 1000, 2000), (100, 100));
    }

    #[test]
    fn a_lease_survives_a_json_round_trip() {
        let l = Lease {
            address: "2001:db8::1".parse().unwrap(),
            iaid: 7,
            server_id: vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 1],
            server_unicast: Some("2001:db8::547".parse().unwrap()),
            preferred_secs: 100,
            valid_secs: INFINITY,
            t1_secs: 50,
            t2_secs: 80,
            dns_servers: vec!["2001:db8::53".parse().unwrap()],
            domain_search: vec!["example.com".into()],
            acquired_unix_ms: 1,
            server_source: Some(Source::new(
                "fe80::547".parse().unwrap(),
                Some([2, 0, 0, 0, 5, 0x47]),
            )),
        };
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Lease>(&json).unwrap(), l);
        assert!(l.is_infinite());
        assert_eq!(finite(INFINITY), None);
    }

    #[test]
    fn t1_above_t2_discards_the_ia() {
        let ia = IANA {
            id: 1,
            t1: 100,
            t2: 50,
            opts: DhcpOptions::new(),
        };
        assert_eq!(IaView::of(&ia), None);
        let ia = IANA { t2: 0, ..ia };
        assert!(IaView::of(&ia).is_some(), "T2 = 0 is 'client chooses'");
    }

    #[test]
    fn addresses_with_preferred_above_valid_are_discarded_and_pick_prefers_ours() {
        let ia = IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: [
                addr("2001:db8::1", 200, 100),
                addr("2001:db8::2", 50, 100),
                addr("2001:db8::3", 50, 100),
                addr("fe80::4", 50, 100),
                DhcpOption::StatusCode(StatusCode {
                    status: Status::Success,
                    msg: String::new(),
                }),
            ]
            .into_iter()
            .collect(),
        };
        let v = IaView::of(&ia).unwrap();
        assert_eq!(v.status, None, "Success is no status");
        assert_eq!(v.addresses.len(), 3);
        assert_eq!(
            v.pick(None).unwrap().address,
            "2001:db8::2".parse::<Ipv6Addr>().unwrap()
        );
        let three = "2001:db8::3".parse().unwrap();
        assert_eq!(v.pick(Some(three)).unwrap().address, three);
        let ll = "fe80::4".parse().unwrap();
        assert_ne!(
            v.pick(Some(ll)).unwrap().address,
            ll,
            "link-local is never leased"
        );
    }
}

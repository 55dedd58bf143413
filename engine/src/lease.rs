//! The lease and its extraction from a validated reply.
//!
//! A reply is refused only for what a lease cannot exist without: the
//! message type and server identifier (checked in `validate.rs`), a usable
//! `yiaddr` and a usable lease time (option 51). Every other option xdhcp
//! reads is optional: when it is malformed it is dropped as if the server had
//! not sent it, reported as a [`MalformedOption`] and counted per option
//! ([`LeaseOption`]), and the lease proceeds. Option 121 replaces option 3
//! (RFC 3442 §2); a dropped option 121 falls back to option 3, as when it is
//! absent. `docs/dhcp-options.md` lists what "malformed" means per option.
//!
//! One thing: a validated reply made into a lease (about 680 lines of code,
//! one option parser per option; the rest is its tests).

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::routes::{self, Option121Error, RejectedRoute, Route, RoutePolicy};
use crate::tally::Counted;
use crate::validate::{DropReason, Reply, is_unicast, mask_to_prefix};

/// Lease time value meaning "infinite" (RFC 2132 §9.2).
pub const INFINITE_SECS: u64 = 0xffff_ffff;

/// The shortest lease the client keeps, in seconds: a shorter option 51 is
/// raised to it, and its T1 and T2 are then the defaults of the raised
/// lease (the server's described a lease that no longer holds). RFC 2131
/// sets no floor; dhcpcd raises a lease below 20 s to 20 s the same way
/// (`DHCP_MIN_LEASE`), and systemd-networkd and ell refuse one below 10 s.
/// Without a floor a 1 s lease renews, and rewrites its record, twice a
/// second.
pub const MIN_LEASE_SECS: u64 = 20;

/// A DHCP lease. Serialisable so a driver can persist it and resume it after
/// a restart ([`crate::Client::resume`]); times are
/// stored as whole seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// `yiaddr` of the ACK.
    pub address: Ipv4Addr,
    /// From option 1; classful default when the server sent none.
    pub prefix_len: u8,
    /// Option 54 of the ACK.
    pub server_id: Ipv4Addr,
    /// Source MAC of the ACK: the server, or the relay/router that is the
    /// next hop towards it. Used to unicast RENEW and RELEASE.
    pub server_mac: Option<[u8; 6]>,
    /// Option 3, only when no well-formed option 121 was sent (RFC 3442; a
    /// malformed one is dropped) and the route policy allows a default route.
    pub routers: Vec<Ipv4Addr>,
    /// Option 121 routes accepted by the route policy.
    pub routes: Vec<Route>,
    /// Option 6.
    pub dns_servers: Vec<Ipv4Addr>,
    /// Option 15.
    pub domain_name: Option<String>,
    /// Option 119 (RFC 3397).
    pub search: Vec<String>,
    /// Option 26.
    pub mtu: Option<u16>,
    /// Option 51. `INFINITE_SECS` seconds means infinite.
    #[serde(with = "secs")]
    pub lease_time: Duration,
    /// Renewal time T1 (option 58 or 50 % of the lease).
    #[serde(with = "secs")]
    pub t1: Duration,
    /// Rebinding time T2 (option 59 or 87.5 % of the lease).
    #[serde(with = "secs")]
    pub t2: Duration,
    /// Wall-clock time (Unix ms) the lease times count from: when the
    /// REQUEST that obtained the ACK was first sent (RFC 2131 §4.4.1).
    pub acquired_unix_ms: u64,
    /// Routes the policy refused (for logging by the driver).
    #[serde(default)]
    pub rejected_routes: Vec<RejectedRoute>,
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

impl Lease {
    /// Whether the lease never expires (option 51 = 0xffffffff).
    pub fn is_infinite(&self) -> bool {
        self.lease_time.as_secs() >= INFINITE_SECS
    }

    /// Wall-clock expiry (Unix ms); `None` for an infinite lease.
    pub fn expires_unix_ms(&self) -> Option<u64> {
        (!self.is_infinite()).then(|| {
            self.acquired_unix_ms
                .saturating_add(self.lease_time.as_millis().min(u128::from(u64::MAX)) as u64)
        })
    }

    /// The default gateway: the `0.0.0.0/0` route of option 121 when present,
    /// else the first router of option 3.
    pub fn default_gateway(&self) -> Option<Ipv4Addr> {
        self.routes
            .iter()
            .find(|r| r.is_default())
            .map(|r| r.gateway)
            .or_else(|| self.routers.first().copied())
    }

    /// Subnet mask for `prefix_len`.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(routes::mask(self.prefix_len))
    }

    /// Same configuration, ignoring times, acquisition time and server MAC:
    /// a renewal that returns an equal lease is [`Event::Renewed`](crate::Event),
    /// otherwise [`Event::Changed`](crate::Event).
    pub fn same_config(&self, other: &Lease) -> bool {
        self.address == other.address
            && self.prefix_len == other.prefix_len
            && self.server_id == other.server_id
            && self.routers == other.routers
            && self.routes == other.routes
            && self.dns_servers == other.dns_servers
            && self.domain_name == other.domain_name
            && self.search == other.search
            && self.mtu == other.mtu
    }

    /// Bring a lease read from storage back into the invariants the engine
    /// relies on (`prefix_len <= 32`, `0 < t1 < t2 < lease_time`, non-zero
    /// lease). Returns how many fields were repaired.
    pub(crate) fn sanitize(&mut self) -> u32 {
        let mut fixed = 0;
        if self.prefix_len > 32 {
            self.prefix_len = classful_prefix(self.address);
            fixed += 1;
        }
        if self.lease_time.is_zero() {
            // A zero lease is never produced by the engine: treat as expired.
            fixed += 1;
        }
        let (t1, t2, notes) = times(
            self.lease_time.as_secs(),
            Some(self.t1.as_secs()),
            Some(self.t2.as_secs()),
        );
        if notes.zero + notes.inconsistent > 0 {
            fixed += 1;
        }
        self.t1 = t1;
        self.t2 = t2;
        fixed
    }
}

/// Things noticed while extracting a lease, counted by the client once the
/// lease is accepted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseNotes {
    /// T1 and/or T2 absent → defaults used.
    pub times_missing: u32,
    /// T1 or T2 zero → defaults used.
    pub times_zero: u32,
    /// T1 ≥ T2 or T2 ≥ lease → corrected.
    pub times_inconsistent: u32,
    /// Lease time below [`MIN_LEASE_SECS`] → raised to it.
    pub lease_time_raised: bool,
    /// Option 1 missing → classful prefix length used.
    pub mask_missing: bool,
    /// Option 3 ignored because option 121 was present.
    pub routers_ignored_for_121: bool,
    /// Optional options dropped because malformed, in option-code order.
    pub malformed: Vec<MalformedOption>,
}

/// An optional option xdhcp reads from an OFFER or ACK. When malformed it is
/// dropped (the lease is built as if it were absent) and counted under this
/// option; it never refuses the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseOption {
    /// Option 1 (RFC 2132 §3.3): absent or dropped → classful prefix length.
    SubnetMask,
    /// Option 3 (RFC 2132 §3.5).
    Router,
    /// Option 6 (RFC 2132 §3.8).
    DomainNameServer,
    /// Option 15 (RFC 2132 §3.17).
    DomainName,
    /// Option 26 (RFC 2132 §5.1).
    InterfaceMtu,
    /// Option 58, T1 (RFC 2132 §9.11): dropped → 50 % of the lease.
    RenewalTime,
    /// Option 59, T2 (RFC 2132 §9.12): dropped → 87.5 % of the lease.
    RebindingTime,
    /// Option 119 (RFC 3397).
    DomainSearch,
    /// Option 121 (RFC 3442): dropped → option 3, as when absent.
    ClasslessStaticRoute,
}

impl LeaseOption {
    /// Every optional option, in option-code (and counter) order.
    pub const ALL: [LeaseOption; 9] = [
        LeaseOption::SubnetMask,
        LeaseOption::Router,
        LeaseOption::DomainNameServer,
        LeaseOption::DomainName,
        LeaseOption::InterfaceMtu,
        LeaseOption::RenewalTime,
        LeaseOption::RebindingTime,
        LeaseOption::DomainSearch,
        LeaseOption::ClasslessStaticRoute,
    ];

    /// The DHCP option code.
    pub fn code(self) -> u8 {
        match self {
            LeaseOption::SubnetMask => 1,
            LeaseOption::Router => 3,
            LeaseOption::DomainNameServer => 6,
            LeaseOption::DomainName => 15,
            LeaseOption::InterfaceMtu => 26,
            LeaseOption::RenewalTime => 58,
            LeaseOption::RebindingTime => 59,
            LeaseOption::DomainSearch => 119,
            LeaseOption::ClasslessStaticRoute => 121,
        }
    }

    /// Bounded, stable label for metrics and structured logs: the option
    /// code in decimal.
    pub fn label(self) -> &'static str {
        match self {
            LeaseOption::SubnetMask => "1",
            LeaseOption::Router => "3",
            LeaseOption::DomainNameServer => "6",
            LeaseOption::DomainName => "15",
            LeaseOption::InterfaceMtu => "26",
            LeaseOption::RenewalTime => "58",
            LeaseOption::RebindingTime => "59",
            LeaseOption::DomainSearch => "119",
            LeaseOption::ClasslessStaticRoute => "121",
        }
    }
}

impl Counted for LeaseOption {
    const ALL: &'static [LeaseOption] = &LeaseOption::ALL;
}

impl fmt::Display for LeaseOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "option {}", self.code())
    }
}

/// What was wrong with a dropped option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformation {
    /// A length the option's type does not allow (a fixed-size value of
    /// another size, an address list that is empty or not a multiple of 4).
    Length { len: usize },
    /// A subnet mask whose one bits are not contiguous, or 0.0.0.0.
    Mask,
    /// An address list with an entry that is not a usable unicast address.
    NotUnicast,
    /// An MTU below the minimum of 68 octets (RFC 2132 §5.1).
    MtuTooSmall { mtu: u16 },
    /// Not a valid DNS name (or list of names): a character outside letters,
    /// digits, `-` and `_`, an empty or over-long label, a bad compression
    /// pointer.
    Name,
    /// Option 121 that cannot be decoded as a whole.
    Routes(Option121Error),
}

impl fmt::Display for Malformation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformation::Length { len } => write!(f, "length {len} is not valid for it"),
            Malformation::Mask => f.write_str("not a contiguous non-zero mask"),
            Malformation::NotUnicast => f.write_str("an address is not unicast"),
            Malformation::MtuTooSmall { mtu } => write!(f, "MTU {mtu} is below 68"),
            Malformation::Name => f.write_str("not a valid DNS name"),
            Malformation::Routes(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// An optional option dropped from a reply because it was malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedOption {
    pub option: LeaseOption,
    pub problem: Malformation,
}

impl fmt::Display for MalformedOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} dropped: {}", self.option, self.problem)
    }
}

struct TimeNotes {
    missing: u32,
    zero: u32,
    inconsistent: u32,
}

/// Compute T1/T2 (RFC 2131 §4.4.5): defaults 0.5 and 0.875 of the lease;
/// zero or inconsistent values are replaced by defaults. When T2 is valid but
/// the default T1 would not be below it, T1 = T2 × 4/7 (the default ratio).
fn times(lease: u64, t1: Option<u64>, t2: Option<u64>) -> (Duration, Duration, TimeNotes) {
    let mut notes = TimeNotes {
        missing: 0,
        zero: 0,
        inconsistent: 0,
    };
    if lease >= INFINITE_SECS {
        let inf = Duration::from_secs(INFINITE_SECS);
        return (inf, inf, notes);
    }
    // Integer arithmetic in milliseconds keeps sub-second precision for tiny
    // test leases while staying exact for whole seconds.
    let lease_ms = lease * 1000;
    let def_t2 = lease_ms * 7 / 8;
    let t2_ms = match t2 {
        None => {
            notes.missing += 1;
            def_t2
        }
        Some(0) => {
            notes.zero += 1;
            def_t2
        }
        Some(v) if v >= lease => {
            notes.inconsistent += 1;
            def_t2
        }
        Some(v) => v * 1000,
    };
    let def_t1 = if lease_ms / 2 < t2_ms {
        lease_ms / 2
    } else {
        t2_ms * 4 / 7
    };
    let t1_ms = match t1 {
        None => {
            notes.missing += 1;
            def_t1
        }
        Some(0) => {
            notes.zero += 1;
            def_t1
        }
        // Saturating: a stored T1 (`Lease::sanitize`) may be any u64.
        Some(v) if v.saturating_mul(1000) >= t2_ms => {
            notes.inconsistent += 1;
            def_t1
        }
        Some(v) => v * 1000,
    };
    (
        Duration::from_millis(t1_ms),
        Duration::from_millis(t2_ms),
        notes,
    )
}

/// Classful prefix length for an address (used when option 1 is absent, as
/// systemd-networkd does).
pub fn classful_prefix(addr: Ipv4Addr) -> u8 {
    match addr.octets()[0] {
        0..=127 => 8,
        128..=191 => 16,
        _ => 24,
    }
}

/// Option 51: required, exactly 4 octets.
fn lease_time(reply: &Reply) -> Result<u64, DropReason> {
    match reply.options.get(&51).map(Vec::as_slice) {
        None => Err(DropReason::MissingLeaseTime),
        Some(&[a, b, c, d]) => Ok(u64::from(u32::from_be_bytes([a, b, c, d]))),
        Some(_) => Err(DropReason::BadLeaseTime),
    }
}

/// Option 58 or 59: optional; any length but 4 drops it.
fn optional_time(reply: &Reply, option: LeaseOption, notes: &mut LeaseNotes) -> Option<u64> {
    match reply.options.get(&option.code()).map(Vec::as_slice) {
        None => None,
        Some(&[a, b, c, d]) => Some(u64::from(u32::from_be_bytes([a, b, c, d]))),
        Some(other) => {
            notes.drop_option(option, Malformation::Length { len: other.len() });
            None
        }
    }
}

impl LeaseNotes {
    fn drop_option(&mut self, option: LeaseOption, problem: Malformation) {
        self.malformed.push(MalformedOption { option, problem });
    }
}

fn ip_list(data: &[u8]) -> Option<Vec<Ipv4Addr>> {
    if data.is_empty() || !data.len().is_multiple_of(4) {
        return None;
    }
    Some(
        data.chunks_exact(4)
            .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]))
            .collect(),
    )
}

/// A DNS name as allowed in resolv.conf: LDH labels (plus `_`), each 1..=63
/// octets, total ≤ 253. A trailing dot is dropped.
fn valid_domain(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Decode RFC 1035 names with compression (RFC 3397 option 119). Pointers
/// must point strictly backwards, which bounds the work and rules out loops.
pub fn parse_domain_search(data: &[u8]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let mut labels: Vec<String> = Vec::new();
        let mut pos = i;
        let mut end_of_name = None;
        let mut limit = pos;
        let mut total = 0usize;
        loop {
            let len = *data.get(pos)?;
            match len {
                0 => {
                    end_of_name.get_or_insert(pos + 1);
                    break;
                }
                1..=63 => {
                    let label = data.get(pos + 1..pos + 1 + usize::from(len))?;
                    total += label.len() + 1;
                    if total > 254 {
                        return None;
                    }
                    labels.push(std::str::from_utf8(label).ok()?.to_owned());
                    pos += 1 + usize::from(len);
                }
                0xc0..=0xff => {
                    let lo = *data.get(pos + 1)?;
                    let target = (usize::from(len & 0x3f) << 8) | usize::from(lo);
                    end_of_name.get_or_insert(pos + 2);
                    if target >= limit {
                        return None;
                    }
                    limit = target;
                    pos = target;
                }
                _ => return None,
            }
        }
        i = end_of_name?;
        let name = labels.join(".");
        if !valid_domain(&name) {
            return None;
        }
        names.push(name);
    }
    Some(names)
}

/// Extract a lease from a validated OFFER or ACK; `acquired_unix_ms` becomes
/// [`Lease::acquired_unix_ms`].
///
/// Fails only on what a lease cannot exist without: an unusable `yiaddr`
/// (not unicast, the server's own address, or the network/broadcast address
/// of its subnet) or an unusable lease time (option 51 absent, not 4 octets,
/// or zero). A malformed optional option is dropped and listed in
/// [`LeaseNotes::malformed`]; routes the policy refuses are listed in
/// [`Lease::rejected_routes`].
pub fn from_reply(
    reply: &Reply,
    server_id: Ipv4Addr,
    policy: &RoutePolicy,
    acquired_unix_ms: u64,
) -> Result<(Lease, LeaseNotes), DropReason> {
    let mut notes = LeaseNotes::default();
    let address = reply.yiaddr;
    if !is_unicast(address) || address == server_id {
        return Err(DropReason::BadAddress);
    }
    let lease_secs = lease_time(reply)?;
    if lease_secs == 0 {
        return Err(DropReason::ZeroLeaseTime);
    }
    let mut t1 = optional_time(reply, LeaseOption::RenewalTime, &mut notes);
    let mut t2 = optional_time(reply, LeaseOption::RebindingTime, &mut notes);
    let lease_secs = if lease_secs < MIN_LEASE_SECS {
        notes.lease_time_raised = true;
        (t1, t2) = (None, None);
        MIN_LEASE_SECS
    } else {
        lease_secs
    };
    let (t1, t2, tn) = times(lease_secs, t1, t2);
    // A raised lease's defaults are the floor's, not missing times.
    if !notes.lease_time_raised {
        notes.times_missing = tn.missing;
        notes.times_zero = tn.zero;
        notes.times_inconsistent = tn.inconsistent;
    }

    let prefix_len = subnet_prefix(reply, address, &mut notes);
    // The subnet's own network or broadcast address is never a host address
    // (point-to-point /31 and host /32 have neither).
    if prefix_len <= 30 {
        let host = u32::from(address) & !routes::mask(prefix_len);
        if host == 0 || host == !routes::mask(prefix_len) {
            return Err(DropReason::BadAddress);
        }
    }

    let mut all_routes = None;
    if let Some(data) = reply.options.get(&121) {
        match routes::parse_option121(data) {
            Ok(list) => all_routes = Some(list),
            Err(e) => notes.drop_option(LeaseOption::ClasslessStaticRoute, Malformation::Routes(e)),
        }
    }
    let mut routers = Vec::new();
    if all_routes.is_some() {
        notes.routers_ignored_for_121 = reply.options.contains_key(&3);
    } else if let Some(data) = reply.options.get(&3) {
        match ip_list(data) {
            Some(list) => routers = list,
            None => notes.drop_option(
                LeaseOption::Router,
                Malformation::Length { len: data.len() },
            ),
        }
    }
    let (routes, mut rejected_routes) = policy.apply(all_routes.unwrap_or_default());
    // Option 3 is a default route: subject to the same policy.
    if let Some(first) = routers.first().copied() {
        let implied = Route {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            gateway: first,
        };
        if let Err(reason) = policy.check(&implied) {
            rejected_routes.push(RejectedRoute {
                route: implied,
                reason,
            });
            routers.clear();
        } else {
            routers.retain(|r| is_unicast(*r));
        }
    }

    let info = informative(reply, &mut notes);
    notes.malformed.sort_by_key(|m| m.option);
    Ok((
        Lease {
            address,
            prefix_len,
            server_id,
            server_mac: None,
            routers,
            routes,
            dns_servers: info.dns_servers,
            domain_name: info.domain_name,
            search: info.search,
            mtu: info.mtu,
            lease_time: Duration::from_secs(lease_secs),
            t1,
            t2,
            acquired_unix_ms,
            rejected_routes,
        },
        notes,
    ))
}

/// Option 1 as a prefix length; absent or malformed → the classful prefix
/// length of `address` (as systemd-networkd does).
fn subnet_prefix(reply: &Reply, address: Ipv4Addr, notes: &mut LeaseNotes) -> u8 {
    let problem = match reply.options.get(&1).map(Vec::as_slice) {
        None => {
            notes.mask_missing = true;
            return classful_prefix(address);
        }
        Some(&[m0, m1, m2, m3]) => match mask_to_prefix([m0, m1, m2, m3]) {
            Some(len) if (1..=32).contains(&len) => return len,
            _ => Malformation::Mask,
        },
        Some(other) => Malformation::Length { len: other.len() },
    };
    notes.drop_option(LeaseOption::SubnetMask, problem);
    classful_prefix(address)
}

struct Informative {
    dns_servers: Vec<Ipv4Addr>,
    domain_name: Option<String>,
    search: Vec<String>,
    mtu: Option<u16>,
}

/// Options 6, 15, 119 and 26: each dropped on its own when malformed.
fn informative(reply: &Reply, notes: &mut LeaseNotes) -> Informative {
    let dns_servers = match reply.options.get(&6) {
        None => Vec::new(),
        Some(d) => match ip_list(d) {
            Some(list) if list.iter().all(|ip| is_unicast(*ip)) => list,
            Some(_) => {
                notes.drop_option(LeaseOption::DomainNameServer, Malformation::NotUnicast);
                Vec::new()
            }
            None => {
                notes.drop_option(
                    LeaseOption::DomainNameServer,
                    Malformation::Length { len: d.len() },
                );
                Vec::new()
            }
        },
    };
    let domain_name = reply.options.get(&15).and_then(|d| {
        let s = String::from_utf8_lossy(d);
        let s = s.trim_end_matches('\0');
        if valid_domain(s) {
            Some(s.strip_suffix('.').unwrap_or(s).to_owned())
        } else {
            notes.drop_option(LeaseOption::DomainName, Malformation::Name);
            None
        }
    });
    let search = match reply.options.get(&119) {
        None => Vec::new(),
        Some(d) => parse_domain_search(d).unwrap_or_else(|| {
            notes.drop_option(LeaseOption::DomainSearch, Malformation::Name);
            Vec::new()
        }),
    };
    let mtu = match reply.options.get(&26).map(Vec::as_slice) {
        None => None,
        Some(&[a, b]) => {
            let mtu = u16::from_be_bytes([a, b]);
            // RFC 2132 §5.1: minimum 68.
            if mtu >= 68 {
                Some(mtu)
            } else {
                notes.drop_option(LeaseOption::InterfaceMtu, Malformation::MtuTooSmall { mtu });
                None
            }
        }
        Some(other) => {
            notes.drop_option(
                LeaseOption::InterfaceMtu,
                Malformation::Length { len: other.len() },
            );
            None
        }
    };

    Informative {
        dns_servers,
        domain_name,
        search,
        mtu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn t1_t2_defaults_and_corrections() {
        let (t1, t2, n) = times(3600, None, None);
        assert_eq!((t1, t2, n.missing), (d(1800), d(3150), 2));
        let (t1, t2, n) = times(3600, Some(100), Some(200));
        assert_eq!(
            (t1, t2, n.missing + n.zero + n.inconsistent),
            (d(100), d(200), 0)
        );
        let (t1, t2, n) = times(3600, Some(0), Some(0));
        assert_eq!((t1, t2, n.zero), (d(1800), d(3150), 2));
        // T2 ≥ lease → default T2; T1 ≥ T2 → default T1.
        let (t1, t2, n) = times(3600, Some(3000), Some(3600));
        assert_eq!((t1, t2, n.inconsistent), (d(3000), d(3150), 1));
        let (t1, t2, n) = times(3600, Some(3200), Some(3000));
        assert_eq!((t1, t2, n.inconsistent), (d(1800), d(3000), 1));
        // Valid small T2 below lease/2: T1 keeps the default ratio.
        let (t1, t2, _) = times(3600, None, Some(700));
        assert_eq!((t1, t2), (d(400), d(700)));
        assert!(t1 < t2);
        // Tiny leases keep T1 < T2 < lease.
        let (t1, t2, _) = times(1, None, None);
        assert_eq!(
            (t1, t2),
            (Duration::from_millis(500), Duration::from_millis(875))
        );
        let (t1, t2, _) = times(INFINITE_SECS, Some(5), Some(6));
        assert_eq!((t1, t2), (d(INFINITE_SECS), d(INFINITE_SECS)));
    }

    /// A lease shorter than the floor is raised to it, with the floor's
    /// default T1 and T2 (the server's 2 s and 4 s described the 6 s lease);
    /// a lease at the floor keeps the server's times.
    #[test]
    fn a_tiny_lease_is_raised_to_the_floor() {
        let reply = |secs: u32| Reply {
            xid: 1,
            secs: 0,
            flags: 0,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::new(192, 0, 2, 10),
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            chaddr: [2, 0, 0, 0, 0, 1],
            options: [
                (1, vec![255, 255, 255, 0]),
                (51, secs.to_be_bytes().to_vec()),
                (58, 2u32.to_be_bytes().to_vec()),
                (59, 4u32.to_be_bytes().to_vec()),
            ]
            .into(),
        };
        let server = Ipv4Addr::new(192, 0, 2, 1);
        let policy = RoutePolicy::default();
        for secs in [1, 6, 19] {
            let (l, n) = from_reply(&reply(secs), server, &policy, 0).unwrap();
            assert_eq!(l.lease_time, d(MIN_LEASE_SECS), "{secs} s");
            assert_eq!((l.t1, l.t2), (d(10), Duration::from_millis(17_500)));
            assert!(n.lease_time_raised);
            assert_eq!(n.times_missing + n.times_zero + n.times_inconsistent, 0);
        }
        let (l, n) = from_reply(&reply(20), server, &policy, 0).unwrap();
        assert_eq!((l.lease_time, l.t1, l.t2), (d(20), d(2), d(4)));
        assert!(!n.lease_time_raised);
    }

    #[test]
    fn masks() {
        assert_eq!(mask_to_prefix([255, 255, 255, 0]), Some(24));
        assert_eq!(mask_to_prefix([255, 255, 255, 255]), Some(32));
        assert_eq!(mask_to_prefix([0, 0, 0, 0]), Some(0));
        assert_eq!(mask_to_prefix([255, 0, 255, 0]), None);
        assert_eq!(mask_to_prefix([255, 255, 255, 254]), Some(31));
    }

    #[test]
    fn domain_search_with_compression() {
        // "eng.example.com", "example.com" (pointer to offset 4), "x.example.com"
        let data = [
            3, b'e', b'n', b'g', 7, b'e', b'x', b'a', b'm', b'p', b'l', b'e', 3, b'c', b'o', b'm',
            0, 0xc0, 4, 1, b'x', 0xc0, 4,
        ];
        assert_eq!(
            parse_domain_search(&data).unwrap(),
            vec!["eng.example.com", "example.com", "x.example.com"]
        );
        // Forward / self pointers and truncation are rejected.
        assert_eq!(parse_domain_search(&[0xc0, 0]), None);
        assert_eq!(parse_domain_search(&[1, b'a', 0xc0, 0]), None);
        assert_eq!(parse_domain_search(&[3, b'a', b'b']), None);
        assert_eq!(parse_domain_search(&[1, b'\n', 0]), None);
        assert_eq!(parse_domain_search(&[0x80, 0]), None);
    }

    #[test]
    fn domain_validation() {
        assert!(valid_domain("example.com"));
        assert!(valid_domain("example.com."));
        assert!(!valid_domain("exa mple.com"));
        assert!(!valid_domain("a..b"));
        assert!(!valid_domain("evil\nnameserver 6.6.6.6"));
        assert!(!valid_domain(""));
    }

    #[test]
    fn sanitize_repairs_stored_times() {
        let mut l = Lease {
            address: Ipv4Addr::new(192, 0, 2, 10),
            prefix_len: 40,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: None,
            routers: vec![],
            routes: vec![],
            dns_servers: vec![],
            domain_name: None,
            search: vec![],
            mtu: None,
            lease_time: d(100),
            t1: d(90),
            t2: d(80),
            acquired_unix_ms: 0,
            rejected_routes: vec![],
        };
        assert!(l.sanitize() >= 2);
        assert_eq!(l.prefix_len, 24);
        assert!(l.t1 < l.t2 && l.t2 < l.lease_time);
    }

    /// Fuzzing finding (target `lease_record`): a stored record with a T1 of
    /// more than `u64::MAX / 1000` seconds overflowed the millisecond
    /// conversion while resuming (a panic with overflow checks, a wrapped T1
    /// without).
    #[test]
    fn sanitize_survives_huge_stored_times() {
        let mut l = Lease {
            address: Ipv4Addr::new(192, 0, 2, 10),
            prefix_len: 24,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: None,
            routers: vec![],
            routes: vec![],
            dns_servers: vec![],
            domain_name: None,
            search: vec![],
            mtu: None,
            lease_time: d(3600),
            t1: Duration::from_secs(u64::MAX),
            t2: Duration::from_secs(u64::MAX / 999),
            acquired_unix_ms: 0,
            rejected_routes: vec![],
        };
        assert!(l.sanitize() >= 1);
        assert_eq!((l.t1, l.t2), (d(1800), d(3150)));
    }

    #[test]
    fn lease_serde_round_trip_uses_seconds() {
        let l = Lease {
            address: Ipv4Addr::new(192, 0, 2, 10),
            prefix_len: 24,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: Some([2, 0, 0, 0, 0, 1]),
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes: vec![],
            dns_servers: vec![Ipv4Addr::new(192, 0, 2, 53)],
            domain_name: Some("example.com".into()),
            search: vec!["example.com".into()],
            mtu: Some(1400),
            lease_time: d(3600),
            t1: d(1800),
            t2: d(3150),
            acquired_unix_ms: 1_700_000_000_000,
            rejected_routes: vec![],
        };
        let json = serde_json::to_string(&l).unwrap();
        assert!(json.contains("\"lease_time\":3600"), "{json}");
        let back: Lease = serde_json::from_str(&json).unwrap();
        assert_eq!(back, l);
    }
}

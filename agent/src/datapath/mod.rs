//! The DHCP packet path: capture of server replies (eBPF ring buffer, or
//! AF_PACKET as the fallback) and the raw-socket sender.
//!
//! Both receive paths yield [`RxFrame`]. Replies are demultiplexed to lease
//! tasks by xid, never by ifindex alone (ifindexes repeat across namespaces).

pub mod afpacket;
pub(crate) mod capture;
pub mod ebpf;
pub mod frame;
pub(crate) mod icmp6;
pub(crate) mod link;
pub(crate) mod port;
pub mod rawsock;
pub(crate) mod udp6;

use std::fmt;
use std::str::FromStr;

/// What the kernel program decided for a captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The frame continued up the stack (observe mode, or xid not owned).
    Pass,
    /// The frame was dropped after capture (intercept mode, owned xid).
    Drop,
}

/// Which receive path produced a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RxPath {
    /// The XDP or TC program's ring buffer, with the program's verdict.
    Ebpf { verdict: Verdict },
    /// The ring buffer, captured by the program on a node uplink (the
    /// frame's ifindex is then one of the agent's own namespace).
    Uplink { verdict: Verdict },
    /// The AF_PACKET fallback socket.
    AfPacket,
}

/// One received DHCP server→client frame, already split into headers and the
/// UDP payload (the DHCP message bytes): IPv4 by default, [`Rx6Frame`] for a
/// `DHCPv6` server message (ADVERTISE or REPLY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxFrame<A = std::net::Ipv4Addr> {
    /// Ingress interface index, in the namespace of that interface.
    pub ifindex: u32,
    /// Receive timestamp, `CLOCK_MONOTONIC` nanoseconds (eBPF path: taken
    /// in the kernel at tick resolution, as `CLOCK_MONOTONIC_COARSE`).
    pub ts_ns: u64,
    pub headers: frame::FrameHeaders<A>,
    pub payload: Vec<u8>,
    pub via: RxPath,
}

/// A captured `DHCPv6` server message.
pub type Rx6Frame = RxFrame<std::net::Ipv6Addr>;

/// How the capture is attached to an interface (reported per interface).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// TC clsact ingress program (default for veth).
    Tc,
    /// XDP in driver mode (default for physical NICs and VF netdevs).
    XdpNative,
    /// XDP in generic (skb) mode (default for everything else, and the
    /// fallback when native XDP is refused).
    XdpGeneric,
    /// No eBPF: the AF_PACKET fallback receiver.
    AfPacket,
}

impl AttachMode {
    /// The stable lower-case name used in flags, logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tc => "tc",
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
            Self::AfPacket => "af-packet",
        }
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An attach mode name that is not one of `tc`, `xdp-native`, `xdp-generic`, `af-packet`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown attach mode {0:?} (expected tc, xdp-native, xdp-generic or af-packet)")]
pub struct UnknownAttachMode(pub String);

impl FromStr for AttachMode {
    type Err = UnknownAttachMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tc" => Ok(Self::Tc),
            "xdp-native" | "xdp" => Ok(Self::XdpNative),
            "xdp-generic" | "xdp-skb" => Ok(Self::XdpGeneric),
            "af-packet" | "afpacket" => Ok(Self::AfPacket),
            other => Err(UnknownAttachMode(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_mode_names_round_trip() {
        for m in [
            AttachMode::Tc,
            AttachMode::XdpNative,
            AttachMode::XdpGeneric,
            AttachMode::AfPacket,
        ] {
            assert_eq!(m.to_string().parse::<AttachMode>(), Ok(m));
        }
        assert_eq!(
            "xdp-turbo".parse::<AttachMode>(),
            Err(UnknownAttachMode("xdp-turbo".into()))
        );
    }
}

//! The agent's settings: every flag of `xdhcp agent`, as plain data that
//! every layer may read. The command line that parses them (and the
//! operator commands) is [`crate::cli`], above everything; what sits below
//! it reads the values from here and never the command line.
//!
//! Every path is a flag (defaults in `docs/dhcp-ipam-localnet.md`, Agent
//! flags); every DHCP timing knob maps onto [`xdhcp_engine::ClientConfig`]
//! (defaults are the engine's, RFC 2131).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use xdhcp_engine::{ClientConfig, ExpiredLeasePolicy, Ipv4Prefix, Retransmit, RoutePolicy};

use crate::cni::config::{DEFAULT_SOCKET, parse_go_duration};
pub use crate::kube::KubeMode;
use crate::telemetry::LogFormat;
use crate::vfio::VfDriverOverride;

/// `--datapath`: how DHCP replies are received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatapathChoice {
    /// eBPF ring buffer when the program loads, else `AF_PACKET`.
    Auto,
    /// eBPF only; fail to start if the program cannot load.
    Ebpf,
    /// `AF_PACKET` with a classic BPF filter.
    Afpacket,
}

/// `--attach`: where the eBPF capture program attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttachChoice {
    /// TC for veths, native XDP for NICs/VFs, generic XDP otherwise.
    Auto,
    /// TC clsact ingress.
    Tc,
    /// Native XDP (falls back to generic with a log line).
    Xdp,
    /// Generic (skb) XDP.
    XdpGeneric,
}

/// `--expired-lease-policy`: what a restarted agent does with a lease that
/// expired while it was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExpiredPolicy {
    /// INIT-REBOOT asking for the old address (RFC 2131 §3.2).
    Reboot,
    /// Start over with DISCOVER.
    Discover,
    /// Forget the lease (the pod keeps no managed address).
    Drop,
}

/// The node name [`AgentArgs::with_defaults`] gives an agent (whatever
/// `NODE_NAME` says), and the node test API servers schedule pods to.
#[cfg(any(test, feature = "test-hooks"))]
pub const TEST_NODE_NAME: &str = "xdhcp-test-node";

/// Flags of `xdhcp agent`.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Unix socket the CNI plugin and the operator commands talk to (mode 0600).
    #[arg(long, env = "XDHCP_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Also serve the agent socket at this path (repeatable), with the same
    /// mode and the same protocol. The `DaemonSet` adds `/run/cni/dhcp.sock`,
    /// the upstream `dhcp` daemon's socket, so the binary installed as
    /// `dhcp` reaches this agent with an unchanged network config.
    #[arg(long = "extra-socket", value_name = "PATH")]
    pub extra_socket: Vec<PathBuf>,
    /// A uid besides root that may use the agent sockets (checked with
    /// `SO_PEERCRED` on every connection; anyone else is refused).
    /// Repeatable.
    #[arg(long = "socket-allow-uid", value_name = "UID")]
    pub socket_allow_uid: Vec<u32>,
    /// Connections the agent sockets serve at once (each socket); the next
    /// waits in the kernel's backlog until one ends.
    #[arg(long, default_value_t = 64, value_parser = positive)]
    pub socket_max_connections: usize,
    /// Prefix put before every `CNI_NETNS` path the agent opens, for an
    /// agent in a container that sees the host's root under this directory
    /// (the upstream daemon's `-hostprefix`).
    #[arg(long, value_name = "DIR")]
    pub host_prefix: Option<PathBuf>,
    /// Write the agent's process id to this file once the sockets are
    /// bound, and remove it on exit (the upstream daemon's `-pidfile`).
    #[arg(long, value_name = "PATH", value_parser = absolute_path)]
    pub pidfile: Option<PathBuf>,
    /// Lease records, the embedded annotation store and the VFIO journal.
    #[arg(long, default_value = "/var/lib/xdhcp")]
    pub state_dir: PathBuf,
    /// Where the eBPF maps (counters, xid ownership, interface modes, the
    /// ring buffer) and the capture links are pinned, when this directory is
    /// on a bpffs mount, so a restarted agent takes them over; elsewhere
    /// nothing is pinned and the log says why (docs/kernel.md, "Pinning").
    /// `xdhcp unpin` removes them when uninstalling.
    #[arg(long, default_value = "/sys/fs/bpf/xdhcp")]
    pub bpffs_dir: PathBuf,
    /// Root of sysfs (a fake tree in tests).
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Kubernetes API use.
    #[arg(long, value_enum, default_value_t = KubeMode::Auto)]
    pub kube: KubeMode,
    /// kubeconfig file (default: in-cluster config, then $KUBECONFIG, ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this TCP address (off by default).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Log format on stderr (filter with `RUST_LOG`, default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
    /// Receive path for DHCP replies.
    #[arg(long, value_enum, default_value_t = DatapathChoice::Auto)]
    pub datapath: DatapathChoice,
    /// eBPF attach point.
    #[arg(long, value_enum, default_value_t = AttachChoice::Auto)]
    pub attach: AttachChoice,
    /// This node's name (Kubernetes downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// What to do with leases that expired while the agent was down.
    #[arg(long, value_enum, default_value_t = ExpiredPolicy::Reboot)]
    pub expired_lease_policy: ExpiredPolicy,

    /// Overall deadline to obtain a lease (per ADD unless the NAD sets ipam.timeout).
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub acquire_timeout: Duration,
    /// First retransmission delay (RFC 2131 §4.1).
    #[arg(long, value_parser = duration, default_value = "4s")]
    pub retransmit_initial: Duration,
    /// Cap on the doubled retransmission delay (NAD ipam.resendMax overrides).
    #[arg(long, value_parser = duration, default_value = "64s")]
    pub retransmit_max: Duration,
    /// Randomisation of each retransmission delay (±).
    #[arg(long, value_parser = duration, default_value = "1s")]
    pub retransmit_jitter: Duration,
    /// REQUEST transmissions in REQUESTING before restarting DISCOVER.
    #[arg(long, default_value_t = 4)]
    pub request_attempts: u32,
    /// REQUEST transmissions in REBOOTING before falling back to DISCOVER.
    #[arg(long, default_value_t = 2)]
    pub reboot_attempts: u32,
    /// Minimum retransmission interval in RENEWING/REBINDING (RFC 2131 §4.4.5).
    #[arg(long, value_parser = duration, default_value = "60s")]
    pub renew_min_interval: Duration,
    /// Renew up to this share of T1 early, at random (per mille, max 500), so
    /// leases granted together do not renew together (RFC 2131 §4.4.5 fuzz).
    #[arg(long, default_value_t = 50)]
    pub renew_fuzz_permille: u32,
    /// Delay before DISCOVER after a second consecutive NAK (doubles per NAK).
    #[arg(long, value_parser = duration, default_value = "50ms")]
    pub nak_backoff_initial: Duration,
    /// Cap on the NAK backoff.
    #[arg(long, value_parser = duration, default_value = "4s")]
    pub nak_backoff_max: Duration,
    /// Wait after DHCPDECLINE before restarting (RFC 2131 §3.1: ≥ 10s).
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub decline_delay: Duration,
    /// New acquisitions in flight per network at once (the rest queue, in
    /// arrival order, for their first DISCOVER); 0 admits every one at once.
    #[arg(long, default_value_t = 8)]
    pub acquisitions_per_network: usize,
    /// The longest one acquisition keeps its network's slot without an
    /// answer (then it goes on retransmitting outside the queue).
    #[arg(long, value_parser = duration, default_value = "500ms")]
    pub acquisition_slot_hold: Duration,
    /// Random delay before the first DISCOVER, uniform in [0, this].
    #[arg(long, value_parser = duration, default_value = "0s")]
    pub init_delay_max: Duration,
    /// Option 57, maximum DHCP message size.
    #[arg(long, default_value_t = 1500)]
    pub max_message_size: u16,
    /// Set the BROADCAST flag so servers broadcast their replies.
    #[arg(long)]
    pub broadcast_flag: bool,
    /// Maximum option-121 routes accepted from one reply.
    #[arg(long, default_value_t = 64)]
    pub max_routes: usize,
    /// Option-121 routes shorter than this (but not /0) are refused unless the
    /// NAD sets `allowDefaultRouteOverride` (`TunnelVision`, CVE-2024-3661).
    #[arg(long, default_value_t = 8)]
    pub min_route_prefix: u8,
    /// A prefix whose routing no DHCP server may change: a route from a
    /// lease that overlaps it (inside it or around it) is refused. Give the
    /// cluster's pod and service CIDRs here. The node's own networks and the
    /// pod's other interfaces' routes are protected without a flag.
    /// Repeatable (docs/security.md).
    #[arg(long = "protect-prefix", value_name = "A.B.C.D/LEN")]
    pub protect_prefixes: Vec<Ipv4Prefix>,
    /// The kubelet's device-plugin checkpoint: a VF on `vfio-pci` that a
    /// device plugin registered is handed off only for the pod it is
    /// allocated to. No file there: the allocation is not checked.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )]
    pub device_checkpoint: PathBuf,
    /// VFIO handoff: how long to wait for the VF's netdev to appear.
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub vfio_netdev_timeout: Duration,
    /// VFIO handoff: the kernel driver of a VF the built-in table does not
    /// know, as `VENDOR:DEVICE=DRIVER` with the PCI ids in hex (`lspci -nn`),
    /// e.g. `8086:1889=iavf`. Repeatable; an entry wins over the table, and
    /// the last entry for the same ids wins.
    #[arg(long = "vf-driver", value_name = "VENDOR:DEVICE=DRIVER")]
    pub vf_driver: Vec<VfDriverOverride>,
    /// A node uplink: the interface (NIC, bond, or bridge port) that carries
    /// a localnet network, in the agent's network namespace, as `IFACE` or
    /// `PHYSNET=IFACE` (the OVN-Kubernetes `physicalNetworkName` it
    /// carries). The capture program is attached there once at start, and
    /// leases whose replies arrive there need nothing attached per pod.
    /// Repeatable (docs/uplinks.md).
    #[arg(long = "uplink", value_name = "[PHYSNET=]IFACE")]
    pub uplinks: Vec<Uplink>,
    /// The node's Open vSwitch database socket. With no `--uplink`, the
    /// agent reads the uplinks of every `ovn-bridge-mappings` entry (each
    /// provider bridge's ports) from it and follows them as they change; an
    /// explicit `--uplink` wins, and OVS is not read. No database there:
    /// no uplinks, said once in the log and in `xdhcp status`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/run/openvswitch/db.sock"
    )]
    pub ovsdb: PathBuf,
    /// A network whose workload ports are DHCP ports: every port of it that
    /// appears on the integration bridge in Open vSwitch (`--ovsdb`) is
    /// guarded at once, before its ADD and whether or not one comes. Named
    /// as OVN-Kubernetes names it on the port: the network
    /// (`k8s.ovn.org/network`, the `name` of its CNI config) or the NAD
    /// (`k8s.ovn.org/nad`, `NAMESPACE/NAME`). Repeatable. Networks the
    /// agent has leased on since it started count too (docs/dhcp-guard.md).
    #[arg(long = "dhcp-network", value_name = "NETWORK")]
    pub dhcp_networks: Vec<String>,
    /// The DHCP guard on the host end of every workload port the agent
    /// serves (server messages from workloads dropped, client messages
    /// rate-limited, one client per VM port); tuned per network by the
    /// NAD's `ipam.dhcpGuard` (docs/dhcp-guard.md).
    #[arg(long, value_enum, default_value_t = GuardChoice::On)]
    pub dhcp_guard: GuardChoice,
    /// A network whose ports may be trusted (server messages from the
    /// workload pass) when its config asks with `ipam.dhcpGuard.trusted`:
    /// its `netAttachDefName` (`namespace/name`) or, without one, its
    /// config `name`. Repeatable; a config alone (a namespaced object a
    /// tenant may write) never makes a port trusted.
    #[arg(long = "dhcp-guard-trusted-network", value_name = "NETWORK")]
    pub dhcp_guard_trusted_network: Vec<String>,
    /// The highest client-message rate (per second) a network config's
    /// `ipam.dhcpGuard.rate` may ask for; more is cut to this.
    #[arg(long, default_value_t = xdhcp_common::guard::GUARD_DEFAULT_RATE)]
    pub dhcp_guard_max_rate: u32,
    /// The largest burst a network config's `ipam.dhcpGuard.burst` may ask
    /// for; more is cut to this.
    #[arg(long, default_value_t = xdhcp_common::guard::GUARD_DEFAULT_BURST)]
    pub dhcp_guard_max_burst: u32,
    /// DHCPACKs per second a learning port (a VM's) may hand to passive
    /// learning once its burst is spent; the kernel passes the rest without
    /// copying them, counted (`xdhcp_learn_replies_skipped_total`).
    #[arg(long, default_value_t = xdhcp_common::guard::LEARN_DEFAULT_RATE,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(xdhcp_common::guard::LEARN_MAX)))]
    pub learn_reply_rate: u32,
    /// DHCPACKs a quiet learning port may hand to passive learning back to
    /// back.
    #[arg(long, default_value_t = xdhcp_common::guard::LEARN_DEFAULT_BURST,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(xdhcp_common::guard::LEARN_MAX)))]
    pub learn_reply_burst: u32,
}

/// One `--uplink`: an interface of the agent's namespace, and optionally
/// the physical network it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    pub ifname: String,
    pub physnet: Option<String>,
}

/// A `--uplink` value that is not `IFACE` or `PHYSNET=IFACE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--uplink {input:?}: {reason}")]
pub struct InvalidUplink {
    pub input: String,
    pub reason: &'static str,
}

impl std::str::FromStr for Uplink {
    type Err = InvalidUplink;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| InvalidUplink {
            input: s.to_owned(),
            reason,
        };
        let (physnet, ifname) = match s.split_once('=') {
            Some((p, i)) => (Some(p), i),
            None => (None, s),
        };
        if let Some(p) = physnet
            && (p.is_empty() || p.chars().any(char::is_whitespace))
        {
            return Err(bad(
                "the physical network name must be non-empty, without spaces",
            ));
        }
        // The kernel's rules for an interface name (dev_valid_name).
        if ifname.is_empty()
            || ifname.len() > 15
            || ifname == "."
            || ifname == ".."
            || ifname
                .bytes()
                .any(|b| b == b'/' || b == b':' || b == b'=' || b.is_ascii_whitespace())
        {
            return Err(bad(
                "the interface name must be 1 to 15 bytes, without '/', ':', '=' or spaces",
            ));
        }
        Ok(Self {
            ifname: ifname.to_owned(),
            physnet: physnet.map(str::to_owned),
        })
    }
}

impl std::fmt::Display for Uplink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.physnet {
            Some(p) => write!(f, "{p}={}", self.ifname),
            None => f.write_str(&self.ifname),
        }
    }
}

/// `--dhcp-guard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GuardChoice {
    /// Guard every veth workload port whose host end is in the agent's namespace.
    On,
    /// No guard.
    Off,
}

impl AgentArgs {
    /// Flags with every default, for tests and in-process agents.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn with_defaults(socket: PathBuf, state_dir: PathBuf) -> Self {
        use clap::Parser;

        /// Just the agent's flags, parsed from an empty command line.
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            args: AgentArgs,
        }
        let mut args = Defaults::parse_from(["xdhcp-agent"]).args;
        args.socket = socket;
        args.state_dir = state_dir;
        // With the Kubernetes API the agent needs its node; tests' fake
        // API servers schedule their pods there.
        args.node_name = Some(TEST_NODE_NAME.to_owned());
        args
    }

    /// The engine configuration every lease starts from (per-NAD settings
    /// and the MAC are applied on top by the daemon).
    pub fn client_config(&self) -> ClientConfig {
        let route_policy = RoutePolicy {
            max_routes: self.max_routes,
            min_prefix_len: self.min_route_prefix,
            protected: self.protect_prefixes.clone(),
            ..RoutePolicy::default()
        };
        ClientConfig {
            retransmit: Retransmit {
                initial: self.retransmit_initial,
                max_interval: self.retransmit_max,
                jitter: self.retransmit_jitter,
                request_attempts: self.request_attempts,
                reboot_attempts: self.reboot_attempts,
                renew_min_interval: self.renew_min_interval,
                nak_backoff_initial: self.nak_backoff_initial,
                nak_backoff_max: self.nak_backoff_max,
                decline_delay: self.decline_delay,
                init_delay_max: self.init_delay_max,
                renew_fuzz_permille: self.renew_fuzz_permille,
            },
            acquire_timeout: self.acquire_timeout,
            route_policy,
            max_message_size: self.max_message_size,
            broadcast_flag: self.broadcast_flag,
            expired_lease: match self.expired_lease_policy {
                ExpiredPolicy::Discover => ExpiredLeasePolicy::Discover,
                ExpiredPolicy::Reboot | ExpiredPolicy::Drop => ExpiredLeasePolicy::Reboot,
            },
            ..ClientConfig::default()
        }
    }
}

fn absolute_path(s: &str) -> Result<PathBuf, String> {
    if s.starts_with('/') {
        Ok(PathBuf::from(s))
    } else {
        Err(format!("{s:?} is not an absolute path"))
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).ok_or_else(|| format!("{s:?} is not a duration like 30s, 1m30s or 250ms"))
}

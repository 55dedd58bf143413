//! Test harness for xdhcp integration tests: network namespaces, veths,
//! bridges and DHCP servers as guard values that always clean up.
//!
//! Everything lives in namespaces named `xdt-<pid>-<n>`; nothing touches the
//! host's interfaces. Guards tear down on drop (also during a panic) and
//! [`netns::sweep_leftovers`] removes what crashed test processes left.
//!
//! ```no_run
//! use xdhcp_tests::{Dnsmasq, DnsmasqConfig, Lab};
//!
//! let lab = Lab::with_clients(2); // server ns with br0 192.0.2.1/24, 2 client ns with eth0
//! let dnsmasq = Dnsmasq::start(&lab.server, DnsmasqConfig { t1_secs: Some(4), ..Default::default() });
//! let client = &lab.clients[0];
//! // ... run a DHCP client in client.ns.path() on client.ifname with client.mac ...
//! assert!(dnsmasq.lease_for(client.mac).is_some());
//! ```

pub mod agent;
pub mod bench;
pub mod chaos;
pub mod cni_burst;
pub mod fake_apiserver;
pub mod frames;
pub mod guest;
pub mod neigh;
pub mod netns;
pub mod nft;
pub mod ovs_lab;
pub mod plugin;
pub mod servers;
pub mod soak;
pub mod stand_in_api;
pub mod tmpfs;

pub use agent::InProcessAgent;
pub use netns::{
    AckDrop, Bridge, Lab, LabBuilder, LabClient, NetNs, UnicastCut, Veth, format_mac, netns_exec,
    parse_mac, unique_name,
};
pub use ovs_lab::two_nodes::{OvnNode, TwoNodes};
pub use ovs_lab::{LabDatapath, LabLink, OvnLab, OvnLabOptions, OvnPod, OvnServerPort};
pub use plugin::{PluginCall, PluginOutput};
pub use servers::{
    AGENT_READY_WITHIN, Dhcpd, DhcpdConfig, Dnsmasq, Dnsmasq6, DnsmasqConfig, Kea, Kea6,
    Kea6Options, KeaConfig, Process, ServerLease, wait_until,
};
pub use stand_in_api::{StandInApi, write_kubeconfig};
pub use xdhcp_testbed::programs::CNI_PLUGIN_DIR;

/// The executable of the external program `name` from the one program table
/// ([`xdhcp_testbed::programs::PROGRAMS`], which `cargo xtask setup` installs
/// from): an absolute path for a Debian program, the bare name for a Rust
/// toolchain program. Every program the harness, the tests and the
/// benchmarks run is found here.
///
/// # Panics
/// If `name` is not in the table (add it there, with its Debian package), or
/// if its Debian package is not installed (run `cargo xtask setup`).
#[track_caller]
pub fn program(name: &str) -> &'static std::path::Path {
    use xdhcp_testbed::programs::{self, Source};
    let Some(p) = programs::find(name) else {
        panic!(
            "`{name}` is not in the program table (testbed/src/programs.rs): add it there with \
             its Debian package so `cargo xtask setup` installs it"
        )
    };
    let exe = std::path::Path::new(p.executable());
    if let Source::Debian { package, path } = p.source {
        assert!(
            exe.exists(),
            "{path} is missing: run `cargo xtask setup` (it installs the Debian package {package})"
        );
    }
    exe
}

/// The agent's CNI request for `container` on `client`'s pod interface, with
/// pod namespace `pod_namespace` and the network config `net_conf` (JSON).
///
/// # Panics
/// If `net_conf` is not a valid config (a bug in the test).
pub fn cni_request(
    client: &LabClient,
    container: &str,
    pod_namespace: &str,
    net_conf: &str,
) -> xdhcp::rpc::CniRequest {
    xdhcp::rpc::CniRequest {
        container_id: container.to_owned(),
        ifname: client.ifname.clone(),
        netns: Some(client.ns.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), pod_namespace.to_owned()),
            ("K8S_POD_NAME".to_owned(), container.to_owned()),
        ]
        .into(),
        config: xdhcp::cni::config::parse(net_conf.as_bytes()).expect("test config is valid"),
    }
}

/// `xdhcp agent` in embedded mode (`--kube off`) on `socket`, keeping its
/// state in `dir/state` and its eBPF pins in `dir/bpffs`: a plain directory
/// of the caller's own, never the host's bpffs, so agents running side by
/// side neither share nor reset each other's pinned maps. The caller adds
/// `RUST_LOG` and any further flags.
pub fn agent_command(
    bin: &std::path::Path,
    socket: &std::path::Path,
    dir: &std::path::Path,
) -> std::process::Command {
    agent_command_in(None, bin, socket, dir)
}

/// [`agent_command`], run inside network namespace `ns` (`ip netns exec`)
/// when one is given: a node's namespace, whose uplinks the agent attaches
/// to.
pub fn agent_command_in(
    ns: Option<&str>,
    bin: &std::path::Path,
    socket: &std::path::Path,
    dir: &std::path::Path,
) -> std::process::Command {
    agent_command_reading(ns, bin, socket, dir, None)
}

/// [`agent_command_in`] with `ovsdb`, when given, as the Open vSwitch
/// database it reads (a lab's own: `OvnLab::db_socket`).
pub fn agent_command_reading(
    ns: Option<&str>,
    bin: &std::path::Path,
    socket: &std::path::Path,
    dir: &std::path::Path,
    ovsdb: Option<&std::path::Path>,
) -> std::process::Command {
    let mut cmd = match ns {
        Some(ns) => netns_exec(ns, bin),
        None => std::process::Command::new(bin),
    };
    cmd.args(["agent", "--kube", "off", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--bpffs-dir")
        .arg(dir.join("bpffs"))
        // Never this machine's Open vSwitch: its uplinks are no test's.
        .arg("--ovsdb")
        .arg(ovsdb.map_or_else(|| dir.join("no-ovsdb.sock"), std::path::Path::to_path_buf))
        .env_remove("CNI_COMMAND");
    cmd
}

/// Runs busybox `udhcpc` once in `ns` on `ifname` (three DISCOVERs, 1 s
/// apart at most); its script records the lease it binds: (address, server
/// identifier), or `None` when it bound none.
///
/// # Panics
/// If the script cannot be written or busybox cannot be run.
pub fn udhcpc_once(ns: &NetNs, ifname: &str) -> Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("script");
    let out = dir.path().join("bound");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip $serverid\" > {}\nexit 0\n",
            out.display()
        ),
    )
    .expect("write udhcpc script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let status = ns
        .command("busybox")
        .args([
            "udhcpc", "-f", "-q", "-n", "-t", "3", "-T", "1", "-A", "1", "-i",
        ])
        .arg(ifname)
        .arg("-s")
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run udhcpc");
    if !status.success() {
        return None;
    }
    let text = std::fs::read_to_string(&out).ok()?;
    let mut it = text.split_whitespace().map(|s| s.parse().ok());
    Some((it.next()??, it.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn netns_guard_creates_and_deletes() {
        let ns = NetNs::new();
        let path = ns.path().to_path_buf();
        assert!(path.exists());
        assert!(ns.name().starts_with(netns::PREFIX));
        assert!(ns.has_link("lo"));
        drop(ns);
        assert!(!path.exists(), "{} left behind", path.display());
    }

    #[test]
    fn sweep_removes_only_dead_owners() {
        // A name owned by a pid that cannot exist (above pid_max) is swept...
        let dead = format!("{}4194399-0", netns::PREFIX);
        netns::run(std::process::Command::new(program("ip")).args(["netns", "add", &dead]));
        // ...one owned by us is not.
        let ours = NetNs::new();
        netns::sweep_leftovers();
        let list = netns::run(std::process::Command::new(program("ip")).args(["netns", "list"]));
        let names: Vec<&str> = list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(!names.contains(&dead.as_str()), "{dead} not swept: {list}");
        assert!(
            names.contains(&ours.name()),
            "{} swept: {list}",
            ours.name()
        );
    }

    #[test]
    fn a_lab_without_ipv6_has_no_ipv6_address_in_any_client_added_later_too() {
        let mut lab = Lab::builder().clients(1).without_ipv6().build();
        lab.add_client("eth0");
        for c in &lab.clients {
            let v6 = c.ns.ip(&["-6", "addr", "show", "dev", &c.ifname]);
            assert!(!v6.contains("inet6"), "{}: {v6}", c.ns.name());
        }
        // A lab with IPv6 on gets a link-local address on its clients.
        let with = Lab::with_clients(1);
        let c = &with.clients[0];
        let v6 = c.ns.ip(&["-6", "addr", "show", "dev", &c.ifname]);
        assert!(v6.contains("inet6 fe80"), "{v6}");
    }

    #[test]
    fn lab_connects_clients_to_server() {
        let lab = Lab::with_clients(2);
        let c = &lab.clients[1];
        assert!(c.ns.has_link("eth0"));
        assert_eq!(c.ns.mac("eth0"), c.mac);
        assert_eq!(
            lab.server.ipv4_addrs(Lab::BRIDGE),
            vec![(lab.server_ip, lab.prefix_len)]
        );
        c.ns.add_addr("eth0", "192.0.2.77".parse().unwrap(), 24);
        // UDP across the bridge: server listens, client sends.
        let server = lab
            .server
            .run_in(|| std::net::UdpSocket::bind("192.0.2.1:9999"))
            .expect("bind in server ns");
        server
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        c.ns.run_in(|| {
            let s = std::net::UdpSocket::bind("192.0.2.77:0").unwrap();
            s.send_to(b"hello", "192.0.2.1:9999").unwrap();
        });
        let mut buf = [0u8; 16];
        let (n, from) = server
            .recv_from(&mut buf)
            .expect("datagram over the lab bridge");
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(from.ip(), std::net::IpAddr::from([192, 0, 2, 77]));
    }

    #[test]
    fn dnsmasq_starts_and_logs() {
        let lab = Lab::with_clients(0);
        let mut d = Dnsmasq::start(&lab.server, DnsmasqConfig::default());
        assert!(d.is_running());
        assert!(
            d.log().contains("DHCP, IP range 192.0.2.10 -- 192.0.2.250"),
            "{}",
            d.log()
        );
        assert!(d.leases().is_empty());
        d.stop();
        assert!(!d.is_running());
        d.restart();
        assert!(d.is_running());
    }

    #[test]
    fn kea_starts() {
        let lab = Lab::with_clients(0);
        let mut k = Kea::start(&lab.server, KeaConfig::default());
        assert!(k.is_running());
        assert!(k.leases().is_empty());
        k.restart();
        assert!(k.is_running());
    }

    #[test]
    fn dhcpd_starts() {
        let lab = Lab::with_clients(0);
        let d = Dhcpd::start(&lab.server, &DhcpdConfig::default());
        assert!(d.wait_for_log("Sending on", Duration::from_secs(1)));
    }
}

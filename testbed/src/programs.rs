//! Every external program the tests, the benchmarks and `cargo xtask` run,
//! with where it comes from: the one table `cargo xtask setup` installs from
//! and the test harness, the benchmarks and the demo look programs up in.
//!
//! A program that is not in [`PROGRAMS`] cannot be run: the harness's lookup
//! (`xdhcp_tests::program`) panics on an unknown name, and a test
//! (`tests/tests/programs.rs`) fails on any `Command::new("literal")`,
//! absolute program path or `netns exec` outside the table's lookups. To use
//! a new program, add one line here; `setup` installs its package.
//!
//! Paths are the ones the Debian 12 package registers (`dpkg-query -S`), so
//! they hold whether or not `/usr` is merged.
//!
//! It lives in `xdhcp-testbed`, which both `xtask` and the tests crate
//! depend on and no shipped crate does (`xtask` must not depend on the tests
//! crate); a typed `const` needs no parser on either side.

/// Where a program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Installed by `cargo xtask setup` from this Debian 12 package (a
    /// package of priority `required` such as `coreutils` is on every
    /// Debian system; `setup` checks it like the others).
    Debian {
        package: &'static str,
        path: &'static str,
    },
    /// The Rust toolchain: rustup's proxies and `cargo install`ed tools, run
    /// by name from `PATH`. `setup` checks the toolchain and builds
    /// `bpf-linker`; rustup itself is the one thing installed by hand.
    Rust,
}

/// One external program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    /// The name callers look it up by. CNI plugins are `cni/<plugin>`.
    pub name: &'static str,
    pub source: Source,
    /// Why xdhcp runs it.
    pub used_for: &'static str,
}

impl Program {
    /// What to execute: the absolute path of a Debian program, the bare
    /// name (resolved on `PATH`) of a Rust toolchain program.
    pub const fn executable(&self) -> &'static str {
        match self.source {
            Source::Debian { path, .. } => path,
            Source::Rust => self.name,
        }
    }

    /// The Debian package, if it comes from one.
    pub const fn package(&self) -> Option<&'static str> {
        match self.source {
            Source::Debian { package, .. } => Some(package),
            Source::Rust => None,
        }
    }
}

const fn deb(
    name: &'static str,
    package: &'static str,
    path: &'static str,
    used_for: &'static str,
) -> Program {
    Program {
        name,
        source: Source::Debian { package, path },
        used_for,
    }
}

const fn rust(name: &'static str, used_for: &'static str) -> Program {
    Program {
        name,
        source: Source::Rust,
        used_for,
    }
}

/// Every external program, one line each.
pub const PROGRAMS: &[Program] = &[
    // DHCP servers the tests and benchmarks run. `dnsmasq-base` is the
    // binary without the `dnsmasq` package's service, which would serve DNS
    // on the host.
    deb(
        "dnsmasq",
        "dnsmasq-base",
        "/usr/sbin/dnsmasq",
        "DHCP server",
    ),
    deb(
        "kea-dhcp4",
        "kea-dhcp4-server",
        "/usr/sbin/kea-dhcp4",
        "DHCP server",
    ),
    deb(
        "kea-dhcp6",
        "kea-dhcp6-server",
        "/usr/sbin/kea-dhcp6",
        "DHCPv6 server",
    ),
    deb("dhcpd", "isc-dhcp-server", "/usr/sbin/dhcpd", "DHCP server"),
    // Network namespaces, links, addresses, `ip netns exec`.
    deb("ip", "iproute2", "/bin/ip", "namespaces, veths, bridges"),
    // Listing the DHCP guard's TC filters on a port (guard tests).
    deb("tc", "iproute2", "/sbin/tc", "listing TC filters"),
    // Listing the agent's packet sockets in a pod namespace (uplink tests).
    deb("ss", "iproute2", "/bin/ss", "listing packet sockets"),
    // Dropping unicast DHCP at a bridge (the renew-then-rebind tests).
    deb(
        "nft",
        "nftables",
        "/usr/sbin/nft",
        "cutting a server's unicast path",
    ),
    // Capturing DHCP frames in the VM tests.
    deb("tcpdump", "tcpdump", "/usr/bin/tcpdump", "packet capture"),
    // Guest DHCP clients behind a VM port (passive learning tests): each
    // with its own default client identifier.
    deb(
        "dhcpcd",
        "dhcpcd-base",
        "/usr/sbin/dhcpcd",
        "guest DHCP client (DUID client id)",
    ),
    deb(
        "dhclient",
        "isc-dhcp-client",
        "/sbin/dhclient",
        "guest DHCP client (no client id)",
    ),
    // The datapath benchmark's traffic.
    deb("iperf3", "iperf3", "/usr/bin/iperf3", "datapath benchmark"),
    // Inspecting pinned maps and programs (docs/kernel.md); no test runs it.
    deb(
        "bpftool",
        "bpftool",
        "/usr/sbin/bpftool",
        "inspecting eBPF maps",
    ),
    // The lease store's power-loss test: ext4 on a loop device.
    deb(
        "mkfs.ext4",
        "e2fsprogs",
        "/sbin/mkfs.ext4",
        "power-loss test disk",
    ),
    deb("losetup", "mount", "/sbin/losetup", "power-loss test disk"),
    // Also the bind mounts of a guest DHCP client's private mount namespace
    // (the passive-learning tests: its /var/lib/dhcpcd and /run).
    deb(
        "mount",
        "mount",
        "/bin/mount",
        "power-loss test disk; a guest client's private bind mounts",
    ),
    deb("umount", "mount", "/bin/umount", "power-loss test disk"),
    // CNI plugins: main plugins around the IPAM plugin, and the upstream
    // DHCP IPAM plugin the benchmarks compare against.
    deb(
        "cni/bridge",
        "containernetworking-plugins",
        "/usr/lib/cni/bridge",
        "CNI main plugin",
    ),
    deb(
        "cni/macvlan",
        "containernetworking-plugins",
        "/usr/lib/cni/macvlan",
        "CNI main plugin",
    ),
    deb(
        "cni/dhcp",
        "containernetworking-plugins",
        "/usr/lib/cni/dhcp",
        "upstream DHCP IPAM plugin (benchmark baseline)",
    ),
    // Checking that this table is true (`tests/tests/programs.rs`).
    deb(
        "dpkg-query",
        "dpkg",
        "/usr/bin/dpkg-query",
        "checking this table",
    ),
    // `cargo xtask setup` and friends.
    deb(
        "apt-get",
        "apt",
        "/usr/bin/apt-get",
        "installing this table",
    ),
    deb("id", "coreutils", "/usr/bin/id", "checking for root"),
    deb(
        "cp",
        "coreutils",
        "/bin/cp",
        "installing the VM tier's kernel modules",
    ),
    // The VM test tier (`cargo xtask vmtest`): a second kernel under qemu.
    deb(
        "dpkg",
        "dpkg",
        "/usr/bin/dpkg",
        "unpacking the VM tier's kernel package",
    ),
    deb(
        "apt-cache",
        "apt",
        "/usr/bin/apt-cache",
        "finding the VM tier's kernel package",
    ),
    deb(
        "qemu-system-x86_64",
        "qemu-system-x86",
        "/usr/bin/qemu-system-x86_64",
        "booting the VM tier's kernel (software emulation)",
    ),
    deb(
        "depmod",
        "kmod",
        "/sbin/depmod",
        "indexing the VM tier kernel's modules",
    ),
    deb(
        "modprobe",
        "kmod",
        "/sbin/modprobe",
        "loading NIC and VFIO drivers in the guest",
    ),
    deb(
        "busybox",
        "busybox-static",
        "/bin/busybox",
        "virtme-ng's guest init; udhcpc, a guest DHCP client",
    ),
    deb(
        "python3",
        "python3-minimal",
        "/usr/bin/python3",
        "the venv virtme-ng runs from",
    ),
    deb(
        "python3-venv",
        "python3-venv",
        "/usr/share/doc/python3-venv",
        "python3 -m venv (for virtme-ng from PyPI)",
    ),
    deb("bash", "bash", "/bin/bash", "the kind end-to-end script"),
    // The OVN-Kubernetes drop-in test runs a bare `dhcp daemon` (default
    // state dir, default bpffs) in a private mount namespace whose /var/lib
    // and /sys/fs/bpf are the test's own.
    deb(
        "unshare",
        "util-linux",
        "/usr/bin/unshare",
        "a private mount namespace for a bare `dhcp daemon` or a guest DHCP client",
    ),
    deb(
        "sh",
        "dash",
        "/bin/sh",
        "bind mounts before exec'ing a bare `dhcp daemon` or a guest DHCP client",
    ),
    // Open vSwitch's database, without ovs-vswitchd: the OVSDB client's
    // tests (`ovsdb/tests/`) run their own server on a database of their
    // own, built from the schema the package ships.
    deb(
        "ovsdb-server",
        "openvswitch-common",
        "/usr/sbin/ovsdb-server",
        "an OVSDB server for the OVSDB client's tests",
    ),
    deb(
        "ovsdb-tool",
        "openvswitch-common",
        "/usr/bin/ovsdb-tool",
        "creating a test's Open_vSwitch database",
    ),
    deb(
        "ovs-vsctl",
        "openvswitch-switch",
        "/usr/bin/ovs-vsctl",
        "bridges, ports and external_ids in a test's database",
    ),
    // Not a program: the schema `ovsdb-tool create` reads, from the package
    // `setup` must install for it.
    deb(
        "vswitch.ovsschema",
        "openvswitch-switch",
        "/usr/share/openvswitch/vswitch.ovsschema",
        "the Open_vSwitch database schema",
    ),
    // The OVS + OVN node lab (`tests/src/ovs_lab.rs`): a userspace-datapath
    // ovs-vswitchd (the package's own path: /usr/sbin/ovs-vswitchd is an
    // alternatives link no package owns), OVN's databases, northd and
    // controller, and ethtool for the veths' checksum offload.
    deb(
        "ovs-vswitchd",
        "openvswitch-switch",
        "/usr/lib/openvswitch-switch/ovs-vswitchd",
        "the OVN lab's switch (userspace datapath)",
    ),
    deb(
        "ovs-ofctl",
        "openvswitch-common",
        "/usr/bin/ovs-ofctl",
        "the OVN lab's check that ovn-controller put the flows back after an OVS restart",
    ),
    deb(
        "ovs-appctl",
        "openvswitch-common",
        "/usr/bin/ovs-appctl",
        "the two-chassis lab's look at a node's ovs-vswitchd routes when the overlay fails",
    ),
    deb(
        "ovn-northd",
        "ovn-central",
        "/usr/bin/ovn-northd",
        "the OVN lab's northbound-to-southbound translation",
    ),
    deb(
        "ovn-controller",
        "ovn-host",
        "/usr/bin/ovn-controller",
        "the OVN lab's chassis controller",
    ),
    deb(
        "ovn-nbctl",
        "ovn-common",
        "/usr/bin/ovn-nbctl",
        "the OVN lab's logical switch and ports",
    ),
    // Not programs: the schemas of the OVN lab's databases.
    deb(
        "ovn-nb.ovsschema",
        "ovn-central",
        "/usr/share/ovn/ovn-nb.ovsschema",
        "the OVN northbound database schema",
    ),
    deb(
        "ovn-sb.ovsschema",
        "ovn-central",
        "/usr/share/ovn/ovn-sb.ovsschema",
        "the OVN southbound database schema",
    ),
    deb(
        "ethtool",
        "ethtool",
        "/sbin/ethtool",
        "tx checksum offload off on veths under the userspace datapath",
    ),
    rust("cargo", "building and testing"),
    rust("rustc", "toolchain checks"),
    rust("rustup", "adding rust-src"),
    rust("bpf-linker", "linking the eBPF object"),
];

/// Container engines `cargo xtask image` builds the agent image with, the
/// first found on `PATH`. Not in [`PROGRAMS`]: `setup` never installs one
/// (no test, benchmark or demo needs an image), and without one `image`
/// says so and stops.
pub const CONTAINER_ENGINES: &[&str] = &["podman", "docker", "buildah"];

/// The directory of the Debian CNI plugins (a `CNI_PATH` entry).
pub const CNI_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Whether `key` is one of the variables cargo sets for the one target it
/// builds or runs (its package's name and manifest, `OUT_DIR`…). A cargo
/// started from such a process (`cargo xtask`, a test building a binary)
/// must not inherit them: build scripts that watch them (ring's) would see
/// another environment than a cargo started from a shell and rerun, and
/// two such builds would keep rebuilding each other's artifacts.
pub fn is_cargo_target_env(key: &str) -> bool {
    key == "OUT_DIR"
        || key == "CARGO_PRIMARY_PACKAGE"
        || key == "CARGO_TARGET_TMPDIR"
        || [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_BIN_",
            "CARGO_CRATE_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
}

/// The table entry for `name`, if there is one.
pub fn find(name: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_target_variables_are_told_from_the_user_s() {
        for k in [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_LINKS",
            "CARGO_BIN_EXE_xdhcp",
            "CARGO_CRATE_NAME",
            "OUT_DIR",
        ] {
            assert!(is_cargo_target_env(k), "{k}");
        }
        for k in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "PATH",
            "RUSTFLAGS",
        ] {
            assert!(!is_cargo_target_env(k), "{k}");
        }
    }

    #[test]
    fn names_are_unique_and_cni_plugins_live_in_the_plugin_dir() {
        for (i, p) in PROGRAMS.iter().enumerate() {
            assert!(
                PROGRAMS[..i].iter().all(|q| q.name != p.name),
                "{} twice",
                p.name
            );
            if let Some(plugin) = p.name.strip_prefix("cni/") {
                let Source::Debian { path, .. } = p.source else {
                    panic!("{} is not from Debian", p.name)
                };
                assert_eq!(path.rsplit_once('/'), Some((CNI_PLUGIN_DIR, plugin)));
            }
            if let Source::Debian { path, .. } = p.source {
                assert!(path.starts_with('/'), "{path} is not absolute");
            }
        }
        assert_eq!(find("nft").and_then(Program::package), Some("nftables"));
        assert_eq!(find("cargo").map(Program::executable), Some("cargo"));
        assert!(find("nc").is_none());
    }
}

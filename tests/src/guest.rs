//! A VM guest's own DHCP clients: each runs in the guest's network
//! namespace and in a private mount namespace whose `/var/lib/dhcpcd` and
//! `/run` are directories of the test's ([`GuestFs`]), so no client touches
//! this machine's files.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{NetNs, program, wait_until};

/// The guest clients' `/var/lib/dhcpcd` (`db/`) and `/run` (`run/`),
/// removed on drop.
pub struct GuestFs {
    dir: tempfile::TempDir,
}

impl GuestFs {
    /// New, empty directories.
    ///
    /// # Panics
    /// If they cannot be created.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-guest-fs-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("db")).unwrap();
        std::fs::create_dir(dir.path().join("run")).unwrap();
        Self { dir }
    }

    /// The directory holding `db/` and `run/`.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `program` inside `guest` and a private mount namespace whose
    /// `/var/lib/dhcpcd` and `/run` are this one's directories, bound
    /// before the client starts. `/run` is replaced only once inside the
    /// guest's network namespace, which `ip netns exec` has found under it
    /// already.
    pub fn client(&self, guest: &NetNs, client: &str) -> Command {
        let mut cmd = guest.command("unshare");
        cmd.args(["--mount", "--propagation", "private", "--"])
            .arg(program("sh"))
            .arg("-c")
            .arg(r#"set -e; "$1" --bind "$2" /var/lib/dhcpcd; "$1" --bind "$3" /run; shift 3; exec "$@""#)
            .arg("guest-client")
            .arg(program("mount"))
            .arg(self.path().join("db"))
            .arg(self.path().join("run"))
            .arg(program(client));
        cmd
    }

    /// Runs `dhcpcd` once on the guest's `eth0` with its distribution's
    /// defaults that matter (a DUID client id, a lease database kept across
    /// runs; no hooks: a script records the address); the address it
    /// bound, if any within `secs`.
    ///
    /// # Panics
    /// If dhcpcd cannot be started.
    pub fn dhcpcd_once(&self, guest: &NetNs, secs: u32) -> Option<Ipv4Addr> {
        self.dhcpcd_run(
            guest,
            "eth0",
            Dhcpcd {
                family: "-4",
                conf: "duid\npersistent\nnoarp\nrequire dhcp_server_identifier\n",
                reasons: "BOUND|REBIND|REBOOT|RENEW",
                address: "new_ip_address",
                tag: "",
            },
            secs,
        )?
        .parse()
        .ok()
    }

    /// Runs `dhcpcd` once for DHCPv6 on `ifname` of `guest`: an address
    /// (`IA_NA`) solicited at once, without waiting for a router's
    /// advertisement (`noipv6rs`: dhcpcd leaves those to the kernel); the
    /// address it bound, if any within `secs`.
    ///
    /// # Panics
    /// If dhcpcd cannot be started.
    pub fn dhcpcd6_once(&self, guest: &NetNs, ifname: &str, secs: u32) -> Option<Ipv6Addr> {
        self.dhcpcd_run(
            guest,
            ifname,
            Dhcpcd {
                family: "-6",
                conf: "duid\nnoipv6rs\nia_na\n",
                reasons: "BOUND6|REBIND6|REBOOT6|RENEW6",
                address: "new_dhcp6_ia_na1_ia_addr1",
                tag: "6",
            },
            secs,
        )?
        .parse()
        .ok()
    }

    /// Runs `dhcpcd` once (`-1`) in the foreground with `how`'s family and
    /// configuration on `ifname`; its script writes the address variable
    /// on the reasons that bind. What it wrote, if anything, within `secs`
    /// (dhcpcd's own timeout does not cover a server that keeps offering
    /// what never arrives: this bounds it).
    fn dhcpcd_run(&self, guest: &NetNs, ifname: &str, how: Dhcpcd, secs: u32) -> Option<String> {
        let dir = self.path();
        let conf = dir.join(format!("dhcpcd{}.conf", how.tag));
        std::fs::write(&conf, how.conf).unwrap();
        let out = dir.join(format!("bound{}", how.tag));
        let script = dir.join(format!("script{}", how.tag));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ncase \"$reason\" in {}) echo \"${}\" > {} ;; esac\nexit 0\n",
                how.reasons,
                how.address,
                out.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let _ = std::fs::remove_file(&out);
        let mut child = self
            .client(guest, "dhcpcd")
            .args(["-1", how.family, "-B", "-t", &secs.to_string(), "-f"])
            .arg(&conf)
            .arg("-c")
            .arg(&script)
            .arg(ifname)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run dhcpcd");
        let deadline = Duration::from_secs(u64::from(secs) + 2);
        if !wait_until(deadline, || child.try_wait().is_ok_and(|s| s.is_some())) {
            // SIGTERM first: dhcpcd then stops its helper processes, which
            // hold its sockets (port 546) for a while after a SIGKILL.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if !wait_until(Duration::from_secs(3), || {
                child.try_wait().is_ok_and(|s| s.is_some())
            }) {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
        Some(std::fs::read_to_string(&out).ok()?.trim().to_owned())
    }
}

/// One family's `dhcpcd` run: its flag, configuration file, the script
/// reasons that bind and the variable naming the address, and the suffix
/// of its files.
#[derive(Clone, Copy)]
struct Dhcpcd {
    family: &'static str,
    conf: &'static str,
    reasons: &'static str,
    address: &'static str,
    tag: &'static str,
}

impl Default for GuestFs {
    fn default() -> Self {
        Self::new()
    }
}

//! IPv6 networks end to end: the thin `xdhcp` plugin as the IPAM plugin of a
//! `"family": "ipv6"` network, an `xdhcp agent` process in embedded mode,
//! and dnsmasq serving a DHCPv6 range in a server namespace behind the lab
//! bridge. The agent leases through a UDP socket in the pod's namespace.
//!
//! ```text
//!  [pod ns: eth0] ──veth── c0 ┐
//!                             ├─ br0 (node ns)
//!                        up0 ─┘
//!                         │ veth
//!                  [dhcp ns: s0 fd00:6::1/64, dnsmasq DHCPv6 fd00:6::100–1ff]
//! ```

mod agent_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_support::{AgentProcess, PluginOutput, invoke, plugin_bin};
use xdhcp_tests::{Lab, NetNs, Process, netns_exec, program, wait_until};

/// dnsmasq serving DHCPv6 only, on the lab's server interface.
struct Dnsmasq6 {
    process: Process,
    dir: tempfile::TempDir,
}

impl Dnsmasq6 {
    fn start(ns: &NetNs) -> Self {
        ns.ip(&[
            "-6",
            "addr",
            "add",
            "fd00:6::1/64",
            "dev",
            Lab::SERVER_IF,
            "nodad",
        ]);
        let dir = tempfile::Builder::new()
            .prefix("xdt-dnsmasq6-")
            .tempdir()
            .unwrap();
        let mut cmd = netns_exec(ns.name(), program("dnsmasq"));
        cmd.args([
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=0",
            "--user=root",
            "--group=root",
            "--bind-interfaces",
            "--except-interface=lo",
            "--dhcp-authoritative",
            "--log-dhcp",
        ])
        .arg(format!("--interface={}", Lab::SERVER_IF))
        .arg("--dhcp-range=fd00:6::100,fd00:6::1ff,64,300")
        .arg("--dhcp-option=option6:dns-server,[fd00:6::53]")
        .arg(format!("--pid-file={}", dir.path().join("pid").display()))
        .arg(format!(
            "--dhcp-leasefile={}",
            dir.path().join("leases").display()
        ))
        .arg(format!(
            "--log-facility={}",
            dir.path().join("log").display()
        ));
        let process = Process::spawn_logged("dnsmasq (DHCPv6)", cmd, &dir.path().join("stderr"));
        let me = Self { process, dir };
        assert!(
            wait_until(Duration::from_secs(10), || me.log().contains("DHCPv6")),
            "dnsmasq did not start serving DHCPv6:\n{}\n{}",
            me.log(),
            std::fs::read_to_string(me.dir.path().join("stderr")).unwrap_or_default()
        );
        me
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The lease file's address lines (the `duid` line of the server's own
    /// DUID aside).
    fn leases(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("leases"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("duid "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Dnsmasq6 {
    fn drop(&mut self) {
        self.process.kill();
    }
}

fn conf(socket: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.1.0","name":"v6net",
            "ipam":{{"type":"xdhcp","socketPath":"{}","family":"ipv6","apply":true,
                     "timeout":"20s","ipv6":{{"prefixLength":64}}}}}}"#,
        socket.display()
    )
}

fn call(cmd: &str, id: &str, pod: &NetNs, conf: &str) -> PluginOutput {
    let cni_path = PathBuf::from("/nonexistent");
    invoke(
        &plugin_bin(),
        None,
        cmd,
        id,
        Some(pod.path()),
        "eth0",
        &cni_path,
        conf,
    )
}

/// The address of an ADD's result, which must be a /64 in the range.
fn leased(r: &PluginOutput, agent: &AgentProcess) -> String {
    assert!(r.ok, "ADD failed: {}\nagent:\n{}", r.text(), agent.log());
    let cidr = r.json["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {}", r.stdout));
    let (addr, len) = cidr.split_once('/').unwrap();
    assert_eq!(len, "64", "{cidr}");
    let a: std::net::Ipv6Addr = addr.parse().unwrap();
    assert!(
        (0xfd00_0006_0000_0000_0000_0000_0000_0100..=0xfd00_0006_0000_0000_0000_0000_0000_01ff)
            .contains(&u128::from(a)),
        "{a} is not in the server's range"
    );
    assert_eq!(
        r.json["dns"]["nameservers"][0], "fd00:6::53",
        "{}",
        r.stdout
    );
    assert!(
        r.json.get("routes").is_none(),
        "no gateway, no route: {}",
        r.stdout
    );
    addr.to_owned()
}

fn pod_has(pod: &NetNs, addr: &str) -> bool {
    pod.ip(&["-6", "addr", "show", "dev", "eth0"])
        .contains(&format!("{addr}/64"))
}

/// ADD leases an IPv6 address through the agent (on the pod's interface, in
/// the result, at the server, in `xdhcp leases` with its family); DEL
/// RELEASEs it (gone from the server's lease file) and takes it off.
#[test]
fn an_ipv6_pod_gets_its_lease_and_releases_it_at_del() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let r = call("ADD", "v6pod", pod, &conf);
    let addr = leased(&r, &agent);
    assert!(
        pod_has(pod, &addr),
        "{addr} not on eth0:\n{}",
        pod.ip(&["-6", "addr"])
    );
    assert!(
        server.leases().contains(&addr),
        "dnsmasq holds no lease for {addr}:\n{}",
        server.leases()
    );
    let table = agent.cli("leases", false);
    let row = table
        .lines()
        .find(|l| l.contains("default/v6pod"))
        .unwrap_or_else(|| panic!("no row for the pod:\n{table}"));
    assert!(
        row.contains("ipv6") && row.contains(&format!("{addr}/64")) && row.contains("Bound"),
        "{table}"
    );
    // CHECK passes while the address is on the interface.
    let c = call("CHECK", "v6pod", pod, &conf);
    assert!(c.ok, "CHECK failed: {}", c.text());

    let d = call("DEL", "v6pod", pod, &conf);
    assert!(d.ok, "DEL failed: {}\nagent:\n{}", d.text(), agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the RELEASE was not honoured: dnsmasq still holds {addr}:\n{}\nlog:\n{}",
        server.leases(),
        server.log()
    );
    assert!(server.log().contains("DHCPRELEASE"), "{}", server.log());
    assert!(!pod_has(pod, &addr), "{addr} still on eth0");
    assert!(
        !agent.cli("leases", false).contains("v6pod"),
        "the attachment is forgotten"
    );
}

/// A restarted agent resumes the stored IPv6 lease with a REBIND (no new
/// SOLICIT), keeps the same address, and still releases it at DEL.
#[test]
fn a_restarted_agent_resumes_the_ipv6_lease_with_rebind() {
    let lab = Lab::builder().server_behind_uplink().build();
    let server = Dnsmasq6::start(lab.dhcp_ns());
    let mut agent = AgentProcess::start(&[]);
    let pod = &lab.clients[0].ns;
    let conf = conf(&agent.socket);

    let addr = leased(&call("ADD", "v6again", pod, &conf), &agent);
    let solicits = server.log().matches("DHCPSOLICIT").count();
    agent.kill_and_restart();
    assert!(
        wait_until(Duration::from_secs(10), || server
            .log()
            .contains("DHCPREBIND")),
        "no REBIND after the restart:\n{}\nagent:\n{}",
        server.log(),
        agent.log()
    );
    assert_eq!(
        server.log().matches("DHCPSOLICIT").count(),
        solicits,
        "the resumed lease solicited again"
    );
    assert!(
        wait_until(Duration::from_secs(5), || {
            let t = agent.cli("leases", false);
            t.lines()
                .any(|l| l.contains("v6again") && l.contains(&addr) && l.contains("Bound"))
        }),
        "{}",
        agent.cli("leases", false)
    );
    assert!(pod_has(pod, &addr));
    // A repeated ADD returns the lease held.
    let again = call("ADD", "v6again", pod, &conf);
    assert_eq!(leased(&again, &agent), addr);

    let d = call("DEL", "v6again", pod, &conf);
    assert!(d.ok, "DEL failed: {}", d.text());
    assert!(
        wait_until(Duration::from_secs(5), || !server.leases().contains(&addr)),
        "the resumed lease was not released:\n{}",
        server.log()
    );
}

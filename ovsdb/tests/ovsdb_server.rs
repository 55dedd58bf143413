//! The OVSDB client and the node watcher against a real `ovsdb-server`
//! (Debian 12's Open vSwitch 3.1): each test runs its own server on a
//! database of its own in a temporary directory, and changes it with
//! `ovs-vsctl --no-wait` (no `ovs-vswitchd` runs).
//!
//! The programs come from the one program table (`testbed/src/programs.rs`),
//! which `cargo xtask setup` installs from; a missing one fails the test,
//! as a test of the project does rather than skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use xdhcp_ovsdb::{
    Client, Datapath, NodeState, NodeView, NodeWatch, Operation, OperationResult, UplinkKind,
    VSWITCH_DB, ViewWarning, WatchOptions, node_view,
};

/// The executable (or file) of `name` in the program table.
///
/// # Panics
/// If the table lacks it, or its Debian package is not installed.
#[track_caller]
fn program(name: &str) -> &'static Path {
    let p = xdhcp_testbed::programs::find(name).unwrap_or_else(|| {
        panic!("`{name}` is not in the program table (testbed/src/programs.rs)")
    });
    let exe = Path::new(p.executable());
    assert!(
        exe.exists(),
        "{} is missing: run `cargo xtask setup` (it installs the Debian package {})",
        exe.display(),
        p.package().unwrap_or("?")
    );
    exe
}

/// An `ovsdb-server` on a database of its own, killed (and its directory
/// removed) on drop, also when the test fails.
struct Server {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    /// A new database (`ovs-vsctl init` done) and a server on it.
    fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdhcp-ovsdb-")
            .tempdir()
            .expect("temp dir");
        let mut s = Self { dir, child: None };
        s.create_db();
        s.run();
        s.vsctl(&["init"]);
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn socket(&self) -> PathBuf {
        self.path("db.sock")
    }

    /// Creates (or replaces) the database file.
    fn create_db(&self) {
        let db = self.path("db");
        let _ = std::fs::remove_file(&db);
        let out = Command::new(program("ovsdb-tool"))
            .arg("create")
            .arg(&db)
            .arg(program("vswitch.ovsschema"))
            .output()
            .expect("run ovsdb-tool");
        assert!(
            out.status.success(),
            "ovsdb-tool create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server (in the foreground: it is our child) and waits for
    /// its socket to accept connections.
    fn run(&mut self) {
        assert!(self.child.is_none(), "the server runs already");
        let arg = |flag: &str, name: &str| format!("{flag}{}", self.path(name).display());
        let child = Command::new(program("ovsdb-server"))
            .arg(self.path("db"))
            .arg(arg("--remote=punix:", "db.sock"))
            .arg(arg("--unixctl=", "ctl"))
            .arg(arg("--pidfile=", "pid"))
            .arg("--no-chdir")
            .arg(arg("--log-file=", "log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ovsdb-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("ovsdb-server exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "ovsdb-server's socket did not open in 10 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("log")).unwrap_or_default()
    }

    /// SIGKILLs the server (no goodbye on the socket) and removes what it
    /// leaves behind.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for f in ["db.sock", "ctl", "pid"] {
            let _ = std::fs::remove_file(self.path(f));
        }
    }

    /// Sends `signal` to the server.
    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("the server runs");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: kill has no memory effects; the pid is our own child's,
        // not yet reaped.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {signal}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// `ovs-vsctl --no-wait` on this server.
    fn vsctl(&self, args: &[&str]) {
        let out = Command::new(program("ovs-vsctl"))
            .arg(format!("--db=unix:{}", self.socket().display()))
            .arg("--no-wait")
            .args(args)
            .output()
            .expect("run ovs-vsctl");
        assert!(
            out.status.success(),
            "ovs-vsctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Watcher options for tests: a short backoff, so a restart is picked up
/// quickly.
fn options() -> WatchOptions {
    WatchOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..WatchOptions::default()
    }
}

/// Waits up to 10 s for a state that `pred` accepts and returns it.
async fn wait_for(
    rx: &mut watch::Receiver<NodeState>,
    what: &str,
    pred: impl Fn(&NodeState) -> bool,
) -> NodeState {
    let got = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| pred(s)))
        .await
        .map(|r| r.map(|state| state.clone()));
    match got {
        Ok(Ok(state)) => state,
        Ok(Err(watch::error::RecvError { .. })) => panic!("the watcher ended waiting for {what}"),
        Err(tokio::time::error::Elapsed { .. }) => {
            panic!("no {what} in 10 s; last state: {:#?}", *rx.borrow())
        }
    }
}

fn ready(state: &NodeState) -> Option<&NodeView> {
    match state {
        NodeState::Ready(v) => Some(v),
        NodeState::Unavailable { .. } => None,
    }
}

fn uplink_names(v: &NodeView, physnet: &str) -> Vec<String> {
    v.uplinks_of(physnet).map(|u| u.ifname.clone()).collect()
}

/// The provider bridge of an OVN-Kubernetes localnet: a NIC, an OVS bond,
/// the patch port ovn-controller adds and the bridge's own internal port.
fn provider_bridge(s: &Server) {
    s.vsctl(&["add-br", "br-int"]);
    s.vsctl(&["add-br", "br-ex"]);
    s.vsctl(&["add-port", "br-ex", "eth1"]);
    s.vsctl(&["add-bond", "br-ex", "bond0", "ens1f0", "ens1f1"]);
    s.vsctl(&[
        "add-port",
        "br-ex",
        "patch-localnet-to-br-int",
        "--",
        "set",
        "interface",
        "patch-localnet-to-br-int",
        "type=patch",
        "options:peer=patch-br-int-to-localnet",
        "external_ids:ovn-localnet-port=localnet",
    ]);
    s.vsctl(&[
        "add-port",
        "br-ex",
        "mgmt0",
        "--",
        "set",
        "interface",
        "mgmt0",
        "type=internal",
    ]);
}

/// Set the node's `ovn-bridge-mappings` (`physnet:bridge,…`).
fn map(s: &Server, mappings: &str) {
    s.vsctl(&[
        "set",
        "open_vswitch",
        ".",
        &format!("external_ids:ovn-bridge-mappings={mappings}"),
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_bridge_lists_nic_and_bond_members_not_patch_or_internal() {
    let s = Server::start();
    provider_bridge(&s);
    map(&s, "physnet1:br-ex");

    let mut rx = NodeWatch::spawn(s.socket(), options());
    let state = wait_for(&mut rx, "a ready view", |st| ready(st).is_some()).await;
    let v = ready(&state).unwrap();
    assert_eq!(
        uplink_names(v, "physnet1"),
        ["ens1f0", "ens1f1", "eth1"],
        "{v:#?}"
    );
    for u in &v.uplinks {
        assert_eq!(u.bridge, "br-ex");
        assert_eq!(u.datapath, Datapath::System);
        assert_eq!(u.kind, UplinkKind::System);
        let bonded = u.ifname.starts_with("ens1f");
        assert_eq!(u.bond.as_deref(), bonded.then_some("bond0"), "{u:?}");
    }
    assert_eq!(v.warnings, [], "{v:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_added_at_run_time_reaches_the_view_within_a_second() {
    let s = Server::start();
    provider_bridge(&s);
    s.vsctl(&["set", "bridge", "br-ex", "datapath_type=netdev"]);
    let mut rx = NodeWatch::spawn(s.socket(), options());
    let state = wait_for(&mut rx, "a ready view", |st| ready(st).is_some()).await;
    assert_eq!(ready(&state).unwrap().uplinks, []);

    let start = Instant::now();
    map(&s, "physnet1:br-ex");
    let written = start.elapsed();
    let state = wait_for(&mut rx, "the mapping's uplinks", |st| {
        ready(st).is_some_and(|v| !v.uplinks.is_empty())
    })
    .await;
    let took = start.elapsed();
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!(
            "mapping change -> view: {took:?} from the start of ovs-vsctl \
             ({:?} after ovs-vsctl returned)",
            took.saturating_sub(written)
        );
    }
    assert!(took < Duration::from_secs(1), "{took:?}");
    let v = ready(&state).unwrap();
    assert_eq!(uplink_names(v, "physnet1"), ["ens1f0", "ens1f1", "eth1"]);
    assert!(
        v.uplinks.iter().all(|u| u.datapath == Datapath::Netdev),
        "{v:#?}"
    );

    // A malformed mapping is a warning, the good entries still count.
    map(&s, "\"physnet1:br-ex,nocolon,physnet2:br-none\"");
    let state = wait_for(&mut rx, "the malformed mapping's warnings", |st| {
        ready(st).is_some_and(|v| !v.warnings.is_empty())
    })
    .await;
    let v = ready(&state).unwrap();
    assert_eq!(uplink_names(v, "physnet1"), ["ens1f0", "ens1f1", "eth1"]);
    assert_eq!(
        v.warnings,
        [
            ViewWarning::MappingWithoutColon {
                entry: "nocolon".into()
            },
            ViewWarning::MappedBridgeMissing {
                physnet: "physnet2".into(),
                bridge: "br-none".into()
            }
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_added_removed_and_renamed_show_in_the_view() {
    let s = Server::start();
    provider_bridge(&s);
    map(&s, "physnet1:br-ex");
    let mut rx = NodeWatch::spawn(s.socket(), options());
    let names_are = |want: &'static [&'static str]| {
        move |st: &NodeState| ready(st).is_some_and(|v| uplink_names(v, "physnet1") == want)
    };
    wait_for(
        &mut rx,
        "the first view",
        names_are(&["ens1f0", "ens1f1", "eth1"]),
    )
    .await;

    s.vsctl(&["add-port", "br-ex", "eth2"]);
    wait_for(
        &mut rx,
        "eth2 added",
        names_are(&["ens1f0", "ens1f1", "eth1", "eth2"]),
    )
    .await;

    // A name is immutable in the schema: a rename is a delete and an insert.
    s.vsctl(&[
        "del-port", "br-ex", "eth2", "--", "add-port", "br-ex", "eth3",
    ]);
    wait_for(
        &mut rx,
        "eth2 renamed eth3",
        names_are(&["ens1f0", "ens1f1", "eth1", "eth3"]),
    )
    .await;

    s.vsctl(&["del-port", "br-ex", "eth1"]);
    wait_for(
        &mut rx,
        "eth1 removed",
        names_are(&["ens1f0", "ens1f1", "eth3"]),
    )
    .await;

    // A bond member removed: the bond of one is a plain port.
    s.vsctl(&["del-port", "bond0", "--", "add-port", "br-ex", "ens1f1"]);
    let state = wait_for(&mut rx, "the bond undone", |st| {
        ready(st).is_some_and(|v| v.uplinks.iter().all(|u| u.bond.is_none()))
    })
    .await;
    assert_eq!(
        uplink_names(ready(&state).unwrap(), "physnet1"),
        ["ens1f1", "eth3"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_port_with_ovn_kubernetes_external_ids_is_read_right() {
    let s = Server::start();
    s.vsctl(&["add-br", "br-int"]);
    // As OVN-Kubernetes' CNI adds a secondary-network pod port.
    s.vsctl(&[
        "add-port",
        "br-int",
        "0123456789abcde_3",
        "other_config:transient=true",
        "--",
        "set",
        "interface",
        "0123456789abcde_3",
        "external_ids:iface-id=my.ns.loc.dhcp_my-ns_pod1",
        "external_ids:iface-id-ver=6f1c2a52-1d2e-4b7a-9a51-3c2f0e7e9b10",
        "external_ids:attached_mac=0a:58:0a:80:00:05",
        "external_ids:sandbox=0123456789abcdef0123",
        "external_ids:pod-if-name=net1",
        "external_ids:\"k8s.ovn.org/network\"=my-ns_loc",
        "external_ids:\"k8s.ovn.org/nad\"=\"my-ns/loc-dhcp\"",
    ]);
    // The management port binds a logical port but is internal.
    s.vsctl(&[
        "add-port",
        "br-int",
        "ovn-k8s-mp0",
        "--",
        "set",
        "interface",
        "ovn-k8s-mp0",
        "type=internal",
        "external_ids:iface-id=k8s-node1",
    ]);
    let mut rx = NodeWatch::spawn(s.socket(), options());
    let state = wait_for(&mut rx, "the pod port", |st| {
        ready(st).is_some_and(|v| !v.workloads.is_empty())
    })
    .await;
    let v = ready(&state).unwrap();
    assert_eq!(v.workloads.len(), 1, "{v:#?}");
    let w = &v.workloads[0];
    assert_eq!(w.ifname, "0123456789abcde_3");
    assert_eq!(w.iface_id, "my.ns.loc.dhcp_my-ns_pod1");
    assert_eq!(
        w.pod_uid.as_deref(),
        Some("6f1c2a52-1d2e-4b7a-9a51-3c2f0e7e9b10")
    );
    assert_eq!(
        w.attached_mac.map(|m| m.to_string()).as_deref(),
        Some("0a:58:0a:80:00:05")
    );
    assert_eq!(w.sandbox.as_deref(), Some("0123456789abcdef0123"));
    assert_eq!(w.pod_if_name.as_deref(), Some("net1"));
    assert_eq!(w.network.as_deref(), Some("my-ns_loc"));
    assert_eq!(w.nad.as_deref(), Some("my-ns/loc-dhcp"));
    assert_eq!((w.vf_netdev_name.as_deref(), w.vf_is_vfio), (None, false));
    assert!(!w.ovn_installed);

    // ovn-controller marks the port wired.
    s.vsctl(&[
        "set",
        "interface",
        "0123456789abcde_3",
        "external_ids:ovn-installed=true",
    ]);
    wait_for(&mut rx, "ovn-installed", |st| {
        ready(st).is_some_and(|v| v.workloads.iter().any(|w| w.ovn_installed))
    })
    .await;

    // An SR-IOV VF representor for a VM (VFIO).
    s.vsctl(&[
        "add-port",
        "br-int",
        "ens1f0_3",
        "--",
        "set",
        "interface",
        "ens1f0_3",
        "external_ids:iface-id=ns2_vm1",
        "external_ids:vf-netdev-name=ens1f0v3",
        "external_ids:vf-is-vfio=true",
    ]);
    let state = wait_for(&mut rx, "the VF representor", |st| {
        ready(st).is_some_and(|v| v.workloads.len() == 2)
    })
    .await;
    let vf = ready(&state)
        .unwrap()
        .workload("ens1f0_3")
        .cloned()
        .unwrap();
    assert_eq!(vf.vf_netdev_name.as_deref(), Some("ens1f0v3"));
    assert!(vf.vf_is_vfio);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_reconnects_and_resyncs_after_the_server_is_killed() {
    let mut s = Server::start();
    provider_bridge(&s);
    map(&s, "physnet1:br-ex");
    let mut rx = NodeWatch::spawn(s.socket(), options());
    wait_for(&mut rx, "the first view", |st| {
        ready(st).is_some_and(|v| uplink_names(v, "physnet1").len() == 3)
    })
    .await;

    s.kill();
    wait_for(&mut rx, "unavailable", |st| {
        matches!(st, NodeState::Unavailable { .. })
    })
    .await;

    // Same database: the watcher comes back with a live monitor.
    s.run();
    wait_for(&mut rx, "ready again", |st| ready(st).is_some()).await;
    s.vsctl(&["add-port", "br-ex", "eth7"]);
    wait_for(&mut rx, "eth7 after the restart", |st| {
        ready(st).is_some_and(|v| uplink_names(v, "physnet1").contains(&"eth7".to_owned()))
    })
    .await;

    // Another database behind the same socket: the old rows must be gone
    // (a replica merged with the old one would keep a second Open_vSwitch
    // row and br-ex).
    s.kill();
    wait_for(&mut rx, "unavailable", |st| {
        matches!(st, NodeState::Unavailable { .. })
    })
    .await;
    s.create_db();
    s.run();
    s.vsctl(&["init"]);
    s.vsctl(&["add-br", "br-int"]);
    s.vsctl(&["add-br", "br-new", "--", "add-port", "br-new", "eth9"]);
    map(&s, "physnet1:br-new");
    let state = wait_for(&mut rx, "the new database's view", |st| {
        ready(st).is_some_and(|v| uplink_names(v, "physnet1") == ["eth9"])
    })
    .await;
    let v = ready(&state).unwrap();
    assert_eq!(v.warnings, [], "{v:#?}");
    assert_eq!(v.uplinks.len(), 1, "{v:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_is_found_by_the_echo_probe_and_picked_up_again() {
    let s = Server::start();
    provider_bridge(&s);
    map(&s, "physnet1:br-ex");
    let mut rx = NodeWatch::spawn(
        s.socket(),
        WatchOptions {
            probe_interval: Some(Duration::from_millis(100)),
            reply_timeout: Duration::from_secs(1),
            ..options()
        },
    );
    wait_for(&mut rx, "the first view", |st| ready(st).is_some()).await;

    // Stopped, the server keeps its socket open and answers nothing.
    s.signal(libc::SIGSTOP);
    let state = wait_for(&mut rx, "unavailable", |st| {
        matches!(st, NodeState::Unavailable { .. })
    })
    .await;
    let NodeState::Unavailable { reason } = state else {
        unreachable!()
    };
    assert!(reason.contains("echo"), "{reason}");
    s.signal(libc::SIGCONT);
    let state = wait_for(&mut rx, "ready again", |st| ready(st).is_some()).await;
    assert_eq!(
        uplink_names(ready(&state).unwrap(), "physnet1"),
        ["ens1f0", "ens1f1", "eth1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selects_read_what_the_monitor_replicates() {
    let s = Server::start();
    provider_bridge(&s);
    map(&s, "physnet1:br-ex");
    let (client, _events) = Client::connect(&s.socket()).await.expect("connect");
    let schema = client.get_schema(VSWITCH_DB).await.expect("get_schema");
    let monitor = client
        .monitor(VSWITCH_DB, schema, &xdhcp_ovsdb::monitor_requests())
        .await
        .expect("monitor");
    assert_eq!(monitor.kind, xdhcp_ovsdb::MonitorKind::Cond);
    let results = client
        .transact(
            VSWITCH_DB,
            &[Operation::Select {
                table: "Bridge".into(),
                conditions: Vec::new(),
                columns: Some(vec!["name".into(), "ports".into()]),
            }],
        )
        .await
        .expect("transact");
    let [OperationResult::Rows(rows)] = results.as_slice() else {
        panic!("{results:?}")
    };
    let mut names: Vec<_> = rows.iter().map(|r| r.str("name")).collect();
    names.sort_unstable();
    assert_eq!(names, ["br-ex", "br-int"]);
    let mut replicated: Vec<_> = monitor
        .replica
        .rows("Bridge")
        .map(|(_, r)| r.str("name"))
        .collect();
    replicated.sort_unstable();
    assert_eq!(replicated, names);
    let v = node_view(&monitor.replica, &xdhcp_ovsdb::ViewOptions::default());
    assert_eq!(uplink_names(&v, "physnet1"), ["ens1f0", "ens1f1", "eth1"]);

    // A failed operation is a typed error naming it.
    let err = client
        .transact(
            VSWITCH_DB,
            &[Operation::Select {
                table: "NoSuchTable".into(),
                conditions: Vec::new(),
                columns: None,
            }],
        )
        .await
        .expect_err("no such table");
    assert!(
        matches!(&err, xdhcp_ovsdb::Error::Operation { index: 0, error, .. } if error == "syntax error"),
        "{err}"
    );
}

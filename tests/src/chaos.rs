//! What an operator (or anything else on the node) may do to the agent's
//! capture from outside, for the fault tests and the soak's chaos schedule:
//! detach its BPF links with `bpftool`, delete TC filters and the `clsact`
//! qdisc with `tc`, take an interface down and up with `ip`, flood a pod
//! with junk DHCP replies.
//!
//! Every action takes the interface's network namespace as a path
//! (`/var/run/netns/<name>`, a pod's `CNI_NETNS`; `None`: the test
//! process's own) and runs there. An action with nothing to act on (no
//! link, no filter, no qdisc) is not an error: it says so in its result,
//! so a chaos schedule may fire any of them at any interface at any time.
//!
//! ```no_run
//! use std::time::Duration;
//! use xdhcp_tests::chaos;
//!
//! let ns = std::path::Path::new("/var/run/netns/xdt-1-0");
//! let detached = chaos::detach_links(Some(ns), "eth0"); // tcx links on eth0
//! chaos::delete_tc_filters(Some(ns), "eth0");
//! chaos::delete_clsact(Some(ns), "eth0");
//! chaos::flap(Some(ns), "eth0", Duration::from_millis(200));
//! // Junk replies to a pod, from its bridge port in the switch's namespace.
//! let sw = std::path::Path::new("/var/run/netns/xdt-1-1");
//! chaos::flood_replies(Some(sw), "vp0", [2, 0, 0, 0, 0, 1], 5000);
//! ```

use std::io;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::frames;

/// `bpf(2)` commands and attach types used here (`include/uapi/linux/bpf.h`).
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
/// At most this many links per hook are listed (the agent holds one).
const QUERY_MAX: usize = 64;

/// Runs `f` in `netns` (on a thread of its own) or here.
fn in_ns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> T {
    match netns {
        None => f(),
        Some(p) => xdhcp::sys::netns::run_in_netns(p, f)
            .unwrap_or_else(|e| panic!("enter {}: {e}", p.display())),
    }
}

/// Runs the table program `program` with `args` in `netns`: its output,
/// whatever its exit status (a child process is made in the namespace of
/// the thread that forks it).
fn run_in(netns: Option<&Path>, program: &str, args: &[&str]) -> Output {
    let exe = crate::program(program);
    let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    in_ns(netns, move || {
        Command::new(exe)
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()))
    })
}

/// The kernel ids of the BPF links attached at `ifname`'s tcx hooks
/// (ingress and egress) in `netns`, asked of the kernel there
/// (`BPF_PROG_QUERY`), so an interface of the same name or index in another
/// namespace is never confused with it. Empty when nothing is attached.
///
/// # Errors
/// When the interface does not exist or the kernel refuses the query.
pub fn tcx_links(netns: Option<&Path>, ifname: &str) -> io::Result<Vec<u32>> {
    let ifname = ifname.to_owned();
    in_ns(netns, move || {
        let ifindex = nix::net::if_::if_nametoindex(ifname.as_str()).map_err(io::Error::from)?;
        let mut ids = query_tcx(ifindex, BPF_TCX_INGRESS)?;
        ids.extend(query_tcx(ifindex, BPF_TCX_EGRESS)?);
        Ok(ids)
    })
}

/// `BPF_PROG_QUERY` of one tcx hook: its link ids.
fn query_tcx(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut prog_ids = [0u32; QUERY_MAX];
    let mut link_ids = [0u32; QUERY_MAX];
    // The `query` member of `union bpf_attr`: target_ifindex, attach_type,
    // query_flags, attach_flags, prog_ids (u64 pointer), count, padding,
    // prog_attach_flags, link_ids, link_attach_flags, revision.
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&ifindex.to_ne_bytes());
    attr[4..8].copy_from_slice(&attach_type.to_ne_bytes());
    attr[16..24].copy_from_slice(&(prog_ids.as_mut_ptr() as u64).to_ne_bytes());
    attr[24..28].copy_from_slice(&(QUERY_MAX as u32).to_ne_bytes());
    attr[40..48].copy_from_slice(&(link_ids.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: `attr` is a zeroed `union bpf_attr` prefix of the size passed;
    // the kernel writes at most `count` ids into each array, which hold
    // QUERY_MAX.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let count = u32::from_ne_bytes(attr[24..28].try_into().expect("4 bytes")) as usize;
    Ok(link_ids[..count.min(QUERY_MAX)]
        .iter()
        .copied()
        .filter(|&id| id != 0)
        .collect())
}

/// `bpftool link detach id <id>`: the link stays open in its holder (the
/// agent), attached to nothing.
///
/// # Panics
/// When `bpftool` fails (no such link).
pub fn detach_link(id: u32) {
    let out = run_in(None, "bpftool", &["link", "detach", "id", &id.to_string()]);
    assert!(
        out.status.success(),
        "bpftool link detach id {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Detaches every BPF link at `ifname`'s tcx hooks in `netns` (see
/// [`tcx_links`], [`detach_link`]); the ids detached, empty when there was
/// none (the interface gone, or nothing attached). XDP links cannot be told
/// apart across namespaces from outside: detach those by the id the agent's
/// status names, with [`detach_link`].
pub fn detach_links(netns: Option<&Path>, ifname: &str) -> Vec<u32> {
    let ids = tcx_links(netns, ifname).unwrap_or_default();
    for &id in &ids {
        detach_link(id);
    }
    ids
}

/// `tc filter del dev <ifname> ingress` and `… egress` in `netns`: whether
/// either removed something (they fail without a `clsact` qdisc, as on a
/// kernel whose TC programs are tcx links and no other tool added one).
pub fn delete_tc_filters(netns: Option<&Path>, ifname: &str) -> bool {
    let mut any = false;
    for hook in ["ingress", "egress"] {
        any |= run_in(netns, "tc", &["filter", "del", "dev", ifname, hook])
            .status
            .success();
    }
    any
}

/// `tc qdisc del dev <ifname> clsact` in `netns`: whether there was one (it
/// takes every netlink TC filter on the device with it).
pub fn delete_clsact(netns: Option<&Path>, ifname: &str) -> bool {
    run_in(netns, "tc", &["qdisc", "del", "dev", ifname, "clsact"])
        .status
        .success()
}

/// `tc qdisc add dev <ifname> clsact` in `netns` (as another tool on the
/// node might): whether it was added (`false`: there is one already).
pub fn add_clsact(netns: Option<&Path>, ifname: &str) -> bool {
    run_in(netns, "tc", &["qdisc", "add", "dev", ifname, "clsact"])
        .status
        .success()
}

/// Takes `ifname` in `netns` down, waits `down_for`, and brings it up.
///
/// # Panics
/// When `ip` fails (the interface does not exist).
pub fn flap(netns: Option<&Path>, ifname: &str, down_for: Duration) {
    for (state, wait) in [("down", down_for), ("up", Duration::ZERO)] {
        let out = run_in(netns, "ip", &["link", "set", "dev", ifname, state]);
        assert!(
            out.status.success(),
            "ip link set dev {ifname} {state}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(wait);
    }
}

/// Where [`flood_replies`] says its junk comes from (a server that does not
/// exist, from a locally administered MAC).
const JUNK_SERVER: [u8; 4] = [198, 18, 0, 254];
const JUNK_MAC: [u8; 6] = [0x02, 0xf1, 0x00, 0x00, 0x00, 0x02];

/// Sends `count` well-formed DHCPOFFERs for `dst_mac` out of `ifname` in
/// `netns`, each with a fresh transaction id (so no lease owns it), as
/// fast as the socket takes them: junk every capture program on the way to
/// `dst_mac` copies to the agent's ring buffer. Sent from the switch side
/// of a pod's link (its bridge port) they reach the pod's interface. The
/// frames the kernel took.
///
/// # Panics
/// When `ifname` does not exist in `netns`.
pub fn flood_replies(netns: Option<&Path>, ifname: &str, dst_mac: [u8; 6], count: usize) -> usize {
    send_offers(netns, ifname, dst_mac, count, None)
}

/// [`flood_replies`], every frame with transaction id `xid` (one the
/// kernel owns, so the capture programs copy each into the ring).
pub fn flood_replies_with_xid(
    netns: Option<&Path>,
    ifname: &str,
    dst_mac: [u8; 6],
    count: usize,
    xid: u32,
) -> usize {
    send_offers(netns, ifname, dst_mac, count, Some(xid))
}

/// `count` OFFERs to `dst_mac` out of `ifname`: each with `fixed` as its
/// xid, else a fresh one per frame.
fn send_offers(
    netns: Option<&Path>,
    ifname: &str,
    dst_mac: [u8; 6],
    count: usize,
    fixed: Option<u32>,
) -> usize {
    let ifname = ifname.to_owned();
    in_ns(netns, move || {
        let ifindex = nix::net::if_::if_nametoindex(ifname.as_str())
            .unwrap_or_else(|e| panic!("no interface {ifname}: {e}"));
        let fd = crate::netns::packet_socket_here(ifindex, 0, None)
            .unwrap_or_else(|e| panic!("AF_PACKET socket on {ifname}: {e}"));
        let mut frame = offer_frame(dst_mac);
        let mut xid: u32 = 0x5eed_0001;
        let mut sent = 0;
        for _ in 0..count {
            // xorshift: a fresh xid per frame.
            xid ^= xid << 13;
            xid ^= xid >> 17;
            xid ^= xid << 5;
            let xid = fixed.unwrap_or(xid);
            frame[frames::XID_AT..frames::XID_AT + 4].copy_from_slice(&xid.to_be_bytes());
            // SAFETY: `fd` is an open packet socket bound to `ifindex`;
            // `frame` is readable for its length.
            let rc = unsafe {
                libc::send(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                )
            };
            if rc > 0 {
                sent += 1;
            }
        }
        sent
    })
}

/// A DHCPOFFER for `mac` from the junk server, to `mac` at the broadcast
/// address (the xid is set per frame at [`frames::XID_AT`]).
fn offer_frame(mac: [u8; 6]) -> Vec<u8> {
    let reply = frames::Reply {
        kind: dhcproto::v4::MessageType::Offer,
        xid: 0,
        chaddr: mac,
        yiaddr: Ipv4Addr::new(198, 18, 0, 100),
        server: Ipv4Addr::from(JUNK_SERVER),
        mask: Ipv4Addr::new(255, 255, 255, 0),
    };
    frames::server_reply(JUNK_MAC, mac, Ipv4Addr::BROADCAST, &reply)
}

//! The DHCP guard's attach on a fresh workload port, timed both ways the
//! agent can make it: a netlink TC filter on a new `clsact` qdisc (kernels
//! before 6.6) and a tcx BPF link (`BPF_LINK_CREATE`, 6.6 and later).
//!
//! Testbed: one network namespace of its own holding `2 × reps` fresh veth
//! pairs (made up front, up). The guard's ingress program
//! (`xdhcp_guard_ingress`, from the object embedded in the agent) is loaded
//! once; then, rep after rep, one fresh port gets the netlink pair (the
//! qdisc, then the filter, each timed) and another the tcx link, the order
//! of the two alternating from rep to rep, so the machine's load falls on
//! both alike. Each is then taken off (timed too: the DEL's detach).
//! Medians and the 10th / 90th percentiles, in µs, to stdout.
//!
//! `XDHCP_BENCH_GUARD_REPS` (default 200). Needs root and a kernel with
//! tcx (6.6 or later).
#![expect(clippy::print_stdout, reason = "a benchmark report")]

use std::time::{Duration, Instant};

use aya::programs::SchedClassifier;
use aya::programs::links::{Link as _, LinkOrder};
use aya::programs::tc::{NlOptions, TcAttachOptions, TcAttachType, qdisc_add_clsact};
use xdhcp_tests::NetNs;

#[derive(Default)]
struct Times {
    qdisc: Vec<Duration>,
    filter: Vec<Duration>,
    netlink_total: Vec<Duration>,
    netlink_detach: Vec<Duration>,
    tcx: Vec<Duration>,
    tcx_detach: Vec<Duration>,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn row(name: &str, v: &[Duration]) {
    let mut v = v.to_vec();
    v.sort_unstable();
    // The `pct`-th percentile, nearest rank.
    let at = |pct: usize| us(v[((v.len() - 1) * pct + 50) / 100]);
    println!(
        "| {name} | {:.0} | {:.0} | {:.0} | {} |",
        at(50),
        at(10),
        at(90),
        v.len()
    );
}

fn main() {
    let reps: usize = std::env::var("XDHCP_BENCH_GUARD_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let ns = NetNs::new();
    for i in 0..2 * reps {
        ns.ip(&[
            "link",
            "add",
            &format!("ga{i}"),
            "type",
            "veth",
            "peer",
            "name",
            &format!("gb{i}"),
        ]);
        ns.link_up(&format!("ga{i}"));
        ns.link_up(&format!("gb{i}"));
    }
    let times = ns.run_in(move || {
        let mut ebpf = aya::EbpfLoader::new()
            .load(xdhcp::datapath::ebpf::embedded_object())
            .expect("load the object");
        let prog: &mut SchedClassifier = ebpf
            .program_mut(xdhcp_common::guard::PROG_GUARD_INGRESS)
            .expect("the guard's ingress program")
            .try_into()
            .expect("a sched_cls program");
        prog.load().expect("verify the guard's ingress program");
        let mut t = Times::default();
        for rep in 0..reps {
            let (nl_port, tcx_port) = (format!("ga{}", 2 * rep), format!("ga{}", 2 * rep + 1));
            let netlink = |t: &mut Times, prog: &mut SchedClassifier| {
                let t0 = Instant::now();
                qdisc_add_clsact(&nl_port).expect("clsact");
                let t1 = Instant::now();
                let id = prog
                    .attach_with_options(
                        &nl_port,
                        TcAttachType::Ingress,
                        TcAttachOptions::Netlink(NlOptions::default()),
                    )
                    .expect("netlink filter");
                let t2 = Instant::now();
                t.qdisc.push(t1 - t0);
                t.filter.push(t2 - t1);
                t.netlink_total.push(t2 - t0);
                id
            };
            let tcx = |t: &mut Times, prog: &mut SchedClassifier| {
                let t0 = Instant::now();
                let id = prog
                    .attach_with_options(
                        &tcx_port,
                        TcAttachType::Ingress,
                        TcAttachOptions::TcxOrder(LinkOrder::default()),
                    )
                    .expect("tcx link");
                t.tcx.push(t0.elapsed());
                id
            };
            let (nl_id, tcx_id) = if rep % 2 == 0 {
                let n = netlink(&mut t, prog);
                (n, tcx(&mut t, prog))
            } else {
                let x = tcx(&mut t, prog);
                (netlink(&mut t, prog), x)
            };
            let nl_link = prog.take_link(nl_id).expect("the filter");
            let tcx_link = prog.take_link(tcx_id).expect("the link");
            let t0 = Instant::now();
            nl_link.detach().expect("filter off");
            t.netlink_detach.push(t0.elapsed());
            let t0 = Instant::now();
            tcx_link.detach().expect("link off");
            t.tcx_detach.push(t0.elapsed());
        }
        t
    });
    println!("guard ingress attach on a fresh veth, {reps} interleaved pairs (µs)\n");
    println!("| step | median | p10 | p90 | n |");
    println!("|---|---|---|---|---|");
    row("netlink: clsact qdisc", &times.qdisc);
    row("netlink: first filter", &times.filter);
    row("netlink: qdisc + filter", &times.netlink_total);
    row("tcx: BPF_LINK_CREATE", &times.tcx);
    row("netlink: filter delete", &times.netlink_detach);
    row("tcx: link detach", &times.tcx_detach);
}

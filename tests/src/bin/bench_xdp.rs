//! `cargo xtask bench xdp`: nanoseconds per packet of the xdhcp XDP program
//! (and its TC twin), and of the pair attached to node uplinks
//! (`xdhcp_uplink_xdp`, `xdhcp_uplink_tc`: the same parser, the mode from
//! the uplinks' own map), through `BPF_PROG_TEST_RUN`, next to a do-nothing
//! `XDP_PASS` program from the same object and a do-nothing TC program (the
//! guard object's), loaded in the same run; then the DHCP guard's TC
//! ingress program and its XDP twin beside the same two. Every figure is
//! also given as a ratio to the reference of its kind measured in the same
//! run: a program's non-DHCP cost to the bare program of its hook, a
//! capture to the floor for its frame size (below).
//!
//! Frames: a 60-byte TCP/IPv4 frame (the non-DHCP fast path), and captured
//! DHCP OFFERs of 342 and 1514 bytes whose xid is owned (the programs copy
//! only replies to an owned xid; observe mode: classified, looked up,
//! copied in full into the ring buffer, passed; and the 342-byte one in
//! intercept mode, where it is also dropped after the copy). Needs root.
//!
//! Every figure is the kernel's own per-repetition time (`duration` of
//! `BPF_PROG_TEST_RUN`, integer ns), never wall clock: a wall-clock figure
//! also counts what the syscall does around the timed loop (for XDP with
//! `repeat > 1` the kernel re-patches the XDP dispatcher and waits for an RCU
//! grace period) and the time this process spends preempted on a shared
//! machine. Programs are interleaved round by round (capture runs run by
//! run, see `measure`) so drift hits all of them alike, and each figure is the interquartile mean of the samples
//! (the mean of the middle half: robust like a median, finer than the
//! kernel's integer nanoseconds). A sample is one run (`FAST_RUNS` per round
//! without capture, `DHCP_BATCHES` with), so that the runs another process
//! disturbed fall outside the middle half.
//!
//! Non-DHCP: runs with a large repeat count.
//!
//! DHCP: the 1 MiB ring holds a bounded number of records (records are sized
//! for the frame, `FRAME_BUCKETS`: ~2380 for 342 bytes, ~660 for 1514), so
//! each round is a set of runs of `B` repetitions (four fifths of what the
//! ring holds), and between runs, outside the timed region, the agent's own
//! reader (`EventReader`: record and frame checks, the DHCP payload handed
//! on undecoded as in the agent) reads the records back; the bench fails
//! unless every frame was captured and every record read. Runs
//! start in one of two states. In a burst: the newest record of the previous
//! run is left unread, so the consumer is behind and no record of the run
//! finds it caught up — the per-packet cost of captures that follow each
//! other, which the target is judged on. From an empty ring: the first record
//! finds the consumer caught up and the kernel queues the ring-buffer wakeup
//! (`irq_work`, a self-IPI, expensive in a VM), as the first capture of any
//! burst (or an isolated one) does; the difference, times `B`, is reported
//! as that wakeup's cost.
//!
//! The records land in ring memory the CPU has not touched since the reader
//! last consumed it, as in production; a capture's cost is mostly what that
//! costs (docs/kernel.md). To show what this machine allows, the bench also
//! runs hand-assembled reference programs through the same harness (same
//! ring size, same record size, records read back between runs, in a
//! burst, the floors right after the programs' runs of the same row, from
//! the same start): a bare `XDP_PASS`, one
//! helper call, reserve + submit alone, and for each frame size the least
//! any capture of that frame into a ring buffer can do — reserve the record
//! the programs reserve, copy the frame with one 8-byte load and store per
//! word in straight-line code after one bounds test, coarse timestamp,
//! submit, with no parsing, no mode lookup, no header but the timestamp and
//! no counters (`reference::floor`). That is the floor under `xdhcp_xdp`
//! here, the same work done the cheapest way.
#![expect(clippy::print_stdout, reason = "benchmark CLI prints its report")]

use std::net::Ipv4Addr;

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Encodable as _, Encoder};
use xdhcp::datapath::ebpf::{
    CaptureMode, Datapath, EventReader, Guard, GuardProgram, ProgramKind, Role,
};
use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};

/// Ingress ifindex under `BPF_PROG_TEST_RUN` (the namespace's loopback).
const LO: u32 = 1;
const ROUNDS: usize = 15;
/// Runs per round, and repetitions per run, without capture.
const FAST_RUNS: usize = 5;
const FAST_REPEAT: u32 = 400_000;
/// Capture runs per round and batch size.
const DHCP_BATCHES: u32 = 25;
/// The frame sizes of the capture rows.
const DHCP_SIZES: [usize; 2] = [342, 1514];

/// Repetitions per capture run for frames of `len` bytes: four fifths of the
/// records of that size the ring holds (each record: the ring's 8-byte header
/// plus a record sized for the frame).
fn batch(len: usize) -> u32 {
    let slot = u32::try_from(xdhcp_common::record_len(len) + 8).expect("small");
    xdhcp_common::EVENTS_BYTES / slot * 4 / 5
}

fn dhcp_frame(total_len: usize) -> Result<Vec<u8>> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(0x00c0_ffee)
        .set_yiaddr(Ipv4Addr::new(192, 0, 2, 50))
        .set_chaddr(&[2, 0, 0, 0, 0, 0x42]);
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Offer));
    m.opts_mut()
        .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 1)));
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload))?;
    let want = total_len - 14 - 20 - 8;
    if payload.len() > want {
        bail!(
            "DHCP message of {} bytes does not fit {total_len}",
            payload.len()
        );
    }
    payload.resize(want, 0); // pad after the END option, as servers do
    let h = FrameHeaders {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [0xff; 6],
        vlan: None,
        src_ip: Ipv4Addr::new(192, 0, 2, 1),
        dst_ip: Ipv4Addr::BROADCAST,
        src_port: 67,
        dst_port: 68,
    };
    let f = build_udp_frame(&h, &payload);
    assert_eq!(f.len(), total_len);
    Ok(f)
}

fn tcp_frame() -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&46u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6; // TCP
    f[26..30].copy_from_slice(&[192, 0, 2, 1]);
    f[30..34].copy_from_slice(&[192, 0, 2, 2]);
    f[34..36].copy_from_slice(&443u16.to_be_bytes());
    f[36..38].copy_from_slice(&50000u16.to_be_bytes());
    f[46] = 0x50; // data offset 5
    f[47] = 0x10; // ACK
    f
}

/// The interquartile mean: the mean of the middle half of the samples.
/// Robust to outliers like a median, and finer than the kernel's integer
/// nanoseconds (the rounds dither around the true value).
fn iqm(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let q = v.len() / 4;
    let mid = &v[q..v.len() - q];
    mid.iter().sum::<f64>() / f64::from(u32::try_from(mid.len()).expect("few samples"))
}

fn ns(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

/// Something the bench can time: a program of the object, the do-nothing
/// TC program (the guard object's: any bare `TC_ACT_UNSPEC` program is the
/// same to `BPF_PROG_TEST_RUN`), or a reference.
#[derive(Clone, Copy)]
enum Subject {
    Object(ProgramKind),
    TcPass,
    Reference(usize),
}

/// Columns of the main table.
const SUBJECTS: [Subject; NS] = [
    Subject::Object(ProgramKind::XdpPass),
    Subject::TcPass,
    Subject::Object(ProgramKind::Xdp),
    Subject::Object(ProgramKind::Tc),
    Subject::Object(ProgramKind::UplinkXdp),
    Subject::Object(ProgramKind::UplinkTc),
];
/// Number of [`SUBJECTS`].
const NS: usize = 6;
/// Whether each of [`SUBJECTS`] is a TC program (compared with the bare TC
/// program; the others with the bare XDP one).
const IS_TC: [bool; NS] = [false, true, false, true, false, true];

/// The same mode for the test-run device as a workload port and as an uplink.
fn set_modes(dp: &Datapath, mode: CaptureMode) -> Result<()> {
    dp.set_mode(LO, mode)?;
    dp.set_role_mode(Role::Uplink, LO, mode)?;
    Ok(())
}

/// How the ring stands when a capture run starts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// One record of the previous run left unread: the consumer is behind,
    /// as during a burst of captures, and no record of the run queues a
    /// wakeup.
    Behind,
    /// Everything read: the run's first record finds the consumer caught up
    /// and queues the ring-buffer wakeup (`irq_work`), as the first capture
    /// of a burst does.
    Empty,
}

/// The programs under test and the readers that drain their rings.
struct Bench {
    dp: Datapath,
    /// The guard object: its do-nothing TC program, and the guard itself.
    guard: Guard,
    reader: EventReader,
    refs: reference::Set,
    /// Records in the object's ring not read yet.
    pending: u64,
    /// Records the object's programs submitted, and the reader decoded.
    submitted: u64,
    decoded: u64,
    /// Whether the reference ring holds an unread record.
    ref_pending: bool,
}

impl Bench {
    /// Kernel ns per repetition of one run of `repeat`.
    fn time(&mut self, s: Subject, f: &[u8], repeat: u32) -> Result<f64> {
        Ok(match s {
            Subject::Object(kind) => ns(self.dp.test_run(kind, f, repeat)?.duration),
            Subject::TcPass => ns(self
                .guard
                .test_run_timed(GuardProgram::Pass, f, LO, repeat)?
                .1),
            Subject::Reference(i) => self.refs.run(i, f, repeat)?,
        })
    }

    /// Like [`Bench::time`] for a frame that is captured: counts the records.
    fn capture(&mut self, s: Subject, f: &[u8], repeat: u32) -> Result<f64> {
        let t = self.time(s, f, repeat)?;
        match s {
            Subject::Object(ProgramKind::XdpPass) | Subject::TcPass => {}
            Subject::Object(_) => {
                self.pending += u64::from(repeat);
                self.submitted += u64::from(repeat);
            }
            Subject::Reference(_) => self.ref_pending = true,
        }
        Ok(t)
    }

    /// Decodes `n` records of the object's ring with the agent's reader.
    fn read(&mut self, n: u64) -> Result<()> {
        for _ in 0..n {
            if self.reader.try_recv().is_none() {
                bail!(
                    "a captured record is missing or undecodable ({:?})",
                    self.reader.stats()
                );
            }
            self.decoded += 1;
            self.pending -= 1;
        }
        Ok(())
    }

    /// Puts the ring of `s` in the `start` state.
    fn prepare(&mut self, s: Subject, f: &[u8], start: Start) -> Result<()> {
        match (s, start) {
            (Subject::Object(ProgramKind::XdpPass) | Subject::TcPass, _) => {}
            (Subject::Object(_), Start::Empty) => self.read(self.pending)?,
            (Subject::Object(_), Start::Behind) => {
                if self.pending == 0 {
                    self.capture(s, f, 1)?;
                }
                self.read(self.pending - 1)?;
            }
            (Subject::Reference(_), Start::Empty) => {
                self.refs.drain(false);
                self.ref_pending = false;
            }
            (Subject::Reference(_), Start::Behind) => {
                if !self.ref_pending {
                    self.capture(s, f, 1)?;
                }
                self.refs.drain(true);
            }
        }
        Ok(())
    }

    /// One capture run of `s` on `f` (`batch` repetitions) from `start`
    /// (records read back before it, outside the timed region): kernel ns
    /// per repetition.
    fn capture_run(&mut self, s: Subject, f: &[u8], batch: u32, start: Start) -> Result<f64> {
        self.prepare(s, f, start)?;
        self.capture(s, f, batch)
    }
}

/// Interquartile means of one row: one sample list per column.
fn iqms<const N: usize>(v: &mut [Vec<f64>; N]) -> [f64; N] {
    v.each_mut().map(|x| iqm(x))
}

/// Samples of every row, one list per round.
#[derive(Default)]
struct Samples {
    /// 60-byte TCP frame, per subject of [`SUBJECTS`].
    fast: [Vec<f64>; NS],
    /// 342-byte DHCP frame with the mode off.
    off: [Vec<f64>; NS],
    /// [frame of `DHCP_SIZES`] x [`Start::Behind`, `Start::Empty`] x subject.
    dhcp: [[[Vec<f64>; NS]; 2]; 2],
    /// 342-byte frame captured and dropped in intercept mode (owned xid), in
    /// a burst.
    intercept: [Vec<f64>; NS],
    /// Reference programs (the floors: in a burst, beside the rows in a
    /// burst).
    refs: [Vec<f64>; reference::NAMES.len()],
    /// The floor of each size from an empty ring, beside those rows.
    floor_empty: [Vec<f64>; 2],
    /// The 342-byte floor beside the intercept rows.
    floor_intercept: Vec<f64>,
}

/// Every round times each row for every subject. The programs' capture
/// runs are interleaved run by run — each of the `DHCP_BATCHES` runs of a
/// row times every subject once — so that what the machine does meanwhile
/// (other processes, the state of the caches) falls on all of them alike;
/// then the reference floor for that frame size makes as many runs from
/// the same start, right after them. The floor writes its own ring, so it
/// runs on its own: between two of its runs in the middle of the
/// programs', five runs' worth of records would have gone through the
/// other ring, and its ring memory would be colder than theirs (it measured
/// 10–20 % above the full programs that way). Each run is a sample, so the
/// interquartile mean leaves out the runs another process disturbed.
fn measure(b: &mut Bench, tcp: &[u8], dhcp: &[Vec<u8>; 2]) -> Result<Samples> {
    let mut s = Samples::default();
    for _ in 0..ROUNDS {
        set_modes(&b.dp, CaptureMode::Off)?;
        for (i, subject) in SUBJECTS.into_iter().enumerate() {
            for _ in 0..FAST_RUNS {
                s.off[i].push(b.time(subject, &dhcp[0], FAST_REPEAT)?);
            }
        }
        set_modes(&b.dp, CaptureMode::Observe)?;
        for (i, subject) in SUBJECTS.into_iter().enumerate() {
            for _ in 0..FAST_RUNS {
                s.fast[i].push(b.time(subject, tcp, FAST_REPEAT)?);
            }
        }
        for (fi, f) in dhcp.iter().enumerate() {
            let n = batch(f.len());
            for (si, start) in [Start::Behind, Start::Empty].into_iter().enumerate() {
                for _ in 0..DHCP_BATCHES {
                    for (i, subject) in SUBJECTS.into_iter().enumerate() {
                        s.dhcp[fi][si][i].push(b.capture_run(subject, f, n, start)?);
                    }
                }
                let floor = reference::FLOOR[fi];
                for _ in 0..DHCP_BATCHES {
                    let t = b.capture_run(Subject::Reference(floor), f, n, start)?;
                    match start {
                        Start::Behind => s.refs[floor].push(t),
                        Start::Empty => s.floor_empty[fi].push(t),
                    }
                }
            }
        }
        set_modes(&b.dp, CaptureMode::Intercept)?;
        let offer = &dhcp[0];
        let runs = batch(offer.len());
        for _ in 0..DHCP_BATCHES {
            for (i, subject) in SUBJECTS.into_iter().enumerate() {
                s.intercept[i].push(b.capture_run(subject, offer, runs, Start::Behind)?);
            }
        }
        for _ in 0..DHCP_BATCHES {
            let floor = Subject::Reference(reference::FLOOR[0]);
            s.floor_intercept
                .push(b.capture_run(floor, offer, runs, Start::Behind)?);
        }
        set_modes(&b.dp, CaptureMode::Observe)?;
        // The other references on their own.
        for r in 0..reference::NAMES.len() {
            if reference::FLOOR.contains(&r) {
                continue;
            }
            let frame = &dhcp[reference::FRAME[r]];
            if reference::USES_RING[r] {
                for _ in 0..DHCP_BATCHES {
                    let took = b.capture_run(
                        Subject::Reference(r),
                        frame,
                        batch(frame.len()),
                        Start::Behind,
                    )?;
                    s.refs[r].push(took);
                }
            } else {
                for _ in 0..FAST_RUNS {
                    s.refs[r].push(b.time(Subject::Reference(r), frame, FAST_REPEAT)?);
                }
            }
        }
    }
    Ok(s)
}

fn report(s: &mut Samples, decoded: u64) -> Result<String> {
    let mut out = String::new();
    let m60 = iqms(&mut s.fast);
    writeln!(
        out,
        "bench xdp: BPF_PROG_TEST_RUN, kernel-timed, interquartile mean of the runs of \
         {ROUNDS} rounds, ns/packet"
    )?;
    writeln!(
        out,
        "(without capture: {FAST_RUNS} runs of {FAST_REPEAT} per round; capture: {DHCP_BATCHES} runs per round \
         of B repetitions, records read back between runs, {decoded} records decoded)"
    )?;
    writeln!(
        out,
        "{:<44} {:>9} {:>8} {:>10} {:>9} {:>10} {:>9}",
        "frame", "XDP_PASS", "TC pass", "xdhcp_xdp", "xdhcp_tc", "uplink_xdp", "uplink_tc"
    )?;
    // The programs against the bare program of their hook, same run.
    let over_bare = |out: &mut String, m: [f64; NS]| -> Result<()> {
        let bare = |i: usize| if IS_TC[i] { m[1] } else { m[0] };
        let d = [2, 3, 4, 5].map(|i| m[i] - bare(i));
        let r = [2, 3, 4, 5].map(|i| m[i] / bare(i));
        writeln!(
            out,
            "{:<62} {:>+10.2} {:>+9.2} {:>+10.2} {:>+9.2}",
            "  - bare of its hook (ns)", d[0], d[1], d[2], d[3]
        )?;
        writeln!(
            out,
            "{:<62} {:>10.2} {:>9.2} {:>10.2} {:>9.2}",
            "  / bare of its hook", r[0], r[1], r[2], r[3]
        )?;
        Ok(())
    };
    row(&mut out, "60 B TCP (not DHCP)", m60)?;
    over_bare(&mut out, m60)?;
    let off = iqms(&mut s.off);
    row(&mut out, "342 B DHCP, mode off", off)?;
    over_bare(&mut out, off)?;
    let floors = reference::FLOOR.map(|r| iqm(&mut s.refs[r].clone()));
    let burst_by_size = capture_rows(&mut out, s, floors)?;
    writeln!(out)?;
    writeln!(
        out,
        "reference programs (hand-assembled XDP, same harness; ring ones in a burst, records \
         read back between runs):"
    )?;
    for (name, samples) in reference::NAMES.into_iter().zip(&mut s.refs) {
        writeln!(out, "  {name:<70} {:>7.2}", iqm(samples))?;
    }
    writeln!(out)?;
    verdicts(&mut out, m60, &burst_by_size, floors)?;
    Ok(out)
}

/// One row of the main table.
fn row(out: &mut String, name: &str, m: [f64; NS]) -> Result<()> {
    let [xp, tp, xdp, tc, uxdp, utc] = m;
    writeln!(
        out,
        "{name:<44} {xp:>9.2} {tp:>8.2} {xdp:>10.2} {tc:>9.2} {uxdp:>10.2} {utc:>9.2}"
    )?;
    Ok(())
}

/// The capture rows, each beside the floor for its frame size from the
/// same start, interleaved with it; returns the in-a-burst figures per size.
fn capture_rows(out: &mut String, s: &mut Samples, floors: [f64; 2]) -> Result<[[f64; NS]; 2]> {
    let over_floor = |out: &mut String, m: [f64; NS], len: usize, floor: f64| -> Result<()> {
        let r = [2, 3, 4, 5].map(|i| m[i] / floor);
        writeln!(
            out,
            "{:<62} {:>10.2} {:>9.2} {:>10.2} {:>9.2}",
            format!("  / floor {len} B beside it ({floor:.2} ns)"),
            r[0],
            r[1],
            r[2],
            r[3]
        )?;
        Ok(())
    };
    let mut burst_by_size = [[0.0; NS]; 2];
    for (fi, len) in DHCP_SIZES.into_iter().enumerate() {
        let n = batch(len);
        let burst = iqms(&mut s.dhcp[fi][0]);
        let empty = iqms(&mut s.dhcp[fi][1]);
        let floor_empty = iqm(&mut s.floor_empty[fi]);
        burst_by_size[fi] = burst;
        row(
            out,
            &format!("{len} B OFFER captured, in a burst, B={n}"),
            burst,
        )?;
        over_floor(out, burst, len, floors[fi])?;
        row(
            out,
            &format!("{len} B OFFER captured, from an empty ring"),
            empty,
        )?;
        over_floor(out, empty, len, floor_empty)?;
        let wakeup = [2, 3, 4, 5].map(|i| (empty[i] - burst[i]) * f64::from(n) / 1000.0);
        writeln!(
            out,
            "{:<62} {:>10.2} {:>9.2} {:>10.2} {:>9.2}",
            format!(
                "  (us: the run's first record, wakeup; floor {:.2})",
                (floor_empty - floors[fi]) * f64::from(n) / 1000.0
            ),
            wakeup[0],
            wakeup[1],
            wakeup[2],
            wakeup[3]
        )?;
        if fi == 0 {
            let m = iqms(&mut s.intercept);
            row(out, &format!("{len} B OFFER captured, intercept mode"), m)?;
            over_floor(out, m, len, iqm(&mut s.floor_intercept))?;
        }
    }
    Ok(burst_by_size)
}

/// The targets, met or missed: every program's non-DHCP cost against the
/// bare program of its hook, and the XDP capture against the floor.
fn verdicts(
    out: &mut String,
    m60: [f64; NS],
    burst: &[[f64; NS]; 2],
    floors: [f64; 2],
) -> Result<()> {
    let names = ["xdhcp_xdp", "xdhcp_tc", "uplink_xdp", "uplink_tc"];
    for (k, name) in names.into_iter().enumerate() {
        let i = k + 2;
        let d = m60[i] - if IS_TC[i] { m60[1] } else { m60[0] };
        writeln!(
            out,
            "target {name} non-DHCP <= bare + 3 ns: {d:+.2} ns -> {}",
            if d <= 3.0 { "met" } else { "MISSED" }
        )?;
    }
    for (fi, len) in DHCP_SIZES.into_iter().enumerate() {
        for (i, name) in [(2, "xdhcp_xdp"), (4, "uplink_xdp")] {
            let r = burst[fi][i] / floors[fi];
            writeln!(
                out,
                "target {name} {len} B captured (in a burst) <= 1.1 x floor: {r:.2} x -> {}",
                if r <= 1.1 { "met" } else { "MISSED" }
            )?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("tokio runtime")?;
    let _guard = rt.enter();
    let mut dp = Datapath::load().context("loading the eBPF object (run as root)")?;
    let reader = dp.take_reader()?.context("ring buffer reader")?;
    set_modes(&dp, CaptureMode::Observe)?;
    // Only replies to an owned xid are copied to the ring.
    dp.xid_ownership()
        .own(0x00c0_ffee, 0)
        .context("owning the frames' xid")?;
    let refs = reference::Set::load().context("loading the reference programs")?;
    let guard = Guard::load().context("loading the guard object")?;
    let mut b = Bench {
        dp,
        guard,
        reader,
        refs,
        pending: 0,
        submitted: 0,
        decoded: 0,
        ref_pending: false,
    };
    let tcp = tcp_frame();
    let dhcp = [dhcp_frame(DHCP_SIZES[0])?, dhcp_frame(DHCP_SIZES[1])?];

    // Warm up.
    for s in SUBJECTS {
        b.time(s, &tcp, 100_000)?;
    }
    let before = b.dp.counters()?;
    let mut samples = measure(&mut b, &tcp, &dhcp)?;
    b.read(b.pending)?;
    let after = b.dp.counters()?;
    let captured = after.captured - before.captured;
    if captured != b.submitted
        || b.decoded != b.submitted
        || after.ringbuf_full != before.ringbuf_full
        || !b.reader.stats().errors.is_empty()
    {
        bail!(
            "DHCP frames were not all captured and decoded ({captured} captured, {} decoded, \
             {} sent, ring full {}, reader errors {:?})",
            b.decoded,
            b.submitted,
            after.ringbuf_full - before.ringbuf_full,
            b.reader.stats().errors
        );
    }
    let mut out = report(&mut samples, b.decoded)?;
    out.push_str(&guard::bench(&mut b, &tcp, &dhcp[0])?);
    print!("{out}");
    if let Some(dir) = std::env::var_os("XDHCP_BENCH_RESULTS") {
        let path = std::path::PathBuf::from(dir).join("xdp.md");
        std::fs::write(&path, format!("```text\n{out}```\n"))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("written to {}", path.display());
    }
    Ok(())
}

/// The DHCP guard (TC ingress on a workload port's host end) next to a
/// do-nothing TC program from the same object: the non-DHCP cost every
/// frame a workload sends pays, and the cost of a client message that
/// passes and of a server message that is dropped.
mod guard {
    use std::fmt::Write as _;

    use anyhow::{Result, bail};
    use xdhcp::datapath::ebpf::{GuardProgram, PortPolicy, ProgramKind};

    use super::{Bench, FAST_REPEAT, FAST_RUNS, LO, ROUNDS, iqm, ns};

    pub fn bench(b: &mut Bench, tcp: &[u8], offer: &[u8]) -> Result<String> {
        let g = &mut b.guard;
        // A guarded port without a rate limit, so every DISCOVER passes.
        g.set_policy(
            LO,
            &PortPolicy {
                rate: 0,
                ..PortPolicy::default()
            },
        )?;
        let mut discover = offer.to_vec();
        // The OFFER turned into a client message: ports 68 -> 67, BOOTREQUEST
        // (the UDP checksum is not checked by the program).
        discover[34..36].copy_from_slice(&68u16.to_be_bytes());
        discover[36..38].copy_from_slice(&67u16.to_be_bytes());
        discover[42] = 1;
        // Frame, expected TC verdict (u32::MAX: TC_ACT_UNSPEC), expected
        // XDP verdict.
        let rows: [(&str, &[u8], u32, u32); 3] = [
            ("60 B TCP (not DHCP)", tcp, u32::MAX, 2),
            (
                "342 B DISCOVER from the workload, passed",
                &discover,
                u32::MAX,
                2,
            ),
            ("342 B OFFER from the workload, dropped", offer, 2, 1),
        ];
        // Per row: bare TC, guard TC, bare XDP, guard XDP.
        let mut t: Vec<[Vec<f64>; 4]> = vec![Default::default(); rows.len()];
        for _ in 0..ROUNDS {
            for (i, (name, f, want_tc, want_xdp)) in rows.iter().enumerate() {
                for _ in 0..FAST_RUNS {
                    let g = &mut b.guard;
                    let (_, d) = g.test_run_timed(GuardProgram::Pass, f, LO, FAST_REPEAT)?;
                    t[i][0].push(ns(d));
                    let (ret, d) = g.test_run_timed(GuardProgram::Ingress, f, LO, FAST_REPEAT)?;
                    if ret != *want_tc {
                        bail!("guard verdict {ret} on {name:?}, expected {want_tc}");
                    }
                    t[i][1].push(ns(d));
                    let d =
                        b.dp.test_run(ProgramKind::XdpPass, f, FAST_REPEAT)?
                            .duration;
                    t[i][2].push(ns(d));
                    let (ret, d) = b
                        .guard
                        .test_run_timed(GuardProgram::Xdp, f, LO, FAST_REPEAT)?;
                    if ret != *want_xdp {
                        bail!("guard XDP verdict {ret} on {name:?}, expected {want_xdp}");
                    }
                    t[i][3].push(ns(d));
                }
            }
        }
        let mut out = String::new();
        writeln!(out)?;
        writeln!(
            out,
            "DHCP guard on a guarded workload port, TC ingress and its XDP twin \
             (BPF_PROG_TEST_RUN, same method), ns/packet"
        )?;
        writeln!(
            out,
            "{:<44} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
            "frame", "TC pass", "guard", "-bare", "XDP_PASS", "guard_xdp", "-bare"
        )?;
        let mut d60 = [0.0; 2];
        let mut r60 = [0.0; 2];
        for (i, (name, _, _, _)) in rows.iter().enumerate() {
            let [tp, gt, xp, gx] = t[i].each_mut().map(|v| iqm(v));
            if i == 0 {
                d60 = [gt - tp, gx - xp];
                r60 = [gt / tp, gx / xp];
            }
            writeln!(
                out,
                "{name:<44} {tp:>8.2} {gt:>8.2} {:>+9.2} {xp:>9.2} {gx:>9.2} {:>+9.2}",
                gt - tp,
                gx - xp
            )?;
        }
        for (k, name) in ["guard (TC)", "guard_xdp"].into_iter().enumerate() {
            writeln!(
                out,
                "target {name} non-DHCP <= bare + 3 ns: {:+.2} ns ({:.2} x bare) -> {}",
                d60[k],
                r60[k],
                if d60[k] <= 3.0 { "met" } else { "MISSED" }
            )?;
        }
        Ok(out)
    }
}

/// Hand-assembled reference XDP programs loaded with `bpf(2)`, and their own
/// ring buffer (same size as the agent's), read back between runs.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    reason = "bpf(2) attribute fields and instruction encodings"
)]
mod reference {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

    use anyhow::{Result, bail};

    /// Which of them write into the ring (timed in a burst, like captures).
    pub const USES_RING: [bool; 5] = [false, false, true, true, true];

    /// The frame each one runs on: an index of `DHCP_SIZES`.
    pub const FRAME: [usize; 5] = [0, 0, 0, 0, 1];

    /// The capture floors: reference index for each of `DHCP_SIZES`.
    pub const FLOOR: [usize; 2] = [3, 4];

    /// What each reference program does (one line each, in order).
    pub const NAMES: [&str; 5] = [
        "r0 = XDP_PASS",
        "one helper call (bpf_get_prandom_u32)",
        "ringbuf reserve(432 B) + submit",
        "floor 342 B: reserve + copy (8-byte ld/st) + coarse ktime + submit",
        "floor 1514 B: reserve + copy (8-byte ld/st) + coarse ktime + submit",
    ];

    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_MAP_TYPE_RINGBUF: u32 = 27;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    const FN_PRANDOM: i32 = 7;
    const FN_RESERVE: i32 = 131;
    const FN_SUBMIT: i32 = 132;
    const FN_COARSE_NS: i32 = 160;
    /// The record the reserve-only reference reserves: what the agent's
    /// program reserves for a 342-byte frame.
    const RECORD: i32 = xdhcp_common::record_len(342) as i32;
    const PAGE: usize = 4096;

    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Insn {
        code: u8,
        regs: u8,
        off: i16,
        imm: i32,
    }

    const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: dst | (src << 4),
            off,
            imm,
        }
    }
    const fn mov_imm(dst: u8, imm: i32) -> Insn {
        insn(0xb7, dst, 0, 0, imm)
    }
    const fn mov_reg(dst: u8, src: u8) -> Insn {
        insn(0xbf, dst, src, 0, 0)
    }
    const fn add_imm(dst: u8, imm: i32) -> Insn {
        insn(0x07, dst, 0, 0, imm)
    }
    const fn call(f: i32) -> Insn {
        insn(0x85, 0, 0, 0, f)
    }
    const fn exit() -> Insn {
        insn(0x95, 0, 0, 0, 0)
    }
    /// `if dst == imm goto +off`
    const fn jeq_imm(dst: u8, imm: i32, off: i16) -> Insn {
        insn(0x15, dst, 0, off, imm)
    }
    /// `if dst > src goto +off`
    const fn jgt_reg(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x2d, dst, src, off, 0)
    }
    const fn ldx_w(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x61, dst, src, off, 0)
    }
    const fn ldx_dw(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x79, dst, src, off, 0)
    }
    const fn stx_dw(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x7b, dst, src, off, 0)
    }
    /// `dst = map` (two instructions).
    fn ld_map(dst: u8, fd: i32) -> [Insn; 2] {
        [insn(0x18, dst, 1, 0, fd), insn(0, 0, 0, 0, 0)]
    }

    /// Jump offset from the instruction at `from` to `to`.
    fn rel(from: usize, to: usize) -> i16 {
        i16::try_from(to as isize - from as isize - 1).expect("short program")
    }

    fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<i64> {
        // SAFETY: `attr` is a zero-padded bpf_attr of 128 bytes for `cmd`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr.as_mut_ptr(),
                std::mem::size_of_val(attr),
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    fn set_u32(attr: &mut [u64; 16], byte: usize, v: u32) {
        let w = &mut attr[byte / 8];
        let shift = (byte % 8) * 8;
        *w = (*w & !(0xffff_ffff << shift)) | (u64::from(v) << shift);
    }

    fn get_u32(attr: &[u64; 16], byte: usize) -> u32 {
        (attr[byte / 8] >> ((byte % 8) * 8)) as u32
    }

    fn load(insns: &[Insn]) -> Result<OwnedFd> {
        let license = c"GPL";
        let mut log = vec![0u8; 1 << 16];
        let mut a = [0u64; 16];
        set_u32(&mut a, 0, BPF_PROG_TYPE_XDP);
        set_u32(&mut a, 4, insns.len() as u32);
        a[1] = insns.as_ptr() as u64;
        a[2] = license.as_ptr() as u64;
        set_u32(&mut a, 24, 1); // log_level
        set_u32(&mut a, 28, log.len() as u32);
        a[4] = log.as_mut_ptr() as u64;
        match bpf(BPF_PROG_LOAD, &mut a) {
            // SAFETY: a new fd the kernel just returned.
            Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
            Err(e) => {
                let end = log.iter().position(|&c| c == 0).unwrap_or(log.len());
                bail!(
                    "BPF_PROG_LOAD: {e}\n{}",
                    String::from_utf8_lossy(&log[..end])
                )
            }
        }
    }

    /// The least any capture of a `len`-byte frame can do, straight-line
    /// code (the record is the one the agent's program reserves for that
    /// frame; the copy is one 8-byte load and store per word, the last word
    /// overlapping, no loop and no further bounds test):
    ///
    /// ```text
    /// r7 = data; r8 = data_end; if r7 + len > r8 goto out
    /// r9 = reserve(ring, record_len(len)); if !r9 goto out
    /// copy the frame's words to r9 + 48
    /// r0 = coarse ns; *(r9 + 8) = r0; submit(r9)
    /// out: return XDP_PASS
    /// ```
    ///
    /// No parsing, no mode lookup, no header fields but the timestamp, no
    /// counters.
    fn floor(map: &[Insn; 2], len: usize) -> Vec<Insn> {
        let mut copy = vec![
            ldx_w(7, 1, 0),
            ldx_w(8, 1, 4),
            mov_reg(2, 7),
            add_imm(2, len as i32),
        ];
        let bounds = copy.len();
        copy.push(insn(0, 0, 0, 0, 0)); // patched: jgt_reg(2, 8, out)
        let record = xdhcp_common::record_len(len) as i32;
        copy.extend([map[0], map[1], mov_imm(2, record), mov_imm(3, 0)]);
        copy.extend([call(FN_RESERVE), mov_reg(9, 0)]);
        let null = copy.len();
        copy.push(insn(0, 0, 0, 0, 0)); // patched: jeq_imm(9, 0, out)
        let full = len / 8;
        let words = (0..full)
            .map(|w| (w * 8) as i16)
            .chain(if len.is_multiple_of(8) {
                None
            } else {
                Some((len - 8) as i16)
            });
        for w in words {
            copy.extend([ldx_dw(3, 7, w), stx_dw(9, 3, 48 + w)]);
        }
        copy.extend([call(FN_COARSE_NS), stx_dw(9, 0, 8)]);
        copy.extend([mov_reg(1, 9), mov_imm(2, 0), call(FN_SUBMIT)]);
        let out = copy.len();
        copy.extend([mov_imm(0, 2), exit()]);
        copy[bounds] = jgt_reg(2, 8, rel(bounds, out));
        copy[null] = jeq_imm(9, 0, rel(null, out));
        copy
    }

    /// The reference programs and their ring.
    pub struct Set {
        progs: Vec<OwnedFd>,
        /// Keeps the ring alive for the programs' lifetime.
        _ring: OwnedFd,
        consumer: *mut u64,
        producer: *const u64,
        data: *const u8,
        mask: u64,
        /// Sum of the bytes read back (keeps the reads).
        pub checksum: u64,
    }

    impl Set {
        pub fn load() -> Result<Self> {
            let size = xdhcp_common::EVENTS_BYTES as usize;
            let mut a = [0u64; 16];
            set_u32(&mut a, 0, BPF_MAP_TYPE_RINGBUF);
            set_u32(&mut a, 12, xdhcp_common::EVENTS_BYTES);
            // SAFETY: a new fd the kernel just returned.
            let ring = unsafe { OwnedFd::from_raw_fd(bpf(BPF_MAP_CREATE, &mut a)? as i32) };
            let fd = ring.as_raw_fd();
            // SAFETY: mapping the ring's consumer page (rw) and its producer
            // page plus the doubly mapped data (ro), as libbpf does.
            let (cons, prod) = unsafe {
                let cons = libc::mmap(
                    std::ptr::null_mut(),
                    PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                let prod = libc::mmap(
                    std::ptr::null_mut(),
                    PAGE + 2 * size,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd,
                    PAGE as libc::off_t,
                );
                (cons, prod)
            };
            if cons == libc::MAP_FAILED || prod == libc::MAP_FAILED {
                bail!("mmap ring: {}", std::io::Error::last_os_error());
            }
            let map = ld_map(1, fd);
            let pass = vec![mov_imm(0, 2), exit()];
            let helper = vec![call(FN_PRANDOM), mov_imm(0, 2), exit()];
            // r6 = ctx; r0 = reserve(ring, RECORD, 0); if !r0 goto out;
            // submit(r0, 0); out: return XDP_PASS
            let mut reserve = vec![mov_reg(6, 1), map[0], map[1]];
            reserve.extend([mov_imm(2, RECORD), mov_imm(3, 0), call(FN_RESERVE)]);
            reserve.extend([jeq_imm(0, 0, 3), mov_reg(1, 0), mov_imm(2, 0)]);
            reserve.extend([call(FN_SUBMIT), mov_imm(0, 2), exit()]);
            let progs = [pass, helper, reserve, floor(&map, 342), floor(&map, 1514)]
                .iter()
                .map(|p| load(p))
                .collect::<Result<Vec<_>>>()?;
            Ok(Self {
                progs,
                _ring: ring,
                consumer: cons.cast(),
                producer: prod.cast_const().cast(),
                // SAFETY: the data pages follow the producer page.
                data: unsafe { prod.cast::<u8>().add(PAGE).cast_const() },
                mask: size as u64 - 1,
                checksum: 0,
            })
        }

        /// Kernel ns per repetition of reference program `i` on `frame`.
        pub fn run(&self, i: usize, frame: &[u8], repeat: u32) -> Result<f64> {
            let mut a = [0u64; 16];
            set_u32(&mut a, 0, self.progs[i].as_raw_fd() as u32);
            set_u32(&mut a, 8, frame.len() as u32);
            a[2] = frame.as_ptr() as u64;
            set_u32(&mut a, 32, repeat);
            bpf(BPF_PROG_TEST_RUN, &mut a)?;
            if get_u32(&a, 4) != 2 {
                bail!("reference program {i} returned {}", get_u32(&a, 4));
            }
            Ok(f64::from(get_u32(&a, 36)))
        }

        /// Reads every record (all its bytes, as the agent's decoder does)
        /// and releases it; with `keep_newest`, the newest record stays
        /// unread (the consumer stays behind, see [`super::Start`]).
        pub fn drain(&mut self, keep_newest: bool) {
            // SAFETY: the mapped positions and data of our own ring; the
            // data is mapped twice, so a record never wraps.
            unsafe {
                let end = std::ptr::read_volatile(self.producer);
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                let mut pos = std::ptr::read_volatile(self.consumer);
                while pos < end {
                    let at = self.data.add((pos & self.mask) as usize);
                    let len = std::ptr::read_volatile(at.cast::<[u8; 4]>());
                    let len = u32::from_ne_bytes(len) & 0x3fff_ffff;
                    let next = pos + ((u64::from(len) + 8 + 7) & !7);
                    if keep_newest && next >= end {
                        break;
                    }
                    let rec = std::slice::from_raw_parts(at.add(8), len as usize);
                    self.checksum = rec
                        .iter()
                        .fold(self.checksum, |s, &b| s.wrapping_add(u64::from(b)));
                    pos = next;
                }
                std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
                std::ptr::write_volatile(self.consumer, pos);
            }
        }
    }
}

//! The kernel's IPv4 neighbour (ARP) table as a test bed sees it.
//!
//! There is one ARP table for the whole kernel: every network namespace's
//! entries count against the same `net.ipv4.neigh.default.gc_thresh3`
//! (settable only from the initial namespace). A lab with a thousand pod
//! namespaces and a server that must resolve every leased address can fill
//! it; the kernel then refuses new entries and the packets that needed them
//! are dropped. `/proc/net/stat/arp_cache` counts those refusals
//! (`table_fulls`) and the forced garbage collections before them
//! (`forced_gc_runs`), one row per CPU in hex.

use std::path::{Path, PathBuf};

/// The ARP table counters a bench reports, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArpStat {
    /// New entries refused because the table was full.
    pub table_fulls: u64,
    /// Synchronous garbage collections forced by a full-ish table.
    pub forced_gc_runs: u64,
}

impl ArpStat {
    /// The counters now (`None` if the file cannot be read or parsed).
    pub fn read() -> Option<ArpStat> {
        parse_arp_stat(&std::fs::read_to_string("/proc/net/stat/arp_cache").ok()?)
    }

    /// What grew from `before` to `self` (counters only grow; a wrapped or
    /// reset counter shows as 0).
    #[must_use]
    pub fn since(self, before: ArpStat) -> ArpStat {
        ArpStat {
            table_fulls: self.table_fulls.saturating_sub(before.table_fulls),
            forced_gc_runs: self.forced_gc_runs.saturating_sub(before.forced_gc_runs),
        }
    }
}

/// Parses `/proc/net/stat/arp_cache`: a header line of column names, then
/// one line of hex counters per CPU. Sums `table_fulls` and `forced_gc_runs`
/// over the CPU lines, finding the columns by name.
pub fn parse_arp_stat(text: &str) -> Option<ArpStat> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (fulls, gcs) = (col("table_fulls")?, col("forced_gc_runs")?);
    let mut sum = ArpStat::default();
    let mut rows = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| u64::from_str_radix(fields.get(i)?, 16).ok();
        sum.table_fulls += hex(fulls)?;
        sum.forced_gc_runs += hex(gcs)?;
        rows += 1;
    }
    (rows > 0).then_some(sum)
}

/// `net.ipv4.neigh.default.gc_thresh1/2/3` in `/proc/sys`.
fn thresh_path(i: usize) -> PathBuf {
    Path::new("/proc/sys/net/ipv4/neigh/default").join(format!("gc_thresh{i}"))
}

/// The three ARP table thresholds now.
pub fn gc_thresholds() -> Option<[u64; 3]> {
    let read = |i| {
        std::fs::read_to_string(thresh_path(i))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some([read(1)?, read(2)?, read(3)?])
}

/// Raised ARP table thresholds, restored to what they were when dropped
/// (also during a panic).
#[derive(Debug)]
pub struct RaisedThresholds {
    previous: [u64; 3],
    /// The values set.
    pub now: [u64; 3],
}

impl RaisedThresholds {
    /// Raises each threshold to at least `to` (never lowers one the machine
    /// has set higher).
    ///
    /// # Errors
    /// If the current values cannot be read or the new ones not written (any
    /// threshold already written is put back).
    pub fn raise(to: [u64; 3]) -> std::io::Result<RaisedThresholds> {
        let previous = gc_thresholds().ok_or_else(|| {
            std::io::Error::other("cannot read net.ipv4.neigh.default.gc_thresh*")
        })?;
        let now = [
            previous[0].max(to[0]),
            previous[1].max(to[1]),
            previous[2].max(to[2]),
        ];
        // The guard exists before the first write, so a failed write puts
        // back whatever was already changed. Written from the top down so
        // thresh1 <= thresh2 <= thresh3 holds at every step.
        let guard = RaisedThresholds { previous, now };
        for i in (0..3).rev() {
            std::fs::write(thresh_path(i + 1), now[i].to_string())?;
        }
        Ok(guard)
    }

    /// The values the machine had (and gets back on drop).
    pub fn previous(&self) -> [u64; 3] {
        self.previous
    }
}

impl Drop for RaisedThresholds {
    fn drop(&mut self) {
        // Lowered from the bottom up, keeping thresh1 <= thresh2 <= thresh3.
        for i in 0..3 {
            if let Err(e) = std::fs::write(thresh_path(i + 1), self.previous[i].to_string()) {
                crate::bench::progress_line(&format!(
                    "could not restore net.ipv4.neigh.default.gc_thresh{} to {}: {e}",
                    i + 1,
                    self.previous[i]
                ));
            }
        }
    }
}

/// Packets dropped because a CPU's input backlog was full
/// (`net.core.netdev_max_backlog`), summed over CPUs: the second column of
/// `/proc/net/softnet_stat`, hex, one line per CPU. A veth hands each packet
/// to the receiving side through that backlog, so a broadcast flooded by a
/// bridge to a thousand veths takes a thousand slots. Machine-wide.
pub fn parse_softnet_dropped(text: &str) -> Option<u64> {
    let mut sum = 0;
    let mut rows = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        sum += u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()?;
        rows += 1;
    }
    (rows > 0).then_some(sum)
}

/// [`parse_softnet_dropped`] of this machine now.
pub fn softnet_dropped() -> Option<u64> {
    parse_softnet_dropped(&std::fs::read_to_string("/proc/net/softnet_stat").ok()?)
}

/// UDP datagrams dropped because a socket's receive buffer was full
/// (`RcvbufErrors` of the `Udp:` lines in `/proc/net/snmp`, a header line
/// of names and a line of decimal values). Per network namespace.
pub fn parse_udp_rcvbuf_errors(text: &str) -> Option<u64> {
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let i = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// [`parse_udp_rcvbuf_errors`] of the namespace `ns`, read from inside it.
pub fn udp_rcvbuf_errors_in(ns: &crate::netns::NetNs) -> Option<u64> {
    ns.run_in(|| {
        parse_udp_rcvbuf_errors(&std::fs::read_to_string("/proc/thread-self/net/snmp").ok()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CPUs, as this file looks on a 2-core machine.
    const TWO_CPUS: &str = "\
entries  allocs   destroys hash_grows lookups  hits     res_failed rcv_probes_mcast rcv_probes_ucast periodic_gc_runs forced_gc_runs unresolved_discards table_fulls
00000002 000011d2 00001419 00000003   0008ec15 00025cc5 000005ea   00000000         00000000         00000000         0000010f       00000000            000000aa
00000002 000029b6 0000276d 00000005   00193503 0004cb65 0000190f   00000000         00000000         0000039f         000000e6       00000000            00000095
";

    #[test]
    fn sums_hex_counters_over_cpus() {
        let s = parse_arp_stat(TWO_CPUS).expect("parses");
        assert_eq!(s.table_fulls, 0xaa + 0x95);
        assert_eq!(s.forced_gc_runs, 0x10f + 0xe6);
    }

    #[test]
    fn finds_columns_by_name_not_position() {
        let text = "table_fulls forced_gc_runs\n0000000a 00000001\n00000001 00000000\n";
        assert_eq!(
            parse_arp_stat(text),
            Some(ArpStat {
                table_fulls: 11,
                forced_gc_runs: 1
            })
        );
    }

    #[test]
    fn rejects_what_is_not_the_counter_table() {
        assert_eq!(parse_arp_stat(""), None);
        // Header only: no CPU rows.
        assert_eq!(parse_arp_stat("forced_gc_runs table_fulls\n"), None);
        // Column missing (an older or different format).
        assert_eq!(parse_arp_stat("entries allocs\n1 2\n"), None);
        // Not hex.
        assert_eq!(
            parse_arp_stat("forced_gc_runs table_fulls\n0000zz01 00000001\n"),
            None
        );
    }

    #[test]
    fn delta_is_what_grew() {
        let a = ArpStat {
            table_fulls: 5,
            forced_gc_runs: 9,
        };
        let b = ArpStat {
            table_fulls: 12,
            forced_gc_runs: 9,
        };
        assert_eq!(
            b.since(a),
            ArpStat {
                table_fulls: 7,
                forced_gc_runs: 0
            }
        );
        assert_eq!(a.since(b).table_fulls, 0);
    }

    #[test]
    fn reads_this_machines_table() {
        // Every Linux kernel the harness runs on has the file.
        assert!(ArpStat::read().is_some());
        let t = gc_thresholds().expect("gc_thresh sysctls");
        assert!(t[0] <= t[2], "{t:?}");
    }

    #[test]
    fn sums_backlog_drops_over_cpus() {
        let text = "\
017c042d 004d0688 0000041e 00000000 00000000
017e6e7e 0059fe1d 00000411 00000000 00000000
";
        assert_eq!(parse_softnet_dropped(text), Some(0x004d_0688 + 0x0059_fe1d));
        assert_eq!(parse_softnet_dropped(""), None);
        assert_eq!(parse_softnet_dropped("017c042d\n"), None);
        assert!(softnet_dropped().is_some());
    }

    #[test]
    fn finds_udp_receive_buffer_errors() {
        let text = "\
Icmp: InMsgs InErrors
Icmp: 3 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 1200 4 735 900 731 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
";
        assert_eq!(parse_udp_rcvbuf_errors(text), Some(731));
        assert_eq!(parse_udp_rcvbuf_errors("Udp: InDatagrams\nUdp: 5\n"), None);
        assert!(
            parse_udp_rcvbuf_errors(&std::fs::read_to_string("/proc/net/snmp").unwrap()).is_some()
        );
    }
}

/// A sysctl under `/proc/sys` raised to at least a value for as long as
/// the guard lives, restored when it is dropped (also during a panic).
#[derive(Debug)]
pub struct RaisedSysctl {
    path: PathBuf,
    previous: String,
    /// The value set.
    pub now: u64,
}

impl RaisedSysctl {
    /// Raises `name` (dotted, `net.core.rmem_default`) to at least `to`.
    ///
    /// # Errors
    /// If it cannot be read, is not a number, or cannot be written.
    pub fn raise(name: &str, to: u64) -> std::io::Result<RaisedSysctl> {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let previous = std::fs::read_to_string(&path)?.trim().to_owned();
        let was: u64 = previous
            .parse()
            .map_err(|e| std::io::Error::other(format!("{name} = {previous}: {e}")))?;
        let now = was.max(to);
        std::fs::write(&path, now.to_string())?;
        Ok(RaisedSysctl {
            path,
            previous,
            now,
        })
    }

    /// The value it had (and gets back on drop).
    pub fn previous(&self) -> &str {
        &self.previous
    }
}

impl Drop for RaisedSysctl {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.path, &self.previous) {
            crate::bench::progress_line(&format!(
                "could not restore {} to {}: {e}",
                self.path.display(),
                self.previous
            ));
        }
    }
}

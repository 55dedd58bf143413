//! `cargo xtask vmtest`: the VM test tier. Boots a second kernel — Debian
//! 12's 6.1, the distribution kernel production nodes run — in qemu and runs
//! a guest suite of the workspace's own integration tests inside it.
//!
//! - Setup (idempotent, like `cargo xtask setup`): the Debian packages of
//!   `setup`'s table (qemu, kmod, busybox-static, python3-venv); the newest
//!   `linux-image-6.1.0-*-amd64-unsigned` fetched with `apt-get download`,
//!   unpacked into the cache directory, its modules copied to
//!   `/lib/modules/<release>` and indexed with `depmod`; virtme-ng from `PyPI`
//!   in a venv under the cache directory (no system-wide pip install).
//! - The guest: virtme-ng boots the kernel over this machine's root
//!   filesystem (read-only in the guest), so the guest runs the test binaries
//!   built here, dnsmasq and the CNI plugins; nothing is compiled in the
//!   guest. Software emulation (KVM does not boot a guest on these machines),
//!   2 vCPUs, 2 GiB. Devices: two virtio-net NICs on one qemu hub with the
//!   guest offloads off (`virtio_net` refuses native XDP while the device
//!   may hand it GRO/checksum-offloaded packets it cannot switch off), and
//!   an e1000e on qemu's user network behind an emulated Intel IOMMU (6.1
//!   has no VFIO no-IOMMU mode).
//! - Two sequences of checks at once, a vCPU each: those of the guest's
//!   devices and kernel-wide state, and those confined to namespaces of
//!   their own ([`Lane`]).
//! - Results: every selected test runs on its own (`--exact`, its output
//!   not captured) in the guest, which writes its exit status, duration and
//!   output to a directory shared read-write with the host; the host prints
//!   one line per check, under it what a passing check printed (its
//!   figures), and fails when any check failed or did not run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, setup};

/// Debian 12's kernel series the tier boots.
const KERNEL_SERIES: &str = "6.1.0";
/// The virtme-ng release the tier was verified with.
const VIRTME_NG_VERSION: &str = "1.42";
/// Guest size: a vCPU per [`Lane`], each a thread of qemu's emulation
/// (one per host core here); memory for two lanes' agents, servers and OVS.
const GUEST_MEMORY: &str = "2G";
const GUEST_CPUS: &str = "2";
/// One check's time limit inside the guest.
const CHECK_TIMEOUT_SECS: u32 = 300;
/// The whole guest run's time limit.
const GUEST_TIMEOUT: Duration = Duration::from_mins(25);

/// The guest's devices (MAC addresses and ids are the ones
/// `tests/tests/vm_guest.rs` looks for).
const QEMU_DEVICES: &[&str] = &[
    "-machine q35",
    // VFIO needs an IOMMU; interrupt remapping is not needed (and needs a
    // split irqchip).
    "-device intel-iommu,intremap=off",
    // The e1000e (8086:10d3) on the user network: qemu's own DHCP server.
    "-netdev user,id=vmt-user",
    "-device e1000e,netdev=vmt-user",
    // Two virtio-net NICs on one hub: dnsmasq on one, native XDP (per
    // interface, or the agent's uplink) on the other.
    "-netdev hubport,id=vmt-hub1,hubid=7",
    "-netdev hubport,id=vmt-hub2,hubid=7",
    "-device virtio-net-pci,netdev=vmt-hub1,mac=52:54:00:78:64:01,guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off",
    "-device virtio-net-pci,netdev=vmt-hub2,mac=52:54:00:78:64:02,guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off",
];

/// Which of the guest's two sequences a check runs in. The two run at once,
/// each on a vCPU, the checks of each one after the other.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Checks of the guest's own devices and kernel-wide state — the
    /// virtio-net NICs, the e1000e and its driver handoff, the openvswitch
    /// module's datapath — which no other check may use at the same time.
    Devices,
    /// Checks confined to network namespaces of their own, as on the host,
    /// where each binary's tests run several at once.
    Namespaces,
}

/// The guest suite: integration-test binaries, their lane, and the tests of
/// each that run in the guest (substrings of test names; empty: all, ignored
/// ones included). A test two entries select runs once, in the first's lane.
const GUEST_SUITE: &[(&str, Lane, &[&str])] = &[
    // Every program through the verifier: no device, so beside the rest.
    (
        "vm_guest",
        Lane::Namespaces,
        &["every_program_in_the_object_passes_the_verifier"],
    ),
    // Native XDP on virtio-net, per interface and as the agent's uplink;
    // the VFIO handoff of the e1000e against qemu's DHCP server, with and
    // without a live uplink.
    ("vm_guest", Lane::Devices, &[]),
    // Capture through TC and native/generic XDP on veths (dnsmasq), and the
    // programs under BPF_PROG_TEST_RUN: every record size (the copy 6.1
    // needed changed), VLAN tags, TC on page fragments, DHCPv6 replies owned
    // by transaction id and IAID (the option walk past 6.1's verifier). Not the mode-matrix
    // test, which loads the object 36 times (~30 s here, over 5 min under
    // emulation).
    (
        "kernel_path",
        Lane::Namespaces,
        &[
            "dnsmasq_offer_through",
            "frames_of_every_record_size",
            "vlan_tagged_replies",
            "tc_captures_replies_held_in_page_fragments",
            "dhcpv6_",
        ],
    ),
    // The OVS + OVN lab on the kernel datapath (the openvswitch module this
    // machine's kernel lacks), the virtio NIC as the provider bridge's port:
    // the uplink found in OVS with native XDP, a pod's DORA, renewal and
    // RELEASE after its port is gone; ports guarded before their ADD and a
    // rogue server reaching no new pod; a DISCOVER flood held to the port's
    // rate; OVS killed and restarted under live leases; a bridge mapping
    // added at run time.
    ("ovs_guest", Lane::Devices, &[]),
    // A VM port's guard asks the guest's DISCOVER and REQUEST for broadcast
    // replies: the TC rewrite through 6.1's checksum helper, and the XDP
    // twin past 6.1's verifier (refused there, the guard would fall back to
    // TC without saying so here).
    ("guard_broadcast", Lane::Namespaces, &[]),
    // The guard's IPv6 half past 6.1's verifier (its bounded walk of
    // extension headers, the XDP twin near a quarter of a million
    // instructions there) and its verdicts: DHCPv6 server messages and
    // router advertisements from a workload, behind extension headers; a
    // learning port's DHCPv6 and duplicate address detection copies to the
    // guard ring (the egress program's own walk of the extension headers,
    // one more copy in the XDP twin).
    (
        "guard_kernel",
        Lane::Namespaces,
        &[
            "dhcpv6_server_messages_from_an_untrusted_port_are_dropped_and_counted",
            "router_advertisements_and_redirects_are_dropped_behind_any_extension_headers",
            "the_xdp_twin_gives_the_ingress_programs_verdicts",
            "learning_ports_record_the_guests_dhcpv6_both_ways",
            "learning_ports_record_the_guests_duplicate_address_detection",
        ],
    ),
    // A pod lease's TC capture is a netlink filter before tcx: `tc filter
    // del` from outside is noticed by listing the hook's filters, the lease
    // falls back to AF_PACKET, and the filter is attached again.
    (
        "capture_fallback",
        Lane::Namespaces,
        &["a_tc_filter_deleted_from_outside_is_noticed_where_tc_programs_are_filters"],
    ),
    // The pod path: ADD through the bridge plugin, renewal, DEL.
    (
        "cni",
        Lane::Namespaces,
        &["bridge_pod_is_bound_renewed_and_deleted_on_the_ebpf_datapath"],
    ),
    // The uplink programs on 6.1: their own mode map, apart from the ports'
    // (no netns cookie there to tell namespaces apart), and every truncation
    // offset, tagged and not.
    (
        "uplink_kernel",
        Lane::Namespaces,
        &[
            "uplink_and_port_configurations_never_collide",
            "uplink_truncated_at_every_offset",
        ],
    ),
];

#[derive(clap::Args, Default)]
pub struct Args {
    /// Skip `cargo xtask setup`'s Debian packages (the kernel and virtme-ng
    /// are still checked).
    #[arg(long)]
    pub no_setup: bool,
    /// Only the checks whose `binary::test` name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    if !args.no_setup {
        setup::run()?;
    }
    let kernel = guest_kernel()?;
    let vng = virtme_ng()?;
    let setup_took = t0.elapsed();

    let root = cmd::workspace_root();
    let t_build = Instant::now();
    let built = build(&root)?;
    let build_took = t_build.elapsed();

    let mut checks = Vec::new();
    for &(name, lane, filters) in GUEST_SUITE {
        let bin = built
            .tests
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo built no `{name}` test binary"))?;
        for test in list_tests(&bin)? {
            let id = format!("{name}::{test}");
            let selected = (filters.is_empty() || filters.iter().any(|f| test.contains(f)))
                && !checks.iter().any(|c: &Check| c.id == id);
            let wanted = args.filter.as_deref().is_none_or(|f| id.contains(f));
            if selected && wanted {
                checks.push(Check {
                    id,
                    bin: bin.clone(),
                    test,
                    lane,
                });
            }
        }
    }
    if checks.is_empty() {
        bail!("no guest check matches");
    }

    let out = root.join("target/vmtest");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("checks"))
        .with_context(|| format!("creating {}", out.display()))?;
    let script = out.join("guest.sh");
    std::fs::write(&script, guest_script(&built, &out, &checks))
        .with_context(|| format!("writing {}", script.display()))?;

    println!(
        "vmtest: booting {} (software emulation, {GUEST_CPUS} vCPU, {GUEST_MEMORY}) for {} checks",
        kernel.release,
        checks.len()
    );
    let t_guest = Instant::now();
    let console = out.join("console.log");
    boot(&vng, &kernel, &out, &script, &console)?;
    let guest_took = t_guest.elapsed();

    let release = std::fs::read_to_string(out.join("release")).unwrap_or_default();
    let release = release.trim();
    if release != kernel.release {
        bail!(
            "the guest did not run the suite on {} (it reported {release:?}); console: {}",
            kernel.release,
            console.display()
        );
    }
    report(&out, &checks, release, setup_took, build_took, guest_took)
}

/// One test run in the guest.
struct Check {
    /// `binary::test`.
    id: String,
    bin: PathBuf,
    test: String,
    lane: Lane,
}

/// The unpacked guest kernel.
struct Kernel {
    release: String,
    vmlinuz: PathBuf,
}

fn vm_cache() -> PathBuf {
    setup::cache_dir().join("vm")
}

/// The newest Debian `linux-image-6.1.0-N-amd64-unsigned`, unpacked in the
/// cache with its modules installed under `/lib/modules` (done once).
fn guest_kernel() -> Result<Kernel> {
    let dir = vm_cache().join("kernel");
    if let Some(k) = unpacked_kernel(&dir)? {
        return Ok(k);
    }
    let pkg = newest_kernel_package()?;
    println!("vmtest: fetching {pkg} (Debian's {KERNEL_SERIES} kernel, once)");
    let dl = vm_cache().join("download");
    std::fs::create_dir_all(&dl).with_context(|| format!("creating {}", dl.display()))?;
    cmd::run(
        cmd::program("apt-get")
            .current_dir(&dl)
            .args(["download", &pkg]),
    )
    .with_context(|| format!("could not download {pkg}"))?;
    let deb = std::fs::read_dir(&dl)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pkg}_")))
        })
        .with_context(|| format!("apt-get download left no {pkg}_*.deb in {}", dl.display()))?;
    let tmp = vm_cache().join("kernel.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    cmd::run(cmd::program("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("moving the kernel to {}", dir.display()))?;
    let _ = std::fs::remove_file(&deb);
    unpacked_kernel(&dir)?.with_context(|| format!("{pkg} holds no boot/vmlinuz-* and modules"))
}

/// The kernel unpacked in `dir`, its modules installed; `None` if not there.
fn unpacked_kernel(dir: &Path) -> Result<Option<Kernel>> {
    let Ok(boot) = std::fs::read_dir(dir.join("boot")) else {
        return Ok(None);
    };
    let Some(release) = boot.filter_map(Result::ok).find_map(|e| {
        e.file_name()
            .to_string_lossy()
            .strip_prefix("vmlinuz-")
            .map(str::to_owned)
    }) else {
        return Ok(None);
    };
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    // The guest's modprobe reads the modules from the host's /lib/modules.
    let installed = Path::new("/lib/modules").join(&release);
    if !installed.join("modules.dep").exists() {
        let src = dir.join("lib/modules").join(&release);
        if !src.is_dir() {
            return Ok(None);
        }
        println!(
            "vmtest: installing the modules of {release} in {}",
            installed.display()
        );
        std::fs::create_dir_all("/lib/modules").context("creating /lib/modules")?;
        let _ = std::fs::remove_dir_all(&installed);
        cmd::run(cmd::program("cp").arg("-a").arg(&src).arg(&installed))?;
        cmd::run(cmd::program("depmod").arg(&release))?;
    }
    Ok(Some(Kernel { release, vmlinuz }))
}

/// `linux-image-6.1.0-N-amd64-unsigned` with the highest N the package
/// lists know (updating them once if none is listed).
fn newest_kernel_package() -> Result<String> {
    let search = || -> Result<Option<String>> {
        let pattern = format!(
            "^linux-image-{}-[0-9]+-amd64-unsigned$",
            KERNEL_SERIES.replace('.', "\\.")
        );
        let out =
            cmd::output(cmd::program("apt-cache").args(["search", "--names-only", &pattern]))?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter_map(|name| {
                let abi = name
                    .strip_prefix(&format!("linux-image-{KERNEL_SERIES}-"))?
                    .strip_suffix("-amd64-unsigned")?;
                Some((abi.parse::<u32>().ok()?, name.to_owned()))
            })
            .max()
            .map(|(_, name)| name))
    };
    if let Some(p) = search()? {
        return Ok(p);
    }
    cmd::run(cmd::program("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed: is the Debian package mirror reachable?")?;
    search()?.with_context(|| {
        format!(
            "no linux-image-{KERNEL_SERIES}-*-amd64-unsigned in the package lists: the VM tier \
             needs Debian 12's (bookworm) main archive in /etc/apt/sources.list"
        )
    })
}

/// `vng` from virtme-ng in a venv under the cache (created once).
fn virtme_ng() -> Result<PathBuf> {
    let venv = vm_cache().join("venv");
    let vng = venv.join("bin/vng");
    let version = |vng: &Path| {
        cmd::output(Command::new(vng).arg("--version"))
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    if version(&vng).is_ok_and(|v| v.ends_with(VIRTME_NG_VERSION)) {
        return Ok(vng);
    }
    println!(
        "vmtest: installing virtme-ng {VIRTME_NG_VERSION} in {}",
        venv.display()
    );
    let _ = std::fs::remove_dir_all(&venv);
    // Debian's python3 (python3-venv, in setup's table), whatever else is on PATH.
    cmd::run(cmd::program("python3").args(["-m", "venv"]).arg(&venv)).context(
        "could not create a Python venv (Debian: apt-get install python3-venv, or cargo xtask setup)",
    )?;
    cmd::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("virtme-ng=={VIRTME_NG_VERSION}")),
    )
    .context("could not install virtme-ng from PyPI")?;
    let v = version(&vng).context("virtme-ng installed but vng does not run")?;
    println!("vmtest: {v}");
    Ok(vng)
}

/// What the guest runs: the guest suite's test binaries, and the agent and
/// plugin binaries those tests exec.
struct Built {
    tests: Vec<(String, PathBuf)>,
    agent: PathBuf,
    plugin: PathBuf,
}

/// Build the guest suite's test binaries and, in the same `cargo test
/// --no-run` (same selection and features as `cargo xtask test`'s `cargo
/// test`, so after it nothing is rebuilt), the plain agent and plugin
/// binaries: the agent and plugin packages' own integration tests make cargo
/// build them.
fn build(root: &Path) -> Result<Built> {
    let mut c = cmd::program("cargo");
    c.current_dir(root)
        .arg("test")
        .args(xdhcp_testbed::TEST_BUILD_PACKAGES)
        .args(["--no-run", "--message-format=json-render-diagnostics"]);
    println!("\x1b[1m$ cargo test --no-run (the guest suite and the binaries it runs)\x1b[0m");
    let out = c
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("failed to start cargo")?;
    if !out.status.success() {
        bail!("building the guest suite failed ({})", out.status);
    }
    let mut tests = Vec::new();
    let (mut agent, mut plugin) = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let kind = |k: &str| {
            msg["target"]["kind"]
                .as_array()
                .is_some_and(|ks| ks.iter().any(|x| x == k))
        };
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        let package = msg["package_id"].as_str().unwrap_or_default();
        if kind("test") {
            tests.push((name.to_owned(), PathBuf::from(exe)));
        } else if kind("bin") && msg["profile"]["test"] == false {
            match name {
                "xdhcp" if package.contains("#xdhcp@") => agent = Some(PathBuf::from(exe)),
                "xdhcp-plugin" if package.contains("#xdhcp-plugin@") => {
                    plugin = Some(PathBuf::from(exe));
                }
                _ => {}
            }
        }
    }
    Ok(Built {
        tests,
        agent: agent.context("cargo test --no-run built no plain xdhcp binary")?,
        plugin: plugin.context("cargo test --no-run built no plain xdhcp-plugin binary")?,
    })
}

/// Every test of a libtest binary, ignored ones included.
fn list_tests(bin: &Path) -> Result<Vec<String>> {
    let out = cmd::output(Command::new(bin).args(["--list", "--include-ignored"]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The guest's script: modules, then every check on its own, each writing
/// `checks/<n>.{log,rc,ns}` (output, exit status, start and end time); the
/// two [`Lane`]s at once, each a shell function of its checks in order.
fn guest_script(built: &Built, out: &Path, checks: &[Check]) -> String {
    let q = |p: &Path| shell_quote(&p.to_string_lossy());
    let mut s = String::new();
    let _ = writeln!(s, "#!/bin/sh");
    let _ = writeln!(
        s,
        "# Generated by cargo xtask vmtest; runs inside the guest."
    );
    let _ = writeln!(s, "uname -r > {}", q(&out.join("release")));
    let _ = writeln!(
        s,
        "export XDHCP_BIN={} XDHCP_PLUGIN_BIN={} RUST_BACKTRACE=1",
        q(&built.agent),
        q(&built.plugin)
    );
    // The host's tree is read-only in the guest; tests write under /tmp.
    let _ = writeln!(s, "cd /tmp");
    // Nothing creates /dev/net/tun in the guest until tun is loaded (the
    // NIC drivers are loaded by the tests that use them).
    let _ = writeln!(s, "modprobe tun");
    for (l, lane) in [Lane::Devices, Lane::Namespaces].into_iter().enumerate() {
        let _ = writeln!(s, "lane{l}() {{");
        // `:` keeps an empty lane's function valid shell.
        let _ = writeln!(s, "  :");
        for (n, c) in checks.iter().enumerate().filter(|(_, c)| c.lane == lane) {
            let base = out.join("checks").join(n.to_string());
            let _ = writeln!(s, "  echo \"vmtest: {}\" > /dev/console", c.id);
            let _ = writeln!(s, "  date +%s%N > {}", q(&base.with_extension("ns")));
            let _ = writeln!(
                s,
                "  timeout {CHECK_TIMEOUT_SECS} {} --exact --include-ignored --test-threads=1 --nocapture {} > {} 2>&1",
                q(&c.bin),
                shell_quote(&c.test),
                q(&base.with_extension("log")),
            );
            let _ = writeln!(s, "  echo $? > {}", q(&base.with_extension("rc")));
            let _ = writeln!(s, "  date +%s%N >> {}", q(&base.with_extension("ns")));
        }
        let _ = writeln!(s, "}}");
    }
    let _ = writeln!(s, "lane0 &");
    let _ = writeln!(s, "lane1 &");
    let _ = writeln!(s, "wait");
    let _ = writeln!(s, "dmesg > {}", q(&out.join("dmesg.log")));
    let _ = writeln!(s, "echo done > {}", q(&out.join("done")));
    s
}

fn boot(vng: &Path, kernel: &Kernel, out: &Path, script: &Path, console: &Path) -> Result<()> {
    let log = std::fs::File::create(console)
        .with_context(|| format!("creating {}", console.display()))?;
    let bin = vng.parent().expect("vng lives in the venv's bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new(vng);
    c.env("PATH", path)
        // Without --verbose the guest command's output is lost (the console
        // is the only channel under software emulation); it goes to the log.
        .args(["--verbose", "--disable-kvm", "--disable-microvm", "--run"])
        .arg(&kernel.vmlinuz)
        .args(["--memory", GUEST_MEMORY, "--cpus", GUEST_CPUS])
        .args(["--append", "intel_iommu=on"])
        .arg(format!("--rwdir={}", out.display()))
        .arg(format!("--qemu-opts={}", QEMU_DEVICES.join(" ")))
        .arg("--")
        .arg(format!("sh {}", shell_quote(&script.to_string_lossy())))
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = c.spawn().context("failed to start vng")?;
    let deadline = Instant::now() + GUEST_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the guest did not finish within {GUEST_TIMEOUT:?}; console: {}",
                console.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if !out.join("done").exists() {
        let tail: Vec<String> = std::fs::read_to_string(console)
            .unwrap_or_default()
            .lines()
            .rev()
            .take(30)
            .map(str::to_owned)
            .collect();
        let tail: Vec<&str> = tail.iter().rev().map(String::as_str).collect();
        bail!(
            "the guest stopped before the suite finished (vng: {status}); last console lines:\n{}",
            tail.join("\n")
        );
    }
    Ok(())
}

/// The lines of a check's log that the test harness did not write.
fn printed(log: &str) -> impl Iterator<Item = &str> {
    log.lines().map(str::trim_end).filter(|l| {
        !(l.is_empty()
            || *l == "running 1 test"
            || l.starts_with("test result:")
            || *l == "ok"
            || (l.starts_with("test ") && l.ends_with(" ok"))
            || *l == "successes:")
    })
}

fn report(
    out: &Path,
    checks: &[Check],
    release: &str,
    setup_took: Duration,
    build_took: Duration,
    guest_took: Duration,
) -> Result<()> {
    let mut failed = Vec::new();
    println!("\nvmtest: guest suite on {release}");
    for (n, c) in checks.iter().enumerate() {
        let base = out.join("checks").join(n.to_string());
        let rc = std::fs::read_to_string(base.with_extension("rc")).unwrap_or_default();
        let log = std::fs::read_to_string(base.with_extension("log")).unwrap_or_default();
        let ns: Vec<u128> = std::fs::read_to_string(base.with_extension("ns"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let secs = match ns.as_slice() {
            [a, b] => {
                let ms = u32::try_from(b.saturating_sub(*a) / 1_000_000).unwrap_or(u32::MAX);
                format!("{:.1}s", f64::from(ms) / 1e3)
            }
            _ => "-".to_owned(),
        };
        // Ran, exactly one test, and it passed.
        let ok = rc.trim() == "0" && log.contains("test result: ok. 1 passed");
        let verdict = if ok {
            "ok"
        } else if rc.trim() == "124" {
            "TIMED OUT"
        } else if rc.is_empty() {
            "DID NOT RUN"
        } else {
            "FAILED"
        };
        println!("test vm[{release}] {} ... {verdict} ({secs})", c.id);
        if ok {
            // What the check printed besides the harness's own lines: the
            // figures it measured in the guest.
            for line in printed(&log) {
                println!("    {line}");
            }
        } else {
            failed.push((c, log));
        }
    }
    for (c, log) in &failed {
        println!("\n---- vm[{release}] {} ----\n{}", c.id, log.trim_end());
    }
    println!(
        "\nvmtest: {} passed, {} failed; setup {:.0?}, build {:.0?}, guest {:.0?} (console: {})",
        checks.len() - failed.len(),
        failed.len(),
        setup_took,
        build_took,
        guest_took,
        out.join("console.log").display()
    );
    if !failed.is_empty() {
        bail!("{} guest check(s) failed on {release}", failed.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &str, lane: Lane) -> Check {
        Check {
            id: id.to_owned(),
            bin: PathBuf::from(format!("/b/{id}")),
            test: id.to_owned(),
            lane,
        }
    }

    /// Each lane's checks in their order in one shell function; the two
    /// functions started together, and the suite done only when both are.
    #[test]
    fn the_guest_script_runs_each_lanes_checks_in_order_and_both_lanes_at_once() {
        let built = Built {
            tests: Vec::new(),
            agent: PathBuf::from("/a"),
            plugin: PathBuf::from("/p"),
        };
        let checks = [
            check("dev1", Lane::Devices),
            check("ns1", Lane::Namespaces),
            check("dev2", Lane::Devices),
        ];
        let script = guest_script(&built, Path::new("/out"), &checks);
        let body = |name: &str| {
            let start = script.find(&format!("{name}() {{")).expect(name);
            let end = start + script[start..].find("\n}\n").expect("the function's end");
            script[start..end].to_owned()
        };
        let (devices, namespaces) = (body("lane0"), body("lane1"));
        let (d1, d2) = (
            devices.find("'/b/dev1'").expect("dev1 in the device lane"),
            devices.find("'/b/dev2'").expect("dev2 in the device lane"),
        );
        assert!(d1 < d2, "{devices}");
        assert!(devices.contains("/out/checks/2.rc"), "{devices}");
        assert!(!devices.contains("ns1"), "{devices}");
        assert!(namespaces.contains("'/b/ns1'"), "{namespaces}");
        assert!(namespaces.contains("/out/checks/1.rc"), "{namespaces}");
        let tail = &script[script.find("\n}\nlane0 &").expect("lanes started")..];
        let (wait, done) = (
            tail.find("\nwait\n").unwrap(),
            tail.find("/out/done").unwrap(),
        );
        assert!(tail.contains("lane1 &\n") && wait < done, "{tail}");
    }
}

//! VFIO driver handoff against a fake sysfs tree and a fake kernel.
//!
//! The tree reproduces the kernel's layout: the device directory under
//! `devices/pci0000:00/<bdf>/` with `vendor`, `device`, `driver_override`, the
//! `driver` symlink (`../../../bus/pci/drivers/<drv>`) and a `net/` directory
//! that appears only while a NIC driver is bound; `bus/pci/devices/<bdf>` is a
//! symlink to it; `bus/pci/drivers/<drv>/{bind,unbind}` are plain files.
//!
//! Plain files do not act when written, so [`FakeKernel`] wraps the
//! production [`Sysfs`] implementation (every write really goes to the file at
//! the path the kernel uses) and then applies the kernel's semantics: unbind
//! of a driver that is not bound fails with ENODEV, bind of a bound device
//! fails with EBUSY, bind is refused when `driver_override` names another
//! driver, binding a NIC driver makes `net/<name>` appear after a delay.
//! Failures can be injected at every step. Every test asserts that the
//! device ends on `vfio-pci` (or that `heal` puts it back).

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xdhcp::vfio::{
    HealOutcome, JournalEntry, PciAddr, Step, Sysfs, SysfsOps, VFIO_PCI, VfDriverOverride,
    VfioError, heal, heal_ops, journal_path, with_kernel_driver, with_kernel_driver_ops,
};

const MLX_VF: (u16, u16) = (0x15b3, 0x101e);
const NETDEV: &str = "enp59s0f0v2";
const T: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    ReadDriver,
    Override,
    Unbind,
    Bind,
}

#[derive(Debug, Clone)]
struct Fault {
    op: Op,
    /// Only when acting on this driver (override value, unbind/bind driver).
    driver: Option<&'static str>,
    /// How many more times to fail (`u32::MAX`: always).
    remaining: u32,
}

/// A fake kernel over a fake sysfs tree.
struct FakeKernel {
    root: PathBuf,
    sysfs: Sysfs,
    journal_dir: PathBuf,
    faults: Mutex<Vec<Fault>>,
    /// `None`: the netdev never appears.
    netdev_delay: Mutex<Option<Duration>>,
    /// Writes in order, as `op driver`.
    log: Mutex<Vec<String>>,
    /// Whether the journal existed at every write.
    journal_before_write: Mutex<Vec<bool>>,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl FakeKernel {
    /// Build a tree with one VF bound to vfio-pci and the given drivers loaded.
    fn new(dir: &Path, pci: PciAddr, ids: (u16, u16), drivers: &[&str]) -> Arc<FakeKernel> {
        let root = dir.join("sys");
        let dev = root.join("devices/pci0000:00").join(pci.to_string());
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), format!("0x{:04x}\n", ids.0)).unwrap();
        std::fs::write(dev.join("device"), format!("0x{:04x}\n", ids.1)).unwrap();
        std::fs::write(dev.join("driver_override"), "vfio-pci\n").unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{pci}"),
            root.join("bus/pci/devices").join(pci.to_string()),
        )
        .unwrap();
        for drv in drivers.iter().chain(&[VFIO_PCI]) {
            let d = root.join("bus/pci/drivers").join(drv);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("bind"), "").unwrap();
            std::fs::write(d.join("unbind"), "").unwrap();
        }
        symlink("../../../bus/pci/drivers/vfio-pci", dev.join("driver")).unwrap();
        Arc::new(FakeKernel {
            sysfs: Sysfs::new(&root),
            root,
            journal_dir: dir.join("state/vfio-journal"),
            faults: Mutex::new(Vec::new()),
            netdev_delay: Mutex::new(Some(Duration::from_millis(120))),
            log: Mutex::new(Vec::new()),
            journal_before_write: Mutex::new(Vec::new()),
        })
    }

    fn dev_dir(&self, pci: PciAddr) -> PathBuf {
        self.root.join("devices/pci0000:00").join(pci.to_string())
    }

    fn fail(&self, op: Op, driver: Option<&'static str>, times: u32) {
        self.faults.lock().unwrap().push(Fault {
            op,
            driver,
            remaining: times,
        });
    }

    fn clear_faults(&self) {
        self.faults.lock().unwrap().clear();
    }

    fn never_netdev(&self) {
        *self.netdev_delay.lock().unwrap() = None;
    }

    fn injected(&self, op: Op, driver: &str) -> io::Result<()> {
        let mut faults = self.faults.lock().unwrap();
        for f in faults.iter_mut() {
            if f.op == op && f.driver.is_none_or(|d| d == driver) && f.remaining > 0 {
                if f.remaining != u32::MAX {
                    f.remaining -= 1;
                }
                return Err(errno(libc::EIO));
            }
        }
        Ok(())
    }

    fn record(&self, what: String, pci: PciAddr) {
        let journal = journal_path(&self.journal_dir, &pci).exists();
        self.journal_before_write.lock().unwrap().push(journal);
        self.log.lock().unwrap().push(what);
    }

    fn driver_of(&self, pci: PciAddr) -> Option<String> {
        self.sysfs.current_driver(&pci).unwrap()
    }

    fn override_of(&self, pci: PciAddr) -> String {
        std::fs::read_to_string(self.dev_dir(pci).join("driver_override"))
            .unwrap()
            .trim()
            .to_owned()
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The invariant every test ends with.
    fn assert_on_vfio(&self, pci: PciAddr) {
        assert_eq!(
            self.driver_of(pci).as_deref(),
            Some(VFIO_PCI),
            "log: {:?}",
            self.log()
        );
        assert_eq!(self.override_of(pci), VFIO_PCI);
        assert!(
            !self.dev_dir(pci).join("net").exists(),
            "no netdev while on vfio-pci"
        );
    }

    fn journal_files(&self) -> Vec<String> {
        match std::fs::read_dir(&self.journal_dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

impl SysfsOps for FakeKernel {
    fn device_path(&self, pci: &PciAddr) -> PathBuf {
        self.sysfs.device_dir(pci)
    }

    fn driver_path(&self, driver: &str) -> PathBuf {
        self.sysfs.driver_dir(driver)
    }

    fn device_exists(&self, pci: &PciAddr) -> bool {
        self.sysfs.device_exists(pci)
    }

    fn read_attr(&self, pci: &PciAddr, attr: &str) -> io::Result<String> {
        self.sysfs.read_attr(pci, attr)
    }

    fn current_driver(&self, pci: &PciAddr) -> io::Result<Option<String>> {
        self.injected(Op::ReadDriver, "")?;
        self.sysfs.current_driver(pci)
    }

    fn driver_loaded(&self, driver: &str) -> bool {
        self.sysfs.driver_loaded(driver)
    }

    fn write_driver_override(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.record(format!("override {driver}"), *pci);
        self.injected(Op::Override, driver)?;
        self.sysfs.write_driver_override(pci, driver)
    }

    fn unbind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.record(format!("unbind {driver}"), *pci);
        self.injected(Op::Unbind, driver)?;
        self.sysfs.unbind(pci, driver)?;
        // The write landed in drivers/<driver>/unbind; now act like the kernel.
        let written = std::fs::read_to_string(self.sysfs.driver_dir(driver).join("unbind"))?;
        assert_eq!(written, pci.to_string());
        if self.sysfs.current_driver(pci)?.as_deref() != Some(driver) {
            return Err(errno(libc::ENODEV));
        }
        let dev = self.dev_dir(*pci);
        std::fs::remove_file(dev.join("driver"))?;
        let _ = std::fs::remove_dir_all(dev.join("net"));
        Ok(())
    }

    fn bind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.record(format!("bind {driver}"), *pci);
        self.injected(Op::Bind, driver)?;
        self.sysfs.bind(pci, driver)?;
        let written = std::fs::read_to_string(self.sysfs.driver_dir(driver).join("bind"))?;
        assert_eq!(written, pci.to_string());
        if self.sysfs.current_driver(pci)?.is_some() {
            return Err(errno(libc::EBUSY));
        }
        let ov = self.override_of(*pci);
        if !ov.is_empty() && ov != "(null)" && ov != driver {
            return Err(errno(libc::ENODEV));
        }
        let dev = self.dev_dir(*pci);
        symlink(
            format!("../../../bus/pci/drivers/{driver}"),
            dev.join("driver"),
        )?;
        if driver != VFIO_PCI
            && let Some(delay) = *self.netdev_delay.lock().unwrap()
        {
            let sysfs = self.sysfs.clone();
            let pci = *pci;
            let driver = driver.to_owned();
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                if sysfs.current_driver(&pci).ok().flatten().as_deref() == Some(&driver) {
                    std::fs::create_dir_all(dev.join("net").join(NETDEV)).unwrap();
                }
            });
        }
        Ok(())
    }

    fn netdevs(&self, pci: &PciAddr) -> io::Result<Vec<String>> {
        self.sysfs.netdevs(pci)
    }
}

fn pci() -> PciAddr {
    "0000:3b:02.2".parse().unwrap()
}

fn setup(ids: (u16, u16), drivers: &[&str]) -> (tempfile::TempDir, Arc<FakeKernel>) {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new(dir.path(), pci(), ids, drivers);
    (dir, k)
}

#[tokio::test]
async fn handoff_runs_closure_on_netdev_and_restores() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let kk = k.clone();
    let out = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |netdev| async move {
        // Inside the window: kernel driver bound, netdev present, journal on disk.
        assert_eq!(kk.driver_of(p).as_deref(), Some("mlx5_core"));
        assert_eq!(kk.override_of(p), "mlx5_core");
        let j: JournalEntry = serde_json::from_slice(
            &std::fs::read(journal_path(&kk.journal_dir, &p)).unwrap(),
        )
        .unwrap();
        assert_eq!(j.bdf, p);
        assert_eq!(j.original_driver, VFIO_PCI);
        assert_eq!(j.intended_driver, "mlx5_core");
        assert!(j.started_at > 1_600_000_000);
        let raw = std::fs::read_to_string(journal_path(&kk.journal_dir, &p)).unwrap();
        assert!(raw.starts_with(r#"{"bdf":"0000:3b:02.2","original_driver":"vfio-pci","intended_driver":"mlx5_core","started_at":"#), "{raw}");
        netdev
    })
    .await
    .unwrap();
    assert_eq!(out, NETDEV);
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
    assert_eq!(
        k.log(),
        [
            "override mlx5_core",
            "unbind vfio-pci",
            "bind mlx5_core",
            "unbind mlx5_core",
            "override vfio-pci",
            "bind vfio-pci"
        ]
    );
    // The journal was on disk before the first sysfs write (and every later one).
    assert!(
        k.journal_before_write
            .lock()
            .unwrap()
            .iter()
            .take(3)
            .all(|j| *j)
    );
}

#[tokio::test]
async fn production_entry_point_writes_the_real_files() {
    // `with_kernel_driver` (the real Sysfs) on the fake tree: without a kernel
    // nothing binds, so the netdev never appears; the writes must land in the
    // files the kernel uses and the journal must be cleaned up.
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let err = with_kernel_driver(
        &k.sysfs,
        &k.journal_dir,
        &p,
        Duration::from_millis(150),
        |_| async {},
    )
    .await
    .unwrap_err();
    // The restore round verifies the driver link, which still says vfio-pci
    // (plain files do not unbind), so it succeeds and the timeout is reported.
    assert!(matches!(err, VfioError::NetdevTimeout { .. }), "{err}");
    let drivers = k.root.join("bus/pci/drivers");
    assert_eq!(
        std::fs::read_to_string(drivers.join("vfio-pci/unbind")).unwrap(),
        "0000:3b:02.2"
    );
    assert_eq!(
        std::fs::read_to_string(drivers.join("mlx5_core/bind")).unwrap(),
        "0000:3b:02.2"
    );
    assert_eq!(k.override_of(p), VFIO_PCI);
    assert!(k.journal_files().is_empty());
}

async fn expect_step_failure(op: Op, driver: &'static str, step: Step) {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    k.fail(op, Some(driver), u32::MAX);
    let called = Arc::new(Mutex::new(false));
    let c = called.clone();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async move {
        *c.lock().unwrap() = true;
    })
    .await
    .unwrap_err();
    match &err {
        VfioError::Step { step: s, pci, .. } => {
            assert_eq!(*s, step);
            assert_eq!(*pci, p);
        }
        other => panic!("expected a {step} step error, got {other}"),
    }
    assert!(err.to_string().contains("vfio-pci restored"), "{err}");
    assert!(!*called.lock().unwrap(), "closure must not run");
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn override_write_failure_restores_vfio() {
    expect_step_failure(Op::Override, "mlx5_core", Step::DriverOverride).await;
}

#[tokio::test]
async fn unbind_failure_restores_vfio() {
    expect_step_failure(Op::Unbind, VFIO_PCI, Step::Unbind).await;
}

#[tokio::test]
async fn bind_failure_restores_vfio() {
    expect_step_failure(Op::Bind, "mlx5_core", Step::Bind).await;
}

#[tokio::test]
async fn netdev_timeout_restores_vfio() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    k.never_netdev();
    let err = with_kernel_driver_ops(
        &*k,
        &k.journal_dir,
        &p,
        Duration::from_millis(200),
        |_| async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, VfioError::NetdevTimeout { .. }), "{err}");
    assert!(err.to_string().contains("/net"), "{err}");
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn closure_error_restores_vfio() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let out: Result<(), &str> = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {
        Err("no DHCP offer")
    })
    .await
    .unwrap();
    assert_eq!(out, Err("no DHCP offer"));
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn closure_panic_restores_vfio() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        with_kernel_driver_ops(&*k2, &k2.journal_dir, &p, T, |netdev| async move {
            assert!(netdev.is_empty(), "closure panics on purpose");
        })
        .await
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn cancellation_restores_vfio() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let handoff = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async move {
        tx.send(()).unwrap();
        std::future::pending::<()>().await;
    });
    tokio::select! {
        _ = handoff => panic!("the closure never returns"),
        got = rx => got.unwrap(),
    }
    // `select!` dropped the handoff future mid-closure.
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
    // Also through a timeout wrapper.
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| std::future::pending::<()>()),
    )
    .await;
    assert!(r.is_err());
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn transient_restore_failure_is_retried() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    // The first unbind of the kernel driver fails, the next round succeeds.
    k.fail(Op::Unbind, Some("mlx5_core"), 1);
    k.fail(Op::Override, Some(VFIO_PCI), 1);
    with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap();
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn persistent_restore_failure_keeps_journal_then_heal_restores() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    k.fail(Op::Unbind, Some("mlx5_core"), u32::MAX);
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    let VfioError::RestoreFailed { source, after } = &err else {
        panic!("expected RestoreFailed, got {err}");
    };
    assert!(after.is_none());
    assert_eq!(source.driver_now.as_deref(), Some("mlx5_core"));
    assert!(err.to_string().contains("unbind (mlx5_core)"), "{err}");
    assert_eq!(k.driver_of(p).as_deref(), Some("mlx5_core"));
    assert_eq!(k.journal_files(), ["0000:3b:02.2.json"]);
    // A second handoff is refused while the journal is there.
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    assert!(matches!(err, VfioError::NotBoundToVfio { .. }), "{err}");

    // The fault clears (e.g. after a restart); heal puts vfio-pci back.
    k.clear_faults();
    let reports = heal_ops(&*k, &k.journal_dir).unwrap();
    assert_eq!(reports.len(), 1);
    assert!(
        matches!(&reports[0].outcome, HealOutcome::Restored { from } if from == "mlx5_core"),
        "{:?}",
        reports[0].outcome
    );
    assert_eq!(reports[0].intended_driver.as_deref(), Some("mlx5_core"));
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn restore_failure_after_step_error_reports_both() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    k.never_netdev();
    k.fail(Op::Bind, Some(VFIO_PCI), u32::MAX);
    let err = with_kernel_driver_ops(
        &*k,
        &k.journal_dir,
        &p,
        Duration::from_millis(100),
        |_| async {},
    )
    .await
    .unwrap_err();
    let VfioError::RestoreFailed {
        after: Some(after), ..
    } = &err
    else {
        panic!("expected RestoreFailed after a timeout, got {err}");
    };
    assert!(matches!(**after, VfioError::NetdevTimeout { .. }));
    assert_eq!(k.journal_files(), ["0000:3b:02.2.json"]);
    k.clear_faults();
    let reports = heal_ops(&*k, &k.journal_dir).unwrap();
    assert!(reports[0].is_healed());
    k.assert_on_vfio(p);
}

#[tokio::test]
async fn agent_killed_mid_handoff_is_healed_on_start() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut handoff = Box::pin(with_kernel_driver_ops(
        &*k,
        &k.journal_dir,
        &p,
        T,
        |_| async move {
            tx.send(()).unwrap();
            std::future::pending::<()>().await;
        },
    ));
    tokio::select! {
        _ = &mut handoff => panic!("the closure never returns"),
        got = rx => got.unwrap(),
    }
    // SIGKILL: no destructor runs.
    std::mem::forget(handoff);
    assert_eq!(k.driver_of(p).as_deref(), Some("mlx5_core"));
    assert!(k.dev_dir(p).join("net").join(NETDEV).exists());
    assert_eq!(k.journal_files(), ["0000:3b:02.2.json"]);

    // The agent starts again: heal through the production entry point on a
    // fresh fake kernel over the same tree.
    let restarted = FakeKernelView(k.clone());
    let reports = heal_ops(&restarted, &k.journal_dir).unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].pci, Some(p));
    assert!(matches!(&reports[0].outcome, HealOutcome::Restored { from } if from == "mlx5_core"));
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
    // A second heal has nothing to do.
    assert!(heal_ops(&restarted, &k.journal_dir).unwrap().is_empty());
}

/// The same fake kernel seen by a "new process".
struct FakeKernelView(Arc<FakeKernel>);

impl SysfsOps for FakeKernelView {
    fn device_exists(&self, pci: &PciAddr) -> bool {
        self.0.device_exists(pci)
    }
    fn read_attr(&self, pci: &PciAddr, attr: &str) -> io::Result<String> {
        self.0.read_attr(pci, attr)
    }
    fn current_driver(&self, pci: &PciAddr) -> io::Result<Option<String>> {
        self.0.current_driver(pci)
    }
    fn driver_loaded(&self, driver: &str) -> bool {
        self.0.driver_loaded(driver)
    }
    fn write_driver_override(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.0.write_driver_override(pci, driver)
    }
    fn unbind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.0.unbind(pci, driver)
    }
    fn bind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        self.0.bind(pci, driver)
    }
    fn netdevs(&self, pci: &PciAddr) -> io::Result<Vec<String>> {
        self.0.netdevs(pci)
    }
}

#[tokio::test]
async fn unknown_device_fails_before_touching_anything() {
    let (_dir, k) = setup((0x1af4, 0x1041), &["virtio-pci"]);
    let p = pci();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        VfioError::UnknownDevice {
            vendor: 0x1af4,
            device: 0x1041,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(
        msg.contains("0x1af4") && msg.contains("0x1041") && msg.contains("0000:3b:02.2"),
        "{msg}"
    );
    assert!(k.log().is_empty());
    assert!(k.journal_files().is_empty());
    k.assert_on_vfio(p);
}

#[tokio::test]
async fn operator_vf_driver_entry_hands_off_an_unknown_device_and_wins_over_the_table() {
    // `with_kernel_driver` (the real Sysfs) on the fake tree, as in
    // `production_entry_point_writes_the_real_files`: the bind lands in the
    // driver the operator named, then the netdev wait times out and
    // vfio-pci is restored.
    let entries: Vec<VfDriverOverride> = ["1af4:1041=virtio-pci", "15b3:101e=mlx5_vendor"]
        .iter()
        .map(|e| e.parse().unwrap())
        .collect();
    for (ids, drivers, want) in [
        ((0x1af4, 0x1041), ["virtio-pci", "mlx5_core"], "virtio-pci"),
        (MLX_VF, ["mlx5_core", "mlx5_vendor"], "mlx5_vendor"),
    ] {
        let (_dir, k) = setup(ids, &drivers);
        let p = pci();
        let sysfs = k.sysfs.clone().with_vf_drivers(&entries);
        let err = with_kernel_driver(
            &sysfs,
            &k.journal_dir,
            &p,
            Duration::from_millis(150),
            |_| async {},
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&err, VfioError::NetdevTimeout { driver, .. } if driver == want),
            "{err}"
        );
        let bound = |drv: &str| {
            std::fs::read_to_string(k.root.join("bus/pci/drivers").join(drv).join("bind")).unwrap()
        };
        assert_eq!(bound(want), "0000:3b:02.2");
        for other in drivers.iter().filter(|d| **d != want) {
            assert_eq!(bound(other), "", "{other}");
        }
        assert_eq!(k.override_of(p), VFIO_PCI);
        assert!(k.journal_files().is_empty());
    }
    // An entry for a driver that is not loaded fails before anything is written.
    let (_dir, k) = setup((0x1af4, 0x1041), &[]);
    let err = with_kernel_driver(
        &k.sysfs.clone().with_vf_drivers(&entries[..1]),
        &k.journal_dir,
        &pci(),
        T,
        |_| async {},
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, VfioError::DriverNotLoaded { wanted, .. } if wanted == "virtio-pci"),
        "{err}"
    );
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn device_not_on_vfio_is_refused() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    // Put it on the kernel driver by hand.
    let dev = k.dev_dir(p);
    std::fs::remove_file(dev.join("driver")).unwrap();
    symlink("../../../bus/pci/drivers/mlx5_core", dev.join("driver")).unwrap();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, VfioError::NotBoundToVfio { driver: Some(d), .. } if d == "mlx5_core"),
        "{err}"
    );
    assert!(k.log().is_empty());
    assert!(k.journal_files().is_empty());
}

#[tokio::test]
async fn missing_device_and_unloaded_driver_are_clear_errors() {
    let (_dir, k) = setup(MLX_VF, &[]);
    let p = pci();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    assert!(matches!(err, VfioError::DriverNotLoaded { .. }), "{err}");
    assert!(err.to_string().contains("mlx5_core"), "{err}");
    let other: PciAddr = "0000:3b:02.3".parse().unwrap();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &other, T, |_| async {})
        .await
        .unwrap_err();
    assert!(matches!(err, VfioError::DeviceNotFound { .. }), "{err}");
    assert!(k.log().is_empty());
    k.assert_on_vfio(p);
}

#[tokio::test]
async fn intel_vf_uses_i40evf_when_iavf_is_absent() {
    let (_dir, k) = setup((0x8086, 0x154c), &["i40evf"]);
    let p = pci();
    let kk = k.clone();
    with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async move {
        assert_eq!(kk.driver_of(p).as_deref(), Some("i40evf"));
    })
    .await
    .unwrap();
    k.assert_on_vfio(p);
}

#[tokio::test]
async fn broadcom_and_ixgbevf_vfs_hand_off() {
    for (ids, drv) in [((0x14e4, 0x16dc), "bnxt_en"), ((0x8086, 0x10ed), "ixgbevf")] {
        let (_dir, k) = setup(ids, &[drv, "mlx5_core"]);
        let p = pci();
        let kk = k.clone();
        with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async move {
            assert_eq!(kk.driver_of(p).as_deref(), Some(drv));
        })
        .await
        .unwrap();
        k.assert_on_vfio(p);
    }
}

#[tokio::test]
async fn existing_journal_refuses_a_second_handoff() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    std::fs::create_dir_all(&k.journal_dir).unwrap();
    let j = journal_path(&k.journal_dir, &p);
    std::fs::write(&j, b"{\"other\":\"handoff\"}").unwrap();
    let err = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| async {})
        .await
        .unwrap_err();
    assert!(matches!(err, VfioError::HandoffInProgress { .. }), "{err}");
    assert!(k.log().is_empty());
    assert_eq!(std::fs::read(&j).unwrap(), b"{\"other\":\"handoff\"}");
    k.assert_on_vfio(p);
}

#[test]
fn heal_handles_every_kind_of_entry() {
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    // No journal dir at all.
    assert!(heal(&k.sysfs, &k.journal_dir).unwrap().is_empty());

    std::fs::create_dir_all(&k.journal_dir).unwrap();
    // 1. Corrupt content, but the file name is the address: restored by name.
    std::fs::write(journal_path(&k.journal_dir, &p), b"{trunc").unwrap();
    // 2. A device that no longer exists.
    let gone: PciAddr = "0000:af:00.1".parse().unwrap();
    let entry = JournalEntry {
        bdf: gone,
        original_driver: VFIO_PCI.into(),
        intended_driver: "iavf".into(),
        started_at: 1,
    };
    std::fs::write(
        journal_path(&k.journal_dir, &gone),
        serde_json::to_vec(&entry).unwrap(),
    )
    .unwrap();
    // 3. Garbage that names nothing.
    std::fs::write(k.journal_dir.join("garbage.json"), b"?").unwrap();
    // 4. A temporary from an interrupted journal write.
    std::fs::write(k.journal_dir.join(".0000:3b:02.2.tmp.99"), b"{").unwrap();

    // The device is on the kernel driver, as after a crash.
    let dev = k.dev_dir(p);
    std::fs::remove_file(dev.join("driver")).unwrap();
    symlink("../../../bus/pci/drivers/mlx5_core", dev.join("driver")).unwrap();
    std::fs::write(dev.join("driver_override"), "mlx5_core").unwrap();

    let reports = heal_ops(&*k, &k.journal_dir).unwrap();
    assert_eq!(reports.len(), 3, "{reports:?}");
    let by_name = |n: &str| {
        reports
            .iter()
            .find(|r| r.journal.file_name().unwrap() == n)
            .unwrap()
    };
    assert!(matches!(
        by_name("0000:3b:02.2.json").outcome,
        HealOutcome::Restored { .. }
    ));
    assert!(matches!(
        by_name("0000:af:00.1.json").outcome,
        HealOutcome::DeviceGone
    ));
    assert!(matches!(
        by_name("garbage.json").outcome,
        HealOutcome::Unreadable(_)
    ));
    assert!(!by_name("garbage.json").is_healed());
    k.assert_on_vfio(p);
    // Only the unreadable entry is kept, for an operator.
    assert_eq!(k.journal_files(), ["garbage.json"]);

    // Already on vfio-pci with a stale override: re-pinned.
    std::fs::write(
        journal_path(&k.journal_dir, &p),
        serde_json::to_vec(&JournalEntry {
            bdf: p,
            original_driver: VFIO_PCI.into(),
            intended_driver: "mlx5_core".into(),
            started_at: 1,
        })
        .unwrap(),
    )
    .unwrap();
    std::fs::write(dev.join("driver_override"), "mlx5_core").unwrap();
    let reports = heal_ops(&*k, &k.journal_dir).unwrap();
    let r = reports.iter().find(|r| r.pci == Some(p)).unwrap();
    assert!(
        matches!(r.outcome, HealOutcome::AlreadyBound),
        "{:?}",
        r.outcome
    );
    k.assert_on_vfio(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_thread_runtime_handoff_and_cancellation() {
    // On the agent's multi-threaded runtime sysfs writes go through
    // `block_in_place`; the guard still restores on cancellation.
    let (_dir, k) = setup(MLX_VF, &["mlx5_core"]);
    let p = pci();
    let out = with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |n| async move { n })
        .await
        .unwrap();
    assert_eq!(out, NETDEV);
    k.assert_on_vfio(p);
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        with_kernel_driver_ops(&*k, &k.journal_dir, &p, T, |_| std::future::pending::<()>()),
    )
    .await;
    assert!(r.is_err());
    k.assert_on_vfio(p);
    assert!(k.journal_files().is_empty());
}

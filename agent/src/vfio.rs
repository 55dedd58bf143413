//! VFIO driver handoff, journaled on disk so an interrupted handoff is healed on start.
//!
//! A KubeVirt VM with an SR-IOV VF passed through has the VF bound to
//! `vfio-pci`: the host has no netdev to run DHCP on. For the one-shot
//! discovery [`with_kernel_driver`] temporarily hands the VF to its
//! kernel NIC driver, waits for the netdev, runs the caller's closure on it
//! and gives the VF back to `vfio-pci`:
//!
//! 1. read `vendor`/`device` under `<sysfs>/bus/pci/devices/<bdf>/` and pick
//!    the driver: an operator's `--vf-driver` entry for these ids, else
//!    [`VF_DRIVERS`] (unknown ids fail here, nothing touched);
//! 2. check the device is bound to `vfio-pci`;
//! 3. write the journal `<journal_dir>/<bdf>.json`
//!    (`{bdf, original_driver, intended_driver, started_at}`), atomically and
//!    exclusively, **before the first sysfs write**;
//! 4. `driver_override` = driver, unbind from `vfio-pci`, bind to the driver
//!    (`drivers/<driver>/bind`), poll `<device>/net/` for the netdev;
//! 5. run the closure;
//! 6. restore on every path: unbind the kernel driver, `driver_override` =
//!    `vfio-pci`, bind `vfio-pci`, verify, remove the journal.
//!
//! Step 6 is owned by a guard: the normal and error paths call it
//! explicitly, and the guard's `Drop` runs it synchronously when the future
//! is cancelled (dropped) or the closure panics. A process that is killed
//! outright leaves the journal behind; [`heal`] at agent start restores
//! `vfio-pci` for every journal entry before anything is served.
//!
//! All sysfs access goes through the [`SysfsOps`] trait; [`Sysfs`] is the
//! production implementation rooted at `--sysfs-root` (default `/sys`), and
//! tests substitute a fake kernel that mutates a fake tree.
//!
//! # Driver table
//! VF device ids come from the kernel drivers' PCI tables. Intel `ice` (E810)
//! has no VF netdev driver: its VFs are "Ethernet Adaptive Virtual Function"
//! devices (0x1889) driven by `iavf`. `i40evf` is the pre-4.17 name of `iavf`
//! and is used when only it is loaded. ConnectX-3 VFs belong to `mlx4_core`
//! (whose netdev comes from `mlx4_en`), ConnectX-4 and later to `mlx5_core`.
//!
//! One thing, whole: the handoff, its journal and its healing share one
//! state model (which driver a device is on, and what the journal promises),
//! and splitting them would spread that model over files; a third of the
//! file is the fake-kernel tests of every failure step.
//!
//! The table cannot know every VF (new device ids, vendor drivers, devices
//! passed through whole). An operator names the driver for such a device
//! with `--vf-driver VENDOR:DEVICE=DRIVER` ([`VfDriverOverride`], carried by
//! [`Sysfs::with_vf_drivers`]); an entry wins over the table.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::sys::fs::{AtomicWrite, Install, WriteStep};

/// The driver a passed-through VF lives on.
pub const VFIO_PCI: &str = "vfio-pci";
/// Default `--sysfs-root`.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";
/// How often the netdev wait polls `<device>/net/`.
pub const NETDEV_POLL: Duration = Duration::from_millis(50);
/// Restore attempts (each a full unbind/override/bind/verify round).
pub const RESTORE_ROUNDS: u32 = 3;

/// A PCI address `DDDD:BB:DD.F` (domain, bus, device, function).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddr {
    /// Domain (16 bits).
    pub domain: u16,
    /// Bus.
    pub bus: u8,
    /// Device (0..=0x1f).
    pub device: u8,
    /// Function (0..=7).
    pub function: u8,
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Debug for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PciAddr({self})")
    }
}

impl FromStr for PciAddr {
    type Err = VfioError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| VfioError::InvalidPciAddress {
            input: s.to_owned(),
            reason,
        };
        let hex = |part: &str, len: usize| -> Option<u32> {
            (part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(part, 16).ok())
                .flatten()
        };
        let (domain, rest) = s
            .split_once(':')
            .ok_or_else(|| bad("expected DDDD:BB:DD.F"))?;
        let (bus, rest) = rest
            .split_once(':')
            .ok_or_else(|| bad("expected DDDD:BB:DD.F"))?;
        let (device, function) = rest
            .split_once('.')
            .ok_or_else(|| bad("expected DDDD:BB:DD.F"))?;
        let domain = hex(domain, 4).ok_or_else(|| bad("domain must be 4 hex digits"))?;
        let bus = hex(bus, 2).ok_or_else(|| bad("bus must be 2 hex digits"))?;
        let device = hex(device, 2).ok_or_else(|| bad("device must be 2 hex digits"))?;
        let function = hex(function, 1).ok_or_else(|| bad("function must be 1 hex digit"))?;
        if device > 0x1f {
            return Err(bad("device must be at most 1f"));
        }
        if function > 7 {
            return Err(bad("function must be at most 7"));
        }
        Ok(PciAddr {
            domain: domain as u16,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl Serialize for PciAddr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// One row of the VF driver table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VfDriver {
    /// PCI vendor id.
    pub vendor: u16,
    /// VF device ids the driver claims.
    pub devices: &'static [u16],
    /// Driver names to try, in order (the first one loaded wins).
    pub drivers: &'static [&'static str],
}

/// VF (vendor, device) → kernel netdev driver.
pub const VF_DRIVERS: &[VfDriver] = &[
    // NVIDIA/Mellanox ConnectX-4 .. ConnectX-7/8 VFs, BlueField VF (mlx5 main.c).
    VfDriver {
        vendor: 0x15b3,
        devices: &[
            0x1012, 0x1014, 0x1016, 0x1018, 0x101a, 0x101c, 0x101e, 0xa2d3,
        ],
        drivers: &["mlx5_core"],
    },
    // ConnectX-3 VF (mlx4).
    VfDriver {
        vendor: 0x15b3,
        devices: &[0x1004],
        drivers: &["mlx4_core"],
    },
    // Intel XL710/X722/E810 VFs: i40e VF, Hyper-V VF, Adaptive VF (ice), X722 VF.
    VfDriver {
        vendor: 0x8086,
        devices: &[0x154c, 0x1571, 0x1889, 0x37cd],
        drivers: &["iavf", "i40evf"],
    },
    // Intel 82599/X540/X550 VFs (and their Hyper-V variants).
    VfDriver {
        vendor: 0x8086,
        devices: &[
            0x10ed, 0x152e, 0x1515, 0x1530, 0x1565, 0x1564, 0x15a8, 0x15a9, 0x15c5, 0x15b4,
        ],
        drivers: &["ixgbevf"],
    },
    // Intel 82576/I350 VFs.
    VfDriver {
        vendor: 0x8086,
        devices: &[0x10ca, 0x152d, 0x1520, 0x152f],
        drivers: &["igbvf"],
    },
    // Broadcom NetXtreme-C/E/S VFs (bnxt.c, CONFIG_BNXT_SRIOV section).
    VfDriver {
        vendor: 0x14e4,
        devices: &[
            0x1606, 0x1607, 0x1608, 0x1609, 0x16bd, 0x16c1, 0x16c2, 0x16c3, 0x16c4, 0x16c5, 0x16cb,
            0x16d3, 0x16dc, 0x16e1, 0x16e5, 0x16e6, 0x1806, 0x1807, 0x1808, 0x1809, 0x1819, 0xd800,
        ],
        drivers: &["bnxt_en"],
    },
];

/// The table row for a (vendor, device) pair.
pub fn vf_driver_for(vendor: u16, device: u16) -> Option<&'static VfDriver> {
    VF_DRIVERS
        .iter()
        .find(|d| d.vendor == vendor && d.devices.contains(&device))
}

/// An operator's `--vf-driver VENDOR:DEVICE=DRIVER`: the kernel netdev
/// driver for one PCI (vendor, device) pair, written like `lspci -nn` shows
/// the ids (`8086:1889=iavf`; 1–4 hex digits each, an optional `0x`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfDriverOverride {
    /// PCI vendor id.
    pub vendor: u16,
    /// PCI device id.
    pub device: u16,
    /// The driver's name under `/sys/bus/pci/drivers/`.
    pub driver: String,
}

impl fmt::Display for VfDriverOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:04x}={}", self.vendor, self.device, self.driver)
    }
}

impl FromStr for VfDriverOverride {
    type Err = VfioError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| VfioError::InvalidVfDriver {
            input: s.to_owned(),
            reason,
        };
        let id = |part: &str| -> Option<u16> {
            let hex = part.strip_prefix("0x").unwrap_or(part);
            (!hex.is_empty() && hex.len() <= 4 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u16::from_str_radix(hex, 16).ok())
                .flatten()
        };
        let (ids, driver) = s
            .split_once('=')
            .ok_or_else(|| bad("expected VENDOR:DEVICE=DRIVER"))?;
        let (vendor, device) = ids
            .split_once(':')
            .ok_or_else(|| bad("expected VENDOR:DEVICE=DRIVER"))?;
        let vendor = id(vendor).ok_or_else(|| bad("the vendor id must be 1 to 4 hex digits"))?;
        let device = id(device).ok_or_else(|| bad("the device id must be 1 to 4 hex digits"))?;
        // A driver name becomes a path component under bus/pci/drivers/.
        if driver.is_empty()
            || driver.starts_with('.')
            || !driver
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad(
                "the driver must be a kernel driver name (letters, digits, _ - .)",
            ));
        }
        Ok(VfDriverOverride {
            vendor,
            device,
            driver: driver.to_owned(),
        })
    }
}

/// The drivers to try for (vendor, device), in order: the last operator
/// entry for these ids, else the [`VF_DRIVERS`] row. `None`: nobody knows it.
pub fn vf_drivers_for(
    overrides: &[VfDriverOverride],
    vendor: u16,
    device: u16,
) -> Option<Vec<&str>> {
    if let Some(o) = overrides
        .iter()
        .rev()
        .find(|o| o.vendor == vendor && o.device == device)
    {
        return Some(vec![o.driver.as_str()]);
    }
    vf_driver_for(vendor, device).map(|row| row.drivers.to_vec())
}

/// A step of the handoff or of the restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Reading the bound driver (`<device>/driver` link).
    ReadDriver,
    /// Writing `<device>/driver_override`.
    DriverOverride,
    /// Writing the address to `drivers/<driver>/unbind`.
    Unbind,
    /// Writing the address to `drivers/<driver>/bind`.
    Bind,
    /// Checking that `vfio-pci` is bound again.
    Verify,
    /// Removing the journal entry.
    RemoveJournal,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::ReadDriver => "read bound driver",
            Step::DriverOverride => "write driver_override",
            Step::Unbind => "unbind",
            Step::Bind => "bind",
            Step::Verify => "verify vfio-pci is bound",
            Step::RemoveJournal => "remove journal",
        })
    }
}

/// One failed step of a restore round.
#[derive(Debug)]
pub struct StepFailure {
    /// Which step.
    pub step: Step,
    /// The driver involved.
    pub driver: String,
    /// Why.
    pub error: io::Error,
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.step, self.driver, self.error)
    }
}

/// `vfio-pci` could not be bound again; the journal is kept so [`heal`] retries.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to give {pci} back to vfio-pci after {rounds} rounds (now bound to {}): {}",
    driver_now.as_deref().unwrap_or("no driver"),
    failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
)]
pub struct RestoreError {
    /// The device.
    pub pci: PciAddr,
    /// Rounds attempted.
    pub rounds: u32,
    /// The driver bound at the end, if known.
    pub driver_now: Option<String>,
    /// The failures of the last round.
    pub failures: Vec<StepFailure>,
}

/// Errors of the VFIO handoff.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// Not a `DDDD:BB:DD.F` PCI address.
    #[error("invalid PCI address {input:?}: {reason}")]
    InvalidPciAddress {
        /// The rejected input.
        input: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Not a `VENDOR:DEVICE=DRIVER` driver-table entry.
    #[error("invalid --vf-driver {input:?}: {reason}")]
    InvalidVfDriver {
        /// The rejected input.
        input: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// No such device under the sysfs root.
    #[error("PCI device {pci} not found under {path}")]
    DeviceNotFound {
        /// The device.
        pci: PciAddr,
        /// The directory looked at.
        path: PathBuf,
    },
    /// A sysfs or journal file operation failed (before any state changed,
    /// or while healing).
    #[error("failed to {op} {path}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `vendor`/`device` did not hold a hex id.
    #[error("PCI device {pci}: {attr} is {content:?}, not a 0x-prefixed hex id")]
    BadId {
        /// The device.
        pci: PciAddr,
        /// `vendor` or `device`.
        attr: &'static str,
        /// What the file held.
        content: String,
    },
    /// The (vendor, device) pair is neither in [`VF_DRIVERS`] nor overridden.
    #[error(
        "PCI device {pci} has vendor 0x{vendor:04x} device 0x{device:04x}, which no known VF kernel driver claims (known: Mellanox/NVIDIA mlx5_core/mlx4_core, Intel iavf/ixgbevf/igbvf, Broadcom bnxt_en; name its driver with --vf-driver {vendor:04x}:{device:04x}=DRIVER)"
    )]
    UnknownDevice {
        /// The device.
        pci: PciAddr,
        /// PCI vendor id.
        vendor: u16,
        /// PCI device id.
        device: u16,
    },
    /// The driver for the device is not loaded (no `drivers/<name>` dir).
    #[error("PCI device {pci} needs kernel driver {wanted}, which is not loaded (no {path})")]
    DriverNotLoaded {
        /// The device.
        pci: PciAddr,
        /// Names tried.
        wanted: String,
        /// The first directory looked for.
        path: PathBuf,
    },
    /// The device is not on `vfio-pci`, so there is nothing to hand off.
    #[error("PCI device {pci} is bound to {}, not vfio-pci", driver.as_deref().unwrap_or("no driver"))]
    NotBoundToVfio {
        /// The device.
        pci: PciAddr,
        /// Its driver.
        driver: Option<String>,
    },
    /// A journal entry for the device exists: a handoff is running or was
    /// interrupted and not healed.
    #[error(
        "a VFIO handoff of {pci} is already journaled at {journal} (in progress, or interrupted and not healed)"
    )]
    HandoffInProgress {
        /// The device.
        pci: PciAddr,
        /// The journal file.
        journal: PathBuf,
    },
    /// A handoff step failed; `vfio-pci` was bound again.
    #[error("VFIO handoff of {pci} to {driver}: {step} failed (vfio-pci restored)")]
    Step {
        /// The device.
        pci: PciAddr,
        /// The kernel driver.
        driver: String,
        /// The step.
        step: Step,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The netdev did not appear in time; `vfio-pci` was bound again.
    #[error(
        "VFIO handoff of {pci} to {driver}: no netdev under {path} after {timeout:?} (vfio-pci restored)"
    )]
    NetdevTimeout {
        /// The device.
        pci: PciAddr,
        /// The kernel driver.
        driver: String,
        /// The `net/` directory polled.
        path: PathBuf,
        /// The timeout.
        timeout: Duration,
    },
    /// Restoring `vfio-pci` failed (the journal is kept for [`heal`]).
    #[error("{source}{}", after.as_ref().map(|a| format!(" (after: {a})")).unwrap_or_default())]
    RestoreFailed {
        /// The restore failure.
        #[source]
        source: RestoreError,
        /// The error that ended the handoff before restoring, if any.
        after: Option<Box<VfioError>>,
    },
}

/// Every sysfs access of the handoff. [`Sysfs`] is the real one.
pub trait SysfsOps: Send + Sync {
    /// `<device>` directory, for messages (default: under `/sys`).
    fn device_path(&self, pci: &PciAddr) -> PathBuf {
        Sysfs::default().device_dir(pci)
    }
    /// `drivers/<driver>` directory, for messages (default: under `/sys`).
    fn driver_path(&self, driver: &str) -> PathBuf {
        Sysfs::default().driver_dir(driver)
    }
    /// Whether `<device>` exists.
    fn device_exists(&self, pci: &PciAddr) -> bool;
    /// Read an attribute file of the device (`vendor`, `device`), trimmed.
    fn read_attr(&self, pci: &PciAddr, attr: &str) -> io::Result<String>;
    /// The bound driver's name (basename of the `driver` link), if any.
    fn current_driver(&self, pci: &PciAddr) -> io::Result<Option<String>>;
    /// Whether `drivers/<driver>` exists (the driver is loaded).
    fn driver_loaded(&self, driver: &str) -> bool;
    /// Write `<device>/driver_override`.
    fn write_driver_override(&self, pci: &PciAddr, driver: &str) -> io::Result<()>;
    /// Write the address to `drivers/<driver>/unbind`.
    fn unbind(&self, pci: &PciAddr, driver: &str) -> io::Result<()>;
    /// Write the address to `drivers/<driver>/bind`.
    fn bind(&self, pci: &PciAddr, driver: &str) -> io::Result<()>;
    /// Names under `<device>/net/` (empty when the directory is absent).
    fn netdevs(&self, pci: &PciAddr) -> io::Result<Vec<String>>;
    /// The operator's `--vf-driver` entries (none by default).
    fn vf_driver_overrides(&self) -> &[VfDriverOverride] {
        &[]
    }
}

/// The sysfs tree at `--sysfs-root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
    vf_drivers: Vec<VfDriverOverride>,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new(DEFAULT_SYSFS_ROOT)
    }
}

impl Sysfs {
    /// A sysfs tree rooted at `root` (`/sys` in production).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs {
            root: root.into(),
            vf_drivers: Vec::new(),
        }
    }

    /// The same tree, with the operator's `--vf-driver` entries consulted
    /// before [`VF_DRIVERS`].
    #[must_use]
    pub fn with_vf_drivers(mut self, overrides: &[VfDriverOverride]) -> Self {
        self.vf_drivers = overrides.to_vec();
        self
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/bus/pci/devices/<bdf>`.
    pub fn device_dir(&self, pci: &PciAddr) -> PathBuf {
        self.root.join("bus/pci/devices").join(pci.to_string())
    }

    /// `<root>/bus/pci/drivers/<driver>`.
    pub fn driver_dir(&self, driver: &str) -> PathBuf {
        self.root.join("bus/pci/drivers").join(driver)
    }
}

/// Write a sysfs attribute the way `echo value > file` does (no create).
fn write_attr(path: &Path, value: &str) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    f.write_all(value.as_bytes())
}

impl SysfsOps for Sysfs {
    fn device_path(&self, pci: &PciAddr) -> PathBuf {
        self.device_dir(pci)
    }

    fn driver_path(&self, driver: &str) -> PathBuf {
        self.driver_dir(driver)
    }

    fn device_exists(&self, pci: &PciAddr) -> bool {
        self.device_dir(pci).is_dir()
    }

    fn read_attr(&self, pci: &PciAddr, attr: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.device_dir(pci).join(attr))?
            .trim()
            .to_owned())
    }

    fn current_driver(&self, pci: &PciAddr) -> io::Result<Option<String>> {
        match std::fs::read_link(self.device_dir(pci).join("driver")) {
            Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn driver_loaded(&self, driver: &str) -> bool {
        self.driver_dir(driver).is_dir()
    }

    fn write_driver_override(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        write_attr(&self.device_dir(pci).join("driver_override"), driver)
    }

    fn unbind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        write_attr(&self.driver_dir(driver).join("unbind"), &pci.to_string())
    }

    fn bind(&self, pci: &PciAddr, driver: &str) -> io::Result<()> {
        write_attr(&self.driver_dir(driver).join("bind"), &pci.to_string())
    }

    fn netdevs(&self, pci: &PciAddr) -> io::Result<Vec<String>> {
        let dir = self.device_dir(pci).join("net");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    fn vf_driver_overrides(&self) -> &[VfDriverOverride] {
        &self.vf_drivers
    }
}

/// The on-disk record of a handoff in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The device.
    pub bdf: PciAddr,
    /// The driver to give it back to (always `vfio-pci`).
    pub original_driver: String,
    /// The kernel driver it is handed to.
    pub intended_driver: String,
    /// Unix seconds when the handoff started.
    pub started_at: u64,
}

/// Directory under the state dir that holds the handoff journal.
pub const JOURNAL_DIR_NAME: &str = "vfio-journal";

/// `<state_dir>/vfio-journal`: the `journal_dir` to pass to
/// [`with_kernel_driver`] and [`heal`].
pub fn journal_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(JOURNAL_DIR_NAME)
}

/// `<journal_dir>/<bdf>.json`.
pub fn journal_path(journal_dir: &Path, pci: &PciAddr) -> PathBuf {
    journal_dir.join(format!("{pci}.json"))
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> VfioError + use<> {
    let path = path.to_owned();
    move |source| VfioError::Io { op, path, source }
}

/// Create the journal entry atomically (fsync'd temporary, then a hard link
/// that fails if the entry exists) and fsync the directory.
fn journal_create(journal_dir: &Path, entry: &JournalEntry) -> Result<PathBuf, VfioError> {
    std::fs::create_dir_all(journal_dir).map_err(io_err("create journal dir", journal_dir))?;
    let path = journal_path(journal_dir, &entry.bdf);
    let tmp = journal_dir.join(format!(".{}.tmp.{}", entry.bdf, std::process::id()));
    let bytes = serde_json::to_vec(entry).expect("a journal entry always serializes");
    // A temporary left by a crash of this pid's predecessor.
    let _ = std::fs::remove_file(&tmp);
    let options = AtomicWrite {
        install: Install::Exclusive,
        ..AtomicWrite::durable(&tmp)
    };
    match crate::sys::fs::atomic_replace(&path, &bytes, &options) {
        Ok(()) => Ok(path),
        Err(e)
            if e.step == WriteStep::Install && e.source.kind() == io::ErrorKind::AlreadyExists =>
        {
            Err(VfioError::HandoffInProgress {
                pci: entry.bdf,
                journal: path,
            })
        }
        Err(e) => {
            let op = match e.step {
                WriteStep::Write | WriteStep::SyncFile => "write journal",
                WriteStep::Install => "create journal",
                WriteStep::SyncDir => "fsync journal dir",
            };
            Err(io_err(op, &e.path)(e.source))
        }
    }
}

fn read_id(
    ops: &(impl SysfsOps + ?Sized),
    sysfs_hint: &Path,
    pci: PciAddr,
    attr: &'static str,
) -> Result<u16, VfioError> {
    let content = ops
        .read_attr(&pci, attr)
        .map_err(io_err("read", &sysfs_hint.join(attr)))?;
    content
        .strip_prefix("0x")
        .filter(|h| !h.is_empty() && h.len() <= 4)
        .and_then(|h| u16::from_str_radix(h, 16).ok())
        .ok_or(VfioError::BadId { pci, attr, content })
}

/// Give the device back to `vfio-pci`: up to [`RESTORE_ROUNDS`] rounds of
/// unbind (whatever is bound) → `driver_override=vfio-pci` → bind `vfio-pci`
/// → verify; on success the journal (if any) is removed.
/// Returns the driver that was bound before (None if none / already vfio-pci).
fn restore(
    ops: &(impl SysfsOps + ?Sized),
    pci: PciAddr,
    journal: Option<&Path>,
) -> Result<Option<String>, RestoreError> {
    let pci = &pci;
    let mut failures = Vec::new();
    let mut was = None;
    let mut driver_now = None;
    let mut first = true;
    for _ in 0..RESTORE_ROUNDS {
        failures.clear();
        let fail = |failures: &mut Vec<StepFailure>, step, driver: &str, error| {
            failures.push(StepFailure {
                step,
                driver: driver.to_owned(),
                error,
            });
        };
        let current = match ops.current_driver(pci) {
            Ok(c) => c,
            Err(e) => {
                fail(&mut failures, Step::ReadDriver, "?", e);
                continue;
            }
        };
        if first {
            was = current.clone().filter(|d| d != VFIO_PCI);
            first = false;
        }
        if let Some(d) = current.as_deref().filter(|d| *d != VFIO_PCI)
            && let Err(e) = ops.unbind(pci, d)
        {
            fail(&mut failures, Step::Unbind, d, e);
        }
        if let Err(e) = ops.write_driver_override(pci, VFIO_PCI) {
            fail(&mut failures, Step::DriverOverride, VFIO_PCI, e);
        }
        if current.as_deref() != Some(VFIO_PCI)
            && let Err(e) = ops.bind(pci, VFIO_PCI)
        {
            fail(&mut failures, Step::Bind, VFIO_PCI, e);
        }
        match ops.current_driver(pci) {
            Ok(now) => {
                if now.as_deref() != Some(VFIO_PCI) {
                    fail(
                        &mut failures,
                        Step::Verify,
                        VFIO_PCI,
                        io::Error::other(format!(
                            "bound to {}",
                            now.as_deref().unwrap_or("no driver")
                        )),
                    );
                }
                driver_now = now;
            }
            Err(e) => fail(&mut failures, Step::Verify, VFIO_PCI, e),
        }
        if failures.is_empty() {
            if let Some(journal) = journal {
                match std::fs::remove_file(journal) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        fail(&mut failures, Step::RemoveJournal, VFIO_PCI, e);
                        continue;
                    }
                }
            }
            return Ok(was);
        }
        tracing::warn!(%pci, failures = failures.len(), "restoring vfio-pci: round failed, retrying");
    }
    Err(RestoreError {
        pci: *pci,
        rounds: RESTORE_ROUNDS,
        driver_now,
        failures,
    })
}

/// Restores `vfio-pci` when dropped while armed (cancellation, panic).
struct RestoreGuard<'a, O: SysfsOps + ?Sized> {
    ops: &'a O,
    pci: PciAddr,
    journal: PathBuf,
    armed: bool,
}

impl<O: SysfsOps + ?Sized> RestoreGuard<'_, O> {
    fn finish(mut self) -> Result<(), RestoreError> {
        self.armed = false;
        blocking(|| restore(self.ops, self.pci, Some(&self.journal))).map(|_| ())
    }
}

/// Run sysfs writes that may block for a while (a NIC driver's probe or
/// teardown takes up to seconds): on a multi-threaded tokio runtime the
/// worker hands its other tasks off first (`block_in_place`); elsewhere
/// (current-thread runtime, no runtime, `Drop`) the call runs inline.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl<O: SysfsOps + ?Sized> Drop for RestoreGuard<'_, O> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match restore(self.ops, self.pci, Some(&self.journal)) {
            Ok(_) => tracing::warn!(pci = %self.pci, "VFIO handoff interrupted; vfio-pci restored"),
            Err(e) => tracing::error!(
                pci = %self.pci, error = %e, journal = %self.journal.display(),
                "VFIO handoff interrupted and vfio-pci could not be restored; the journal is kept for heal at next start"
            ),
        }
    }
}

async fn wait_netdev(
    ops: &(impl SysfsOps + ?Sized),
    pci: &PciAddr,
    driver: &str,
    net_dir: PathBuf,
    timeout: Duration,
) -> Result<String, VfioError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let names = ops.netdevs(pci).map_err(io_err("list", &net_dir))?;
        if let Some(name) = names.into_iter().next() {
            return Ok(name);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(VfioError::NetdevTimeout {
                pci: *pci,
                driver: driver.to_owned(),
                path: net_dir,
                timeout,
            });
        }
        tokio::time::sleep(NETDEV_POLL.min(deadline - now)).await;
    }
}

/// Hand the VF at `pci` to its kernel driver, run `f` with the netdev name,
/// and give it back to `vfio-pci` on every path (see the module docs).
pub async fn with_kernel_driver<T, Fut: Future<Output = T>>(
    sysfs: &Sysfs,
    journal_dir: &Path,
    pci: &PciAddr,
    netdev_timeout: Duration,
    f: impl FnOnce(String) -> Fut,
) -> Result<T, VfioError> {
    with_kernel_driver_ops(sysfs, journal_dir, pci, netdev_timeout, f).await
}

/// [`with_kernel_driver`] over any [`SysfsOps`] (tests use a fake kernel).
pub async fn with_kernel_driver_ops<O, T, Fut>(
    ops: &O,
    journal_dir: &Path,
    pci: &PciAddr,
    netdev_timeout: Duration,
    f: impl FnOnce(String) -> Fut,
) -> Result<T, VfioError>
where
    O: SysfsOps + ?Sized,
    Fut: Future<Output = T>,
{
    let dev_dir = ops.device_path(pci);
    if !ops.device_exists(pci) {
        return Err(VfioError::DeviceNotFound {
            pci: *pci,
            path: dev_dir,
        });
    }
    let vendor = read_id(ops, &dev_dir, *pci, "vendor")?;
    let device = read_id(ops, &dev_dir, *pci, "device")?;
    let drivers = vf_drivers_for(ops.vf_driver_overrides(), vendor, device).ok_or(
        VfioError::UnknownDevice {
            pci: *pci,
            vendor,
            device,
        },
    )?;
    let driver = drivers
        .iter()
        .copied()
        .find(|d| ops.driver_loaded(d))
        .ok_or_else(|| VfioError::DriverNotLoaded {
            pci: *pci,
            wanted: drivers.join(" or "),
            path: ops.driver_path(drivers[0]),
        })?;
    match ops.current_driver(pci) {
        Ok(Some(d)) if d == VFIO_PCI => {}
        Ok(other) => {
            return Err(VfioError::NotBoundToVfio {
                pci: *pci,
                driver: other,
            });
        }
        Err(e) => return Err(io_err("read", &dev_dir.join("driver"))(e)),
    }

    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let journal = journal_create(
        journal_dir,
        &JournalEntry {
            bdf: *pci,
            original_driver: VFIO_PCI.to_owned(),
            intended_driver: driver.to_owned(),
            started_at,
        },
    )?;
    let guard = RestoreGuard {
        ops,
        pci: *pci,
        journal,
        armed: true,
    };
    tracing::info!(%pci, driver, vendor = format!("0x{vendor:04x}"), device = format!("0x{device:04x}"), "VFIO handoff: binding kernel driver");

    let step = |step: Step, drv: &str| {
        let drv = drv.to_owned();
        move |source| VfioError::Step {
            pci: *pci,
            driver: drv,
            step,
            source,
        }
    };
    let handed = async {
        blocking(|| ops.write_driver_override(pci, driver))
            .map_err(step(Step::DriverOverride, driver))?;
        blocking(|| ops.unbind(pci, VFIO_PCI)).map_err(step(Step::Unbind, VFIO_PCI))?;
        blocking(|| ops.bind(pci, driver)).map_err(step(Step::Bind, driver))?;
        wait_netdev(ops, pci, driver, dev_dir.join("net"), netdev_timeout).await
    }
    .await;

    match handed {
        Ok(netdev) => {
            tracing::debug!(%pci, netdev, "VFIO handoff: netdev ready");
            let out = f(netdev).await;
            guard.finish().map_err(|source| VfioError::RestoreFailed {
                source,
                after: None,
            })?;
            tracing::info!(%pci, "VFIO handoff done; vfio-pci restored");
            Ok(out)
        }
        Err(e) => match guard.finish() {
            Ok(()) => Err(e),
            Err(source) => Err(VfioError::RestoreFailed {
                source,
                after: Some(Box::new(e)),
            }),
        },
    }
}

/// The driver the device is bound to (`None`: unbound). Lets the caller
/// decide between the VFIO handoff (bound to [`VFIO_PCI`]) and the
/// netdev-in-the-pod path.
pub fn bound_driver(sysfs: &Sysfs, pci: &PciAddr) -> Result<Option<String>, VfioError> {
    if !sysfs.device_exists(pci) {
        return Err(VfioError::DeviceNotFound {
            pci: *pci,
            path: sysfs.device_dir(pci),
        });
    }
    sysfs
        .current_driver(pci)
        .map_err(io_err("read", &sysfs.device_dir(pci).join("driver")))
}

/// Where a VM's one-shot DORA runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmDevice {
    /// A VF bound to `vfio-pci`: hand it off with [`with_kernel_driver`] and
    /// run the DORA on the temporary host netdev.
    Vfio(PciAddr),
    /// No PCI device, or one with a kernel driver (its netdev is in the pod
    /// netns): run the DORA on the pod interface.
    PodNetdev,
}

/// Decide the VM path from the CNI config's `deviceID` (a PCI address
/// injected by Multus for SR-IOV resources). A `deviceID` that is not a PCI
/// address, or names no device, is an error.
pub fn vm_device(sysfs: &Sysfs, device_id: Option<&str>) -> Result<VmDevice, VfioError> {
    let Some(id) = device_id.map(str::trim).filter(|d| !d.is_empty()) else {
        return Ok(VmDevice::PodNetdev);
    };
    let pci: PciAddr = id.parse()?;
    Ok(match bound_driver(sysfs, &pci)?.as_deref() {
        Some(VFIO_PCI) => VmDevice::Vfio(pci),
        _ => VmDevice::PodNetdev,
    })
}

/// What [`heal`] did for one journal entry.
#[derive(Debug)]
pub enum HealOutcome {
    /// The device was on another driver and is on `vfio-pci` again.
    Restored {
        /// The driver it was taken from.
        from: String,
    },
    /// It was already on `vfio-pci`; the override was re-pinned.
    AlreadyBound,
    /// The device no longer exists (VF removed); the journal was dropped.
    DeviceGone,
    /// Restoring failed; the journal is kept.
    Failed(RestoreError),
    /// The journal file is not a valid entry and its name is not an address;
    /// it is kept for an operator.
    Unreadable(String),
}

/// One journal entry handled by [`heal`].
#[derive(Debug)]
pub struct HealReport {
    /// The journal file.
    pub journal: PathBuf,
    /// The device, if known.
    pub pci: Option<PciAddr>,
    /// The driver the interrupted handoff was binding, if recorded.
    pub intended_driver: Option<String>,
    /// What happened.
    pub outcome: HealOutcome,
}

impl HealReport {
    /// Whether the device is (again) on `vfio-pci` or gone.
    pub fn is_healed(&self) -> bool {
        matches!(
            self.outcome,
            HealOutcome::Restored { .. } | HealOutcome::AlreadyBound | HealOutcome::DeviceGone
        )
    }
}

/// At agent start: restore `vfio-pci` for every journaled handoff.
pub fn heal(sysfs: &Sysfs, journal_dir: &Path) -> Result<Vec<HealReport>, VfioError> {
    heal_ops(sysfs, journal_dir)
}

/// [`heal`] over any [`SysfsOps`].
pub fn heal_ops<O: SysfsOps + ?Sized>(
    ops: &O,
    journal_dir: &Path,
) -> Result<Vec<HealReport>, VfioError> {
    let entries = match std::fs::read_dir(journal_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("read journal dir", journal_dir)(e)),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(io_err("read journal dir", journal_dir))?
            .path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with('.') && name.contains(".tmp.") {
            // A temporary from a write that never completed: no handoff started.
            let _ = std::fs::remove_file(&path);
        } else if path.extension().is_some_and(|e| e == "json") {
            paths.push(path);
        }
    }
    paths.sort();
    let mut reports = Vec::new();
    for journal in paths {
        let parsed: Result<JournalEntry, String> = std::fs::read(&journal)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        let (pci, intended_driver) = match &parsed {
            Ok(e) => (Some(e.bdf), Some(e.intended_driver.clone())),
            Err(_) => (
                journal
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.parse().ok()),
                None,
            ),
        };
        let Some(pci) = pci else {
            let why = parsed.err().unwrap_or_default();
            tracing::error!(journal = %journal.display(), error = why, "unreadable VFIO journal entry kept");
            reports.push(HealReport {
                journal,
                pci: None,
                intended_driver,
                outcome: HealOutcome::Unreadable(why),
            });
            continue;
        };
        let outcome = if ops.device_exists(&pci) {
            match restore(ops, pci, Some(&journal)) {
                Ok(Some(from)) => HealOutcome::Restored { from },
                Ok(None) => HealOutcome::AlreadyBound,
                Err(e) => HealOutcome::Failed(e),
            }
        } else {
            match std::fs::remove_file(&journal) {
                Ok(()) => HealOutcome::DeviceGone,
                Err(e) => HealOutcome::Failed(RestoreError {
                    pci,
                    rounds: 0,
                    driver_now: None,
                    failures: vec![StepFailure {
                        step: Step::RemoveJournal,
                        driver: VFIO_PCI.to_owned(),
                        error: e,
                    }],
                }),
            }
        };
        match &outcome {
            HealOutcome::Failed(e) => {
                tracing::error!(%pci, error = %e, "heal: vfio-pci not restored");
            }
            other => {
                tracing::info!(%pci, outcome = ?other, "heal: interrupted VFIO handoff resolved");
            }
        }
        reports.push(HealReport {
            journal,
            pci: Some(pci),
            intended_driver,
            outcome,
        });
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_parse_and_format() {
        let a: PciAddr = "0000:3b:02.7".parse().unwrap();
        assert_eq!(
            a,
            PciAddr {
                domain: 0,
                bus: 0x3b,
                device: 2,
                function: 7
            }
        );
        assert_eq!(a.to_string(), "0000:3b:02.7");
        assert_eq!(
            "ABCD:EF:1F.0".parse::<PciAddr>().unwrap().to_string(),
            "abcd:ef:1f.0"
        );
        for bad in [
            "",
            "3b:02.7",
            "0000:3b:02",
            "0000:3b:20.0",
            "0000:3b:02.8",
            "000:3b:02.7",
            "0000:3b:2.7",
            "0000:3b:02.7 ",
            "0000:3g:02.7",
            "0000:3b:02.77",
            "+000:3b:02.7",
            "0000:3b:02.7/../..",
        ] {
            let err = bad.parse::<PciAddr>().unwrap_err();
            assert!(matches!(err, VfioError::InvalidPciAddress { .. }), "{bad}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, "\"0000:3b:02.7\"");
        assert_eq!(serde_json::from_str::<PciAddr>(&json).unwrap(), a);
    }

    #[test]
    fn driver_table_covers_the_required_vendors() {
        let drv = |v, d| vf_driver_for(v, d).map(|r| r.drivers[0]);
        for d in [0x1016, 0x1018, 0x101a, 0x101c, 0x101e] {
            assert_eq!(drv(0x15b3, d), Some("mlx5_core"));
        }
        assert_eq!(drv(0x15b3, 0x1004), Some("mlx4_core"));
        for d in [0x154c, 0x1889, 0x37cd] {
            assert_eq!(drv(0x8086, d), Some("iavf"));
        }
        assert_eq!(
            vf_driver_for(0x8086, 0x154c).unwrap().drivers,
            ["iavf", "i40evf"]
        );
        for d in [0x10ed, 0x1515, 0x1565] {
            assert_eq!(drv(0x8086, d), Some("ixgbevf"));
        }
        for d in [0x16c1, 0x16d3, 0x16dc, 0x1606, 0x1807] {
            assert_eq!(drv(0x14e4, d), Some("bnxt_en"));
        }
        // PFs are not VFs.
        assert_eq!(drv(0x15b3, 0x1017), None);
        assert_eq!(drv(0x8086, 0x1592), None);
        assert_eq!(drv(0x1af4, 0x1041), None);
        // No device id appears twice.
        let mut all: Vec<(u16, u16)> = VF_DRIVERS
            .iter()
            .flat_map(|r| r.devices.iter().map(move |d| (r.vendor, *d)))
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    fn vf_driver_overrides_parse_and_win_over_the_table() {
        let o: VfDriverOverride = "8086:10d3=e1000e".parse().unwrap();
        assert_eq!(
            o,
            VfDriverOverride {
                vendor: 0x8086,
                device: 0x10d3,
                driver: "e1000e".into()
            }
        );
        assert_eq!(o.to_string(), "8086:10d3=e1000e");
        let o: VfDriverOverride = "0x15B3:0x101e=mlx5_core".parse().unwrap();
        assert_eq!((o.vendor, o.device), (0x15b3, 0x101e));
        assert_eq!(
            "1af4:41=virtio-pci"
                .parse::<VfDriverOverride>()
                .unwrap()
                .device,
            0x41
        );
        for bad in [
            "",
            "8086:10d3",
            "8086=e1000e",
            "8086:10d3=",
            ":10d3=e1000e",
            "8086:=e1000e",
            "18086:10d3=e1000e",
            "8086:10g3=e1000e",
            "0x:10d3=e1000e",
            "8086:10d3=../vfio-pci",
            "8086:10d3=..",
            "8086:10d3=e1000e x",
        ] {
            let err = bad.parse::<VfDriverOverride>().unwrap_err();
            assert!(matches!(err, VfioError::InvalidVfDriver { .. }), "{bad}");
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }

        let ops: Vec<VfDriverOverride> =
            ["8086:10d3=e1000e", "15b3:101e=mlx5_vendor", "8086:10d3=igb"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
        // Unknown to the table: only the operator knows it; the last entry wins.
        assert_eq!(vf_drivers_for(&[], 0x8086, 0x10d3), None);
        assert_eq!(vf_drivers_for(&ops, 0x8086, 0x10d3), Some(vec!["igb"]));
        // Known to the table: the operator's entry replaces the row.
        assert_eq!(
            vf_drivers_for(&ops, 0x15b3, 0x101e),
            Some(vec!["mlx5_vendor"])
        );
        assert_eq!(
            vf_drivers_for(&ops, 0x8086, 0x154c),
            Some(vec!["iavf", "i40evf"])
        );
        let sysfs = Sysfs::new("/sys").with_vf_drivers(&ops);
        assert_eq!(sysfs.vf_driver_overrides(), ops.as_slice());
        assert!(Sysfs::default().vf_driver_overrides().is_empty());
    }

    #[test]
    fn bound_driver_reads_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let pci: PciAddr = "0000:3b:02.2".parse().unwrap();
        let sysfs = Sysfs::new(dir.path());
        assert!(matches!(
            bound_driver(&sysfs, &pci),
            Err(VfioError::DeviceNotFound { .. })
        ));
        let dev = sysfs.device_dir(&pci);
        std::fs::create_dir_all(&dev).unwrap();
        assert_eq!(bound_driver(&sysfs, &pci).unwrap(), None);
        std::os::unix::fs::symlink("../../../bus/pci/drivers/vfio-pci", dev.join("driver"))
            .unwrap();
        assert_eq!(
            bound_driver(&sysfs, &pci).unwrap().as_deref(),
            Some(VFIO_PCI)
        );
        assert_eq!(
            vm_device(&sysfs, Some("0000:3b:02.2")).unwrap(),
            VmDevice::Vfio(pci)
        );
        assert_eq!(vm_device(&sysfs, None).unwrap(), VmDevice::PodNetdev);
        assert_eq!(vm_device(&sysfs, Some("")).unwrap(), VmDevice::PodNetdev);
        assert!(matches!(
            vm_device(&sysfs, Some("0000:3b:02.3")),
            Err(VfioError::DeviceNotFound { .. })
        ));
        assert!(matches!(
            vm_device(&sysfs, Some("eth0")),
            Err(VfioError::InvalidPciAddress { .. })
        ));
        std::fs::remove_file(dev.join("driver")).unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/mlx5_core", dev.join("driver"))
            .unwrap();
        assert_eq!(
            vm_device(&sysfs, Some("0000:3b:02.2")).unwrap(),
            VmDevice::PodNetdev
        );
        assert_eq!(
            journal_dir(Path::new("/var/lib/xdhcp")),
            Path::new("/var/lib/xdhcp/vfio-journal")
        );
    }

    #[test]
    fn unknown_device_error_names_the_ids() {
        let err = VfioError::UnknownDevice {
            pci: "0000:01:00.1".parse().unwrap(),
            vendor: 0x1af4,
            device: 0x1041,
        };
        let s = err.to_string();
        assert!(
            s.contains("0x1af4") && s.contains("0x1041") && s.contains("0000:01:00.1"),
            "{s}"
        );
        assert!(s.contains("--vf-driver 1af4:1041=DRIVER"), "{s}");
    }
}

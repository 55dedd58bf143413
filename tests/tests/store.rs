//! Lease store crash safety.
//!
//! - Process death: a writer process is killed (`SIGKILL`) at random moments
//!   while it rewrites records; every record found afterwards must be whole
//!   (old or new, never torn) and nothing may be quarantined.
//! - Power loss: the store lives on an ext4 filesystem on a loop device, and
//!   the device's backing file is copied right after a save or delete
//!   returns. The copy holds exactly what the filesystem had sent to its
//!   disk, so mounting it (the journal is replayed) is what a host would find
//!   after losing power at that instant. Needs root, `losetup` and
//!   `mkfs.ext4`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use xdhcp::model::{PodRef, WorkloadKind};
use xdhcp::store::{LeaseKey, LeaseRecord, LeaseStore, RECORD_VERSION};

const WRITER_ENV: &str = "XDHCP_STORE_TEST_WRITER_DIR";
const KEYS: usize = 8;

fn record(i: usize, generation: u32) -> LeaseRecord {
    LeaseRecord {
        version: RECORD_VERSION,
        container_id: format!("container{i}"),
        ifname: "eth0".to_owned(),
        netns: Some(PathBuf::from(format!("/var/run/netns/pod{i}"))),
        network: (&xdhcp::cni::config::parse(
            br#"{"cniVersion":"1.0.0","name":"localnet","ipam":{"type":"xdhcp"}}"#,
        )
        .expect("valid config"))
            .into(),
        // Large-ish arguments so a write spans several pages.
        args: [
            ("generation".to_owned(), generation.to_string()),
            ("pad".to_owned(), "x".repeat(16 * 1024)),
        ]
        .into(),
        pod: Some(PodRef {
            namespace: "default".to_owned(),
            name: format!("pod-{i}"),
            uid: Some(format!("uid-{i}")),
        }),
        workload: WorkloadKind::Pod,
        mac: [2, 0, 0, 0, 0, i as u8],
        annotation_key: Some("default/localnet".to_owned()),
        lease: Some(xdhcp_engine::Lease {
            address: Ipv4Addr::new(192, 0, 2, 10 + i as u8),
            prefix_len: 24,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: Some([2, 0, 0, 0, 0, 0xff]),
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes: Vec::new(),
            dns_servers: Vec::new(),
            domain_name: None,
            search: Vec::new(),
            mtu: None,
            lease_time: Duration::from_mins(2),
            t1: Duration::from_mins(1),
            t2: Duration::from_secs(105),
            acquired_unix_ms: u64::from(generation),
            rejected_routes: Vec::new(),
        }),
        updated_unix_ms: 0,
        uplink: None,
        requested: None,
        requested_from: None,
        planned_xids: None,
        lease6: None,
        router6: None,
        lease_family: None,
    }
}

/// The generation a test record was written with.
fn generation_of(r: &LeaseRecord) -> u64 {
    r.args["generation"].parse().expect("a generation")
}

/// The writer half: runs in a child process (this test binary re-executed).
fn writer(dir: &Path) -> ! {
    let store = LeaseStore::open(dir).expect("open store in writer");
    let mut generation = 0u32;
    loop {
        generation += 1;
        for i in 0..KEYS {
            store.save(&record(i, generation)).expect("save in writer");
        }
    }
}

#[test]
fn sigkill_during_writes_never_leaves_a_torn_record() {
    if let Ok(dir) = std::env::var(WRITER_ENV) {
        writer(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for round in 0..10u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "sigkill_during_writes_never_leaves_a_torn_record",
                "--nocapture",
            ])
            .env(WRITER_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(150 + round * 37));
        child.kill().unwrap();
        child.wait().unwrap();

        let store = LeaseStore::open(dir.path()).unwrap();
        let report = store.load_all().unwrap();
        assert!(
            report.quarantined.is_empty(),
            "round {round}: torn record(s): {:?}",
            report.quarantined
        );
        assert!(
            !report.records.is_empty(),
            "round {round}: the writer wrote nothing"
        );
        for rec in &report.records {
            let i: usize = rec.container_id["container".len()..].parse().unwrap();
            let generation = generation_of(rec);
            assert_eq!(
                *rec,
                record(i, generation as u32).with_updated(rec.updated_unix_ms)
            );
        }
        // Leftover temporary files are cleaned by the open() above; the only
        // dot-files left are the fresh pool of spares it created.
        let stray: Vec<_> = std::fs::read_dir(store.leases_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert_eq!(
            stray.len(),
            store.spares(),
            "temporary files left besides the spares: {stray:?}"
        );
    }
}

trait WithUpdated {
    fn with_updated(self, ms: u64) -> Self;
}

impl WithUpdated for LeaseRecord {
    fn with_updated(mut self, ms: u64) -> Self {
        self.updated_unix_ms = ms;
        self
    }
}

/// An ext4 filesystem on a loop device, mounted with a 600 s journal commit
/// interval so nothing reaches the disk unless someone asks for it (`fsync`).
/// Unmounted and detached on drop, also when the test fails.
struct LoopDisk {
    dir: tempfile::TempDir,
    device: String,
    mounted: bool,
}

impl LoopDisk {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                image.to_str().unwrap(),
            ],
        );
        let device = run("losetup", &["--find", "--show", image.to_str().unwrap()]);
        let mut disk = LoopDisk {
            dir,
            device,
            mounted: false,
        };
        std::fs::create_dir(disk.mnt()).unwrap();
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "commit=600",
                &disk.device,
                disk.mnt().to_str().unwrap(),
            ],
        );
        disk.mounted = true;
        disk
    }

    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// What a host would find after losing power now: a copy of the disk,
    /// mounted (journal replayed) in a fresh directory; `read` looks at it.
    fn after_power_loss<T>(&self, read: impl FnOnce(&Path) -> T) -> T {
        let snap = tempfile::tempdir().unwrap();
        let image = snap.path().join("crashed.img");
        std::fs::copy(self.dir.path().join("disk.img"), &image).unwrap();
        let mnt = snap.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "loop",
                image.to_str().unwrap(),
                mnt.to_str().unwrap(),
            ],
        );
        let unmount = Unmount(mnt.clone());
        let out = read(&mnt);
        drop(unmount);
        out
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new(xdhcp_tests::program("umount"))
                .arg(self.mnt())
                .status();
        }
        let _ = Command::new(xdhcp_tests::program("losetup"))
            .args(["-d", &self.device])
            .status();
    }
}

/// Unmounts (and so frees the loop device `mount -o loop` took) on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new(xdhcp_tests::program("umount"))
            .arg(&self.0)
            .status();
    }
}

/// Runs a set-up command; its trimmed stdout, or a panic naming it.
/// Runs the table program `cmd` ([`xdhcp_tests::program`]).
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(xdhcp_tests::program(cmd))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn saved_and_deleted_records_survive_a_power_loss() {
    let disk = LoopDisk::new();
    let state = disk.mnt().join("state");
    let store = LeaseStore::open(&state).unwrap();
    let kept = record(1, 1);
    store.save(&kept).unwrap();
    store.save(&record(2, 1)).unwrap();
    store.save(&record(2, 2)).unwrap();
    // The control: a file written the ordinary way after the saves. Were the
    // copy not a faithful power loss, it would be there too.
    std::fs::write(disk.mnt().join("control"), b"never fsynced").unwrap();

    disk.after_power_loss(|root| {
        assert!(
            !root.join("control").exists(),
            "the copy holds writes nobody made durable: it does not model a power loss"
        );
        let report = LeaseStore::open(&root.join("state"))
            .unwrap()
            .load_all()
            .unwrap();
        assert!(report.quarantined.is_empty(), "{:?}", report.quarantined);
        let generations: Vec<(String, u64)> = report
            .records
            .iter()
            .map(|r| (r.container_id.clone(), generation_of(r)))
            .collect();
        assert_eq!(
            generations,
            [("container1".to_owned(), 1), ("container2".to_owned(), 2)],
            "every save that returned is on the disk, the newest version of each"
        );
    });

    assert!(
        store
            .delete(&LeaseKey::new("container2", "eth0").unwrap())
            .unwrap()
    );
    disk.after_power_loss(|root| {
        let report = LeaseStore::open(&root.join("state"))
            .unwrap()
            .load_all()
            .unwrap();
        let keys: Vec<&str> = report
            .records
            .iter()
            .map(|r| r.container_id.as_str())
            .collect();
        assert_eq!(
            keys,
            ["container1"],
            "a delete that returned is on the disk"
        );
        assert_eq!(
            report.records[0],
            kept.clone().with_updated(report.records[0].updated_unix_ms)
        );
    });
}

//! Lease store crash safety: a writer process is killed (`SIGKILL`) at random moments
//! while it rewrites records; every record found afterwards must be whole
//! (old or new, never torn) and nothing may be quarantined.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use xdhcp::store::{Attachment, AttachmentMode, LeaseKey, LeaseRecord, LeaseStore};

const WRITER_ENV: &str = "XDHCP_STORE_TEST_WRITER_DIR";
const KEYS: usize = 8;

fn record(i: usize, generation: u32) -> LeaseRecord {
    LeaseRecord::new(
        LeaseKey::new(&format!("container{i}"), "eth0").unwrap(),
        Attachment {
            netns: PathBuf::from(format!("/var/run/netns/pod{i}")),
            mac: [2, 0, 0, 0, 0, i as u8],
            pod_namespace: Some("default".to_owned()),
            pod_name: Some(format!("pod-{i}")),
            pod_uid: Some(format!("uid-{i}")),
            network_key: Some("default/localnet".to_owned()),
            mode: AttachmentMode::Pod,
            apply: false,
            // A large-ish config so a write spans several pages.
            cni_config: serde_json::json!({ "generation": generation, "pad": "x".repeat(16 * 1024) }),
        },
        xdhcp_engine::Lease {
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
        },
    )
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
            let i: usize = rec.key.container_id()["container".len()..].parse().unwrap();
            let generation = rec.attachment.cni_config["generation"].as_u64().unwrap();
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

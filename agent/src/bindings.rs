//! The binding table: which MAC holds which IPv4 address behind which
//! workload port, until when, and how the agent knows — it leased the
//! address itself, or it learned it by watching the guest's own DHCP on a
//! VM's port.
//!
//! [`Learner`] turns observed DHCP messages into binding changes (sans-IO);
//! [`LearnedStore`] keeps the learned bindings in one file, replaced
//! durably on every change (temporary file, `fsync`, rename, directory
//! `fsync`), so they survive agent restarts; a file that does not parse is
//! set aside, never trusted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xdhcp_engine::DropReason;
use xdhcp_engine::validate::{self, MessageType};

use crate::sys::fs::{AtomicWrite, Temp, WriteStep};

/// `GET` path of the binding table on the agent socket.
pub const PATH_BINDINGS: &str = "/v1/bindings";

/// How the agent knows a binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BindingSource {
    /// xdhcp leased the address itself (a pod's lease, a VM's one-shot).
    Leased,
    /// Learned from the guest's own DHCP exchange on a VM's port.
    Learned,
}

impl BindingSource {
    /// Stable label (metrics, table).
    pub const fn label(self) -> &'static str {
        match self {
            Self::Leased => "leased",
            Self::Learned => "learned",
        }
    }
}

/// One row of `xdhcp bindings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    pub ip: Ipv4Addr,
    /// Host end of the workload port, when the guard knows it.
    pub port: Option<String>,
    /// `<namespace>/<name>` of the pod, when known.
    pub pod: Option<String>,
    /// Expiry, wall clock, milliseconds since the epoch (`None`: infinite).
    pub expires_unix_ms: Option<u64>,
    pub source: BindingSource,
    /// A learned binding whose ACK moved the `pod-networks` entry: the
    /// address the entry reported before, put back if the guest declines
    /// this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<Ipv4Addr>,
}

/// One row of `xdhcp bindings` as the agent serves it: the binding, and
/// where its port's identity came from (`ovs`: the Open vSwitch database,
/// `cni`: an ADD, `both`), when the guard is on the port. A client that
/// reads a [`Binding`] ignores the extra field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingRow {
    #[serde(flatten)]
    pub binding: Binding,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
}

/// What one observed message means for the port's binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    /// The server acknowledged `ip` for the port's MAC.
    Bound {
        ip: Ipv4Addr,
        prefix_len: Option<u8>,
        router: Option<Ipv4Addr>,
        /// Lease time in seconds (`None`: infinite).
        lease_secs: Option<u32>,
    },
    /// The guest gave `ip` back (RELEASE).
    Released { ip: Ipv4Addr },
    /// The guest refused `ip` after the server acknowledged it (DECLINE:
    /// its probe found the address in use): it never held it.
    Declined { ip: Ipv4Addr },
}

/// Why an observed message taught nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LearnError {
    /// The engine's validator refused the message.
    #[error("not a valid DHCP message: {reason}")]
    Decode {
        #[source]
        reason: DropReason,
    },
    #[error("chaddr is not the port's MAC")]
    OtherClient,
    #[error("message type {0:?} changes no binding")]
    NoChange(Option<MessageType>),
}

/// Interprets one DHCP message seen on a learning port whose client has
/// `mac`. `to_workload`: the message went towards the workload (a server
/// reply), else it came from it (a client message). The message is decoded
/// by the engine's validator ([`validate::parse_observed`]), the one that
/// checks the replies to the agent's own leases.
pub fn learn(payload: &[u8], mac: [u8; 6], to_workload: bool) -> Result<Learned, LearnError> {
    let msg = validate::parse_observed(payload).map_err(|reason| LearnError::Decode { reason })?;
    if msg.chaddr != mac {
        return Err(LearnError::OtherClient);
    }
    let mt = msg.message_type;
    match (to_workload, mt) {
        // An ACK to an INFORM carries no address (yiaddr 0): nothing bound.
        (true, Some(MessageType::Ack)) if !msg.yiaddr.is_unspecified() => Ok(Learned::Bound {
            ip: msg.yiaddr,
            prefix_len: msg.prefix_len,
            router: msg.router,
            lease_secs: msg.lease_time.filter(|s| *s != u32::MAX),
        }),
        (false, Some(MessageType::Release)) if !msg.ciaddr.is_unspecified() => {
            Ok(Learned::Released { ip: msg.ciaddr })
        }
        (false, Some(MessageType::Decline)) => match msg.requested_ip {
            Some(ip) => Ok(Learned::Declined { ip }),
            None => Err(LearnError::NoChange(mt)),
        },
        _ => Err(LearnError::NoChange(mt)),
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Errors of the learned-binding store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The learned bindings, keyed by MAC, persisted in one file.
#[derive(Debug)]
pub struct LearnedStore {
    path: PathBuf,
    rows: BTreeMap<String, Binding>,
}

impl LearnedStore {
    /// File name in the state directory.
    pub const FILE: &'static str = "learned-bindings.json";

    /// Opens (or starts) the store in `state_dir`. An unreadable or
    /// unparsable file is renamed aside (`*.corrupt-<ms>`) and the store
    /// starts empty; the second value says so.
    pub fn open(state_dir: &Path) -> Result<(Self, Option<String>), StoreError> {
        let path = state_dir.join(Self::FILE);
        let mut quarantined = None;
        let rows = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Vec<Binding>>(&bytes) {
                Ok(v) => v.into_iter().map(|b| (b.mac.clone(), b)).collect(),
                Err(e) => {
                    let aside = path.with_extension(format!("corrupt-{}", now_ms()));
                    std::fs::rename(&path, &aside).map_err(|source| StoreError::Io {
                        op: "set aside",
                        path: path.clone(),
                        source,
                    })?;
                    quarantined = Some(format!("{}: {e}", aside.display()));
                    BTreeMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(StoreError::Io {
                    op: "read",
                    path,
                    source,
                });
            }
        };
        Ok((Self { path, rows }, quarantined))
    }

    /// Every learned binding not expired at `now_ms`.
    pub fn rows(&self, now_ms: u64) -> Vec<Binding> {
        self.rows
            .values()
            .filter(|b| b.expires_unix_ms.is_none_or(|e| e > now_ms))
            .cloned()
            .collect()
    }

    /// The learned binding of `mac`, if any (expired or not).
    pub fn get(&self, mac: &str) -> Option<&Binding> {
        self.rows.get(mac)
    }

    /// Records `b` (replacing the MAC's previous binding), durably.
    pub fn upsert(&mut self, b: Binding) -> Result<(), StoreError> {
        if self.rows.get(&b.mac) == Some(&b) {
            return Ok(());
        }
        self.rows.insert(b.mac.clone(), b);
        self.save()
    }

    /// Forgets `mac`'s binding when it is for `ip` (`None`: whatever it
    /// is), durably. Returns whether one was removed.
    pub fn remove(&mut self, mac: &str, ip: Option<Ipv4Addr>) -> Result<bool, StoreError> {
        Ok(self.take(mac, ip)?.is_some())
    }

    /// Like [`Self::remove`], returning the binding removed.
    pub fn take(&mut self, mac: &str, ip: Option<Ipv4Addr>) -> Result<Option<Binding>, StoreError> {
        match self.rows.get(mac) {
            Some(b) if ip.is_none_or(|ip| ip == b.ip) => {
                let gone = self.rows.remove(mac);
                self.save()?;
                Ok(gone)
            }
            _ => Ok(None),
        }
    }

    /// Drops the bindings expired at `now_ms`, durably; returns them.
    pub fn expire(&mut self, now_ms: u64) -> Result<Vec<Binding>, StoreError> {
        let gone: Vec<Binding> = self
            .rows
            .values()
            .filter(|b| b.expires_unix_ms.is_some_and(|e| e <= now_ms))
            .cloned()
            .collect();
        if !gone.is_empty() {
            for b in &gone {
                self.rows.remove(&b.mac);
            }
            self.save()?;
        }
        Ok(gone)
    }

    fn save(&self) -> Result<(), StoreError> {
        let io = |op, source| StoreError::Io {
            op,
            path: self.path.clone(),
            source,
        };
        let rows: Vec<&Binding> = self.rows.values().collect();
        let bytes = serde_json::to_vec_pretty(&rows).map_err(|e| io("encode", e.into()))?;
        let tmp = self.path.with_extension("tmp");
        let options = AtomicWrite {
            create: Temp::Reuse,
            ..AtomicWrite::durable(&tmp)
        };
        crate::sys::fs::atomic_replace(&self.path, &bytes, &options).map_err(|e| {
            let op = match e.step {
                WriteStep::Write => "write",
                WriteStep::SyncFile => "fsync",
                WriteStep::Install => "rename",
                WriteStep::SyncDir => "fsync the directory of",
            };
            io(op, e.source)
        })
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The table as `xdhcp bindings` prints it.
pub fn render(rows: &[BindingRow], now_ms: u64) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<17}  {:<15}  {:<15}  {:<8}  {:<30}  {:<10}  {:>10}\n",
        "MAC", "IP", "PORT", "IDENTITY", "POD", "SOURCE", "EXPIRES IN"
    );
    for row in rows {
        let b = &row.binding;
        let expires = b.expires_unix_ms.map_or_else(
            || "never".to_owned(),
            |e| format!("{}s", e.saturating_sub(now_ms) / 1000),
        );
        let _ = writeln!(
            s,
            "{:<17}  {:<15}  {:<15}  {:<8}  {:<30}  {:<10}  {:>10}",
            b.mac,
            b.ip,
            b.port.as_deref().unwrap_or("-"),
            row.identity.as_deref().unwrap_or("-"),
            b.pod.as_deref().unwrap_or("-"),
            b.source.label(),
            expires
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use dhcproto::v4::{self, DhcpOption, Message, Opcode};
    use dhcproto::{Encodable as _, Encoder};

    use super::*;

    const MAC: [u8; 6] = [2, 0, 0x5e, 0, 0x53, 0x42];

    fn msg(op: Opcode, mt: v4::MessageType, f: impl FnOnce(&mut Message)) -> Vec<u8> {
        let mut m = Message::default();
        m.set_opcode(op).set_chaddr(&MAC);
        m.opts_mut().insert(DhcpOption::MessageType(mt));
        f(&mut m);
        let mut b = Vec::new();
        m.encode(&mut Encoder::new(&mut b)).unwrap();
        b
    }

    #[test]
    fn an_ack_for_the_port_binds_its_address() {
        let ack = msg(Opcode::BootReply, v4::MessageType::Ack, |m| {
            m.set_yiaddr(Ipv4Addr::new(192, 0, 2, 232));
            m.opts_mut().insert(DhcpOption::AddressLeaseTime(120));
            m.opts_mut()
                .insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
            m.opts_mut()
                .insert(DhcpOption::Router(vec![Ipv4Addr::new(192, 0, 2, 1)]));
        });
        assert_eq!(
            learn(&ack, MAC, true),
            Ok(Learned::Bound {
                ip: Ipv4Addr::new(192, 0, 2, 232),
                prefix_len: Some(24),
                router: Some(Ipv4Addr::new(192, 0, 2, 1)),
                lease_secs: Some(120),
            })
        );
        // Another client's ACK, an INFORM's ACK, an OFFER: nothing.
        assert_eq!(
            learn(&ack, [2, 0, 0, 0, 0, 1], true),
            Err(LearnError::OtherClient)
        );
        let inform_ack = msg(Opcode::BootReply, v4::MessageType::Ack, |_| {});
        assert!(matches!(
            learn(&inform_ack, MAC, true),
            Err(LearnError::NoChange(_))
        ));
        let offer = msg(Opcode::BootReply, v4::MessageType::Offer, |m| {
            m.set_yiaddr(Ipv4Addr::new(192, 0, 2, 9));
        });
        assert!(matches!(
            learn(&offer, MAC, true),
            Err(LearnError::NoChange(_))
        ));
        // An infinite lease has no expiry.
        let forever = msg(Opcode::BootReply, v4::MessageType::Ack, |m| {
            m.set_yiaddr(Ipv4Addr::new(192, 0, 2, 9));
            m.opts_mut().insert(DhcpOption::AddressLeaseTime(u32::MAX));
        });
        assert!(matches!(
            learn(&forever, MAC, true),
            Ok(Learned::Bound {
                lease_secs: None,
                ..
            })
        ));
        assert_eq!(
            learn(b"junk", MAC, true),
            Err(LearnError::Decode {
                reason: DropReason::Truncated
            })
        );
    }

    /// Learning decodes with the engine's validator: what it refuses in a
    /// reply to the agent's own lease teaches nothing here either.
    #[test]
    fn a_message_the_validator_refuses_teaches_nothing() {
        let ack = |f: fn(&mut Message)| {
            msg(Opcode::BootReply, v4::MessageType::Ack, |m| {
                m.set_yiaddr(Ipv4Addr::new(192, 0, 2, 232));
                f(m);
            })
        };
        let refused = |bytes: &[u8]| match learn(bytes, MAC, true) {
            Err(LearnError::Decode { reason }) => reason,
            other => panic!("{other:?}"),
        };
        let mut bad_cookie = ack(|_| {});
        bad_cookie[236] = 0;
        assert_eq!(refused(&bad_cookie), DropReason::BadCookie);
        let mut long_option = ack(|_| {});
        let end = long_option.iter().rposition(|b| *b == 255).unwrap();
        long_option.truncate(end);
        long_option.extend_from_slice(&[15, 200, b'x']);
        assert_eq!(refused(&long_option), DropReason::BadOptionLength);
        let mut short_lease_time = ack(|_| {});
        let end = short_lease_time.iter().rposition(|b| *b == 255).unwrap();
        short_lease_time.truncate(end);
        short_lease_time.extend_from_slice(&[51, 2, 0, 60, 255]);
        assert_eq!(refused(&short_lease_time), DropReason::BadLeaseTime);
        // The same ACK, well-formed, binds.
        assert!(matches!(
            learn(&ack(|_| {}), MAC, true),
            Ok(Learned::Bound {
                lease_secs: None,
                ..
            })
        ));
    }

    #[test]
    fn release_gives_the_address_back_and_decline_refuses_it() {
        let release = msg(Opcode::BootRequest, v4::MessageType::Release, |m| {
            m.set_ciaddr(Ipv4Addr::new(192, 0, 2, 232));
        });
        assert_eq!(
            learn(&release, MAC, false),
            Ok(Learned::Released {
                ip: Ipv4Addr::new(192, 0, 2, 232)
            })
        );
        let decline = msg(Opcode::BootRequest, v4::MessageType::Decline, |m| {
            m.opts_mut()
                .insert(DhcpOption::RequestedIpAddress(Ipv4Addr::new(192, 0, 2, 7)));
        });
        assert_eq!(
            learn(&decline, MAC, false),
            Ok(Learned::Declined {
                ip: Ipv4Addr::new(192, 0, 2, 7)
            })
        );
        // A DECLINE without the address it refuses teaches nothing.
        let bare_decline = msg(Opcode::BootRequest, v4::MessageType::Decline, |_| {});
        assert!(matches!(
            learn(&bare_decline, MAC, false),
            Err(LearnError::NoChange(_))
        ));
        let request = msg(Opcode::BootRequest, v4::MessageType::Request, |_| {});
        assert!(matches!(
            learn(&request, MAC, false),
            Err(LearnError::NoChange(_))
        ));
    }

    fn binding(mac: &str, ip: [u8; 4], expires: Option<u64>) -> Binding {
        Binding {
            mac: mac.to_owned(),
            ip: Ipv4Addr::from(ip),
            port: Some("veth1".to_owned()),
            pod: Some("default/vm1".to_owned()),
            expires_unix_ms: expires,
            source: BindingSource::Learned,
            replaced: None,
        }
    }

    #[test]
    fn learned_bindings_survive_a_reopen_and_expire() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(q.is_none());
        s.upsert(binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(10_000)))
            .unwrap();
        s.upsert(binding("02:00:00:00:00:02", [192, 0, 2, 6], None))
            .unwrap();
        let (mut s, _) = LearnedStore::open(dir.path()).unwrap();
        assert_eq!(s.rows(0).len(), 2);
        assert_eq!(s.rows(10_000).len(), 1, "expired rows are not shown");
        let gone = s.expire(10_000).unwrap();
        assert_eq!(gone.len(), 1);
        // A RELEASE of another address keeps the binding; of its own removes it.
        assert!(
            !s.remove("02:00:00:00:00:02", Some(Ipv4Addr::new(192, 0, 2, 99)))
                .unwrap()
        );
        assert!(
            s.remove("02:00:00:00:00:02", Some(Ipv4Addr::new(192, 0, 2, 6)))
                .unwrap()
        );
        let (s, _) = LearnedStore::open(dir.path()).unwrap();
        assert!(s.rows(0).is_empty());
    }

    #[test]
    fn a_corrupt_file_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LearnedStore::FILE), b"{not json").unwrap();
        let (s, q) = LearnedStore::open(dir.path()).unwrap();
        assert!(s.rows(0).is_empty());
        assert!(q.is_some_and(|q| q.contains("corrupt")));
        assert!(!dir.path().join(LearnedStore::FILE).exists());
    }

    #[test]
    fn table_rendering() {
        let row = |identity: Option<&str>| BindingRow {
            binding: binding("02:00:00:00:00:01", [192, 0, 2, 5], Some(65_000)),
            identity: identity.map(str::to_owned),
        };
        let t = render(&[row(None), row(Some("both"))], 5_000);
        assert!(t.lines().nth(1).unwrap().contains("192.0.2.5"));
        assert!(t.contains("learned") && t.contains("60s"));
        assert!(t.lines().nth(2).unwrap().contains(" both "), "{t}");
        // A client that reads plain bindings reads the rows too.
        let json = serde_json::to_string(&[row(Some("ovs"))]).unwrap();
        let plain: Vec<Binding> = serde_json::from_str(&json).unwrap();
        assert_eq!(plain[0], row(None).binding);
        assert!(json.contains(r#""identity":"ovs""#), "{json}");
    }
}

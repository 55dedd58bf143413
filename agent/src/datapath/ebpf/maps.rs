//! Typed handles on the programs' maps: the per-interface capture mode (a
//! hash map and its array mirror), the xid ownership map and the per-CPU
//! outcome counters.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray};
use xdhcp_common as common;

use super::{Datapath, EbpfDatapathError, Result, Role};

/// Per-interface capture mode, mirrored into the kernel's config map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Pass everything, capture nothing.
    Off,
    /// Capture DHCP server→client frames, pass them on.
    Observe,
    /// Capture; drop the frames whose xid is owned, pass all others.
    Intercept,
}

impl CaptureMode {
    const fn to_kernel(self) -> u32 {
        match self {
            Self::Off => common::MODE_OFF,
            Self::Observe => common::MODE_OBSERVE,
            Self::Intercept => common::MODE_INTERCEPT,
        }
    }

    #[cfg(feature = "test-hooks")]
    const fn from_kernel(mode: u32) -> Self {
        match mode {
            common::MODE_OBSERVE => Self::Observe,
            common::MODE_INTERCEPT => Self::Intercept,
            _ => Self::Off,
        }
    }
}

/// Counters summed over CPUs, one field per kernel outcome of a DHCP
/// frame (a frame that is not DHCP is passed and counted nowhere: see
/// [`common::COUNTER_RETIRED_NOT_DHCP`]). The captures' three
/// (`captured`, `dropped_owned`, `passed_unowned`) are counted by this
/// agent from the records it has read, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Records read off the ring: frames the programs copied into it.
    pub captured: u64,
    /// … of which the program dropped the frame (intercept mode).
    pub dropped_owned: u64,
    pub ringbuf_full: u64,
    pub malformed: u64,
    pub fragment: u64,
    pub mode_off: u64,
    /// … of which the frame passed in intercept mode (too long to hand
    /// over whole).
    pub passed_unowned: u64,
    pub load_error: u64,
    /// Replies whose xid no lease owns, passed without a record.
    pub unowned_uncaptured: u64,
}

impl Counters {
    /// `(label, value)` pairs for metrics.
    pub fn labelled(&self) -> [(&'static str, u64); 9] {
        [
            ("captured", self.captured),
            ("dropped_owned", self.dropped_owned),
            ("ringbuf_full", self.ringbuf_full),
            ("malformed", self.malformed),
            ("fragment", self.fragment),
            ("mode_off", self.mode_off),
            ("passed_unowned", self.passed_unowned),
            ("load_error", self.load_error),
            ("unowned_uncaptured", self.unowned_uncaptured),
        ]
    }
}

/// Shared handle on a kernel ownership map, keyed by `K` as the programs
/// read it: [`XidOwnership`] (`DHCPv4` xids) and [`Xid6Ownership`]
/// (`DHCPv6` transaction id and IAID). Clones refer to the same map.
#[derive(Clone)]
pub struct Ownership<K> {
    map: Arc<Mutex<HashMap<MapData, K, common::Owned>>>,
    name: &'static str,
    /// Keys a previous agent left in a pinned map that this agent has not
    /// registered since: kept, so their replies are still kept from the
    /// pods while the agents hand over, until
    /// [`Datapath::release_unclaimed`] removes them.
    inherited: Arc<Mutex<HashSet<K>>>,
}

/// The `DHCPv4` xid ownership map (see [`Datapath::xid_ownership`]);
/// keys are xids in wire order.
pub type XidOwnership = Ownership<u32>;

/// The `DHCPv6` ownership map (see [`Datapath::xid6_ownership`]).
pub type Xid6Ownership = Ownership<common::Owned6Key>;

impl<K> std::fmt::Debug for Ownership<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("map", &self.name)
            .finish_non_exhaustive()
    }
}

impl<K: aya::Pod + Eq + std::hash::Hash> Ownership<K> {
    pub(super) fn new(map: HashMap<MapData, K, common::Owned>, name: &'static str) -> Self {
        Self {
            map: Arc::new(Mutex::new(map)),
            name,
            inherited: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Notes every key now in the map as a previous agent's.
    pub(super) fn mark_inherited(&self) {
        let keys: HashSet<K> = lock(&self.map)
            .keys()
            .filter_map(std::result::Result::ok)
            .collect();
        *lock(&self.inherited) = keys;
    }

    fn own_key(&self, key: K, ifindex: u32) -> Result<()> {
        let value = common::Owned {
            ifindex,
            reserved: 0,
        };
        lock(&self.inherited).remove(&key);
        lock(&self.map)
            .insert(key, value, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: self.name,
                source,
            })
    }

    fn disown_key(&self, key: K) -> Result<()> {
        lock(&self.inherited).remove(&key);
        match lock(&self.map).remove(&key) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(EbpfDatapathError::Map {
                name: self.name,
                source,
            }),
        }
    }

    /// Removes the previous agent's keys this agent did not register
    /// since; returns how many.
    fn release_inherited(&self) -> Result<usize> {
        let keys: Vec<K> = lock(&self.inherited).drain().collect();
        let mut owned = lock(&self.map);
        for k in &keys {
            owned
                .remove(k)
                .or_else(|e| if is_not_found(&e) { Ok(()) } else { Err(e) })
                .map_err(|source| EbpfDatapathError::Map {
                    name: self.name,
                    source,
                })?;
        }
        Ok(keys.len())
    }
}

impl XidOwnership {
    /// Whether `xid` (host order) is one a previous agent left owned in the
    /// pinned map and this agent has not registered since: that agent had
    /// a transaction open with it.
    pub fn is_inherited(&self, xid: u32) -> bool {
        lock(&self.inherited).contains(&wire_xid(xid))
    }

    /// Registers `xid` (host order, as in `Client::xid()`) as owned by
    /// `ifindex`: in intercept mode the programs drop replies carrying it.
    pub fn own(&self, xid: u32, ifindex: u32) -> Result<()> {
        self.own_key(wire_xid(xid), ifindex)
    }

    /// Removes `xid` from the ownership map (absent is fine).
    pub fn disown(&self, xid: u32) -> Result<()> {
        self.disown_key(wire_xid(xid))
    }
}

impl Xid6Ownership {
    /// Registers the `DHCPv6` transaction `xid` (24 bits, host order) of
    /// the `IA_NA` `iaid` as owned by `ifindex`: in intercept mode the
    /// programs drop the ADVERTISEs and REPLYs that carry both.
    pub fn own(&self, xid: u32, iaid: u32, ifindex: u32) -> Result<()> {
        self.own_key(common::Owned6Key::new(xid, iaid), ifindex)
    }

    /// Removes the pair from the map (absent is fine).
    pub fn disown(&self, xid: u32, iaid: u32) -> Result<()> {
        self.disown_key(common::Owned6Key::new(xid, iaid))
    }
}

/// The per-interface mode maps: the hash map is the source of truth (it
/// knows "never set" from "off"); the array mirrors it for ifindexes below
/// [`common::IFCONFIG_DIRECT_SLOTS`], where the programs read the array.
pub(super) struct IfConfigMaps {
    pub(super) hash: HashMap<MapData, u32, common::IfConfig>,
    pub(super) direct: Array<MapData, common::IfConfig>,
    /// Uplinks, keyed by ifindex in the agent's own namespace; read only by
    /// the uplink programs (see [`common::MAP_UPLINKS`]).
    pub(super) uplinks: HashMap<MapData, u32, common::IfConfig>,
}

impl IfConfigMaps {
    /// Mirrors `cfg` into the array when `ifindex` has a slot there.
    fn set_direct(&mut self, ifindex: u32, cfg: common::IfConfig) -> Result<()> {
        if ifindex >= common::IFCONFIG_DIRECT_SLOTS {
            return Ok(());
        }
        self.direct
            .set(ifindex, cfg, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG_DIRECT,
                source,
            })
    }
}

const MODE_OFF: common::IfConfig = common::IfConfig {
    mode: common::MODE_OFF,
    reserved: 0,
};

impl Datapath {
    /// Reconciles the tables a previous agent left in pinned maps with what
    /// this agent holds, once it has taken over the links it needs (its
    /// leases resumed and their interfaces attached): the previous agent's
    /// link pins nobody claimed are removed (which detaches them), its xids
    /// this agent did not register are disowned, and every mode entry on
    /// an ifindex nothing is attached to any more is cleared (stale entries
    /// would apply to a new interface that reuses the index). Until then
    /// the tables stay as they were, so the programs the previous agent left
    /// attached keep owned replies from the pods while no agent, or a
    /// starting one, reads the ring. Returns (links released, xids
    /// disowned).
    pub fn release_unclaimed(&mut self) -> Result<(usize, usize)> {
        let links = std::mem::take(&mut self.inherited);
        for left in links.values() {
            tracing::info!(pin = %left.path.display(), "releasing a pinned link no lease claimed");
            super::pin::remove_link_pin(&left.path);
        }
        let xids = self.owned.release_inherited()? + self.owned6.release_inherited()?;
        let (ports, uplinks) = (
            self.ifindexes_in(Role::Port),
            self.ifindexes_in(Role::Uplink),
        );
        let stale: Vec<u32> = {
            let cfg = lock(&self.ifconfig);
            cfg.hash
                .keys()
                .filter_map(std::result::Result::ok)
                .filter(|i| !ports.contains(i))
                .collect()
        };
        for ifindex in stale {
            self.clear_mode(ifindex)?;
        }
        let stale_uplinks: Vec<u32> = {
            let cfg = lock(&self.ifconfig);
            cfg.uplinks
                .keys()
                .filter_map(std::result::Result::ok)
                .filter(|i| !uplinks.contains(i))
                .collect()
        };
        for ifindex in stale_uplinks {
            self.clear_role_mode(Role::Uplink, ifindex)?;
        }
        // Array slots set without a hash entry (never by this agent, but a
        // pin is outside our control): zero every such slot.
        let known: HashSet<u32> = {
            let cfg = lock(&self.ifconfig);
            cfg.hash
                .keys()
                .filter_map(std::result::Result::ok)
                .collect()
        };
        let mut cfg = lock(&self.ifconfig);
        for ifindex in 0..common::IFCONFIG_DIRECT_SLOTS {
            if known.contains(&ifindex) {
                continue;
            }
            let v = cfg
                .direct
                .get(&ifindex, 0)
                .map_err(|source| EbpfDatapathError::Map {
                    name: common::MAP_IFCONFIG_DIRECT,
                    source,
                })?;
            if v != MODE_OFF {
                cfg.set_direct(ifindex, MODE_OFF)?;
            }
        }
        Ok((links.len(), xids))
    }

    /// Sets the capture mode of `ifindex` (an index in the interface's own
    /// namespace; the map is keyed by ifindex alone, see `docs/kernel.md`).
    pub fn set_mode(&self, ifindex: u32, mode: CaptureMode) -> Result<()> {
        let cfg = common::IfConfig {
            mode: mode.to_kernel(),
            reserved: 0,
        };
        let mut maps = lock(&self.ifconfig);
        maps.hash
            .insert(ifindex, cfg, 0)
            .map_err(|source| EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            })?;
        maps.set_direct(ifindex, cfg)
    }

    /// Sets the capture mode of an attachment in `role`: a workload port
    /// ([`Datapath::set_mode`]) or an uplink (`ifindex` in the agent's own
    /// namespace, in the uplinks' own map).
    pub fn set_role_mode(&self, role: Role, ifindex: u32, mode: CaptureMode) -> Result<()> {
        match role.mode_map() {
            Role::Port | Role::PortEgress => self.set_mode(ifindex, mode),
            Role::Uplink => {
                let cfg = common::IfConfig {
                    mode: mode.to_kernel(),
                    reserved: 0,
                };
                lock(&self.ifconfig)
                    .uplinks
                    .insert(ifindex, cfg, 0)
                    .map_err(|source| EbpfDatapathError::Map {
                        name: common::MAP_UPLINKS,
                        source,
                    })
            }
        }
    }

    /// Forgets the mode of an attachment in `role` (see [`Datapath::set_role_mode`]).
    pub fn clear_role_mode(&self, role: Role, ifindex: u32) -> Result<()> {
        match role.mode_map() {
            Role::Port | Role::PortEgress => self.clear_mode(ifindex),
            Role::Uplink => match lock(&self.ifconfig).uplinks.remove(&ifindex) {
                Ok(()) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(source) => Err(EbpfDatapathError::Map {
                    name: common::MAP_UPLINKS,
                    source,
                }),
            },
        }
    }

    /// The mode set for an uplink's `ifindex`, if any.
    #[cfg(feature = "test-hooks")]
    pub fn uplink_mode(&self, ifindex: u32) -> Result<Option<CaptureMode>> {
        match lock(&self.ifconfig).uplinks.get(&ifindex, 0) {
            Ok(cfg) => Ok(Some(CaptureMode::from_kernel(cfg.mode))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_UPLINKS,
                source,
            }),
        }
    }

    /// The mode set for `ifindex`, if any (`None`: the programs treat it as off).
    #[cfg(feature = "test-hooks")]
    pub fn mode(&self, ifindex: u32) -> Result<Option<CaptureMode>> {
        match lock(&self.ifconfig).hash.get(&ifindex, 0) {
            Ok(cfg) => Ok(Some(match cfg.mode {
                common::MODE_OBSERVE => CaptureMode::Observe,
                common::MODE_INTERCEPT => CaptureMode::Intercept,
                _ => CaptureMode::Off,
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            }),
        }
    }

    /// Forgets the mode of `ifindex` (the programs then treat it as off).
    pub fn clear_mode(&self, ifindex: u32) -> Result<()> {
        let mut maps = lock(&self.ifconfig);
        // The mirror first: the programs prefer it for small ifindexes.
        maps.set_direct(ifindex, MODE_OFF)?;
        match maps.hash.remove(&ifindex) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(source) => Err(EbpfDatapathError::Map {
                name: common::MAP_IFCONFIG,
                source,
            }),
        }
    }

    /// A handle on the xid ownership map that works without this
    /// `Datapath`: callers keeping the datapath behind a lock can register
    /// xids while an attach (netlink work, milliseconds) holds that lock.
    pub fn xid_ownership(&self) -> XidOwnership {
        self.owned.clone()
    }

    /// The same for the `DHCPv6` ownership map.
    pub fn xid6_ownership(&self) -> Xid6Ownership {
        self.owned6.clone()
    }

    /// Reads the per-CPU counters and sums them; the captures' outcomes
    /// come from the records read so far (the programs do not count them).
    pub fn counters(&self) -> Result<Counters> {
        let sum = |index: u32| -> Result<u64> {
            let values = self
                .counters
                .get(&index, 0)
                .map_err(|source| EbpfDatapathError::Map {
                    name: common::MAP_COUNTERS,
                    source,
                })?;
            Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
        };
        let (captured, dropped_owned, passed_unowned) = self.record_counts.read();
        Ok(Counters {
            captured,
            dropped_owned,
            ringbuf_full: sum(common::COUNTER_RINGBUF_FULL)?,
            malformed: sum(common::COUNTER_MALFORMED)?,
            fragment: sum(common::COUNTER_FRAGMENT)?,
            mode_off: sum(common::COUNTER_MODE_OFF)?,
            passed_unowned,
            load_error: sum(common::COUNTER_LOAD_ERROR)?,
            unowned_uncaptured: sum(common::COUNTER_UNOWNED_UNCAPTURED)?,
        })
    }
}

/// The per-CPU counter array, as taken from the object.
pub(super) type CounterMap = PerCpuArray<MapData, u64>;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a map handle inconsistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deleting an absent key: aya reports `ENOENT` from `bpf_map_delete_elem`.
fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The ownership map is keyed by the xid bytes as they appear on the wire.
fn wire_xid(xid: u32) -> u32 {
    u32::from_ne_bytes(xid.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_is_keyed_in_wire_order() {
        assert_eq!(wire_xid(0x0102_0304).to_ne_bytes(), [1, 2, 3, 4]);
    }
}

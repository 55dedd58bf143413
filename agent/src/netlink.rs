//! rtnetlink: link lookup and address/route configuration.
//!
//! A netlink socket talks to the namespace it was created in. [`Netlink::open`]
//! creates the socket on a dedicated thread inside the target namespace
//! ([`crate::sys::netns`]) while that thread has entered the caller's tokio
//! runtime, so the socket is registered with the caller's reactor and every
//! later request runs on the caller's runtime — one connection per namespace,
//! no thread per request. (A lease notices its interface's deletion through
//! [`crate::datapath::rawsock::LinkRemovalWatch`], a bare socket.)
//!
//! Used for `"apply": true` (the agent itself configures the lease's address
//! and routes in the pod netns), CNI CHECK (is the address still there) and interface lookups.
//!
//! One thing: the agent's rtnetlink client (about 580 lines of code; the
//! rest is its tests).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd as _, BorrowedFd};
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoKind, LinkAttribute, LinkExtentMask, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{RouteProtocol, RouteScope};
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio::task::JoinHandle;
use xdhcp_engine::{Ipv4Prefix, Lease};

use crate::sys::netns::{NetnsError, run_in_netns_async};

/// Errors of netlink operations. Variants name the namespace (and the
/// interface or address where there is one).
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// Entering the namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The netlink socket could not be created.
    #[error("failed to open a netlink socket in {}: {source}", ns_label(netns.as_deref()))]
    Connect {
        netns: Option<PathBuf>,
        #[source]
        source: io::Error,
    },
    /// No interface with this name / index.
    #[error("interface {what} not found in {}", ns_label(netns.as_deref()))]
    NoSuchLink {
        what: String,
        netns: Option<PathBuf>,
    },
    /// A request was refused by the kernel or failed.
    #[error("failed to {op} in {}: {source}", ns_label(netns.as_deref()))]
    Request {
        op: String,
        netns: Option<PathBuf>,
        #[source]
        source: rtnetlink::Error,
    },
    /// A lease's route would take the place of a route already there.
    #[error("route {wanted} conflicts with {existing} in {}: the existing route is left alone", ns_label(netns.as_deref()))]
    RouteConflict {
        wanted: String,
        existing: String,
        netns: Option<PathBuf>,
    },
}

/// The smallest MTU an IPv4 link may have (RFC 791), and the smallest
/// option 26 value RFC 2132 §5.1 allows.
pub const MIN_IPV4_MTU: u16 = 68;

/// Convenience alias for results of this module.
pub type Result<T, E = NetlinkError> = std::result::Result<T, E>;

impl NetlinkError {}

fn ns_label(p: Option<&Path>) -> String {
    p.map_or_else(
        || "the agent's namespace".to_owned(),
        |p| p.display().to_string(),
    )
}

/// The errno of a netlink error reply, if it is one.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io().raw_os_error(),
        _ => None,
    }
}

/// What we know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDetails {
    /// Interface index inside its namespace.
    pub ifindex: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, if the link has a 6-byte one.
    pub mac: Option<[u8; 6]>,
    /// `IFLA_INFO_KIND` (e.g. `veth`, `bridge`, `macvlan`); `None` for
    /// physical devices.
    pub kind: Option<String>,
    /// MTU.
    pub mtu: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Operationally up, carrier present (`IFF_RUNNING`).
    pub running: bool,
    /// The device it is enslaved to (`IFLA_MASTER`: a bridge's port names
    /// its bridge), by index.
    pub master: Option<u32>,
}

impl LinkDetails {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut details = Self {
            ifindex: msg.header.index,
            name: String::new(),
            mac: None,
            kind: None,
            mtu: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            running: msg.header.flags.contains(LinkFlags::Running),
            master: None,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => details.name.clone_from(n),
                LinkAttribute::Address(a) => details.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
                LinkAttribute::Mtu(m) => details.mtu = Some(*m),
                LinkAttribute::Controller(m) if *m != 0 => details.master = Some(*m),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            details.kind = Some(kind_name(kind));
                        }
                    }
                }
                _ => {}
            }
        }
        details
    }
}

fn kind_name(kind: &InfoKind) -> String {
    kind.to_string()
}

/// One IPv4 route to install for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Route {
    /// Destination network.
    pub dest: Ipv4Addr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Next hop; `None` for an on-link route (option 121 router 0.0.0.0).
    pub gateway: Option<Ipv4Addr>,
}

/// The routes a lease asks for: option 121 when present (RFC 3442: it
/// replaces option 3), else a default route via the first router.
pub fn lease_routes(lease: &Lease) -> Vec<Ipv4Route> {
    if lease.routes.is_empty() {
        lease
            .routers
            .first()
            .map(|gw| Ipv4Route {
                dest: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                gateway: Some(*gw),
            })
            .into_iter()
            .collect()
    } else {
        lease
            .routes
            .iter()
            .map(|r| Ipv4Route {
                dest: r.dest,
                prefix_len: r.prefix_len,
                gateway: (!r.gateway.is_unspecified()).then_some(r.gateway),
            })
            .collect()
    }
}

/// A route of the main table, as far as the agent compares routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    pub dest: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
    pub metric: u32,
}

impl KernelRoute {
    fn from_message(m: &rtnetlink::packet_route::route::RouteMessage) -> Option<Self> {
        use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteType};
        if m.header.kind != RouteType::Unicast {
            return None;
        }
        let mut r = KernelRoute {
            dest: Ipv4Addr::UNSPECIFIED,
            prefix_len: m.header.destination_prefix_length,
            gateway: None,
            oif: None,
            metric: 0,
        };
        let mut table = u32::from(m.header.table);
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => r.dest = *ip,
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => r.gateway = Some(*ip),
                RouteAttribute::Oif(i) => r.oif = Some(*i),
                RouteAttribute::Priority(p) => r.metric = *p,
                RouteAttribute::Table(t) => table = *t,
                _ => {}
            }
        }
        (table == u32::from(libc::RT_TABLE_MAIN)).then_some(r)
    }
}

impl std::fmt::Display for KernelRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.dest, self.prefix_len)?;
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        if let Some(oif) = self.oif {
            write!(f, " dev #{oif}")?;
        }
        write!(f, " metric {}", self.metric)
    }
}

/// An rtnetlink connection to one namespace, driven by the caller's runtime.
#[derive(Debug)]
pub struct Netlink {
    handle: Handle,
    task: JoinHandle<()>,
    netns: Option<PathBuf>,
}

/// Creates the connection socket in `netns` (or here) registered with the
/// current runtime, and spawns its driver task there.
async fn connect<T: Send + 'static>(
    netns: Option<&Path>,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T> {
    let runtime = tokio::runtime::Handle::current();
    let work = move || {
        let _entered = runtime.enter();
        make()
    };
    let made = match netns {
        Some(ns) => run_in_netns_async(ns, work).await?,
        None => work(),
    };
    made.map_err(|source| NetlinkError::Connect {
        netns: netns.map(Path::to_path_buf),
        source,
    })
}

impl Netlink {
    /// Opens a connection inside `netns` (`None`: the agent's own namespace).
    /// Must be called within a tokio runtime.
    pub async fn open(netns: Option<&Path>) -> Result<Self> {
        let (conn, handle, _messages) = connect(netns, rtnetlink::new_connection).await?;
        Ok(Self::driven(conn, handle, netns))
    }

    /// The connection `conn` (its driver spawned) with its `handle`.
    fn driven(
        conn: rtnetlink::proto::Connection<rtnetlink::packet_route::RouteNetlinkMessage>,
        handle: Handle,
        netns: Option<&Path>,
    ) -> Self {
        Self {
            handle,
            task: tokio::spawn(conn),
            netns: netns.map(Path::to_path_buf),
        }
    }

    /// As [`Netlink::open`], on a socket that also hears the namespace's
    /// IPv6 address changes ([`Addr6Events`]) from this moment on.
    pub async fn open_watching6(netns: Option<&Path>) -> Result<(Self, Addr6Events)> {
        let (conn, handle, messages) = connect(netns, || {
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Ipv6Ifaddr])
        })
        .await?;
        Ok((Self::driven(conn, handle, netns), Addr6Events { messages }))
    }

    /// An add's outcome where the thing being there already (`EEXIST`)
    /// is success; any other error names `what`.
    fn existing_is_fine(
        &self,
        added: std::result::Result<(), rtnetlink::Error>,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        match added {
            Err(e) if errno(&e) == Some(libc::EEXIST) => Ok(()),
            other => other.map_err(|e| self.request_err(what())(e)),
        }
    }

    /// Deletes the route `msg` describes; whether it was there (`ESRCH`:
    /// it was not). Any other error names `what`.
    async fn del_route_message(
        &self,
        msg: rtnetlink::packet_route::route::RouteMessage,
        what: impl FnOnce() -> String,
    ) -> Result<bool> {
        match self.handle.route().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno(&e) == Some(libc::ESRCH) => Ok(false),
            Err(e) => Err(self.request_err(what())(e)),
        }
    }

    fn request_err(
        &self,
        op: impl Into<String>,
    ) -> impl FnOnce(rtnetlink::Error) -> NetlinkError + '_ {
        let op = op.into();
        move |source| NetlinkError::Request {
            op,
            netns: self.netns.clone(),
            source,
        }
    }

    /// Looks a link up by name.
    pub async fn link(&self, ifname: &str) -> Result<LinkDetails> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(ifname.to_owned())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(LinkDetails::from_message(&msg)),
            Ok(None) => Err(self.no_such(ifname)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Err(self.no_such(ifname)),
            Err(e) => Err(self.request_err(format!("look up link {ifname:?}"))(e)),
        }
    }

    /// Looks a link up by index; `Ok(None)` if there is none.
    pub async fn link_by_index(&self, ifindex: u32) -> Result<Option<LinkDetails>> {
        let mut stream = self.handle.link().get().match_index(ifindex).execute();
        match stream.try_next().await {
            Ok(msg) => Ok(msg.as_ref().map(LinkDetails::from_message)),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(self.request_err(format!("look up link #{ifindex}"))(e)),
        }
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<LinkDetails>> {
        let mut stream = self.handle.link().get().execute();
        let mut links = Vec::new();
        while let Some(msg) = stream
            .try_next()
            .await
            .map_err(self.request_err("list the links"))?
        {
            links.push(LinkDetails::from_message(&msg));
        }
        Ok(links)
    }

    fn no_such(&self, what: &str) -> NetlinkError {
        NetlinkError::NoSuchLink {
            what: format!("{what:?}"),
            netns: self.netns.clone(),
        }
    }

    /// Sets a link administratively up.
    pub async fn set_up(&self, ifindex: u32) -> Result<()> {
        let msg = rtnetlink::LinkUnspec::new_with_index(ifindex).up().build();
        self.set_link(msg, format!("set link #{ifindex} up")).await
    }

    /// Sets the hardware address of a link.
    pub async fn set_mac(&self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        let msg = rtnetlink::LinkUnspec::new_with_index(ifindex)
            .address(mac.to_vec())
            .build();
        self.set_link(msg, format!("set the hardware address of link #{ifindex}"))
            .await
    }

    /// Sets the MTU of a link.
    pub async fn set_mtu(&self, ifindex: u32, mtu: u32) -> Result<()> {
        let msg = rtnetlink::LinkUnspec::new_with_index(ifindex)
            .mtu(mtu)
            .build();
        self.set_link(msg, format!("set the MTU of link #{ifindex} to {mtu}"))
            .await
    }

    /// One `RTM_SETLINK`, `op` naming it in the error.
    async fn set_link(&self, msg: LinkMessage, op: String) -> Result<()> {
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(self.request_err(op))
    }

    /// IPv4 addresses on `ifindex`, with prefix lengths.
    pub async fn addresses(&self, ifindex: u32) -> Result<Vec<(Ipv4Addr, u8)>> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(ifindex)
            .execute()
            .try_collect()
            .await
            .map_err(self.request_err(format!("list addresses of link #{ifindex}")))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == ifindex)
            .filter_map(|m| {
                m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip)) => Some((*ip, m.header.prefix_len)),
                    _ => None,
                })
            })
            .collect())
    }

    /// The IPv4 routes of the main table, with what a conflict message and
    /// the route policy need.
    pub async fn routes(&self) -> Result<Vec<KernelRoute>> {
        let msgs: Vec<rtnetlink::packet_route::route::RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(self.request_err("list routes"))?;
        Ok(msgs.iter().filter_map(KernelRoute::from_message).collect())
    }

    /// Prefixes whose routing a lease must not change, as seen in this
    /// namespace: the destination of every main-table route out of an
    /// interface other than `except` (the default route aside: it is the
    /// most general route there is), and the networks of every address on
    /// such an interface (loopback aside).
    pub async fn prefixes_to_protect(&self, except: Option<u32>) -> Result<Vec<Ipv4Prefix>> {
        let routes = self.routes().await?;
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(self.request_err("list addresses"))?;
        Ok(protected_prefixes(&routes, &msgs, except))
    }

    /// Whether `addr` (with `prefix_len`, if given) is configured on `ifindex`
    /// (CNI CHECK with `"apply": true`).
    pub async fn has_address(
        &self,
        ifindex: u32,
        addr: Ipv4Addr,
        prefix_len: Option<u8>,
    ) -> Result<bool> {
        Ok(self
            .addresses(ifindex)
            .await?
            .iter()
            .any(|(a, p)| *a == addr && prefix_len.is_none_or(|want| want == *p)))
    }

    /// Adds `addr/prefix_len` to `ifindex`; an identical existing address is fine.
    pub async fn add_address(&self, ifindex: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<()> {
        let added = self
            .handle
            .address()
            .add(ifindex, IpAddr::V4(addr), prefix_len)
            .execute()
            .await;
        self.existing_is_fine(added, || {
            format!("add {addr}/{prefix_len} to link #{ifindex}")
        })
    }

    /// Adds the IPv6 `addr/prefix_len` to `ifindex`, with the kernel's
    /// duplicate address detection when `dad` (the address stays tentative
    /// until it ends: [`Netlink::dad6`]), else `nodad`; an identical
    /// existing address is fine (and left as it is).
    pub async fn add_address6(
        &self,
        ifindex: u32,
        addr: Ipv6Addr,
        prefix_len: u8,
        dad: bool,
    ) -> Result<()> {
        let mut req = self
            .handle
            .address()
            .add(ifindex, IpAddr::V6(addr), prefix_len);
        if !dad {
            req.message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        let added = req.execute().await;
        self.existing_is_fine(added, || {
            format!("add {addr}/{prefix_len} to link #{ifindex}")
        })
    }

    /// Where the kernel's duplicate address detection of `addr` on
    /// `ifindex` stands.
    pub async fn dad6(&self, ifindex: u32, addr: Ipv6Addr) -> Result<Dad6> {
        let msgs = self.addresses6(ifindex, addr).await?;
        let Some(m) = msgs.iter().find(|m| m.header.index == ifindex) else {
            return Ok(Dad6::Gone);
        };
        Ok(Dad6::of(address_flags(m)))
    }

    /// The kernel's entries for the IPv6 `addr` on `ifindex` (none when it
    /// is not there).
    async fn addresses6(&self, ifindex: u32, addr: Ipv6Addr) -> Result<Vec<AddressMessage>> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(ifindex)
            .set_address_filter(IpAddr::V6(addr))
            .execute()
            .try_collect()
            .await
            .map_err(self.request_err(format!("look up {addr} on link #{ifindex}")))?;
        Ok(msgs)
    }

    /// Whether the IPv6 `addr/prefix_len` is on `ifindex`.
    pub async fn has_address6(&self, ifindex: u32, addr: Ipv6Addr, prefix_len: u8) -> Result<bool> {
        let msgs = self.addresses6(ifindex, addr).await?;
        Ok(msgs
            .iter()
            .any(|m| m.header.index == ifindex && m.header.prefix_len == prefix_len))
    }

    /// Adds the IPv6 default route through `gw` out of `ifindex` with
    /// `metric`; one already there with the same metric is left as it is
    /// (never replaced).
    pub async fn add_default_route6(
        &self,
        ifindex: u32,
        gw: Ipv6Addr,
        metric: Option<u32>,
    ) -> Result<()> {
        let added = self
            .handle
            .route()
            .add(Self::default_route6(ifindex, gw, metric))
            .execute()
            .await;
        self.existing_is_fine(added, || {
            format!("add default route via {gw} on link #{ifindex}")
        })
    }

    /// Deletes the route [`Netlink::add_default_route6`] added; whether it
    /// was there.
    pub async fn del_default_route6(
        &self,
        ifindex: u32,
        gw: Ipv6Addr,
        metric: Option<u32>,
    ) -> Result<bool> {
        self.del_route_message(Self::default_route6(ifindex, gw, metric), || {
            format!("delete default route via {gw} on link #{ifindex}")
        })
        .await
    }

    fn default_route6(
        ifindex: u32,
        gw: Ipv6Addr,
        metric: Option<u32>,
    ) -> rtnetlink::packet_route::route::RouteMessage {
        let mut builder = RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(Ipv6Addr::UNSPECIFIED, 0)
            .gateway(gw)
            .output_interface(ifindex)
            .protocol(RouteProtocol::Dhcp);
        if let Some(m) = metric {
            builder = builder.priority(m);
        }
        builder.build()
    }

    /// Removes `addr/prefix_len` from `ifindex`; returns whether it was there.
    pub async fn del_address(&self, ifindex: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<bool> {
        self.del_address_any(ifindex, IpAddr::V4(addr), Some(prefix_len))
            .await
    }

    /// Removes `addr` from `ifindex` whatever its prefix length; returns
    /// whether it was there.
    pub async fn del_address_of_any_prefix(&self, ifindex: u32, addr: Ipv4Addr) -> Result<bool> {
        self.del_address_any(ifindex, IpAddr::V4(addr), None).await
    }

    /// Removes the IPv6 `addr/prefix_len` from `ifindex`; whether it was there.
    pub async fn del_address6(&self, ifindex: u32, addr: Ipv6Addr, prefix_len: u8) -> Result<bool> {
        self.del_address_any(ifindex, IpAddr::V6(addr), Some(prefix_len))
            .await
    }

    async fn del_address_any(
        &self,
        ifindex: u32,
        addr: IpAddr,
        prefix_len: Option<u8>,
    ) -> Result<bool> {
        let shown = prefix_len.map_or_else(|| addr.to_string(), |p| format!("{addr}/{p}"));
        let mut get = self
            .handle
            .address()
            .get()
            .set_link_index_filter(ifindex)
            .set_address_filter(addr);
        if let Some(p) = prefix_len {
            get = get.set_prefix_length_filter(p);
        }
        let msgs: Vec<AddressMessage> = get
            .execute()
            .try_collect()
            .await
            .map_err(self.request_err(format!("look up {shown} on link #{ifindex}")))?;
        let mut removed = false;
        for msg in msgs.into_iter().filter(|m| m.header.index == ifindex) {
            match self.handle.address().del(msg).execute().await {
                Ok(()) => removed = true,
                Err(e) if errno(&e) == Some(libc::EADDRNOTAVAIL) => {}
                Err(e) => {
                    return Err(self
                        .request_err(format!("remove {shown} from link #{ifindex}"))(
                        e
                    ));
                }
            }
        }
        Ok(removed)
    }

    fn route_message(
        ifindex: u32,
        route: Ipv4Route,
        metric: Option<u32>,
    ) -> rtnetlink::packet_route::route::RouteMessage {
        let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(route.dest, route.prefix_len)
            .output_interface(ifindex)
            .protocol(RouteProtocol::Dhcp);
        builder = match route.gateway {
            Some(gw) => builder.gateway(gw),
            None => builder.scope(RouteScope::Link),
        };
        if let Some(m) = metric {
            builder = builder.priority(m);
        }
        builder.build()
    }

    /// Adds a route out of `ifindex` with `metric` (the network's
    /// `ipam.priority`; the kernel's 0 when unset). Never replaces: the
    /// same route already there out of `ifindex` (a lease applied again) is
    /// fine, and any other route with the same destination and metric —
    /// another interface's, or another gateway's — is left alone and the
    /// add fails naming both ([`NetlinkError::RouteConflict`]).
    pub async fn add_route(
        &self,
        ifindex: u32,
        route: Ipv4Route,
        metric: Option<u32>,
    ) -> Result<()> {
        let added = self
            .handle
            .route()
            .add(Self::route_message(ifindex, route, metric))
            .execute()
            .await;
        match added {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(libc::EEXIST) => {
                let wanted = KernelRoute {
                    dest: route.dest,
                    prefix_len: route.prefix_len,
                    gateway: route.gateway,
                    oif: Some(ifindex),
                    metric: metric.unwrap_or(0),
                };
                let existing = self.routes().await?.into_iter().find(|r| {
                    r.dest == wanted.dest
                        && r.prefix_len == wanted.prefix_len
                        && r.metric == wanted.metric
                });
                match existing {
                    Some(r) if r == wanted => Ok(()),
                    existing => Err(NetlinkError::RouteConflict {
                        wanted: wanted.to_string(),
                        existing: existing.map_or_else(
                            || "a route the kernel did not list".to_owned(),
                            |r| r.to_string(),
                        ),
                        netns: self.netns.clone(),
                    }),
                }
            }
            Err(e) => Err(self
                .request_err(format!("add route {route:?} via link #{ifindex}"))(
                e
            )),
        }
    }

    /// Deletes our route out of `ifindex` (the same destination, gateway,
    /// interface and metric); returns whether it existed.
    pub async fn del_route(
        &self,
        ifindex: u32,
        route: Ipv4Route,
        metric: Option<u32>,
    ) -> Result<bool> {
        self.del_route_message(Self::route_message(ifindex, route, metric), || {
            format!("delete route {route:?} via link #{ifindex}")
        })
        .await
    }

    /// Applies a lease to `ifindex`: sets the link up, applies option 26 (MTU)
    /// when present — a value the device refuses is logged and skipped, the
    /// address and routes matter more — adds the address, then the routes of
    /// [`lease_routes`] (on-link routes first so gateways reachable only
    /// through them resolve).
    pub async fn apply_lease(
        &self,
        ifindex: u32,
        lease: &Lease,
        metric: Option<u32>,
    ) -> Result<()> {
        self.set_up(ifindex).await?;
        if let Some(mtu) = lease.mtu.filter(|m| *m >= MIN_IPV4_MTU)
            && let Err(error) = self.set_mtu(ifindex, u32::from(mtu)).await
        {
            tracing::warn!(ifindex, mtu, %error, "MTU from the lease (option 26) not applied");
        }
        self.add_address(ifindex, lease.address, lease.prefix_len)
            .await?;
        let mut routes = lease_routes(lease);
        routes.sort_by_key(|r| r.gateway.is_some());
        for route in routes {
            self.add_route(ifindex, route, metric).await?;
        }
        Ok(())
    }

    /// Removes what [`Netlink::apply_lease`] added (routes, then the address).
    /// Missing pieces are not an error.
    pub async fn remove_lease(
        &self,
        ifindex: u32,
        lease: &Lease,
        metric: Option<u32>,
    ) -> Result<()> {
        let mut routes = lease_routes(lease);
        routes.sort_by_key(|r| r.gateway.is_none());
        for route in routes {
            self.del_route(ifindex, route, metric).await?;
        }
        self.del_address(ifindex, lease.address, lease.prefix_len)
            .await?;
        Ok(())
    }
}

/// Where the kernel's duplicate address detection of an IPv6 address
/// stands (RFC 4862 §5.4), from the address's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dad6 {
    /// Still tentative: neighbour solicitations out, no answer yet.
    Tentative,
    /// Another node on the link holds the address (`dadfailed`).
    Duplicate,
    /// Detection is over (or was never run): the address is the node's.
    Unique,
    /// The address is not on the interface.
    Gone,
}

impl Dad6 {
    fn of(flags: AddressFlags) -> Self {
        if flags.contains(AddressFlags::Dadfailed) {
            Self::Duplicate
        } else if flags.contains(AddressFlags::Tentative) {
            Self::Tentative
        } else {
            Self::Unique
        }
    }
}

/// The other end of a veth, as seen from the namespace of one end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VethPeer {
    /// The peer's ifindex, in the peer's namespace.
    pub ifindex: u32,
    /// Whether the peer lives in the namespace given to [`veth_peer_here`].
    pub in_namespace: bool,
}

/// What a trip that opened a pod's link did about its veth peer, for the
/// DHCP guard.
#[derive(Debug, Default)]
pub enum PeerLookup {
    /// It did not look: the guard makes a trip of its own.
    #[default]
    NotLooked,
    /// It looked ([`veth_peer_here`]).
    Found(io::Result<Option<VethPeer>>),
}

impl PeerLookup {
    /// The host port's index, when the peer was found in the agent's
    /// namespace.
    pub fn host_ifindex(&self) -> Option<u32> {
        match self {
            Self::Found(Ok(Some(p))) if p.in_namespace => Some(p.ifindex),
            _ => None,
        }
    }
}

/// The peer of veth `ifname` in the calling thread's namespace (`None`:
/// not a veth, or no peer), and whether the peer lives in the namespace
/// `ns` refers to (an open `/proc/.../ns/net` or `/var/run/netns/...`
/// file): the link's `IFLA_LINK_NETNSID` is compared with the id this
/// namespace gives `ns` (`RTM_GETNSID`). Ifindexes repeat across
/// namespaces, so the ifindex alone never says which device is meant.
///
/// Blocking, on a socket of its own: it runs inside the trip that opens a
/// pod's link (on that trip's thread), so the DHCP guard needs no trip and
/// no runtime round trips of its own. Under a burst of ADDs the async form
/// this replaced waited tens of milliseconds for busy runtime workers.
pub fn veth_peer_here(ifname: &str, ns: BorrowedFd<'_>) -> io::Result<Option<VethPeer>> {
    veth_peer_on(&route_socket_here()?, ifname, ns)
}

/// A blocking `NETLINK_ROUTE` socket in the calling thread's namespace.
/// It stays in that namespace: requests sent on it later, from any
/// thread, are answered there.
pub fn route_socket_here() -> io::Result<rtnetlink::sys::Socket> {
    use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    Ok(sock)
}

/// [`veth_peer_here`] on `sock`, a route socket of the namespace `ifname`
/// is in ([`route_socket_here`]).
pub fn veth_peer_on(
    sock: &rtnetlink::sys::Socket,
    ifname: &str,
    ns: BorrowedFd<'_>,
) -> io::Result<Option<VethPeer>> {
    use rtnetlink::packet_route::RouteNetlinkMessage;
    use rtnetlink::packet_route::nsid::{NsidAttribute, NsidMessage};

    let mut get = LinkMessage::default();
    get.attributes
        .push(LinkAttribute::IfName(ifname.to_owned()));
    // Without the link's counters: a quarter of the answer, which every
    // ADD parsed whole for two attributes.
    get.attributes
        .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
    let RouteNetlinkMessage::NewLink(link) = request(sock, RouteNetlinkMessage::GetLink(get), 3)?
    else {
        return Err(io::Error::other(
            "RTM_GETLINK answered with another message",
        ));
    };
    if LinkDetails::from_message(&link).kind.as_deref() != Some("veth") {
        return Ok(None);
    }
    let mut peer = None;
    let mut peer_nsid = None;
    for attr in &link.attributes {
        match attr {
            LinkAttribute::Link(i) if *i != 0 => peer = Some(*i),
            LinkAttribute::LinkNetNsId(id) => peer_nsid = Some(*id),
            _ => {}
        }
    }
    let Some(ifindex) = peer else {
        return Ok(None);
    };
    // No IFLA_LINK_NETNSID: the peer is in this very namespace.
    let Some(peer_nsid) = peer_nsid else {
        return Ok(Some(VethPeer {
            ifindex,
            in_namespace: false,
        }));
    };
    let mut get = NsidMessage::default();
    get.attributes.push(NsidAttribute::Fd(
        u32::try_from(ns.as_raw_fd()).unwrap_or(u32::MAX),
    ));
    let nsid = match request(sock, RouteNetlinkMessage::GetNsId(get), 4)? {
        RouteNetlinkMessage::NewNsId(m) => m.attributes.iter().find_map(|a| match a {
            NsidAttribute::Id(id) => Some(*id),
            _ => None,
        }),
        _ => None,
    };
    Ok(Some(VethPeer {
        ifindex,
        in_namespace: nsid == Some(peer_nsid) && peer_nsid >= 0,
    }))
}

/// How an XDP program is attached by [`set_xdp_here`]: in the driver
/// (native) or in the generic receive path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpHook {
    Native,
    Generic,
}

impl XdpHook {
    /// `XDP_FLAGS_DRV_MODE` / `XDP_FLAGS_SKB_MODE`.
    const fn flags(self) -> u32 {
        match self {
            Self::Native => 1 << 2,
            Self::Generic => 1 << 1,
        }
    }
}

/// Attaches XDP program `prog` to device `ifindex` of the calling thread's
/// namespace through netlink (`IFLA_XDP`), replacing the program attached
/// there the same way; `None` detaches it. Blocking, on a socket of its
/// own. An attachment made this way is no BPF link: it holds its program
/// until it is replaced or detached, or the device goes, whether or not
/// the process that made it still runs (as a TC filter does).
pub fn set_xdp_here(ifindex: u32, prog: Option<BorrowedFd<'_>>, hook: XdpHook) -> io::Result<()> {
    use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
    use rtnetlink::packet_route::RouteNetlinkMessage;
    use rtnetlink::packet_route::link::LinkXdp;
    use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut set = LinkMessage::default();
    set.header.index = ifindex;
    set.attributes.push(LinkAttribute::Xdp(vec![
        LinkXdp::Fd(prog.map_or(-1, |fd| fd.as_raw_fd())),
        LinkXdp::Flags(hook.flags()),
    ]));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::SetLink(set));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    req.header.sequence_number = 1;
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    loop {
        let (reply, _) = sock.recv_from_full()?;
        let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        if m.header.sequence_number != 1 {
            continue;
        }
        return match m.payload {
            NetlinkPayload::Error(e) if e.code.is_some() => Err(e.to_io()),
            _ => Ok(()),
        };
    }
}

/// The id of the XDP program attached to device `ifindex` of the calling
/// thread's namespace (`None`: none), and how it is attached.
pub fn xdp_prog_here(ifindex: u32) -> io::Result<Option<(u32, XdpHook)>> {
    use rtnetlink::packet_route::RouteNetlinkMessage;
    use rtnetlink::packet_route::link::{LinkXdp, XdpAttached};
    use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut get = LinkMessage::default();
    get.header.index = ifindex;
    let RouteNetlinkMessage::NewLink(link) = request(&sock, RouteNetlinkMessage::GetLink(get), 1)?
    else {
        return Err(io::Error::other(
            "RTM_GETLINK answered with another message",
        ));
    };
    // One program: its mode and id. Several (modes): an id per mode.
    let (mut mode, mut prog, mut drv, mut skb) = (None, None, None, None);
    for attr in &link.attributes {
        if let LinkAttribute::Xdp(xdp) = attr {
            for a in xdp {
                match a {
                    LinkXdp::Attached(XdpAttached::Driver) => mode = Some(XdpHook::Native),
                    LinkXdp::Attached(XdpAttached::SocketBuffer) => mode = Some(XdpHook::Generic),
                    LinkXdp::ProgId(id) if *id != 0 => prog = Some(*id),
                    LinkXdp::DrvProgId(id) if *id != 0 => drv = Some(*id),
                    LinkXdp::SkbProgId(id) if *id != 0 => skb = Some(*id),
                    _ => {}
                }
            }
        }
    }
    Ok(match (mode, prog) {
        (Some(mode), Some(id)) => Some((id, mode)),
        _ => drv
            .map(|id| (id, XdpHook::Native))
            .or(skb.map(|id| (id, XdpHook::Generic))),
    })
}

/// The prefixes a lease must not reroute, from a namespace's main-table
/// `routes` and its `addresses` ([`Netlink::prefixes_to_protect`]), the
/// interface `except` (the one being leased) aside.
fn protected_prefixes(
    routes: &[KernelRoute],
    addresses: &[AddressMessage],
    except: Option<u32>,
) -> Vec<Ipv4Prefix> {
    let mut out = Vec::new();
    for r in routes {
        if r.prefix_len > 0 && r.oif.is_some() && r.oif != except {
            out.extend(Ipv4Prefix::new(r.dest, r.prefix_len));
        }
    }
    for m in addresses.iter().filter(|m| Some(m.header.index) != except) {
        for a in &m.attributes {
            if let AddressAttribute::Local(IpAddr::V4(ip)) = a
                && !ip.is_loopback()
            {
                out.extend(Ipv4Prefix::new(*ip, m.header.prefix_len));
            }
        }
    }
    out.sort_by_key(|p| (u32::from(p.addr), p.len));
    out.dedup();
    out
}

/// [`Netlink::prefixes_to_protect`] in the calling thread's namespace,
/// with one blocking socket: for a caller already in the pod's namespace
/// (the ADD's one trip there, `Link::open_looking`), which then needs no
/// connection, thread or trip of its own before the first DISCOVER.
pub fn prefixes_to_protect_here(except: u32) -> io::Result<Vec<Ipv4Prefix>> {
    prefixes_to_protect_on(&route_socket_here()?, except)
}

/// [`prefixes_to_protect_here`] on `sock`, a route socket of the namespace
/// to read ([`route_socket_here`]).
pub fn prefixes_to_protect_on(
    sock: &rtnetlink::sys::Socket,
    except: u32,
) -> io::Result<Vec<Ipv4Prefix>> {
    use rtnetlink::packet_route::RouteNetlinkMessage;

    let get_routes = RouteMessageBuilder::<Ipv4Addr>::new().build();
    let routes: Vec<KernelRoute> = dump(sock, RouteNetlinkMessage::GetRoute(get_routes), 1)?
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => KernelRoute::from_message(r),
            _ => None,
        })
        .collect();
    let mut get_addresses = AddressMessage::default();
    get_addresses.header.family = rtnetlink::packet_route::AddressFamily::Inet;
    let addresses: Vec<AddressMessage> =
        dump(sock, RouteNetlinkMessage::GetAddress(get_addresses), 2)?
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => Some(a),
                _ => None,
            })
            .collect();
    Ok(protected_prefixes(&routes, &addresses, Some(except)))
}

/// Where a netlink TC filter hangs: the `clsact` qdisc's ingress or egress
/// hook (`TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcHook {
    Ingress,
    Egress,
}

impl TcHook {
    const fn parent(self) -> u32 {
        match self {
            TcHook::Ingress => 0xFFFF_FFF2,
            TcHook::Egress => 0xFFFF_FFF3,
        }
    }
}

/// Asks whether a netlink TC filter running one BPF program is still on
/// an interface: on kernels before tcx (6.6) a TC program is such a
/// filter, not a BPF link, and the kernel has no link id to ask about —
/// `tc filter del` or the `clsact` qdisc's deletion removes it without a
/// trace anywhere else. The socket is opened in the interface's namespace
/// and stays bound to it, so a check needs no trip into the namespace.
pub struct FilterWatch {
    sock: rtnetlink::sys::Socket,
    ifindex: u32,
    hook: TcHook,
    prog_id: u32,
    seq: std::sync::atomic::AtomicU32,
}

impl FilterWatch {
    /// Opens the watch in the calling thread's namespace.
    pub fn open_here(ifindex: u32, hook: TcHook, prog_id: u32) -> io::Result<Self> {
        use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        // A dump is always answered; a second's bound keeps a wedged
        // kernel from holding the caller (the datapath's lock) for ever.
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: a valid socket and a `timeval` of the size given.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            sock,
            ifindex,
            hook,
            prog_id,
            seq: std::sync::atomic::AtomicU32::new(1),
        })
    }

    /// Whether the filter is still there: `false` when the hook holds no
    /// filter running the program (or the device is gone).
    pub fn present(&self) -> io::Result<bool> {
        use rtnetlink::packet_route::RouteNetlinkMessage;
        use rtnetlink::packet_route::tc::TcMessage;

        let mut msg = TcMessage::default();
        msg.header.index = i32::try_from(self.ifindex).unwrap_or(i32::MAX);
        msg.header.parent = self.hook.parent().into();
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match dump(&self.sock, RouteNetlinkMessage::GetTrafficFilter(msg), seq) {
            Ok(filters) => Ok(filters.iter().any(|m| match m {
                RouteNetlinkMessage::NewTrafficFilter(f) => runs_prog(f, self.prog_id),
                _ => false,
            })),
            // The device is gone (a missing device or qdisc is otherwise
            // an empty dump).
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Whether the filter message `f` is a `bpf` filter running `prog_id`.
fn runs_prog(f: &rtnetlink::packet_route::tc::TcMessage, prog_id: u32) -> bool {
    use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};

    f.attributes.iter().any(|a| match a {
        TcAttribute::Options(opts) => opts
            .iter()
            .any(|o| matches!(o, TcOption::Bpf(TcFilterBpfOption::ProgId(id)) if *id == prog_id)),
        _ => false,
    })
}

/// Send one dump request on a blocking rtnetlink socket and collect its
/// answers up to the end of the dump.
fn dump(
    sock: &rtnetlink::sys::Socket,
    msg: rtnetlink::packet_route::RouteNetlinkMessage,
    seq: u32,
) -> io::Result<Vec<rtnetlink::packet_route::RouteNetlinkMessage>> {
    use rtnetlink::packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
    use rtnetlink::packet_route::RouteNetlinkMessage;

    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.header.sequence_number = seq;
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let mut out = Vec::new();
    loop {
        let (reply, _) = sock.recv_from_full()?;
        let mut at = 0;
        while at < reply.len() {
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[at..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = m.header.length as usize;
            if m.header.sequence_number == seq {
                match m.payload {
                    NetlinkPayload::InnerMessage(inner) => out.push(inner),
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => return Err(e.to_io()),
                    _ => {}
                }
            }
            if len == 0 {
                break;
            }
            at += len;
        }
        if reply.is_empty() {
            return Ok(out);
        }
    }
}

/// Send one request on `sock` and return its answer (an error answer as
/// its errno).
fn request(
    sock: &rtnetlink::sys::Socket,
    msg: rtnetlink::packet_route::RouteNetlinkMessage,
    seq: u32,
) -> io::Result<rtnetlink::packet_route::RouteNetlinkMessage> {
    use rtnetlink::packet_core::{NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
    use rtnetlink::packet_route::RouteNetlinkMessage;

    let mut req = NetlinkMessage::from(msg);
    req.header.flags = NLM_F_REQUEST;
    req.header.sequence_number = seq;
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    loop {
        let (reply, _) = sock.recv_from_full()?;
        let mut at = 0;
        while at < reply.len() {
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[at..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = m.header.length as usize;
            if m.header.sequence_number == seq {
                match m.payload {
                    NetlinkPayload::InnerMessage(inner) => return Ok(inner),
                    NetlinkPayload::Error(e) => return Err(e.to_io()),
                    _ => {}
                }
            }
            if len == 0 {
                break;
            }
            at += len;
        }
    }
}

/// A change to a link of the namespace, as [`LinkEvents`] hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link was made or changed (`RTM_NEWLINK`): what it is now.
    Changed(LinkDetails),
    /// A link was deleted (`RTM_DELLINK`), by index.
    Gone(u32),
}

/// One unsolicited message of a route socket's multicast groups.
type RouteNotice = (
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
);
/// What a route socket subscribed to multicast groups hears.
type RouteNotices = futures::channel::mpsc::UnboundedReceiver<RouteNotice>;

/// The link changes of the agent's namespace (`RTNLGRP_LINK`), from the
/// moment it is opened. Only whole-device messages count: a bridge's own
/// notices about its ports (`AF_BRIDGE`) are skipped, the device's own
/// `RTM_NEWLINK` says the same.
#[derive(Debug)]
pub struct LinkEvents {
    messages: RouteNotices,
    task: JoinHandle<()>,
}

impl LinkEvents {
    /// Subscribes in the calling thread's namespace; must run inside the
    /// tokio runtime that will poll it.
    pub fn open_here() -> io::Result<Self> {
        let (conn, _handle, messages) =
            rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link])?;
        Ok(Self {
            messages,
            task: tokio::spawn(conn),
        })
    }

    /// The next change; `None` once the subscription has ended (its socket
    /// failed: the caller opens another and reads again what it needs).
    pub async fn next(&mut self) -> Option<LinkEvent> {
        use futures::StreamExt as _;
        use rtnetlink::packet_core::NetlinkPayload;
        use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};

        loop {
            let (msg, _) = self.messages.next().await?;
            let NetlinkPayload::InnerMessage(inner) = msg.payload else {
                continue;
            };
            match inner {
                RouteNetlinkMessage::NewLink(m)
                    if m.header.interface_family != AddressFamily::Bridge =>
                {
                    return Some(LinkEvent::Changed(LinkDetails::from_message(&m)));
                }
                RouteNetlinkMessage::DelLink(m)
                    if m.header.interface_family != AddressFamily::Bridge =>
                {
                    return Some(LinkEvent::Gone(m.header.index));
                }
                _ => {}
            }
        }
    }
}

/// A change the kernel announced to one IPv6 address
/// (`RTNLGRP_IPV6_IFADDR`): its link, the address, and where its duplicate
/// address detection stands ([`Dad6::Gone`] for a deleted address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr6Change {
    /// The link's index.
    pub ifindex: u32,
    /// The address.
    pub address: Ipv6Addr,
    /// Its state after the change.
    pub state: Dad6,
}

impl Addr6Change {
    /// The change an `RTM_NEWADDR` (`gone`: `RTM_DELADDR`) message
    /// describes; `None` for one that is not about an IPv6 address.
    fn of(m: &AddressMessage, gone: bool) -> Option<Self> {
        let address = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V6(a)) => Some(*a),
            _ => None,
        })?;
        let state = if gone {
            Dad6::Gone
        } else {
            Dad6::of(address_flags(m))
        };
        Some(Self {
            ifindex: m.header.index,
            address,
            state,
        })
    }
}

/// An address message's flags: the 32-bit attribute when the kernel sends
/// it (it always has since 3.14), else the header's eight bits.
fn address_flags(m: &AddressMessage) -> AddressFlags {
    m.attributes
        .iter()
        .find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        })
        .unwrap_or_else(|| AddressFlags::from_bits_retain(u32::from(m.header.flags.bits())))
}

/// The kernel's notices of IPv6 address changes in one namespace
/// (`RTNLGRP_IPV6_IFADDR`), from the moment it is opened: what a wait for
/// duplicate address detection wakes on, instead of reading the address's
/// flags on a timer.
#[derive(Debug)]
pub struct Addr6Events {
    messages: RouteNotices,
}

impl Addr6Events {
    /// The next change; `None` once the subscription has ended (its socket
    /// failed: the caller reads the state it needs instead).
    pub async fn next(&mut self) -> Option<Addr6Change> {
        use futures::StreamExt as _;
        use rtnetlink::packet_core::NetlinkPayload;
        use rtnetlink::packet_route::RouteNetlinkMessage;

        loop {
            let (msg, _) = self.messages.next().await?;
            let NetlinkPayload::InnerMessage(inner) = msg.payload else {
                continue;
            };
            let change = match inner {
                RouteNetlinkMessage::NewAddress(m) => Addr6Change::of(&m, false),
                RouteNetlinkMessage::DelAddress(m) => Addr6Change::of(&m, true),
                _ => None,
            };
            if let Some(c) = change {
                return Some(c);
            }
        }
    }

    /// The next change `wanted` says yes to; `None` once the subscription
    /// has ended.
    pub async fn next_where(
        &mut self,
        mut wanted: impl FnMut(&Addr6Change) -> bool,
    ) -> Option<Addr6Change> {
        loop {
            let c = self.next().await?;
            if wanted(&c) {
                return Some(c);
            }
        }
    }
}

/// Notices fed to an [`Addr6Events`] by hand (tests).
#[cfg(test)]
pub(crate) struct FakeAddr6(futures::channel::mpsc::UnboundedSender<RouteNotice>);

#[cfg(test)]
impl FakeAddr6 {
    /// An [`Addr6Events`] that hears what this is told to announce.
    pub(crate) fn new() -> (Self, Addr6Events) {
        let (tx, messages) = futures::channel::mpsc::unbounded();
        (Self(tx), Addr6Events { messages })
    }

    fn send(&self, m: rtnetlink::packet_route::RouteNetlinkMessage) {
        let msg = rtnetlink::packet_core::NetlinkMessage::from(m);
        self.0
            .unbounded_send((msg, rtnetlink::sys::SocketAddr::new(0, 0)))
            .expect("the events are read");
    }

    fn message(ifindex: u32, addr: Ipv6Addr, flags: AddressFlags) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = rtnetlink::packet_route::AddressFamily::Inet6;
        m.header.index = ifindex;
        m.header.prefix_len = 64;
        m.attributes
            .push(AddressAttribute::Address(IpAddr::V6(addr)));
        m.attributes.push(AddressAttribute::Flags(flags));
        m
    }

    /// The kernel's `RTM_NEWADDR` for `addr` on `ifindex` with `flags`.
    pub(crate) fn announce(&self, ifindex: u32, addr: Ipv6Addr, flags: AddressFlags) {
        let m = Self::message(ifindex, addr, flags);
        self.send(rtnetlink::packet_route::RouteNetlinkMessage::NewAddress(m));
    }

    /// The kernel's `RTM_DELADDR` for `addr` on `ifindex`.
    pub(crate) fn delete(&self, ifindex: u32, addr: Ipv6Addr) {
        let m = Self::message(ifindex, addr, AddressFlags::empty());
        self.send(rtnetlink::packet_route::RouteNetlinkMessage::DelAddress(m));
    }
}

impl Drop for LinkEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_filter_runs_our_program_only_when_its_bpf_options_name_its_id() {
        use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcMessage, TcOption};

        let filter = |opts: Vec<TcOption>| {
            let mut f = TcMessage::default();
            f.attributes.push(TcAttribute::Kind("bpf".to_owned()));
            f.attributes.push(TcAttribute::Options(opts));
            f
        };
        let ours = filter(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgName("xdhcp_tc".to_owned())),
            TcOption::Bpf(TcFilterBpfOption::ProgId(42)),
        ]);
        assert!(runs_prog(&ours, 42));
        assert!(!runs_prog(&ours, 43), "another program's filter");
        // The chain's head entry of a dump carries no options.
        let head = {
            let mut f = TcMessage::default();
            f.attributes.push(TcAttribute::Kind("bpf".to_owned()));
            f
        };
        assert!(!runs_prog(&head, 42));
        assert!(!runs_prog(&filter(Vec::new()), 42));
    }
    use xdhcp_engine::Route;

    fn lease(routes: Vec<Route>) -> Lease {
        Lease {
            address: Ipv4Addr::new(192, 0, 2, 10),
            prefix_len: 24,
            server_id: Ipv4Addr::new(192, 0, 2, 1),
            server_mac: None,
            routers: vec![Ipv4Addr::new(192, 0, 2, 1)],
            routes,
            dns_servers: Vec::new(),
            domain_name: None,
            search: Vec::new(),
            mtu: None,
            lease_time: Duration::from_mins(2),
            t1: Duration::from_mins(1),
            t2: Duration::from_secs(105),
            acquired_unix_ms: 0,
            rejected_routes: Vec::new(),
        }
    }

    #[test]
    fn routes_from_option_3_and_121() {
        assert_eq!(
            lease_routes(&lease(Vec::new())),
            vec![Ipv4Route {
                dest: Ipv4Addr::UNSPECIFIED,
                prefix_len: 0,
                gateway: Some(Ipv4Addr::new(192, 0, 2, 1)),
            }]
        );
        let l = lease(vec![
            Route {
                dest: Ipv4Addr::new(198, 51, 100, 0),
                prefix_len: 24,
                gateway: Ipv4Addr::new(192, 0, 2, 254),
            },
            Route {
                dest: Ipv4Addr::new(203, 0, 113, 0),
                prefix_len: 24,
                gateway: Ipv4Addr::UNSPECIFIED,
            },
        ]);
        let routes = lease_routes(&l);
        // Option 121 replaces option 3: no default route via 192.0.2.1.
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0].gateway, Some(Ipv4Addr::new(192, 0, 2, 254)));
        assert_eq!(routes[1].gateway, None, "router 0.0.0.0 means on-link");
    }
}

//! The DHCP packet path: capture of server replies (eBPF ring buffer, or
//! AF_PACKET as the fallback) and the raw-socket sender.

pub mod afpacket;
pub mod ebpf;
pub mod frame;
pub mod rawsock;

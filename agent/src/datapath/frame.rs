//! Ethernet/IPv4/UDP framing around DHCP payloads, in both directions.

//! Which addresses an http action may reach (issue 32, least privilege inside): a global unicast
//! address, or one the worker's allow-list (`ATTUNE_WORKER_HTTP_ALLOW`) names. Everything else is
//! refused by default: loopback, private (RFC 1918, IPv6 unique-local `fc00::/7`), link-local
//! (the cloud metadata address among them), unspecified, multicast, broadcast, CGNAT
//! `100.64.0.0/10`, documentation, benchmarking and reserved blocks, and in IPv6 anything outside
//! global unicast `2000::/3` or in its special-purpose blocks (Teredo, 6to4, documentation). An
//! IPv6 address that embeds an IPv4 one (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64
//! `64:ff9b::a.b.c.d`) is judged as that IPv4 address, so no spelling reaches what the plain one
//! may not.
//!
//! The rule is pure: `crate::http` applies it to the addresses a name resolves to (before it
//! connects) and to an address written in the URL.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The setting that lists the networks allowed besides global addresses.
pub const ALLOW_SETTING: &str = "ATTUNE_WORKER_HTTP_ALLOW";

/// A network: an address and how many of its leading bits are the network's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr { network: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    const fn v6(first: u16, second: u16, prefix: u8) -> Cidr {
        Cidr { network: IpAddr::V6(Ipv6Addr::new(first, second, 0, 0, 0, 0, 0, 0)), prefix }
    }

    /// Whether `ip` is in this network (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(network), IpAddr::V4(ip)) => u32::from(ip) & mask_v4(self.prefix) == u32::from(network),
            (IpAddr::V6(network), IpAddr::V6(ip)) => u128::from(ip) & mask_v6(self.prefix) == u128::from(network),
            _ => false,
        }
    }
}

/// The leading `prefix` bits set (`prefix` at most 32; 0 is no bit).
fn mask_v4(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// The leading `prefix` bits set (`prefix` at most 128; 0 is no bit).
fn mask_v6(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

impl FromStr for Cidr {
    type Err = String;

    /// `address/prefix` (`10.0.0.0/8`, `fd00::/8`), or an address alone (one host: `/32` or
    /// `/128`). The bits past the prefix must be zero: `10.1.2.3/8` is refused rather than read
    /// as `10.0.0.0/8`, since whoever wrote it meant something else.
    fn from_str(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network = IpAddr::from_str(address).map_err(|_| format!("'{address}' is not an IPv4 or IPv6 address"))?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => {
                let digits = !prefix.is_empty() && prefix.len() <= 3 && prefix.bytes().all(|b| b.is_ascii_digit());
                match prefix.parse::<u8>() {
                    Ok(prefix) if digits && prefix <= bits => prefix,
                    _ => return Err(format!("the prefix length must be a number from 0 to {bits}")),
                }
            }
        };
        let cidr = Cidr { network, prefix };
        if !cidr.contains(network) {
            let masked = match network {
                IpAddr::V4(ip) => IpAddr::V4(Ipv4Addr::from(u32::from(ip) & mask_v4(prefix))),
                IpAddr::V6(ip) => IpAddr::V6(Ipv6Addr::from(u128::from(ip) & mask_v6(prefix))),
            };
            return Err(format!("bits are set past the /{prefix} prefix (the network is {masked}/{prefix})"));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The networks an http action may reach besides global addresses; empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Cidr>);

impl AllowList {
    /// Comma-separated CIDRs (spaces around an entry and empty entries ignored). `Err` is the
    /// first entry that is not one, and why.
    pub fn parse(text: &str) -> Result<AllowList, (String, String)> {
        let entries = text.split(',').map(str::trim).filter(|entry| !entry.is_empty());
        entries
            .map(|entry| entry.parse().map_err(|reason| (entry.to_string(), reason)))
            .collect::<Result<_, _>>()
            .map(AllowList)
    }

    /// Whether an http action may connect to `ip`: it is global, or allowed.
    pub fn admits(&self, ip: IpAddr) -> bool {
        let allowed = |ip: IpAddr| self.0.iter().any(|cidr| cidr.contains(ip));
        match ip {
            IpAddr::V4(v4) => allowed(ip) || is_global_v4(v4),
            IpAddr::V6(v6) => match embedded_v4(v6) {
                Some(v4) => allowed(ip) || allowed(IpAddr::V4(v4)) || is_global_v4(v4),
                None => allowed(ip) || is_global_v6(v6),
            },
        }
    }
}

/// IPv4 blocks that are not global (IANA's special-purpose registry, RFC 6890 and after).
const NOT_GLOBAL_V4: &[Cidr] = &[
    Cidr::v4(0, 0, 0, 0, 8),       // "this network", 0.0.0.0 (unspecified) among it
    Cidr::v4(10, 0, 0, 0, 8),      // private (RFC 1918)
    Cidr::v4(100, 64, 0, 0, 10),   // shared address space, carrier-grade NAT (RFC 6598)
    Cidr::v4(127, 0, 0, 0, 8),     // loopback
    Cidr::v4(169, 254, 0, 0, 16),  // link-local, the cloud metadata service among it
    Cidr::v4(172, 16, 0, 0, 12),   // private (RFC 1918)
    Cidr::v4(192, 0, 0, 0, 24),    // IETF protocol assignments
    Cidr::v4(192, 0, 2, 0, 24),    // documentation (TEST-NET-1)
    Cidr::v4(192, 88, 99, 0, 24),  // 6to4 relay anycast (deprecated)
    Cidr::v4(192, 168, 0, 0, 16),  // private (RFC 1918)
    Cidr::v4(198, 18, 0, 0, 15),   // benchmarking
    Cidr::v4(198, 51, 100, 0, 24), // documentation (TEST-NET-2)
    Cidr::v4(203, 0, 113, 0, 24),  // documentation (TEST-NET-3)
    Cidr::v4(224, 0, 0, 0, 4),     // multicast
    Cidr::v4(240, 0, 0, 0, 4),     // reserved, 255.255.255.255 (broadcast) among it
];

/// IPv6 global unicast, and the blocks inside it that are not global.
const GLOBAL_UNICAST_V6: Cidr = Cidr::v6(0x2000, 0, 3);
const NOT_GLOBAL_V6: &[Cidr] = &[
    Cidr::v6(0x2001, 0, 23),      // IETF protocol assignments, Teredo (2001::/32) among them
    Cidr::v6(0x2001, 0x0db8, 32), // documentation
    Cidr::v6(0x2002, 0, 16),      // 6to4: an IPv4 address inside, reached through a relay
    Cidr::v6(0x3fff, 0, 20),      // documentation (RFC 9637)
];

fn is_global_v4(ip: Ipv4Addr) -> bool {
    !NOT_GLOBAL_V4.iter().any(|cidr| cidr.contains(IpAddr::V4(ip)))
}

fn is_global_v6(ip: Ipv6Addr) -> bool {
    GLOBAL_UNICAST_V6.contains(IpAddr::V6(ip)) && !NOT_GLOBAL_V6.iter().any(|cidr| cidr.contains(IpAddr::V6(ip)))
}

/// The IPv4 address an IPv6 one stands for: mapped (`::ffff:0:0/96`), compatible (`::/96`, but
/// `::` and `::1`, which are IPv6's own unspecified and loopback) or NAT64 (`64:ff9b::/96`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let [_, _, _, _, _, _, high, low] = ip.segments();
    let v4 = Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    match ip.segments() {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(v4),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some(v4),
        _ => None,
    }
}

/// What a refused action is told: the host as the URL writes it, and the setting that would allow
/// it; nothing about the destination (no connection was tried).
pub fn refusal(host: &str) -> String {
    format!(
        "http actions may not reach {host}: loopback, private and other non-global addresses are refused \
         unless {ALLOW_SETTING} allows them"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_cidr_contains_its_network_and_nothing_past_it() {
        let ten = cidr("10.0.0.0/8");
        assert!(ten.contains(ip("10.0.0.0")) && ten.contains(ip("10.255.255.255")));
        assert!(!ten.contains(ip("11.0.0.0")) && !ten.contains(ip("9.255.255.255")));
        assert!(!ten.contains(ip("::ffff:10.0.0.1")), "never across families");
        let host = cidr("127.0.0.1/32");
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let odd = cidr("100.64.0.0/10");
        assert!(odd.contains(ip("100.127.255.255")) && !odd.contains(ip("100.128.0.0")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")), "/0 is every IPv4 address");
        assert!(cidr("::/0").contains(ip("2001:db8::1")) && !cidr("::/0").contains(ip("1.2.3.4")));
        let ula = cidr("fc00::/7");
        assert!(ula.contains(ip("fd12:3456::1")) && ula.contains(ip("fc00::")) && !ula.contains(ip("fe00::")));
        assert!(cidr("::1/128").contains(ip("::1")) && !cidr("::1/128").contains(ip("::2")));
    }

    #[test]
    fn cidrs_parse_strictly() {
        assert_eq!(cidr("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("127.0.0.1").to_string(), "127.0.0.1/32", "an address alone is one host");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        assert_eq!(cidr("FD00::/8").to_string(), "fd00::/8");
        assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
        let refused = [
            ("10.0.0.0/33", "from 0 to 32"),
            ("::/129", "from 0 to 128"),
            ("10.0.0.0/", "from 0 to 32"),
            ("10.0.0.0/+8", "from 0 to 32"),
            ("10.0.0.0/-1", "from 0 to 32"),
            ("10.0.0.0/8/8", "from 0 to 32"),
            ("10.0.0.0/0008", "from 0 to 32"),
            ("10.0.0.0/ 8", "from 0 to 32"),
            ("10.1.2.3/8", "past the /8 prefix (the network is 10.0.0.0/8)"),
            ("fd12::1/8", "past the /8 prefix (the network is fd00::/8)"),
            ("127.0.0.1/0", "past the /0 prefix (the network is 0.0.0.0/0)"),
            ("10.0.0/8", "not an IPv4 or IPv6 address"),
            ("010.0.0.0/8", "not an IPv4 or IPv6 address"),
            ("localhost/32", "not an IPv4 or IPv6 address"),
            ("[::1]/128", "not an IPv4 or IPv6 address"),
            ("/8", "not an IPv4 or IPv6 address"),
            ("", "not an IPv4 or IPv6 address"),
        ];
        for (text, reason) in refused {
            let error = text.parse::<Cidr>().unwrap_err();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn an_allow_list_is_comma_separated_and_names_its_first_bad_entry() {
        assert_eq!(AllowList::parse("").unwrap(), AllowList::default());
        assert_eq!(AllowList::parse(" , ").unwrap(), AllowList::default());
        let list = AllowList::parse("127.0.0.1/32, 10.0.0.0/8,::1/128,").unwrap();
        assert_eq!(list.0, [cidr("127.0.0.1/32"), cidr("10.0.0.0/8"), cidr("::1/128")]);
        let (entry, reason) = AllowList::parse("127.0.0.1/32, 10.0.0.0/33 ,nonsense").unwrap_err();
        assert_eq!(entry, "10.0.0.0/33");
        assert!(reason.contains("from 0 to 32"), "{reason}");
        assert_eq!(AllowList::parse("127.0.0.1/32;10.0.0.0/8").unwrap_err().0, "127.0.0.1/32;10.0.0.0/8");
    }

    #[test]
    fn by_default_only_global_addresses_are_admitted() {
        let none = AllowList::default();
        let refused = [
            "127.0.0.1",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456:789a::1",
            "fec0::1",
            "ff02::1",
            "ff0e::1",
            "100::1",
            "64:ff9b:1::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
            "2002:7f00:1::1",
            "3fff::1",
            "5f00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
        ];
        for text in refused {
            assert!(!none.admits(ip(text)), "{text} is refused");
        }
        let admitted = [
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "169.253.255.255",
            "192.0.1.1",
            "192.169.0.1",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "2001:200::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ];
        for text in admitted {
            assert!(none.admits(ip(text)), "{text} is admitted");
        }
    }

    #[test]
    fn the_allow_list_admits_what_it_names_in_every_spelling_and_nothing_more() {
        let list = AllowList::parse("127.0.0.1/32,10.0.0.0/8,::1/128").unwrap();
        for text in ["127.0.0.1", "::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::7f00:1", "10.9.8.7", "::1", "8.8.8.8"] {
            assert!(list.admits(ip(text)), "{text} is admitted");
        }
        for text in ["127.0.0.2", "192.168.1.1", "::2", "::", "fe80::1", "169.254.169.254", "::ffff:127.0.0.2"] {
            assert!(!list.admits(ip(text)), "{text} is still refused");
        }
        let v6 = AllowList::parse("fd00::/8").unwrap();
        assert!(v6.admits(ip("fd00::5")) && !v6.admits(ip("fc00::5")));
    }

    #[test]
    fn the_refusal_names_the_host_and_the_setting() {
        assert_eq!(
            refusal("127.0.0.1"),
            "http actions may not reach 127.0.0.1: loopback, private and other non-global addresses are refused \
             unless ATTUNE_WORKER_HTTP_ALLOW allows them"
        );
    }
}

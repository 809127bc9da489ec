//! IP networks (`203.0.113.0/24`, `2001:db8::/32`) and the prefix grouping of client keys.
//!
//! Written here rather than taken from a crate: the layer needs parsing, `contains` and masking,
//! about a hundred lines, and they are tested below.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP network: an address and a prefix length, with the host bits cleared.
///
/// IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`, what a dual-stack socket reports for an IPv4
/// peer) are treated as the IPv4 address they carry, both in a `Cidr` and in
/// [`Cidr::contains`].
///
/// # Examples
/// ```
/// use tollgate::tower::Cidr;
/// let net: Cidr = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// let host: Cidr = "::1".parse()?; // a bare address is a /32 or /128
/// assert_eq!(host.prefix(), 128);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a network could not be parsed or built.
///
/// # Examples
/// ```
/// use tollgate::tower::{Cidr, CidrError};
/// assert_eq!("10.0.0.0/33".parse::<Cidr>(), Err(CidrError::Prefix("33".into())));
/// assert!(matches!("intranet/8".parse::<Cidr>(), Err(CidrError::Address(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address.
    #[error("`{0}` is not an IP address")]
    Address(String),
    /// The prefix length is not a number, or exceeds 32 (IPv4) / 128 (IPv6).
    #[error("`{0}` is not a valid prefix length for this address family")]
    Prefix(String),
}

impl Cidr {
    /// The network of `addr` with `prefix` leading bits; the host bits are cleared.
    ///
    /// # Errors
    /// [`CidrError::Prefix`] if `prefix` exceeds the address's width.
    ///
    /// # Examples
    /// ```
    /// use std::net::IpAddr;
    /// use tollgate::tower::{Cidr, CidrError};
    /// let ip: IpAddr = "192.0.2.77".parse()?;
    /// // The host bits are cleared: the network, not the address given.
    /// assert_eq!(Cidr::new(ip, 24)?.to_string(), "192.0.2.0/24");
    /// assert_eq!(Cidr::new(ip, 40), Err(CidrError::Prefix("40".into())));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Cidr, CidrError> {
        let addr = addr.to_canonical();
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(CidrError::Prefix(prefix.to_string()));
        }
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// The network address (host bits zero).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::Cidr;
    /// let net: Cidr = "2001:db8:1234::1/32".parse()?;
    /// assert_eq!(net.addr(), "2001:db8::".parse::<std::net::IpAddr>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::Cidr;
    /// assert_eq!("10.0.0.0/8".parse::<Cidr>()?.prefix(), 8);
    /// // A bare IPv4 address is one host.
    /// assert_eq!("10.0.0.1".parse::<Cidr>()?.prefix(), 32);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address counts as IPv4).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::Cidr;
    /// let net: Cidr = "192.0.2.0/24".parse()?;
    /// assert!(net.contains("192.0.2.200".parse()?));
    /// // What a dual-stack socket reports for an IPv4 peer: the same address.
    /// assert!(net.contains("::ffff:192.0.2.200".parse()?));
    /// assert!(!net.contains("192.0.3.1".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn contains(&self, ip: IpAddr) -> bool {
        // On the integers (`mask` builds and compares whole `IpAddr`s): called for every
        // trusted-proxy hop of every request.
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                ip.to_bits() & v4_mask(self.prefix) == net.to_bits()
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                ip.to_bits() & v6_mask(self.prefix) == net.to_bits()
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::Address(addr.to_string()))?;
        let addr = addr.to_canonical();
        let prefix = match prefix {
            None => match addr {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
            Some(p) => {
                // Digits only: `u8::from_str` would also take a leading `+`.
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(CidrError::Prefix(p.to_string()));
                }
                p.parse().map_err(|_| CidrError::Prefix(p.to_string()))?
            }
        };
        Cidr::new(addr, prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `ip` with all but its first `prefix` bits cleared (`prefix` at most the address's width;
/// larger values keep the whole address).
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(v4.to_bits() & v4_mask(prefix))),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & v6_mask(prefix))),
    }
}

/// The IPv4 netmask of `prefix` bits (all of them past 32).
fn v4_mask(prefix: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0)
}

/// The IPv6 netmask of `prefix` bits (all of them past 128).
fn v6_mask(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_networks_and_clears_host_bits() {
        let net: Cidr = "192.168.1.77/24".parse().unwrap();
        assert_eq!(net.to_string(), "192.168.1.0/24");
        let net: Cidr = "2001:db8:aa:bb::1/56".parse().unwrap();
        assert_eq!(net.to_string(), "2001:db8:aa::/56");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().prefix(), 0);
        assert_eq!(" 127.0.0.1 ".parse::<Cidr>().unwrap().prefix(), 32);
        // A mapped address is its IPv4 address.
        assert_eq!(
            "::ffff:10.0.0.1/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
    }

    #[test]
    fn refuses_malformed_networks() {
        for bad in [
            "",
            "/",
            "1.2.3.4/",
            "1.2.3.4/33",
            "::/129",
            "1.2.3.4/+8",
            "1.2.3.4/-1",
            "x/8",
            "1.2.3/8",
            "1.2.3.4/8/8",
            "1.2.3.4/999999999999999999999",
        ] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn contains_respects_family_and_prefix() {
        let v4: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(v4.contains(ip("10.255.255.255")));
        assert!(v4.contains(ip("::ffff:10.0.0.1")));
        assert!(!v4.contains(ip("11.0.0.0")));
        assert!(!v4.contains(ip("::a00:1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")));
        assert!(!all.contains(ip("::1")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        let any6: Cidr = "::/0".parse().unwrap();
        assert!(any6.contains(ip("fe80::1")));
        let host: Cidr = "127.0.0.1".parse().unwrap();
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let host6: Cidr = "2001:db8::1/128".parse().unwrap();
        assert!(host6.contains(ip("2001:db8::1")) && !host6.contains(ip("2001:db8::2")));
        let odd: Cidr = "192.0.2.128/25".parse().unwrap();
        assert!(odd.contains(ip("192.0.2.255")) && !odd.contains(ip("192.0.2.127")));
    }

    #[test]
    fn mask_groups_by_prefix() {
        assert_eq!(mask(ip("2001:db8:1:2ff:1::1"), 56), ip("2001:db8:1:200::"));
        assert_eq!(mask(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(mask(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_eq!(mask(ip("1.2.3.4"), 32), ip("1.2.3.4"));
        assert_eq!(mask(ip("1.2.3.4"), 0), ip("0.0.0.0"));
    }
}

//! The allow-list: which hosts and ports a run may reach through the egress
//! proxy, how a request narrows it, and which resolved addresses a listed
//! name may lead to.
//!
//! Entries (`allowed_hosts`):
//!
//! * `host` (any port), `host:port`;
//! * `*.domain`: the subdomains of `domain` (not `domain` itself), any port
//!   or `*.domain:port`;
//! * an IP address or a CIDR block, with an optional `:port` (IPv6 in
//!   brackets when a port follows: `[::1]:8080`, `[fd00::/8]:443`).
//!
//! Names compare case-insensitively, without a trailing dot.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// What an entry matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// One host name.
    Name(String),
    /// The subdomains of a domain.
    Subdomains(String),
    /// Addresses of a block (a single address is a /32 or /128).
    Net(IpNet),
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    target: Target,
    /// `None`: any port.
    port: Option<u16>,
    /// The entry as written, for messages and `/list-envs`.
    text: String,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A name as compared: lower case, no trailing dot.
fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn is_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !label.starts_with('-')
        })
}

impl Rule {
    /// Parse one entry; the error says what is wrong with it.
    pub(crate) fn parse(text: &str) -> Result<Rule, String> {
        let entry = text.trim();
        let bad = |why: &str| format!("allowed_hosts entry {text:?}: {why}");
        if entry.is_empty() {
            return Err(bad("empty"));
        }
        let port = |p: &str| -> Result<u16, String> {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(bad("the port must be a number from 1 to 65535")),
                Ok(p) => Ok(p),
            }
        };
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("an opening [ without its ]"))?;
            let port = match after {
                "" => None,
                p => Some(port(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("after ] only :PORT may follow"))?,
                )?),
            };
            (inner, port)
        } else if entry.matches(':').count() > 1 {
            // A bare IPv6 address or block: no port.
            (entry, None)
        } else {
            match entry.rsplit_once(':') {
                Some((host, p)) => (host, Some(port(p)?)),
                None => (entry, None),
            }
        };
        let target = if let Ok(ip) = host.parse::<IpAddr>() {
            Target::Net(IpNet::from(ip))
        } else if let Ok(net) = host.parse::<IpNet>() {
            Target::Net(net.trunc())
        } else if let Some(domain) = host.strip_prefix("*.") {
            if !is_name(domain) {
                return Err(bad("not a host name after *."));
            }
            Target::Subdomains(normal(domain))
        } else if is_name(host) {
            Target::Name(normal(host))
        } else {
            return Err(bad(
                "not a host, *.domain, IP address or CIDR block (with an optional :port)",
            ));
        };
        Ok(Rule {
            target,
            port,
            text: entry.to_string(),
        })
    }

    fn port_covers(&self, port: Option<u16>) -> bool {
        match (self.port, port) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            (Some(_), None) => false,
        }
    }

    /// Whether every destination `other` allows, this entry allows too.
    fn covers(&self, other: &Rule) -> bool {
        if !self.port_covers(other.port) {
            return false;
        }
        match (&self.target, &other.target) {
            (Target::Name(a), Target::Name(b)) => a == b,
            (Target::Subdomains(d), Target::Name(n)) => n.ends_with(&format!(".{d}")),
            (Target::Subdomains(d), Target::Subdomains(e)) => {
                e == d || e.ends_with(&format!(".{d}"))
            }
            (Target::Net(a), Target::Net(b)) => a.contains(b),
            _ => false,
        }
    }

    /// Whether this entry lets a request name `host` (a name, or an IP
    /// literal) on `port`.
    fn allows(&self, host: &Host, port: u16) -> bool {
        if !self.port_covers(Some(port)) {
            return false;
        }
        match (&self.target, host) {
            (Target::Name(a), Host::Name(n)) => a == n,
            (Target::Subdomains(d), Host::Name(n)) => n.ends_with(&format!(".{d}")),
            (Target::Net(net), Host::Ip(ip)) => net.contains(ip),
            _ => false,
        }
    }

    /// Whether this entry lists address `ip` itself (an address or block).
    fn lists_address(&self, ip: &IpAddr, port: u16) -> bool {
        matches!(&self.target, Target::Net(net) if net.contains(ip)) && self.port_covers(Some(port))
    }
}

/// A destination as a request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Host {
    /// A host name, normalized.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

impl Host {
    /// A request's host: an address literal (IPv6 with or without brackets)
    /// or a name.
    pub(crate) fn parse(text: &str) -> Option<Host> {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Some(Host::Ip(ip));
        }
        is_name(text).then(|| Host::Name(normal(text)))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why the proxy refused a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No entry lists the host and port.
    NotListed,
    /// The host is listed by name but resolves to a special address
    /// (loopback, private, link-local, ...) that no entry lists.
    SpecialAddress(IpAddr),
    /// The destination is one of this server's own listening addresses.
    ServerAddress(IpAddr),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotListed => f.write_str("no allowed_hosts entry lists it"),
            Refusal::SpecialAddress(ip) => write!(
                f,
                "it resolves to {ip}, a loopback, private or link-local address that no allowed_hosts entry lists by address"
            ),
            Refusal::ServerAddress(ip) => write!(
                f,
                "{ip} is this server's own address, which only an allowed_hosts entry naming that address and port opens"
            ),
        }
    }
}

/// The addresses no listed name may lead to, unless an entry lists the
/// address itself: loopback, unspecified, private (RFC 1918, unique local),
/// link-local (cloud metadata at 169.254.169.254), shared (100.64/10),
/// multicast and broadcast.
pub(crate) fn is_special(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || (v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
                || v4.octets()[0] == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_special(&IpAddr::V4(v4));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

/// An allow-list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Policy {
    rules: Vec<Rule>,
}

impl Policy {
    /// Parse every entry; the first bad one is the error.
    pub(crate) fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Policy, String> {
        let rules = entries
            .iter()
            .map(|e| Rule::parse(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy { rules })
    }

    /// The entries as written.
    pub(crate) fn entries(&self) -> Vec<String> {
        self.rules.iter().map(|r| r.text.clone()).collect()
    }

    /// A request's own list, each entry within this one: a request may
    /// narrow the list, never widen it. The error names the first entry
    /// that widens it.
    pub(crate) fn narrow<S: AsRef<str>>(&self, asked: &[S]) -> Result<Policy, String> {
        let asked = Policy::parse(asked)?;
        for rule in &asked.rules {
            if !self.rules.iter().any(|mine| mine.covers(rule)) {
                return Err(format!(
                    "network.allowed_hosts entry {:?} is not within the server's allowed_hosts ({}): a request may only narrow the list",
                    rule.text,
                    if self.rules.is_empty() {
                        "none".to_string()
                    } else {
                        self.entries().join(", ")
                    }
                ));
            }
        }
        Ok(asked)
    }

    /// The entry that lets a request name `host` on `port`.
    pub(crate) fn check(&self, host: &Host, port: u16) -> Result<&Rule, Refusal> {
        self.rules
            .iter()
            .find(|r| r.allows(host, port))
            .ok_or(Refusal::NotListed)
    }

    /// Whether the proxy may connect to `ip` for a request that named
    /// `host` (allowed by `rule`): a special address only when an entry
    /// lists it by address, or when the request named `localhost` itself
    /// (a name that means loopback, RFC 6761) by an entry naming it; this
    /// server's own listening addresses only when an entry lists that
    /// address and port.
    pub(crate) fn check_address(
        &self,
        host: &Host,
        rule: &Rule,
        ip: IpAddr,
        port: u16,
        server: &[std::net::SocketAddr],
    ) -> Result<(), Refusal> {
        let listed = self.rules.iter().any(|r| {
            r.lists_address(&ip, port) && (r.port.is_some() || !server_has(server, ip, port))
        });
        if server_has(server, ip, port) && !listed {
            return Err(Refusal::ServerAddress(ip));
        }
        if !is_special(&ip) || listed {
            return Ok(());
        }
        let localhost = matches!(host, Host::Name(n) if n == "localhost")
            && rule.target == Target::Name("localhost".into());
        if localhost && ip.is_loopback() {
            return Ok(());
        }
        Err(Refusal::SpecialAddress(ip))
    }
}

fn server_has(server: &[std::net::SocketAddr], ip: IpAddr, port: u16) -> bool {
    server
        .iter()
        .any(|a| a.port() == port && (a.ip() == ip || a.ip().is_unspecified()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> Policy {
        Policy::parse(entries).unwrap()
    }

    fn host(h: &str) -> Host {
        Host::parse(h).unwrap()
    }

    #[test]
    fn entries_parse_as_written_and_bad_ones_say_why() {
        for good in [
            "pypi.org",
            "pypi.org:443",
            "*.pythonhosted.org",
            "10.0.0.1",
            "10.0.0.0/8:5432",
            "::1",
            "[::1]:8080",
            "fd00::/8",
            "[fd00::/8]:443",
            "localhost:8000",
        ] {
            assert!(Rule::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "pypi.org:0",
            "pypi.org:99999",
            "*.",
            "a b",
            "[::1",
            "[::1]x",
            "*",
        ] {
            let err = Rule::parse(bad).unwrap_err();
            assert!(err.contains("allowed_hosts entry"), "{bad}: {err}");
        }
    }

    #[test]
    fn names_ports_subdomains_and_blocks_match() {
        let p = policy(&[
            "pypi.org:443",
            "*.pythonhosted.org",
            "10.1.0.0/16:80",
            "Example.TEST.",
        ]);
        assert!(p.check(&host("PyPI.org"), 443).is_ok());
        assert_eq!(p.check(&host("pypi.org"), 80), Err(Refusal::NotListed));
        assert!(p.check(&host("files.pythonhosted.org"), 443).is_ok());
        assert!(p.check(&host("pythonhosted.org"), 443).is_err());
        assert!(p.check(&host("10.1.2.3"), 80).is_ok());
        assert!(p.check(&host("10.2.0.1"), 80).is_err());
        assert!(p.check(&host("example.test"), 1).is_ok());
        // A name rule does not open an address literal, nor the reverse.
        assert!(
            policy(&["1.2.3.4"])
                .check(&host("one.example"), 80)
                .is_err()
        );
    }

    #[test]
    fn a_request_may_narrow_never_widen() {
        let p = policy(&["*.example.com", "10.0.0.0/8", "pypi.org:443"]);
        assert!(
            p.narrow(&[
                "api.example.com:443",
                "*.eu.example.com",
                "10.1.0.0/16:80",
                "pypi.org:443"
            ])
            .is_ok()
        );
        assert_eq!(p.narrow::<&str>(&[]).unwrap(), Policy::default());
        for wide in ["example.com", "pypi.org", "11.0.0.1", "10.0.0.0/7", "*.com"] {
            let err = p.narrow(&[wide]).unwrap_err();
            assert!(err.contains(wide), "{wide}: {err}");
        }
    }

    #[test]
    fn a_listed_name_may_not_lead_to_special_addresses() {
        let p = policy(&["example.test", "localhost:8000", "127.0.0.1:9000"]);
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let metadata: IpAddr = "169.254.169.254".parse().unwrap();
        let named = host("example.test");
        let rule = p.check(&named, 443).unwrap().clone();
        assert!(p.check_address(&named, &rule, public, 443, &[]).is_ok());
        for special in [
            loopback,
            metadata,
            "10.0.0.1".parse().unwrap(),
            "::ffff:192.168.1.1".parse().unwrap(),
        ] {
            assert_eq!(
                p.check_address(&named, &rule, special, 443, &[]),
                Err(Refusal::SpecialAddress(special))
            );
        }
        // `localhost` listed by name is loopback by definition.
        let local = host("localhost");
        let rule = p.check(&local, 8000).unwrap().clone();
        assert!(p.check_address(&local, &rule, loopback, 8000, &[]).is_ok());
        // An address listed by address is open, but not the server's own
        // address unless the entry names its port.
        let lit = host("127.0.0.1");
        let rule = p.check(&lit, 9000).unwrap().clone();
        let server = ["127.0.0.1:9000".parse().unwrap()];
        assert!(
            p.check_address(&lit, &rule, loopback, 9000, &server)
                .is_ok()
        );
        let wide = policy(&["127.0.0.0/8"]);
        let rule = wide.check(&lit, 9000).unwrap().clone();
        assert_eq!(
            wide.check_address(&lit, &rule, loopback, 9000, &server),
            Err(Refusal::ServerAddress(loopback))
        );
    }
}

//! The HTTP target policy: which hosts and addresses an HTTP target may reach. Owns the rules
//! (`--http-target-allow`, `--http-target-deny`), their parsing, and the verdict on a host and
//! the addresses it resolved to. It does no IO: resolving names is the worker's, and the server
//! judges at write time only what a URL says by itself.
//!
//! A rule is a network (`10.0.0.0/8`, `::1/128`; a bare address is a /32 or a /128) or a host
//! pattern (`api.example.com` exactly, `*.example.com` any subdomain of it but not itself, `*`
//! any host, IP literals included). The verdict:
//!
//! - The URL's host is judged by the host rules, each address it resolves to by the network
//!   rules. Among the rules of one kind that match, the most specific wins (the longest prefix;
//!   an exact host over `*.suffix`, a suffix of more labels over one of fewer, either over
//!   `*`), and deny wins a tie.
//! - A request is refused if the host's verdict is deny, or any address's is.
//! - Otherwise it is accepted if the host's verdict is allow (the operator named the host: this
//!   overrides the default below, never an address deny), or if every address is allowed by a
//!   rule, or is matched by none and is public.
//! - An address matched by no rule that is internal (loopback, unspecified, link-local,
//!   private, shared (carrier-grade NAT), unique-local, site-local, multicast, broadcast) is
//!   refused unless `internal_allowed`.
//!
//! An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, also the IPv4-compatible `::a.b.c.d` and the
//! IPv4-translated `::ffff:0:a.b.c.d`) is judged as its IPv4 address, and a network rule inside
//! `::ffff:0:0/96` as the IPv4 network it maps, so the spellings of one address always get one
//! verdict. An IPv6 address that reaches an IPv4 one through a translator or a tunnel — NAT64
//! `64:ff9b::/96`, 6to4 `2002::/16`, Teredo `2001::/32` (its client address) — is judged by the
//! embedded IPv4 address, and is also refused by a deny rule matching the IPv6 address itself; an
//! allow rule can only let it through by allowing the IPv4 address. The local-use NAT64 prefix
//! `64:ff9b:1::/48`, where the embedded address sits wherever the local translator puts it, is
//! internal: refused unless a rule allows it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// One allow or deny rule: a network or a host pattern. Written and sent as its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum EgressRule {
    Network(ipnet::IpNet),
    Host(HostPattern),
}

/// The host half of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This host name exactly (lower case, no trailing dot).
    Exact(String),
    /// Any name ending in `.` and this suffix; the suffix itself is not matched.
    Subdomains(String),
    /// Every host, IP literals included.
    Any,
}

/// Why a rule's text is not a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("an HTTP target rule must not be empty")]
    Empty,
    #[error("{rule:?} is not a network: {why}")]
    Network { rule: String, why: String },
    #[error("{rule:?} has bits set past its prefix length; did you mean {network}?")]
    HostBits { rule: String, network: String },
    #[error("{rule:?} is not a host pattern: {why}")]
    Host { rule: String, why: String },
}

/// How one kind of rule judges a host or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed(EgressRule),
    Denied(EgressRule),
    /// No rule of the kind matches.
    Unmatched,
}

/// Why a request is not allowed, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("host {host} is denied by the rule {rule}")]
    HostDenied { host: String, rule: String },
    #[error("{address}{via} is denied by the rule {rule}", via = via(host, address))]
    AddressDenied {
        host: String,
        address: IpAddr,
        rule: String,
    },
    #[error(
        "{address}{via} is a {kind} address; allow it with --http-target-allow {address}{or_host}",
        via = via(host, address),
        or_host = or_host(host, address)
    )]
    Internal {
        host: String,
        address: IpAddr,
        kind: &'static str,
    },
}

/// ` (the address of NAME)` when the host was a name, nothing for an IP literal.
fn via(host: &str, address: &IpAddr) -> String {
    if is_literal_of(host, address) {
        String::new()
    } else {
        format!(" (the address of {host})")
    }
}

fn or_host(host: &str, address: &IpAddr) -> String {
    if is_literal_of(host, address) {
        String::new()
    } else {
        format!(" or --http-target-allow {host}")
    }
}

fn is_literal_of(host: &str, address: &IpAddr) -> bool {
    literal(host).is_some_and(|ip| canonical(ip) == canonical(*address))
}

/// Which hosts and addresses HTTP targets may reach. The server holds it and hands it to every
/// worker that registers; the default, no rules and internal addresses allowed, lets a target
/// reach anything (what a server that sends no policy means).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressPolicy {
    pub allow: Vec<EgressRule>,
    pub deny: Vec<EgressRule>,
    /// Whether an address no rule matches may be internal (loopback, private, link-local...).
    pub internal_allowed: bool,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        EgressPolicy {
            allow: Vec::new(),
            deny: Vec::new(),
            internal_allowed: true,
        }
    }
}

impl EgressPolicy {
    /// Whether some request may be refused. When none can, a proxy may carry the requests;
    /// otherwise they must not go through one, since the address behind a proxy cannot be
    /// checked.
    pub fn restricts(&self) -> bool {
        !self.deny.is_empty() || !self.internal_allowed
    }

    /// One line for the log: what is in force.
    pub fn summary(&self) -> String {
        let list = |rules: &[EgressRule]| {
            rules
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = if self.internal_allowed {
            "internal addresses allowed".to_string()
        } else {
            "internal addresses refused unless allowed".to_string()
        };
        if !self.allow.is_empty() {
            text.push_str(&format!("; allow {}", list(&self.allow)));
        }
        if !self.deny.is_empty() {
            text.push_str(&format!("; deny {}", list(&self.deny)));
        }
        text
    }

    /// The host rules' verdict on a host (a name, or an IP literal with or without brackets).
    pub fn host_verdict(&self, host: &str) -> Verdict {
        let host = normal_host(host);
        let is_literal = literal(&host).is_some();
        self.verdict(|rule| match rule {
            EgressRule::Host(pattern) => pattern.specificity(&host, is_literal),
            EgressRule::Network(_) => None,
        })
    }

    /// The network rules' verdict on an address.
    pub fn address_verdict(&self, address: IpAddr) -> Verdict {
        let address = canonical(address);
        let own = |address: IpAddr| {
            self.verdict(|rule| match rule {
                EgressRule::Network(net) if net.contains(&address) => {
                    Some(u32::from(net.prefix_len()))
                }
                _ => None,
            })
        };
        match address {
            IpAddr::V6(v6) => match routed_v4(v6) {
                Some(v4) => match own(address) {
                    denied @ Verdict::Denied(_) => denied,
                    _ => own(IpAddr::V4(v4)),
                },
                None => own(address),
            },
            v4 => own(v4),
        }
    }

    /// The most specific matching rule; deny wins a tie.
    fn verdict(&self, specificity: impl Fn(&EgressRule) -> Option<u32>) -> Verdict {
        let mut best: Option<(u32, bool, &EgressRule)> = None;
        let rules = self
            .allow
            .iter()
            .map(|r| (r, false))
            .chain(self.deny.iter().map(|r| (r, true)));
        for (rule, deny) in rules {
            if let Some(s) = specificity(rule) {
                if best.is_none_or(|(bs, bdeny, _)| (s, deny) > (bs, bdeny)) {
                    best = Some((s, deny, rule));
                }
            }
        }
        match best {
            Some((_, true, rule)) => Verdict::Denied(rule.clone()),
            Some((_, false, rule)) => Verdict::Allowed(rule.clone()),
            None => Verdict::Unmatched,
        }
    }

    /// What can be judged of a host before it is resolved: refused only by a host rule.
    pub fn check_host(&self, host: &str) -> Result<Verdict, Refusal> {
        match self.host_verdict(host) {
            Verdict::Denied(rule) => Err(Refusal::HostDenied {
                host: normal_host(host),
                rule: rule.to_string(),
            }),
            verdict => Ok(verdict),
        }
    }

    /// The verdict on a host and the addresses it resolved to (for an IP literal, the address
    /// itself).
    pub fn check_addresses(&self, host: &str, addresses: &[IpAddr]) -> Result<(), Refusal> {
        let host_verdict = self.check_host(host)?;
        let host = normal_host(host);
        let verdicts: Vec<(IpAddr, Verdict)> = addresses
            .iter()
            .map(|a| (*a, self.address_verdict(*a)))
            .collect();
        for (address, verdict) in &verdicts {
            if let Verdict::Denied(rule) = verdict {
                return Err(Refusal::AddressDenied {
                    host,
                    address: *address,
                    rule: rule.to_string(),
                });
            }
        }
        if matches!(host_verdict, Verdict::Allowed(_)) || self.internal_allowed {
            return Ok(());
        }
        for (address, verdict) in verdicts {
            if verdict == Verdict::Unmatched {
                if let Some(kind) = internal_kind(address) {
                    return Err(Refusal::Internal {
                        host,
                        address,
                        kind,
                    });
                }
            }
        }
        Ok(())
    }

    /// What a URL says by itself: its host by the host rules and, for an IP literal, its
    /// address. A name's addresses are judged where it is resolved. A URL without a host is
    /// not this policy's to judge.
    pub fn check_url(&self, url: &url::Url) -> Result<(), Refusal> {
        match url.host() {
            Some(url::Host::Domain(name)) => self.check_host(name).map(|_| ()),
            Some(url::Host::Ipv4(ip)) => self.check_addresses(&ip.to_string(), &[IpAddr::V4(ip)]),
            Some(url::Host::Ipv6(ip)) => self.check_addresses(&ip.to_string(), &[IpAddr::V6(ip)]),
            None => Ok(()),
        }
    }
}

/// Lower case, without brackets or a trailing dot: the form rules are matched against.
fn normal_host(host: &str) -> String {
    let host = host.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// The address an IP-literal host spells, if it is one.
fn literal(host: &str) -> Option<IpAddr> {
    normal_host(host).parse().ok()
}

/// An IPv6 spelling of an IPv4 address (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`,
/// translated `::ffff:0:a.b.c.d`) as that IPv4 address; any other address as it is. `::` and
/// `::1` stay themselves: they are IPv6's own unspecified and loopback addresses.
fn canonical(address: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = address else {
        return address;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let [a, b, c, d, e, f, g, h] = v6.segments();
    let low = Ipv4Addr::from((u32::from(g) << 16) | u32::from(h));
    match [a, b, c, d, e, f] {
        [0, 0, 0, 0, 0, 0] if g != 0 => IpAddr::V4(low),
        [0, 0, 0, 0, 0xffff, 0] => IpAddr::V4(low),
        _ => address,
    }
}

/// The IPv4 address an IPv6 address reaches through a translator or a tunnel: NAT64's
/// well-known prefix (RFC 6052), 6to4 (RFC 3056), and a Teredo client (RFC 4380, whose
/// address is stored inverted).
pub fn routed_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let [a, b, c, d, e, f, g, h] = v6.segments();
    let v4 = |high: u16, low: u16| Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
    match (a, b) {
        (0x0064, 0xff9b) if [c, d, e, f] == [0, 0, 0, 0] => Some(v4(g, h)),
        (0x2002, _) => Some(v4(b, c)),
        (0x2001, 0x0000) => Some(v4(!g, !h)),
        _ => None,
    }
}

/// The local-use NAT64 prefix `64:ff9b:1::/48` (RFC 8215).
fn is_local_nat64(v6: Ipv6Addr) -> bool {
    let [a, b, c, ..] = v6.segments();
    [a, b, c] == [0x0064, 0xff9b, 0x0001]
}

/// What kind of internal address this is, or `None` for a public one. An address that reaches
/// an IPv4 one (see [`routed_v4`]) is what that address is.
pub fn internal_kind(address: IpAddr) -> Option<&'static str> {
    match canonical(address) {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) if is_local_nat64(v6) => Some("local-use NAT64"),
        IpAddr::V6(v6) => match routed_v4(v6) {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if a == 0 {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() {
        Some("private")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else {
        None
    }
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xffc0 == 0xfec0 {
        Some("site-local")
    } else if first & 0xfe00 == 0xfc00 {
        Some("unique-local")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

/// Host specificity: an exact name beats any suffix, which beats `*`.
const EXACT: u32 = 1_000;

impl HostPattern {
    /// How specifically this pattern matches `host` (normalized), if it does.
    fn specificity(&self, host: &str, is_literal: bool) -> Option<u32> {
        match self {
            HostPattern::Any => Some(0),
            _ if is_literal => None,
            HostPattern::Exact(name) => (name == host).then_some(EXACT),
            HostPattern::Subdomains(suffix) => {
                let matches = host
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.'));
                // `*.a.b` has two labels after the star; a name is at most 127 labels.
                let labels = u32::try_from(suffix.split('.').count()).unwrap_or(EXACT - 1);
                matches.then_some(labels.min(EXACT - 1))
            }
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Subdomains(suffix) => write!(f, "*.{suffix}"),
            HostPattern::Any => f.write_str("*"),
        }
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressRule::Network(net) => write!(f, "{net}"),
            EgressRule::Host(pattern) => write!(f, "{pattern}"),
        }
    }
}

impl FromStr for EgressRule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(RuleError::Empty);
        }
        if let Some(ip) = literal(text) {
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            return network(text, ip, prefix);
        }
        // Only what looks like an address before the `/` is a network: `http://x` is a host
        // pattern gone wrong, and is told so.
        let looks_like_network = |head: &str| {
            head.bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
        };
        if let Some((ip, prefix)) = text.split_once('/').filter(|(h, _)| looks_like_network(h)) {
            let bad = |why: &str| RuleError::Network {
                rule: text.to_string(),
                why: why.to_string(),
            };
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| bad("the part before / is not an IP address"))?;
            let prefix: u8 = prefix
                .parse()
                .map_err(|_| bad("the prefix length is not a number"))?;
            return network(text, ip, prefix);
        }
        host_pattern(text).map(EgressRule::Host)
    }
}

/// A network rule; an IPv4-mapped network as the IPv4 network it maps.
fn network(text: &str, ip: IpAddr, prefix: u8) -> Result<EgressRule, RuleError> {
    let net = ipnet::IpNet::new(ip, prefix).map_err(|_| RuleError::Network {
        rule: text.to_string(),
        why: format!(
            "the prefix length must be at most {}",
            if ip.is_ipv4() { 32 } else { 128 }
        ),
    })?;
    if net.trunc() != net {
        return Err(RuleError::HostBits {
            rule: text.to_string(),
            network: net.trunc().to_string(),
        });
    }
    let net = match ip {
        IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => ipnet::IpNet::new(IpAddr::V4(v4), prefix - 96).unwrap_or(net),
            None => net,
        },
        _ => net,
    };
    Ok(EgressRule::Network(net))
}

fn host_pattern(text: &str) -> Result<HostPattern, RuleError> {
    let bad = |why: &str| RuleError::Host {
        rule: text.to_string(),
        why: why.to_string(),
    };
    if text == "*" {
        return Ok(HostPattern::Any);
    }
    let lower = text.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let (wild, name) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    if !name.is_ascii() {
        return Err(bad(
            "write an internationalized name in its ASCII (xn--) form",
        ));
    }
    if name.len() > 253 {
        return Err(bad("a host name is at most 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(bad(
                "it has an empty label (two dots, or a dot at the start)",
            ));
        }
        if label.len() > 63 {
            return Err(bad("a label is at most 63 characters"));
        }
        if label.contains('*') {
            return Err(bad(
                "`*` may only be the whole first label, as in *.example.com",
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad(
                "a host name has letters, digits, '-' and '_' only (no scheme, port or path)",
            ));
        }
    }
    // URLs read a name ending in a number as an IPv4 address, so such a pattern could match
    // nothing.
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad(
            "it ends in a number, which URLs read as an IPv4 address; write the address or a network",
        ));
    }
    Ok(if wild {
        HostPattern::Subdomains(name.to_string())
    } else {
        HostPattern::Exact(name.to_string())
    })
}

impl TryFrom<String> for EgressRule {
    type Error = RuleError;

    fn try_from(text: String) -> Result<Self, RuleError> {
        text.parse()
    }
}

impl From<EgressRule> for String {
    fn from(rule: EgressRule) -> String {
        rule.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules(texts: &[&str]) -> Vec<EgressRule> {
        texts
            .iter()
            .map(|t| t.parse().unwrap_or_else(|e| panic!("{t}: {e}")))
            .collect()
    }

    fn policy(allow: &[&str], deny: &[&str], internal_allowed: bool) -> EgressPolicy {
        EgressPolicy {
            allow: rules(allow),
            deny: rules(deny),
            internal_allowed,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn rules_parse_and_print() {
        for (text, shown) in [
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("::1/128", "::1/128"),
            ("127.0.0.1", "127.0.0.1/32"),
            ("::1", "::1/128"),
            ("[fe80::1]", "fe80::1/128"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("API.Example.com.", "api.example.com"),
            ("*.example.com", "*.example.com"),
            ("*", "*"),
            ("localhost", "localhost"),
        ] {
            let rule: EgressRule = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(rule.to_string(), shown);
        }
    }

    #[test]
    fn bad_rules_say_why() {
        let cases = [
            ("", "empty"),
            ("10.0.0.0/33", "at most 32"),
            ("10.1.0.0/8", "did you mean 10.0.0.0/8"),
            ("10.0.0/8", "not an IP address"),
            ("10.0.0.0/x", "not a number"),
            ("http://example.com", "no scheme"),
            ("example.com:80", "no scheme, port"),
            ("a*.example.com", "whole first label"),
            ("*.*.example.com", "whole first label"),
            ("a..b", "empty label"),
            ("1.2.3", "ends in a number"),
            ("bücher.de", "xn--"),
        ];
        for (text, why) in cases {
            match text.parse::<EgressRule>() {
                Ok(rule) => panic!("{text:?} parsed as {rule}"),
                Err(e) => assert!(e.to_string().contains(why), "{text:?}: {e}"),
            }
        }
    }

    #[test]
    fn policies_travel_as_text() {
        let p = policy(&["10.1.0.0/16", "api.example.com"], &["*"], false);
        let json = serde_json::to_value(&p).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "allow": ["10.1.0.0/16", "api.example.com"],
                "deny": ["*"],
                "internal_allowed": false
            })
        );
        let back: EgressPolicy = serde_json::from_value(json).expect("parses");
        assert_eq!(back, p);
        let bad =
            serde_json::from_value::<EgressPolicy>(serde_json::json!({"allow": ["10.1.0.0/8"]}));
        assert!(bad.is_err());
        // A server that sends no policy allows everything.
        let empty: EgressPolicy = serde_json::from_str("{}").expect("parses");
        assert_eq!(empty, EgressPolicy::default());
        assert!(!empty.restricts());
    }

    #[test]
    fn internal_addresses_are_refused_by_default_on_a_server() {
        let p = policy(&[], &[], false);
        for (address, kind) in [
            ("127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("169.254.169.254", "link-local"),
            ("10.2.3.4", "private"),
            ("172.31.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00::1", "unique-local"),
            ("ff02::1", "multicast"),
            ("::ffff:169.254.169.254", "link-local"),
        ] {
            let refusal = p.check_addresses(address, &[ip(address)]);
            match refusal {
                Err(Refusal::Internal { kind: k, .. }) => assert_eq!(k, kind, "{address}"),
                other => panic!("{address}: {other:?}"),
            }
        }
        for public in [
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "2001:db8::1",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(p.check_addresses(public, &[ip(public)]), Ok(()), "{public}");
        }
        assert_eq!(
            policy(&[], &[], true).check_addresses("127.0.0.1", &[ip("127.0.0.1")]),
            Ok(())
        );
    }

    #[test]
    fn an_ipv6_address_that_reaches_an_ipv4_one_is_judged_by_it() {
        let p = policy(&[], &[], false);
        for (address, kind) in [
            ("::127.0.0.1", "loopback"),
            ("::ffff:0:127.0.0.1", "loopback"),
            ("::ffff:0:a9fe:a9fe", "link-local"),
            ("::10.0.0.1", "private"),
            ("64:ff9b::7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b:1::7f00:1", "local-use NAT64"),
            ("64:ff9b:1:7f00:1::", "local-use NAT64"),
            ("2002:7f00:1::", "loopback"),
            ("2002:c0a8:101:5::1", "private"),
            ("2002:a9fe:a9fe::1", "link-local"),
            // Teredo stores its client's address inverted: 127.0.0.1 here.
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),
        ] {
            match p.check_addresses(address, &[ip(address)]) {
                Err(Refusal::Internal { kind: k, .. }) => assert_eq!(k, kind, "{address}"),
                other => panic!("{address}: {other:?}"),
            }
        }
        for public in ["64:ff9b::808:808", "2002:808:808::1", "::8.8.8.8"] {
            assert_eq!(p.check_addresses(public, &[ip(public)]), Ok(()), "{public}");
        }
        // Allowing the IPv6 range does not let an internal IPv4 address through; allowing the
        // IPv4 address does, and a deny of either refuses.
        let p = policy(&["2002::/16", "64:ff9b::/96"], &[], false);
        assert!(p.check_addresses("x", &[ip("2002:7f00:1::")]).is_err());
        assert!(p.check_addresses("x", &[ip("64:ff9b::7f00:1")]).is_err());
        let p = policy(&["127.0.0.0/8"], &[], false);
        assert_eq!(p.check_addresses("x", &[ip("2002:7f00:1::")]), Ok(()));
        let p = policy(&[], &["2002::/16"], false);
        assert!(p.check_addresses("x", &[ip("2002:808:808::")]).is_err());
        let p = policy(&[], &["8.8.8.0/24"], false);
        assert!(p.check_addresses("x", &[ip("64:ff9b::808:808")]).is_err());
        assert!(p
            .check_addresses("x", &[ip("2001:0:1:2:3:4:f7f7:f7f7")])
            .is_err());
    }

    #[test]
    fn refusals_say_what_to_do() {
        let p = policy(&[], &[], false);
        let text = |r: Result<(), Refusal>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            text(p.check_addresses("169.254.169.254", &[ip("169.254.169.254")])),
            "169.254.169.254 is a link-local address; allow it with --http-target-allow \
             169.254.169.254"
        );
        assert_eq!(
            text(p.check_addresses("localhost", &[ip("127.0.0.1")])),
            "127.0.0.1 (the address of localhost) is a loopback address; allow it with \
             --http-target-allow 127.0.0.1 or --http-target-allow localhost"
        );
        let p = policy(&[], &["10.0.0.0/8", "*.internal"], true);
        assert_eq!(
            text(p.check_addresses("db.internal", &[])),
            "host db.internal is denied by the rule *.internal"
        );
        assert_eq!(
            text(p.check_addresses("x.example.com", &[ip("10.0.0.5")])),
            "10.0.0.5 (the address of x.example.com) is denied by the rule 10.0.0.0/8"
        );
    }

    #[test]
    fn the_most_specific_rule_wins_and_deny_wins_a_tie() {
        let p = policy(&["10.1.0.0/16"], &["0.0.0.0/0"], true);
        assert_eq!(p.check_addresses("h", &[ip("10.1.2.3")]), Ok(()));
        assert!(p.check_addresses("h", &[ip("10.2.0.1")]).is_err());
        assert!(p.check_addresses("h", &[ip("8.8.8.8")]).is_err());
        // IPv6 is not under an IPv4 rule.
        assert_eq!(p.check_addresses("h", &[ip("2001:db8::1")]), Ok(()));

        let p = policy(&["api.example.com"], &["*"], true);
        assert_eq!(p.check_host("api.example.com").map(|_| ()), Ok(()));
        assert_eq!(p.check_host("API.example.com.").map(|_| ()), Ok(()));
        assert!(p.check_host("www.example.com").is_err());
        assert!(p.check_host("8.8.8.8").is_err(), "`*` covers IP literals");
        assert!(p.check_host("[::1]").is_err());

        let p = policy(
            &["*.example.com"],
            &["*.corp.example.com", "example.com"],
            true,
        );
        assert!(p.check_host("a.example.com").is_ok());
        assert!(p.check_host("a.corp.example.com").is_err());
        assert!(
            p.check_host("example.com").is_err(),
            "a suffix is not its own subdomain"
        );
        assert!(p.check_host("badexample.com").is_ok(), "no rule matches it");
        assert_eq!(p.host_verdict("badexample.com"), Verdict::Unmatched);

        let tie = policy(&["10.0.0.0/8", "a.b"], &["10.0.0.0/8", "a.b"], true);
        assert!(tie.check_addresses("h", &[ip("10.0.0.1")]).is_err());
        assert!(tie.check_host("a.b").is_err());
    }

    #[test]
    fn an_allowed_host_overrides_only_the_default() {
        let p = policy(&["localhost"], &["127.0.0.2"], false);
        assert_eq!(p.check_addresses("localhost", &[ip("127.0.0.1")]), Ok(()));
        assert!(matches!(
            p.check_addresses("localhost", &[ip("127.0.0.1"), ip("127.0.0.2")]),
            Err(Refusal::AddressDenied { .. })
        ));
        // Any internal address of a name no host rule allows refuses it.
        let p = policy(&[], &[], false);
        assert!(p
            .check_addresses("mixed.example", &[ip("8.8.8.8"), ip("10.0.0.1")])
            .is_err());
    }

    #[test]
    fn urls_are_judged_by_what_they_say() {
        let p = policy(&[], &["*.internal"], false);
        let url = |t: &str| url::Url::parse(t).expect("a URL");
        assert!(p.check_url(&url("http://169.254.169.254/latest")).is_err());
        assert!(p.check_url(&url("http://[::1]:8080/")).is_err());
        assert!(p.check_url(&url("http://[::ffff:127.0.0.1]/")).is_err());
        assert!(p.check_url(&url("http://db.internal/")).is_err());
        // A name is judged by its addresses where it is resolved.
        assert!(p.check_url(&url("http://localhost:5432/")).is_ok());
        assert!(p.check_url(&url("https://example.com/")).is_ok());
    }

    fn any_v4() -> impl Strategy<Value = Ipv4Addr> {
        any::<u32>().prop_map(Ipv4Addr::from)
    }

    fn any_address() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any_v4().prop_map(IpAddr::V4),
            any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
        ]
    }

    /// A network containing `address`, `prefix` bits long.
    fn around(address: Ipv4Addr, prefix: u8) -> String {
        let net = ipnet::Ipv4Net::new(address, prefix).map(|n| n.trunc());
        net.map(|n| n.to_string()).unwrap_or_default()
    }

    fn any_rule() -> impl Strategy<Value = String> {
        prop_oneof![
            (any_v4(), 0u8..=32).prop_map(|(a, p)| around(a, p)),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| ipnet::Ipv6Net::new(Ipv6Addr::from(a), p)
                .map(|n| n.trunc().to_string())
                .unwrap_or_default()),
            Just("*".to_string()),
            Just("a.example".to_string()),
            Just("*.example".to_string()),
        ]
    }

    proptest! {
        #[test]
        fn denying_everything_refuses_every_address(address in any_address(), internal in any::<bool>()) {
            let p = policy(&[], &["0.0.0.0/0", "::/0"], internal);
            prop_assert!(p.check_addresses("h.example", &[address]).is_err());
        }

        #[test]
        fn a_narrower_allow_inside_a_deny_is_allowed(
            address in any_v4(), outer in 0u8..=31, extra in 1u8..=32, internal in any::<bool>()
        ) {
            let inner = outer.saturating_add(extra).min(32);
            let (outer_net, inner_net) = (around(address, outer), around(address, inner));
            let p = policy(&[&inner_net], &[&outer_net], internal);
            prop_assert_eq!(p.check_addresses("h", &[IpAddr::V4(address)]), Ok(()));
            // Just outside the allowed network but inside the denied one: refused.
            let outside = u32::from(address) ^ (1u32 << (32 - inner));
            if inner > outer {
                prop_assert!(p.check_addresses("h", &[IpAddr::V4(Ipv4Addr::from(outside))]).is_err());
            }
        }

        #[test]
        fn a_narrower_deny_inside_an_allow_is_refused(
            address in any_v4(), outer in 0u8..=31, extra in 1u8..=32
        ) {
            let inner = outer.saturating_add(extra).min(32);
            let p = policy(&[&around(address, outer)], &[&around(address, inner)], true);
            prop_assert!(p.check_addresses("h", &[IpAddr::V4(address)]).is_err());
        }

        #[test]
        fn the_mapped_form_gets_the_ipv4_verdict(
            address in any_v4(),
            allow in proptest::collection::vec(any_rule(), 0..4),
            deny in proptest::collection::vec(any_rule(), 0..4),
            internal in any::<bool>(),
        ) {
            let allow: Vec<&str> = allow.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
            let deny: Vec<&str> = deny.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
            let p = policy(&allow, &deny, internal);
            let v4 = IpAddr::V4(address);
            let mapped = IpAddr::V6(address.to_ipv6_mapped());
            prop_assert_eq!(
                p.check_addresses("h.example", &[v4]).is_ok(),
                p.check_addresses("h.example", &[mapped]).is_ok()
            );
            prop_assert_eq!(p.address_verdict(v4), p.address_verdict(mapped));
        }

        #[test]
        fn every_ipv6_form_of_a_refused_ipv4_address_is_refused(
            address in any_v4(),
            site in any::<u64>(),
            allow in proptest::collection::vec(any_rule(), 0..4),
            deny in proptest::collection::vec(any_rule(), 0..4),
            internal in any::<bool>(),
        ) {
            // `::` and `::1` are IPv6's own addresses, not spellings of 0.0.0.0 and 0.0.0.1.
            prop_assume!(address.octets()[0] != 0);
            let allow: Vec<&str> = allow.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
            let deny: Vec<&str> = deny.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
            let p = policy(&allow, &deny, internal);
            let n = u128::from(u32::from(address));
            let site = u128::from(site);
            let spellings = [n, (0xffff_0000u128 << 32) | n];
            for form in spellings {
                let v6 = IpAddr::V6(Ipv6Addr::from(form));
                prop_assert_eq!(p.address_verdict(v6), p.address_verdict(IpAddr::V4(address)));
            }
            let routed = [
                (0x0064_ff9bu128 << 96) | n,
                (0x2002u128 << 112) | (n << 80) | (site & ((1 << 80) - 1)),
                (0x2001_0000u128 << 96) | (site << 32 & ((1 << 96) - 1)) | (!n & 0xffff_ffff),
            ];
            let v4_refused = p.check_addresses("h.example", &[IpAddr::V4(address)]).is_err();
            for form in spellings.into_iter().chain(routed) {
                let v6 = IpAddr::V6(Ipv6Addr::from(form));
                if v4_refused {
                    prop_assert!(p.check_addresses("h.example", &[v6]).is_err(), "{}", v6);
                }
            }
        }

        #[test]
        fn every_rule_reads_back_as_itself(rule in any_rule()) {
            prop_assume!(!rule.is_empty());
            let parsed = rule.parse::<EgressRule>().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let again = parsed.to_string().parse::<EgressRule>().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(parsed, again);
        }
    }
}

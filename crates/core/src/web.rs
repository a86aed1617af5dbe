//! What the server takes from a browser: the path a login returns to, the `Host` an open
//! development server answers, whether a request's `Origin` is the server's own, and which
//! bodies a JSON route reads. Plain rules over header text; the server applies them.

use std::net::IpAddr;

/// Where a login sends its visitor: `next` when it is a path of this site, `/` otherwise.
///
/// A path is taken only when it starts with a single `/` followed by a character that is not
/// `/`, `\` or a control character, and holds no control character anywhere: browsers read
/// `//host`, `/\host` and `/<TAB>/host` as another site, and CR or LF cannot be in a header.
/// The login page itself is not a destination (it would loop).
pub fn return_path(next: &str) -> &str {
    let mut chars = next.chars();
    let local = chars.next() == Some('/')
        && chars
            .next()
            .is_some_and(|c| c != '/' && c != '\\' && !c.is_control())
        && !next.chars().any(char::is_control)
        && !next.contains('\\');
    if local && !next.starts_with("/login") {
        next
    } else {
        "/"
    }
}

/// The host of an authority (`Host` header, or an origin without its scheme): `example.com`
/// of `example.com:8080`, `::1` of `[::1]:8080`. `None` when it is not an authority.
pub fn host_of(authority: &str) -> Option<&str> {
    if authority.is_empty() || authority.contains(['/', '@', ' ']) {
        return None;
    }
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return (after.is_empty() || after.strip_prefix(':').is_some_and(is_port)).then_some(host);
    }
    match authority.split_once(':') {
        Some((host, port)) if is_port(port) && !host.is_empty() => Some(host),
        Some(_) => None,
        None => Some(authority),
    }
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `host` names this machine only: `localhost` (and names under it, which browsers
/// resolve to loopback themselves), an address of 127.0.0.0/8, `::1`, or an IPv4-mapped
/// loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// Whether an open development server answers a request whose `Host` header is `host`: only
/// for a loopback name or address, or the host of its configured public URL (`public_host`).
/// Any other name is a page that made its own name resolve to this server (DNS rebinding).
pub fn open_server_answers(host: Option<&str>, public_host: Option<&str>) -> bool {
    let Some(name) = host.and_then(host_of) else {
        return false;
    };
    is_loopback_host(name) || public_host.is_some_and(|p| p.eq_ignore_ascii_case(name))
}

/// Whether a request's `Origin` is the server's own: its authority is the `Host` the request
/// was sent to, or it is the configured public URL's origin (`public_origin`, as
/// `scheme://host[:port]`). `null` (an opaque origin: a sandboxed frame, a `data:` page) is
/// nobody's own.
pub fn is_own_origin(origin: &str, host: Option<&str>, public_origin: Option<&str>) -> bool {
    let origin = origin.trim();
    if public_origin.is_some_and(|p| p.eq_ignore_ascii_case(origin)) {
        return true;
    }
    let authority = origin
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
        })
        .map(|(_, authority)| authority);
    matches!((authority, host), (Some(a), Some(h)) if !a.is_empty() && a.eq_ignore_ascii_case(h))
}

/// Whether a `Content-Type` is JSON (`application/json`, with or without parameters).
pub fn is_json(content_type: &str) -> bool {
    is_media_type(content_type, "application/json")
}

/// Whether a `Content-Type`'s type, parameters aside, is `essence`.
pub fn is_media_type(content_type: &str, essence: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(essence))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_returns_only_to_a_path_of_this_site() {
        for kept in ["/jobs?namespace=x", "/runs/12", "/a/b//c", "/x?next=//y"] {
            assert_eq!(return_path(kept), kept);
        }
        for refused in [
            "",
            "/",
            "//evil.example/",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/jobs\r\nSet-Cookie: x=1",
            "/jobs\u{7f}",
            "/jobs\\..\\x",
            "https://evil.example/",
            "evil.example",
            "\t/jobs",
            "/login?next=/",
            "/\u{85}evil.example",
        ] {
            assert_eq!(return_path(refused), "/", "{refused:?}");
        }
    }

    #[test]
    fn hosts_are_read_from_authorities() {
        assert_eq!(host_of("example.com:8080"), Some("example.com"));
        assert_eq!(host_of("example.com"), Some("example.com"));
        assert_eq!(host_of("[::1]:80"), Some("::1"));
        assert_eq!(host_of("[::1]"), Some("::1"));
        assert_eq!(host_of("[::1]x"), None);
        assert_eq!(host_of("a:b"), None);
        assert_eq!(host_of(":80"), None);
        assert_eq!(host_of("user@host"), None);
        assert_eq!(host_of(""), None);
    }

    #[test]
    fn an_open_server_answers_loopback_names_and_its_public_host_only() {
        for host in [
            "localhost:7070",
            "LOCALHOST",
            "localhost.",
            "app.localhost:1",
            "127.0.0.1:7070",
            "127.1.2.3",
            "[::1]:7070",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(open_server_answers(Some(host), None), "{host}");
        }
        for host in [
            "rebind.evil.example:7070",
            "localhost.evil.example",
            "evil-localhost",
            "10.0.0.1:7070",
            "[::2]:1",
            "0.0.0.0:7070",
            "",
        ] {
            assert!(!open_server_answers(Some(host), None), "{host}");
        }
        assert!(!open_server_answers(None, None));
        assert!(open_server_answers(Some("sked.lan:7070"), Some("sked.lan")));
        assert!(!open_server_answers(
            Some("other.lan:7070"),
            Some("sked.lan")
        ));
    }

    #[test]
    fn only_the_servers_own_origin_is_its_own() {
        let host = Some("127.0.0.1:7070");
        assert!(is_own_origin("http://127.0.0.1:7070", host, None));
        assert!(is_own_origin("HTTPS://127.0.0.1:7070", host, None));
        assert!(!is_own_origin("http://evil.example", host, None));
        assert!(!is_own_origin("http://127.0.0.1:7071", host, None));
        assert!(!is_own_origin("null", host, None));
        assert!(!is_own_origin("file://", Some(""), None));
        assert!(!is_own_origin("http://127.0.0.1:7070", None, None));
        let public = Some("https://sked.example.com");
        assert!(is_own_origin(
            "https://sked.example.com",
            Some("10.0.0.5:7070"),
            public
        ));
        assert!(!is_own_origin(
            "http://sked.example.com",
            Some("10.0.0.5:7070"),
            public
        ));
    }

    #[test]
    fn json_is_application_json_with_any_parameters() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json("application/jsonp"));
        assert!(!is_json(""));
    }
}

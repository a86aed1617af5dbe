//! A database URL and the connections made from it: the URL and `key=value` forms as libpq
//! reads them, with libpq's TLS keys taken out for `tls.rs` (tokio-postgres knows only
//! disable, prefer and require) and the rest left to tokio-postgres; and a connection opened
//! host by host, in the URL's order, so that a failure names each host and what went wrong
//! there, without the password.
//!
//! Owns nothing about what is done on a connection: the pool, the listener and the migration
//! copy each take theirs from here.

use super::tls::{SslMode, Tls, TlsKeys};
use crate::{Result, StoreError};
use tokio_postgres::config::{Host, LoadBalanceHosts};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The stream of a connection, TLS or not.
pub type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// A connection as tokio-postgres hands it over: the client and the future that drives it.
pub type Connected = (Client, tokio_postgres::Connection<Socket, Stream>);

/// The keys libpq has and tokio-postgres does not parse; tokio-postgres refuses the modes
/// it lacks, so `sslmode` is taken out too and told to it afterwards.
const TLS_KEYS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// How long one host may take to answer, unless the URL says (`connect_timeout`).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How a connection whose peer vanished (a host lost, a link cut without a reset) is noticed,
/// unless the URL says: TCP keepalive probes after this much silence, every `KEEPALIVE_EVERY`,
/// `KEEPALIVE_PROBES` times; and data unacknowledged for `UNACKNOWLEDGED` ends it. Without
/// them the system's defaults leave such a connection hanging for hours (2 h before the first
/// probe) or, mid-query, for about 15 minutes of retransmissions.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(15);
const KEEPALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const KEEPALIVE_PROBES: u32 = 3;
const UNACKNOWLEDGED: std::time::Duration = std::time::Duration::from_secs(30);

/// A connection string, parsed: nothing read or connected yet.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    pub config: Config,
    pub tls: TlsKeys,
}

impl DatabaseUrl {
    pub fn parse(text: &str) -> Result<DatabaseUrl> {
        let bad =
            |why: String| StoreError::Open(format!("bad PostgreSQL connection string: {why}"));
        let (rest, taken) = take_keys(text, TLS_KEYS);
        let mut tls = TlsKeys::default();
        for (key, value) in taken {
            match key {
                "sslmode" => tls.mode = Some(SslMode::parse(&value).map_err(bad)?),
                "sslrootcert" => tls.root_cert = Some(value),
                "sslcert" => tls.cert = Some(value.into()),
                _ => tls.key = Some(value.into()),
            }
        }
        let mut config: Config = rest.parse().map_err(|e| bad(super::said(&e)))?;
        config.ssl_mode(tls.mode.unwrap_or(SslMode::Prefer).negotiation());
        if config.get_application_name().is_none() {
            config.application_name("sked");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let says = |key: &str| rest.contains(key);
        if !says("keepalives_idle") {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        if !says("keepalives_interval") {
            config.keepalives_interval(KEEPALIVE_EVERY);
        }
        if !says("keepalives_retries") {
            config.keepalives_retries(KEEPALIVE_PROBES);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(UNACKNOWLEDGED);
        }
        hosts_agree(&config).map_err(bad)?;
        Ok(DatabaseUrl { config, tls })
    }

    /// Where it points, without the password: every host, its port, and the database.
    pub fn describe(&self) -> String {
        let config = &self.config;
        let hosts = attempts(config)
            .iter()
            .map(|attempt| attempt.label.clone())
            .collect::<Vec<_>>()
            .join(",");
        let database = config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or_default();
        format!("PostgreSQL at {hosts}/{database}")
    }
}

/// The number of hosts, host addresses and ports must agree, as tokio-postgres requires
/// when it connects; said at start rather than at the first connection.
fn hosts_agree(config: &Config) -> std::result::Result<(), String> {
    let (hosts, addrs, ports) = (
        config.get_hosts().len(),
        config.get_hostaddrs().len(),
        config.get_ports().len(),
    );
    if hosts > 0 && addrs > 0 && hosts != addrs {
        return Err(format!(
            "{hosts} hosts but {addrs} hostaddrs: give one address per host"
        ));
    }
    let count = hosts.max(addrs);
    if count == 0 {
        return Err("no host: name one, as postgres://user@HOST:5432/db or host=HOST".to_string());
    }
    if ports > 1 && ports != count {
        return Err(format!(
            "{count} hosts but {ports} ports: give one port, or one per host"
        ));
    }
    Ok(())
}

/// A connection string ready to connect: parsed, its TLS files read.
#[derive(Debug, Clone)]
pub struct Connector {
    url: DatabaseUrl,
    tls: Tls,
    place: String,
}

impl Connector {
    /// Parses `text` and reads the TLS files it names: anything wrong is said now, naming
    /// the file, before any connection is tried.
    pub fn new(text: &str) -> Result<Connector> {
        let url = DatabaseUrl::parse(text)?;
        let place = url.describe();
        let tls = Tls::load(&url.tls).map_err(|e| StoreError::Open(format!("{place}: {e}")))?;
        Ok(Connector { url, tls, place })
    }

    /// [`DatabaseUrl::describe`].
    pub fn place(&self) -> &str {
        &self.place
    }

    pub fn config(&self) -> &Config {
        &self.url.config
    }

    /// How connections are protected, for the start-up line.
    pub fn tls_summary(&self) -> String {
        self.tls.summary()
    }

    /// Opens a connection: each host in turn (shuffled with `load_balance_hosts=random`),
    /// the first that connects — and, with `target_session_attrs=read-write`, accepts
    /// writes — is used.
    pub async fn connect(&self) -> std::result::Result<Connected, Failed> {
        let mut attempts = attempts(&self.url.config);
        if self.url.config.get_load_balance_hosts() == LoadBalanceHosts::Random {
            use rand::seq::SliceRandom;
            attempts.shuffle(&mut rand::thread_rng());
        }
        let mut tried = Vec::new();
        let mut last = None;
        for attempt in attempts {
            match attempt.config.connect(self.tls.connector()).await {
                Ok(connected) => return Ok(connected),
                Err(e) => {
                    let why = self.tls.explain(&e).unwrap_or_else(|| super::said(&e));
                    tried.push((attempt.label, why));
                    last = Some(e);
                }
            }
        }
        match last {
            Some(last) => Err(Failed {
                place: self.place.clone(),
                tried,
                last,
            }),
            None => unreachable!("attempts() names at least one host"),
        }
    }

    /// A client whose connection is driven by a task of its own until the client is dropped.
    pub async fn client(&self) -> Result<Client> {
        let (client, connection) = self
            .connect()
            .await
            .map_err(|e| StoreError::Open(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("a PostgreSQL connection ended: {e}");
            }
        });
        Ok(client)
    }
}

/// Why no host could be used: where the URL points, each host tried and what went wrong
/// there, and the last error as tokio-postgres gave it (the pool passes that one on).
#[derive(Debug)]
pub struct Failed {
    place: String,
    tried: Vec<(String, String)>,
    pub last: tokio_postgres::Error,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.place)?;
        match self.tried.as_slice() {
            [(_, why)] => f.write_str(why),
            tried => {
                f.write_str("no host could be used: ")?;
                for (i, (host, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{host}: {why}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<Failed> for StoreError {
    fn from(e: Failed) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// How long a session of the pool may sit idle inside a transaction before PostgreSQL ends
/// it, unless the URL's `options` set `idle_in_transaction_session_timeout`. sked never waits
/// between a transaction's statements, so a session that does was cut off mid-transaction
/// (a frozen link, a stalled host): its row locks would otherwise hold up the nodes that took
/// its partitions for as long as the link stays frozen.
pub const IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_secs(5);

/// The pool's connections, opened as [`Connector::connect`] does, each with
/// [`IDLE_IN_TRANSACTION`]. The pool only passes on a tokio-postgres error, so what each host
/// said is logged here.
pub struct PoolConnect(pub Connector);

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(
        &self,
        _config: &Config,
    ) -> futures_util::future::BoxFuture<
        '_,
        std::result::Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        Box::pin(async move {
            let (client, connection) = self.0.connect().await.map_err(|failed| {
                tracing::warn!("cannot connect: {failed}");
                failed.last
            })?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!("a PostgreSQL connection of the pool ended: {e}");
                }
            });
            let set_by_url = self
                .0
                .config()
                .get_options()
                .is_some_and(|o| o.contains("idle_in_transaction_session_timeout"));
            if !set_by_url {
                let ms = IDLE_IN_TRANSACTION.as_millis();
                let set = format!("SET idle_in_transaction_session_timeout = {ms}");
                if let Err(e) = client.batch_execute(&set).await {
                    task.abort();
                    return Err(e);
                }
            }
            Ok((client, task))
        })
    }
}

/// One host to try: what to call it, and a connection string that names only it.
struct Attempt {
    label: String,
    config: Config,
}

/// The hosts of `config` in its order, each as a connection string of its own (with the
/// host's address and port), as tokio-postgres pairs them.
fn attempts(config: &Config) -> Vec<Attempt> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    if hosts.is_empty() && addrs.is_empty() {
        // `DatabaseUrl::parse` refuses this; tokio-postgres would say the same.
        return vec![Attempt {
            label: "no host".to_string(),
            config: config.clone(),
        }];
    }
    (0..hosts.len().max(addrs.len()))
        .map(|i| {
            let host = hosts.get(i);
            let addr = addrs.get(i);
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let mut one = without_hosts(config);
            let name = match host {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                    name.clone()
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                    // libpq never uses TLS on a Unix socket, whatever sslmode says.
                    one.ssl_mode(tokio_postgres::config::SslMode::Disable);
                    path.display().to_string()
                }
                None => String::new(),
            };
            if let Some(addr) = addr {
                one.hostaddr(*addr);
            }
            one.port(port);
            let shown = if name.is_empty() {
                addr.map(ToString::to_string).unwrap_or_default()
            } else {
                name
            };
            let label = if shown.contains(':') && !shown.starts_with('/') {
                format!("[{shown}]:{port}")
            } else {
                format!("{shown}:{port}")
            };
            Attempt { label, config: one }
        })
        .collect()
}

/// `config` with no host, address or port: tokio-postgres' `Config` can add hosts but not
/// remove them, so every other setting is copied over.
fn without_hosts(config: &Config) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    one
}

/// Takes the parameters named `keys` out of a connection string (the last of each wins, as
/// in libpq): the string without them, and their values. A string this cannot read is
/// handed on whole, for tokio-postgres to say what is wrong with it.
fn take_keys<'k>(text: &str, keys: &[&'k str]) -> (String, Vec<(&'k str, String)>) {
    let is_url = text.starts_with("postgres://") || text.starts_with("postgresql://");
    let spans = if is_url {
        url_params(text)
    } else {
        keyword_params(text)
    };
    let Some(spans) = spans else {
        return (text.to_string(), Vec::new());
    };
    let mut rest = String::with_capacity(text.len());
    let mut taken = Vec::new();
    let mut from = 0;
    for param in spans {
        let Some(key) = keys.iter().find(|k| **k == param.key) else {
            continue;
        };
        taken.push((*key, param.value));
        rest.push_str(&text[from..param.start]);
        from = param.end;
    }
    rest.push_str(&text[from..]);
    if is_url {
        // A query left with a dangling separator: `?&a=1`, `?a=1&`, or a bare `?`.
        rest = tidy_query(&rest);
    }
    (rest, taken)
}

/// One `key=value` of a connection string: decoded key and value, and where it stands.
struct Param {
    key: String,
    value: String,
    start: usize,
    end: usize,
}

/// The query parameters of a URL, where tokio-postgres finds them: after the first `?` that
/// follows the credentials (which end at the first `@`, if any).
fn url_params(text: &str) -> Option<Vec<Param>> {
    let after_credentials = text.find('@').map_or(0, |at| at + 1);
    let Some(query) = text[after_credentials..].find('?') else {
        return Some(Vec::new());
    };
    let mut at = after_credentials + query + 1;
    let mut params = Vec::new();
    for pair in text[at..].split('&') {
        let (key, value) = pair.split_once('=')?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .ok()
        };
        params.push(Param {
            key: decode(key)?,
            value: decode(value)?,
            start: at,
            end: at + pair.len(),
        });
        at += pair.len() + 1;
    }
    Some(params)
}

/// Drops the empty parameters the removal of some left in a URL's query.
fn tidy_query(url: &str) -> String {
    let after_credentials = url.find('@').map_or(0, |at| at + 1);
    let Some(q) = url[after_credentials..].find('?') else {
        return url.to_string();
    };
    let q = after_credentials + q;
    let params: Vec<&str> = url[q + 1..].split('&').filter(|p| !p.is_empty()).collect();
    if params.is_empty() {
        url[..q].to_string()
    } else {
        format!("{}?{}", &url[..q], params.join("&"))
    }
}

/// The `key = value` pairs of libpq's keyword form, read as tokio-postgres reads them:
/// blanks around `=`, a value bare or in single quotes, a backslash escaping the next
/// character.
fn keyword_params(text: &str) -> Option<Vec<Param>> {
    let mut chars = text.char_indices().peekable();
    let mut params = Vec::new();
    let skip_blanks = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_blanks(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            return Some(params);
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        skip_blanks(&mut chars);
        chars.next_if(|(_, c)| *c == '=')?;
        skip_blanks(&mut chars);
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let mut value = String::new();
        let mut end = text.len();
        let mut closed = !quoted;
        while let Some(&(i, c)) = chars.peek() {
            if (quoted && c == '\'') || (!quoted && c.is_whitespace()) {
                end = i;
                break;
            }
            chars.next();
            if c == '\\' {
                value.push(chars.next()?.1);
            } else {
                value.push(c);
            }
        }
        if quoted {
            let (i, _) = chars.next_if(|(_, c)| *c == '\'')?;
            end = i + 1;
            closed = true;
        }
        if !closed || (!quoted && value.is_empty()) {
            return None;
        }
        params.push(Param {
            key,
            value,
            start,
            end,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(text: &str) -> (String, Vec<(&'static str, String)>) {
        take_keys(text, TLS_KEYS)
    }

    #[test]
    fn a_vanished_peer_is_noticed_in_seconds_unless_the_url_says_otherwise() {
        let url = DatabaseUrl::parse("postgres://db/sked").expect("a URL");
        assert_eq!(url.config.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(url.config.get_keepalives_interval(), Some(KEEPALIVE_EVERY));
        assert_eq!(url.config.get_keepalives_retries(), Some(KEEPALIVE_PROBES));
        assert_eq!(url.config.get_tcp_user_timeout(), Some(&UNACKNOWLEDGED));
        // tokio-postgres reads `tcp_user_timeout` in seconds, where libpq reads milliseconds.
        let url = DatabaseUrl::parse(
            "postgres://db/sked?keepalives_idle=60&keepalives_interval=10\
             &keepalives_retries=5&tcp_user_timeout=90",
        )
        .expect("a URL");
        let secs = std::time::Duration::from_secs;
        assert_eq!(url.config.get_keepalives_idle(), secs(60));
        assert_eq!(url.config.get_keepalives_interval(), Some(secs(10)));
        assert_eq!(url.config.get_keepalives_retries(), Some(5));
        assert_eq!(url.config.get_tcp_user_timeout(), Some(&secs(90)));
    }

    #[test]
    fn tls_keys_leave_a_url_and_the_rest_stays_as_written() {
        let (rest, keys) = taken(
            "postgres://sked:p%40ss?w@db:5432/sked?sslmode=verify-full&application_name=x\
             &sslrootcert=%2Fetc%2Fsked%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem",
        );
        assert_eq!(
            rest,
            "postgres://sked:p%40ss?w@db:5432/sked?application_name=x"
        );
        assert_eq!(
            keys,
            vec![
                ("sslmode", "verify-full".to_string()),
                ("sslrootcert", "/etc/sked/ca.pem".to_string()),
                ("sslcert", "/c.pem".to_string()),
                ("sslkey", "/k.pem".to_string()),
            ]
        );
        let (rest, keys) = taken("postgresql://db/sked?sslmode=require");
        assert_eq!(rest, "postgresql://db/sked");
        assert_eq!(keys, vec![("sslmode", "require".to_string())]);
        assert_eq!(taken("postgres://db/sked").0, "postgres://db/sked");
    }

    #[test]
    fn tls_keys_leave_the_keyword_form_with_quotes_and_escapes() {
        let (rest, keys) = taken(
            "host=db sslrootcert = '/etc/my ca.pem' password='it\\'s' sslmode=verify-ca \
             sslkey=/k\\ 1.pem",
        );
        assert_eq!(
            rest.split_whitespace().collect::<Vec<_>>(),
            ["host=db", "password='it\\'s'"]
        );
        assert_eq!(
            keys,
            vec![
                ("sslrootcert", "/etc/my ca.pem".to_string()),
                ("sslmode", "verify-ca".to_string()),
                ("sslkey", "/k 1.pem".to_string()),
            ]
        );
        // Unreadable: passed on whole, for tokio-postgres to explain.
        assert_eq!(
            taken("host='db sslmode=require").0,
            "host='db sslmode=require"
        );
    }

    #[test]
    fn modes_tokio_postgres_lacks_are_told_to_it_as_require() {
        use tokio_postgres::config::SslMode as Pg;
        let url = DatabaseUrl::parse("host=db sslmode=verify-full user=sked").unwrap();
        assert_eq!(url.config.get_ssl_mode(), Pg::Require);
        assert_eq!(url.tls.mode, Some(SslMode::VerifyFull));
        // libpq's default.
        let url = DatabaseUrl::parse("postgres://db/sked").unwrap();
        assert_eq!(url.config.get_ssl_mode(), Pg::Prefer);
        let err = DatabaseUrl::parse("postgres://db/sked?sslmode=verify").unwrap_err();
        assert!(
            err.to_string().contains("sslmode=verify is not a mode"),
            "{err}"
        );
    }

    #[test]
    fn every_host_is_described_and_tried_alone_and_no_password_shows() {
        let url = DatabaseUrl::parse(
            "postgres://sked:hunter2@a.db:5433,b.db,[::1]:5434/jobs?target_session_attrs=read-write",
        )
        .unwrap();
        let place = url.describe();
        assert_eq!(place, "PostgreSQL at a.db:5433,b.db:5432,[::1]:5434/jobs");
        let tries = attempts(&url.config);
        let labels: Vec<_> = tries.iter().map(|a| a.label.as_str()).collect();
        assert_eq!(labels, ["a.db:5433", "b.db:5432", "[::1]:5434"]);
        for attempt in &tries {
            assert_eq!(attempt.config.get_hosts().len(), 1);
            assert_eq!(attempt.config.get_ports().len(), 1);
            assert_eq!(attempt.config.get_password(), Some(&b"hunter2"[..]));
            assert_eq!(
                attempt.config.get_target_session_attrs(),
                tokio_postgres::config::TargetSessionAttrs::ReadWrite
            );
        }

        let url = DatabaseUrl::parse(
            "host=a,b hostaddr=10.0.0.1,10.0.0.2 port=6432 dbname=d password=hunter2",
        )
        .unwrap();
        assert_eq!(url.describe(), "PostgreSQL at a:6432,b:6432/d");
        let second = &attempts(&url.config)[1];
        assert_eq!(
            second.config.get_hostaddrs(),
            ["10.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
        assert!(!format!("{:?}", url).contains("hunter2"));
    }

    #[test]
    fn a_single_host_copy_keeps_every_setting() {
        let url = DatabaseUrl::parse(
            "host=db port=5433 user=u password=p dbname=d options=-cx=1 application_name=a \
             sslmode=require connect_timeout=3 tcp_user_timeout=4 keepalives=0 \
             keepalives_idle=5 keepalives_interval=6 keepalives_retries=7 \
             target_session_attrs=read-write channel_binding=require load_balance_hosts=random",
        )
        .unwrap();
        let one = &attempts(&url.config)[0].config;
        assert_eq!(format!("{one:?}"), format!("{:?}", url.config));
    }

    #[test]
    fn hosts_addresses_and_ports_must_agree() {
        let err = DatabaseUrl::parse("host=a,b port=1,2,3").unwrap_err();
        assert!(err.to_string().contains("2 hosts but 3 ports"), "{err}");
        let err = DatabaseUrl::parse("host=a,b hostaddr=10.0.0.1").unwrap_err();
        assert!(err.to_string().contains("2 hosts but 1 hostaddrs"), "{err}");
    }
}

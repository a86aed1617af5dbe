//! `sked dev`, `sked server` and `sked worker`: opening the store and starting the server and
//! worker with their settings. Everything here is wiring.

use crate::cli::{DevArgs, ServerArgs, WorkerArgs};
use anyhow::{bail, Context, Result};
use chrono::Utc;
use sked_core::auth::Secret;
use sked_core::container::ContainerPolicy;
use sked_core::egress::EgressPolicy;
use sked_core::policy::BacklogLimits;
use sked_server::auth::{
    ensure_admin_token, generate_secret, AuthMode, MAX_SECRET_LEN, MIN_SECRET_LEN,
};
use sked_server::config::SmtpRelay;
use sked_server::http::{anonymous_share, ConnectionLimits, Tls};
use sked_server::rate::RateLimit;
use sked_server::secrets::SecretKey;
use sked_server::traces::{OtlpProtocol, TraceSettings};
use sked_server::ServerConfig;
use sked_store::{PgStore, SqliteStore, Store};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

/// Listens for Ctrl-C and SIGTERM from the moment it is called and resolves on either, having
/// told the service manager the drain begins. Each command calls it first: a signal that
/// arrives while the node still starts is then a drain, not the default action that kills the
/// process unannounced.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    let stop = stop_signal()?;
    Ok(async move {
        stop.await;
        crate::service::stopping();
    })
}

#[cfg(unix)]
fn stop_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn stop_signal() -> Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// The store a server runs on.
struct OpenStore {
    store: Arc<dyn Store>,
    /// Where the data is, for the start-up line.
    place: String,
}

async fn open_store(args: &ServerArgs) -> Result<OpenStore> {
    if let Some(url) = &args.store.database_url {
        // The error says "cannot open the store", where, and why.
        let store = PgStore::connect(url).await?;
        return Ok(OpenStore {
            place: store.place(),
            store: Arc::new(store),
        });
    }
    let dir = &args.store.data_dir;
    create_private_dir(dir)?;
    refuse_foreign_dir(dir)?;
    let path = dir.join(DB_FILE);
    // The error names the file and says what to do.
    let store = SqliteStore::open(&path)?;
    Ok(OpenStore {
        store: Arc::new(store),
        place: dir.display().to_string(),
    })
}

/// Creates the data directory readable by its owner only: it holds every job definition, env
/// values included. One that already exists keeps its mode, with a warning if others may read
/// it.
fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("cannot read the data directory {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            "the data directory {} may be read by other users (mode {:o}); it holds job              definitions with their env: chmod 700 it",
            dir.display(),
            mode & 0o777
        );
    }
    Ok(())
}

/// Refuses a data directory this process may not keep: one it cannot write to, or, when
/// running as root, one that belongs to another user (a service's, typically): the files root
/// created there would be unreadable to that service at its next start.
fn refuse_foreign_dir(dir: &Path) -> Result<()> {
    use nix::unistd::{access, AccessFlags, Uid, User};
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(dir)
        .with_context(|| format!("cannot read the data directory {}", dir.display()))?
        .uid();
    let me = Uid::effective();
    if owner == me.as_raw() {
        return Ok(());
    }
    let user_name = |uid: u32| {
        User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| format!("uid {uid}"), |user| user.name)
    };
    if me.is_root() {
        bail!(
            "the data directory {} belongs to {}, but sked runs as root: files it wrote there \
             would be root's, and the directory's owner could no longer read them. Run sked as \
             its owner (`runuser -u {} -- sked ...`), or choose another --data-dir",
            dir.display(),
            user_name(owner),
            user_name(owner)
        );
    }
    if access(dir, AccessFlags::W_OK | AccessFlags::X_OK).is_err() {
        bail!(
            "the data directory {} belongs to {}, and {} (whom sked runs as) may not write to \
             it: run sked as its owner, `chown` it, or choose another --data-dir",
            dir.display(),
            user_name(owner),
            user_name(me.as_raw())
        );
    }
    Ok(())
}

/// This very executable, which supervises each shell attempt
/// (`sked_worker::executor::supervisor`). Through /proc it stays the binary that is running,
/// even once an upgrade has replaced the file on disk.
const SELF_EXE: &str = "/proc/self/exe";

/// The embedded store's file in its data directory.
const DB_FILE: &str = "sked.db";

/// `sked store check`: prints what is wrong with the embedded store, or that it is sound.
pub fn check_store(data_dir: &Path) -> Result<()> {
    let path = data_dir.join(DB_FILE);
    let report = SqliteStore::check(&path)
        .with_context(|| format!("cannot check the store at {}", path.display()))?;
    if report.problems.is_empty() {
        println!("{}: ok", path.display());
        return Ok(());
    }
    for problem in &report.problems {
        println!("{problem}");
    }
    bail!(
        "{} has {} problem(s); restore it from a backup",
        path.display(),
        report.problems.len()
    )
}

pub fn backup_store(data_dir: &Path, to: &Path) -> Result<()> {
    let path = data_dir.join(DB_FILE);
    let started = std::time::Instant::now();
    let version = SqliteStore::backup(&path, to)
        .with_context(|| format!("cannot back up the store at {}", path.display()))?;
    let bytes = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    println!(
        "{} backed up to {} ({:.1} MB, schema version {version}, in {:.1?})",
        path.display(),
        to.display(),
        bytes as f64 / 1e6,
        started.elapsed()
    );
    Ok(())
}

/// `sked store migrate`: copies one store into an empty one of the other kind, saying how far
/// it is (on a terminal, one line per table redrawn as it goes; otherwise a line per table).
pub async fn migrate_store(from: &str, to: &str) -> Result<()> {
    use sked_store::transfer::{self, Location};
    use std::io::{IsTerminal, Write};
    let source = Location::parse(from).context("--from")?;
    let target = Location::parse(to).context("--to")?;
    if let Location::Sqlite(file) = &target {
        if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    let terminal = std::io::stderr().is_terminal();
    let progress: transfer::Progress = std::sync::Arc::new(move |table, done, total| {
        let mut err = std::io::stderr().lock();
        if terminal {
            let _ = write!(err, "\r\x1b[2K{table}: {done} of {total} rows");
            if done >= total {
                let _ = writeln!(err);
            }
        } else if done >= total {
            let _ = writeln!(err, "{table}: {done} rows");
        }
    });
    let started = std::time::Instant::now();
    let copied = transfer::migrate(&source, &target, progress)
        .await
        .with_context(|| {
            format!(
                "cannot migrate {} to {}",
                source.describe(),
                target.describe()
            )
        })?;
    let rows: u64 = copied.iter().map(|c| c.rows).sum();
    let count = |table: &str| {
        copied
            .iter()
            .find(|c| c.table == table)
            .map_or(0, |c| c.rows)
    };
    println!(
        "{} migrated to {}: {} jobs, {} runs, {} attempts, {} tokens, {rows} rows in all, in {:.1?}",
        source.describe(),
        target.describe(),
        count("jobs"),
        count("runs"),
        count("attempts"),
        count("tokens"),
        started.elapsed()
    );
    println!(
        "start sked on {} with the source's secret key file: secrets stay sealed with it",
        target.describe()
    );
    Ok(())
}

/// The admin token file: `--admin-token-file`, or `admin.token` in the data directory.
fn admin_token_path(args: &ServerArgs) -> PathBuf {
    args.admin_token_file
        .clone()
        .unwrap_or_else(|| args.store.data_dir.join(ADMIN_TOKEN_FILE))
}

/// The secret key file: `--secret-key-file`, or `secret.key` in the data directory.
fn secret_key_path(args: &ServerArgs) -> PathBuf {
    args.secret_key_file
        .clone()
        .unwrap_or_else(|| args.store.data_dir.join(SECRET_KEY_FILE))
}

const ADMIN_TOKEN_FILE: &str = "admin.token";
const SECRET_KEY_FILE: &str = "secret.key";

/// The admin token: the file's content when it exists, else a new token written there with
/// mode 0600 (only the path is logged, never the token). It is then made an admin token in the
/// store.
async fn bootstrap_admin(args: &ServerArgs, store: &dyn Store) -> Result<Secret> {
    let path = admin_token_path(args);
    let secret = private_file(&path, "admin token", generate_secret).await?;
    if secret.len() > MAX_SECRET_LEN {
        bail!(
            "the admin token in {} is longer than {MAX_SECRET_LEN} characters, more than a \
             request may carry",
            path.display()
        );
    }
    if secret.len() < MIN_SECRET_LEN {
        bail!(
            "the admin token in {} is shorter than {MIN_SECRET_LEN} characters; delete the \
             file to have a new one generated",
            path.display()
        );
    }
    let name = ensure_admin_token(store, &secret, Utc::now())
        .await
        .context("cannot record the admin token in the store")?;
    tracing::info!("admin token {name} is in {}", path.display());
    Ok(Secret::new(secret))
}

/// The key that seals secrets in job definitions: the file's content when it exists, else a
/// new key written there with mode 0600. Every node of a cluster needs the same one.
async fn secret_key(args: &ServerArgs) -> Result<SecretKey> {
    let path = secret_key_path(args);
    let text = private_file(&path, "secret key", SecretKey::generate).await?;
    let key = SecretKey::from_base64(&text)
        .with_context(|| format!("the secret key in {}", path.display()))?;
    tracing::info!(
        "secrets are sealed with key {} from {}",
        key.id(),
        path.display()
    );
    Ok(key)
}

/// A private file's content, trimmed: read when the file exists, else `generate`d and written
/// with mode 0600. The file is never overwritten; one another process is writing at the same
/// moment (nodes starting together) is waited for, briefly.
async fn private_file(path: &Path, what: &str, generate: impl Fn() -> String) -> Result<String> {
    if let Some(text) = read_private(path, what).await? {
        return Ok(text);
    }
    let text = generate();
    if write_private(path, &text)? {
        tracing::info!("a new {what} was written to {}", path.display());
        return Ok(text);
    }
    read_private(path, what)
        .await?
        .with_context(|| format!("{} appeared but holds no {what}", path.display()))
}

/// The file's content, trimmed; `None` when there is no file.
async fn read_private(path: &Path, what: &str) -> Result<Option<String>> {
    for _ in 0..50 {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read the {what} {}", path.display()))
            }
        };
        if !text.trim().is_empty() {
            refuse_shared(path, what)?;
            return Ok(Some(text.trim().to_string()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    bail!("the {what} file {} is empty", path.display())
}

/// Refuses a key or token file that users other than its owner may read: the key opens every
/// sealed secret and the token is an administrator's, so starting with either exposed would
/// hand them out silently.
fn refuse_shared(path: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if exposed(meta.mode(), meta.uid()) {
        bail!(
            "the {what} file {} may be read by other users (mode {:o}): run `chmod 600 {}` \
             (and replace the {what} if others may have read it)",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        );
    }
    Ok(())
}

/// Whether a private file of this mode and owner is open to more than its owner. A file root
/// owns may also be readable by its group, as PostgreSQL allows for its key: root granted that
/// group the file on purpose, as an administrator does with `root:sked 0640` and as
/// Kubernetes does for a Secret volume under `fsGroup` (mode 0440, whatever `defaultMode`
/// says).
fn exposed(mode: u32, owner: u32) -> bool {
    let granted = if owner == 0 { 0o040 } else { 0 };
    mode & 0o077 & !granted != 0
}

/// Writes a new file only its owner may read. An existing file is never overwritten: `false`
/// when one was there already.
fn write_private(path: &Path, content: &str) -> Result<bool> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    if let Err(e) = writeln!(file, "{content}").and_then(|()| file.sync_all()) {
        // Leave no empty or partial file for the next start to trip over.
        let _ = std::fs::remove_file(path);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(true)
}

/// `internal_allowed`: whether HTTP targets may reach internal addresses no rule names, which
/// `sked dev` (a laptop's own services) allows and `sked server` does not.
/// `dev` is `sked dev`'s laxer defaults: HTTP targets may reach internal addresses, and
/// container targets may run any image.
fn server_config(args: &ServerArgs, dev: bool) -> Result<ServerConfig> {
    if args.header_read_timeout.0 < std::time::Duration::from_millis(100) {
        bail!("--header-read-timeout must be at least 100ms");
    }
    if args.body_read_timeout.0 < std::time::Duration::from_millis(100) {
        bail!("--body-read-timeout must be at least 100ms");
    }
    if args.node_lease.0 < std::time::Duration::from_millis(300) {
        bail!("--node-lease must be at least 300ms (nodes renew every third of it)");
    }
    Ok(ServerConfig {
        listen: args.listen.clone(),
        heartbeat_interval: args.heartbeat_interval.0,
        heartbeat_timeout: args.heartbeat_timeout.0,
        output_cap: args.output_cap,
        retention: Some(args.retention.0).filter(|r| !r.is_zero()),
        partition_runs: args.partition_runs,
        node_lease: args.node_lease.0,
        node_name: host_name(),
        connections: ConnectionLimits {
            header_read_timeout: args.header_read_timeout.0,
            body_read_timeout: args.body_read_timeout.0,
            max_connections: args.max_connections as usize,
            max_anonymous_connections: args
                .max_anonymous_connections
                .map_or_else(
                    || anonymous_share(args.max_connections as usize),
                    |n| n as usize,
                )
                .min(args.max_connections as usize),
            ..ConnectionLimits::default()
        },
        max_log_follows: args.max_log_follows as usize,
        worker_retention: args.worker_retention.0,
        backlog: BacklogLimits {
            per_job: args.max_queued_per_job,
            per_namespace: args.max_queued_per_namespace,
        },
        audit_retention: Some(args.audit_retention.0).filter(|r| !r.is_zero()),
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(Tls::from_pem_files(cert, key)?),
            _ => None,
        },
        auth: AuthMode::Tokens,
        rate_limit: RateLimit {
            per_second: args.rate_limit,
            burst: args.rate_limit.saturating_mul(2),
        },
        brokers: args.brokers.clone(),
        broker_allowances: args.broker_allow.clone(),
        public_url: args.public_url.clone(),
        smtp: args.smtp_url.clone().map(|url| SmtpRelay {
            url,
            from: args.smtp_from.clone(),
        }),
        http_target_policy: EgressPolicy {
            allow: args.http_target_allow.clone(),
            deny: args.http_target_deny.clone(),
            internal_allowed: dev,
        },
        container_policy: ContainerPolicy {
            any_image: dev,
            images: args.image_allow.clone(),
            mounts: args.mount_allow.clone(),
        },
        overload: match args.overload.setting()? {
            Some(setting) => setting.control().map_err(anyhow::Error::msg)?,
            None => sked_core::dispatch::OverloadControl::default(),
        },
        oidc: oidc_config(args)?,
        traces: trace_settings(args)?,
        ..ServerConfig::default()
    })
}

/// Where and how traces are exported, when `--otlp-endpoint` names a collector.
fn trace_settings(args: &ServerArgs) -> Result<Option<TraceSettings>> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Ok(None);
    };
    if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host().is_none() {
        bail!("--otlp-endpoint must be an http:// or https:// URL with a host, not {endpoint}");
    }
    let Some(protocol) = OtlpProtocol::parse(&args.otlp_protocol) else {
        bail!(
            "--otlp-protocol must be http or grpc, not {:?}",
            args.otlp_protocol
        );
    };
    if !(0.0..=1.0).contains(&args.trace_ratio) {
        bail!(
            "--trace-ratio must be from 0 to 1, not {}",
            args.trace_ratio
        );
    }
    if args.otlp_headers.len() > 32 {
        bail!("--otlp-header may be given at most 32 times");
    }
    let mut headers = Vec::new();
    for header in &args.otlp_headers {
        // The value is never part of a message: it may be a credential.
        let Some((name, value)) = header.split_once('=') else {
            bail!(
                "--otlp-header must be NAME=VALUE (the one without = is left out of this message)"
            );
        };
        let name = name.trim();
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(value).is_err()
        {
            bail!("--otlp-header {name:?} is not a valid header name, or its value not a valid header value");
        }
        headers.push((name.to_string(), value.to_string()));
    }
    Ok(Some(TraceSettings {
        endpoint: endpoint.as_str().trim_end_matches('/').to_string(),
        protocol,
        headers,
        sampling: sked_core::trace::Sampling {
            ratio: args.trace_ratio,
            late_after: args.trace_late_after.0,
        },
        timeout: args.otlp_timeout.0,
        link: match &args.trace_link {
            Some(link) if !link.contains("{trace_id}") => {
                bail!("--trace-link must hold {{trace_id}}, where the trace's id goes")
            }
            Some(link) if !(link.starts_with("https://") || link.starts_with("http://")) => {
                bail!("--trace-link must be an http:// or https:// URL")
            }
            link => link.clone(),
        },
    }))
}

/// The identity provider of console logins, when `--oidc-issuer` names one.
fn oidc_config(args: &ServerArgs) -> Result<Option<sked_server::oidc::OidcConfig>> {
    let oidc = &args.oidc;
    let (Some(issuer), Some(client_id), Some(secret_file)) = (
        &oidc.oidc_issuer,
        &oidc.oidc_client_id,
        &oidc.oidc_client_secret_file,
    ) else {
        return Ok(None);
    };
    // The provider sends people back to an address their browser reaches: not the listen
    // address, which may be 0.0.0.0 or behind a proxy.
    let Some(public_url) = &args.public_url else {
        bail!(
            "--oidc-issuer needs --public-url: the identity provider sends people back to \
             PUBLIC_URL/login/oidc/callback"
        );
    };
    let client_secret = std::fs::read_to_string(secret_file)
        .with_context(|| {
            format!(
                "cannot read --oidc-client-secret-file {}",
                secret_file.display()
            )
        })?
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    if client_secret.is_empty() {
        bail!(
            "--oidc-client-secret-file {} holds no secret on its first line",
            secret_file.display()
        );
    }
    Ok(Some(sked_server::oidc::OidcConfig {
        issuer: issuer.clone(),
        client_id: client_id.clone(),
        client_secret,
        redirect_uri: format!("{}/login/oidc/callback", public_url.trim_end_matches('/')),
        scopes: oidc
            .oidc_scopes
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        groups_claim: oidc.oidc_groups_claim.clone(),
        rules: oidc.oidc_group.clone(),
        session: oidc.oidc_session.0,
        display_name: oidc.oidc_name.clone(),
    }))
}

/// Readiness for the service manager: the server tells the sender, `service` the manager.
fn notify_when_ready(config: &mut ServerConfig) {
    let (ready, readiness) = watch::channel(false);
    config.on_ready = Some(ready);
    tokio::spawn(crate::service::ready_when(readiness));
}

pub async fn server(args: ServerArgs) -> Result<()> {
    let stop = shutdown_signal()?;
    let mut config = server_config(&args, false)?;
    notify_when_ready(&mut config);
    let opened = open_store(&args).await?;
    let listener = sked_server::bind(&config).await?;
    let addr = listener.local_addr()?;
    announce(
        &args,
        format!(
            "sked server listening on {}://{addr} (data in {}; every request needs a token)",
            scheme(&args),
            opened.place
        ),
    );
    tracing::info!("HTTP targets: {}", config.http_target_policy.summary());
    bootstrap_admin(&args, opened.store.as_ref()).await?;
    config.secret_key = Some(secret_key(&args).await?);
    sked_server::serve(config, opened.store.clone(), listener, stop).await?;
    Ok(())
}

pub async fn dev(args: DevArgs) -> Result<()> {
    let stop = shutdown_signal()?;
    let mut config = server_config(&args.server, true)?;
    notify_when_ready(&mut config);
    let listener = sked_server::bind(&config).await?;
    let addr = listener.local_addr()?;
    let open = !args.require_token;
    if open && !addr.ip().is_loopback() {
        bail!(
            "refusing to start open on {addr}, which is not a loopback address: anyone who \
             reaches it could run commands on this machine. Listen on 127.0.0.1, or pass \
             --require-token (the admin token is then in {})",
            admin_token_path(&args.server).display()
        );
    }
    let opened = open_store(&args.server).await?;
    if open {
        config.auth = AuthMode::Open;
        announce(
            &args.server,
            format!(
                "sked dev listening on {}://{addr} (data in {}; open: no token needed on this \
                 loopback address)",
                scheme(&args.server),
                opened.place
            ),
        );
    } else {
        announce(
            &args.server,
            format!(
                "sked dev listening on {}://{addr} (data in {}; every request needs a token, \
                 the admin token is in {})",
                scheme(&args.server),
                opened.place,
                admin_token_path(&args.server).display()
            ),
        );
    }
    tracing::info!(
        "HTTP targets: {} (sked dev's default; sked server refuses internal addresses no \
         --http-target-allow names)",
        config.http_target_policy.summary()
    );
    let admin = bootstrap_admin(&args.server, opened.store.as_ref()).await?;
    config.secret_key = Some(secret_key(&args.server).await?);
    let (server_stop, server_stopped) = watch::channel(false);
    let (worker_stop, worker_stopped) = watch::channel(false);
    let mut server = tokio::spawn(sked_server::serve(
        config,
        opened.store.clone(),
        listener,
        stopped(server_stopped),
    ));
    let worker_config = sked_worker::WorkerConfig {
        servers: vec![format!("{}://{addr}", scheme(&args.server))],
        name: "dev".to_string(),
        labels: BTreeMap::new(),
        slots: args.slots,
        token: (!open).then_some(admin),
        // Over TLS, the in-process worker trusts --ca-file, or the server's own chain.
        trusted_certificates: match args.ca_file.as_ref().or(args.server.tls_cert.as_ref()) {
            Some(path) if args.server.tls_cert.is_some() => read_certificates(path)?,
            _ => Vec::new(),
        },
        supervisor: Some(SELF_EXE.into()),
        container_runtime: args.container_runtime.clone(),
        ..sked_worker::WorkerConfig::default()
    };
    let worker = tokio::spawn(sked_worker::run(worker_config, stopped(worker_stopped)));
    let failed = tokio::select! {
        () = stop => None,
        ended = &mut server => Some(ended),
    };
    if let Some(ended) = failed {
        // The server stopped by itself (a duty of it failed): nothing can take the worker's
        // reports any more, so it is dropped (its shell processes with it) and the server's
        // error is what `sked dev` exits with. What it was running is in the ledger as
        // running, and the next start reaps it.
        worker.abort();
        ended.context("server task")??;
        bail!("the server stopped on its own");
    }
    // The worker stops first, so it can still report what it ran to the server.
    let _ = worker_stop.send(true);
    match worker.await {
        Ok(Err(e)) => tracing::error!("worker: {e}"),
        Err(e) => tracing::error!("worker task: {e}"),
        Ok(Ok(())) => {}
    }
    let _ = server_stop.send(true);
    server.await.context("server task")??;
    Ok(())
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

pub async fn worker(args: WorkerArgs) -> Result<()> {
    let stop = shutdown_signal()?;
    let mut labels = BTreeMap::new();
    for pair in &args.labels {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("label {pair:?} is not key=value"))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    if args.slots == 0 {
        bail!("--slots must be at least 1");
    }
    let name = args.name.clone().unwrap_or_else(host_name);
    let token = match &args.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?;
            if text.trim().is_empty() {
                bail!("the token file {} is empty", path.display());
            }
            Some(text)
        }
        None => args.token.clone(),
    }
    .map(|t| Secret::new(t.trim()))
    .filter(|t| !t.expose().is_empty());
    let config = sked_worker::WorkerConfig {
        servers: args
            .server
            .iter()
            .map(|s| s.trim_end_matches('/').to_string())
            .collect(),
        name,
        labels,
        slots: args.slots,
        brokers: args.brokers.clone(),
        drain_grace: args.drain_grace.0,
        stall_after: args.stall_after.0,
        stall_over: args.stall_over,
        overload: args.overload.setting()?,
        token,
        trusted_certificates: match &args.ca_file {
            Some(path) => read_certificates(path)?,
            None => Vec::new(),
        },
        supervisor: Some(SELF_EXE.into()),
        container_runtime: args.container_runtime.clone(),
        ..sked_worker::WorkerConfig::default()
    };
    sked_worker::run(config, stop).await?;
    Ok(())
}

/// The PEM certificates of a `--ca-file` (or a certificate chain) to trust.
pub fn read_certificates(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read the certificates {}", path.display()))
}

/// The line saying where the server listens: for people on standard output, or with
/// `--log-format json` a log record like every other line the process writes.
fn announce(args: &ServerArgs, line: String) {
    match args.log.log_format {
        crate::cli::LogFormat::Text => println!("{line}"),
        crate::cli::LogFormat::Json => tracing::info!("{line}"),
    }
}

/// `https` when the server has a certificate.
fn scheme(args: &ServerArgs) -> &'static str {
    if args.tls_cert.is_some() {
        "https"
    } else {
        "http"
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sked".to_string())
}

#[cfg(test)]
mod tests {
    use super::exposed;

    #[test]
    fn a_private_file_is_its_owners_or_read_by_the_group_root_granted_it() {
        const ROOT: u32 = 0;
        const SKED: u32 = 10001;
        for mode in [0o600, 0o400, 0o700] {
            assert!(!exposed(mode, SKED), "{mode:o}");
            assert!(!exposed(mode, ROOT), "{mode:o}");
        }
        for mode in [0o640, 0o440] {
            assert!(exposed(mode, SKED), "{mode:o}");
            assert!(!exposed(mode, ROOT), "{mode:o}");
        }
        for mode in [0o644, 0o604, 0o660, 0o620, 0o444] {
            assert!(exposed(mode, SKED), "{mode:o}");
            assert!(exposed(mode, ROOT), "{mode:o}");
        }
    }
}

//! `sked import KIND FILE|URL`: reads another scheduler's definitions (a file, standard
//! input, or an http(s) URL, each within the importers' size bound), has `sked-import`
//! translate them, and writes the `sked job apply` file to `--out` (atomically, never over a
//! file unless `--force`) or to standard output. What was not translated, or translated with a
//! difference, goes to standard error with its line.
//!
//! It never applies anything and never talks to a sked server: applying is `sked job apply`'s,
//! after a person read the file. The translation rules are the `sked-import` crate's; this
//! module only reads, writes and reports.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use sked_import::{text_of, Import, ImportError, MAX_INPUT_BYTES};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod tables;

/// The exit status of an import whose file was written but that left something out or
/// changed it (each reported on standard error).
pub const EXIT_PARTIAL: u8 = 3;

/// How long fetching a URL may take, all of it.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// What an import reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// A user crontab (`crontab -l`) or a system one (`/etc/crontab`, `/etc/cron.d/*`).
    Crontab,
    /// Kubernetes CronJobs: manifests, or `kubectl get cronjobs -o yaml`.
    K8sCronjob,
    /// A systemd `.timer` unit and its `.service`.
    SystemdTimer,
    /// A Celery app's `beat_schedule`, or django-celery-beat's tables.
    CeleryBeat,
    /// pg_cron's `cron.job` table.
    PgCron,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// What SOURCE holds.
    #[arg(value_enum)]
    pub kind: Kind,
    /// The file to read, `-` for standard input, or an http:// or https:// URL.
    pub source: String,
    /// The namespace the jobs are meant for: the file names none (`sked job apply` takes it
    /// from its own --namespace), so the command to apply it there is printed.
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// Write the job file here instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Replace --out when it exists.
    #[arg(long, requires = "out")]
    pub force: bool,
    /// The IANA zone of entries that name none (a crontab without CRON_TZ ran in the host's
    /// zone, a CronJob without timeZone in the controller's); UTC when not given.
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,
    /// crontab: read SOURCE as a system crontab, whose entries name a user after the time
    /// fields (the default for /etc/crontab and /etc/cron.d/*; otherwise guessed).
    #[arg(long, conflicts_with = "user_crontab")]
    pub system: bool,
    /// crontab: read SOURCE as a user crontab, whatever it looks like.
    #[arg(long = "user-crontab")]
    pub user_crontab: bool,
    /// celery-beat: the broker connection of the sked server (`--broker NAME=URL`) the tasks
    /// are published through, the one beat's broker URL names.
    #[arg(long, value_name = "NAME")]
    pub connection: Option<String>,
    /// systemd-timer: the `.service` unit file the timer activates (default: the file its
    /// `Unit=` names, or the timer's name with `.service`, beside the timer).
    #[arg(long, value_name = "FILE")]
    pub service: Option<PathBuf>,
}

/// The import wrote its file but left something out or changed it: exit
/// [`EXIT_PARTIAL`], each item already on standard error.
#[derive(Debug)]
pub struct Partial;

impl std::fmt::Display for Partial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "some definitions were not translated exactly")
    }
}

impl std::error::Error for Partial {}

pub async fn run(args: ImportArgs) -> Result<()> {
    if let Some(ns) = &args.namespace {
        sked_core::job::validate_name("--namespace", ns).map_err(|e| anyhow!("{e}"))?;
    }
    let timezone = match &args.timezone {
        Some(zone) => Some(
            zone.parse::<chrono_tz::Tz>()
                .map_err(|_| anyhow!("--timezone {zone:?} is not an IANA time zone"))?,
        ),
        None => None,
    };
    if let Some(kind) = unavailable(args.kind) {
        bail!("`sked import {kind}` is not available in this build");
    }
    let database = tables::is_database_url(&args.source);
    match (args.kind, database) {
        (Kind::CeleryBeat | Kind::PgCron, true) => {}
        (Kind::PgCron, false) => bail!(
            "`sked import pg-cron` reads cron.job from a PostgreSQL URL \
             (postgres://USER@HOST:PORT/DATABASE)"
        ),
        (_, true) => {
            bail!("a PostgreSQL URL is read by `sked import celery-beat` and `sked import pg-cron`")
        }
        _ => {}
    }
    if args.kind == Kind::CeleryBeat {
        let Some(connection) = &args.connection else {
            bail!(
                "`sked import celery-beat` needs --connection NAME: the sked server's broker \
                 connection (`--broker NAME=URL`) the tasks are published through"
            );
        };
        sked_core::job::validate_name("--connection", connection).map_err(|e| anyhow!("{e}"))?;
    }
    // Refused before reading anything, and before an existing --out is touched.
    if let Some(out) = &args.out {
        if out.exists() && !args.force {
            bail!(
                "{} exists: choose another --out, or add --force to replace it",
                out.display()
            );
        }
    }
    let (import, source) = if database {
        // The URL may hold a password: it is named by host and database only.
        tables::import(&args, timezone).await?
    } else {
        let bytes = read_source(&args.source).await?;
        let text = text_of(&bytes).map_err(|e| anyhow!("{}: {e}", args.source))?;
        let service = match args.kind {
            Kind::SystemdTimer => read_service(&args, text).await?,
            _ => None,
        };
        let import = translate(&args, text, service.as_deref(), timezone)
            .map_err(|e| anyhow!("{}: {e}", args.source))?;
        (import, args.source.clone())
    };
    let file = import.to_yaml_for(&source, args.namespace.as_deref());
    match &args.out {
        Some(out) => write_atomically(out, file.as_bytes(), args.force)?,
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(file.as_bytes())
                .and_then(|()| stdout.flush())
                .context("cannot write the job file to standard output")?;
        }
    }
    report(&import, &args);
    if import.is_exact() {
        Ok(())
    } else {
        Err(Partial.into())
    }
}

/// The kinds whose importer this build does not have.
fn unavailable(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Crontab | Kind::K8sCronjob | Kind::SystemdTimer => None,
        Kind::CeleryBeat | Kind::PgCron => None,
    }
}

/// The unit name of a timer read from `source`: its file name (`backup.timer`).
fn timer_unit(source: &str) -> String {
    let name = source
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && *name != "-")
        .unwrap_or("stdin.timer");
    name.split(['?', '#']).next().unwrap_or(name).to_string()
}

/// The text of the service a timer activates: `--service`, or the file its `Unit=` names (or
/// the timer's name with `.service`) beside a timer read from a file. None when there is no
/// such file: the importer then says the command is unknown and writes no job.
async fn read_service(args: &ImportArgs, timer: &str) -> Result<Option<String>> {
    let path = match &args.service {
        Some(path) => path.clone(),
        None => {
            let source = Path::new(&args.source);
            let local = args.source != "-" && !args.source.contains("://");
            let name = sked_import::systemd::service_of(timer, &timer_unit(&args.source))
                .map_err(|e| anyhow!("{}: {e}", args.source))?;
            match source.parent() {
                Some(dir) if local && !name.contains('/') => dir.join(name),
                _ => return Ok(None),
            }
        }
    };
    if args.service.is_none() && !path.exists() {
        return Ok(None);
    }
    let bytes = read_source(&path.to_string_lossy()).await?;
    let text = text_of(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(Some(text.to_string()))
}

fn translate(
    args: &ImportArgs,
    text: &str,
    service: Option<&str>,
    timezone: Option<chrono_tz::Tz>,
) -> Result<Import, ImportError> {
    match args.kind {
        Kind::Crontab => {
            let path = Path::new(&args.source);
            let format = if args.system {
                Some(sked_import::crontab::Format::System)
            } else if args.user_crontab {
                Some(sked_import::crontab::Format::User)
            } else if path == Path::new("/etc/crontab") || path.starts_with("/etc/cron.d") {
                Some(sked_import::crontab::Format::System)
            } else {
                None
            };
            sked_import::crontab::import_with(
                text,
                &sked_import::crontab::Options {
                    format,
                    timezone,
                    as_of: None,
                },
            )
        }
        Kind::K8sCronjob => sked_import::k8s::import_with(
            text,
            &sked_import::k8s::Options {
                timezone,
                as_of: None,
            },
        ),
        Kind::SystemdTimer => {
            sked_import::systemd::import_in(text, service, &timer_unit(&args.source), timezone)
        }
        Kind::CeleryBeat => sked_import::celery_beat::import_json(
            text,
            args.connection.as_deref().unwrap_or_default(),
        ),
        // Refused by `run` before anything is read: pg-cron reads a database.
        Kind::PgCron => Ok(Import::default()),
    }
}

/// Standard error: each item left out or changed, with its line, then what was written.
fn report(import: &Import, args: &ImportArgs) {
    let mut err = std::io::stderr().lock();
    for item in &import.untranslated {
        let _ = writeln!(
            err,
            "line {}: not translated: {} -- {}",
            item.line,
            item.text.replace('\n', " "),
            item.reason
        );
    }
    for item in &import.differences {
        let _ = writeln!(
            err,
            "line {}: translated with a difference: {} -- {}",
            item.line,
            item.text.replace('\n', " "),
            item.reason
        );
    }
    let target = args.out.as_ref().map_or_else(
        || "standard output".to_string(),
        |p| p.display().to_string(),
    );
    let _ = writeln!(
        err,
        "{} job(s) written to {target}; {} not translated, {} translated with a difference",
        import.jobs.len(),
        import.untranslated.len(),
        import.differences.len()
    );
    if let (Some(out), Some(ns)) = (&args.out, &args.namespace) {
        let _ = writeln!(
            err,
            "apply it with: sked job apply -f {} --namespace {ns}",
            out.display()
        );
    }
}

/// The source's bytes: at most [`MAX_INPUT_BYTES`]; a larger source is refused with its size
/// when it is known.
async fn read_source(source: &str) -> Result<Vec<u8>> {
    let too_large = |size: Option<u64>| match size {
        Some(n) => anyhow!("{source}: {}", ImportError::TooLarge(n as usize)),
        None => anyhow!(
            "{source}: the input is over {MAX_INPUT_BYTES} bytes, the most sked import reads"
        ),
    };
    let limit = MAX_INPUT_BYTES as u64;
    if source.starts_with("http://") || source.starts_with("https://") {
        return fetch(source, limit).await;
    }
    let mut bytes = Vec::new();
    if source == "-" {
        std::io::stdin()
            .lock()
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
    } else {
        let file = std::fs::File::open(source).with_context(|| format!("cannot read {source}"))?;
        let size = file.metadata().ok().map(|m| m.len());
        if size.is_some_and(|n| n > limit) {
            return Err(too_large(size));
        }
        file.take(limit + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read {source}"))?;
    }
    if bytes.len() as u64 > limit {
        return Err(too_large(None));
    }
    Ok(bytes)
}

/// An http(s) URL's body, within [`FETCH_TIMEOUT`] and `limit` bytes.
async fn fetch(url: &str, limit: u64) -> Result<Vec<u8>> {
    let client = reqwest::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("cannot set up an HTTP client")?;
    let mut response = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("cannot fetch {url}"))?;
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    if let Some(length) = response.content_length().filter(|n| *n > limit) {
        bail!("{url}: {}", ImportError::TooLarge(length as usize));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("cannot fetch {url}"))?
    {
        bytes.extend_from_slice(&chunk);
        if bytes.len() as u64 > limit {
            bail!("{url}: the body is over {MAX_INPUT_BYTES} bytes, the most sked import reads");
        }
    }
    Ok(bytes)
}

/// Writes `bytes` to `out` whole or not at all: into a new file beside it, synced, then put
/// in place: linked (which fails when `out` appeared meanwhile) or, with `force`, renamed
/// over it.
fn write_atomically(out: &Path, bytes: &[u8], force: bool) -> Result<()> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("--out {} names no file", out.display()))?;
    let temp = dir.join(format!(
        ".{}.sked-import-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        if force {
            std::fs::rename(&temp, out)
        } else {
            std::fs::hard_link(&temp, out)?;
            // `out` is in place; a leftover name beside it is harmless.
            let _ = std::fs::remove_file(&temp);
            Ok(())
        }
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            bail!(
                "{} exists: choose another --out, or add --force to replace it",
                out.display()
            );
        }
        return Err(e).with_context(|| format!("cannot write {}", out.display()));
    }
    Ok(())
}

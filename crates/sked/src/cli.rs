//! The command line: every subcommand and flag, and which module carries it out.

use crate::{apply, client, serve};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use sked_core::egress::EgressRule;
use sked_core::HumanDuration;
use std::path::{Path, PathBuf};

/// What `sked --version` prints after the name: the version, the commit and the build date.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SKED_COMMIT"),
    ", built ",
    env!("SKED_BUILD_DATE"),
    ")"
);

#[derive(Debug, Parser)]
#[command(name = "sked", version = VERSION, about = "A distributed job scheduler")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Server and worker in one process on an embedded store: the quickest way to run sked.
    Dev(DevArgs),
    /// The API, the scheduler and the dispatcher.
    Server(ServerArgs),
    /// Run a worker (`sked worker --server URL`), or list workers (`sked worker list`).
    Worker(WorkerCommand),
    /// Define and manage jobs.
    #[command(subcommand)]
    Job(JobCommand),
    /// Read and cancel runs.
    #[command(subcommand)]
    Run(RunCommand),
    /// Look after the embedded store.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Create, list and revoke API tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Who changed what: the audit trail, newest first.
    Audit(AuditArgs),
    /// What a namespace allows: shell targets, caps on jobs and queued runs (admin).
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// A namespace's secrets, which job definitions name with `{"secret_ref": NAME}`.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// A namespace's calendars of business days, which schedules name in `calendar`.
    #[command(subcommand)]
    Calendar(CalendarCommand),
    /// Tell sked what happened: an event starts the jobs whose schedule names its key and
    /// releases the runs waiting for it.
    #[command(subcommand)]
    Event(EventCommand),
    /// Check a config file (`--config`) without starting anything.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Translate another scheduler's definitions (crontab, Kubernetes CronJobs, ...) into a
    /// `sked job apply` file, reporting what it could not translate with its line. Exits 0
    /// when everything was translated exactly, 3 when the file was written but something was
    /// left out or translated with a difference (listed on standard error), 1 on an error
    /// (nothing written).
    Import(crate::import::ImportArgs),
    /// Simulate the dispatch policies on a request trace (no server needed): `workload`,
    /// `matrix`, `run`.
    Sim(crate::sim::SimArgs),
    /// Print a shell's completion script for sked (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write sked's manual pages (sked.1, and one per subcommand) into a directory.
    Man {
        /// Where the pages go; created when missing.
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
    /// Whether a server is ready: exits 0 when its `/readyz` answers 200 (`--live`:
    /// `/healthz`), non-zero saying what went wrong otherwise. For health checks of
    /// containers and service managers, which have no HTTP client of their own.
    Health(HealthArgs),
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The server to check, e.g. https://sked.example.com. Default: the server this host
    /// runs, at the address --listen names (on loopback when it listens on every address).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The address the server listens on, as `sked server --listen` takes it; read when no
    /// --server is given.
    #[arg(long, env = "SKED_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Check `/healthz` (the process answers: it is alive) instead of `/readyz` (it is ready
    /// to serve: schedules loaded, store committing).
    #[arg(long)]
    pub live: bool,
    /// Give up on an answer after this long.
    #[arg(long, default_value = "5s")]
    pub timeout: HumanDuration,
    /// Certificates (PEM) to trust for an https:// server besides the public roots.
    #[arg(long, env = "SKED_CA_FILE")]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Reads FILE as `sked server`, `sked worker` and `sked dev` would, each its own table,
    /// and says everything that is wrong with it: each unknown table or key (with the nearest
    /// known name), each value its flag refuses. Exits non-zero when anything is.
    Check {
        /// The config file (TOML).
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum EventCommand {
    /// Posts an event of KEY in `--namespace`. Sending the same key and id again changes
    /// nothing, so a sender may retry freely.
    Send {
        /// What happened, e.g. `sales.dataset.ready`.
        key: String,
        /// Which occurrence of it, e.g. the day's date or a batch number.
        #[arg(long)]
        id: String,
        /// The payload handed to the runs it starts: JSON, text that is not JSON (sent as a
        /// string), or `@FILE` to read either from a file.
        #[arg(long)]
        payload: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The events of `--namespace`, newest first.
    List {
        /// Only events of this key.
        #[arg(long)]
        key: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// The settings of `--namespace` (defaults when none were set).
    Show(ClientArgs),
    /// Every namespace with settings.
    List(ClientArgs),
    /// Changes the settings of `--namespace`; what is not given stays as it is.
    Set {
        /// Whether its jobs may have shell targets.
        #[arg(long, value_parser = ["allow", "forbid"])]
        shell: Option<String>,
        /// The most jobs it may hold, or `none`.
        #[arg(long)]
        max_jobs: Option<String>,
        /// The most of its runs that may wait for a worker at once, or `none` (the server's
        /// `--max-queued-per-namespace`).
        #[arg(long)]
        max_queued_runs: Option<String>,
        /// Its weight in the fair share of worker slots between namespaces whose runs wait
        /// (1 to 1000), or `none` (1).
        #[arg(long)]
        weight: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Forgets the settings of `--namespace`: its jobs stay, under the defaults.
    Reset(ClientArgs),
    /// Stops the scheduled instants of `--namespace` until a time: a blackout window from now
    /// to --until; its jobs' instants meanwhile are recorded skipped (blackout) with --reason.
    /// Runs already started go on, unless --cancel-running.
    Pause {
        /// When the window ends (RFC 3339, e.g. 2026-12-01T08:00:00Z).
        #[arg(long)]
        until: String,
        /// Why, as the skipped runs will say.
        #[arg(long)]
        reason: String,
        /// Also cancel the runs of the namespace's scheduled jobs running now (their workers
        /// are told to stop), with --reason.
        #[arg(long)]
        cancel_running: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ends the one-off blackout windows of `--namespace` that are open now (what pause
    /// opened); repeating windows stay.
    Resume(ClientArgs),
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Sets a secret of `--namespace` to the value read from standard input (or `--from-file`),
    /// so it appears in no command line or shell history. One trailing newline is dropped.
    Set {
        /// The secret's name, as jobs give it in `secret_ref`.
        name: String,
        /// Read the value from this file instead of standard input.
        #[arg(long)]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The secrets of `--namespace`: names and times, never values.
    List(ClientArgs),
    /// Deletes a secret; jobs that name it fail their attempts until it is set again.
    Delete {
        /// The secret's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum CalendarCommand {
    /// Creates or replaces calendar NAME from a YAML or JSON file (timezone, weekdays,
    /// holidays, include, except, description).
    Apply {
        /// The calendar's name, as schedules give it in `calendar`.
        name: String,
        /// The calendar's definition.
        #[arg(short, long)]
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Creates or replaces calendar NAME with the all-day events of an iCalendar file as its
    /// holidays (a bank-holiday feed, say). The file is read and checked here; only the
    /// calendar is sent.
    Import {
        /// The calendar's name.
        name: String,
        /// The iCalendar (.ics) file.
        #[arg(long)]
        ics: PathBuf,
        /// The calendar's IANA time zone (default UTC).
        #[arg(long)]
        timezone: Option<String>,
        /// Working weekdays, comma-separated (default mon,tue,wed,thu,fri).
        #[arg(long, value_delimiter = ',')]
        weekdays: Option<Vec<String>>,
        /// What the calendar is for.
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The calendars of `--namespace`.
    List(ClientArgs),
    /// One calendar, with the jobs and calendars that name it.
    Show {
        /// The calendar's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Deletes a calendar nothing names; with --force also a named one (the schedules naming
    /// it then fire nothing until it is written again).
    Delete {
        /// The calendar's name.
        name: String,
        /// Delete it even while jobs or calendars name it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token. Its secret is shown once, as the last line of the output.
    Create {
        /// What the token is called in lists and the audit trail.
        #[arg(long)]
        name: String,
        /// admin, editor, viewer, worker or emitter (posts events only).
        #[arg(long)]
        role: String,
        /// Editors may define jobs with shell targets (commands run on the workers).
        #[arg(long)]
        shell: bool,
        /// Worker tokens: the labels its workers may claim, `key=value` or `key=*`,
        /// comma-separated (default: any).
        #[arg(long, value_delimiter = ',')]
        labels: Option<Vec<String>>,
        /// It expires after this long, e.g. 30d or 12h (default: never).
        #[arg(long)]
        expires: Option<String>,
        /// The namespaces it sees are `--namespace`, comma-separated, or `*` for all.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Every token: name, role, namespaces, expiry and last use (never the secrets).
    List(ClientArgs),
    /// Revoke a token: every server refuses it within a second.
    Revoke {
        /// The token's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Every namespace the token sees, instead of `--namespace`'s only.
    #[arg(long)]
    pub all: bool,
    /// Only changes to this object (a job's name, a run's id, a token's name).
    #[arg(long)]
    pub object: Option<String>,
    /// Only changes made with this token (its name).
    #[arg(long)]
    pub actor: Option<String>,
    /// Only changes at or after this instant (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Check the embedded store without changing it: that it was not emptied, its schema
    /// version, and every page. Exits non-zero when anything is wrong.
    Check {
        /// Directory of the embedded store.
        #[arg(long, env = "SKED_DATA_DIR", default_value = "./sked-data")]
        data_dir: PathBuf,
    },
    /// Copy the embedded store to a new file, consistent as of one moment, while sked runs.
    /// The copy is checked before it takes its name; an existing file is never overwritten.
    /// Restore by stopping sked and putting the copy in place of `sked.db` (docs/OPERATIONS.md).
    Backup {
        /// Directory of the embedded store.
        #[arg(long, env = "SKED_DATA_DIR", default_value = "./sked-data")]
        data_dir: PathBuf,
        /// The backup file to create.
        #[arg(long)]
        to: PathBuf,
    },
    /// Copy a whole store to the other kind: the embedded store to PostgreSQL
    /// (`--from sqlite:./sked-data --to postgres://…`) or back. Jobs and their versions, runs
    /// with attempts and output, events, tokens, namespaces and secrets, the audit trail and
    /// notifications keep their ids. The target must hold nothing yet, and is written in one
    /// transaction: a copy that fails leaves it empty. Stop sked on the source first; give the
    /// target's servers the source's secret key file (secrets stay sealed with it).
    Migrate {
        /// `sqlite:DIR` (a data directory) or `postgres://…`.
        #[arg(long, value_name = "STORE")]
        from: String,
        /// `postgres://…` or `sqlite:DIR`, holding nothing yet.
        #[arg(long, value_name = "STORE")]
        to: String,
    },
}

#[derive(Debug, Args, Clone)]
pub struct StoreArgs {
    /// Directory of the embedded store.
    #[arg(long, env = "SKED_DATA_DIR", default_value = "./sked-data")]
    pub data_dir: PathBuf,
    /// PostgreSQL URL (instead of --data-dir), e.g. postgres://sked@db:5432/sked, or libpq's
    /// key=value form. TLS as in libpq: sslmode is disable, prefer (the default), require,
    /// verify-ca or verify-full; sslrootcert=FILE (or system) the CA, sslcert=FILE and
    /// sslkey=FILE a client certificate; e.g. ...?sslmode=verify-full&sslrootcert=ca.pem.
    /// Several hosts (postgres://sked@a:5432,b:5432/sked?target_session_attrs=read-write)
    /// are tried in order. Any number of server nodes may share one database
    /// (docs/OPERATIONS.md, docs/CLUSTER.md).
    #[arg(long, env = "SKED_DATABASE_URL")]
    pub database_url: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct ServerArgs {
    /// A TOML file of settings: its `[server]` table (`[dev]` for `sked dev`), whose keys are
    /// these flags without the dashes. A flag or its `SKED_*` variable wins over the file
    /// (docs/OPERATIONS.md).
    #[arg(long, env = "SKED_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SKED_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// How often workers heartbeat.
    #[arg(long, env = "SKED_HEARTBEAT_INTERVAL", default_value = "2s")]
    pub heartbeat_interval: HumanDuration,
    /// A worker silent this long is declared dead and its attempts move elsewhere.
    #[arg(long, env = "SKED_HEARTBEAT_TIMEOUT", default_value = "10s")]
    pub heartbeat_timeout: HumanDuration,
    /// Finished runs older than this are deleted ("0s" keeps them forever).
    #[arg(long, env = "SKED_RETENTION", default_value = "30days")]
    pub retention: HumanDuration,
    /// On PostgreSQL, make time partitions of runs so that retention drops expired runs a
    /// partition at a time (experimental: docs/OPERATIONS.md, "PostgreSQL").
    #[arg(long, env = "SKED_PARTITION_RUNS")]
    pub partition_runs: bool,
    /// Workers declared dead are forgotten once silent this long.
    #[arg(long, env = "SKED_WORKER_RETENTION", default_value = "1day")]
    pub worker_retention: HumanDuration,
    /// Output kept per attempt, in bytes.
    #[arg(long, env = "SKED_OUTPUT_CAP", default_value_t = 1024 * 1024)]
    pub output_cap: u64,
    /// How long this node's partition and maintenance leases last unrenewed (renewed every
    /// third of it): a dead node's schedules move to the others after about this long.
    #[arg(long, env = "SKED_NODE_LEASE", default_value = "3s")]
    pub node_lease: HumanDuration,
    /// Most runs of one job waiting for a worker; past it an instant is recorded as skipped
    /// (reason `backlog`) instead of queuing another run.
    #[arg(long, env = "SKED_MAX_QUEUED_PER_JOB", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queued_per_job: u64,
    /// How long a client may take to send a request's headers, counted from opening the
    /// connection or from the previous response: it closes slow and idle connections alike.
    #[arg(long, env = "SKED_HEADER_READ_TIMEOUT", default_value = "10s")]
    pub header_read_timeout: HumanDuration,
    /// How long a client may take to send a request's body, counted from the end of its
    /// headers; past it the request fails and its connection is closed.
    #[arg(long, env = "SKED_BODY_READ_TIMEOUT", default_value = "30s")]
    pub body_read_timeout: HumanDuration,
    /// Connections open at once; more are closed as they arrive.
    #[arg(long, env = "SKED_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Of those, connections of clients that have not shown a valid token yet (default: three
    /// quarters of --max-connections); the rest is kept for workers and callers with a token.
    #[arg(long, env = "SKED_MAX_ANONYMOUS_CONNECTIONS",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_anonymous_connections: Option<u64>,
    /// Run logs followed at once (`sked run logs -f`, `?follow=true`); more are refused with
    /// 429 until one ends.
    #[arg(long, env = "SKED_MAX_LOG_FOLLOWS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_log_follows: u64,
    /// Most runs of one namespace waiting for a worker, likewise.
    #[arg(long, env = "SKED_MAX_QUEUED_PER_NAMESPACE", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queued_per_namespace: u64,
    /// File of the admin token: read when it exists, otherwise a new admin token is written
    /// there (mode 0600). Default: admin.token in the data directory.
    #[arg(long, env = "SKED_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key.
    #[arg(long, env = "SKED_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "SKED_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The URL clients reach this node at (behind a proxy or a load balancer), for addresses
    /// it hands out: where a broker target's consumer reports a completion. Default: the
    /// address it listens on.
    #[arg(long, env = "SKED_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: Option<String>,
    /// The SMTP relay that `email` notifications go through: `smtps://user:pass@host:465`
    /// (TLS), `smtp://user:pass@host:587?tls=required` (STARTTLS), or `smtp://host:port`
    /// (unencrypted: a relay on this machine only). Without it, email notifications fail and
    /// say so.
    #[arg(
        long,
        env = "SKED_SMTP_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub smtp_url: Option<String>,
    /// The sender address of notification emails.
    #[arg(
        long,
        env = "SKED_SMTP_FROM",
        default_value = "sked@localhost",
        value_name = "ADDRESS"
    )]
    pub smtp_from: String,
    /// File of the key that seals secrets in job definitions (32 random bytes in base64):
    /// read when it exists, otherwise generated there (mode 0600). Every node of a cluster
    /// needs the same key. Default: secret.key in the data directory.
    #[arg(long, env = "SKED_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
    /// Requests per second each token may send to the API, in bursts of twice that (the worker
    /// protocol is not counted); past it the answer is 429 with Retry-After. 0 turns it off.
    #[arg(long, env = "SKED_RATE_LIMIT", default_value_t = 100)]
    pub rate_limit: u32,
    /// Export the traces of runs to this OpenTelemetry collector: its base URL, e.g.
    /// `http://127.0.0.1:4318` (HTTP, `/v1/traces` is added) or `http://127.0.0.1:4317` with
    /// `--otlp-protocol grpc`. Off when not given: no trace context reaches targets and
    /// nothing is exported (docs/OPERATIONS.md, "Tracing").
    #[arg(long, env = "SKED_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<url::Url>,
    /// `http` (protobuf over HTTP) or `grpc`.
    #[arg(
        long,
        env = "SKED_OTLP_PROTOCOL",
        default_value = "http",
        value_name = "PROTOCOL"
    )]
    pub otlp_protocol: String,
    /// A header sent with every export, `NAME=VALUE` (an API key, a tenant). Repeatable, or
    /// comma-separated; the values are never printed.
    #[arg(
        long = "otlp-header",
        env = "SKED_OTLP_HEADERS",
        value_delimiter = ',',
        value_name = "NAME=VALUE",
        hide_env_values = true
    )]
    pub otlp_headers: Vec<String>,
    /// The longest one export may take.
    #[arg(long, env = "SKED_OTLP_TIMEOUT", default_value = "10s")]
    pub otlp_timeout: HumanDuration,
    /// The share of runs whose traces are exported, from 0 to 1, decided on the trace id so
    /// that targets with the same ratio agree. Failed, retried, late and deadline-missing
    /// runs are exported whatever the ratio.
    #[arg(
        long,
        env = "SKED_TRACE_RATIO",
        default_value_t = 1.0,
        value_name = "RATIO"
    )]
    pub trace_ratio: f64,
    /// A run that starts this long after its instant is late, and its trace is exported
    /// whatever the ratio.
    #[arg(long, env = "SKED_TRACE_LATE_AFTER", default_value = "1s")]
    pub trace_late_after: HumanDuration,
    /// Where the tracing backend shows a trace: a URL with `{trace_id}` in it, e.g.
    /// `http://jaeger:16686/trace/{trace_id}`. A run's page in the console links its trace
    /// there.
    #[arg(long, env = "SKED_TRACE_LINK", value_name = "URL")]
    pub trace_link: Option<String>,
    /// Audit entries older than this are deleted ("0s" keeps them forever).
    #[arg(long, env = "SKED_AUDIT_RETENTION", default_value = "365days")]
    pub audit_retention: HumanDuration,
    /// Let HTTP targets reach this network or host: `10.0.0.0/8`, `::1/128`, an address,
    /// `api.example.com`, `*.example.com` or `*`. Repeatable, or comma-separated. The most
    /// specific matching rule wins and a deny wins a tie; an allow also lets an internal
    /// address through (docs/SECURITY.md).
    #[arg(
        long,
        env = "SKED_HTTP_TARGET_ALLOW",
        value_delimiter = ',',
        value_name = "RULE"
    )]
    pub http_target_allow: Vec<EgressRule>,
    /// Keep HTTP targets off this network or host (the same rules as --http-target-allow).
    /// `sked server` also keeps them off internal addresses (loopback, private, link-local,
    /// ...) that no rule allows; `sked dev` does not.
    #[arg(
        long,
        env = "SKED_HTTP_TARGET_DENY",
        value_delimiter = ',',
        value_name = "RULE"
    )]
    pub http_target_deny: Vec<EgressRule>,
    /// A broker connection that broker targets name: `NAME=amqp://user:pass@host:5672/vhost`,
    /// `NAME=nats://host:4222` or `NAME=redis://host:6379`. Repeatable. Job definitions name
    /// the connection, never the URL; this server publishes their messages.
    #[arg(
        long = "broker",
        env = "SKED_BROKERS",
        value_delimiter = ' ',
        value_name = "NAME=URL",
        hide_env_values = true
    )]
    pub brokers: Vec<sked_core::publish::BrokerConnection>,
    /// Namespace NS may publish through connection CONN only to exchanges, subjects and stream
    /// keys beginning with PREFIX: `NS=CONN:PREFIX`. Repeatable. Once a connection is named
    /// here, only the namespaces named may use it.
    #[arg(
        long = "broker-allow",
        env = "SKED_BROKER_ALLOW",
        value_delimiter = ',',
        value_name = "NS=CONN:PREFIX"
    )]
    pub broker_allow: Vec<sked_core::publish::BrokerAllowance>,
    /// Container targets may run images beginning with PREFIX (`registry.example.com/team/`,
    /// `*` for any), in namespace NS only when given as `NS=PREFIX`. Repeatable, or
    /// comma-separated. `sked server` allows no image until one is given; `sked dev` allows
    /// every image.
    #[arg(
        long = "image-allow",
        env = "SKED_IMAGE_ALLOW",
        value_delimiter = ',',
        value_name = "[NS=]PREFIX"
    )]
    pub image_allow: Vec<sked_core::container::ImageAllowance>,
    /// Container targets may mount host paths under PATH, read-only unless given as
    /// `PATH:rw`, in namespace NS only when given as `NS=PATH`. Repeatable, or
    /// comma-separated. Without it no host path may be mounted.
    #[arg(
        long = "mount-allow",
        env = "SKED_MOUNT_ALLOW",
        value_delimiter = ',',
        value_name = "[NS=]PATH[:rw]"
    )]
    pub mount_allow: Vec<sked_core::container::MountAllowance>,
    #[command(flatten)]
    pub overload: OverloadArgs,
    #[command(flatten)]
    pub oidc: OidcArgs,
}

/// Console logins through an OpenID Connect provider (docs/UI.md, "Logging in with an
/// identity provider").
#[derive(Debug, Args, Clone, Default)]
pub struct OidcArgs {
    /// Let people log in to the console through this OpenID Connect provider (its issuer
    /// URL; https, or http on a loopback address), besides API tokens. Needs
    /// --oidc-client-id, --oidc-client-secret-file, at least one --oidc-group and
    /// --public-url (the provider sends people back to PUBLIC_URL/login/oidc/callback).
    #[arg(long, env = "SKED_OIDC_ISSUER", value_parser = parse_issuer,
          requires = "oidc_client_id", requires = "oidc_client_secret_file",
          requires = "oidc_group")]
    pub oidc_issuer: Option<String>,
    /// This server's client id at the provider.
    #[arg(long, env = "SKED_OIDC_CLIENT_ID", requires = "oidc_issuer")]
    pub oidc_client_id: Option<String>,
    /// File holding the client secret (the first line), so it is on no command line.
    #[arg(long, env = "SKED_OIDC_CLIENT_SECRET_FILE", requires = "oidc_issuer")]
    pub oidc_client_secret_file: Option<PathBuf>,
    /// Members of GROUP get ROLE (admin, editor or viewer) in the namespaces named (`*`: all),
    /// and may define shell targets with `:shell`: `GROUP=ROLE:NS[,NS...][:shell]`.
    /// Repeatable, or `;`-separated. A person in none of these groups is refused; in several,
    /// the strongest role wins, over the namespaces of each group giving it.
    #[arg(
        long = "oidc-group",
        env = "SKED_OIDC_GROUPS",
        value_delimiter = ';',
        value_name = "GROUP=ROLE:NS",
        requires = "oidc_issuer"
    )]
    pub oidc_group: Vec<sked_core::identity::GroupRule>,
    /// The claim listing a person's groups, in the ID token or else at the userinfo endpoint.
    #[arg(long, env = "SKED_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// Scopes asked for besides `openid` (space-separated); some providers need a scope, such
    /// as `groups`, to send the groups claim.
    #[arg(long, env = "SKED_OIDC_SCOPES", default_value = "profile email")]
    pub oidc_scopes: String,
    /// How long a console session made by such a login lasts (at most 12h).
    #[arg(long, env = "SKED_OIDC_SESSION", default_value = "8h", value_parser = parse_session)]
    pub oidc_session: HumanDuration,
    /// What the login button calls the provider ("Log in with ...").
    #[arg(long, env = "SKED_OIDC_NAME", default_value = "single sign-on")]
    pub oidc_name: String,
}

/// An issuer is https, or http on a loopback address (a provider on the same machine).
fn parse_issuer(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(format!(
                "{text:?}: an issuer must be https (http only on a loopback address)"
            ))
        }
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(format!(
            "{text:?}: an issuer has no credentials and no query"
        ));
    }
    Ok(text.trim_end_matches('/').to_string())
}

fn parse_session(text: &str) -> Result<HumanDuration, String> {
    let duration: HumanDuration = text.parse::<HumanDuration>().map_err(|e| e.to_string())?;
    if duration.0.is_zero() || duration.0 > std::time::Duration::from_secs(12 * 3600) {
        return Err(format!(
            "{text:?}: a session lasts more than 0s and at most 12h"
        ));
    }
    Ok(duration)
}

/// Overload control of workers: on `sked server`, for workers that name none; on
/// `sked worker`, for the worker's pool (docs/DISPATCH.md).
#[derive(Debug, Args, Clone, Default)]
pub struct OverloadArgs {
    /// `none`, `breaker` (a worker over --stall-trip gets no work until back at
    /// --stall-reset) or `admission` (its share of work shrinks, low priorities first)
    /// [default: breaker]
    #[arg(long, env = "SKED_OVERLOAD", value_name = "POLICY")]
    pub overload: Option<sked_core::dispatch::Overload>,
    /// The stall gauge (a worker's HTTP attempts in flight past its --stall-after or beyond
    /// its --stall-over) above which a worker is overloaded [default: 8]
    #[arg(long, env = "SKED_STALL_TRIP", value_name = "N")]
    pub stall_trip: Option<u32>,
    /// The stall gauge at or below which an overloaded worker has recovered; below
    /// --stall-trip [default: 4]
    #[arg(long, env = "SKED_STALL_RESET", value_name = "N")]
    pub stall_reset: Option<u32>,
}

impl OverloadArgs {
    /// The setting these flags name, `None` when none is given.
    pub fn setting(&self) -> anyhow::Result<Option<sked_core::protocol::OverloadSetting>> {
        if self.overload.is_none() && self.stall_trip.is_none() && self.stall_reset.is_none() {
            return Ok(None);
        }
        let defaults = sked_core::dispatch::StallLimits::default();
        let setting = sked_core::protocol::OverloadSetting {
            policy: self.overload.unwrap_or_default(),
            trip: self.stall_trip.unwrap_or(defaults.trip),
            reset: self.stall_reset.unwrap_or(defaults.reset),
        };
        setting
            .control()
            .map_err(|e| anyhow::anyhow!("--stall-reset: {e}"))?;
        Ok(Some(setting))
    }
}

#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Slots of the in-process worker.
    #[arg(long, env = "SKED_SLOTS", default_value_t = 8)]
    pub slots: u32,
    /// With --tls-cert: the certificates (PEM) the in-process worker trusts; default: the
    /// --tls-cert file itself, which must then hold the chain up to its CA.
    #[arg(long, env = "SKED_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Require a token on every request, as `sked server` does. Without it `sked dev` is open
    /// to anyone who reaches it, so it listens on loopback addresses only.
    #[arg(long, env = "SKED_REQUIRE_TOKEN")]
    pub require_token: bool,
    /// The container engine that runs container targets: podman or docker, or none for no
    /// container targets. Default: whichever of podman and docker is on PATH.
    #[arg(long, env = "SKED_CONTAINER_RUNTIME", value_parser = ["podman", "docker", "none"])]
    pub container_runtime: Option<String>,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WorkerCommand {
    #[command(subcommand)]
    pub list: Option<WorkerList>,
    #[command(flatten)]
    pub run: WorkerArgs,
}

#[derive(Debug, Subcommand)]
pub enum WorkerList {
    /// Registered workers, their load and last heartbeat.
    List(ClientArgs),
    /// Drain worker ID (admin): no server hands it new attempts, and it exits once its
    /// running attempts end or its `--drain-grace` passes. For a rolling restart or taking a
    /// host out of service.
    Drain {
        /// The worker's id, as `sked worker list` shows it.
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// A TOML file of settings: its `[worker]` table, whose keys are these flags without the
    /// dashes. A flag or its `SKED_*` variable wins over the file (docs/OPERATIONS.md).
    #[arg(long, env = "SKED_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Server URLs, comma-separated; the worker fails over between them and goes back to the
    /// first once it is ready again.
    #[arg(
        long,
        env = "SKED_SERVER",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: Vec<String>,
    /// Labels, `key=value`, comma-separated; jobs route by them.
    #[arg(long, env = "SKED_LABELS", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Attempts run at once.
    #[arg(long, env = "SKED_SLOTS", default_value_t = 8)]
    pub slots: u32,
    /// Name shown in `sked worker list` (default: the host name).
    #[arg(long, env = "SKED_WORKER_NAME")]
    pub name: Option<String>,
    /// The worker token (a command line is visible to other users: prefer --token-file or
    /// the environment).
    #[arg(long, env = "SKED_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the worker token; wins over --token.
    #[arg(long, env = "SKED_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Certificates (PEM) to trust for https:// servers besides the public roots.
    #[arg(long, env = "SKED_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// A broker connection this worker publishes through, as `sked server --broker`
    /// (`NAME=amqp://...`, `nats://...`, `redis://...`). Repeatable. The worker then takes
    /// broker targets of jobs routed to its labels that name the connection.
    #[arg(
        long = "broker",
        env = "SKED_WORKER_BROKERS",
        value_delimiter = ' ',
        value_name = "NAME=URL",
        hide_env_values = true
    )]
    pub brokers: Vec<sked_core::publish::BrokerConnection>,
    /// On SIGTERM or Ctrl-C the worker leases nothing more and lets its running attempts
    /// finish for up to this long, then stops the rest (reported `cancelled`) and exits.
    #[arg(long, env = "SKED_DRAIN_GRACE", default_value = "30s")]
    pub drain_grace: HumanDuration,
    /// An HTTP attempt in flight longer than this counts in the stall gauge this worker
    /// reports, which overload control reads.
    #[arg(long, env = "SKED_STALL_AFTER", default_value = "10s")]
    pub stall_after: HumanDuration,
    /// HTTP attempts in flight beyond this many (the newest) count in the stall gauge too:
    /// the concurrency of the service behind the HTTP targets, past which work waits there.
    #[arg(long, env = "SKED_STALL_OVER", value_name = "N")]
    pub stall_over: Option<u32>,
    /// The container engine that runs container targets: podman or docker, or none for no
    /// container targets. Default: whichever of podman and docker is on PATH.
    #[arg(long, env = "SKED_CONTAINER_RUNTIME", value_parser = ["podman", "docker", "none"])]
    pub container_runtime: Option<String>,
    #[command(flatten)]
    pub overload: OverloadArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// How a long-running process writes its log (standard error).
#[derive(Debug, Args, Clone, Default)]
pub struct LogArgs {
    /// `text` for people, or `json`: one object per line with the fields of each line (an
    /// attempt's `run_id`, `attempt_id`, `namespace` and `job`, a worker's `worker`) as keys,
    /// for a log collector. `RUST_LOG` sets the level either way.
    #[arg(long, env = "SKED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Cli {
    /// Whether the command serves until stopped (`sked server`, `sked worker`, `sked dev`)
    /// rather than answering and exiting.
    pub fn is_long_running(&self) -> bool {
        matches!(
            &self.command,
            Command::Dev(_)
                | Command::Server(_)
                | Command::Worker(WorkerCommand { list: None, .. })
        )
    }

    /// The log format the command asks for; client commands write text.
    pub fn log_format(&self) -> LogFormat {
        match &self.command {
            Command::Dev(args) => args.server.log.log_format,
            Command::Server(args) => args.log.log_format,
            Command::Worker(WorkerCommand { list: None, run }) => run.log.log_format,
            _ => LogFormat::Text,
        }
    }
}

#[derive(Debug, Args, Clone)]
pub struct ClientArgs {
    /// The sked server.
    #[arg(
        long,
        env = "SKED_SERVER",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub server: String,
    /// The namespace of the jobs and runs.
    #[arg(
        short,
        long,
        env = "SKED_NAMESPACE",
        default_value = "default",
        global = true
    )]
    pub namespace: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// The API token to send (a command line is visible to other users: prefer the
    /// environment).
    #[arg(long, env = "SKED_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Certificates (PEM) to trust for an https:// server besides the public roots.
    #[arg(long, env = "SKED_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Create or update the jobs of a YAML or JSON file, and report what changed.
    Apply {
        /// The file of jobs (`jobs:` list), YAML or JSON.
        #[arg(short, long)]
        file: PathBuf,
        /// Print what applying would change, job by job and field by field; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also delete the namespace's jobs that the file does not list (with --dry-run, list
        /// them).
        #[arg(long)]
        prune: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Jobs of the namespace: name, state, schedule, next fire time.
    List {
        /// Only jobs whose name or description contains this text.
        #[arg(long)]
        search: Option<String>,
        /// Only jobs in this state: active, paused or completed.
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One job: its definition, next fire time, last run and counters.
    Get {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The definitions the job has had: each version, when it was written, what it changed.
    History {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Put an earlier definition back, as a new version.
    Rollback {
        /// The job's name.
        name: String,
        /// The version to put back (see `sked job history`).
        #[arg(long)]
        to: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Run the job now.
    Trigger {
        /// The job's name.
        name: String,
        /// A parameter for the run, NAME=VALUE (repeatable): a shell job sees it as
        /// SKED_PARAM_NAME.
        #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_param)]
        params: Vec<(String, String)>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Ping a heartbeat job: its oldest run waiting for a ping succeeds.
    Ping {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The address a heartbeat job takes pings at without a token (for `curl -X POST URL`).
    PingUrl {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop firing the job; its instants are still recorded, as skipped (paused).
    Pause {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Fire the job again from its next instant.
    Resume {
        /// The job's name.
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete the job; its runs stay readable.
    Delete {
        /// The job's name.
        name: String,
        /// Delete it even if other jobs depend on it; they are paused.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The dependency graph around the job: what it waits for, and what waits for it.
    Graph {
        /// The job's name.
        name: String,
        /// Levels of upstreams to show.
        #[arg(long, default_value_t = 5)]
        up: u32,
        /// Levels of dependants to show.
        #[arg(long, default_value_t = 5)]
        down: u32,
        /// Print Graphviz (`sked job graph load --dot | dot -Tsvg > load.svg`).
        #[arg(long)]
        dot: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The next fire times.
    Preview {
        /// The job's name.
        name: String,
        /// How many fire times to show.
        #[arg(long, default_value_t = 10)]
        count: usize,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Records the instants the job's schedule names between FROM and TO (both included,
    /// RFC 3339, not in the future) as runs, each once; its dependants follow them. At most
    /// 10,000 instants at a time.
    Backfill {
        /// The job's name.
        name: String,
        /// The first instant of the range, e.g. 2026-11-01T00:00:00Z.
        #[arg(long)]
        from: String,
        /// The last instant of the range.
        #[arg(long)]
        to: String,
        /// List the instants without recording anything.
        #[arg(long)]
        dry_run: bool,
        /// Then follow the recorded runs until each has ended, showing how many have (redrawn
        /// in place on a terminal); exits non-zero if any did not succeed.
        #[arg(long, conflicts_with = "dry_run")]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// Runs, newest first.
    List {
        /// Only the runs of this job.
        #[arg(long)]
        job: Option<String>,
        /// Only runs in this state, e.g. queued, running, succeeded, failed.
        #[arg(long)]
        state: Option<String>,
        /// Only runs that missed a deadline (their job's `deadline`).
        #[arg(long)]
        deadline_missed: bool,
        /// Only runs that were called at risk of missing their `finish_by`.
        #[arg(long)]
        at_risk: bool,
        /// At most this many runs.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One run with its attempts.
    Get {
        /// The run's id.
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Captured output of the run's latest attempt (or --attempt N).
    Logs {
        /// The run's id.
        id: i64,
        /// Which attempt's output (1 is the first).
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep streaming until the run ends.
        #[arg(short, long)]
        follow: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel the run: a queued run ends cancelled, a running attempt is stopped.
    Cancel {
        /// The run's id.
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Run a run that failed, timed out, was cancelled or skipped again, with a fresh retry
    /// budget; the dependants its failure skipped wait for it again, within their timeout.
    Retry {
        /// The run's id.
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Dev(args) => serve::dev(args).await,
        Command::Server(args) => serve::server(args).await,
        Command::Worker(WorkerCommand {
            list: Some(WorkerList::List(c)),
            ..
        }) => client::Client::new(&c)?.worker_list().await,
        Command::Worker(WorkerCommand {
            list: Some(WorkerList::Drain { id, client }),
            ..
        }) => client::Client::new(&client)?.worker_drain(&id).await,
        Command::Worker(WorkerCommand { list: None, run }) => serve::worker(run).await,
        Command::Job(cmd) => job(cmd).await,
        Command::Run(cmd) => run_cmd(cmd).await,
        Command::Store(StoreCommand::Check { data_dir }) => serve::check_store(&data_dir),
        Command::Store(StoreCommand::Backup { data_dir, to }) => {
            serve::backup_store(&data_dir, &to)
        }
        Command::Store(StoreCommand::Migrate { from, to }) => {
            serve::migrate_store(&from, &to).await
        }
        Command::Token(cmd) => token(cmd).await,
        Command::Audit(args) => client::Client::new(&args.client)?.audit(&args).await,
        Command::Namespace(cmd) => namespace(cmd).await,
        Command::Secret(cmd) => secret(cmd).await,
        Command::Calendar(cmd) => calendar(cmd).await,
        Command::Event(cmd) => event(cmd).await,
        Command::Config(ConfigCommand::Check { file }) => match crate::config::check(&file) {
            Ok(()) => {
                println!("{}: ok", file.display());
                Ok(())
            }
            Err(crate::config::ConfigErrors(errors)) => {
                for e in &errors {
                    eprintln!("error: {e}");
                }
                bail!("{} mistake(s) in {}", errors.len(), file.display())
            }
        },
        Command::Import(args) => crate::import::run(args).await,
        Command::Sim(args) => crate::sim::run(args),
        Command::Completions { shell } => {
            crate::manual::completions(shell, &mut std::io::stdout().lock())
        }
        Command::Man { out_dir } => crate::manual::man_pages(&out_dir),
        Command::Health(args) => client::health(&args).await,
    }
}

async fn event(cmd: EventCommand) -> Result<()> {
    match cmd {
        EventCommand::Send {
            key,
            id,
            payload,
            client,
        } => {
            let payload = match payload {
                None => serde_json::Value::Null,
                Some(arg) => match arg.strip_prefix('@') {
                    Some(path) => {
                        let file = read_bounded(Path::new(path))?;
                        payload_value(file.trim_end_matches(['\n', '\r']))
                    }
                    None => payload_value(&arg),
                },
            };
            client::Client::new(&client)?
                .event_send(&key, &id, payload)
                .await
        }
        EventCommand::List { key, limit, client } => {
            client::Client::new(&client)?
                .event_list(key.as_deref(), limit)
                .await
        }
    }
}

/// What the command line reads for a request (a secret's value, an event's payload): the
/// server takes at most 64 KiB of either, so reading stops a little past that.
const READ_LIMIT: u64 = 128 * 1024;

/// A file's text, at most [`READ_LIMIT`] bytes of it.
fn read_bounded(path: &Path) -> Result<String> {
    read_bounded_to(path, READ_LIMIT)
}

/// A file's text, at most `limit` bytes of it.
fn read_bounded_to(path: &Path, limit: u64) -> Result<String> {
    std::fs::File::open(path)
        .and_then(|f| std::io::read_to_string(std::io::Read::take(f, limit)))
        .with_context(|| format!("cannot read {}", path.display()))
}

/// An event payload as given: JSON when it parses, else the text as a string.
fn payload_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

/// A cap as the API takes it: a number, or `none` for null.
fn cap(flag: &str, text: &str) -> Result<serde_json::Value> {
    if text == "none" {
        return Ok(serde_json::Value::Null);
    }
    let n: u64 = text
        .parse()
        .map_err(|_| anyhow::anyhow!("--{flag} takes a number or `none`, not {text:?}"))?;
    Ok(n.into())
}

async fn namespace(cmd: NamespaceCommand) -> Result<()> {
    match cmd {
        NamespaceCommand::Show(client) => client::Client::new(&client)?.namespace_show().await,
        NamespaceCommand::List(client) => client::Client::new(&client)?.namespace_list().await,
        NamespaceCommand::Set {
            shell,
            max_jobs,
            max_queued_runs,
            weight,
            client,
        } => {
            let mut changes = serde_json::Map::new();
            if let Some(shell) = shell {
                changes.insert("allow_shell".into(), (shell == "allow").into());
            }
            if let Some(text) = max_jobs {
                changes.insert("max_jobs".into(), cap("max-jobs", &text)?);
            }
            if let Some(text) = max_queued_runs {
                changes.insert("max_queued_runs".into(), cap("max-queued-runs", &text)?);
            }
            if let Some(text) = weight {
                changes.insert("weight".into(), cap("weight", &text)?);
            }
            client::Client::new(&client)?.namespace_set(changes).await
        }
        NamespaceCommand::Reset(client) => client::Client::new(&client)?.namespace_reset().await,
        NamespaceCommand::Pause {
            until,
            reason,
            cancel_running,
            client,
        } => {
            let until: chrono::DateTime<chrono::Utc> = until
                .parse()
                .with_context(|| format!("--until {until:?} is not an RFC 3339 instant"))?;
            let now = chrono::Utc::now();
            if until <= now {
                bail!("--until {until} is not in the future");
            }
            let client = client::Client::new(&client)?;
            let mut windows = client.namespace_blackouts().await?;
            let mut window = serde_json::json!({
                "from": now.to_rfc3339(),
                "to": until.to_rfc3339(),
                "reason": reason,
            });
            if cancel_running {
                window["cancel_running"] = true.into();
            }
            windows.push(window);
            let mut changes = serde_json::Map::new();
            changes.insert("blackouts".into(), windows.into());
            client.namespace_set(changes).await
        }
        NamespaceCommand::Resume(client) => {
            let now = chrono::Utc::now();
            let client = client::Client::new(&client)?;
            let open_now = |w: &serde_json::Value| {
                let at = |field: &str| {
                    w[field]
                        .as_str()
                        .and_then(|t| t.parse::<chrono::DateTime<chrono::Utc>>().ok())
                };
                matches!((at("from"), at("to")), (Some(from), Some(to)) if from <= now && now < to)
            };
            let windows: Vec<serde_json::Value> = client
                .namespace_blackouts()
                .await?
                .into_iter()
                .filter(|w| !open_now(w))
                .collect();
            let mut changes = serde_json::Map::new();
            changes.insert("blackouts".into(), windows.into());
            client.namespace_set(changes).await
        }
    }
}

async fn secret(cmd: SecretCommand) -> Result<()> {
    match cmd {
        SecretCommand::Set {
            name,
            from_file,
            client,
        } => {
            let mut value = match &from_file {
                Some(path) => read_bounded(path)?,
                None => {
                    let stdin = std::io::Read::take(std::io::stdin(), READ_LIMIT);
                    std::io::read_to_string(stdin)
                        .context("cannot read the secret from standard input")?
                }
            };
            if value.ends_with('\n') {
                value.pop();
                if value.ends_with('\r') {
                    value.pop();
                }
            }
            client::Client::new(&client)?
                .secret_set(&name, &value)
                .await
        }
        SecretCommand::List(client) => client::Client::new(&client)?.secret_list().await,
        SecretCommand::Delete { name, client } => {
            client::Client::new(&client)?.secret_delete(&name).await
        }
    }
}

async fn calendar(cmd: CalendarCommand) -> Result<()> {
    use sked_core::calendar::{ical, CalendarSpec};
    match cmd {
        CalendarCommand::Apply { name, file, client } => {
            let text = read_bounded_to(&file, CALENDAR_LIMIT)?;
            // YAML is a superset of JSON, so one parser reads both.
            let doc: serde_json::Value = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is neither valid YAML nor JSON", file.display()))?;
            let spec: CalendarSpec = serde_json::from_value(doc)
                .with_context(|| format!("{} is not a calendar", file.display()))?;
            spec.validate()
                .map_err(|e| anyhow::anyhow!("nothing was applied: {e}"))?;
            client::Client::new(&client)?
                .calendar_put(&name, &spec)
                .await
        }
        CalendarCommand::Import {
            name,
            ics,
            timezone,
            weekdays,
            description,
            client,
        } => {
            let size = std::fs::metadata(&ics)
                .with_context(|| format!("cannot read {}", ics.display()))?
                .len();
            if size > ical::MAX_ICS_BYTES as u64 {
                bail!(
                    "ics: {} holds {size} bytes; an iCalendar file may hold at most {}",
                    ics.display(),
                    ical::MAX_ICS_BYTES
                );
            }
            let text = read_bounded_to(&ics, ical::MAX_ICS_BYTES as u64)?;
            let imported = ical::holidays_from_ics(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", ics.display()))?;
            if imported.skipped_timed > 0 {
                eprintln!(
                    "{} events with a time of day were left out: a holiday is a whole day",
                    imported.skipped_timed
                );
            }
            let spec = CalendarSpec {
                timezone,
                weekdays,
                holidays: imported.holidays,
                include: Vec::new(),
                except: Vec::new(),
                description,
            };
            spec.validate()
                .map_err(|e| anyhow::anyhow!("nothing was imported: {e}"))?;
            client::Client::new(&client)?
                .calendar_put(&name, &spec)
                .await
        }
        CalendarCommand::List(client) => client::Client::new(&client)?.calendar_list().await,
        CalendarCommand::Show { name, client } => {
            client::Client::new(&client)?.calendar_show(&name).await
        }
        CalendarCommand::Delete {
            name,
            force,
            client,
        } => {
            client::Client::new(&client)?
                .calendar_delete(&name, force)
                .await
        }
    }
}

/// The largest calendar file `sked calendar apply` reads: a calendar's holidays at their
/// longest labels.
const CALENDAR_LIMIT: u64 = 2 * 1024 * 1024;

async fn token(cmd: TokenCommand) -> Result<()> {
    match cmd {
        TokenCommand::Create {
            name,
            role,
            shell,
            labels,
            expires,
            client,
        } => {
            let namespaces: Vec<String> = client
                .namespace
                .split(',')
                .map(|n| n.trim().to_string())
                .collect();
            let body = serde_json::json!({
                "name": name,
                "role": role,
                "namespaces": namespaces,
                "shell": shell,
                "labels": labels,
                "expires": expires,
            });
            client::Client::new(&client)?.token_create(&body).await
        }
        TokenCommand::List(client) => client::Client::new(&client)?.token_list().await,
        TokenCommand::Revoke { name, client } => {
            client::Client::new(&client)?.token_revoke(&name).await
        }
    }
}

async fn job(cmd: JobCommand) -> Result<()> {
    match cmd {
        JobCommand::Apply {
            file,
            dry_run,
            prune,
            client,
        } => {
            let options = apply::ApplyOptions { dry_run, prune };
            apply::apply(&client::Client::new(&client)?, &file, options).await
        }
        JobCommand::List {
            search,
            state,
            client,
        } => client::Client::new(&client)?.job_list(search, state).await,
        JobCommand::Get { name, client } => client::Client::new(&client)?.job_get(&name).await,
        JobCommand::History { name, client } => {
            client::Client::new(&client)?.job_history(&name).await
        }
        JobCommand::Rollback { name, to, client } => {
            client::Client::new(&client)?.job_rollback(&name, to).await
        }
        JobCommand::Trigger {
            name,
            params,
            client,
        } => {
            client::Client::new(&client)?
                .job_trigger(&name, params.into_iter().collect())
                .await
        }
        JobCommand::Ping { name, client } => {
            client::Client::new(&client)?
                .job_action(&name, "ping")
                .await
        }
        JobCommand::PingUrl { name, client } => {
            client::Client::new(&client)?.job_ping_url(&name).await
        }
        JobCommand::Pause { name, client } => {
            client::Client::new(&client)?
                .job_action(&name, "pause")
                .await
        }
        JobCommand::Resume { name, client } => {
            client::Client::new(&client)?
                .job_action(&name, "resume")
                .await
        }
        JobCommand::Delete {
            name,
            force,
            client,
        } => client::Client::new(&client)?.job_delete(&name, force).await,
        JobCommand::Graph {
            name,
            up,
            down,
            dot,
            client,
        } => {
            client::Client::new(&client)?
                .job_graph(&name, up, down, dot)
                .await
        }
        JobCommand::Preview {
            name,
            count,
            client,
        } => {
            client::Client::new(&client)?
                .job_preview(&name, count)
                .await
        }
        JobCommand::Backfill {
            name,
            from,
            to,
            dry_run,
            wait,
            client,
        } => {
            let client = client::Client::new(&client)?;
            let recorded = client.job_backfill(&name, &from, &to, dry_run).await?;
            if wait {
                client.follow_runs(&name, &recorded).await?;
            }
            Ok(())
        }
    }
}

async fn run_cmd(cmd: RunCommand) -> Result<()> {
    match cmd {
        RunCommand::List {
            job,
            state,
            deadline_missed,
            at_risk,
            limit,
            client,
        } => {
            let filter = client::RunFilter {
                job,
                state,
                deadline_missed,
                at_risk,
            };
            client::Client::new(&client)?.run_list(filter, limit).await
        }
        RunCommand::Get { id, client } => client::Client::new(&client)?.run_get(id).await,
        RunCommand::Logs {
            id,
            attempt,
            follow,
            client,
        } => {
            client::Client::new(&client)?
                .run_logs(id, attempt, follow)
                .await
        }
        RunCommand::Cancel { id, client } => client::Client::new(&client)?.run_cancel(id).await,
        RunCommand::Retry { id, client } => client::Client::new(&client)?.run_retry(id).await,
    }
}

/// `--public-url`: an http(s) URL without credentials, query or fragment.
fn parse_public_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("give an http:// or https:// URL with a host".to_string());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a public URL carries no credentials".to_string());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a public URL has no query or fragment".to_string());
    }
    Ok(text.trim_end_matches('/').to_string())
}

/// One `--param NAME=VALUE`.
fn parse_param(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
}

#[cfg(test)]
mod tests {
    use super::{parse_public_url, Cli};
    use clap::CommandFactory;

    /// Every subcommand and every argument a user can type says what it is for in `--help`.
    #[test]
    fn an_issuer_is_https_or_loopback_http_and_a_session_is_bounded() {
        use super::{parse_issuer, parse_session};
        assert_eq!(
            parse_issuer("https://id.example.com/realms/ops/").unwrap(),
            "https://id.example.com/realms/ops"
        );
        assert!(parse_issuer("http://127.0.0.1:5556").is_ok());
        assert!(parse_issuer("http://localhost:5556").is_ok());
        for bad in [
            "http://id.example.com",
            "ftp://id.example.com",
            "https://user:pass@id.example.com",
            "https://id.example.com/?x=1",
            "id.example.com",
        ] {
            assert!(parse_issuer(bad).is_err(), "{bad}");
        }
        assert!(parse_session("8h").is_ok());
        assert!(parse_session("12h").is_ok());
        assert!(parse_session("13h").is_err());
        assert!(parse_session("0s").is_err());
    }

    #[test]
    fn every_command_and_argument_has_a_help_line() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
                    missing.push(format!("{path} <{}>", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" || sub.is_hide_set() {
                    continue;
                }
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "sked", &mut missing);
        assert!(missing.is_empty(), "no help line: {missing:#?}");
    }

    #[test]
    fn a_public_url_is_http_with_a_host_and_nothing_secret() {
        assert_eq!(
            parse_public_url("https://sked.example.com/"),
            Ok("https://sked.example.com".to_string())
        );
        assert!(parse_public_url("http://10.0.0.5:8080").is_ok());
        for bad in [
            "sked.example.com",
            "ftp://sked.example.com",
            "https://user:pass@sked.example.com",
            "https://sked.example.com/?a=1",
        ] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
    }
}

//! sked's PostgreSQL link over TLS, black-box: the test starts PostgreSQL 15 instances of its
//! own (initdb and pg_ctl in a temporary directory, on free loopback ports; as the `postgres`
//! user when it runs as root) — one with `ssl = on`, a certificate for `localhost` signed by a
//! test CA, and client certificates demanded of one user; one without TLS, whose database
//! `sked` is read-only — and real `sked server` processes whose `--database-url` asks for each
//! `sslmode`. A server that should start must answer `/readyz`; one that should not must exit
//! with a message saying why, naming the file or host, and never the password.
//!
//! Needs PostgreSQL's server programs (`SKED_TEST_PG_BIN`, by default
//! /usr/lib/postgresql/15/bin) and the `openssl` command; without them, or without
//! `SKED_TEST_DATABASE_URL`, the test is reported as ignored (see build.rs), and under CI it
//! runs, so their absence fails it.

mod common;

use common::certs::{Issued, TestCa};
use common::{free_port, Proc};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Sent in every URL that should fail: no message may show it.
const PASSWORD: &str = "hunter2-never-shown";

/// Where PostgreSQL's server programs are.
fn pg_bin() -> PathBuf {
    std::env::var_os("SKED_TEST_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// Whether this process runs as root, which initdb and postgres refuse.
fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs one of PostgreSQL's programs, as the `postgres` user when this process is root.
fn pg(program: &str, args: &[&str]) {
    let path = pg_bin().join(program);
    let mut command = if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&path);
        c
    } else {
        Command::new(&path)
    };
    let out = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL instance of the test's own, stopped and removed when dropped.
struct Instance {
    dir: tempfile::TempDir,
    port: u16,
}

impl Instance {
    /// Creates and starts an instance with `settings` added to its postgresql.conf and
    /// `hba` as its pg_hba.conf; `files` are copied into its data directory first.
    fn start(settings: &str, hba: &str, files: &[(&Path, &str)]) -> Instance {
        let initdb = pg_bin().join("initdb");
        assert!(
            initdb.exists(),
            "{} is missing: install PostgreSQL 15's server (Debian: postgresql-15), or set \
             SKED_TEST_PG_BIN",
            initdb.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("sked-pg-")
            .tempdir()
            .expect("tempdir");
        if as_root() {
            chown_to_postgres(dir.path());
        }
        let data = dir.path().join("data");
        let data_arg = data.to_str().expect("utf-8 path");
        pg(
            "initdb",
            &[
                "-D",
                data_arg,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
        );
        for (from, name) in files {
            let to = data.join(name);
            std::fs::copy(from, &to).expect("copy a file into the data directory");
        }
        let port = free_port();
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             max_connections = 150\n{settings}\n",
            dir.path().display()
        );
        append(&data.join("postgresql.conf"), &conf);
        std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        if as_root() {
            chown_to_postgres(dir.path());
        }
        let log = dir.path().join("postgres.log");
        let log_arg = log.to_str().expect("utf-8 path");
        pg(
            "pg_ctl",
            &["-D", data_arg, "-l", log_arg, "-w", "-t", "30", "start"],
        );
        Instance { dir, port }
    }

    /// Runs each statement as the superuser over the instance's Unix socket (CREATE DATABASE
    /// must stand alone).
    async fn execute(&self, statements: &[&str]) {
        let url = format!(
            "host={} port={} user=postgres dbname=postgres",
            self.dir.path().display(),
            self.port
        );
        let client = sked_store::postgres::client(&url)
            .await
            .expect("connect over the Unix socket");
        for sql in statements {
            client.batch_execute(sql).await.expect(sql);
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let path = pg_bin().join("pg_ctl");
        let mut command = if as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let _ = command
            .args([
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .stdin(Stdio::null())
            .output();
    }
}

fn chown_to_postgres(dir: &Path) {
    let out = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .output()
        .expect("chown");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open postgresql.conf");
    file.write_all(text.as_bytes())
        .expect("append to postgresql.conf");
}

/// What a `sked server` started on a URL should do.
enum Expect {
    /// Answer `/readyz`, its start-up line holding this.
    Ready(&'static str),
    /// Exit with a message holding each of these.
    Refuse(Vec<String>),
}

/// One `sked server` on a URL: `None` when it did what `expect` says, else what went wrong.
async fn check(name: &str, url: &str, expect: Expect, scratch: &Path) -> Option<String> {
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir).expect("a directory per case");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = dir.join("server.log");
    let data = dir.join("data");
    let mut server = Proc::spawn(
        name,
        &[
            "server",
            "--listen",
            &listen,
            "--data-dir",
            data.to_str().expect("utf-8 path"),
            "--database-url",
            url,
        ],
        &log,
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    let outcome = loop {
        if let Ok(Some(status)) = server.child.try_wait() {
            break Err(status);
        }
        let ready = http
            .get(format!("http://{listen}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break Ok(());
        }
        if Instant::now() > deadline {
            return Some(format!(
                "{name}: neither ready nor stopped within 30 s: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    server.sigkill();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    // Shown with --nocapture: what an operator would read.
    eprintln!("[{name}] {}", said.lines().last().unwrap_or_default());
    if said.contains(PASSWORD) {
        return Some(format!("{name}: the password shows: {said}"));
    }
    match (expect, outcome) {
        (Expect::Ready(line), Ok(())) if said.contains(line) => None,
        (Expect::Ready(line), Ok(())) => Some(format!(
            "{name}: ready, but the start-up line lacks {line:?}: {said}"
        )),
        (Expect::Ready(_), Err(status)) => Some(format!("{name}: stopped ({status}): {said}")),
        (Expect::Refuse(words), Err(status)) if !status.success() => {
            let missing: Vec<_> = words
                .iter()
                .filter(|w| !said.contains(w.as_str()))
                .collect();
            (!missing.is_empty()).then(|| format!("{name}: the message lacks {missing:?}: {said}"))
        }
        (Expect::Refuse(_), Err(status)) => Some(format!("{name}: exited {status}: {said}")),
        (Expect::Refuse(_), Ok(())) => Some(format!("{name}: started, and should not have")),
    }
}

fn refuse(words: &[&str]) -> Expect {
    Expect::Refuse(words.iter().map(|w| w.to_string()).collect())
}

fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

#[cfg_attr(
    not(sked_pg_server_tests),
    ignore = "needs PostgreSQL's server programs (SKED_TEST_PG_BIN) and SKED_TEST_DATABASE_URL"
)]
#[tokio::test]
async fn sslmodes_client_certificates_and_several_hosts_against_real_postgresql() {
    let files = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(files.path(), "ca");
    let other_ca = TestCa::new(files.path(), "other-ca");
    // Only `localhost`: connecting by 127.0.0.1 is a name the certificate does not hold.
    let server = ca.issue(
        "server",
        "localhost",
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth",
    );
    let client = ca.issue("client", "certuser", "extendedKeyUsage=clientAuth");
    let stranger = other_ca.issue("stranger", "certuser", "extendedKeyUsage=clientAuth");

    // With TLS: plain connections are refused outright, so a server that starts used TLS.
    let tls = Instance::start(
        "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
         ssl_ca_file = 'ca.crt'",
        "local all all trust\n\
         hostssl all certuser 127.0.0.1/32 cert\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 127.0.0.1/32 reject\n",
        &[
            (&server.cert, "server.crt"),
            (&server.key, "server.key"),
            (&ca.cert, "ca.crt"),
        ],
    );
    tls.execute(&[
        "CREATE ROLE certuser LOGIN SUPERUSER",
        "CREATE DATABASE sked",
    ])
    .await;
    // Without TLS, its database `sked` read-only as a standby's would be.
    let plain = Instance::start(
        "ssl = off",
        "local all all trust\nhost all all 127.0.0.1/32 trust\n",
        &[],
    );
    plain
        .execute(&[
            "CREATE DATABASE sked",
            "ALTER DATABASE sked SET default_transaction_read_only = on",
        ])
        .await;
    let dead = free_port();

    let (t, p) = (tls.port, plain.port);
    let (ca_pem, other_pem) = (path(&ca.cert), path(&other_ca.cert));
    let Issued { cert, key } = &client;
    let (cert, key) = (path(cert), path(key));
    // A key others may read, a file that is no certificate, one that does not exist.
    let open_key = files.path().join("open.key");
    std::fs::copy(&client.key, &open_key).expect("copy");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let garbage = files.path().join("garbage.pem");
    std::fs::write(&garbage, "this is not a certificate\n").expect("write");
    let missing = files.path().join("no-such-ca.pem");
    let (open_key, garbage, missing) = (path(&open_key), path(&garbage), path(&missing));
    let as_user = |user: &str, host: &str, port: u16, db: &str, query: &str| {
        format!("postgres://{user}:{PASSWORD}@{host}:{port}/{db}?{query}")
    };

    let cases: Vec<(&str, String, Expect)> = vec![
        (
            "verify-full with the right CA and host",
            as_user(
                "postgres",
                "localhost",
                t,
                "postgres",
                &format!("sslmode=verify-full&sslrootcert={ca_pem}"),
            ),
            Expect::Ready(
                "sslmode=verify-full; certificate and host name checked against sslrootcert",
            ),
        ),
        (
            "verify-full with another CA",
            as_user(
                "postgres",
                "localhost",
                t,
                "postgres",
                &format!("sslmode=verify-full&sslrootcert={other_pem}"),
            ),
            refuse(&["not trusted", &other_pem, &format!("localhost:{t}")]),
        ),
        (
            "verify-full by a name the certificate lacks",
            as_user(
                "postgres",
                "127.0.0.1",
                t,
                "postgres",
                &format!("sslmode=verify-full&sslrootcert={ca_pem}"),
            ),
            refuse(&["not valid for the host name 127.0.0.1", "localhost"]),
        ),
        (
            "verify-ca by that name, in the keyword form",
            format!(
                "host=127.0.0.1 port={t} user=postgres dbname=postgres sslmode=verify-ca \
                 sslrootcert='{ca_pem}'"
            ),
            Expect::Ready("sslmode=verify-ca; certificate checked against sslrootcert"),
        ),
        (
            "require without a CA",
            as_user("postgres", "127.0.0.1", t, "postgres", "sslmode=require"),
            Expect::Ready("sslmode=require; the server's certificate is not checked"),
        ),
        (
            "require with a CA that did not sign",
            as_user(
                "postgres",
                "localhost",
                t,
                "postgres",
                &format!("sslmode=require&sslrootcert={other_pem}"),
            ),
            refuse(&["not trusted", &other_pem]),
        ),
        (
            "a client certificate where pg_hba demands one",
            as_user(
                "certuser",
                "localhost",
                t,
                "sked",
                &format!("sslmode=verify-full&sslrootcert={ca_pem}&sslcert={cert}&sslkey={key}"),
            ),
            Expect::Ready("sslmode=verify-full"),
        ),
        (
            "no client certificate where pg_hba demands one",
            as_user(
                "certuser",
                "localhost",
                t,
                "sked",
                &format!("sslmode=verify-full&sslrootcert={ca_pem}"),
            ),
            refuse(&["certificate"]),
        ),
        (
            "a client certificate of a CA the server does not trust",
            as_user(
                "certuser",
                "localhost",
                t,
                "sked",
                &format!(
                    "sslmode=verify-full&sslrootcert={ca_pem}&sslcert={}&sslkey={}",
                    path(&stranger.cert),
                    path(&stranger.key)
                ),
            ),
            refuse(&["refused the TLS handshake", &path(&stranger.cert)]),
        ),
        (
            "a private key others may read",
            as_user(
                "certuser",
                "localhost",
                t,
                "sked",
                &format!(
                    "sslmode=verify-full&sslrootcert={ca_pem}&sslcert={cert}&sslkey={open_key}"
                ),
            ),
            refuse(&[&open_key, "0600"]),
        ),
        (
            "a key that is not the certificate's",
            as_user(
                "certuser",
                "localhost",
                t,
                "sked",
                &format!(
                    "sslmode=verify-full&sslrootcert={ca_pem}&sslcert={cert}&sslkey={}",
                    path(&stranger.key)
                ),
            ),
            refuse(&[&path(&stranger.key), &cert, "is not the key of"]),
        ),
        (
            "an sslrootcert that does not exist",
            as_user(
                "postgres",
                "localhost",
                t,
                "postgres",
                &format!("sslmode=verify-full&sslrootcert={missing}"),
            ),
            refuse(&[&missing, "No such file"]),
        ),
        (
            "an sslrootcert that is no certificate",
            as_user(
                "postgres",
                "localhost",
                t,
                "postgres",
                &format!("sslmode=verify-ca&sslrootcert={garbage}"),
            ),
            refuse(&[&garbage, "no PEM certificate"]),
        ),
        (
            "require against a server without TLS",
            as_user("postgres", "127.0.0.1", p, "postgres", "sslmode=require"),
            refuse(&["does not offer TLS", &format!("127.0.0.1:{p}")]),
        ),
        (
            "prefer against a server without TLS",
            as_user("postgres", "127.0.0.1", p, "postgres", "sslmode=prefer"),
            Expect::Ready("sslmode=prefer"),
        ),
        (
            "several hosts, the first dead",
            format!(
                "postgres://postgres:{PASSWORD}@localhost:{dead},localhost:{t}/sked\
                 ?sslmode=verify-full&sslrootcert={ca_pem}&target_session_attrs=read-write"
            ),
            Expect::Ready(""),
        ),
        (
            "several hosts, the first read-only",
            format!(
                "postgres://postgres:{PASSWORD}@127.0.0.1:{p},localhost:{t}/sked\
                 ?target_session_attrs=read-write"
            ),
            Expect::Ready(""),
        ),
        (
            "several hosts, none usable",
            format!(
                "host=127.0.0.1,127.0.0.1 port={dead},{p} user=postgres password={PASSWORD} \
                 dbname=sked target_session_attrs=read-write"
            ),
            refuse(&[
                "no host could be used",
                &format!("127.0.0.1:{dead}: "),
                &format!("127.0.0.1:{p}: "),
                "database does not allow writes",
            ]),
        ),
    ];
    let scratch = tempfile::tempdir().expect("tempdir");
    let checks = cases
        .into_iter()
        .enumerate()
        .map(|(i, (name, url, expect))| {
            let scratch = scratch.path().to_path_buf();
            async move {
                check(&format!("{i:02}"), &url, expect, &scratch)
                    .await
                    .map(|problem| format!("{name}: {problem}"))
            }
        });
    let problems: Vec<String> = futures_util::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(problems.is_empty(), "\n{}", problems.join("\n\n"));
}

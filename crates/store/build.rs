//! Decides at build time whether a package's tests that need a real service run (this one's,
//! and the `sked` binary's, whose build script includes this file): PostgreSQL with
//! `SKED_TEST_DATABASE_URL` set (and the instances a test starts itself, over TLS, with that
//! and PostgreSQL's server programs in `SKED_TEST_PG_BIN`, by default
//! /usr/lib/postgresql/15/bin), the brokers (RabbitMQ, NATS, Redis) with
//! `SKED_TEST_AMQP_URL`, `SKED_TEST_NATS_URL` and `SKED_TEST_REDIS_URL` set, the web console
//! in a real Chromium with `SKED_TEST_CHROMEDRIVER` (the `chromedriver` to start), container
//! targets with `SKED_TEST_PODMAN` (the `podman` to run them with), the Celery target with the
//! brokers and `SKED_TEST_PYTHON` (a Python 3 to make Celery's venv with; alone, it runs the
//! tests whose peer is a Python program, such as the OTLP receiver), PostgreSQL failing
//! over with `SKED_TEST_DATABASE_URL` set and pg_auto_failover's `/usr/bin/pg_autoctl`
//! installed (the tests start formations of their own; the file is watched when it is there,
//! so its removal is noticed, and an install is noticed at the next change of the variables);
//! under CI, where their absence must fail loudly, always. Otherwise they are reported as
//! `ignored`, never as passed.

/// pg_auto_failover's command, from Debian's `pg-auto-failover-cli`.
const PG_AUTOCTL: &str = "/usr/bin/pg_autoctl";

fn set(var: &str) -> bool {
    println!("cargo::rerun-if-env-changed={var}");
    std::env::var(var).is_ok_and(|u| !u.trim().is_empty())
}

pub fn main() {
    println!("cargo::rustc-check-cfg=cfg(sked_pg_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_pg_server_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_broker_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_browser_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_container_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_celery_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_failover_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_python_tests)");
    println!("cargo::rerun-if-env-changed=CI");
    let ci = std::env::var_os("CI").is_some();
    let pg = set("SKED_TEST_DATABASE_URL");
    if pg || ci {
        println!("cargo::rustc-cfg=sked_pg_tests");
    }
    println!("cargo::rerun-if-env-changed=SKED_TEST_PG_BIN");
    let pg_bin = std::env::var_os("SKED_TEST_PG_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/lib/postgresql/15/bin".into());
    if pg_bin.is_dir() {
        // Noticed when PostgreSQL is installed or removed; a directory that does not exist
        // cannot be watched (cargo would run this script on every build).
        println!("cargo::rerun-if-changed={}", pg_bin.display());
    }
    if (pg && pg_bin.join("initdb").exists()) || ci {
        println!("cargo::rustc-cfg=sked_pg_server_tests");
    }
    let pg_autoctl = std::path::Path::new(PG_AUTOCTL);
    if pg_autoctl.exists() {
        println!("cargo::rerun-if-changed={PG_AUTOCTL}");
    }
    if (pg && pg_autoctl.exists()) || ci {
        println!("cargo::rustc-cfg=sked_failover_tests");
    }
    let brokers = [
        "SKED_TEST_AMQP_URL",
        "SKED_TEST_NATS_URL",
        "SKED_TEST_REDIS_URL",
    ];
    let all_brokers = brokers.iter().all(|var| set(var));
    if all_brokers || ci {
        println!("cargo::rustc-cfg=sked_broker_tests");
    }
    let python = set("SKED_TEST_PYTHON");
    if python || ci {
        println!("cargo::rustc-cfg=sked_python_tests");
    }
    if (all_brokers && python) || ci {
        println!("cargo::rustc-cfg=sked_celery_tests");
    }
    if set("SKED_TEST_CHROMEDRIVER") || ci {
        println!("cargo::rustc-cfg=sked_browser_tests");
    }
    if set("SKED_TEST_PODMAN") || ci {
        println!("cargo::rustc-cfg=sked_container_tests");
    }
}

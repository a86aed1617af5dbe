//! Decides at build time whether a package's tests that need a real service run (this one's,
//! and the `sked` binary's, whose build script includes this file): PostgreSQL with
//! `SKED_TEST_DATABASE_URL` set, the brokers (RabbitMQ, NATS, Redis) with
//! `SKED_TEST_AMQP_URL`, `SKED_TEST_NATS_URL` and `SKED_TEST_REDIS_URL` set, the web console
//! in a real Chromium with `SKED_TEST_CHROMEDRIVER` (the `chromedriver` to start); under CI, where
//! their absence must fail loudly, always. Otherwise they are reported as `ignored`, never as
//! passed.

fn set(var: &str) -> bool {
    println!("cargo::rerun-if-env-changed={var}");
    std::env::var(var).is_ok_and(|u| !u.trim().is_empty())
}

pub fn main() {
    println!("cargo::rustc-check-cfg=cfg(sked_pg_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_broker_tests)");
    println!("cargo::rustc-check-cfg=cfg(sked_browser_tests)");
    println!("cargo::rerun-if-env-changed=CI");
    let ci = std::env::var_os("CI").is_some();
    if set("SKED_TEST_DATABASE_URL") || ci {
        println!("cargo::rustc-cfg=sked_pg_tests");
    }
    let brokers = [
        "SKED_TEST_AMQP_URL",
        "SKED_TEST_NATS_URL",
        "SKED_TEST_REDIS_URL",
    ];
    if brokers.iter().all(|var| set(var)) || ci {
        println!("cargo::rustc-cfg=sked_broker_tests");
    }
    if set("SKED_TEST_CHROMEDRIVER") || ci {
        println!("cargo::rustc-cfg=sked_browser_tests");
    }
}

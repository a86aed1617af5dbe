//! Decides at build time whether a package's PostgreSQL tests run (this one's, and the `sked`
//! binary's, which names this file as its build script): with
//! `SKED_TEST_DATABASE_URL` set (or under CI, where its absence must fail loudly) they are
//! compiled as ordinary tests; without it they are reported as `ignored`, never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(sked_pg_tests)");
    println!("cargo::rerun-if-env-changed=SKED_TEST_DATABASE_URL");
    println!("cargo::rerun-if-env-changed=CI");
    let url_set = std::env::var("SKED_TEST_DATABASE_URL").is_ok_and(|u| !u.trim().is_empty());
    if url_set || std::env::var_os("CI").is_some() {
        println!("cargo::rustc-cfg=sked_pg_tests");
    }
}

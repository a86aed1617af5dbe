//! The bench's build script: which of its tests need a real service and run (the store's
//! rules, shared: under CI always, otherwise only with the service's variable set, and
//! reported as `ignored` without it, never as passed).

#[path = "../crates/store/build.rs"]
mod service_tests;

fn main() {
    service_tests::main();
}

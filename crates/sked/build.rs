//! The `sked` binary's build script: which of its tests need a real service and run (the
//! store's rules, shared), and what `sked --version` says: the commit and the build date.
//!
//! The commit comes from `SKED_BUILD_COMMIT` when set (a build from a source archive), else
//! from git, else it is `unknown`. The date is `SOURCE_DATE_EPOCH`'s when set (reproducible
//! builds), else today's in UTC; it is taken when the commit changes, not at every build.

#[path = "../store/build.rs"]
mod service_tests;

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    service_tests::main();
    println!("cargo::rerun-if-env-changed=SKED_BUILD_COMMIT");
    println!("cargo::rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = std::env::var("SKED_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        });
    println!("cargo::rustc-env=SKED_COMMIT={}", commit.trim());
    println!("cargo::rustc-env=SKED_BUILD_DATE={}", utc_date(seconds));
}

/// The checked-out commit, abbreviated; `None` outside a git checkout. The build script runs
/// again when HEAD moves (a commit, a checkout), through the files git keeps it in.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let git_dir = PathBuf::from(git(&["rev-parse", "--git-dir"])?);
    let common_dir = PathBuf::from(git(&["rev-parse", "--git-common-dir"])?);
    let mut watched = vec![git_dir.join("HEAD"), common_dir.join("packed-refs")];
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common_dir.join(reference));
    }
    // A path that does not exist would make cargo run this script at every build.
    for path in watched.iter().filter(|p| Path::new(p).exists()) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    Some(commit)
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// `YYYY-MM-DD` of a Unix time, in UTC (the civil-from-days conversion of the proleptic
/// Gregorian calendar).
fn utc_date(seconds: u64) -> String {
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

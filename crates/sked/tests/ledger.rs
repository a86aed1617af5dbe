//! The ledger under SIGKILL: many schedules on `sked dev`, the process killed outright at
//! seeded random moments while it fires and runs them, restarted each time. Afterwards every
//! instant each schedule owed, from its first to its last, has exactly one run, and every run
//! has ended; with `run_all` each one ran.

mod common;

use common::{instant, shell, Rng, Sked};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const JOBS: usize = 40;
const KILLS: usize = 3;

#[tokio::test]
async fn every_owed_instant_has_one_run_across_sigkills() {
    let mut rng = Rng::from_env();
    let mut sked = Sked::new();
    sked.start_dev(&["--slots", "32"]).await;
    let created = chrono::Utc::now();
    for i in 0..JOBS {
        let job = json!({
            "schedule": {"every": "1s"},
            "target": shell("echo $SKED_SCHEDULED_FOR"),
            "misfire": {"policy": "run_all", "catchup_window": "1h"},
        });
        assert_eq!(sked.put_job(&format!("j{i:02}"), job).await.0, 201);
    }
    for kill in 0..KILLS {
        let alive_ms = 1500 + rng.below(2500);
        let down_ms = 200 + rng.below(2000);
        tokio::time::sleep(Duration::from_millis(alive_ms)).await;
        println!("kill {kill}: SIGKILL after {alive_ms} ms, down {down_ms} ms");
        sked.server.as_mut().expect("sked dev runs").sigkill();
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        sked.start_dev(&["--slots", "32"]).await;
    }
    // Let the last catch-up and any run cut off by a kill finish (a lost attempt comes back
    // after the heartbeat timeout).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let checked = chrono::Utc::now();

    let mut total = 0;
    for i in 0..JOBS {
        let name = format!("j{i:02}");
        let runs = sked.wait_runs(&name, 5, Duration::from_secs(30)).await;
        let mut per_instant: BTreeMap<String, usize> = BTreeMap::new();
        for run in &runs {
            *per_instant
                .entry(
                    run["scheduled_for"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
                .or_default() += 1;
        }
        let doubled: Vec<_> = per_instant.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            doubled.is_empty(),
            "{name}: instants with two runs {doubled:?}"
        );
        for pair in runs.windows(2) {
            let gap = instant(&pair[1]["scheduled_for"]) - instant(&pair[0]["scheduled_for"]);
            assert_eq!(
                gap,
                chrono::Duration::seconds(1),
                "{name}: an instant is missing: {pair:?}"
            );
        }
        for run in &runs {
            assert_eq!(run["state"], "succeeded", "{name}: {run}");
        }
        // Nothing missing at either end: the first instant follows the job's creation, the
        // last is the one just before the check.
        let (first, last) = (
            instant(&runs[0]["scheduled_for"]),
            instant(&runs[runs.len() - 1]["scheduled_for"]),
        );
        let second = chrono::Duration::seconds(1);
        assert!(
            first - created <= second * 2,
            "{name}: first instant {first}"
        );
        assert!(checked - last <= second * 2, "{name}: last instant {last}");
        total += runs.len();
    }
    println!("{total} runs of {JOBS} schedules checked across {KILLS} SIGKILLs");
}

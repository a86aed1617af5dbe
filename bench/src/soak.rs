//! `soak`: the `e2e` load held for a long time on PostgreSQL with run retention on, to see how
//! the ledger ages rather than how fast it is. Every sample period it records what the run and
//! attempt tables weigh with their indexes, their live and dead rows, autovacuum's passes so
//! far, the runs completed per second, and the lateness (instant to result recorded) of the
//! runs due in the period. Retention deletes in passes (the first a minute after start, then
//! every ten minutes), so the samples show what a pass costs the runs beside it.
//! Only reads statistics views and the runs of the schema under test.

use crate::e2e::Counters;
use crate::harness::{start_configured, store_with_jobs};
use crate::noop;
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sked_core::job::JobSpec;
use sked_server::ServerConfig;
use std::time::Duration;

pub struct Options {
    pub schedules: usize,
    pub seconds: u64,
    pub slots: u32,
    pub retention: Duration,
    pub sample: Duration,
    pub partition_runs: bool,
}

pub async fn run(database_url: Option<&str>, options: Options) -> Result<Value> {
    if database_url.is_none() {
        bail!("soak measures PostgreSQL's tables and needs --database-url");
    }
    let jobs = (0..options.schedules).map(|i| {
        let spec: JobSpec = serde_json::from_value(json!({
            "schedule": {"every": "1s"},
            "target": {"shell": {"command": "true"}},
        }))
        .expect("a valid benchmark job");
        (format!("noop-{i:07}"), spec)
    });
    let (store, place) = store_with_jobs(database_url, jobs).await?;
    let config = ServerConfig {
        retention: Some(options.retention),
        partition_runs: options.partition_runs,
        ..ServerConfig::default()
    };
    let mut server = start_configured(store, place, 1, config).await?;
    let http = crate::harness::http_client();
    let deadline = std::time::Instant::now() + Duration::from_secs(options.seconds);
    let workers = noop::spawn(
        &http,
        &server.bases,
        options.slots,
        &noop::Until::deadline(deadline),
    );
    let sampled = async {
        let (Some(admin), Some(schema)) = (server.admin(), server.schema()) else {
            bail!("soak needs a PostgreSQL schema");
        };
        let mut samples = Vec::new();
        let mut last = Counters::read(&server).await?;
        let mut since = Utc::now();
        while std::time::Instant::now() + options.sample <= deadline {
            tokio::time::sleep(options.sample).await;
            let now = Utc::now();
            let counters = Counters::read(&server).await?;
            let seconds = (now - since).num_milliseconds() as f64 / 1000.0;
            let mut sample = tables(admin, schema).await?;
            sample["at_seconds"] = json!((samples.len() + 1) as f64 * options.sample.as_secs_f64());
            sample["completed_per_second"] =
                json!((counters.completions - last.completions) / seconds);
            sample["lateness_ms"] = lateness(admin, schema, since, now).await?;
            println!("{sample}");
            samples.push(sample);
            (last, since) = (counters, now);
        }
        Ok(samples)
    };
    let (completed, samples) = tokio::join!(noop::join(workers), sampled);
    server.stop().await;
    server.finish().await;
    Ok(json!({
        "scenario": "soak",
        "schedules": options.schedules,
        "seconds": options.seconds,
        "retention_seconds": options.retention.as_secs(),
        "partition_runs": options.partition_runs,
        "completions_sent": completed?,
        "samples": samples?,
    }))
}

/// Size (with indexes and TOAST), rows and vacuum passes of the run and attempt tables, summed
/// over their partitions (a dropped partition takes its counts with it), and how many
/// partitions each has.
async fn tables(admin: &tokio_postgres::Client, schema: &str) -> Result<Value> {
    let rows = admin
        .query(
            "SELECT coalesce(p.relname, s.relname), \
                 sum(pg_total_relation_size(s.relid))::bigint, \
                 sum(pg_indexes_size(s.relid))::bigint, \
                 sum(n_live_tup)::bigint, sum(n_dead_tup)::bigint, \
                 sum(autovacuum_count)::bigint, sum(autoanalyze_count)::bigint, \
                 sum(n_tup_del)::bigint, sum(n_tup_hot_upd)::bigint, sum(n_tup_upd)::bigint, \
                 count(*) \
             FROM pg_stat_user_tables s \
             LEFT JOIN pg_inherits i ON i.inhrelid = s.relid \
             LEFT JOIN pg_class p ON p.oid = i.inhparent \
             WHERE s.schemaname = $1 AND coalesce(p.relname, s.relname) IN ('runs', 'attempts') \
             GROUP BY 1",
            &[&schema],
        )
        .await
        .context("reading pg_stat_user_tables")?;
    let mut tables = serde_json::Map::new();
    for row in rows {
        let name: String = row.try_get(0)?;
        let mb = |bytes: i64| bytes as f64 / (1024.0 * 1024.0);
        tables.insert(
            name,
            json!({
                "total_mb": mb(row.try_get(1)?),
                "indexes_mb": mb(row.try_get(2)?),
                "live": row.try_get::<_, i64>(3)?,
                "dead": row.try_get::<_, i64>(4)?,
                "autovacuums": row.try_get::<_, i64>(5)?,
                "autoanalyzes": row.try_get::<_, i64>(6)?,
                "deleted": row.try_get::<_, i64>(7)?,
                "hot_updates": row.try_get::<_, i64>(8)?,
                "updates": row.try_get::<_, i64>(9)?,
                "partitions": row.try_get::<_, i64>(10)?,
            }),
        );
    }
    Ok(Value::Object(tables))
}

/// p50, p99 and max of instant to result recorded, over the runs due in `[from, to)` that have
/// finished (a run still running at the sample is left out; the next sample does not see it).
async fn lateness(
    admin: &tokio_postgres::Client,
    schema: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Value> {
    let micros = |t: DateTime<Utc>| t.timestamp_micros();
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*), \
                 percentile_cont(0.5) WITHIN GROUP (ORDER BY finished_at - scheduled_for), \
                 percentile_cont(0.99) WITHIN GROUP (ORDER BY finished_at - scheduled_for), \
                 max(finished_at - scheduled_for) \
                 FROM {quoted}.runs WHERE namespace = 'default' \
                 AND scheduled_for >= $1 AND scheduled_for < $2 AND finished_at IS NOT NULL"
            ),
            &[&micros(from), &micros(to)],
        )
        .await
        .context("reading the period's runs")?;
    let as_ms = |v: Option<f64>| v.map(|micros| micros / 1000.0);
    let max: Option<i64> = row.try_get(3)?;
    Ok(json!({
        "runs": row.try_get::<_, i64>(0)?,
        "p50": as_ms(row.try_get(1)?),
        "p99": as_ms(row.try_get(2)?),
        "max": as_ms(max.map(|m| m as f64)),
    }))
}

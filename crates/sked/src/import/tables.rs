//! The tables `sked import` reads from a PostgreSQL URL: pg_cron's `cron.job` (and the
//! `cron.timezone`, `cron.match_dom_and_dow` settings it runs under) and django-celery-beat's
//! periodic tasks joined with their schedules.
//!
//! Read-only and bounded: every query runs in a `READ ONLY` transaction with a statement
//! timeout, the whole read within [`READ_TIMEOUT`], at most [`MAX_ROWS`] rows (more is an
//! error, not a silent cut). The URL may hold a password: it is named by host and database
//! only ([`Connector::place`]), in the output file and in every error. The translation is
//! `sked_import`'s; this module only reads.

use super::{ImportArgs, Kind};
use anyhow::{anyhow, bail, Context, Result};
use sked_import::celery_beat::{DjangoBeatTask, DjangoCrontab, DjangoInterval, DjangoSolar};
use sked_import::pg_cron::{self, PgCronJob};
use sked_import::Import;
use sked_store::postgres::connection::Connector;
use std::time::Duration;
use tokio_postgres::{Client, Row};

/// The most rows an import reads; more is refused.
pub const MAX_ROWS: i64 = 10_000;
/// The longest a whole read (connecting included) may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `source` is a PostgreSQL URL rather than a file.
pub fn is_database_url(source: &str) -> bool {
    source.starts_with("postgres://") || source.starts_with("postgresql://")
}

/// Reads and translates the tables `args.kind` names; returns the import and how the source
/// is named (without the URL's password).
pub async fn import(
    args: &ImportArgs,
    timezone: Option<chrono_tz::Tz>,
) -> Result<(Import, String)> {
    let connector = Connector::new(&args.source).map_err(|e| anyhow!("{e}"))?;
    let place = connector.place().to_string();
    let read = async {
        let client = connector.client().await.map_err(|e| anyhow!("{e}"))?;
        match args.kind {
            Kind::PgCron => {
                let (rows, mut options) = read_pg_cron(&client).await?;
                if timezone.is_some() {
                    options.timezone = timezone;
                }
                Ok(pg_cron::import_rows_with(&rows, &options))
            }
            _ => {
                let rows = read_django_beat(&client).await?;
                let connection = args.connection.as_deref().unwrap_or_default();
                Ok(sked_import::celery_beat::import_django_rows(
                    &rows, connection,
                ))
            }
        }
    };
    let import = tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| anyhow!("{place}: reading took over {}s", READ_TIMEOUT.as_secs()))?
        .map_err(|e: anyhow::Error| anyhow!("{place}: {e:#}"))?;
    Ok((import, place))
}

/// A read-only transaction with a statement timeout, and the bounded query's rows.
async fn rows(client: &Client, sql: &str) -> Result<Vec<Row>> {
    client
        .batch_execute(&format!(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = '{}s'",
            READ_TIMEOUT.as_secs()
        ))
        .await
        .context("cannot start a read-only transaction")?;
    let result = client.query(sql, &[&(MAX_ROWS + 1)]).await;
    // Nothing was written; the transaction only bounded the reads.
    let _ = client.batch_execute("ROLLBACK").await;
    let rows = result?;
    if rows.len() as i64 > MAX_ROWS {
        bail!("more than {MAX_ROWS} rows: sked import reads at most {MAX_ROWS}");
    }
    Ok(rows)
}

/// A setting of the server, `None` when it does not exist or may not be read (pg_cron's
/// settings are its superusers' to read).
async fn setting(client: &Client, name: &str) -> Option<String> {
    client
        .query_one("SELECT current_setting($1, true)", &[&name])
        .await
        .ok()
        .and_then(|row| row.try_get::<_, Option<String>>(0).ok().flatten())
        .filter(|v| !v.is_empty())
}

async fn read_pg_cron(client: &Client) -> Result<(Vec<PgCronJob>, pg_cron::Options)> {
    let mut options = pg_cron::Options::default();
    match setting(client, "cron.timezone").await {
        // PostgreSQL spells UTC as GMT too.
        Some(zone) if matches!(zone.as_str(), "GMT" | "UTC" | "Etc/UTC" | "Etc/GMT") => {}
        Some(zone) => {
            options.timezone = Some(zone.parse().map_err(|_| {
                anyhow!(
                    "cron.timezone {zone:?} is not an IANA time zone sked knows: \
                     give the zone with --timezone"
                )
            })?)
        }
        None => eprintln!(
            "cron.timezone could not be read (pg_cron before 1.5, or a role that may not read \
             it): the schedules are read in GMT, pg_cron's default; --timezone reads them in \
             another"
        ),
    }
    options.match_dom_and_dow = setting(client, "cron.match_dom_and_dow")
        .await
        .is_some_and(|v| matches!(v.as_str(), "on" | "true" | "1"));
    let rows = rows(
        client,
        "SELECT jobid::bigint, jobname, schedule, command, database, username, nodename, \
                nodeport::int, active \
         FROM cron.job ORDER BY jobid LIMIT $1",
    )
    .await
    .context("cannot read cron.job")?;
    let jobs = rows
        .iter()
        .map(|row| -> Result<PgCronJob> {
            Ok(PgCronJob {
                jobid: row.try_get(0)?,
                jobname: row.try_get(1)?,
                schedule: row.try_get(2)?,
                command: row.try_get(3)?,
                database: row.try_get(4)?,
                username: row.try_get(5)?,
                nodename: row.try_get(6)?,
                nodeport: row.try_get(7)?,
                active: row.try_get(8)?,
            })
        })
        .collect::<Result<Vec<_>>>()
        .context("cannot read cron.job")?;
    Ok((jobs, options))
}

/// An instant from the seconds since the epoch a query gave.
fn instant(seconds: Option<i64>) -> Option<sked_core::Instant> {
    seconds.and_then(|s| chrono::DateTime::from_timestamp(s, 0))
}

async fn read_django_beat(client: &Client) -> Result<Vec<DjangoBeatTask>> {
    let rows = rows(
        client,
        "SELECT t.id::bigint, t.name, t.task, t.args, t.kwargs, t.queue, t.exchange, \
                t.routing_key, t.priority::bigint, \
                floor(extract(epoch FROM t.expires))::bigint, t.expire_seconds::bigint, \
                t.enabled, t.one_off, floor(extract(epoch FROM t.start_time))::bigint, \
                t.description, \
                c.id IS NOT NULL, c.minute, c.hour, c.day_of_week, c.day_of_month, \
                c.month_of_year, c.timezone::text, \
                i.id IS NOT NULL, i.every::bigint, i.period, \
                s.id IS NOT NULL, s.event, s.latitude::text, s.longitude::text, \
                floor(extract(epoch FROM k.clocked_time))::bigint \
         FROM django_celery_beat_periodictask t \
         LEFT JOIN django_celery_beat_crontabschedule c ON c.id = t.crontab_id \
         LEFT JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id \
         LEFT JOIN django_celery_beat_solarschedule s ON s.id = t.solar_id \
         LEFT JOIN django_celery_beat_clockedschedule k ON k.id = t.clocked_id \
         ORDER BY t.id LIMIT $1",
    )
    .await
    .context("cannot read django-celery-beat's tables")?;
    rows.iter()
        .map(|row| -> Result<DjangoBeatTask> {
            let text = |i: usize| -> Result<String> {
                Ok(row.try_get::<_, Option<String>>(i)?.unwrap_or_default())
            };
            let crontab = if row.try_get::<_, bool>(15)? {
                Some(DjangoCrontab {
                    minute: text(16)?,
                    hour: text(17)?,
                    day_of_week: text(18)?,
                    day_of_month: text(19)?,
                    month_of_year: text(20)?,
                    timezone: text(21)?,
                })
            } else {
                None
            };
            let interval = if row.try_get::<_, bool>(22)? {
                Some(DjangoInterval {
                    every: row.try_get::<_, Option<i64>>(23)?.unwrap_or_default(),
                    period: text(24)?,
                })
            } else {
                None
            };
            let solar = if row.try_get::<_, bool>(25)? {
                Some(DjangoSolar {
                    event: text(26)?,
                    latitude: text(27)?,
                    longitude: text(28)?,
                })
            } else {
                None
            };
            Ok(DjangoBeatTask {
                id: row.try_get(0)?,
                name: text(1)?,
                task: text(2)?,
                args: text(3)?,
                kwargs: text(4)?,
                queue: row.try_get(5)?,
                exchange: row.try_get(6)?,
                routing_key: row.try_get(7)?,
                priority: row.try_get(8)?,
                expires: instant(row.try_get(9)?),
                expire_seconds: row.try_get(10)?,
                enabled: row.try_get(11)?,
                one_off: row.try_get(12)?,
                start_time: instant(row.try_get(13)?),
                description: row.try_get(14)?,
                crontab,
                interval,
                solar,
                clocked: instant(row.try_get(29)?),
            })
        })
        .collect::<Result<Vec<_>>>()
        .context("cannot read django-celery-beat's tables")
}

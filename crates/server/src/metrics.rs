//! Counters the server keeps about itself, exposed at `/metrics` in Prometheus' text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub fires: AtomicU64,
    pub fires_skipped: AtomicU64,
    pub fires_skipped_backlog: AtomicU64,
    pub fire_batches: AtomicU64,
    pub attempts_started: AtomicU64,
    /// Broker targets: messages the broker confirmed, and publishes that failed.
    pub messages_published: AtomicU64,
    pub messages_failed: AtomicU64,
    pub completions_accepted: AtomicU64,
    pub completions_rejected: AtomicU64,
    pub attempts_lost: AtomicU64,
    pub retries: AtomicU64,
    pub workers_declared_dead: AtomicU64,
    pub runs_deleted: AtomicU64,
    /// Sum and count of firing lateness (instant -> ledger row) in microseconds.
    pub fire_lateness_us_sum: AtomicU64,
    pub schedules: AtomicU64,
    pub queue_depth: AtomicU64,
    pub workers_overloaded: AtomicU64,
    /// Log streams being followed now.
    pub log_follows: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, n: u64) {
        gauge.store(n, Ordering::Relaxed);
    }

    /// Counts one more on `gauge` until the returned guard is dropped, however the code
    /// holding it ends.
    pub fn hold(gauge: &AtomicU64) -> Held<'_> {
        gauge.fetch_add(1, Ordering::Relaxed);
        Held(gauge)
    }

    /// The Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let rows: [(&str, &str, &str, &AtomicU64); 18] = [
            (
                "sked_fires_total",
                "counter",
                "Instants written to the ledger.",
                &self.fires,
            ),
            (
                "sked_fires_skipped_total",
                "counter",
                "Instants recorded as skipped.",
                &self.fires_skipped,
            ),
            (
                "sked_fires_skipped_backlog_total",
                "counter",
                "Instants recorded as skipped because their job or namespace had too many runs queued.",
                &self.fires_skipped_backlog,
            ),
            (
                "sked_fire_batches_total",
                "counter",
                "Ledger transactions of the firing loop.",
                &self.fire_batches,
            ),
            (
                "sked_fire_lateness_microseconds_sum",
                "counter",
                "Sum of firing lateness.",
                &self.fire_lateness_us_sum,
            ),
            (
                "sked_attempts_started_total",
                "counter",
                "Attempts handed to workers.",
                &self.attempts_started,
            ),
            (
                "sked_messages_published_total",
                "counter",
                "Messages of broker targets the broker confirmed.",
                &self.messages_published,
            ),
            (
                "sked_messages_failed_total",
                "counter",
                "Publishes of broker targets that failed or timed out.",
                &self.messages_failed,
            ),
            (
                "sked_completions_accepted_total",
                "counter",
                "Attempt results recorded.",
                &self.completions_accepted,
            ),
            (
                "sked_completions_rejected_total",
                "counter",
                "Attempt results rejected (fenced or unknown).",
                &self.completions_rejected,
            ),
            (
                "sked_attempts_lost_total",
                "counter",
                "Attempts lost with their worker; their runs were re-queued without spending a retry.",
                &self.attempts_lost,
            ),
            (
                "sked_retries_total",
                "counter",
                "Failed or timed-out attempts whose run was queued again by its retry policy.",
                &self.retries,
            ),
            (
                "sked_workers_declared_dead_total",
                "counter",
                "Workers declared dead after missing heartbeats.",
                &self.workers_declared_dead,
            ),
            (
                "sked_runs_deleted_total",
                "counter",
                "Finished runs removed by retention.",
                &self.runs_deleted,
            ),
            (
                "sked_schedules",
                "gauge",
                "Schedules held by the firing loop.",
                &self.schedules,
            ),
            (
                "sked_dispatch_queue_depth",
                "gauge",
                "Runs waiting in the dispatcher.",
                &self.queue_depth,
            ),
            (
                "sked_workers_overloaded",
                "gauge",
                "Workers this node knows whose overload control holds them back now.",
                &self.workers_overloaded,
            ),
            (
                "sked_log_follows",
                "gauge",
                "Run logs being followed (GET /runs/{id}/log?follow=true) now.",
                &self.log_follows,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
        out
    }
}

/// One unit of a gauge, given back on drop (see [`Metrics::hold`]).
pub struct Held<'a>(&'a AtomicU64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

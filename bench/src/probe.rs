//! What the runtime and the machine were doing during a benchmark's window, minute by minute,
//! so a latency tail can be put down to this process being late to run its tasks, its blocking
//! pool being late to start work, the broker, or the machine being short of CPU (time stolen by
//! the hypervisor included), rather than guessed at.
//!
//! It measures from the outside only (timers, `/proc`); it must not change what it measures
//! beyond one timer task and one blocking call every few milliseconds.

use serde_json::{json, Value};
use sked_core::stats::percentiles;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often the runtime probe asks to be woken.
const TICK: Duration = Duration::from_millis(10);
/// How often the blocking-pool probe hands it a no-op.
const BLOCKING_EVERY: Duration = Duration::from_millis(50);

/// Readings kept where the probing tasks and [`Probe::finish`] both reach them: the tasks
/// are aborted at the end, and what they read so far must survive that.
type Shared<T> = Arc<Mutex<Vec<T>>>;

pub struct Probe {
    from: Instant,
    tasks: Vec<JoinHandle<()>>,
    /// Since `from`, how late the runtime woke a timer task, in ms.
    runtime: Shared<(Duration, f64)>,
    /// Since `from`, how long a no-op waited for the blocking pool, in ms.
    blocking: Shared<(Duration, f64)>,
    /// CPU counters at `from` and at each whole minute after it.
    usage: Shared<Usage>,
}

fn push<T>(shared: &Shared<T>, value: T) {
    shared.lock().unwrap_or_else(|p| p.into_inner()).push(value);
}

fn take<T>(shared: &Shared<T>) -> Vec<T> {
    std::mem::take(&mut *shared.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Starts probing now, for `minutes` minutes (or until [`Probe::finish`]); `broker` is the
/// command name of the broker's process (`beam.smp` for RabbitMQ), whose CPU is read too.
pub fn start(minutes: u64, broker: &'static str) -> Probe {
    let from = Instant::now();
    let until = from + Duration::from_secs(minutes * 60);
    let (runtime, blocking, usage) = (Shared::default(), Shared::default(), Shared::default());
    let mut tasks = Vec::new();
    let delays = Arc::clone(&runtime);
    tasks.push(tokio::spawn(async move {
        while Instant::now() < until {
            let asked = Instant::now();
            tokio::time::sleep(TICK).await;
            let late = asked.elapsed().saturating_sub(TICK);
            push(&delays, (asked - from, late.as_secs_f64() * 1000.0));
        }
    }));
    let delays = Arc::clone(&blocking);
    tasks.push(tokio::spawn(async move {
        while Instant::now() < until {
            let asked = Instant::now();
            if let Ok(started) = tokio::task::spawn_blocking(Instant::now).await {
                push(
                    &delays,
                    (asked - from, (started - asked).as_secs_f64() * 1000.0),
                );
            }
            tokio::time::sleep(BLOCKING_EVERY).await;
        }
    }));
    let readings = Arc::clone(&usage);
    tasks.push(tokio::spawn(async move {
        let broker = pid_of(broker);
        push(&readings, Usage::now(broker));
        for minute in 1..=minutes {
            tokio::time::sleep_until((from + Duration::from_secs(minute * 60)).into()).await;
            push(&readings, Usage::now(broker));
        }
    }));
    Probe {
        from,
        tasks,
        runtime,
        blocking,
        usage,
    }
}

impl Probe {
    /// The figures of each whole minute probed, as JSON objects in minute order.
    pub fn finish(self) -> Vec<Value> {
        let elapsed_minutes = (self.from.elapsed().as_secs() / 60) as usize;
        for task in &self.tasks {
            task.abort();
        }
        let (runtime, blocking, usage) =
            (take(&self.runtime), take(&self.blocking), take(&self.usage));
        let by_minute = |samples: &[(Duration, f64)], minute: usize| {
            let mut values: Vec<f64> = samples
                .iter()
                .filter(|(at, _)| at.as_secs() / 60 == minute as u64)
                .map(|(_, v)| *v)
                .collect();
            let p = percentiles(&mut values);
            json!({"p99": p.p99, "max": p.max})
        };
        (0..elapsed_minutes.min(usage.len().saturating_sub(1)))
            .map(|minute| {
                let (a, b) = (&usage[minute], &usage[minute + 1]);
                let machine = b.machine.since(&a.machine);
                json!({
                    "minute": minute,
                    "runtime_late_ms": by_minute(&runtime, minute),
                    "blocking_start_ms": by_minute(&blocking, minute),
                    // Shares of the whole machine (every core), 0 to 1.
                    "machine": machine,
                    // Cores' worth of CPU time in the minute.
                    "this_process_cores": (b.this_process - a.this_process) / 60.0,
                    "broker_cores": b.broker.zip(a.broker).map(|(b, a)| (b - a) / 60.0),
                })
            })
            .collect()
    }
}

/// One reading of the CPU counters.
struct Usage {
    machine: MachineTicks,
    /// Seconds of CPU this process has used.
    this_process: f64,
    broker: Option<f64>,
}

impl Usage {
    fn now(broker: Option<u32>) -> Usage {
        let cpu = |pid: u32| crate::process::cpu_time(pid).ok().map(|t| t.own);
        Usage {
            machine: MachineTicks::read().unwrap_or_default(),
            this_process: cpu(std::process::id()).unwrap_or(0.0),
            broker: broker.and_then(cpu),
        }
    }
}

/// The first line of `/proc/stat`, in clock ticks since boot.
#[derive(Default, Clone, Copy)]
struct MachineTicks {
    busy: u64,
    iowait: u64,
    steal: u64,
    idle: u64,
}

impl MachineTicks {
    fn read() -> Option<MachineTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let n: Vec<u64> = line
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let at = |i: usize| n.get(i).copied().unwrap_or(0);
        Some(MachineTicks {
            busy: at(0) + at(1) + at(2) + at(5) + at(6),
            idle: at(3),
            iowait: at(4),
            steal: at(7),
        })
    }

    fn since(&self, before: &MachineTicks) -> Value {
        let busy = self.busy.saturating_sub(before.busy) as f64;
        let idle = self.idle.saturating_sub(before.idle) as f64;
        let iowait = self.iowait.saturating_sub(before.iowait) as f64;
        let steal = self.steal.saturating_sub(before.steal) as f64;
        let total = (busy + idle + iowait + steal).max(1.0);
        let share = |v: f64| (v / total * 1000.0).round() / 1000.0;
        json!({"busy": share(busy), "iowait": share(iowait), "steal": share(steal), "idle": share(idle)})
    }
}

/// The first process whose command name is `name`.
fn pid_of(name: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|comm| comm.trim() == name)
                .unwrap_or(false)
        })
}

//! The synthetic workload: a trace shaped like the seed's rule processing traffic.
//!
//! Owns the generator and its distributions. Knows nothing of servers or policies beyond the
//! pool size its arrival rate is calibrated for. Every draw comes from one
//! [`rand::rngs::StdRng`] seeded with the workload's seed.
//!
//! - **Projects.** [`Workload::projects`] projects (2,000), the affinity keys `project-1` ...,
//!   drawn by a Zipf popularity: project `k` with weight `1 / k^zipf` (`zipf` 1.0, so the top
//!   32 projects draw about half the requests). Each project has a size: lognormal, median 1,
//!   sigma [`PROJECT_SIGMA`] (0.6), which scales both its execution and its cold start.
//! - **Durations.** `warm` = size × lognormal(median 0.5 s, sigma [`WARM_SIGMA`] = 1.0), capped at
//!   600 s: overall median 0.5 s, sigma about 1.17, mean about 1 s. `cold` = `warm` + size ×
//!   lognormal(median 2 s, sigma 0.5), the penalty capped at 300 s: the project's data is
//!   fetched first (a cold start).
//! - **Classes.** Priority 1 (manual, a person waiting): single requests, `high_share` (5%) of
//!   all requests. Priority 0 (automated exports): an export of a project sends one request
//!   with probability `1 − burst_share` (1/2), else a burst of `burst_min` to `burst_max` (5 to
//!   20, uniform), all of the project, spread uniformly over the first 3 s (one request a
//!   channel).
//! - **Arrivals.** Poisson processes (manual requests, exports) whose rate follows the day:
//!   `mean × (1 + 0.5 cos(2π (hour − 14) / 24))`, busiest at 14:00, a third as busy at 02:00.
//!   The trace starts at 08:00. The mean rate is set so that, executed warm, the requests keep
//!   `utilisation` (0.3) of 14 servers × 4 slots busy over the day, 0.45 at the afternoon
//!   peak: about 17 requests a second, about 1.5 million a day. Executed where they land at
//!   random, about 45% of them start cold and the work more than doubles: the pool is about two
//!   thirds busy over the day and fully busy at the peak, where bursts overload servers. (At a
//!   warm utilisation of 0.35 and more, random placement needs more than the whole pool at the
//!   peak and its queue grows for hours: requests here never time out.)
//!
//! Times and durations are rounded to milliseconds, so a trace written and read back is the
//! trace generated.
//!
//! **Families.** A [`Family`] is the default workload with another key count, popularity
//! exponent or burstiness, named `zipf<exponent>-keys<count>` (`zipf1.2-keys50`), optionally
//! followed by `-bursts<share>`. [`Family::SKEWED`] (`skewed`) is the six of Zipf 0.8, 1.0 and
//! 1.2 over 50 and 500 keys, with the default bursts: few keys, some of them more popular than
//! one server can serve, which is where an affinity that ignores load piles work onto a few
//! servers.

use crate::trace::{write_lines, Micros, Request, Trace, TraceLine};
use crate::SimError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::Write;

/// The spread of project sizes (sigma of the log).
pub const PROJECT_SIGMA: f64 = 0.6;
/// The spread of one request's warm time around its project's size.
pub const WARM_SIGMA: f64 = 1.0;
/// The median warm time of a project of size 1, in seconds.
pub const WARM_MEDIAN: f64 = 0.5;
/// The longest warm time, in seconds.
pub const WARM_CAP: f64 = 600.0;
/// The median cold-start penalty of a project of size 1, in seconds, and its spread.
pub const COLD_MEDIAN: f64 = 2.0;
pub const COLD_SIGMA: f64 = 0.5;
/// The longest cold-start penalty, in seconds.
pub const COLD_CAP: f64 = 300.0;
/// An export's requests arrive within this many seconds of its start.
pub const BURST_SPREAD: f64 = 3.0;
/// The hour of the day the trace starts at.
pub const START_HOUR: f64 = 8.0;
/// The day's swing around the mean rate, and the busiest hour.
pub const DAY_SWING: f64 = 0.5;
pub const PEAK_HOUR: f64 = 14.0;
/// The pool the arrival rate is calibrated for: the seed's 14 servers, 4 slots each here.
pub const CALIBRATION_SLOTS: f64 = 14.0 * 4.0;

/// The generator's settings; [`Workload::new`] gives the defaults above.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub seed: u64,
    pub hours: f64,
    pub projects: u32,
    pub zipf: f64,
    /// The share of the calibration pool the requests keep busy when executed warm.
    pub utilisation: f64,
    /// The share of requests that are manual (priority 1).
    pub high_share: f64,
    /// The share of exports sent as a burst rather than a single request.
    pub burst_share: f64,
    /// A burst's size, drawn uniformly from `burst_min..=burst_max` (2 to 1,000).
    pub burst_min: u32,
    pub burst_max: u32,
}

/// One generated request before it becomes a trace line or a trace [`Request`].
struct Generated {
    at: f64,
    project: u32,
    priority: i32,
    /// The request's channel within its export (0 for manual requests).
    channel: u32,
    warm: f64,
    cold: f64,
}

impl Workload {
    /// The default workload of `hours` (more than 0, at most 168) from `seed`.
    pub fn new(seed: u64, hours: f64) -> Result<Workload, SimError> {
        let workload = Workload {
            seed,
            hours,
            projects: 2_000,
            zipf: 1.0,
            utilisation: 0.3,
            high_share: 0.05,
            burst_share: 0.5,
            burst_min: 5,
            burst_max: 20,
        };
        workload.validate()?;
        Ok(workload)
    }

    pub fn validate(&self) -> Result<(), SimError> {
        if !(self.hours > 0.0 && self.hours <= 168.0) {
            return Err(SimError::out_of_range(
                "hours",
                "more than 0 and at most 168",
                self.hours,
            ));
        }
        if !(1..=1_000_000).contains(&self.projects) {
            return Err(SimError::out_of_range(
                "projects",
                "1 to 1,000,000",
                self.projects,
            ));
        }
        if !(self.zipf.is_finite() && (0.0..=5.0).contains(&self.zipf)) {
            return Err(SimError::out_of_range("zipf", "0 to 5", self.zipf));
        }
        if !(self.utilisation > 0.0 && self.utilisation <= 10.0) {
            return Err(SimError::out_of_range(
                "utilisation",
                "more than 0 and at most 10",
                self.utilisation,
            ));
        }
        if !(0.0..=1.0).contains(&self.high_share) {
            return Err(SimError::out_of_range(
                "high_share",
                "0 to 1",
                self.high_share,
            ));
        }
        if !(0.0..=1.0).contains(&self.burst_share) {
            return Err(SimError::out_of_range(
                "burst share",
                "0 to 1",
                self.burst_share,
            ));
        }
        if !(2..=1_000).contains(&self.burst_min) || !(2..=1_000).contains(&self.burst_max) {
            return Err(SimError::out_of_range(
                "burst size",
                "2 to 1,000",
                format!("{}-{}", self.burst_min, self.burst_max),
            ));
        }
        if self.burst_min > self.burst_max {
            return Err(SimError::out_of_range(
                "burst size",
                "MIN-MAX with MIN at most MAX",
                format!("{}-{}", self.burst_min, self.burst_max),
            ));
        }
        Ok(())
    }

    /// Mean requests a second over a whole day.
    pub fn mean_rate(&self) -> f64 {
        // Mean of size × lognormal(median, WARM_SIGMA): the cap changes it by less than 0.1%.
        let mean_warm = WARM_MEDIAN * ((PROJECT_SIGMA.powi(2) + WARM_SIGMA.powi(2)) / 2.0).exp();
        self.utilisation * CALIBRATION_SLOTS / mean_warm
    }

    /// The workload as a trace for the simulator.
    pub fn trace(&self) -> Result<Trace, SimError> {
        let generated = self.generate()?;
        let keys: Vec<String> = (1..=self.projects)
            .map(|p| format!("project-{p}"))
            .collect();
        let requests = generated
            .iter()
            .map(|g| Request {
                at: millis(g.at),
                key: g.project - 1,
                priority: g.priority,
                warm: millis(g.warm),
                cold: millis(g.cold),
            })
            .collect();
        Trace::from_requests(requests, keys)
    }

    /// Writes the workload as JSONL, in order of arrival; returns how many requests.
    pub fn write_jsonl(&self, out: &mut impl Write) -> Result<usize, SimError> {
        let generated = self.generate()?;
        for g in &generated {
            let job = if g.priority > 0 {
                format!("p{}-manual", g.project)
            } else {
                format!("p{}-export-{}", g.project, g.channel)
            };
            let line = TraceLine {
                at: millis(g.at).secs(),
                job,
                key: format!("project-{}", g.project),
                priority: g.priority,
                warm: millis(g.warm).secs(),
                cold: millis(g.cold).secs(),
            };
            write_lines(std::slice::from_ref(&line), out)?;
        }
        Ok(generated.len())
    }

    fn generate(&self) -> Result<Vec<Generated>, SimError> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let end = self.hours * 3600.0;
        let popularity = Zipf::new(self.projects, self.zipf);
        let sizes: Vec<f64> = (0..self.projects)
            .map(|_| lognormal(&mut rng, 1.0, PROJECT_SIGMA))
            .collect();
        let rate = self.mean_rate();
        // Mean requests an export: single, or a burst of `burst_min..=burst_max`. (With the
        // defaults, 0.5 + 0.5 × 12.5: the same float as ever, so the same workload.)
        let mean_burst = f64::from(self.burst_min + self.burst_max) / 2.0;
        let per_export = (1.0 - self.burst_share) + self.burst_share * mean_burst;
        let manual_rate = rate * self.high_share;
        let export_rate = rate * (1.0 - self.high_share) / per_export;
        let mut out = Vec::new();
        let mut draw = |rng: &mut StdRng, at: f64, project: u32, priority, channel| {
            let size = sizes.get(project as usize - 1).copied().unwrap_or(1.0);
            let warm = (size * lognormal(rng, WARM_MEDIAN, WARM_SIGMA)).min(WARM_CAP);
            let penalty = (size * lognormal(rng, COLD_MEDIAN, COLD_SIGMA)).min(COLD_CAP);
            if out.len() >= crate::trace::MAX_LINES {
                return Err(SimError::TooManyLines {
                    max: crate::trace::MAX_LINES,
                });
            }
            out.push(Generated {
                at,
                project,
                priority,
                channel,
                warm,
                cold: warm + penalty,
            });
            Ok(())
        };
        for at in arrivals(&mut rng, manual_rate, end) {
            let project = popularity.sample(&mut rng);
            draw(&mut rng, at, project, 1, 0)?;
        }
        for start in arrivals(&mut rng, export_rate, end) {
            let project = popularity.sample(&mut rng);
            // Drawn as ever: `gen_bool(1 − share)` for a single request (1/2 by default).
            let size = if rng.gen_bool(1.0 - self.burst_share) {
                1
            } else {
                rng.gen_range(self.burst_min..=self.burst_max)
            };
            for channel in 0..size {
                let at = if channel == 0 {
                    start
                } else {
                    start + rng.gen::<f64>() * BURST_SPREAD
                };
                if at < end {
                    draw(&mut rng, at, project, 0, channel)?;
                }
            }
        }
        // Stable on the rounded instant: what is written is in the order it is read back.
        out.sort_by_key(|g| millis(g.at));
        Ok(out)
    }
}

/// A family of workloads: the default workload with another key count, popularity exponent and
/// share of bursts (everything else, the seed and the hours included, from the workload it is
/// applied to).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    /// Projects: the affinity keys.
    pub keys: u32,
    /// The exponent of their Zipf popularity.
    pub zipf: f64,
    /// The share of exports sent as a burst.
    pub burst_share: f64,
}

impl Family {
    /// `skewed`: Zipf 0.8, 1.0 and 1.2 over 50 and 500 keys, bursts as by default.
    pub const SKEWED: [Family; 6] = [
        Family::of(50, 0.8),
        Family::of(50, 1.0),
        Family::of(50, 1.2),
        Family::of(500, 0.8),
        Family::of(500, 1.0),
        Family::of(500, 1.2),
    ];

    const NAMES: &'static str = "skewed, or zipf<exponent>-keys<count>[-bursts<share>] \
                                 (zipf1.2-keys50), comma-separated";

    const fn of(keys: u32, zipf: f64) -> Family {
        Family {
            keys,
            zipf,
            burst_share: 0.5,
        }
    }

    /// `zipf1.2-keys50`, with `-bursts<share>` when the share is not the default's.
    pub fn name(&self) -> String {
        let mut name = format!("zipf{:?}-keys{}", self.zipf, self.keys);
        if self.burst_share != 0.5 {
            name.push_str(&format!("-bursts{:?}", self.burst_share));
        }
        name
    }

    /// One family by its name (see [`Family::name`]).
    pub fn parse(name: &str) -> Result<Family, SimError> {
        let bad = || SimError::out_of_range("a workload family", Family::NAMES, name);
        let mut parts = name.trim().split('-');
        let mut field = |prefix: &str| {
            parts
                .next()
                .and_then(|part| part.strip_prefix(prefix))
                .ok_or_else(bad)
        };
        let zipf: f64 = field("zipf")?.parse().map_err(|_| bad())?;
        let keys: u32 = field("keys")?.parse().map_err(|_| bad())?;
        let burst_share = match parts.next() {
            None => 0.5,
            Some(part) => part
                .strip_prefix("bursts")
                .and_then(|share| share.parse().ok())
                .ok_or_else(bad)?,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        let family = Family {
            keys,
            zipf,
            burst_share,
        };
        family.apply(&Workload::new(1, 1.0)?).validate()?;
        Ok(family)
    }

    /// Comma-separated names; `skewed` stands for [`Family::SKEWED`]. At least one, at most 100.
    pub fn parse_list(names: &str) -> Result<Vec<Family>, SimError> {
        let mut families = Vec::new();
        for name in names.split(',').map(str::trim) {
            if name == "skewed" {
                families.extend(Family::SKEWED);
            } else {
                families.push(Family::parse(name)?);
            }
        }
        if families.is_empty() || families.len() > 100 {
            return Err(SimError::out_of_range(
                "workload families",
                "1 to 100",
                families.len(),
            ));
        }
        Ok(families)
    }

    /// `base` with the family's keys, popularity and bursts.
    pub fn apply(&self, base: &Workload) -> Workload {
        Workload {
            projects: self.keys,
            zipf: self.zipf,
            burst_share: self.burst_share,
            ..base.clone()
        }
    }
}

/// Rounded to the millisecond (inputs here are finite, non-negative and bounded).
fn millis(seconds: f64) -> Micros {
    Micros((seconds * 1000.0).round() as i64 * 1000)
}

/// The day's shape at `t` seconds into the trace: 1 on average over a day.
fn day_shape(t: f64) -> f64 {
    let hour = (START_HOUR + t / 3600.0).rem_euclid(24.0);
    1.0 + DAY_SWING * (std::f64::consts::TAU * (hour - PEAK_HOUR) / 24.0).cos()
}

/// A Poisson process of mean rate `rate` shaped by the day, up to `end` seconds: candidates at
/// the peak rate, each kept with the day's share of the peak (thinning).
fn arrivals(rng: &mut StdRng, rate: f64, end: f64) -> Vec<f64> {
    let peak = rate * (1.0 + DAY_SWING);
    let mut out = Vec::new();
    if peak <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        // Exponential gap by inverse transform; 1 - u is in (0, 1].
        t += -(1.0 - rng.gen::<f64>()).ln() / peak;
        if t >= end {
            return out;
        }
        if rng.gen::<f64>() * (1.0 + DAY_SWING) < day_shape(t) {
            out.push(t);
        }
    }
}

/// A standard normal draw (Box-Muller).
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1 = 1.0 - rng.gen::<f64>();
    let u2 = rng.gen::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn lognormal(rng: &mut StdRng, median: f64, sigma: f64) -> f64 {
    median * (sigma * standard_normal(rng)).exp()
}

/// Zipf popularity over `1..=n` by inverse transform on the cumulative weights.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u32, exponent: f64) -> Zipf {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|k| {
                total += 1.0 / f64::from(k).powf(exponent);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut StdRng) -> u32 {
        let total = self.cumulative.last().copied().unwrap_or(0.0);
        let u = rng.gen::<f64>() * total;
        let index = self.cumulative.partition_point(|&c| c <= u);
        (index.min(self.cumulative.len().saturating_sub(1)) + 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_workload() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let w = Workload::new(4, 0.05).unwrap();
        w.write_jsonl(&mut a).unwrap();
        w.write_jsonl(&mut b).unwrap();
        assert_eq!(a, b);
        let mut c = Vec::new();
        Workload::new(5, 0.05).unwrap().write_jsonl(&mut c).unwrap();
        assert_ne!(a, c);
        // Written and read back, it is the trace generated.
        // (Keys are numbered in another order, so compare the lines.)
        let read = Trace::read(a.as_slice()).unwrap();
        assert_eq!(read.to_lines(), w.trace().unwrap().to_lines());
    }

    #[test]
    fn the_workload_has_its_shape() {
        let w = Workload::new(1, 1.0).unwrap();
        let trace = w.trace().unwrap();
        let r = trace.requests();
        let n = r.len() as f64;
        // 08:00 to 09:00 runs at about 1.07 times the day's mean rate.
        let expected = w.mean_rate() * 3600.0 * day_shape(1800.0);
        assert!((n / expected - 1.0).abs() < 0.1, "{n} against {expected}");
        let high = r.iter().filter(|q| q.priority == 1).count() as f64;
        assert!((high / n - 0.05).abs() < 0.01, "{}", high / n);
        let mut warm: Vec<f64> = r.iter().map(|q| q.warm.secs()).collect();
        warm.sort_by(f64::total_cmp);
        let median = warm[warm.len() / 2];
        assert!((0.4..0.6).contains(&median), "median warm {median}");
        assert!(warm.iter().all(|&w| (0.0..=WARM_CAP).contains(&w)));
        assert!(r.iter().all(|q| q.cold >= q.warm));
        let mean_warm = warm.iter().sum::<f64>() / n;
        let busy = n * mean_warm / 3600.0 / CALIBRATION_SLOTS;
        assert!((0.25..0.4).contains(&busy), "warm utilisation {busy}");
        // Popular projects dominate: the top 32 draw roughly half.
        let top = r.iter().filter(|q| q.key < 32).count() as f64;
        assert!((0.35..0.65).contains(&(top / n)), "{}", top / n);
        assert!(Workload::new(1, 0.0).is_err());
        assert!(Workload::new(1, 168.5).is_err());
    }

    /// FNV-1a of a workload's JSONL.
    fn fingerprint(workload: &Workload) -> (usize, u64) {
        let mut out = Vec::new();
        workload.write_jsonl(&mut out).unwrap();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in &out {
            h ^= u64::from(*byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (out.len(), h)
    }

    #[test]
    fn the_default_workload_is_the_one_it_always_was() {
        // Fingerprints of the default workload taken before the families were added: the same
        // seed gives the same bytes, whatever settings the generator has gained since.
        assert_eq!(
            fingerprint(&Workload::new(1, 0.1).unwrap()),
            (560_358, 0x9311_233f_f429_2ebb)
        );
        assert_eq!(
            fingerprint(&Workload::new(4, 0.1).unwrap()),
            (590_541, 0x4bc0_851c_edea_b53d)
        );
        assert_eq!(
            fingerprint(&Workload::new(4, 1.0).unwrap()),
            (6_213_417, 0x27a8_f3b3_6dba_4a3a)
        );
    }

    #[test]
    fn families_set_keys_popularity_and_bursts() {
        let names: Vec<String> = Family::SKEWED.iter().map(Family::name).collect();
        assert_eq!(
            names,
            [
                "zipf0.8-keys50",
                "zipf1.0-keys50",
                "zipf1.2-keys50",
                "zipf0.8-keys500",
                "zipf1.0-keys500",
                "zipf1.2-keys500"
            ]
        );
        for family in Family::SKEWED {
            assert_eq!(Family::parse(&family.name()).unwrap(), family);
        }
        assert_eq!(Family::parse_list("skewed").unwrap(), Family::SKEWED);
        let bursty = Family::parse("zipf1-keys50-bursts0.9").unwrap();
        assert_eq!(
            (bursty.keys, bursty.zipf, bursty.burst_share),
            (50, 1.0, 0.9)
        );
        assert_eq!(bursty.name(), "zipf1.0-keys50-bursts0.9");
        assert_eq!(Family::parse_list("skewed, zipf2-keys10").unwrap().len(), 7);
        for bad in [
            "",
            "zipf1",
            "keys50-zipf1",
            "zipf1-keys0",
            "zipf9-keys50",
            "zipf1-keys50-bursts2",
            "zipf1-keys50-bursts0.5-x",
        ] {
            assert!(Family::parse_list(bad).is_err(), "{bad}");
        }

        let base = Workload::new(7, 1.0).unwrap();
        let w = Family::parse("zipf1.2-keys50").unwrap().apply(&base);
        assert_eq!((w.seed, w.hours, w.utilisation), (7, 1.0, 0.3));
        let trace = w.trace().unwrap();
        let r = trace.requests();
        assert!(r.iter().all(|q| q.key < 50));
        // Zipf 1.2 over 50 keys: the top key draws about 30% of the requests (1 / H(50, 1.2)).
        let top = r.iter().filter(|q| q.key == 0).count() as f64 / r.len() as f64;
        assert!((0.22..0.38).contains(&top), "{top}");
        // The same request rate as the default workload's: about as many requests an hour.
        let n = Workload::new(7, 1.0)
            .unwrap()
            .trace()
            .unwrap()
            .requests()
            .len() as f64;
        assert!(
            (r.len() as f64 / n - 1.0).abs() < 0.1,
            "{} against {n}",
            r.len()
        );

        // No bursts: every export one request; all bursts: about 12.5 requests of a project
        // arrive together, the rate of exports scaled so the requests an hour stay the same.
        let single = Workload {
            burst_share: 0.0,
            ..base.clone()
        };
        let all = Workload {
            burst_share: 1.0,
            ..base.clone()
        };
        for w in [&single, &all] {
            let count = w.trace().unwrap().requests().len() as f64;
            assert!((count / n - 1.0).abs() < 0.1, "{count} against {n}");
        }
        let mut lines = Vec::new();
        single.write_jsonl(&mut lines).unwrap();
        let text = String::from_utf8(lines).unwrap();
        assert!(
            !text.contains("-export-1\""),
            "no second channel without bursts"
        );
        let bad_size = Workload {
            burst_min: 30,
            ..base.clone()
        };
        assert!(bad_size.trace().is_err());
        assert!(Workload {
            burst_max: 1_001,
            ..base
        }
        .validate()
        .is_err());
    }

    #[test]
    fn the_day_is_busiest_in_the_afternoon() {
        assert!((day_shape((PEAK_HOUR - START_HOUR) * 3600.0) - 1.5).abs() < 1e-9);
        assert!((day_shape((26.0 - START_HOUR) * 3600.0) - 0.5).abs() < 1e-9);
        let mean: f64 = (0..24 * 60)
            .map(|m| day_shape(f64::from(m) * 60.0))
            .sum::<f64>()
            / (24.0 * 60.0);
        assert!((mean - 1.0).abs() < 1e-9);
    }
}

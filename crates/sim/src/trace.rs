//! Traces: the requests a simulation replays, and their JSONL form.
//!
//! Owns the request types, reading a trace (bounded, with the line number of a bad line) and
//! writing one. Knows nothing of servers, policies or figures.
//!
//! One request a line: `{"at": 12.5, "job": "j1", "key": "project-7", "priority": 1,
//! "warm": 0.8, "cold": 4.0}`: seconds from the trace start, the job, the affinity key, the
//! priority (0 low, higher first), and the execution time in seconds when the server holds the
//! key warm, or not. Unknown fields are refused; lines need not be in order of `at`.

use crate::SimError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};

/// The most lines a trace may have.
pub const MAX_LINES: usize = 10_000_000;
/// The longest line a trace may have, in bytes (without its newline).
pub const MAX_LINE_BYTES: usize = 1024;
/// The latest arrival and the longest execution a trace may name, in seconds (about 31 years):
/// far inside what microseconds in an `i64` hold.
pub const MAX_SECONDS: f64 = 1e9;

/// One request as a trace line holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceLine {
    /// Seconds from the trace start.
    pub at: f64,
    pub job: String,
    /// The affinity key: what a server may hold warm.
    pub key: String,
    /// 0 is low; higher goes first.
    pub priority: i32,
    /// Execution seconds on a server that holds `key` warm.
    pub warm: f64,
    /// Execution seconds on a server that does not.
    pub cold: f64,
}

/// Simulated time or a span of it: microseconds (from the trace start, for an instant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Micros(pub i64);

impl Micros {
    /// Whole microseconds of `seconds`, which must be finite and in `0..=MAX_SECONDS`.
    pub fn from_secs(seconds: f64) -> Option<Micros> {
        if seconds.is_finite() && (0.0..=MAX_SECONDS).contains(&seconds) {
            Some(Micros((seconds * 1e6).round() as i64))
        } else {
            None
        }
    }

    pub fn secs(self) -> f64 {
        self.0 as f64 / 1e6
    }
}

impl std::ops::Add for Micros {
    type Output = Micros;
    fn add(self, other: Micros) -> Micros {
        Micros(self.0.saturating_add(other.0))
    }
}

impl std::ops::Sub for Micros {
    type Output = Micros;
    fn sub(self, other: Micros) -> Micros {
        Micros(self.0.saturating_sub(other.0))
    }
}

/// One request as the simulator replays it: times in microseconds, the key interned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub at: Micros,
    /// Index into [`Trace::key`].
    pub key: u32,
    pub priority: i32,
    pub warm: Micros,
    pub cold: Micros,
}

/// A validated trace: at least one request, in order of arrival (ties keep the trace's order).
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    requests: Vec<Request>,
    keys: Vec<String>,
}

impl Trace {
    /// Checks and orders `lines`; an error names the line (counting from 1) at fault.
    pub fn from_lines(lines: impl IntoIterator<Item = TraceLine>) -> Result<Trace, SimError> {
        let mut builder = Builder::default();
        for (i, line) in lines.into_iter().enumerate() {
            if i >= MAX_LINES {
                return Err(SimError::TooManyLines { max: MAX_LINES });
            }
            builder.push(line, i + 1)?;
        }
        builder.finish()
    }

    /// A trace of requests already in simulator form (`keys` are what their key indexes
    /// stand for): sorted by arrival, refused when empty or longer than [`MAX_LINES`].
    pub fn from_requests(requests: Vec<Request>, keys: Vec<String>) -> Result<Trace, SimError> {
        if requests.len() > MAX_LINES {
            return Err(SimError::TooManyLines { max: MAX_LINES });
        }
        if let Some(r) = requests.iter().find(|r| r.key as usize >= keys.len()) {
            return Err(SimError::out_of_range(
                "a request's key",
                "an index into the trace's keys",
                r.key,
            ));
        }
        Builder {
            requests,
            keys,
            key_ids: HashMap::new(),
        }
        .finish()
    }

    /// Reads JSONL: one request a line, blank lines skipped, at most [`MAX_LINES`] lines of at
    /// most [`MAX_LINE_BYTES`] bytes.
    pub fn read(reader: impl BufRead) -> Result<Trace, SimError> {
        let mut builder = Builder::default();
        let mut reader = reader;
        let mut buf = Vec::with_capacity(MAX_LINE_BYTES + 2);
        let mut line = 0usize;
        loop {
            buf.clear();
            // One byte past the limit, and the newline: a longer line is caught, never held.
            let limit = (MAX_LINE_BYTES + 2) as u64;
            let n = reader.by_ref().take(limit).read_until(b'\n', &mut buf)?;
            if n == 0 {
                break;
            }
            line += 1;
            if line > MAX_LINES {
                return Err(SimError::TooManyLines { max: MAX_LINES });
            }
            let ended = buf.last() == Some(&b'\n');
            if ended {
                buf.pop();
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
            }
            if buf.len() > MAX_LINE_BYTES || (!ended && n as u64 == limit) {
                return Err(SimError::LineTooLong {
                    line,
                    max: MAX_LINE_BYTES,
                });
            }
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed: TraceLine = serde_json::from_slice(&buf).map_err(|e| SimError::Line {
                line,
                reason: e.to_string(),
            })?;
            builder.push(parsed, line)?;
        }
        builder.finish()
    }

    /// The requests, in order of arrival.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// The affinity key a request's `key` index stands for.
    pub fn key(&self, index: u32) -> &str {
        self.keys
            .get(index as usize)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// How many distinct keys the trace names.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The priorities present, lowest first.
    pub fn classes(&self) -> Vec<i32> {
        let mut classes: Vec<i32> = self.requests.iter().map(|r| r.priority).collect();
        classes.sort_unstable();
        classes.dedup();
        classes
    }

    /// From the trace start to the last arrival, in hours.
    pub fn hours(&self) -> f64 {
        self.requests.last().map_or(0.0, |r| r.at.secs() / 3600.0)
    }

    /// The trace as lines (jobs are not kept: each is named after its request's index).
    pub fn to_lines(&self) -> Vec<TraceLine> {
        self.requests
            .iter()
            .enumerate()
            .map(|(i, r)| TraceLine {
                at: r.at.secs(),
                job: format!("j{i}"),
                key: self.key(r.key).to_string(),
                priority: r.priority,
                warm: r.warm.secs(),
                cold: r.cold.secs(),
            })
            .collect()
    }
}

/// Writes `lines` as JSONL.
pub fn write_lines(lines: &[TraceLine], out: &mut impl Write) -> std::io::Result<()> {
    for line in lines {
        serde_json::to_writer(&mut *out, line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[derive(Default)]
struct Builder {
    requests: Vec<Request>,
    keys: Vec<String>,
    key_ids: HashMap<String, u32>,
}

impl Builder {
    fn push(&mut self, line: TraceLine, number: usize) -> Result<(), SimError> {
        let bad = |reason: String| SimError::Line {
            line: number,
            reason,
        };
        let seconds = |name: &str, value: f64| {
            Micros::from_secs(value).ok_or_else(|| {
                bad(format!(
                    "{name} must be a finite number of seconds from 0 to {MAX_SECONDS:e} \
                     (got {value})"
                ))
            })
        };
        let at = seconds("at", line.at)?;
        let warm = seconds("warm", line.warm)?;
        let cold = seconds("cold", line.cold)?;
        if line.key.is_empty() {
            return Err(bad("key must not be empty".to_string()));
        }
        let key = match self.key_ids.get(&line.key) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.keys.len())
                    .map_err(|_| bad("too many distinct keys".to_string()))?;
                self.key_ids.insert(line.key.clone(), id);
                self.keys.push(line.key);
                id
            }
        };
        self.requests.push(Request {
            at,
            key,
            priority: line.priority,
            warm,
            cold,
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Trace, SimError> {
        if self.requests.is_empty() {
            return Err(SimError::EmptyTrace);
        }
        // Stable: requests arriving at the same microsecond keep the trace's order.
        self.requests.sort_by_key(|r| r.at);
        Ok(Trace {
            requests: self.requests,
            keys: self.keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Trace, SimError> {
        Trace::read(text.as_bytes())
    }

    /// A trace line with `fields` (JSON members without braces) after `at`, `job` and `key`.
    fn line(at: &str, key: &str, fields: &str) -> String {
        format!("{{\"at\": {at}, \"job\": \"j\", \"key\": \"{key}\", {fields}}}")
    }

    #[test]
    fn reads_sorts_and_interns() {
        let text = [
            line("2.5", "p1", r#""priority": 0, "warm": 1, "cold": 3"#) + "\n",
            "\n".to_string(),
            line("1", "p2", r#""priority": 1, "warm": 0.5, "cold": 2"#) + "\r\n",
            line("2.5", "p1", r#""priority": 0, "warm": 0, "cold": 0"#),
        ]
        .concat();
        let trace = read(&text).unwrap();
        let r = trace.requests();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].at, Micros(1_000_000));
        assert_eq!(trace.key(r[0].key), "p2");
        assert_eq!(r[1].warm, Micros(1_000_000), "ties keep the trace's order");
        assert_eq!(r[1].key, r[2].key);
        assert_eq!(trace.classes(), vec![0, 1]);
        assert_eq!(trace.key_count(), 2);
    }

    #[test]
    fn bad_lines_are_named() {
        let good = line("1", "p", r#""priority": 0, "warm": 1, "cold": 1"#);
        let cases = [
            (line("1", "p", r#""priority": 0, "warm": 1"#), "cold"),
            (
                line("1", "p", r#""priority": 0, "warm": 1, "cold": 1, "x": 1"#),
                "unknown field",
            ),
            (
                line("-1", "p", r#""priority": 0, "warm": 1, "cold": 1"#),
                "at must be",
            ),
            (
                line("1", "p", r#""priority": 0, "warm": -0.5, "cold": 1"#),
                "warm must be",
            ),
            (
                line("1", "", r#""priority": 0, "warm": 1, "cold": 1"#),
                "key must not be empty",
            ),
            (
                line("1e400", "p", r#""priority": 0, "warm": 1, "cold": 1"#),
                "trace line 2",
            ),
            ("not json".to_string(), "expected"),
        ];
        for (bad, expect) in cases {
            let err = read(&format!("{good}\n{bad}\n")).unwrap_err().to_string();
            assert!(err.starts_with("trace line 2: "), "{err}");
            assert!(err.contains(expect), "{err}");
        }
        let long = format!("{good}\n{}\n", " ".repeat(MAX_LINE_BYTES + 1));
        assert!(matches!(
            read(&long),
            Err(SimError::LineTooLong { line: 2, .. })
        ));
        let padded = format!("{good}{}\n", " ".repeat(MAX_LINE_BYTES - good.len()));
        assert!(read(&padded).is_ok(), "exactly the limit is fine");
        assert!(matches!(read("\n \n"), Err(SimError::EmptyTrace)));
    }

    #[test]
    fn lines_round_trip() {
        let lines = vec![TraceLine {
            at: 12.5,
            job: "j0".into(),
            key: "project-7".into(),
            priority: 1,
            warm: 0.8,
            cold: 4.0,
        }];
        let mut out = Vec::new();
        write_lines(&lines, &mut out).unwrap();
        let trace = Trace::read(out.as_slice()).unwrap();
        assert_eq!(trace.to_lines(), lines);
        assert_eq!(Trace::from_lines(lines).unwrap(), trace);
    }
}

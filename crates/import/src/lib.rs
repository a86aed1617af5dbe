//! `sked import`: other schedulers' definitions translated into a `sked job apply` file.
//!
//! Each source has its module (`crontab`, `k8s`, `systemd`, `celery_beat`, `pg_cron`) that
//! turns text (or rows the binary read for it) into an [`Import`]: the jobs it could translate,
//! each with the comments and the line it came from, what it could not, each with its line
//! and the reason, and the translated entries whose instants or behaviour still differ from
//! the source's (`dst.rs` finds where a change of clocks makes cron's instants part from
//! sked's). Nothing here does IO or applies anything: reading files, URLs and databases
//! is the binary's, and applying is `sked job apply`'s, after a person read the file.
//!
//! Every translated job is checked by sked's own rules ([`Import::push_job`]): a definition
//! sked would refuse is reported as untranslated, never written.

pub mod systemd;

use serde_json::Value;
use sked_core::job::JobSpec;

pub mod celery_beat;
pub mod crontab;
mod dst;
pub mod k8s;
pub mod pg_cron;

/// Largest input any importer reads; a bigger one is refused before parsing.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;

/// Why an input could not be imported at all (nothing is written).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error("the input is {0} bytes; sked import reads at most {MAX_INPUT_BYTES}")]
    TooLarge(usize),
    #[error("the input is not text (line {line} holds a NUL byte or is not UTF-8)")]
    NotText { line: usize },
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
}

/// One translated job: its definition as `sked job apply` reads it, the comments that stood
/// above it in the source, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedJob {
    /// A job definition (`name`, `schedule`, `target`, ...), checked by [`JobSpec::validate`].
    pub job: Value,
    /// The source's comments about it, without their comment markers.
    pub comments: Vec<String>,
    /// The 1-based line of the source it came from (0 when the source has no lines, as rows).
    pub line: usize,
}

/// Something of the source that is not in the output, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranslated {
    /// The 1-based line (0 when the source has no lines).
    pub line: usize,
    /// The source's text for it, as written.
    pub text: String,
    pub reason: String,
}

/// What an importer made of its input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Import {
    pub jobs: Vec<ImportedJob>,
    pub untranslated: Vec<Untranslated>,
    /// Entries that were translated, but whose sked job does not behave exactly as the source
    /// did (a daylight saving change handled differently, say), each with why. Their job is in
    /// `jobs`; a person must read these as they read `untranslated`.
    pub differences: Vec<Untranslated>,
}

impl Import {
    /// Adds a translated job if sked accepts its definition (its name unique in the import);
    /// otherwise reports it as untranslated with sked's reason.
    /// Whether it was kept.
    pub fn push_job(&mut self, job: ImportedJob, text: &str) -> bool {
        let name = job.job["name"].as_str().unwrap_or_default().to_string();
        if self.jobs.iter().any(|j| j.job["name"] == job.job["name"]) {
            self.skip(job.line, text, format!("a second job named {name:?}"));
            return false;
        }
        let checked = serde_json::from_value::<JobSpec>(job.job.clone())
            .map_err(|e| e.to_string())
            .and_then(|spec| {
                spec.validate(None, chrono::Utc::now())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        match checked {
            Ok(()) => {
                self.jobs.push(job);
                true
            }
            Err(e) => {
                self.skip(job.line, text, format!("sked refuses the translation: {e}"));
                false
            }
        }
    }

    /// Reports `text` of `line` as not translated, for `reason`.
    pub fn skip(&mut self, line: usize, text: &str, reason: impl Into<String>) {
        self.untranslated.push(Untranslated {
            line,
            text: text.to_string(),
            reason: reason.into(),
        });
    }

    /// Reports that the job of `text` at `line` was translated, but behaves differently from
    /// the source, for `reason`.
    pub fn differ(&mut self, line: usize, text: &str, reason: impl Into<String>) {
        self.differences.push(Untranslated {
            line,
            text: text.to_string(),
            reason: reason.into(),
        });
    }

    /// Whether everything of the source is in the output exactly: nothing untranslated, no
    /// difference.
    pub fn is_exact(&self) -> bool {
        self.untranslated.is_empty() && self.differences.is_empty()
    }

    /// The `sked job apply` file: a `jobs:` list, each job preceded by its source comments and
    /// its origin; then what was not translated, as comments, so the file says it too.
    pub fn to_yaml(&self, source: &str) -> String {
        self.to_yaml_for(source, None)
    }

    /// [`Import::to_yaml`] for a file meant for `namespace`: a job file names no namespace
    /// (`sked job apply` takes it from `--namespace`), so the header says which command applies
    /// it there.
    pub fn to_yaml_for(&self, source: &str, namespace: Option<&str>) -> String {
        let mut out = format!("# Imported by `sked import` from {source}.\n");
        match namespace {
            Some(ns) => out.push_str(&format!(
                "# Read it, then apply it with `sked job apply -f FILE --namespace {ns}`.\n"
            )),
            None => out.push_str("# Read it, then apply it with `sked job apply -f FILE`.\n"),
        }
        out.push_str("jobs:\n");
        for job in &self.jobs {
            for comment in &job.comments {
                out.push_str(&format!("  # {}\n", one_line(comment.trim_end())));
            }
            if job.line > 0 {
                out.push_str(&format!("  # from line {}\n", job.line));
            }
            let body = serde_yaml::to_string(&job.job).unwrap_or_default();
            for (i, line) in body.lines().enumerate() {
                let lead = if i == 0 { "- " } else { "  " };
                out.push_str(&format!("  {lead}{line}\n"));
            }
        }
        if self.jobs.is_empty() {
            out.truncate(out.len() - "jobs:\n".len());
            out.push_str("jobs: []\n");
        }
        for (title, items) in [
            ("# Not translated:\n", &self.untranslated),
            ("# Translated, with a difference:\n", &self.differences),
        ] {
            if items.is_empty() {
                continue;
            }
            out.push_str(title);
            for item in items {
                out.push_str(&format!(
                    "#   line {}: {} -- {}\n",
                    item.line,
                    one_line(&item.text),
                    one_line(&item.reason)
                ));
            }
        }
        out
    }
}

/// `text` on one line, so that it stays inside a YAML comment.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// The input as text, refused when too large or not text, before any parsing.
pub fn text_of(bytes: &[u8]) -> Result<&str, ImportError> {
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(ImportError::TooLarge(bytes.len()));
    }
    let line_of = |at: usize| bytes[..at].iter().filter(|b| **b == b'\n').count() + 1;
    if let Some(at) = bytes.iter().position(|b| *b == 0) {
        return Err(ImportError::NotText { line: line_of(at) });
    }
    std::str::from_utf8(bytes).map_err(|e| ImportError::NotText {
        line: line_of(e.valid_up_to()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(name: &str) -> ImportedJob {
        ImportedJob {
            job: json!({"name": name, "schedule": {"cron": "0 3 * * *"},
                        "target": {"shell": {"command": "backup"}}}),
            comments: vec!["nightly backup".into()],
            line: 4,
        }
    }

    #[test]
    fn a_job_sked_refuses_or_a_second_name_is_reported_not_written() {
        let mut import = Import::default();
        import.push_job(job("backup"), "0 3 * * * backup");
        import.push_job(job("backup"), "0 3 * * * backup");
        let mut bad = job("bad");
        bad.job["schedule"]["cron"] = json!("61 * * * *");
        import.push_job(bad, "61 * * * * x");
        assert_eq!(import.jobs.len(), 1);
        assert_eq!(import.untranslated.len(), 2);
        assert!(import.untranslated[0].reason.contains("second job"));
        assert!(import.untranslated[1].reason.contains("sked refuses"));
    }

    #[test]
    fn the_file_keeps_comments_and_reads_back_as_the_same_jobs() {
        let mut import = Import::default();
        import.push_job(job("backup"), "0 3 * * * backup");
        import.skip(7, "@reboot start", "@reboot has no instant");
        let yaml = import.to_yaml("crontab");
        assert!(yaml.contains("  # nightly backup\n"), "{yaml}");
        assert!(yaml.contains("#   line 7: @reboot start -- @reboot has no instant"));
        let doc: Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(doc["jobs"][0], import.jobs[0].job);
        let empty: Value = serde_yaml::from_str(&Import::default().to_yaml("x")).unwrap();
        assert_eq!(empty["jobs"], json!([]));
    }

    #[test]
    fn binary_or_huge_input_is_refused_with_its_line() {
        assert_eq!(text_of(b"a\nb\0c"), Err(ImportError::NotText { line: 2 }));
        assert_eq!(text_of(b"a\n\n\xff"), Err(ImportError::NotText { line: 3 }));
        let big = vec![b'#'; MAX_INPUT_BYTES + 1];
        assert_eq!(
            text_of(&big),
            Err(ImportError::TooLarge(MAX_INPUT_BYTES + 1))
        );
        assert_eq!(text_of(b"ok"), Ok("ok"));
    }
}

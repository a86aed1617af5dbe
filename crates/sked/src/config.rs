//! The config file (`--config FILE`, TOML): settings for `sked server`, `sked worker` and
//! `sked dev` kept in a file rather than on a command line. Each command reads the table named
//! after it (`[server]`, `[worker]`, `[dev]`), whose keys are its long flags without the dashes.
//!
//! The file ranks below the environment, which ranks below the command line: a key is used
//! only for a flag that neither the command line nor its `SKED_*` variable set. It is applied
//! by adding the key to the command line before clap parses it for good, so a value in the
//! file is checked exactly as the same flag would be. This module owns only that merge; what a
//! setting means belongs to the flag.

use crate::cli::Cli;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The commands that read a config file, each from the table of its name.
pub const COMMANDS: [&str; 3] = ["server", "worker", "dev"];

/// A config file larger than this is refused: settings take a few kilobytes.
const MAX_BYTES: u64 = 1024 * 1024;

/// Why a config file cannot be used. Each names the file, and the table and key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is larger than {MAX_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error(
        "config file {path}: [{table}] is not a command that reads a config file (one of: \
         server, worker, dev){}",
        did_you_mean(suggestion, "[", "]")
    )]
    UnknownTable {
        path: PathBuf,
        table: String,
        suggestion: Option<String>,
    },
    #[error("config file {path}: `{key}` must be a table ([{key}]) of that command's settings")]
    NotATable { path: PathBuf, key: String },
    #[error(
        "config file {path}: [{table}] has no setting `{key}`{} (`sked {table} --help` lists \
         them)",
        did_you_mean(suggestion, "`", "`")
    )]
    UnknownKey {
        path: PathBuf,
        table: String,
        key: String,
        suggestion: Option<String>,
    },
    #[error("config file {path}: [{table}] {key}: {message}")]
    BadValue {
        path: PathBuf,
        table: String,
        key: String,
        message: String,
    },
}

/// "; did you mean `listen`?" when there is a near name, else nothing.
fn did_you_mean(suggestion: &Option<String>, open: &str, close: &str) -> String {
    suggestion
        .as_deref()
        .map(|s| format!("; did you mean {open}{s}{close}?"))
        .unwrap_or_default()
}

/// Every mistake `sked config check` found in a file, one per line.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lines: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        write!(f, "{}", lines.join("\n"))
    }
}

impl std::error::Error for ConfigErrors {}

/// `argv` with the settings of the config file its command names (by `--config` or
/// `SKED_CONFIG`) added for every flag the command line and the environment left unset.
/// A command line that does not parse, or names no file, comes back as it was, for clap to
/// report or run.
pub fn apply(argv: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    let Ok(matches) = Cli::command().try_get_matches_from(&argv) else {
        return Ok(argv);
    };
    let Some((name, sub)) = matches.subcommand() else {
        return Ok(argv);
    };
    // `sked worker list` is a client command: it reads no config file.
    if !COMMANDS.contains(&name) || sub.subcommand().is_some() {
        return Ok(argv);
    }
    let Ok(Some(path)) = sub.try_get_one::<PathBuf>("config") else {
        return Ok(argv);
    };
    let file = read(path)?;
    let Some(table) = file.get(name) else {
        return Ok(argv);
    };
    let flags = flags_from(path, name, table, |id| explicit(sub, id))?;
    let mut argv = argv;
    argv.extend(flags.iter().map(OsString::from));
    // A value the flag refuses is the file's mistake: say so, naming the key.
    if let Err(e) = Cli::command().try_get_matches_from(&argv) {
        if let Some(key) = failing_key(&e).filter(|key| {
            flags
                .iter()
                .any(|flag| flag.starts_with(&format!("--{key}=")) || *flag == format!("--{key}"))
        }) {
            return Err(bad_value(path, name, key, &e));
        }
    }
    Ok(argv)
}

fn bad_value(path: &Path, table: &str, key: String, error: &clap::Error) -> ConfigError {
    ConfigError::BadValue {
        path: path.to_path_buf(),
        table: table.to_string(),
        key,
        message: refusal(error),
    }
}

/// Why the flag refused the file's value, in the flag parser's own words when it has them:
/// clap's message quotes the whole value, which for a broker connection holds a password.
fn refusal(error: &clap::Error) -> String {
    match std::error::Error::source(error) {
        Some(reason) => reason.to_string(),
        None => first_line(&error.to_string()),
    }
}

/// Checks every table of the file against its command, as `sked config check` does: each
/// key must be one of the command's flags and its value one the flag accepts. Every mistake is
/// reported, not only the first.
pub fn check(path: &Path) -> Result<(), ConfigErrors> {
    let text = read_text(path).map_err(|e| ConfigErrors(vec![e]))?;
    let mut errors = Vec::new();
    for (name, table) in &text {
        if let Some(e) = not_a_command(path, name, table) {
            errors.push(e);
            continue;
        }
        let Some(table) = table.as_table() else {
            continue;
        };
        // Each key on its own first, so that one unknown key hides no other mistake.
        let mut flags: Vec<(String, Vec<String>)> = Vec::new();
        for (key, value) in table {
            let one = toml::Value::Table(toml::Table::from_iter([(key.clone(), value.clone())]));
            match flags_from(path, name, &one, |_| false) {
                Ok(f) => flags.push((key.clone(), f)),
                Err(e) => errors.push(e),
            }
        }
        // Then together, as the command would take them: a value a flag refuses is set aside
        // and the rest tried again, so every refused value is named.
        while !flags.is_empty() {
            let mut argv = vec!["sked".to_string(), name.clone()];
            argv.extend(flags.iter().flat_map(|(_, f)| f.iter().cloned()));
            let Err(e) = Cli::command().try_get_matches_from(&argv) else {
                break;
            };
            let key = failing_key(&e).filter(|k| flags.iter().any(|(key, _)| key == k));
            match key {
                Some(key) => {
                    flags.retain(|(k, _)| *k != key);
                    errors.push(bad_value(path, name, key, &e));
                }
                None => {
                    errors.push(bad_value(path, name, "?".into(), &e));
                    break;
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The name among `known` nearest to `given`, if it is near enough to be a slip of the
/// fingers: at most one edit for names of up to 4 characters, two up to 8, three beyond
/// (an edit inserts, deletes or changes a character, or swaps two neighbours).
pub fn nearest<'a>(given: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = match given.chars().count() {
        0..=4 => 1,
        5..=8 => 2,
        _ => 3,
    };
    known
        .into_iter()
        .map(|name| (edit_distance(given, name), name))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, name)| name)
}

/// The optimal string alignment distance between `a` and `b`: the fewest insertions,
/// deletions, substitutions and swaps of neighbouring characters that turn one into the other.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows of the table: two back (for swaps), one back, and the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (previous[j] + 1)
                .min(row[j - 1] + 1)
                .min(previous[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut previous, row);
    }
    previous[b.len()]
}

/// The mistake in a top-level entry that is not a command's table, if it is one.
fn not_a_command(path: &Path, key: &str, value: &toml::Value) -> Option<ConfigError> {
    if COMMANDS.contains(&key) {
        return None;
    }
    Some(match value {
        toml::Value::Table(_) => ConfigError::UnknownTable {
            path: path.to_path_buf(),
            table: key.to_string(),
            suggestion: nearest(key, COMMANDS).map(str::to_string),
        },
        _ => ConfigError::NotATable {
            path: path.to_path_buf(),
            key: key.to_string(),
        },
    })
}

/// The file's tables, each a command's.
fn read(path: &Path) -> Result<toml::Table, ConfigError> {
    let table = read_text(path)?;
    for (key, value) in &table {
        if let Some(e) = not_a_command(path, key, value) {
            return Err(e);
        }
    }
    Ok(table)
}

/// The file as TOML, whatever its tables are.
fn read_text(path: &Path) -> Result<toml::Table, ConfigError> {
    let read_err = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_err)?.len();
    if size > MAX_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })
}

/// Whether the command line or the environment set the flag `id`: then the file must not.
fn explicit(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The command-line flags that say what `table` says for the command `name`, leaving out the
/// flags `explicit` says were set another way.
fn flags_from(
    path: &Path,
    name: &str,
    table: &toml::Value,
    explicit: impl Fn(&str) -> bool,
) -> Result<Vec<String>, ConfigError> {
    let Some(table) = table.as_table() else {
        return Err(ConfigError::NotATable {
            path: path.to_path_buf(),
            key: name.to_string(),
        });
    };
    let command = Cli::command();
    let command = command
        .find_subcommand(name)
        .ok_or_else(|| ConfigError::UnknownTable {
            path: path.to_path_buf(),
            table: name.to_string(),
            suggestion: None,
        })?;
    let bad = |key: &str, message: &str| ConfigError::BadValue {
        path: path.to_path_buf(),
        table: name.to_string(),
        key: key.to_string(),
        message: message.to_string(),
    };
    let mut flags = Vec::new();
    for (key, value) in table {
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && a.get_id() != "config")
            .ok_or_else(|| ConfigError::UnknownKey {
                path: path.to_path_buf(),
                table: name.to_string(),
                key: key.clone(),
                suggestion: nearest(key, settings(command)).map(str::to_string),
            })?;
        if explicit(arg.get_id().as_str()) {
            continue;
        }
        if !arg.get_action().takes_values() {
            match value {
                toml::Value::Boolean(true) => flags.push(format!("--{key}")),
                toml::Value::Boolean(false) => {}
                _ => return Err(bad(key, "must be true or false")),
            }
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items.iter().collect(),
            single => vec![single],
        };
        for value in values {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => return Err(bad(key, "must be a string, a number or a list of them")),
            };
            flags.push(format!("--{key}={text}"));
        }
    }
    Ok(flags)
}

/// The keys a command's table may hold: its long flags but `config`.
fn settings(command: &clap::Command) -> impl Iterator<Item = &str> {
    command
        .get_arguments()
        .filter(|a| a.get_id() != "config" && !a.is_hide_set())
        .filter_map(|a| a.get_long())
}

/// The flag clap's error is about, without its dashes.
fn failing_key(error: &clap::Error) -> Option<String> {
    match error.get(clap::error::ContextKind::InvalidArg) {
        Some(clap::error::ContextValue::String(arg)) => Some(
            arg.trim_start_matches('-')
                .split([' ', '='])
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
        _ => None,
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("a temporary file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("written");
        f
    }

    fn parsed(argv: &[&str]) -> crate::cli::Cli {
        let argv = argv.iter().map(OsString::from).collect();
        let argv = apply(argv).expect("the file applies");
        Cli::try_parse_from(argv).expect("the command line parses")
    }

    fn server(cli: crate::cli::Cli) -> crate::cli::ServerArgs {
        match cli.command {
            crate::cli::Command::Server(args) => args,
            other => panic!("not a server command: {other:?}"),
        }
    }

    #[test]
    fn the_file_fills_what_the_command_line_left_unset() {
        let f = file(
            "[server]\nlisten = \"127.0.0.1:9999\"\nretention = \"7days\"\n\
             http-target-deny = [\"10.0.0.0/8\", \"example.org\"]\n",
        );
        let path = f.path().to_str().expect("a UTF-8 path");
        let args = server(parsed(&["sked", "server", "--config", path]));
        assert_eq!(args.listen, "127.0.0.1:9999");
        assert_eq!(args.retention.0, std::time::Duration::from_secs(7 * 86_400));
        assert_eq!(args.http_target_deny.len(), 2);

        // The command line wins over the file, flag by flag.
        let args = server(parsed(&[
            "sked",
            "server",
            "--config",
            path,
            "--listen",
            "127.0.0.1:7777",
        ]));
        assert_eq!(args.listen, "127.0.0.1:7777");
        assert_eq!(args.retention.0, std::time::Duration::from_secs(7 * 86_400));
    }

    #[test]
    fn a_boolean_flag_is_set_by_true_only() {
        let f = file("[dev]\nrequire-token = true\nslots = 3\n");
        let path = f.path().to_str().expect("a UTF-8 path");
        match parsed(&["sked", "dev", "--config", path]).command {
            crate::cli::Command::Dev(args) => {
                assert!(args.require_token);
                assert_eq!(args.slots, 3);
            }
            other => panic!("not a dev command: {other:?}"),
        }
        let f = file("[dev]\nrequire-token = false\n");
        let path = f.path().to_str().expect("a UTF-8 path");
        match parsed(&["sked", "dev", "--config", path]).command {
            crate::cli::Command::Dev(args) => assert!(!args.require_token),
            other => panic!("not a dev command: {other:?}"),
        }
    }

    #[test]
    fn mistakes_name_the_table_and_the_key() {
        let cases = [
            (
                "[server]\nlisten = 8080\nlisen = \"x\"\n",
                "[server] has no setting `lisen`",
            ),
            ("[servr]\nlisten = \"x\"\n", "[servr] is not a command"),
            ("listen = \"x\"\n", "`listen` must be a table"),
            ("[server]\nretention = \"soon\"\n", "[server] retention"),
            ("[worker]\nslots = \"many\"\n", "[worker] slots"),
            ("[dev]\nrequire-token = \"yes\"\n", "must be true or false"),
            (
                "[server]\nbroker = [\"events=ftp://sked:hunter2@mq/\"]\n",
                "[server] broker: broker connection \"events\": ftp://",
            ),
            (
                "[server]\nconfig = \"other.toml\"\n",
                "has no setting `config`",
            ),
            ("[server\n", "not valid TOML"),
        ];
        for (text, expected) in cases {
            let f = file(text);
            let message = check(f.path()).expect_err(text).to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
    }

    #[test]
    fn every_mistake_is_reported_with_the_nearest_name() {
        let f = file(
            "[servr]\nlisten = \"x\"\n[server]\nlisen = \"x\"\nretention = \"soon\"\n\
             heartbeat-timout = \"5s\"\nslots = 3\nmax-connections = 0\n\
             [worker]\nslots = \"many\"\nlables = [\"a=b\"]\n",
        );
        let errors = check(f.path()).expect_err("a file with mistakes").0;
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let text = lines.join("\n");
        for expected in [
            "[servr] is not a command that reads a config file (one of: server, worker, dev); \
             did you mean [server]?",
            "[server] has no setting `lisen`; did you mean `listen`?",
            "[server] has no setting `heartbeat-timout`; did you mean `heartbeat-timeout`?",
            // Nothing near enough: no guess.
            "[server] has no setting `slots` (",
            "[server] retention",
            "[server] max-connections",
            "[worker] slots",
            "[worker] has no setting `lables`; did you mean `labels`?",
        ] {
            assert!(text.contains(expected), "{expected:?} not in:\n{text}");
        }
        assert_eq!(lines.len(), 8, "{text}");
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_changes_and_swaps() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("listen", "listen"), 0);
        assert_eq!(edit_distance("lisen", "listen"), 1);
        assert_eq!(edit_distance("listen", "lisen"), 1);
        assert_eq!(edit_distance("lsiten", "listen"), 1);
        assert_eq!(edit_distance("slots", "slits"), 1);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("délai", "delai"), 1);
        assert_eq!(nearest("servr", COMMANDS), Some("server"));
        assert_eq!(nearest("wroker", COMMANDS), Some("worker"));
        assert_eq!(nearest("dve", COMMANDS), Some("dev"));
        assert_eq!(nearest("database", COMMANDS), None);
        assert_eq!(nearest("x", ["y", "xy"]), Some("xy"));
    }

    #[test]
    fn a_good_file_checks() {
        let f = file(
            "[server]\nlisten = \"0.0.0.0:8080\"\nheartbeat-timeout = \"20s\"\n\
             [worker]\nserver = [\"http://a:8080\", \"http://b:8080\"]\nslots = 16\n\
             labels = [\"zone=eu\"]\n[dev]\nslots = 2\n",
        );
        check(f.path()).expect("a valid file");
    }

    /// Every flag of the commands that read a config file can be set by an environment
    /// variable too, so a deployment may use either.
    #[test]
    fn every_setting_has_an_environment_variable() {
        let command = Cli::command();
        for name in COMMANDS {
            let sub = command.find_subcommand(name).expect("the command exists");
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                assert!(
                    arg.get_env().is_some(),
                    "sked {name} --{} has no SKED_* variable",
                    arg.get_long().unwrap_or(id)
                );
            }
        }
    }
}

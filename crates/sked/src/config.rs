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
         server, worker, dev)"
    )]
    UnknownTable { path: PathBuf, table: String },
    #[error("config file {path}: `{key}` must be a table ([{key}]) of that command's settings")]
    NotATable { path: PathBuf, key: String },
    #[error(
        "config file {path}: [{table}] has no setting `{key}` (`sked {table} --help` lists them)"
    )]
    UnknownKey {
        path: PathBuf,
        table: String,
        key: String,
    },
    #[error("config file {path}: [{table}] {key}: {message}")]
    BadValue {
        path: PathBuf,
        table: String,
        key: String,
        message: String,
    },
}

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
/// key must be one of the command's flags and its value one the flag accepts.
pub fn check(path: &Path) -> Result<(), ConfigError> {
    let file = read(path)?;
    for (name, table) in &file {
        let mut argv = vec!["sked".to_string(), name.clone()];
        argv.extend(flags_from(path, name, table, |_| false)?);
        if let Err(e) = Cli::command().try_get_matches_from(&argv) {
            let key = failing_key(&e).unwrap_or_else(|| "?".into());
            return Err(bad_value(path, name, key, &e));
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<toml::Table, ConfigError> {
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
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
    for (key, value) in &table {
        if !COMMANDS.contains(&key.as_str()) {
            return Err(match value {
                toml::Value::Table(_) => ConfigError::UnknownTable {
                    path: path.to_path_buf(),
                    table: key.clone(),
                },
                _ => ConfigError::NotATable {
                    path: path.to_path_buf(),
                    key: key.clone(),
                },
            });
        }
    }
    Ok(table)
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

//! A service's command lines (`systemd.service(5)`, "COMMAND LINES"), `Environment=`
//! assignments and `%` specifiers (`systemd.unit(5)`, "SPECIFIERS"), read with systemd's
//! quoting and written as one `/bin/sh -c` command line that runs the same programs with the
//! same arguments. Which settings hold commands is `systemd.rs`'s business.

/// One `ExecStart=` line: its words after quoting, and what its prefixes asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExecLine {
    /// The program and its arguments, unquoted.
    pub words: Vec<String>,
    /// `-`: a failure counts as success.
    pub ignore_failure: bool,
    /// `:`: systemd does not expand `$VAR` in the words.
    pub literal: bool,
    /// `@`: the word systemd passed as `argv[0]` (dropped: the shell sets its own).
    pub argv0: Option<String>,
    /// `+`, `!` or `!!`: systemd ran it with privileges the service's other settings deny.
    pub privileged: bool,
}

/// Reads an `ExecStart=` value (specifiers already expanded).
pub(super) fn parse_exec(value: &str) -> Result<ExecLine, String> {
    let trimmed = value.trim_start();
    let prefix_len = trimmed
        .find(|c: char| !matches!(c, '-' | '@' | ':' | '+' | '!'))
        .unwrap_or(trimmed.len());
    let (prefix, rest) = trimmed.split_at(prefix_len);
    let mut words = split_words(rest)?;
    if words.iter().any(|w| w == ";") {
        return Err("a lone ';' (several commands on one line) is not read; \
                    give each command its own ExecStart= line"
            .to_string());
    }
    let argv0 = if prefix.contains('@') {
        if words.len() < 2 {
            return Err("the @ prefix needs the program and the argv[0] it is given".to_string());
        }
        Some(words.remove(1))
    } else {
        None
    };
    if words.is_empty() {
        return Err("the command line names no program".to_string());
    }
    Ok(ExecLine {
        words,
        ignore_failure: prefix.contains('-'),
        literal: prefix.contains(':'),
        argv0,
        privileged: prefix.contains('+') || prefix.contains('!'),
    })
}

impl ExecLine {
    /// The command as shell text: each word quoted so the shell passes it unchanged, except
    /// the `$VAR` and `${VAR}` references systemd would have expanded from the environment
    /// (a lone `$VAR` word split at whitespace, as systemd splits it). `-` becomes `|| true`.
    pub fn to_shell(&self) -> String {
        let text = self
            .words
            .iter()
            .map(|w| shell_word(w, !self.literal))
            .collect::<Vec<_>>()
            .join(" ");
        if self.ignore_failure {
            format!("{text} || true")
        } else {
            text
        }
    }
}

/// Several command lines run in order while each succeeds, as systemd runs a oneshot's.
pub(super) fn chain(lines: &[ExecLine]) -> String {
    match lines {
        [one] => one.to_shell(),
        _ => lines
            .iter()
            .map(|line| {
                if line.ignore_failure {
                    format!("{{ {}; }}", line.to_shell())
                } else {
                    line.to_shell()
                }
            })
            .collect::<Vec<_>>()
            .join(" && "),
    }
}

/// Reads an `Environment=` value: one or more `NAME=VALUE` words, quoted as systemd quotes.
pub(super) fn parse_environment(value: &str) -> Result<Vec<(String, String)>, String> {
    split_words(value)?
        .into_iter()
        .map(|word| match word.split_once('=') {
            Some((name, value)) if is_env_name(name) => Ok((name.to_string(), value.to_string())),
            _ => Err(format!("{word:?} is not a NAME=VALUE assignment")),
        })
        .collect()
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits at whitespace, honouring `"…"`, `'…'` and C escapes, as systemd's
/// `extract_first_word` does with unquoting and unescaping.
pub(super) fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, c) if c.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (_, '\\') => word.push(unescape(&mut chars, text)?),
                (_, c) => word.push(c),
            }
        }
        if quote.is_some() {
            return Err(format!("a quote is not closed in {text:?}"));
        }
        words.push(word);
    }
}

fn unescape(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    text: &str,
) -> Result<char, String> {
    let bad = || format!("an escape sequence in {text:?} is not understood");
    let c = chars.next().ok_or_else(bad)?;
    Ok(match c {
        'a' => '\u{7}',
        'b' => '\u{8}',
        'f' => '\u{c}',
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        'v' => '\u{b}',
        's' => ' ',
        '\\' | '"' | '\'' | ' ' => c,
        'x' => {
            let hex: String = (0..2).filter_map(|_| chars.next()).collect();
            u32::from_str_radix(&hex, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(bad)?
        }
        _ => return Err(bad()),
    })
}

/// A word the shell passes through unchanged, or, with `expand`, with systemd's environment
/// references kept as the shell's.
fn shell_word(word: &str, expand: bool) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%^".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        return word.to_string();
    }
    if expand && word.contains('$') {
        if word.len() > 1 && word.starts_with('$') && is_env_name(&word[1..]) {
            return word.to_string();
        }
        let mut out = String::from("\"");
        let mut chars = word.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '$' => match chars.peek() {
                    Some('$') => {
                        chars.next();
                        out.push_str("\\$");
                    }
                    Some(&n) if n == '{' || n == '_' || n.is_ascii_alphabetic() => out.push('$'),
                    _ => out.push_str("\\$"),
                },
                '"' | '\\' | '`' => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
        out.push('"');
        return out;
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// A unit's name in its parts, for specifiers: `backup@db.service` has prefix `backup`,
/// instance `db` and suffix `service`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UnitName {
    pub full: String,
    pub prefix: String,
    pub instance: Option<String>,
}

impl UnitName {
    pub fn parse(full: &str) -> UnitName {
        let stem = full.rsplit_once('.').map_or(full, |(stem, _)| stem);
        let (prefix, instance) = match stem.split_once('@') {
            Some((p, i)) => (p.to_string(), Some(i.to_string())),
            None => (stem.to_string(), None),
        };
        UnitName {
            full: full.to_string(),
            prefix,
            instance,
        }
    }

    /// The name without its type suffix (`%N`).
    pub fn stem(&self) -> String {
        match &self.instance {
            Some(i) => format!("{}@{i}", self.prefix),
            None => self.prefix.clone(),
        }
    }
}

/// Expands the specifiers that depend only on the unit's name (`%%`, `%n`, `%N`, `%p`, `%P`,
/// `%i`, `%I`, `%j`, `%J`). The others depend on the machine or the user systemd runs it for
/// (`%h`, `%u`, `%H`, `%t`...): they are left as written and returned, to be reported.
pub(super) fn expand_specifiers(text: &str, unit: &UnitName) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut unknown = Vec::new();
    let mut chars = text.chars();
    let last_dash = |s: &str| {
        s.rsplit_once('-')
            .map_or(s.to_string(), |(_, l)| l.to_string())
    };
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            unknown.push("%".to_string());
            out.push('%');
            break;
        };
        let instance = unit.instance.clone().unwrap_or_default();
        match spec {
            '%' => out.push('%'),
            'n' => out.push_str(&unit.full),
            'N' => out.push_str(&unit.stem()),
            'p' => out.push_str(&unit.prefix),
            'P' => out.push_str(&unescape_unit(&unit.prefix)),
            'i' => out.push_str(&instance),
            'I' => out.push_str(&unescape_unit(&instance)),
            'j' => out.push_str(&last_dash(&unit.prefix)),
            'J' => out.push_str(&unescape_unit(&last_dash(&unit.prefix))),
            other => {
                let written = format!("%{other}");
                out.push_str(&written);
                if !unknown.contains(&written) {
                    unknown.push(written);
                }
            }
        }
    }
    (out, unknown)
}

/// systemd's unit name unescaping: `-` is `/`, `\xNN` a byte.
fn unescape_unit(text: &str) -> String {
    let mut bytes = Vec::new();
    let raw = text.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'-' => bytes.push(b'/'),
            b'\\' if raw.get(i + 1) == Some(&b'x') => {
                let hex = text
                    .get(i + 2..i + 4)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        bytes.push(b);
                        i += 3;
                    }
                    None => bytes.push(b'\\'),
                }
            }
            b => bytes.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_unquoted_as_systemd_does() {
        assert_eq!(
            split_words(r#"/bin/echo "a b" 'c d' e\ f "q\"uote" \x41"#).unwrap(),
            ["/bin/echo", "a b", "c d", "e f", "q\"uote", "A"]
        );
        assert!(split_words("/bin/echo \"open")
            .unwrap_err()
            .contains("not closed"));
        assert!(split_words(r"/bin/echo \q").is_err());
    }

    #[test]
    fn prefixes_are_stripped_and_kept_as_meaning() {
        let line = parse_exec("-/usr/bin/backup --all").unwrap();
        assert!(line.ignore_failure);
        assert_eq!(line.to_shell(), "/usr/bin/backup --all || true");
        let line = parse_exec("@/usr/bin/backup backupd --all").unwrap();
        assert_eq!(line.argv0.as_deref(), Some("backupd"));
        assert_eq!(line.to_shell(), "/usr/bin/backup --all");
        assert!(parse_exec("+/usr/bin/backup").unwrap().privileged);
        assert!(parse_exec("!!/usr/bin/backup").unwrap().privileged);
        let literal = parse_exec(":/bin/echo $HOME").unwrap();
        assert_eq!(literal.to_shell(), "/bin/echo '$HOME'");
        assert!(parse_exec("/bin/a ; /bin/b").is_err());
        assert!(parse_exec("-").is_err());
    }

    #[test]
    fn the_shell_gets_the_same_words_and_environment_references() {
        let line = parse_exec(r#"/bin/tar -czf "/backups/my files.tgz" $OPTS "--dir=${DIR}" it's"#);
        // An unbalanced quote is systemd's error too.
        assert!(line.is_err());
        let line = parse_exec(
            r#"/bin/tar -czf "/backups/my files.tgz" $OPTS "--dir=${DIR}" "a|b" $$HOME"#,
        )
        .unwrap();
        assert_eq!(
            line.to_shell(),
            r#"/bin/tar -czf '/backups/my files.tgz' $OPTS "--dir=${DIR}" 'a|b' "\$HOME""#
        );
        let chained = chain(&[
            parse_exec("/bin/a").unwrap(),
            parse_exec("-/bin/b").unwrap(),
            parse_exec("/bin/c").unwrap(),
        ]);
        assert_eq!(chained, "/bin/a && { /bin/b || true; } && /bin/c");
    }

    #[test]
    fn environment_lines_hold_several_quoted_assignments() {
        assert_eq!(
            parse_environment(r#"A=1 "B=two words" C='x y' D="#).unwrap(),
            [
                ("A".into(), "1".into()),
                ("B".into(), "two words".into()),
                ("C".into(), "x y".into()),
                ("D".into(), String::new()),
            ]
        );
        assert!(parse_environment("1A=x").is_err());
        assert!(parse_environment("novalue").is_err());
    }

    #[test]
    fn name_specifiers_expand_and_the_others_are_returned() {
        let unit = UnitName::parse("backup@db-main.service");
        let (text, unknown) = expand_specifiers("/bin/run %n %N %p %i %I %% %h/x %u %h", &unit);
        assert_eq!(
            text,
            "/bin/run backup@db-main.service backup@db-main backup db-main db/main % %h/x %u %h"
        );
        assert_eq!(unknown, ["%h", "%u"]);
        let plain = UnitName::parse("backup.service");
        assert_eq!(expand_specifiers("x%iy", &plain).0, "xy");
    }
}

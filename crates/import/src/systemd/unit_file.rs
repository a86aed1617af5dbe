//! The unit file syntax of `systemd.syntax(7)`: sections, `Key=value` assignments, `#`/`;`
//! comments, `\` line continuations, repeated keys and the empty assignment that resets a
//! list. What a key means is `systemd.rs`'s business; this only reads the file's shape.

use crate::ImportError;

/// One `Key=value` assignment, with the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Assignment {
    pub section: String,
    pub key: String,
    pub value: String,
    pub line: usize,
}

impl Assignment {
    /// The assignment as the file wrote it (continuations joined), for reports.
    pub fn text(&self) -> String {
        format!("{}={}", self.key, self.value)
    }
}

/// A parsed unit file: its assignments in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct UnitFile {
    pub assignments: Vec<Assignment>,
}

/// Reads a unit file. A line that is neither a section header, a comment nor an assignment
/// is a syntax error: such a file is not a unit systemd would load, so nothing is guessed.
pub(super) fn parse(text: &str) -> Result<UnitFile, ImportError> {
    let mut unit = UnitFile::default();
    let mut section: Option<String> = None;
    // A continued assignment being collected: its first line and the text so far.
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim();
        if let Some((start, mut joined)) = pending.take() {
            // systemd skips comment lines inside a continued value.
            if line.starts_with('#') || line.starts_with(';') {
                pending = Some((start, joined));
                continue;
            }
            match line.strip_suffix('\\') {
                Some(head) => {
                    joined.push(' ');
                    joined.push_str(head.trim());
                    pending = Some((start, joined));
                }
                None => {
                    joined.push(' ');
                    joined.push_str(line);
                    assign(&mut unit, section.as_deref(), start, &joined)?;
                }
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[') {
            let Some(name) = name.strip_suffix(']') else {
                return Err(syntax(
                    number,
                    format!("section header {line:?} lacks its ']'"),
                ));
            };
            if name.is_empty() || name.contains(['[', ']']) {
                return Err(syntax(number, format!("{line:?} is not a section header")));
            }
            section = Some(name.to_string());
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => pending = Some((number, head.trim_end().to_string())),
            None => assign(&mut unit, section.as_deref(), number, line)?,
        }
    }
    if let Some((start, joined)) = pending {
        // A continuation at the end of the file ends the value there, as systemd reads it.
        assign(&mut unit, section.as_deref(), start, &joined)?;
    }
    Ok(unit)
}

fn assign(
    unit: &mut UnitFile,
    section: Option<&str>,
    line: usize,
    text: &str,
) -> Result<(), ImportError> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(syntax(
            line,
            format!("{text:?} is neither a [Section] header, a comment nor a Key=value assignment"),
        ));
    };
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(syntax(line, format!("{key:?} is not a setting name")));
    }
    let Some(section) = section else {
        return Err(syntax(
            line,
            format!("{key}= stands before any [Section] header"),
        ));
    };
    unit.assignments.push(Assignment {
        section: section.to_string(),
        key: key.to_string(),
        value: value.trim().to_string(),
        line,
    });
    Ok(())
}

fn syntax(line: usize, message: String) -> ImportError {
    ImportError::Syntax { line, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_comments_continuations_and_repeats() {
        let text = "# a timer\n\
                    [Unit]\n\
                    Description=Nightly backup\n\
                    ; another comment\n\
                    \n\
                    [Timer]\n\
                    OnCalendar=Mon..Fri \\\n\
                    # skipped inside the continuation\n\
                      *-*-* 09:00\n\
                    OnCalendar = daily \n\
                    OnCalendar=\n";
        let unit = parse(text).unwrap();
        let got: Vec<_> = unit
            .assignments
            .iter()
            .map(|a| (a.section.as_str(), a.key.as_str(), a.value.as_str(), a.line))
            .collect();
        assert_eq!(
            got,
            [
                ("Unit", "Description", "Nightly backup", 3),
                ("Timer", "OnCalendar", "Mon..Fri *-*-* 09:00", 7),
                ("Timer", "OnCalendar", "daily", 10),
                ("Timer", "OnCalendar", "", 11),
            ]
        );
    }

    #[test]
    fn a_line_that_is_not_unit_syntax_is_an_error_with_its_line() {
        let err = parse("[Timer]\nOnCalendar=daily\nthis is not a setting\n").unwrap_err();
        assert!(
            matches!(&err, ImportError::Syntax { line: 3, message } if message.contains("Key=value")),
            "{err:?}"
        );
        assert!(matches!(
            parse("OnCalendar=daily\n"),
            Err(ImportError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            parse("[Timer\n"),
            Err(ImportError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            parse("[Timer]\nOn Calendar=daily\n"),
            Err(ImportError::Syntax { line: 2, .. })
        ));
    }
}

//! The quota file: a tiny TOML subset, parsed by hand (no TOML dependency).
//!
//! Accepted: blank lines, `# comments` (also after a value), `key = value` pairs where the key is
//! bare (`A-Za-z0-9_-`) or a basic/literal string, values that are basic strings (`"..."` with
//! `\" \\ \n \t` escapes), literal strings (`'...'`) or non-negative integers (`4294967296`, `4_096`),
//! and table headers `[name]`. Anything else is an error naming `file:line`.

use std::path::Path;

/// A scalar value from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Str(String),
    Int(u64),
}

impl Value {
    /// The value as text, so sizes can be written either `"4GiB"` or `4294967296`.
    pub fn as_text(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
        }
    }
}

/// One `key = value` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Table the key is in (`""` for the top level).
    pub table: String,
    pub key: String,
    pub value: Value,
    /// 1-based line number, for `file:line` messages.
    pub line: usize,
}

/// Parses the file's text. Returns the entries and the syntax errors (each `path:line: message`).
pub fn parse(path: &Path, text: &str) -> (Vec<Entry>, Vec<String>) {
    let mut entries: Vec<Entry> = Vec::new();
    let mut errors = Vec::new();
    let mut table = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |msg: String| format!("{}:{line}: {msg}", path.display());
        match parse_line(raw) {
            Ok(Line::Blank) => {}
            Ok(Line::Table(name)) => table = name,
            Ok(Line::Pair(key, value)) => {
                if let Some(prev) = entries.iter().find(|e| e.table == table && e.key == key) {
                    errors.push(err(format!(
                        "duplicate key \"{key}\" (first set on line {})",
                        prev.line
                    )));
                } else {
                    entries.push(Entry {
                        table: table.clone(),
                        key,
                        value,
                        line,
                    });
                }
            }
            Err(msg) => errors.push(err(msg)),
        }
    }
    (entries, errors)
}

enum Line {
    Blank,
    Table(String),
    Pair(String, Value),
}

fn parse_line(raw: &str) -> Result<Line, String> {
    let s = raw.trim();
    if s.is_empty() || s.starts_with('#') {
        return Ok(Line::Blank);
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (name, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("unterminated table header {s:?} (expected [name])"))?;
        expect_end(tail)?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(is_bare) {
            return Err(format!(
                "bad table name {name:?} (expected letters, digits, _ or -)"
            ));
        }
        return Ok(Line::Table(name.to_string()));
    }
    let (key, rest) = parse_key(s)?;
    let rest = rest.trim_start();
    let rest = rest
        .strip_prefix('=')
        .ok_or_else(|| format!("expected `=` after key \"{key}\""))?
        .trim_start();
    let (value, tail) = parse_value(rest)?;
    expect_end(tail)?;
    Ok(Line::Pair(key, value))
}

fn is_bare(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn expect_end(tail: &str) -> Result<(), String> {
    let t = tail.trim();
    if t.is_empty() || t.starts_with('#') {
        Ok(())
    } else {
        Err(format!("unexpected text {t:?} after the value"))
    }
}

fn parse_key(s: &str) -> Result<(String, &str), String> {
    match s.chars().next() {
        Some('"') | Some('\'') => parse_string(s),
        _ => {
            let end = s.find(|c: char| !is_bare(c)).unwrap_or(s.len());
            if end == 0 {
                return Err(format!(
                    "expected a key (letters, digits, _ or -, or a quoted string), found {s:?}"
                ));
            }
            Ok((s[..end].to_string(), &s[end..]))
        }
    }
}

fn parse_value(s: &str) -> Result<(Value, &str), String> {
    match s.chars().next() {
        Some('"') | Some('\'') => parse_string(s).map(|(v, rest)| (Value::Str(v), rest)),
        Some(c) if c.is_ascii_digit() => {
            let end = s
                .find(|c: char| !(c.is_ascii_digit() || c == '_'))
                .unwrap_or(s.len());
            if s[end..].starts_with(|c: char| c.is_ascii_alphabetic() || c == '.') {
                // `memory_limit = 4GiB`: a size needs quotes in TOML.
                let word_end = s
                    .find(|c: char| c.is_whitespace() || c == '#')
                    .unwrap_or(s.len());
                let word = &s[..word_end];
                return Err(format!(
                    "unquoted value {word:?} (expected a \"string\" such as \"{word}\", or a non-negative integer)"
                ));
            }
            let digits: String = s[..end].chars().filter(|&c| c != '_').collect();
            let n = digits
                .parse()
                .map_err(|_| format!("integer {:?} out of range", &s[..end]))?;
            Ok((Value::Int(n), &s[end..]))
        }
        None => Err("missing value after `=`".into()),
        _ => Err(format!(
            "unsupported value {s:?} (expected a \"string\" or a non-negative integer)"
        )),
    }
}

/// Parses a basic (`"..."`) or literal (`'...'`) string at the start of `s`.
fn parse_string(s: &str) -> Result<(String, &str), String> {
    let quote = s.chars().next().unwrap_or('"');
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1);
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Ok((out, &s[i + 1..]));
        }
        if c == '\\' && quote == '"' {
            match chars.next().map(|(_, c)| c) {
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                other => {
                    return Err(format!(
                        "unsupported escape \\{} (expected \\\", \\\\, \\n or \\t)",
                        other.map(String::from).unwrap_or_default()
                    ))
                }
            }
        } else {
            out.push(c);
        }
    }
    Err(format!("unterminated string {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subset() {
        let text = r#"# gpuslice quota
tenant = "team-a"            # optional
ledger = '/dev/shm/gpuslice/team-a.ledger'
memory_limit = 4_294_967_296
[devices]
"0" = "2GiB"
"GPU-1b2c" = "8GiB" # comment
"#;
        let (entries, errors) = parse(Path::new("q.toml"), text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0].key, "tenant");
        assert_eq!(entries[0].value, Value::Str("team-a".into()));
        assert_eq!(entries[2].value, Value::Int(4 << 30));
        assert_eq!(entries[3].table, "devices");
        assert_eq!(entries[4].key, "GPU-1b2c");
        assert_eq!(entries[4].line, 7);
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let text =
            "tenant = \"a\"\nmemory_limit 4GiB\nx = \"open\n[bad\ny = true\ntenant = \"b\"\n";
        let (_, errors) = parse(Path::new("/etc/q.toml"), text);
        assert_eq!(
            errors,
            vec![
                "/etc/q.toml:2: expected `=` after key \"memory_limit\"".to_string(),
                "/etc/q.toml:3: unterminated string \"\\\"open\"".to_string(),
                "/etc/q.toml:4: unterminated table header \"[bad\" (expected [name])".to_string(),
                "/etc/q.toml:5: unsupported value \"true\" (expected a \"string\" or a non-negative integer)".to_string(),
                "/etc/q.toml:6: duplicate key \"tenant\" (first set on line 1)".to_string(),
            ]
        );
    }
}

//! [`ProfileError`], and the small helpers that keep the wording of its messages in one
//! place: JSON paths (`nodes[3].gpu_links`, `["1"].bandwidth`), quoted strings, what a JSON
//! value is, numbers and counts in words.

use serde_json::{Map, Value};

use super::SCHEMA_VERSION;

/// Why a cluster profile could not be read. Every message is one line: the file, the JSON
/// path of the field, what is wrong, and in parentheses what to do.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{origin}: cannot read the cluster profile: {io} (check the path, and that the file exists and is readable)")]
    Read { origin: String, io: std::io::Error },

    #[error("{origin}:{line}:{column}: not valid JSON: {message} ({hint})")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
        hint: &'static str,
    },

    #[error("{origin}: not a cluster profile: the top level is {found} (expected an object with \"schema\": \"{v}\", a Pipette bandwidth file {{\"gpus\": [hosts], \"bandwidth\": [[GB/s]]}} or Pipette's mpiGraph tables {{\"0\": ..., \"1\": ...}}; see docs/cluster-profile.md)", v = SCHEMA_VERSION)]
    UnknownFormat { origin: String, found: String },

    #[error("{origin}: schema is {found}, but this pipette-run reads \"{v}\" (write the file in that version, or use the pipette-run that wrote it)", v = SCHEMA_VERSION)]
    UnknownSchema { origin: String, found: String },

    #[error("{origin}: {path} is missing ({hint})")]
    MissingField {
        origin: String,
        path: String,
        hint: String,
    },

    #[error("{origin}: {path} is {found} (expected {expected})")]
    WrongType {
        origin: String,
        path: String,
        found: String,
        expected: String,
    },

    #[error(
        "{origin}: {path} is not a field of {owner} (its fields are {allowed}; check the spelling)"
    )]
    UnknownField {
        origin: String,
        path: String,
        owner: &'static str,
        allowed: String,
    },

    #[error("{origin}: {path} {problem}")]
    MatrixShape {
        origin: String,
        path: String,
        problem: String,
    },

    #[error("{origin}: {path} is {found}, not a finite number (write the bandwidth in {unit}, e.g. {example})")]
    NotANumber {
        origin: String,
        path: String,
        found: String,
        unit: &'static str,
        example: &'static str,
    },

    #[error("{origin}: {path} is {} {unit}, a negative bandwidth (correct the figure, or measure the link again)", show_number(*.value))]
    NegativeBandwidth {
        origin: String,
        path: String,
        value: f64,
        unit: &'static str,
    },

    #[error("{origin}: {path} is 0: no bandwidth from {from} to {to} (was the link measured? measure it again, or leave one of the two out)")]
    ZeroBandwidth {
        origin: String,
        path: String,
        from: String,
        to: String,
    },

    #[error("{origin}: {path} is {} {unit}, beyond what any link attains (figures from {} to {max} {unit} are accepted; check the unit: Pipette bandwidth files hold GB/s, mpiGraph tables MB/s)", show_number(*.value), show_number(*.min))]
    ImplausibleBandwidth {
        origin: String,
        path: String,
        value: f64,
        unit: &'static str,
        min: f64,
        max: f64,
    },

    #[error("{origin}: {path} repeats host {host}, already at {first} (list each node once)")]
    DuplicateHost {
        origin: String,
        path: String,
        host: String,
        first: String,
    },

    #[error(
        "{origin}: {path} is 0 bytes (give the GPU's memory in bytes, e.g. 85899345920 for 80 GiB)"
    )]
    ZeroMemory { origin: String, path: String },

    #[error("{origin}: {path} {problem}")]
    InvalidValue {
        origin: String,
        path: String,
        problem: String,
    },
}

impl ProfileError {
    /// The file (or other origin) the error is about.
    pub fn origin(&self) -> &str {
        match self {
            ProfileError::Read { origin, .. }
            | ProfileError::Syntax { origin, .. }
            | ProfileError::UnknownFormat { origin, .. }
            | ProfileError::UnknownSchema { origin, .. }
            | ProfileError::MissingField { origin, .. }
            | ProfileError::WrongType { origin, .. }
            | ProfileError::UnknownField { origin, .. }
            | ProfileError::MatrixShape { origin, .. }
            | ProfileError::NotANumber { origin, .. }
            | ProfileError::NegativeBandwidth { origin, .. }
            | ProfileError::ZeroBandwidth { origin, .. }
            | ProfileError::ImplausibleBandwidth { origin, .. }
            | ProfileError::DuplicateHost { origin, .. }
            | ProfileError::ZeroMemory { origin, .. }
            | ProfileError::InvalidValue { origin, .. } => origin,
        }
    }

    /// The JSON path of the field at fault, when the error is about one field.
    pub fn path(&self) -> Option<&str> {
        match self {
            ProfileError::Read { .. }
            | ProfileError::Syntax { .. }
            | ProfileError::UnknownFormat { .. } => None,
            ProfileError::UnknownSchema { .. } => Some("schema"),
            ProfileError::MissingField { path, .. }
            | ProfileError::WrongType { path, .. }
            | ProfileError::UnknownField { path, .. }
            | ProfileError::MatrixShape { path, .. }
            | ProfileError::NotANumber { path, .. }
            | ProfileError::NegativeBandwidth { path, .. }
            | ProfileError::ZeroBandwidth { path, .. }
            | ProfileError::ImplausibleBandwidth { path, .. }
            | ProfileError::DuplicateHost { path, .. }
            | ProfileError::ZeroMemory { path, .. }
            | ProfileError::InvalidValue { path, .. } => Some(path),
        }
    }
}

pub(crate) fn invalid(origin: &str, path: &str, problem: String) -> ProfileError {
    ProfileError::InvalidValue {
        origin: origin.into(),
        path: shown(path),
        problem,
    }
}

pub(crate) fn missing(origin: &str, path: &str, hint: String) -> ProfileError {
    ProfileError::MissingField {
        origin: origin.into(),
        path: shown(path),
        hint,
    }
}

pub(crate) fn wrong_type(origin: &str, path: &str, found: &Value, expected: &str) -> ProfileError {
    ProfileError::WrongType {
        origin: origin.into(),
        path: shown(path),
        found: describe(found),
        expected: expected.into(),
    }
}

/// `parent.key`, or `parent["key"]` when the key is not a plain name (mpiGraph's "0").
pub(crate) fn field_path(parent: &str, key: &str) -> String {
    let plain = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (_, false) => format!("{parent}[{}]", quote(key)),
    }
}

pub(crate) fn index_path(parent: &str, index: usize) -> String {
    format!("{parent}[{index}]")
}

fn shown(path: &str) -> String {
    if path.is_empty() {
        "the top level".into()
    } else {
        path.into()
    }
}

/// A string as a JSON literal on one line, shortened when long.
pub(crate) fn quote(text: &str) -> String {
    const MAX_CHARS: usize = 60;
    let mut out = String::from("\"");
    for (k, c) in text.chars().enumerate() {
        if k == MAX_CHARS {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What a JSON value is, for "is X (expected Y)" messages.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("{b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {}", quote(s)),
        Value::Array(items) if items.is_empty() => "an empty list".into(),
        Value::Array(items) => format!("a list of {}", count(items.len(), "item")),
        Value::Object(map) => describe_keys(map),
    }
}

pub(crate) fn describe_keys(map: &Map<String, Value>) -> String {
    if map.is_empty() {
        return "an empty object".into();
    }
    let mut keys: Vec<String> = map.keys().take(5).map(|k| quote(k)).collect();
    if map.len() > 5 {
        keys.push("…".into());
    }
    format!("an object with fields {}", keys.join(", "))
}

/// A number for a message: `-3`, `19635.4`, `1e-200` (never hundreds of zeros).
pub(crate) fn show_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&x.abs()) {
        x.to_string()
    } else {
        format!("{x:e}")
    }
}

/// "1 row", "8 rows".
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// "there is 1 node", "there are 4 nodes".
pub(crate) fn there_are(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("there is 1 {noun}")
    } else {
        format!("there are {n} {noun}s")
    }
}

/// The origin without control characters, so that every message stays on one line.
pub(crate) fn clean_origin(origin: &str) -> String {
    origin
        .chars()
        .map(|c| {
            if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
                '?'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_quote_keys_that_are_not_plain_names() {
        assert_eq!(field_path("", "nodes"), "nodes");
        assert_eq!(field_path("nodes[3]", "gpu_links"), "nodes[3].gpu_links");
        assert_eq!(field_path("", "0"), "[\"0\"]");
        assert_eq!(field_path("x", "a b"), "x[\"a b\"]");
        assert_eq!(index_path("nodes", 2), "nodes[2]");
    }

    #[test]
    fn quote_keeps_messages_on_one_line() {
        assert_eq!(quote("a\nb"), "\"a\\u000ab\"");
        assert_eq!(quote("x\u{2028}"), "\"x\\u2028\"");
        assert!(quote(&"h".repeat(100)).ends_with("…\""));
        assert_eq!(clean_origin("a\nb.json"), "a?b.json");
    }
}

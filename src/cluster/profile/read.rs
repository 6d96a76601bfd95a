//! Reading a profile: JSON text to [`ClusterProfile`], in any format [`ClusterProfile::load`]
//! knows. The file's structure is read by serde derive (see [`super::types`]), with
//! `serde_path_to_error` giving the JSON path of a field serde refuses; this module turns
//! serde's words into ours (what was found, what belongs there, what to write when it is
//! missing), then hands the file to the validation pass.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_path_to_error::Segment;

use super::error::{
    clean_origin, describe, describe_keys, field_path, index_path, invalid, missing, quote,
    wrong_type,
};
use super::types::ProfileFile;
use super::validate::GPU_LINKS_HINT;
use super::{ClusterProfile, ProfileError, SCHEMA_VERSION};
use crate::cluster::import;

impl ClusterProfile {
    /// Reads a profile from JSON text in any format [`ClusterProfile::load`] knows.
    /// `origin` names the text in error messages (usually the file name).
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let origin = clean_origin(origin);
        let value = parse_json(text.as_bytes(), &origin)?;
        Self::from_value(&value, &origin)
    }

    /// Reads a profile file, recognising its format by its content:
    ///
    /// - `{"schema": "pipette-cluster/1", ...}`: this crate's own format;
    /// - `{"gpus": [hosts], "bandwidth": [[GB/s]]}`: the original Pipette bandwidth file
    ///   (cells may be numbers or strings such as `"19.6"`);
    /// - `{"0": {"gpus": ..., "bandwidth": [[MB/s]]}, "1": ...}`: mpiGraph's tables as
    ///   Pipette kept them.
    ///
    /// Imported files know the network only: their nodes' GPUs are
    /// [`super::GpuInventory::Unknown`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        let path = path.as_ref();
        let origin = clean_origin(&path.display().to_string());
        let bytes = crate::input_file::read(path).map_err(|io| ProfileError::Read {
            origin: origin.clone(),
            io,
        })?;
        let value = parse_json(&bytes, &origin)?;
        Self::from_value(&value, &origin)
    }

    /// Reads a profile from parsed JSON, in any format [`ClusterProfile::load`] knows.
    pub fn from_value(value: &Value, origin: &str) -> Result<Self, ProfileError> {
        let origin = clean_origin(origin);
        let Some(root) = value.as_object() else {
            return Err(ProfileError::UnknownFormat {
                origin,
                found: describe(value),
            });
        };
        match import::detect(root) {
            import::Format::Native => read_native(value, &origin),
            import::Format::Pipette => import::pipette_bandwidth(value, &origin),
            import::Format::MpiGraph => import::mpigraph(value, &origin),
            import::Format::Unrecognised => Err(ProfileError::UnknownFormat {
                origin,
                found: describe_keys(root),
            }),
        }
    }
}

impl<'de> Deserialize<'de> for ClusterProfile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ClusterProfile::from_value(&value, "cluster profile").map_err(serde::de::Error::custom)
    }
}

/// The schema version is checked first, so that a file of another version is refused as
/// such rather than for the fields that version has.
fn read_native(value: &Value, origin: &str) -> Result<ClusterProfile, ProfileError> {
    match value.get("schema") {
        None => {
            return Err(missing(
                origin,
                "schema",
                format!("add \"schema\": \"{SCHEMA_VERSION}\" as the first field"),
            ))
        }
        Some(Value::String(s)) if s == SCHEMA_VERSION => {}
        Some(Value::String(s)) => {
            return Err(ProfileError::UnknownSchema {
                origin: origin.into(),
                found: quote(s),
            })
        }
        Some(other) => {
            return Err(wrong_type(
                origin,
                "schema",
                other,
                &format!("the string \"{SCHEMA_VERSION}\""),
            ))
        }
    }
    let file: ProfileFile = deserialize(value, origin, Format::Native)?;
    super::validate::check(file, origin)
}

/// The file formats whose structure serde reads, for the words of the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Native,
    /// The original Pipette bandwidth file (GB/s).
    Pipette,
    /// mpiGraph's tables as Pipette kept them (MB/s).
    MpiGraph,
}

/// `value` read as a `T`, or the error a user reads: the field's path, what is there, and
/// what belongs there.
pub(crate) fn deserialize<T: DeserializeOwned>(
    value: &Value,
    origin: &str,
    format: Format,
) -> Result<T, ProfileError> {
    serde_path_to_error::deserialize(value).map_err(|e| translate(&e, value, origin, format))
}

/// One step of a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

fn path_of(steps: &[Step]) -> String {
    steps.iter().fold(String::new(), |path, step| match step {
        Step::Key(key) => field_path(&path, key),
        Step::Index(i) => index_path(&path, *i),
    })
}

fn value_at<'v>(root: &'v Value, steps: &[Step]) -> Option<&'v Value> {
    steps.iter().try_fold(root, |value, step| match step {
        Step::Key(key) => value.get(key.as_str()),
        Step::Index(i) => value.get(*i),
    })
}

fn translate(
    error: &serde_path_to_error::Error<serde_json::Error>,
    root: &Value,
    origin: &str,
    format: Format,
) -> ProfileError {
    let mut steps: Vec<Step> = error
        .path()
        .iter()
        .filter_map(|segment| match segment {
            Segment::Seq { index } => Some(Step::Index(*index)),
            Segment::Map { key } => Some(Step::Key(key.clone())),
            Segment::Enum { .. } | Segment::Unknown => None,
        })
        .collect();
    // serde's own words for these two are stable: "missing field `x`" and "unknown field
    // `x`, expected one of `a`, `b`, `c`" (or "expected `a` or `b`", or "expected `a`").
    let message = error.inner().to_string();
    if let Some(field) = quoted_after(&message, "missing field `") {
        steps.push(Step::Key(field.into()));
        let hint = place(format, &steps, &Value::Null).missing;
        return missing(origin, &path_of(&steps), hint.unwrap_or("add it").into());
    }
    if let Some(field) = quoted_after(&message, "unknown field `") {
        if steps.last() != Some(&Step::Key(field.into())) {
            steps.push(Step::Key(field.into()));
        }
        let owner = place(format, &steps[..steps.len() - 1], &Value::Null).owner;
        let allowed = message
            .split_once(", expected ")
            .map_or("none", |(_, list)| list)
            .trim_start_matches("one of ")
            .replace("` or `", ", ")
            .replace('`', "");
        return ProfileError::UnknownField {
            origin: origin.into(),
            path: path_of(&steps),
            owner: owner.unwrap_or("this object"),
            allowed,
        };
    }
    // A value of the wrong type, or out of a type's range: name the deepest place whose
    // expectation we know (a list given where an object belongs fails inside the list).
    while !steps.is_empty() {
        let found = value_at(root, &steps).unwrap_or(&Value::Null);
        let place = place(format, &steps, found);
        let path = path_of(&steps);
        match (place.missing, place.expected) {
            (Some(hint), _) if found.is_null() => return missing(origin, &path, hint.into()),
            _ if steps.last() == Some(&Step::Key("source".into())) && found.is_string() => {
                return invalid(
                    origin,
                    &path,
                    format!(
                        "is {} (write one of {SOURCES})",
                        quote(found.as_str().unwrap_or(""))
                    ),
                )
            }
            (_, Some(expected)) => return wrong_type(origin, &path, found, &expected),
            (_, None) => {
                steps.pop();
            }
        }
    }
    invalid(origin, "", format!("is not valid ({message})"))
}

/// The text between `prefix` and the next backtick.
fn quoted_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    message.strip_prefix(prefix)?.split('`').next()
}

const SOURCES: &str = "\"measured\", \"datasheet\", \"imported\", \"estimated\"";
const LINKS: &str = "{\"provenance\": {...}, \"gb_per_s\": [[...]]}";

/// What the schema says about one place in a file.
#[derive(Debug, Default)]
struct Place {
    /// What belongs there, for "is X (expected Y)".
    expected: Option<String>,
    /// What to write when it is missing (a null counts as missing).
    missing: Option<&'static str>,
    /// What the object there is, for "is not a field of X".
    owner: Option<&'static str>,
}

fn expect(text: &str) -> Place {
    Place {
        expected: Some(text.into()),
        ..Place::default()
    }
}

impl Place {
    fn or_missing(mut self, hint: &'static str) -> Place {
        self.missing = Some(hint);
        self
    }

    fn owner(mut self, owner: &'static str) -> Place {
        self.owner = Some(owner);
        self
    }
}

/// The place `steps` points to in a file of `format`; `found` is what is there.
fn place(format: Format, steps: &[Step], found: &Value) -> Place {
    let names: Vec<&str> = steps
        .iter()
        .map(|step| match step {
            Step::Key(key) => key.as_str(),
            Step::Index(_) => "[]",
        })
        .collect();
    match (format, names.as_slice()) {
        (Format::Native, names) => native_place(steps, names, found),
        (Format::Pipette, names) => table_place(
            names,
            "give the host-pair bandwidths in GB/s, one row per host in the order of gpus",
        ),
        (Format::MpiGraph, [_]) => {
            expect("an mpiGraph table: {\"gpus\": [hosts], \"bandwidth\": [[MB/s]]}")
        }
        (Format::MpiGraph, [_, names @ ..]) => table_place(
            names,
            "give the table's bandwidths in MB/s, one row per host in the order of gpus",
        ),
        (Format::MpiGraph, []) => Place::default(),
    }
}

/// "a number of TFLOPS", and when a string was given, "..., without quotes".
fn number(what: &str, found: &Value) -> Place {
    expect(&if found.is_string() {
        format!("a number {what}, without quotes")
    } else {
        format!("a number {what}")
    })
}

fn native_place(steps: &[Step], names: &[&str], found: &Value) -> Place {
    // One row per node in node_links, per GPU in a node's gpu_links.
    let per = if names.first() == Some(&"node_links") {
        "node"
    } else {
        "GPU"
    };
    match names {
        [] => Place::default().owner("a cluster profile"),
        ["note"] | [.., "provenance", "date" | "tool" | "note"] => expect("a string"),
        ["nodes"] => expect("a list of nodes").or_missing(
            "list the nodes, e.g. \"nodes\": [{\"host\": \"node1\", \"gpus\": \"unknown\"}]",
        ),
        ["node_links"] => expect(LINKS)
            .or_missing(
                "give the node-pair bandwidths: {\"provenance\": {...}, \"gb_per_s\": [[...]]}",
            )
            .owner("a link matrix"),
        ["nodes", "[]"] => expect("a node: {\"host\": ..., \"gpus\": ...}").owner("a node"),
        [.., "host"] => expect("a host name (a string)").or_missing("give the node's host name"),
        ["nodes", "[]", "gpus"] => expect("a list of GPUs, or \"unknown\"").or_missing(
            "list the node's GPUs, or write \"gpus\": \"unknown\" to have them profiled",
        ),
        [.., "nics_per_node"] => expect("a whole number of NICs per node, e.g. 8"),
        [.., "all_rails", "rails"] => expect("a whole number of rails, e.g. 8"),
        [.., "all_rails", "gb_per_s" | "one_rail_gb_per_s"] => expect("a number in GB/s"),
        [.., "all_rails"] => expect(
            "the rails measured at once: {\"rails\": 8, \"gb_per_s\": 352.0, \"one_rail_gb_per_s\": 48.5}",
        ),
        [.., "gpu_links"] => expect(LINKS)
            .or_missing(GPU_LINKS_HINT)
            .owner("a link matrix"),
        [.., "gpus", "[]"] => expect("a GPU: {\"index\": 0, \"name\": ..., ...}").owner("a GPU"),
        [.., "index"] => expect("a device index such as 0")
            .or_missing("give the GPU's device index as nvidia-smi numbers it"),
        [.., "name"] => expect("the GPU model (a string)")
            .or_missing("give the GPU model, e.g. \"A100-SXM4-80GB\""),
        [.., "memory_bytes"] => expect("a whole number of bytes, e.g. 85899345920 for 80 GiB")
            .or_missing("give the GPU's memory in bytes, e.g. 85899345920 for 80 GiB"),
        [.., "peak_tflops"] => expect(
            "dense TFLOPS per dtype, e.g. {\"bf16\": 312.0, \"fp16\": 312.0}",
        )
        .or_missing(
            "give the datasheet's dense tensor TFLOPS, e.g. {\"bf16\": 312.0, \"fp16\": 312.0}",
        )
        .owner("peak_tflops"),
        [.., "bf16"] => number(
            "of TFLOPS, or null when the GPU has no bf16 tensor cores",
            found,
        ),
        [.., "fp16"] => {
            number("of TFLOPS", found).or_missing("give the datasheet's dense fp16 tensor TFLOPS")
        }
        [.., "measured_tflops"] => {
            expect("{\"dtype\": \"bf16\", \"tflops\": ..., \"provenance\": {...}}, or a list of such figures, one per dtype")
                .owner("measured_tflops")
        }
        [.., "measured_tflops", "[]"] => {
            expect("{\"dtype\": \"bf16\", \"tflops\": ..., \"provenance\": {...}}")
                .owner("measured_tflops")
        }
        [.., "dtype"] => expect("\"bf16\", \"fp16\" or \"fp32\"")
            .or_missing("say which dtype was measured: \"bf16\", \"fp16\" or \"fp32\""),
        [.., "tflops"] => number("of TFLOPS", found).or_missing("give the attained TFLOPS"),
        [.., parent, "provenance"] => {
            let grandparent = names.len().checked_sub(3).map_or("", |i| names[i]);
            let hint = match (grandparent, *parent) {
                (_, "measured_tflops") | ("measured_tflops", "[]") => "say how it was measured, e.g. {\"source\": \"measured\", \"date\": \"2024-05-31\"}",
                (_, "[]") => "say where the GPU's figures came from, e.g. {\"source\": \"datasheet\"}",
                _ => "say where the bandwidths came from, e.g. {\"source\": \"measured\", \"tool\": \"nccl-tests\"}",
            };
            expect("where the figures came from, e.g. {\"source\": \"measured\", \"date\": \"2024-05-31\"}").or_missing(hint).owner("provenance")
        }
        [.., "source"] => expect(&format!("one of {SOURCES}")).or_missing(
            "say where the figures came from: measured, datasheet, imported or estimated",
        ),
        [.., "gb_per_s"] => expect(&format!(
            "a square matrix, one row per {per} (a list of lists)"
        ))
        .or_missing("give the bandwidths in GB/s, one row per sender, one column per receiver"),
        [.., "gb_per_s", "[]"] => expect(&format!("a row of bandwidths, one per {per}")),
        [.., "node_gb_per_s"] => expect("a list of bandwidths in GB/s, one per node"),
        [.., "node_gb_per_s", "[]"] => number("in GB/s", found),
        [.., "pairs"] => expect("a list of measured pairs, each [from node, to node, GB/s]"),
        [.., "pairs", "[]"] => expect("a measured pair: [from node, to node, GB/s]"),
        [.., "pairs", "[]", "[]"] => match steps.last() {
            Some(Step::Index(2)) => number("in GB/s", found),
            _ => expect("a node's position in nodes, from 0"),
        },
        [.., "gb_per_s", "[]", "[]"] => {
            let diagonal = matches!(steps, [.., Step::Index(i), Step::Index(j)] if i == j);
            if diagonal {
                expect("a number (the diagonal is not used; write 0)")
            } else {
                number("in GB/s", found)
            }
        }
        _ => Place::default(),
    }
}

/// A Pipette bandwidth file, or one mpiGraph table: `{"gpus": [hosts], "bandwidth": [[...]]}`.
fn table_place(names: &[&str], bandwidth_hint: &'static str) -> Place {
    match names {
        ["gpus"] => expect("a list of host names")
            .or_missing("list the hosts, in the order of the bandwidth rows"),
        ["gpus", "[]"] => expect("a host name (a string)"),
        ["bandwidth"] => {
            expect("a square matrix, one row per host (a list of lists)").or_missing(bandwidth_hint)
        }
        ["bandwidth", "[]"] => expect("a row of bandwidths, one per host"),
        _ => Place::default(),
    }
}

/// Parses a profile file's JSON: a UTF-8 byte-order mark at the start is skipped (editors
/// on Windows write one), and a key repeated in one object is an error at its line and
/// column (serde_json keeps the last silently, so a file edited by hand could carry a
/// value nobody sees).
fn parse_json(bytes: &[u8], origin: &str) -> Result<Value, ProfileError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    serde_json::from_slice::<StrictValue>(bytes)
        .map(|v| v.0)
        .map_err(|e| syntax_error(origin, &e))
}

/// A JSON value read with every object's keys checked to be distinct.
struct StrictValue(Value);

const DUPLICATE_KEY: &str = "duplicate key";

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "{DUPLICATE_KEY} {}",
                    quote(&key)
                )));
            }
            let StrictValue(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn syntax_error(origin: &str, error: &serde_json::Error) -> ProfileError {
    let text = error.to_string();
    // serde_json ends its messages with " at line L column C"; we put those first.
    let message = match text.rfind(" at line ") {
        Some(at) => text[..at].to_string(),
        None => text,
    };
    let hint = if error.classify() == serde_json::error::Category::Eof {
        "the file is empty or cut short"
    } else if message.starts_with(DUPLICATE_KEY) {
        "an object names each key once: keep the value meant and delete the other"
    } else {
        "fix the JSON at that line and column"
    };
    ProfileError::Syntax {
        origin: origin.into(),
        line: error.line(),
        column: error.column(),
        message,
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let err = ClusterProfile::from_json_str("{\n  \"schema\": 1,,\n}", "s.json").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("s.json:2:"), "{text}");
        assert!(!text.contains(" at line "), "{text}");
        let err = ClusterProfile::from_json_str("", "e.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty or cut short"), "{err}");
    }

    #[test]
    fn defect_12_duplicate_json_keys_are_an_error_not_last_wins() {
        let text = "{\n  \"gpus\": [\"a\", \"b\"],\n  \"gpus\": [\"c\", \"d\"],\n  \"bandwidth\": [[0, 1], [1, 0]]\n}";
        let err = ClusterProfile::from_json_str(text, "d.json")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("d.json:3:"), "{err}");
        assert!(err.contains("duplicate key \"gpus\""), "{err}");
        assert!(err.contains("keep the value meant"), "{err}");
        // Repeated keys in different objects are fine.
        let ok = "{\"gpus\": [\"a\", \"b\"], \"bandwidth\": [[0, 1], [1, 0]]}";
        assert!(ClusterProfile::from_json_str(ok, "ok.json").is_ok());
    }

    #[test]
    fn defect_12_a_utf8_byte_order_mark_is_accepted() {
        let text = "\u{feff}{\"gpus\": [\"a\", \"b\"], \"bandwidth\": [[0, 1], [1, 0]]}";
        let profile = ClusterProfile::from_json_str(text, "bom.json").unwrap();
        assert_eq!(profile.nodes.len(), 2);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bom.json");
        std::fs::write(&path, text).unwrap();
        assert_eq!(ClusterProfile::load(&path).unwrap().nodes.len(), 2);
    }
}

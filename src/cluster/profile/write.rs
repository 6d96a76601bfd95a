//! Writing a profile: `pipette-cluster/1` JSON in a stable, diff-friendly layout (fields in
//! schema order, one matrix row per line, small objects on one line), and serde's
//! `Serialize`, both from the file types' serde derive so the two always agree.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};

use super::types::ProfileFile;
use super::ClusterProfile;

impl ClusterProfile {
    /// The profile as `pipette-cluster/1` JSON: two-space indents, one matrix row per line,
    /// small objects on one line; ends with a newline. Reading it back gives an equal profile.
    pub fn to_json_pretty(&self) -> String {
        // The compact text has the fields in the types' order; serde_json's own `Value`
        // would sort them, so the layout works on a `Doc` that keeps the order.
        let compact = serde_json::to_string(self).unwrap_or_default();
        let mut out = String::new();
        if let Ok(doc) = serde_json::from_str::<Doc>(&compact) {
            doc.write_pretty(&mut out, 0, 0);
        }
        out.push('\n');
        out
    }
}

impl Serialize for ClusterProfile {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ProfileFile::from(self).serialize(serializer)
    }
}

/// Lines up to this many characters keep a small object or list on one line.
const LINE_WIDTH: usize = 160;

/// A JSON document that keeps its fields in the order they were written.
enum Doc {
    Null,
    Bool(bool),
    Int(u64),
    Neg(i64),
    Num(f64),
    Str(String),
    List(Vec<Doc>),
    Obj(Vec<(String, Doc)>),
}

impl Doc {
    fn is_container(&self) -> bool {
        matches!(self, Doc::List(_) | Doc::Obj(_))
    }

    fn has_containers(&self) -> bool {
        match self {
            Doc::List(items) => items.iter().any(Doc::is_container),
            Doc::Obj(fields) => fields.iter().any(|(_, v)| v.is_container()),
            _ => false,
        }
    }

    fn write_inline(&self, out: &mut String) {
        match self {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(&b.to_string()),
            Doc::Int(i) => out.push_str(&i.to_string()),
            Doc::Neg(i) => out.push_str(&i.to_string()),
            // serde_json writes the shortest text that reads back as the same f64.
            Doc::Num(x) => {
                out.push_str(&serde_json::to_string(x).unwrap_or_else(|_| "null".into()))
            }
            Doc::Str(s) => {
                out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()))
            }
            Doc::List(items) => {
                out.push('[');
                for (k, item) in items.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    item.write_inline(out);
                }
                out.push(']');
            }
            Doc::Obj(fields) => {
                out.push('{');
                for (k, (key, value)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    out.push('"');
                    out.push_str(key);
                    out.push_str("\": ");
                    value.write_inline(out);
                }
                out.push('}');
            }
        }
    }

    /// Containers of scalars (a matrix row, a provenance) always go on one line; other
    /// containers too when they fit in [`LINE_WIDTH`] from `column`; else one member a line.
    fn write_pretty(&self, out: &mut String, indent: usize, column: usize) {
        let mut inline = String::new();
        self.write_inline(&mut inline);
        if !self.has_containers() || column + inline.chars().count() <= LINE_WIDTH {
            out.push_str(&inline);
            return;
        }
        let pad = " ".repeat(indent + 2);
        match self {
            Doc::List(items) => {
                out.push_str("[\n");
                for (k, item) in items.iter().enumerate() {
                    out.push_str(&pad);
                    item.write_pretty(out, indent + 2, indent + 2);
                    out.push_str(if k + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&" ".repeat(indent));
                out.push(']');
            }
            Doc::Obj(fields) => {
                out.push_str("{\n");
                for (k, (key, value)) in fields.iter().enumerate() {
                    out.push_str(&pad);
                    out.push('"');
                    out.push_str(key);
                    out.push_str("\": ");
                    value.write_pretty(out, indent + 2, indent + 2 + key.chars().count() + 4);
                    out.push_str(if k + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&" ".repeat(indent));
                out.push('}');
            }
            _ => out.push_str(&inline),
        }
    }
}

impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> Visitor<'de> for Any {
            type Value = Doc;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Doc, E> {
                Ok(Doc::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Doc, E> {
                Ok(Doc::Bool(b))
            }
            fn visit_u64<E>(self, i: u64) -> Result<Doc, E> {
                Ok(Doc::Int(i))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Doc, E> {
                Ok(Doc::Neg(i))
            }
            fn visit_f64<E>(self, x: f64) -> Result<Doc, E> {
                Ok(Doc::Num(x))
            }
            fn visit_str<E>(self, s: &str) -> Result<Doc, E> {
                Ok(Doc::Str(s.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Doc::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry()? {
                    fields.push(field);
                }
                Ok(Doc::Obj(fields))
            }
        }
        deserializer.deserialize_any(Any)
    }
}

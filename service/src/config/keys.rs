//! The key table (`--list-keys`, the docs' configuration tables), generated from the
//! same defaults the loader starts from.
//!
//! Name and type come from the loader's schema (the serialized `Raw::default()`, or the
//! value given to [`super::Layers::with_schema`]), the default from the defaults (for a
//! key of an array's element, from the schema's element; a key the defaults leave out
//! is shown unset); range and meaning from one static [`KeyDoc`] table per section, in
//! the order shown. An element key is named `limits[].key`. [`uncovered`]
//! lists the differences between the two key sets, and each service has a unit test
//! asserting there are none: a key cannot be added without its documentation, and a
//! documented key cannot outlive its field.

use std::fmt::Write as _;

use toml::Value;

use super::{ConfigError, ConfigErrorKind, Layers, Range, any_element, leaves};

/// What the code cannot know about a key: its allowed values and its meaning.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    /// The key (dotted path for a nested key).
    pub name: &'static str,
    /// Allowed values: the bounds the validation checks, or words.
    pub range: Range,
    /// What it does.
    pub help: &'static str,
}

impl KeyDoc {
    /// A key's documentation.
    pub const fn new(name: &'static str, range: Range, help: &'static str) -> Self {
        Self { name, range, help }
    }
}

/// The documentation of `key` among `sections`; an element key (`limits[2].limit`) is
/// found as `limits[].limit`.
pub fn find<'a>(sections: &'a [Section], key: &str) -> Option<&'a KeyDoc> {
    let name = any_element(key, "[]");
    sections
        .iter()
        .flat_map(Section::docs)
        .find(|d| d.name == name)
}

/// The range documented for `key` among `sections` ([`Range::Any`] when none: a
/// range check of it then refuses, naming the key, which a unit test of every service
/// reaches by loading the defaults).
pub fn range(sections: &[Section], key: &str) -> Range {
    find(sections, key).map_or(Range::Any, |d| d.range)
}

/// [`range`] among the keys of one section.
pub fn range_of(keys: &'static [KeyDoc], key: &str) -> Range {
    range(&[Section::new("", keys)], key)
}

/// A loader's refusal (from [`Layers`]) as the operator has to fix it, for a binary whose
/// keys are `sections`: an unknown key points at `list_keys` (the command that lists the
/// keys), an integer serde refused (`-1`) is out of range, and every other refusal of a
/// key carries the key's range.
pub fn refusal(e: ConfigError, sections: &[Section], list_keys: &str) -> ConfigError {
    let allowed = range(sections, e.key()).to_string();
    match e.kind() {
        ConfigErrorKind::UnknownKey => e.with_hint(&format!(" (see `{list_keys}`)")),
        ConfigErrorKind::File => e,
        ConfigErrorKind::Invalid if e.message().contains("invalid value: integer") => {
            ConfigError::new(e.key(), ConfigErrorKind::OutOfRange, e.message())
                .with_origin(e.origin())
                .with_allowed(allowed)
        }
        _ => e.with_allowed(allowed),
    }
}

/// A group of keys shown as one table.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    /// A short name, used in the docs' markers (`<!-- keys:NAME -->`).
    pub name: &'static str,
    /// The keys, in the order shown.
    pub keys: &'static [KeyDoc],
    /// Keys a binary adds to a shared section (`[nats]` of the adapter), shown after
    /// [`Section::keys`] in the same table.
    pub extra: &'static [KeyDoc],
}

impl Section {
    /// A section of `keys`.
    pub const fn new(name: &'static str, keys: &'static [KeyDoc]) -> Self {
        Self {
            name,
            keys,
            extra: &[],
        }
    }

    /// A shared section's `keys` followed by a binary's own `extra` keys.
    pub const fn with_extra(
        name: &'static str,
        keys: &'static [KeyDoc],
        extra: &'static [KeyDoc],
    ) -> Self {
        Self { name, keys, extra }
    }

    /// Every key, in the order shown.
    pub fn docs(&self) -> impl Iterator<Item = &'static KeyDoc> {
        self.keys.iter().chain(self.extra)
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// The key.
    pub name: String,
    /// `integer`, `decimal`, `bool`, `string`, `array`, `table`.
    pub ty: &'static str,
    /// The default as TOML would write it; `None` for an empty string or array (unset).
    pub default: Option<String>,
    /// Allowed values.
    pub range: String,
    /// Meaning.
    pub help: &'static str,
}

/// The rows of `section`, with types and defaults taken from `layers`.
pub fn rows(layers: &Layers, section: &Section) -> Vec<KeyRow> {
    let schema = leaves(layers.schema());
    let defaults = leaves(layers.defaults());
    section
        .docs()
        .map(|doc| {
            let ty = schema.get(doc.name).copied();
            let default = match doc.name.contains("[]") {
                true => ty,
                false => defaults.get(doc.name).copied(),
            };
            KeyRow {
                name: doc.name.to_owned(),
                ty: ty.map_or("unknown", type_name),
                default: default.and_then(shown),
                range: doc.range.to_string(),
                help: doc.help,
            }
        })
        .collect()
}

/// Keys of the schema no section documents, and documented keys the schema does not
/// have (both empty when the docs are complete).
pub fn uncovered(layers: &Layers, sections: &[Section]) -> (Vec<String>, Vec<&'static str>) {
    let leaves = leaves(layers.schema());
    let documented: Vec<&str> = sections
        .iter()
        .flat_map(|s| s.docs().map(|k| k.name))
        .collect();
    let undocumented = leaves
        .keys()
        .filter(|k| !documented.contains(&k.as_str()))
        .cloned()
        .collect();
    let extra = documented
        .into_iter()
        .filter(|d| !leaves.contains_key(*d))
        .collect();
    (undocumented, extra)
}

/// Every key of `sections` with its type, default, range and meaning: aligned text for
/// `--list-keys`, or (`markdown`) the Markdown tables of a service's docs page, each
/// between its `<!-- keys:NAME -->` markers (see [`docs_section`]).
pub fn table(layers: &Layers, sections: &[Section], markdown: bool) -> String {
    let mut out = String::new();
    for section in sections {
        let rows = rows(layers, section);
        if markdown {
            out.push_str(&format!(
                "<!-- keys:{0} -->\n{1}<!-- /keys:{0} -->\n",
                section.name,
                self::markdown(&rows)
            ));
        } else {
            out.push_str(&text(&rows));
        }
    }
    out
}

/// The rows as aligned text lines (`--list-keys`).
pub fn text(rows: &[KeyRow]) -> String {
    let mut out = String::new();
    for r in rows {
        let default = r.default.as_deref().unwrap_or("(unset)");
        let _ = write!(
            out,
            "{:<30} {:<8} default {:<24} {}",
            r.name, r.ty, default, r.help
        );
        let _ = match r.range.as_str() {
            "" => writeln!(out),
            range => writeln!(out, "  ({range})"),
        };
    }
    out
}

/// The rows as a Markdown table (the docs' configuration tables).
pub fn markdown(rows: &[KeyRow]) -> String {
    let mut out =
        String::from("| key | type | default | range | meaning |\n|---|---|---|---|---|\n");
    for r in rows {
        let default = r
            .default
            .as_ref()
            .map_or("—".to_owned(), |d| format!("`{d}`"));
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            r.name,
            r.ty,
            default,
            cell(&r.range),
            cell(r.help)
        );
    }
    out
}

/// A table cell: `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Integer(_) => "integer",
        Value::Float(_) => "decimal",
        Value::Boolean(_) => "bool",
        Value::Datetime(_) => "datetime",
        Value::Array(_) => "array",
        Value::Table(_) => "table",
    }
}

/// The default as written in TOML, or `None` when it means "unset".
fn shown(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if s.is_empty() => None,
        Value::Array(a) if a.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The text between `<!-- keys:NAME -->` and `<!-- /keys:NAME -->` in `doc`, if both
/// markers are there (for the test that keeps a docs page equal to [`markdown`]).
pub fn docs_section<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<!-- keys:{name} -->\n");
    let close = format!("<!-- /keys:{name} -->");
    let start = doc.find(&open)? + open.len();
    let len = doc[start..].find(&close)?;
    Some(&doc[start..start + len])
}

/// The sections of `sections` whose table in `doc` (between its markers) is not the one
/// in `generated` (the `--markdown` output), markers missing included: what a docs test
/// asserts is empty.
pub fn stale_docs_sections(doc: &str, generated: &str, sections: &[Section]) -> Vec<&'static str> {
    sections
        .iter()
        .filter(|s| docs_section(doc, s.name) != docs_section(generated, s.name))
        .map(|s| s.name)
        .collect()
}

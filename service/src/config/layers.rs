//! The loader: layers merged into one TOML table, deserialized into a service's raw
//! serde struct (see the module above for the layers and invariants).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use toml::{Table, Value};

use super::{ConfigError, ConfigErrorKind, ConfigWarning, Origin};

/// Where a binary's configuration comes from, lowest precedence first
/// ([`Layers::load`]).
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// A TOML file.
    pub file: Option<PathBuf>,
    /// Environment variables (pass `std::env::vars()`); only those under the binary's
    /// prefix are read.
    pub env: Vec<(String, String)>,
    /// `key=value` overrides from the command line (dotted keys), applied last in order.
    pub overrides: Vec<(String, String)>,
}

/// The layers merged so far, with the origin of every value that is not a default.
#[derive(Debug, Clone)]
pub struct Layers {
    defaults: Table,
    schema: Table,
    merged: Table,
    origins: BTreeMap<String, Origin>,
    aliases: &'static [Alias],
    warnings: Vec<ConfigWarning>,
}

impl Layers {
    /// Starts from `defaults` (the raw struct's `Default`), serialized.
    ///
    /// # Panics
    /// Never for a raw struct of TOML-representable fields; a field TOML cannot hold
    /// (a `u64` above `i64::MAX`, an `Option` inside an array) is a programming error
    /// that every service's unit tests hit at once.
    pub fn new<T: Serialize>(defaults: &T) -> Self {
        let defaults = match Table::try_from(defaults) {
            Ok(t) => t,
            Err(e) => panic!("the configuration defaults do not serialize to TOML: {e}"),
        };
        Self::new_from(defaults)
    }

    /// Declares the keys the defaults do not show: `schema` is a value of the raw
    /// struct with every optional key set and one element in each array of tables
    /// (whose fields are the element defaults). It types text values, is searched for
    /// "did you mean" and is listed by [`keys`].
    ///
    /// # Panics
    /// As [`Layers::new`].
    pub fn with_schema<T: Serialize>(mut self, schema: &T) -> Self {
        self.schema = match Table::try_from(schema) {
            Ok(t) => t,
            Err(e) => panic!("the configuration schema does not serialize to TOML: {e}"),
        };
        self
    }

    /// The defaults as a table.
    pub fn defaults(&self) -> &Table {
        &self.defaults
    }

    /// The schema (see [`Layers::with_schema`]).
    pub fn schema(&self) -> &Table {
        &self.schema
    }

    /// Where the value of `key` (a dotted path) came from.
    pub fn origin(&self, key: &str) -> &Origin {
        self.origins.get(key).unwrap_or(&Origin::Default)
    }

    /// Merges a TOML file (nested tables merge key by key).
    pub fn file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let fail = |message: String| {
            ConfigError::new(path.display().to_string(), ConfigErrorKind::File, message)
                .with_origin(&Origin::File(path.to_owned()))
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let table: Table = text.parse().map_err(|e| fail(format!("not TOML: {e}")))?;
        self.table(&table, &Origin::File(path.to_owned()));
        Ok(())
    }

    /// Merges a parsed TOML table (a file's contents) key by key, each value with
    /// `origin`.
    pub fn table(&mut self, table: &Table, origin: &Origin) {
        let mut leaves = Vec::new();
        flatten("", table, &mut leaves);
        for (key, value) in leaves {
            // A renamed key is a value, never a section (`admin` → `admin.listen`, while
            // an empty `[admin]` stays the section).
            let key = match value {
                Value::Table(_) => key,
                _ => self.resolve(&key, origin),
            };
            // An empty `[section]` of a known section changes nothing (inserting it
            // would drop the section's defaults); an unknown one is still refused.
            let empty_known = value.as_table().is_some_and(Table::is_empty)
                && lookup(&self.merged, &key).is_some_and(Value::is_table);
            if !empty_known {
                self.insert(&key, value.clone(), origin.clone());
            }
        }
    }

    /// Merges `sources` in precedence order: the file, the variables under `env_prefix`
    /// (but `env_not_keys`, see [`Layers::env`]), then the command line's overrides. A
    /// refusal is the file's (unreadable, not TOML); the values are checked by
    /// [`Layers::build`].
    pub fn load(
        &mut self,
        sources: &ConfigSources,
        env_prefix: &str,
        env_not_keys: &[&str],
    ) -> Result<(), ConfigError> {
        if let Some(path) = &sources.file {
            self.file(path)?;
        }
        self.env(env_prefix, sources.env.iter().cloned(), env_not_keys);
        for (key, value) in &sources.overrides {
            self.set_text(key, value, Origin::CommandLine);
        }
        Ok(())
    }

    /// Merges the variables named `prefix` + key: `WEIR_LLM_NATS__URL` sets `nats.url`.
    /// `not_keys` are suffixes under the prefix that are something else (a flag's
    /// variable); every other variable under the prefix must be a key.
    pub fn env(
        &mut self,
        prefix: &str,
        vars: impl IntoIterator<Item = (String, String)>,
        not_keys: &[&str],
    ) {
        for (name, text) in vars {
            let Some(suffix) = name.strip_prefix(prefix) else {
                continue;
            };
            if not_keys.contains(&suffix) {
                continue;
            }
            let key = suffix.to_ascii_lowercase().replace("__", ".");
            self.set_text(&key, &text, Origin::Env(name.clone()));
        }
    }

    /// Merges one text value (`--set key=value`, a flag, a variable): it takes the type
    /// of the key's default (see the module invariants).
    pub fn set_text(&mut self, key: &str, text: &str, origin: Origin) {
        let key = self.resolve(key, &origin);
        let value = coerce(text, lookup(&self.schema, &first_element(&key)));
        self.insert(&key, value, origin);
    }

    fn insert(&mut self, key: &str, value: Value, origin: Origin) {
        let mut table = &mut self.merged;
        let mut parts = key.split('.').map(part).peekable();
        while let Some((name, index)) = parts.next() {
            let last = parts.peek().is_none();
            let slot = match (index, last) {
                (None, true) => {
                    table.insert(name.to_owned(), value);
                    break;
                }
                (None, false) => table
                    .entry(name.to_owned())
                    .or_insert_with(|| Value::Table(Table::new())),
                // `name[i]`: element `i` of an array of tables, created up to `i`.
                (Some(i), _) => {
                    let array = table
                        .entry(name.to_owned())
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if !array.is_array() {
                        *array = Value::Array(Vec::new());
                    }
                    let Value::Array(items) = array else { break };
                    if items.len() <= i {
                        items.resize(i + 1, Value::Table(Table::new()));
                    }
                    &mut items[i]
                }
            };
            if index.is_some() && last {
                *slot = value;
                break;
            }
            if !slot.is_table() {
                *slot = Value::Table(Table::new());
            }
            let Value::Table(next) = slot else { break };
            table = next;
        }
        self.origins.insert(key.to_owned(), origin);
    }

    /// Deserializes the merged table into the raw struct. A refusal names the key and
    /// the origin of its value, and for an unknown key the nearest known one.
    pub fn build<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        if let Some(e) = self
            .origins
            .iter()
            .find_map(|(key, origin)| self.unknown(key, origin))
        {
            return Err(e);
        }
        let whole = match Value::Table(self.merged.clone()).try_into::<T>() {
            Ok(raw) => return Ok(raw),
            Err(e) => e,
        };
        // Find the value serde refused: the first one that fails on top of the defaults
        // alone (the error path is rare; a few dozen small deserializations).
        for (key, origin) in &self.origins {
            let Some(value) = lookup(&self.merged, key) else {
                continue;
            };
            let mut probe = Self::new_from(self.defaults.clone());
            probe.schema.clone_from(&self.schema);
            probe.insert(key, value.clone(), origin.clone());
            if let Err(e) = Value::Table(probe.merged).try_into::<T>() {
                return Err(self.refusal(key, origin, e.message()));
            }
        }
        Err(ConfigError::new(
            "",
            ConfigErrorKind::Invalid,
            whole.message().trim(),
        ))
    }

    fn new_from(defaults: Table) -> Self {
        Self {
            merged: defaults.clone(),
            schema: defaults.clone(),
            defaults,
            origins: BTreeMap::new(),
            aliases: &[],
            warnings: Vec::new(),
        }
    }

    fn refusal(&self, key: &str, origin: &Origin, serde_message: &str) -> ConfigError {
        let serde_message = serde_message.trim();
        if serde_message.starts_with("unknown field") {
            // serde names the unknown field; the key is the path down to it (`[section]`
            // with `x = 1` in it is the unknown key `section`).
            let field = serde_message.split('`').nth(1);
            let parts: Vec<&str> = key.split('.').collect();
            let end = (parts.iter()).position(|p| Some(*p) == field);
            return self.unknown_key(
                parts[..end.map_or(parts.len(), |i| i + 1)].join("."),
                origin,
            );
        }
        let kind = match serde_message.starts_with("invalid type") {
            true => ConfigErrorKind::WrongType,
            false => ConfigErrorKind::Invalid,
        };
        ConfigError::new(key, kind, plain_types(serde_message)).with_origin(origin)
    }

    /// The first part of `key` the schema does not have, as a refusal: keys of a
    /// section deserialized without `deny_unknown_fields` (one that flattens a shared
    /// section) are refused here, before serde.
    fn unknown(&self, key: &str, origin: &Origin) -> Option<ConfigError> {
        let parts: Vec<&str> = key.split('.').collect();
        let missing = (1..=parts.len()).find(|&n| {
            let prefix = parts[..n].join(".");
            lookup(&self.schema, &first_element(&prefix)).is_none()
        })?;
        Some(self.unknown_key(parts[..missing].join("."), origin))
    }

    /// `key` is not a configuration key (with the nearest one that is, if any).
    fn unknown_key(&self, key: String, origin: &Origin) -> ConfigError {
        let hint = nearest(&self.schema, &key)
            .map(|k| format!("; did you mean `{k}`?"))
            .unwrap_or_default();
        let message = format!("not a configuration key{hint}");
        ConfigError::new(key, ConfigErrorKind::UnknownKey, message).with_origin(origin)
    }

    /// The renamed keys read under their old name (for one release): a value set by
    /// `old` sets `new`, with a [`ConfigWarning`] naming both.
    pub fn with_aliases(mut self, aliases: &'static [Alias]) -> Self {
        self.aliases = aliases;
        self
    }

    /// The warnings of the layers merged so far: each renamed key that was set under
    /// its old name.
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.warnings
    }

    /// `key`, or the new name of a renamed key (noting the warning).
    fn resolve(&mut self, key: &str, origin: &Origin) -> String {
        let Some(alias) = self.aliases.iter().find(|a| a.old == key) else {
            return key.to_owned();
        };
        self.warnings.push(ConfigWarning::new(
            [alias.old, alias.new],
            format!(
                "config key `{}` (from {origin}) is renamed `{}`; the old name is read for \
                 one more release",
                alias.old, alias.new
            ),
        ));
        alias.new.to_owned()
    }
}

/// A renamed key: `old` still loads, as `new`, with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    /// The name read for one more release.
    pub old: &'static str,
    /// The key it sets.
    pub new: &'static str,
}

impl Alias {
    /// `old` → `new`.
    pub const fn new(old: &'static str, new: &'static str) -> Self {
        Self { old, new }
    }
}

/// The text as the type of `default`.
fn coerce(text: &str, default: Option<&Value>) -> Value {
    let trimmed = text.trim();
    match default {
        Some(Value::String(_)) => Value::String(text.to_owned()),
        Some(Value::Boolean(_)) => match trimmed {
            "true" | "1" | "yes" => Value::Boolean(true),
            "false" | "0" | "no" => Value::Boolean(false),
            _ => Value::String(text.to_owned()),
        },
        // A number, an array, a table, a key without a default: a TOML value, or the
        // text as a string (a bare word like `gap` for an enum without a default).
        _ if trimmed.contains('\n') => Value::String(text.to_owned()),
        _ => trimmed
            .parse::<Value>()
            .unwrap_or_else(|_| Value::String(text.to_owned())),
    }
}

/// One part of a dotted path: `limits[1]` is `("limits", Some(1))`.
fn part(text: &str) -> (&str, Option<usize>) {
    match text.strip_suffix(']').and_then(|t| t.split_once('[')) {
        Some((name, index)) => match index.parse() {
            Ok(i) => (name, Some(i)),
            Err(_) => (text, None),
        },
        None => (text, None),
    }
}

/// `key` with every element index replaced by `replacement` (`limits[1].key` →
/// `limits[].key` with `"[]"`).
pub(crate) fn any_element(key: &str, replacement: &str) -> String {
    key.split('.')
        .map(|p| match part(p) {
            (name, Some(_)) => format!("{name}{replacement}"),
            (name, None) => name.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `key` addressing the schema's one element of each array (`limits[3].key` →
/// `limits[0].key`).
fn first_element(key: &str) -> String {
    any_element(key, "[0]")
}

/// The value at a dotted path (`limits[1].key` included).
fn lookup<'a>(table: &'a Table, key: &str) -> Option<&'a Value> {
    let mut value = None;
    for (name, index) in key.split('.').map(part) {
        let table = match value {
            None => table,
            Some(v) => Value::as_table(v)?,
        };
        let mut v = table.get(name)?;
        if let Some(i) = index {
            v = v.as_array()?.get(i)?;
        }
        value = Some(v);
    }
    value
}

/// Every leaf (a value that is neither a table nor an array of tables) with its dotted
/// path; the elements of an array of tables are `name[i]`.
fn flatten<'a>(prefix: &str, table: &'a Table, out: &mut Vec<(String, &'a Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(t) if !t.is_empty() => flatten(&key, t, out),
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_table) => {
                for (i, item) in items.iter().enumerate() {
                    let element = format!("{key}[{i}]");
                    match item {
                        Value::Table(t) if !t.is_empty() => flatten(&element, t, out),
                        _ => out.push((element, item)),
                    }
                }
            }
            _ => out.push((key, v)),
        }
    }
}

/// Every leaf of `table` by its key-table name (`limits[].key`).
pub(crate) fn leaves(table: &Table) -> BTreeMap<String, &Value> {
    let mut leaves = Vec::new();
    flatten("", table, &mut leaves);
    leaves
        .into_iter()
        .map(|(k, v)| (any_element(&k, "[]"), v))
        .collect()
}

/// The known key or section nearest to `key` (at most two edits away), for "did you
/// mean".
fn nearest(defaults: &Table, key: &str) -> Option<String> {
    let leaves: Vec<String> = leaves(defaults).into_keys().collect();
    // Sections are candidates too: `[natz]` is nearest to `nats`.
    let sections: Vec<String> = leaves
        .iter()
        .flat_map(|k| k.match_indices('.').map(|(i, _)| k[..i].to_owned()))
        .collect();
    let key = any_element(key, "[]");
    leaves
        .into_iter()
        .chain(sections)
        .map(|k| (edit_distance(&k, &key), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// serde's Rust type names in words: "expected u64" → "expected a non-negative integer".
fn plain_types(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, words) in [
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected i64", "expected an integer"),
        ("expected f64", "expected a number"),
    ] {
        out = out.replace(rust, words);
    }
    out
}

/// The command line's overrides, in order: the dedicated flags that were given
/// (`(key, value)`), then each `--set KEY=VALUE`; a `--set` without `=` is refused
/// naming it (key `--set`, kind [`ConfigErrorKind::Invalid`]).
pub fn cli_overrides(
    flags: &[(&str, &Option<String>)],
    sets: &[String],
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out: Vec<(String, String)> = flags
        .iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| ((*key).to_owned(), v.clone())))
        .collect();
    for kv in sets {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            ConfigError::new(
                "--set",
                ConfigErrorKind::Invalid,
                format!("{kv:?} is not KEY=VALUE"),
            )
        })?;
        out.push((k.trim().to_owned(), v.to_owned()));
    }
    Ok(out)
}

//! Configuration, written once for every service: the loader, the one error type, typed
//! ranges, and the sections every binary composes.
//!
//! - [`ConfigError`] (with [`ConfigErrorKind`]) is the only refusal of a configuration
//!   value, in every crate; [`ConfigWarning`] is the tier beside it (`check-config`).
//! - [`Range`] is a key's allowed values as data: the validation and the key table read
//!   the same bounds.
//! - [`Layers`] (feature `config`) merges the layers into one TOML table, then
//!   deserializes it into the service's raw serde struct (which the service validates
//!   into its settings types). [`keys`] prints the key table; [`section`] holds the
//!   sections both binaries compose (`[nats]`, `[admin]`, `[log]`);
//!   [`config_section!`](crate::config_section) declares a section's keys once (struct,
//!   defaults, key docs).
//!
//! Layers, lowest precedence first: the defaults (`Raw::default()` serialized, so each
//! default is written once, in `Default`), a TOML file, environment variables
//! (`PREFIX` + the key in upper case, a nested key's parts joined by `__`), then the
//! command line (`--set key=value`, a nested key's parts joined by `.`, and the
//! dedicated flags). [`keys`] prints the same defaults as `--list-keys` and the docs
//! table.
//!
//! Invariants:
//! - every value set by a layer keeps its [`Origin`], so a refusal names the key *and*
//!   where the value came from (the file, the variable, the command line);
//! - nothing is ignored silently: a key the schema does not have is refused whichever
//!   layer set it, an environment variable under the prefix included (unless the
//!   service lists it as not a key);
//! - a renamed key ([`Alias`]) still loads under its old name for one release, setting
//!   the new key, and leaves a [`ConfigWarning`] naming both;
//! - text values (environment, command line) take the type of the key's default: a
//!   string key keeps the text as is (`"0123"` stays a string), a boolean key takes
//!   `true`/`false` (and `1`/`0`, `yes`/`no`), any other key parses the text as a TOML
//!   value (`1_000`, `2.5`, `[1, 2]`), falling back to a string that deserialization
//!   then refuses with the expected type.
//! - an array of tables (`[[limits]]`) is addressed per element: `limits[1].key` is a
//!   key like any other (origin, refusal, `--set`); the raw struct's element type must
//!   have a default for every field, so that one element's value can be tried alone.
//!
//! Keys the defaults do not show (an `Option` that is unset by default, the fields of
//! an array's elements) are known from the *schema*: a value of the raw struct with
//! every key present, given by [`Layers::with_schema`] (by default the defaults). Its
//! element keys are named `limits[].key` in the key table.
//!
//! Why not figment or config-rs: neither is in the dependency tree, and what weir needs
//! (origins, refusal of unknown variables, a key table from the defaults) is this
//! module over the `toml` crate every service already uses.

mod error;
mod range;

use std::fmt;
use std::path::PathBuf;

pub use error::{ConfigError, ConfigErrorKind, ConfigWarning};
pub use range::{Range, Unit, whole_ms};

#[cfg(feature = "config")]
mod declare;
#[cfg(feature = "config")]
pub mod keys;
#[cfg(feature = "config")]
mod layers;
#[cfg(feature = "config")]
pub mod section;
#[cfg(all(test, feature = "config"))]
use layers::edit_distance;
#[cfg(feature = "config")]
pub use layers::{Alias, ConfigSources, Layers, cli_overrides};
#[cfg(feature = "config")]
pub(crate) use layers::{any_element, leaves};

/// `Some(text)` unless empty: an empty string is "unset" for the optional text keys.
pub fn set(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// A TOML file.
    File(PathBuf),
    /// An environment variable (its name).
    Env(String),
    /// The command line (`--set` or a dedicated flag).
    CommandLine,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("the default"),
            Self::File(p) => write!(f, "file {}", p.display()),
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::CommandLine => f.write_str("the command line"),
        }
    }
}

#[cfg(all(test, feature = "config"))]
mod tests;

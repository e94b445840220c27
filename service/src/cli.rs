//! The configuration flags of both services' `serve` (feature `cli`): `--set KEY=VALUE`
//! (any key, repeatable, applied last), `--list-keys` and `--markdown`. A binary
//! flattens [`ConfigFlags`] into its arguments (`#[command(flatten)]`) and gives `--set`
//! and `--markdown` its own example and documentation page (`mut_arg`).

use std::io::Write;

/// `--set`, `--list-keys` and `--markdown`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigFlags {
    /// Any configuration key (repeatable; applied last, in order).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print every configuration key with its type, default and range, then exit.
    #[arg(long)]
    pub list_keys: bool,
    /// With --list-keys: print the Markdown tables of the service's documentation.
    #[arg(long, requires = "list_keys")]
    pub markdown: bool,
}

impl ConfigFlags {
    /// With `--list-keys`, writes `key_table(markdown)` to stdout and returns true (the
    /// binary then exits). A closed pipe (`| head`) ends the listing; it is not an error.
    pub fn print_key_table(&self, key_table: impl FnOnce(bool) -> String) -> bool {
        if self.list_keys {
            let table = key_table(self.markdown);
            let _ = std::io::stdout().lock().write_all(table.as_bytes());
        }
        self.list_keys
    }
}

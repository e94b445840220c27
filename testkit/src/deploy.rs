//! The deploy kit's metric references (`deploy/prometheus/weir-rules.yml`,
//! `deploy/grafana/weir-dashboard.json`) and a `/metrics` scrape, compared by name.
//!
//! Each service's test scrapes its real binary and checks the names with its prefixes:
//! an alert or a panel that names a metric the binary does not export would be silently
//! empty in production.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The deploy files whose metric names are checked.
pub const FILES: &[&str] = &["prometheus/weir-rules.yml", "grafana/weir-dashboard.json"];

/// Prefixes of the metric names weir's binaries and consumer core export.
pub const PREFIXES: &[&str] = &[
    "weir_ingress_",
    "weir_consumer_",
    "weir_llm_",
    "weir_build_",
    "process_",
];

/// The repository's `deploy/` directory (from a crate directory of this workspace).
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every metric name with one of [`PREFIXES`] that the deploy files mention, with the
/// file that mentions it. Histogram series (`_bucket`, `_sum`, `_count`) are named as
/// the scrape names them.
pub fn referenced() -> std::io::Result<BTreeSet<(String, &'static str)>> {
    let mut out = BTreeSet::new();
    for file in FILES {
        let text = std::fs::read_to_string(deploy_dir().join(file))?;
        for name in metric_tokens(&text) {
            out.insert((name, *file));
        }
    }
    Ok(out)
}

/// The tokens of `text` that look like metric names and start with one of
/// [`PREFIXES`].
pub fn metric_tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        // A bare prefix (prose such as "the weir_consumer_* metrics") is not a name.
        .filter(|t| {
            PREFIXES
                .iter()
                .any(|p| t.starts_with(p) && t.len() > p.len())
        })
        .filter(|t| !t.ends_with('_'))
        .map(str::to_owned)
        .collect()
}

/// The metric names of a Prometheus text exposition (`/metrics`), as series names
/// (`x_bucket`, `x_sum`, `x_count` for a histogram `x`).
pub fn scraped(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// The arguments (after the binary) of the `directive` line (`ExecStart`,
/// `ExecStartPre`) of the systemd unit `deploy/systemd/<unit>`, with the installed
/// configuration path `/etc/weir/<file>` replaced by this repository's
/// `deploy/<file>`: a test runs the binary exactly as the unit would.
pub fn unit_exec_args(unit: &str, directive: &str) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(deploy_dir().join("systemd").join(unit))?;
    let prefix = format!("{directive}=");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .ok_or_else(|| std::io::Error::other(format!("{unit} has no {directive}= line")))?;
    Ok(line
        .split_whitespace()
        .skip(1)
        .map(|a| match a.strip_prefix("/etc/weir/") {
            Some(file) => deploy_dir().join(file).to_string_lossy().into_owned(),
            None => a.to_owned(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_scrapes_are_compared_by_series_name() {
        let rule = r#"expr: sum(rate(weir_ingress_gaps_total[5m])) > 0.8 * on (instance) weir_llm_x_bytes
  summary: "{{ $labels.instance }}" histogram_quantile(0.95, rate(weir_llm_q_seconds_bucket[1m]))"#;
        let t = metric_tokens(rule);
        assert!(t.contains("weir_ingress_gaps_total") && t.contains("weir_llm_x_bytes"));
        assert!(t.contains("weir_llm_q_seconds_bucket") && !t.contains("instance"));
        let scrape = "# TYPE a counter\nweir_ingress_gaps_total 0\nweir_llm_q_seconds_bucket{le=\"0.1\"} 2\n\n";
        let s = scraped(scrape);
        assert!(s.contains("weir_ingress_gaps_total") && s.contains("weir_llm_q_seconds_bucket"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn the_deploy_files_reference_weir_metrics() {
        let refs = referenced().expect("deploy files");
        for file in FILES {
            assert!(
                refs.iter().filter(|(_, f)| f == file).count() > 10,
                "{file}"
            );
        }
    }

    #[test]
    fn unit_lines_become_arguments_with_the_repository_config() {
        let args = unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
        assert_eq!(args[0], "serve");
        let config = deploy_dir().join("audio-ingress.toml");
        assert!(
            args.iter().any(|a| *a == config.to_string_lossy()),
            "{args:?}"
        );
        assert!(unit_exec_args("audio-ingress.service", "ExecStop").is_err());
    }
}

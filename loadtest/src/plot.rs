//! Hand-written SVG line charts: a grid of panels, one row per metric, one column per
//! design, with a shared y scale along each row so that "bounded beside naive" compares
//! heights directly. A shaded band marks the fault window.
//!
//! Invariants: the output is a self-contained SVG 1.1 document; every text is
//! XML-escaped; non-finite points are skipped; an empty or flat series still yields a
//! valid axis (the range is widened), never a division by zero.

use std::fmt::Write as _;

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Title above the chart.
    pub title: String,
    /// Lines.
    pub series: Vec<Series>,
    /// A shaded x range (the fault).
    pub shade: Option<(f64, f64)>,
    /// A horizontal reference line (e.g. the configured limit) and its label.
    pub reference: Option<(f64, String)>,
}

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 210.0;
const MARGIN_L: f64 = 70.0;
const MARGIN_R: f64 = 20.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 40.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// XML-escapes text.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// At most about `n` round tick values covering `lo..=hi` (steps of 1, 2, 2.5 or
/// 5 × 10^k: the smallest such step that gives no more than `n` intervals).
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    let raw = (hi - lo) / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    let mut ticks = Vec::new();
    let mut t = first;
    // Bounded: at most n + 2 ticks by construction of `step`; the cap guards rounding.
    while t <= hi + step * 1e-9 && ticks.len() < n + 3 {
        ticks.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    ticks
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Every point of every series of `panels`.
fn points<'a>(panels: &'a [&Panel]) -> impl Iterator<Item = (f64, f64)> + 'a {
    panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().copied())
}

/// The y range of a set of panels (from 0, widened when flat).
fn y_range(panels: &[&Panel]) -> (f64, f64) {
    let references = panels
        .iter()
        .filter_map(|p| p.reference.as_ref().map(|r| r.0));
    let hi = points(panels)
        .map(|(_, y)| y)
        .chain(references)
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    (0.0, if hi <= 0.0 { 1.0 } else { hi } * 1.08)
}

fn x_range(panels: &[&Panel]) -> (f64, f64) {
    let xs = points(panels).map(|(x, _)| x).filter(|x| x.is_finite());
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if lo >= hi {
        (0.0, 1.0)
    } else {
        (lo.min(0.0), hi)
    }
}

fn panel(
    out: &mut String,
    p: &Panel,
    ox: f64,
    oy: f64,
    (x0, x1): (f64, f64),
    (y0, y1): (f64, f64),
) {
    let w = PANEL_W - MARGIN_L - MARGIN_R;
    let h = PANEL_H - MARGIN_T - MARGIN_B;
    let px = |x: f64| ox + MARGIN_L + (x - x0) / (x1 - x0) * w;
    let py = |y: f64| oy + MARGIN_T + h - (y - y0) / (y1 - y0) * h;
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"##,
        ox + MARGIN_L,
        oy + 18.0,
        escape(&p.title)
    );
    if let Some((a, b)) = p.shade {
        let (a, b) = (a.max(x0), b.min(x1));
        if b > a {
            let _ = writeln!(
                out,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#f4c7c3" opacity="0.6"/>"##,
                px(a),
                oy + MARGIN_T,
                px(b) - px(a),
                h
            );
        }
    }
    for t in nice_ticks(y0, y1, 4) {
        let y = py(t);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            ox + MARGIN_L,
            ox + MARGIN_L + w,
            ox + MARGIN_L - 4.0,
            y + 3.0,
            fmt_tick(t)
        );
    }
    for t in nice_ticks(x0, x1, 6) {
        let x = px(t);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#999"/><text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
            oy + MARGIN_T + h,
            oy + MARGIN_T + h + 4.0,
            oy + MARGIN_T + h + 15.0,
            fmt_tick(t)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">seconds</text>"##,
        ox + MARGIN_L + w / 2.0,
        oy + PANEL_H - 8.0
    );
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#333"/>"##,
        ox + MARGIN_L,
        oy + MARGIN_T
    );
    if let Some((r, label)) = &p.reference
        && r.is_finite()
        && *r <= y1
    {
        let y = py(*r);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#555" stroke-dasharray="5,3"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end" fill="#555">{}</text>"##,
            ox + MARGIN_L,
            ox + MARGIN_L + w,
            ox + MARGIN_L + w - 2.0,
            y - 3.0,
            escape(label)
        );
    }
    let legend = p.series.len() > 1;
    for (i, s) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut d = String::new();
        for (x, y) in s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
        {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if d.is_empty() { "M" } else { " L" },
                px(*x),
                py(*y)
            );
        }
        if !d.is_empty() {
            let _ = writeln!(
                out,
                r##"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.6"/>"##
            );
        }
        if legend {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="{color}" text-anchor="end">{}</text>"##,
                ox + PANEL_W - MARGIN_R,
                oy + 18.0 + 12.0 * i as f64,
                escape(&s.label)
            );
        }
    }
}

/// Renders a grid of panels (rows × columns) with one title; each row shares its y
/// scale, the whole grid shares its x scale.
pub fn grid_svg(title: &str, rows: &[Vec<Panel>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let width = PANEL_W * cols as f64;
    let height = 36.0 + PANEL_H * rows.len() as f64;
    let all: Vec<&Panel> = rows.iter().flatten().collect();
    let xr = x_range(&all);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"##,
        escape(title)
    );
    for (r, row) in rows.iter().enumerate() {
        let refs: Vec<&Panel> = row.iter().collect();
        let yr = y_range(&refs);
        for (c, p) in row.iter().enumerate() {
            panel(
                &mut out,
                p,
                PANEL_W * c as f64,
                36.0 + PANEL_H * r as f64,
                xr,
                yr,
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        let t = nice_ticks(0.0, 873.0, 4);
        assert_eq!(t[0], 0.0);
        assert!(
            t.windows(2).all(|w| (w[1] - w[0] - 250.0).abs() < 1e-9),
            "{t:?}"
        );
        assert_eq!(
            nice_ticks(5.0, 5.0, 4),
            nice_ticks(0.0, 1.0, 4),
            "flat range widened"
        );
        assert!(nice_ticks(f64::NAN, 1.0, 4).len() >= 2);
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(10.0), "10");
        assert_eq!(fmt_tick(25_000.0), "25k");
        assert_eq!(fmt_tick(2_500_000.0), "2.5M");
    }

    #[test]
    fn escapes_xml() {
        assert_eq!(escape("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
    }

    #[test]
    fn grid_is_a_valid_looking_svg() {
        let p = |label: &str, k: f64| Panel {
            title: format!("pending <{label}>"),
            series: vec![Series {
                label: label.into(),
                points: (0..50)
                    .map(|i| (i as f64 * 0.1, k * i as f64))
                    .chain([(5.0, f64::NAN)])
                    .collect(),
            }],
            shade: Some((1.0, 2.0)),
            reference: Some((30.0, "limit".into())),
        };
        let svg = grid_svg("t & t", &[vec![p("bounded", 1.0), p("naive", 10.0)]]);
        assert!(svg.starts_with("<?xml"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("pending &lt;naive&gt;"));
        assert!(svg.contains("t &amp; t"));
        assert!(!svg.contains("NaN"));
        // Both panels use the row's shared scale: the naive line reaches the top.
        assert!(!svg.contains("inf"));
    }

    #[test]
    fn empty_panels_still_render() {
        let svg = grid_svg(
            "empty",
            &[vec![Panel {
                title: "x".into(),
                series: vec![],
                shade: None,
                reference: None,
            }]],
        );
        assert!(svg.contains("</svg>"));
        assert!(!svg.contains("NaN"));
    }
}

//! A hand-written SVG latency-by-percentile plot (HdrHistogram style: the x axis stretches the
//! tail, 0% … 99.999%).

use std::fmt::Write as _;

use hdrhistogram::Histogram;

const W: f64 = 800.0;
const H: f64 = 450.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// The x axis spans log10(1 / (1 - q)) from 0 (q = 0) to this (q = 99.999%).
const X_DECADES: f64 = 5.0;

/// Renders one SVG with a line per named histogram (microsecond values), latency in ms.
pub fn percentile_plot(title: &str, series: &[(&str, &Histogram<u64>)]) -> String {
    const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let steps = 250;
    let curves: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(name, h)| {
            let points = (0..=steps)
                .map(|i| {
                    let x = X_DECADES * i as f64 / steps as f64;
                    let q = 1.0 - 10f64.powf(-x);
                    (x, h.value_at_quantile(q) as f64 / 1000.0)
                })
                .collect();
            (*name, points)
        })
        .collect();
    let y_max = curves
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(0.0f64, f64::max);
    let y_top = nice_ceiling(y_max.max(0.001));
    let px = |x: f64| LEFT + (W - LEFT - RIGHT) * x / X_DECADES;
    let py = |y: f64| H - BOTTOM - (H - TOP - BOTTOM) * y / y_top;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    // Grid and axis labels.
    for (i, label) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
        .iter()
        .enumerate()
    {
        let x = px(i as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 18.0
        );
    }
    for i in 0..=5 {
        let v = y_top * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            format_ms(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">latency (ms)</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0
    );
    for (index, (name, points)) in curves.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let mut path = String::new();
        for (x, y) in points {
            let _ = write!(path, "{:.1},{:.1} ", px(*x), py(*y));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.trim_end()
        );
        let ly = TOP + 16.0 + 18.0 * index as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 12.0,
            LEFT + 40.0,
            LEFT + 46.0,
            ly + 4.0,
            escape(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// 1, 2 or 5 times a power of ten, at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn format_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{new_histogram, record};

    #[test]
    fn test_svg_plot_is_well_formed() {
        let mut a = new_histogram();
        let mut b = new_histogram();
        for i in 1..10_000u64 {
            record(&mut a, i);
            record(&mut b, i * 3);
        }
        let svg = percentile_plot("run <1>", &[("publish", &a), ("end-to-end", &b)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("run &lt;1&gt;"));
        assert!(!svg.contains("NaN"));
        // Empty histograms draw no line but still a valid document.
        let empty = percentile_plot("none", &[("publish", &new_histogram())]);
        assert_eq!(empty.matches("<polyline").count(), 0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }
}

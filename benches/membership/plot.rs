//! The SVG line plots written next to the report (`bench-results/*.svg`).

use std::fmt::Write as _;

/// A plot of read_all p50 latency.
pub(crate) fn svg(
    title: &str,
    xlabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    svg_y(
        title,
        xlabel,
        "read_all p50 (ms)",
        "read fails",
        series,
        log_x,
    )
}

/// A plot of any quantity: `ylabel` names it, `failed` labels a failed measurement (a NaN point).
pub(crate) fn svg_y(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    failed: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> String {
    let (w, h, m) = (640.0, 360.0, 60.0);
    // NaN marks a failed measurement: drawn as a cross at the top of the plot.
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .filter(|p| p.1.is_finite())
        .collect();
    let ticks: std::collections::BTreeSet<u64> = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0 as u64))
        .collect();
    let fx = |x: f64| if log_x { (x.max(1.0)).log10() } else { x };
    let (x0, x1) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(fx(p.0)), b.max(fx(p.0)))
    });
    let y1 = all.iter().fold(0.0f64, |a, p| a.max(p.1)) * 1.15 + 0.01;
    let px = |x: f64| m + (fx(x) - x0) / (x1 - x0).max(1e-9) * (w - 2.0 * m);
    let py = |y: f64| h - m - y / y1 * (h - 2.0 * m);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{title}</text>\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{xlabel}</text><text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">{ylabel}</text>",
        w / 2.0,
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0,
        h - 16.0,
        h / 2.0,
        h / 2.0
    );
    for k in 0..=4 {
        let y = y1 * f64::from(k) / 4.0;
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1}</text>",
            m - 6.0,
            py(y) + 4.0,
            y
        );
    }
    for t in ticks {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{t}</text>",
            px(t as f64),
            h - m + 16.0
        );
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for p in pts {
            if p.1.is_finite() {
                let _ = write!(
                    out,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{c}\"/>",
                    px(p.0),
                    py(p.1)
                );
            } else {
                // A failed measurement: a cross at the top, with the series' colour.
                let y = m + 14.0 + 16.0 * i as f64;
                let _ = write!(
                    out,
                    "<text x=\"{:.1}\" y=\"{y:.1}\" fill=\"{c}\" text-anchor=\"end\">{failed} ✕</text>",
                    px(p.0) - 4.0
                );
            }
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{name}</text>",
            m + 10.0,
            m + 14.0 + 16.0 * i as f64
        );
    }
    out.push_str("</svg>\n");
    out
}

//! Two small SVG charts written by hand (no plotting dependency): grouped bars
//! (one group per figure, one bar per program) and lines over runs. Values
//! carry their spread as a whisker from min to max.

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// One plotted value with its extremes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// One program's values, one per category (bars) or per run (lines); `None`: not measured.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub values: Vec<Option<Point>>,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn header(title: &str, y_label: &str) -> String {
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>",
        W / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        "<text transform=\"translate(15,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        TOP + (H - TOP - BOTTOM) / 2.0,
        escape(y_label)
    );
    s
}

/// The y scale's top: the largest max, rounded up to 1, 2 or 5 times a power of ten.
fn y_top(series: &[Series]) -> f64 {
    let m = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .map(|p| p.max.max(p.median))
        .fold(0.0, f64::max);
    if m <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(m.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|k| k * mag)
        .find(|v| *v >= m)
        .unwrap_or(10.0 * mag)
}

fn y_axis(s: &mut String, top: f64) -> impl Fn(f64) -> f64 {
    let plot_h = H - TOP - BOTTOM;
    let y = move |v: f64| TOP + plot_h * (1.0 - v / top);
    for i in 0..=4 {
        let v = top * i as f64 / 4.0;
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{py:.1}\" y2=\"{py:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - RIGHT,
            LEFT - 5.0,
            y(v) + 4.0,
            format_value(v),
            py = y(v)
        );
    }
    y
}

fn legend(s: &mut String, series: &[Series]) {
    for (i, ser) in series.iter().enumerate() {
        let x = LEFT + 10.0 + 160.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            H - 18.0,
            COLOURS[i % COLOURS.len()],
            x + 16.0,
            H - 8.0,
            escape(&ser.name)
        );
    }
}

/// A short label for an axis value.
pub fn format_value(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn whisker(s: &mut String, x: f64, p: &Point, y: &impl Fn(f64) -> f64) {
    let _ = writeln!(
        s,
        "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/>",
        y(p.min),
        y(p.max)
    );
}

/// Grouped bars: one group per category, one bar per series, whiskers min–max.
pub fn bar_chart(title: &str, y_label: &str, categories: &[String], series: &[Series]) -> String {
    let mut s = header(title, y_label);
    let y = y_axis(&mut s, y_top(series));
    let group_w = (W - LEFT - RIGHT) / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        let gx = LEFT + group_w * c as f64;
        for (i, ser) in series.iter().enumerate() {
            let Some(p) = ser.values.get(c).copied().flatten() else {
                continue;
            };
            let x = gx + group_w * 0.1 + bar_w * i as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar_w:.1}\" height=\"{:.1}\" fill=\"{}\">\
                 <title>{}: {}</title></rect>",
                y(p.median),
                y(0.0) - y(p.median),
                COLOURS[i % COLOURS.len()],
                escape(&ser.name),
                p.median
            );
            whisker(&mut s, x + bar_w / 2.0, &p, &y);
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            gx + group_w / 2.0,
            H - BOTTOM + 16.0,
            escape(cat)
        );
    }
    legend(&mut s, series);
    s.push_str("</svg>\n");
    s
}

/// Lines over runs (x: run index, labelled with `runs`), whiskers min–max.
pub fn line_chart(title: &str, y_label: &str, runs: &[String], series: &[Series]) -> String {
    let mut s = header(title, y_label);
    let y = y_axis(&mut s, y_top(series));
    let step = (W - LEFT - RIGHT) / runs.len().max(1) as f64;
    let x = |i: usize| LEFT + step * (i as f64 + 0.5);
    for (i, ser) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = ser
            .values
            .iter()
            .enumerate()
            .filter_map(|(r, p)| p.map(|p| format!("{:.1},{:.1}", x(r), y(p.median))))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            pts.join(" ")
        );
        for (r, p) in ser.values.iter().enumerate() {
            if let Some(p) = p {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                    x(r),
                    y(p.median)
                );
                whisker(&mut s, x(r), p, &y);
            }
        }
    }
    // At most ten run labels, so they stay readable.
    let every = runs.len().div_ceil(10).max(1);
    for (r, run) in runs.iter().enumerate().filter(|(r, _)| r % every == 0) {
        let label: String = run.chars().take(16).collect();
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            x(r),
            H - BOTTOM + 16.0,
            escape(&label)
        );
    }
    legend(&mut s, series);
    s.push_str("</svg>\n");
    s
}

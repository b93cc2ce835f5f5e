//! Plots as hand-written SVG: axes with round-numbered ticks, axis labels,
//! a title and a legend, lines or grouped bars.
//!
//! Why by hand: a plot of a few series needs a hundred lines of SVG, and
//! writing them directly keeps the output byte-for-byte stable for a seed
//! (no plotting library's version in the way). Private to the crate: the
//! scenarios' `svg` functions are what the command line draws.

use std::fmt::Write;

/// Width of the plotting area.
const PLOT_W: f64 = 720.0;
const H: f64 = 500.0;
const LEFT: f64 = 84.0;
/// The legend sits right of the plot, this far from it.
const GAP: f64 = 20.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 64.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// How a chart draws its series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Lines,
    Bars,
}

/// One named series of `(x, y)` points.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
    markers: bool,
    step: bool,
    color: Option<usize>,
}

impl Series {
    /// A solid line through `points` (in x order).
    pub(crate) fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            dashed: false,
            markers: false,
            step: false,
            color: None,
        }
    }
    /// Draws the line dashed.
    pub(crate) fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }
    /// Marks each point with a dot.
    pub(crate) fn markers(mut self) -> Self {
        self.markers = true;
        self
    }
    /// Draws a step: each point's value holds until the next x.
    pub(crate) fn step(mut self) -> Self {
        self.step = true;
        self
    }
    /// Uses palette colour `i` (to pair series of one subject).
    pub(crate) fn color(mut self, i: usize) -> Self {
        self.color = Some(i);
        self
    }
}

/// A chart: title, axis labels and series.
#[derive(Clone, Debug)]
pub(crate) struct Chart {
    kind: Kind,
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    bar_width: f64,
    bands: Vec<(f64, f64, String)>,
}

impl Chart {
    /// A line chart.
    pub(crate) fn lines(title: &str, x_label: &str, y_label: &str) -> Self {
        Chart::new(Kind::Lines, title, x_label, y_label)
    }

    /// A bar chart: each x is a bucket `bar_width` wide starting at x, the
    /// series side by side within it.
    pub(crate) fn bars(title: &str, x_label: &str, y_label: &str, bar_width: f64) -> Self {
        let mut c = Chart::new(Kind::Bars, title, x_label, y_label);
        c.bar_width = bar_width;
        c
    }

    fn new(kind: Kind, title: &str, x_label: &str, y_label: &str) -> Self {
        Chart {
            kind,
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            bar_width: 1.0,
            bands: Vec::new(),
        }
    }

    /// Shades the stretch of x from `from` to `to`, labelled at its top.
    pub(crate) fn band(mut self, from: f64, to: f64, label: &str) -> Self {
        self.bands.push((from, to, label.into()));
        self
    }

    /// Adds a series.
    pub(crate) fn series(mut self, s: Series) -> Self {
        self.series.push(s);
        self
    }

    /// The SVG document.
    pub(crate) fn render(&self) -> String {
        let (x0, x1, y1) = self.extent();
        let xt = ticks(x0, x1);
        let yt = ticks(0.0, y1);
        let sx = Scale::new(xt.first, xt.last, LEFT, LEFT + PLOT_W);
        let sy = Scale::new(0.0, yt.last, H - BOTTOM, TOP);
        let w = LEFT + PLOT_W + GAP + self.legend_width() + 16.0;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{H}" viewBox="0 0 {w:.0} {H}" font-family="Helvetica, Arial, sans-serif" font-size="13">"#
        );
        s.push_str(r#"<rect width="100%" height="100%" fill="white"/>"#);
        for (from, to, label) in &self.bands {
            let (x0, x1) = (sx.at(*from), sx.at(*to));
            let _ = write!(
                s,
                r##"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{:.1}" fill="#f4d6d6"/><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#a33">{}</text>"##,
                (x1 - x0).max(0.0),
                H - BOTTOM - TOP,
                (x0 + x1) / 2.0,
                TOP + 16.0,
                esc(label)
            );
        }
        self.axes(&mut s, &xt, &yt, &sx, &sy);
        for (i, ser) in self.series.iter().enumerate() {
            match self.kind {
                Kind::Lines => line(&mut s, ser, color(ser, i), &sx, &sy),
                Kind::Bars => self.bars_of(&mut s, ser, i, &sx, &sy),
            }
        }
        self.legend(&mut s);
        s.push_str("</svg>\n");
        s
    }

    fn extent(&self) -> (f64, f64, f64) {
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if self.kind == Kind::Bars {
            x1 += self.bar_width;
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= 0.0 {
            y1 = 1.0;
        }
        (x0, x1, y1 * 1.05)
    }

    fn axes(&self, s: &mut String, xt: &Ticks, yt: &Ticks, sx: &Scale, sy: &Scale) {
        let (l, r, t, b) = (LEFT, LEFT + PLOT_W, TOP, H - BOTTOM);
        for v in yt.values() {
            let y = sy.at(v);
            let _ = write!(
                s,
                r##"<line x1="{l}" y1="{y:.1}" x2="{r}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                l - 8.0,
                y + 4.0,
                label(v, yt.step)
            );
        }
        for v in xt.values() {
            let x = sx.at(v);
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{b}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                b + 5.0,
                b + 21.0,
                label(v, xt.step)
            );
        }
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="#333"/><line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#333"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="30" text-anchor="middle" font-size="18" font-weight="bold">{}</text>"#,
            (l + r) / 2.0,
            esc(&self.title)
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14">{}</text>"#,
            (l + r) / 2.0,
            H - 18.0,
            esc(&self.x_label)
        );
        let _ = write!(
            s,
            r#"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle" font-size="14">{}</text>"#,
            (t + b) / 2.0,
            esc(&self.y_label)
        );
    }

    fn bars_of(&self, s: &mut String, ser: &Series, i: usize, sx: &Scale, sy: &Scale) {
        let n = self.series.len().max(1) as f64;
        let slot = self.bar_width * 0.8 / n;
        for &(x, y) in &ser.points {
            let bx = x + self.bar_width * 0.1 + slot * i as f64;
            let (px0, px1) = (sx.at(bx), sx.at(bx + slot));
            let (py0, py1) = (sy.at(y), sy.at(0.0));
            let _ = write!(
                s,
                r#"<rect x="{px0:.1}" y="{py0:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                (px1 - px0).max(0.5),
                (py1 - py0).max(0.0),
                color(ser, i)
            );
        }
    }

    fn legend_width(&self) -> f64 {
        let longest = self
            .series
            .iter()
            .map(|x| x.name.chars().count())
            .max()
            .unwrap_or(0) as f64;
        48.0 + longest * 7.2
    }

    fn legend(&self, s: &mut String) {
        let w = self.legend_width();
        let h = 10.0 + 20.0 * self.series.len() as f64;
        let x = LEFT + PLOT_W + GAP;
        let y = TOP;
        let _ = write!(
            s,
            r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="white" fill-opacity="0.9" stroke="#999"/>"##
        );
        for (i, ser) in self.series.iter().enumerate() {
            let ly = y + 18.0 + 20.0 * i as f64;
            let c = color(ser, i);
            if self.kind == Kind::Bars {
                let _ = write!(
                    s,
                    r#"<rect x="{:.1}" y="{:.1}" width="22" height="10" fill="{c}"/>"#,
                    x + 8.0,
                    ly - 9.0
                );
            } else {
                let dash = if ser.dashed {
                    r#" stroke-dasharray="6 4""#
                } else {
                    ""
                };
                let _ = write!(
                    s,
                    r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{c}" stroke-width="2.5"{dash}/>"#,
                    x + 8.0,
                    ly - 4.0,
                    x + 32.0,
                    ly - 4.0
                );
            }
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
                x + 40.0,
                esc(&ser.name)
            );
        }
    }
}

fn color(ser: &Series, i: usize) -> &'static str {
    COLORS[ser.color.unwrap_or(i) % COLORS.len()]
}

fn line(s: &mut String, ser: &Series, c: &str, sx: &Scale, sy: &Scale) {
    if ser.points.is_empty() {
        return;
    }
    let mut d = String::new();
    let mut prev_y: Option<f64> = None;
    for &(x, y) in &ser.points {
        let (px, py) = (sx.at(x), sy.at(y));
        match prev_y {
            None => {
                let _ = write!(d, "M{px:.1},{py:.1}");
            }
            Some(ly) if ser.step => {
                let _ = write!(d, " L{px:.1},{ly:.1} L{px:.1},{py:.1}");
            }
            Some(_) => {
                let _ = write!(d, " L{px:.1},{py:.1}");
            }
        }
        prev_y = Some(py);
    }
    let dash = if ser.dashed {
        r#" stroke-dasharray="6 4""#
    } else {
        ""
    };
    let _ = write!(
        s,
        r#"<path d="{d}" fill="none" stroke="{c}" stroke-width="2.2" stroke-linejoin="round"{dash}/>"#
    );
    if ser.markers {
        for &(x, y) in &ser.points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{c}"/>"#,
                sx.at(x),
                sy.at(y)
            );
        }
    }
}

struct Scale {
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
}

impl Scale {
    fn new(d0: f64, d1: f64, r0: f64, r1: f64) -> Self {
        Scale { d0, d1, r0, r1 }
    }
    fn at(&self, v: f64) -> f64 {
        let span = if self.d1 > self.d0 {
            self.d1 - self.d0
        } else {
            1.0
        };
        self.r0 + (v - self.d0) / span * (self.r1 - self.r0)
    }
}

/// Round-numbered ticks covering a range.
struct Ticks {
    first: f64,
    last: f64,
    step: f64,
}

impl Ticks {
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        let n = ((self.last - self.first) / self.step).round() as usize;
        (0..=n).map(move |i| self.first + self.step * i as f64)
    }
}

/// Ticks at 1, 2 or 5 times a power of ten, about six of them.
fn ticks(lo: f64, hi: f64) -> Ticks {
    let raw = (hi - lo).max(f64::MIN_POSITIVE) / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() * step;
    let last = (hi / step).ceil() * step;
    Ticks { first, last, step }
}

fn label(v: f64, step: f64) -> String {
    if step >= 1.0 {
        let r = v.round() as i64;
        thousands(r)
    } else {
        let digits = (-step.log10()).ceil().max(1.0) as usize;
        format!("{v:.digits$}")
    }
}

fn thousands(n: i64) -> String {
    let digits = paceline_wire::problem::thousands(n.unsigned_abs());
    match n < 0 {
        true => format!("-{digits}"),
        false => digits,
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_names_its_series() {
        let svg = Chart::lines("Drop probability", "accept ratio", "drop probability")
            .series(Series::new(
                "K = 2",
                vec![(0.0, 1.0), (0.5, 0.0), (1.0, 0.0)],
            ))
            .render();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("K = 2"));
    }

    #[test]
    fn ticks_are_round() {
        let t = ticks(0.0, 10_000.0);
        assert_eq!(t.step, 2_000.0);
        assert_eq!(t.last, 10_000.0);
        let t = ticks(0.0, 1.12);
        assert_eq!(t.step, 0.2);
        assert_eq!(label(0.4, t.step), "0.4");
        assert_eq!(label(12_000.0, 2_000.0), "12,000");
    }

    #[test]
    fn bars_and_legend_are_drawn() {
        let svg = Chart::bars("Retries", "seconds", "requests", 1.0)
            .series(Series::new("no jitter", vec![(5.0, 10_000.0), (6.0, 0.0)]))
            .series(Series::new("jitter", vec![(5.0, 2_000.0), (6.0, 2_000.0)]))
            .render();
        assert_eq!(svg.matches("<rect").count(), 1 + 4 + 1 + 2);
        assert!(svg.contains(">no jitter<") && svg.contains(">jitter<"));
        assert!(svg.contains(">seconds<") && svg.contains(">requests<"));
        assert!(svg.contains(">10,000<"));
    }

    #[test]
    fn labels_are_escaped() {
        let svg = Chart::lines("a < b & c", "x", "y")
            .series(
                Series::new("s", vec![(0.0, 1.0), (1.0, 2.0)])
                    .step()
                    .dashed(),
            )
            .render();
        assert!(svg.contains("a &lt; b &amp; c"));
        assert!(svg.contains("stroke-dasharray"));
    }
}

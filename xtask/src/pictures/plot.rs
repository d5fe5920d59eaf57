//! One panel as an SVG line chart (plotters' SVG backend): the panel's title, its series as lines with
//! their legends beside the chart, the run's moments as grey vertical lines, values in the panel's unit.
//! The SVG carries the panel's queries, verbatim, as JSON in its `<desc>` ([`queries_of`]), so a test can
//! hold every committed picture to the dashboard's current queries.

use plotters::prelude::*;

use super::recording::Point;

/// Size of a picture, in pixels.
const WIDTH: u32 = 960;
const HEIGHT: u32 = 400;
/// Width of the legend column on the right.
const LEGEND_WIDTH: u32 = 250;

/// Grafana's classic palette, in its order.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0x73, 0xbf, 0x69),
    RGBColor(0xf2, 0xcc, 0x0c),
    RGBColor(0x8a, 0xb8, 0xff),
    RGBColor(0xff, 0x78, 0x0a),
    RGBColor(0xf2, 0x49, 0x5c),
    RGBColor(0x57, 0x94, 0xf2),
    RGBColor(0xb8, 0x77, 0xd9),
    RGBColor(0x70, 0x5d, 0xa0),
    RGBColor(0x37, 0x87, 0x2d),
    RGBColor(0xfa, 0xde, 0x2a),
];

/// A line of the chart.
#[derive(Clone, Debug)]
pub struct Line {
    pub legend: String,
    pub points: Vec<Point>,
}

/// What a chart shows.
#[derive(Clone, Debug)]
pub struct Chart<'a> {
    pub title: &'a str,
    /// The panel's queries, verbatim (kept in the SVG's `<desc>`).
    pub queries: &'a [String],
    /// Grafana's unit of the values.
    pub unit: Option<&'a str>,
    pub lines: Vec<Line>,
    /// The moments of the run: time (ms since the epoch) and label.
    pub marks: Vec<(i64, String)>,
    /// The recording's first scrape: time 0 of the x axis.
    pub start_ms: i64,
    pub end_ms: i64,
    /// Said under the x axis: how rates were taken.
    pub x_description: String,
}

/// Drawing failed (plotters' errors carry the backend's; kept as text).
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {title:?}: {reason}")]
pub struct DrawError {
    pub title: String,
    pub reason: String,
}

/// The chart as an SVG document.
pub fn svg(chart: &Chart<'_>) -> Result<String, DrawError> {
    let mut out = String::new();
    draw(chart, &mut out).map_err(|reason| DrawError {
        title: chart.title.to_owned(),
        reason,
    })?;
    Ok(with_description(&out, chart.title, chart.queries))
}

fn draw(chart: &Chart<'_>, out: &mut String) -> Result<(), String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| text(&e))?;
    let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let seconds = |ms: i64| (ms - chart.start_ms) as f64 / 1000.0;
    let x_end = seconds(chart.end_ms).max(1.0);
    // Bytes are drawn in the binary unit of the highest value, so that the axis' round numbers are
    // round in that unit (16 MiB, not 16.8 MB shown as 16.0 MiB).
    let (divisor, bytes_unit) = match chart.unit {
        Some("bytes") => {
            let (_, suffix, divisor) = scale(y_max(chart), 1024.0, &["B", "KiB", "MiB", "GiB"]);
            (divisor, Some(suffix))
        }
        _ => (1.0, None),
    };
    let unit = chart.unit.map(str::to_owned);
    let y_format = move |v: &f64| match bytes_unit {
        Some(suffix) => format!("{} {suffix}", trimmed(*v)),
        None => format_value(*v, unit.as_deref()),
    };
    let y_end = y_max(chart) / divisor;

    let mut plot = ChartBuilder::on(&plot_area)
        .caption(chart.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..x_end, 0.0..y_end)
        .map_err(|e| text(&e))?;
    plot.configure_mesh()
        .x_desc(chart.x_description.as_str())
        .y_label_formatter(&y_format)
        .x_label_formatter(&|v| format!("{v:.0} s"))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
        .draw()
        .map_err(|e| text(&e))?;

    let grey = RGBColor(0x88, 0x88, 0x88);
    for (index, (at_ms, label)) in chart.marks.iter().enumerate() {
        let x = seconds(*at_ms);
        plot.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, y_end)],
            grey.stroke_width(1),
        )))
        .map_err(|e| text(&e))?;
        // Labels of close moments are staggered, so that they do not overprint.
        let row = (index % 3) as f64;
        plot.draw_series(std::iter::once(Text::new(
            format!(" {label}"),
            (x, y_end * (0.98 - 0.06 * row)),
            ("sans-serif", 12).into_font().color(&grey),
        )))
        .map_err(|e| text(&e))?;
    }

    for (index, line) in chart.lines.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        // A value that is not a number (0/0: no gets in the window) is a gap, as in Grafana.
        for segment in line
            .points
            .split(|p| !p.value.is_finite())
            .filter(|s| !s.is_empty())
        {
            plot.draw_series(LineSeries::new(
                segment
                    .iter()
                    .map(|p| (seconds(p.at_ms), p.value / divisor)),
                colour.stroke_width(2),
            ))
            .map_err(|e| text(&e))?;
        }
        let y = 60 + 20 * index as i32;
        legend_area
            .draw(&PathElement::new(
                vec![(8, y), (30, y)],
                colour.stroke_width(3),
            ))
            .map_err(|e| text(&e))?;
        legend_area
            .draw(&Text::new(
                line.legend.clone(),
                (36, y - 7),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(|e| text(&e))?;
    }
    root.present().map_err(|e| text(&e))
}

/// The top of the y axis: the panel's fixed maximum for a ratio, else a tenth above the highest value.
fn y_max(chart: &Chart<'_>) -> f64 {
    if chart.unit == Some("percentunit") {
        return 1.05;
    }
    let highest = chart
        .lines
        .iter()
        .flat_map(|l| &l.points)
        .map(|p| p.value)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    if highest > 0.0 { highest * 1.1 } else { 1.0 }
}

/// A value as Grafana shows it in `unit`.
pub fn format_value(value: f64, unit: Option<&str>) -> String {
    match unit {
        Some("percentunit") => format!("{:.0}%", value * 100.0),
        Some("bytes") => {
            let (scaled, suffix, _) = scale(value, 1024.0, &["B", "KiB", "MiB", "GiB"]);
            format!("{} {suffix}", trimmed(scaled))
        }
        Some("reqps") => format!("{} req/s", short(value)),
        Some("ops") => format!("{} ops/s", short(value)),
        _ => short(value),
    }
}

fn short(value: f64) -> String {
    let (scaled, suffix, _) = scale(value, 1000.0, &["", "K", "M", "G"]);
    format!("{}{suffix}", trimmed(scaled))
}

/// One decimal, none when it is zero.
fn trimmed(value: f64) -> String {
    let text = format!("{value:.1}");
    text.strip_suffix(".0").unwrap_or(&text).to_owned()
}

/// `value` in the largest unit of `suffixes` (each `step` times the one before) it reaches: the scaled
/// value, the unit, and what the value was divided by.
fn scale(mut value: f64, step: f64, suffixes: &[&'static str]) -> (f64, &'static str, f64) {
    let mut index = 0;
    let mut divisor = 1.0;
    while value.abs() >= step && index + 1 < suffixes.len() {
        value /= step;
        divisor *= step;
        index += 1;
    }
    (value, suffixes[index], divisor)
}

/// `svg` with `<title>` and a `<desc>` holding the queries as a JSON list, right after the root element.
fn with_description(svg: &str, title: &str, queries: &[String]) -> String {
    let json = serde_json::to_string(queries).unwrap_or_default();
    let Some(open) = svg.find("<svg") else {
        return svg.to_owned();
    };
    let Some(end) = svg[open..].find('>') else {
        return svg.to_owned();
    };
    let at = open + end + 1;
    format!(
        "{}\n<title>{}</title>\n<desc>{}</desc>{}",
        &svg[..at],
        escape(title),
        escape(&json),
        &svg[at..]
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&amp;", "&")
}

/// The queries an SVG written by [`svg`] was drawn from, or `None` when it has no such `<desc>`.
pub fn queries_of(svg: &str) -> Option<Vec<String>> {
    let start = svg.find("<desc>")? + "<desc>".len();
    let end = start + svg[start..].find("</desc>")?;
    serde_json::from_str(&unescape(&svg[start..end])).ok()
}

/// The title an SVG written by [`svg`] carries.
pub fn title_of(svg: &str) -> Option<String> {
    let start = svg.find("<title>")? + "<title>".len();
    let end = start + svg[start..].find("</title>")?;
    Some(unescape(&svg[start..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_shown_in_the_panels_unit() {
        assert_eq!(format_value(0.5, Some("percentunit")), "50%");
        assert_eq!(format_value(3.0 * 1024.0 * 1024.0, Some("bytes")), "3 MiB");
        assert_eq!(format_value(1536.0, Some("bytes")), "1.5 KiB");
        assert_eq!(format_value(1500.0, Some("reqps")), "1.5K req/s");
        assert_eq!(format_value(12.0, Some("ops")), "12 ops/s");
        assert_eq!(format_value(2500.0, Some("short")), "2.5K");
    }

    #[test]
    fn a_picture_carries_its_title_and_queries_verbatim() {
        let queries =
            vec!["sum(rate(a{x=~\"$x\"}[$__rate_interval]))\n/\nsum(b) > 1 & 2 < 3".to_owned()];
        let chart = Chart {
            title: "Hits & misses",
            queries: &queries,
            unit: Some("percentunit"),
            lines: vec![Line {
                legend: "ns/cache".to_owned(),
                points: vec![
                    Point {
                        at_ms: 1_000,
                        value: 0.5,
                    },
                    Point {
                        at_ms: 2_000,
                        value: f64::NAN,
                    },
                    Point {
                        at_ms: 3_000,
                        value: 0.75,
                    },
                ],
            }],
            marks: vec![(2_000, "rollout starts".to_owned())],
            start_ms: 1_000,
            end_ms: 3_000,
            x_description: "seconds".to_owned(),
        };
        let svg = svg(&chart).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(queries_of(&svg), Some(queries));
        assert_eq!(title_of(&svg).as_deref(), Some("Hits & misses"));
        assert!(svg.contains("rollout starts") && svg.contains("ns/cache"));
        assert!(svg.contains("<polyline") || svg.contains("<path"), "{svg}");
    }
}

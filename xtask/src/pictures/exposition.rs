//! The samples of one scrape: the Prometheus text exposition format (and OpenMetrics', which the
//! operator's `prometheus-client` writes) read into names, labels and values.
//!
//! Hand-rolled: the one parser on crates.io for this format, `prometheus-parse` (0.2), splits label
//! values at every `,` and `=` and keeps their escapes, so a value such as an error message would be cut
//! or dropped; the sample line's grammar is small enough to read exactly here. Comments (`# HELP`,
//! `# TYPE`, `# EOF`) carry nothing the plotter needs: histograms are read as their `_bucket`, `_sum` and
//! `_count` series, as PromQL sees them.

use std::collections::BTreeMap;

/// Label names to values; the metric name is kept apart, in [`Sample::name`].
pub type Labels = BTreeMap<String, String>;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

/// A line that is not a sample.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line} is not a sample ({reason}): {text:?}")]
pub struct ExpositionError {
    pub line: usize,
    pub reason: &'static str,
    pub text: String,
}

/// Every sample of `text`, in order.
pub fn parse(text: &str) -> Result<Vec<Sample>, ExpositionError> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let error = |reason| ExpositionError {
            line: index + 1,
            reason,
            text: line.to_owned(),
        };
        samples.push(sample(line).map_err(error)?);
    }
    Ok(samples)
}

fn sample(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Labels::new();
    if let Some(after) = rest.strip_prefix('{') {
        rest = read_labels(after, &mut labels)?;
    }
    // The value, then an optional timestamp, and in OpenMetrics an optional exemplar after ` # `.
    let value = rest.split_whitespace().next().ok_or("no value")?;
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value: parse_value(value).ok_or("a value that is not a number")?,
    })
}

/// Reads `name="value"` pairs up to the closing `}`, and returns what follows it.
fn read_labels<'a>(mut text: &'a str, labels: &mut Labels) -> Result<&'a str, &'static str> {
    loop {
        text = text.trim_start_matches([' ', ',']);
        if let Some(after) = text.strip_prefix('}') {
            return Ok(after);
        }
        let (name, after) = text.split_once('=').ok_or("a label without a value")?;
        let name = name.trim();
        if name.is_empty() {
            return Err("a label without a name");
        }
        let mut chars = after
            .strip_prefix('"')
            .ok_or("a label value without quotes")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars
                .next()
                .ok_or("a label value without its closing quote")?
            {
                (at, '"') => break at,
                (_, '\\') => match chars.next().ok_or("an escape at the end of a line")?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(name.to_owned(), value);
        text = &after[1 + end + 1..];
    }
}

/// A sample value: a decimal or Go float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_keep_commas_equals_signs_and_escapes() {
        let text = "# TYPE x counter\nx_total{reason=\"a, b=c \\\"d\\\" \\\\ e\\nf\",verb=\"get\"} 3 1700000000000\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].name, "x_total");
        assert_eq!(samples[0].labels["reason"], "a, b=c \"d\" \\ e\nf");
        assert_eq!(samples[0].labels["verb"], "get");
        assert_eq!(samples[0].value, 3.0);
    }

    #[test]
    fn samples_without_labels_infinities_and_exemplars_are_read() {
        let text = "up 1\nh_bucket{le=\"+Inf\"} 4 # {trace_id=\"x\"} 1.0\nm{} -Inf\n# EOF\n";
        let samples = parse(text).unwrap();
        assert_eq!(samples[0].name, "up");
        assert!(samples[0].labels.is_empty());
        assert_eq!(samples[1].labels["le"], "+Inf");
        assert_eq!(samples[1].value, 4.0);
        assert_eq!(samples[2].value, f64::NEG_INFINITY);
    }

    #[test]
    fn a_malformed_line_is_refused_with_its_number() {
        let error = parse("up 1\nup{pod=\"a} 1\n").unwrap_err();
        assert_eq!(error.line, 2);
        assert_eq!(
            parse("up{pod=a} 1").unwrap_err().reason,
            "a label value without quotes"
        );
        assert_eq!(
            parse("up one").unwrap_err().reason,
            "a value that is not a number"
        );
        assert_eq!(parse("{pod=\"a\"} 1").unwrap_err().reason, "no metric name");
    }
}

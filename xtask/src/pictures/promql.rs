//! Evaluates the PromQL of the dashboard's panels over a [`Recording`], as a Prometheus server would over
//! the same scrapes, so that the pictures show what Grafana would draw.
//!
//! The queries are parsed by `promql-parser` (Prometheus' grammar, maintained by GreptimeDB). It only
//! parses; no crate on crates.io evaluates PromQL without a storage engine and server of its own, so the
//! subset the pictured panels use is evaluated here: vector selectors with their matchers and `offset` (a
//! series missing from the latest scrape is stale, as with Prometheus' staleness markers), `rate` and
//! `increase` with Prometheus' extrapolation and counter resets, `clamp_min` and `clamp_max`,
//! `sum`/`count`/`min`/`max`/`avg` by or without labels, arithmetic between scalars and vectors with
//! one-to-one matching (`on`, `ignoring`), and `or`. Any other construct is refused by name
//! ([`EvalError::Unsupported`]) rather than guessed.

use std::collections::BTreeMap;
use std::time::Duration;

use promql_parser::label::Matchers;
use promql_parser::parser::{
    self, AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, Offset, VectorMatchCardinality,
    VectorSelector,
};

use super::exposition::Labels;
use super::recording::{NAME_LABEL, Point, Recording};

/// A query that cannot be evaluated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EvalError {
    #[error("not PromQL: {0}")]
    Parse(String),
    #[error("{0} is not in the subset of PromQL the pictures evaluate")]
    Unsupported(String),
    #[error("{0}: one side of the operation has several series with the same labels")]
    ManyToMany(String),
}

/// The value of an expression at one time.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Scalar(f64),
    /// Series by their labels (a result of `rate` or an aggregation has no [`NAME_LABEL`]).
    Vector(BTreeMap<Labels, f64>),
}

/// A parsed query.
#[derive(Clone, Debug)]
pub struct Query {
    expr: Expr,
}

/// A query's result over a recording: per series, its value at each scrape where it had one.
pub type Series = BTreeMap<Labels, Vec<Point>>;

impl Query {
    pub fn parse(text: &str) -> Result<Self, EvalError> {
        parser::parse(text)
            .map(|expr| Self { expr })
            .map_err(EvalError::Parse)
    }

    /// The value at `at_ms`.
    pub fn at(&self, recording: &Recording, at_ms: i64) -> Result<Value, EvalError> {
        eval(&self.expr, recording, at_ms)
    }

    /// The value at each scrape of `recording`, by series (a scalar as a series without labels).
    pub fn over(&self, recording: &Recording) -> Result<Series, EvalError> {
        let mut series = Series::new();
        for &at_ms in &recording.scrapes {
            let elements = match self.at(recording, at_ms)? {
                Value::Scalar(value) => BTreeMap::from([(Labels::new(), value)]),
                Value::Vector(elements) => elements,
            };
            for (labels, value) in elements {
                series
                    .entry(labels)
                    .or_default()
                    .push(Point { at_ms, value });
            }
        }
        Ok(series)
    }
}

fn unsupported(what: impl std::fmt::Display) -> EvalError {
    EvalError::Unsupported(what.to_string())
}

fn eval(expr: &Expr, recording: &Recording, at_ms: i64) -> Result<Value, EvalError> {
    match expr {
        Expr::NumberLiteral(number) => Ok(Value::Scalar(number.val)),
        Expr::Paren(paren) => eval(&paren.expr, recording, at_ms),
        Expr::VectorSelector(selector) => instant(selector, recording, at_ms).map(Value::Vector),
        Expr::Call(call) => function(call, recording, at_ms).map(Value::Vector),
        Expr::Aggregate(aggregate) => aggregation(aggregate, recording, at_ms).map(Value::Vector),
        Expr::Binary(binary) => arithmetic(binary, recording, at_ms),
        other => Err(unsupported(other)),
    }
}

/// The series `selector` selects, with the samples [`select`] keeps.
fn matching<'a>(
    selector: &VectorSelector,
    recording: &'a Recording,
) -> Result<impl Iterator<Item = (&'a Labels, &'a [Point])>, EvalError> {
    if selector.at.is_some() || !selector.matchers.or_matchers.is_empty() {
        return Err(unsupported(selector));
    }
    let name = selector.name.clone();
    let matchers: Matchers = selector.matchers.clone();
    Ok(recording.series.iter().filter_map(move |(labels, points)| {
        let value = |label: &str| labels.get(label).map_or("", String::as_str);
        let selected = name.as_deref().is_none_or(|name| value(NAME_LABEL) == name)
            && matchers.matchers.iter().all(|m| m.is_match(value(&m.name)));
        selected.then_some((labels, points.as_slice()))
    }))
}

/// The time `selector` reads at when a query is evaluated at `at_ms`: earlier by its `offset`.
fn shifted(selector: &VectorSelector, at_ms: i64) -> i64 {
    match &selector.offset {
        Some(Offset::Pos(offset)) => at_ms - duration_ms(*offset),
        Some(Offset::Neg(offset)) => at_ms + duration_ms(*offset),
        None => at_ms,
    }
}

/// An instant vector: each selected series' latest sample, if the latest scrape had it (at the time the
/// selector's `offset` names).
fn instant(
    selector: &VectorSelector,
    recording: &Recording,
    at_ms: i64,
) -> Result<BTreeMap<Labels, f64>, EvalError> {
    let at_ms = shifted(selector, at_ms);
    let Some(scrape) = recording.scrape_at(at_ms) else {
        return Ok(BTreeMap::new());
    };
    Ok(matching(selector, recording)?
        .filter_map(|(labels, points)| {
            let last = points[..points.partition_point(|p| p.at_ms <= at_ms)].last()?;
            (last.at_ms == scrape).then(|| (labels.clone(), last.value))
        })
        .collect())
}

/// `rate(selector[range])`, `increase(…)`, `clamp_min(vector, scalar)` or `clamp_max(…)`.
fn function(
    call: &Call,
    recording: &Recording,
    at_ms: i64,
) -> Result<BTreeMap<Labels, f64>, EvalError> {
    let per_second = match call.func.name {
        "rate" => true,
        "increase" => false,
        "clamp_min" | "clamp_max" => return clamp(call, recording, at_ms),
        _ => return Err(unsupported(call)),
    };
    let [argument] = call.args.args.as_slice() else {
        return Err(unsupported(call));
    };
    let Expr::MatrixSelector(matrix) = argument.as_ref() else {
        return Err(unsupported(call));
    };
    let at_ms = shifted(&matrix.vs, at_ms);
    let start = at_ms - duration_ms(matrix.range);
    Ok(matching(&matrix.vs, recording)?
        .filter_map(|(labels, points)| {
            let from = points.partition_point(|p| p.at_ms <= start);
            let to = points.partition_point(|p| p.at_ms <= at_ms);
            let value = extrapolated_rate(&points[from..to], start, at_ms, per_second)?;
            let mut labels = labels.clone();
            labels.remove(NAME_LABEL);
            Some((labels, value))
        })
        .collect())
}

/// `clamp_min(v, bound)`: each element of `v` raised to `bound` (`clamp_max`: lowered to it), without its
/// metric name, as Prometheus does.
fn clamp(
    call: &Call,
    recording: &Recording,
    at_ms: i64,
) -> Result<BTreeMap<Labels, f64>, EvalError> {
    let [vector, bound] = call.args.args.as_slice() else {
        return Err(unsupported(call));
    };
    let (Value::Vector(elements), Value::Scalar(bound)) = (
        eval(vector, recording, at_ms)?,
        eval(bound, recording, at_ms)?,
    ) else {
        return Err(unsupported(call));
    };
    let min = call.func.name == "clamp_min";
    Ok(elements
        .into_iter()
        .map(|(mut labels, value)| {
            labels.remove(NAME_LABEL);
            let value = if min {
                value.max(bound)
            } else {
                value.min(bound)
            };
            (labels, value)
        })
        .collect())
}

fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Prometheus' `extrapolatedRate` for counters: the increase over the samples in `(start, end]`, counter
/// resets added back, extrapolated towards the window's edges (by at most half a sample interval where
/// the series starts or ends inside the window, and never below zero at the start), per second when
/// `per_second`. `None` with fewer than two samples, as Prometheus returns no value.
pub fn extrapolated_rate(points: &[Point], start: i64, end: i64, per_second: bool) -> Option<f64> {
    let (first, last) = (points.first()?, points.last()?);
    if points.len() < 2 {
        return None;
    }
    let mut increase = last.value - first.value;
    for pair in points.windows(2) {
        if pair[1].value < pair[0].value {
            increase += pair[0].value;
        }
    }
    let seconds = |ms: i64| ms as f64 / 1000.0;
    let sampled = seconds(last.at_ms - first.at_ms);
    let average_interval = sampled / (points.len() - 1) as f64;
    let threshold = average_interval * 1.1;
    let mut to_start = seconds(first.at_ms - start);
    let mut to_end = seconds(end - last.at_ms);
    if to_start >= threshold {
        to_start = average_interval / 2.0;
    }
    if increase > 0.0 && first.value >= 0.0 {
        // A counter does not go below zero: extrapolate no further back than where it would be zero.
        to_start = to_start.min(sampled * (first.value / increase));
    }
    if to_end >= threshold {
        to_end = average_interval / 2.0;
    }
    let mut value = increase * (sampled + to_start + to_end) / sampled;
    if per_second {
        value /= seconds(end - start);
    }
    Some(value)
}

fn aggregation(
    aggregate: &AggregateExpr,
    recording: &Recording,
    at_ms: i64,
) -> Result<BTreeMap<Labels, f64>, EvalError> {
    let op = aggregate.op.to_string();
    if aggregate.param.is_some() {
        return Err(unsupported(aggregate));
    }
    let Value::Vector(elements) = eval(&aggregate.expr, recording, at_ms)? else {
        return Err(unsupported(aggregate));
    };
    let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
    for (labels, value) in elements {
        let group = match &aggregate.modifier {
            Some(LabelModifier::Include(by)) => labels
                .into_iter()
                .filter(|(name, _)| by.labels.contains(name))
                .collect(),
            Some(LabelModifier::Exclude(without)) => labels
                .into_iter()
                .filter(|(name, _)| name != NAME_LABEL && !without.labels.contains(name))
                .collect(),
            None => Labels::new(),
        };
        groups.entry(group).or_default().push(value);
    }
    groups
        .into_iter()
        .map(|(labels, values)| {
            let value = match op.as_str() {
                "sum" => values.iter().sum(),
                "count" => values.len() as f64,
                "min" => values.iter().copied().fold(f64::INFINITY, f64::min),
                "max" => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                "avg" => values.iter().sum::<f64>() / values.len() as f64,
                _ => return Err(unsupported(aggregate)),
            };
            Ok((labels, value))
        })
        .collect()
}

fn arithmetic(binary: &BinaryExpr, recording: &Recording, at_ms: i64) -> Result<Value, EvalError> {
    let op = binary.op.to_string();
    let apply = |a: f64, b: f64| -> Result<f64, EvalError> {
        Ok(match op.as_str() {
            "+" => a + b,
            "-" => a - b,
            "*" => a * b,
            "/" => a / b,
            _ => return Err(unsupported(binary)),
        })
    };
    let lhs = eval(&binary.lhs, recording, at_ms)?;
    let rhs = eval(&binary.rhs, recording, at_ms)?;
    if op == "or" {
        return union(binary, lhs, rhs);
    }
    let without_name = |labels: &Labels| -> Labels {
        let mut labels = labels.clone();
        labels.remove(NAME_LABEL);
        labels
    };
    match (lhs, rhs) {
        (Value::Scalar(a), Value::Scalar(b)) => apply(a, b).map(Value::Scalar),
        (Value::Vector(v), Value::Scalar(s)) => v
            .iter()
            .map(|(labels, value)| Ok((without_name(labels), apply(*value, s)?)))
            .collect::<Result<_, _>>()
            .map(Value::Vector),
        (Value::Scalar(s), Value::Vector(v)) => v
            .iter()
            .map(|(labels, value)| Ok((without_name(labels), apply(s, *value)?)))
            .collect::<Result<_, _>>()
            .map(Value::Vector),
        (Value::Vector(lhs), Value::Vector(rhs)) => {
            let modifier = binary.modifier.as_ref();
            if modifier.is_some_and(|m| {
                !matches!(m.card, VectorMatchCardinality::OneToOne) || m.return_bool
            }) {
                return Err(unsupported(binary));
            }
            let matching = modifier.and_then(|m| m.matching.as_ref());
            let signature = |labels: &Labels| signature(labels, matching);
            let mut right: BTreeMap<Labels, f64> = BTreeMap::new();
            for (labels, value) in &rhs {
                if right.insert(signature(labels), *value).is_some() {
                    return Err(EvalError::ManyToMany(binary.to_string()));
                }
            }
            let mut out = BTreeMap::new();
            for (labels, value) in &lhs {
                if let Some(other) = right.get(&signature(labels))
                    && out
                        .insert(without_name(labels), apply(*value, *other)?)
                        .is_some()
                {
                    return Err(EvalError::ManyToMany(binary.to_string()));
                }
            }
            Ok(Value::Vector(out))
        }
    }
}

/// The labels a vector operation matches `labels` on: those of `on (…)`, all but those of
/// `ignoring (…)`, or all; never the metric name.
fn signature(labels: &Labels, matching: Option<&LabelModifier>) -> Labels {
    labels
        .iter()
        .filter(|(name, _)| match matching {
            Some(LabelModifier::Include(on)) => on.labels.contains(name),
            Some(LabelModifier::Exclude(ignoring)) => {
                *name != NAME_LABEL && !ignoring.labels.contains(name)
            }
            None => *name != NAME_LABEL,
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// `lhs or rhs`: every element of `lhs`, and those of `rhs` whose labels (as matched) no element of
/// `lhs` has. Both keep their labels, the metric name included, as in Prometheus.
fn union(binary: &BinaryExpr, lhs: Value, rhs: Value) -> Result<Value, EvalError> {
    let (Value::Vector(lhs), Value::Vector(rhs)) = (lhs, rhs) else {
        return Err(unsupported(binary));
    };
    let matching = binary.modifier.as_ref().and_then(|m| m.matching.as_ref());
    let taken: std::collections::BTreeSet<Labels> = lhs
        .keys()
        .map(|labels| signature(labels, matching))
        .collect();
    let mut out = lhs;
    for (labels, value) in rhs {
        if !taken.contains(&signature(&labels, matching)) {
            out.insert(labels, value);
        }
    }
    Ok(Value::Vector(out))
}

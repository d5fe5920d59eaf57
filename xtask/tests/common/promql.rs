//! PromQL as Prometheus reads it (promql-parser), for the dashboard's and the alerts' expressions: each
//! must parse, and name only metrics the operator exports.

use std::collections::BTreeSet;

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};

/// Grafana's variables replaced by what they stand for at query time, so the text is plain PromQL.
pub fn without_grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$namespace", ".*")
        .replace("$memcached", ".*")
}

/// The metric names `expr` selects; an error names what does not parse.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(selector) = selector {
                let name = selector
                    .name
                    .clone()
                    .ok_or_else(|| format!("a selector without a metric name: {selector}"))?;
                self.0.insert(name);
            }
            Ok(true)
        }
    }
    let parsed = parser::parse(expr)?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &parsed)?;
    Ok(names.0)
}

/// The names of `expr` that `/metrics` does not carry (memcached_operator::metrics::exported_series).
pub fn unknown_metrics(expr: &str) -> Result<Vec<String>, String> {
    let known = memcached_operator::metrics::exported_series();
    Ok(metric_names(expr)?
        .into_iter()
        .filter(|name| !known.contains(name))
        .collect())
}

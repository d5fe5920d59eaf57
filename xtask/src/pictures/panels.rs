//! Which of the dashboard's panels are pictured, from which recording, and what they query: read from
//! the dashboard JSON itself (config/grafana/memcached-operator.json), so that a picture shows the
//! panel's own queries, legends and unit.

use std::path::Path;

use serde_json::Value;

/// One picture: a panel of the dashboard drawn over one recording.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Picture {
    /// The panel's title, as in the dashboard.
    pub panel: &'static str,
    /// The recording (`bench --record`): `operand` or `convergence`.
    pub recording: &'static str,
    /// The file written under the pictures' directory.
    pub file: &'static str,
}

/// The dashboard's main panels: the operand's (two instances, warm handover on and off, through a
/// rollout, a scale-down and a scale-up), the warm handovers' items in that run, the operator's while 300
/// instances converge.
pub const PICTURES: [Picture; 6] = [
    Picture {
        panel: "Hit ratio",
        recording: "operand",
        file: "hit-ratio.svg",
    },
    Picture {
        panel: "Items",
        recording: "operand",
        file: "items.svg",
    },
    Picture {
        panel: "Memory used against the limit",
        recording: "operand",
        file: "memory.svg",
    },
    Picture {
        panel: "Handover items by outcome",
        recording: "operand",
        file: "handover-items.svg",
    },
    Picture {
        panel: "Reconciles by result",
        recording: "convergence",
        file: "reconciles.svg",
    },
    Picture {
        panel: "API requests by verb and code",
        recording: "convergence",
        file: "api-requests.svg",
    },
];

/// What the dashboard says of a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    /// Grafana's unit of its values (`percentunit`, `bytes`, `reqps`, `short`, …).
    pub unit: Option<String>,
    pub targets: Vec<Target>,
}

/// One query of a panel, verbatim.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub expr: String,
    /// Grafana's legend template (`{{namespace}}/{{memcached}}`).
    pub legend: String,
}

/// A dashboard that does not have what a picture needs.
#[derive(Debug, thiserror::Error)]
pub enum PanelError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not JSON: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("the dashboard has no panel titled {0:?}")]
    NoPanel(String),
    #[error("the panel {0:?} has no query")]
    NoQuery(String),
}

/// Reads the dashboard JSON at `path`.
pub fn read_dashboard(path: &Path) -> Result<Value, PanelError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PanelError::Read {
        path: shown.clone(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| PanelError::Json {
        path: shown,
        source,
    })
}

/// The panel titled `title`, anywhere in the dashboard (rows hold panels of their own when collapsed).
pub fn panel(dashboard: &Value, title: &str) -> Result<Panel, PanelError> {
    let found = all_panels(dashboard)
        .into_iter()
        .find(|p| p["title"] == title)
        .ok_or_else(|| PanelError::NoPanel(title.to_owned()))?;
    let targets: Vec<Target> = found["targets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            Some(Target {
                expr: t["expr"].as_str()?.to_owned(),
                legend: t["legendFormat"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect();
    if targets.is_empty() {
        return Err(PanelError::NoQuery(title.to_owned()));
    }
    Ok(Panel {
        title: title.to_owned(),
        unit: found["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .map(str::to_owned),
        targets,
    })
}

fn all_panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        out.push(panel);
    }
    out
}

/// `expr` as Grafana sends it with every variable at "All": each `$variable` of the dashboard's
/// templating replaced by its `allValue`, and `$__rate_interval` and `$__interval` by `interval`.
pub fn instantiate(dashboard: &Value, expr: &str, interval: &str) -> String {
    let mut out = expr
        .replace("$__rate_interval", interval)
        .replace("$__interval", interval);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        if let (Some(name), Some(all)) = (variable["name"].as_str(), variable["allValue"].as_str())
        {
            out = out.replace(&format!("${name}"), all);
        }
    }
    out
}

/// A legend template filled with a series' labels (`{{label}}`; a label the series lacks is empty).
pub fn legend(template: &str, labels: &super::exposition::Labels) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            out.push_str(&rest[open..]);
            return out;
        };
        let name = after[..close].trim();
        out.push_str(labels.get(name).map_or("", String::as_str));
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    out
}

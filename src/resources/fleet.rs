//! The fleet rollout, in pure terms: what caused a change of an instance's pod template, and how many
//! instances the operator may roll at once for its own changes.
//!
//! A pod template is built from two kinds of input: the instance's own (its spec, the Secrets it names)
//! and the operator's (its version's builders, its defaults such as the image, the key of the Secrets'
//! hash). A change of the first kind is the instance owner's rollout and rolls at once; a change of the
//! second kind reaches every instance together (an operator upgrade), and the operator paces it over the
//! fleet ([`Budget`]). The workload records, in [`CAUSE_ANNOTATION`], the [`cause`] of the template it
//! runs: a hash of the instance's own inputs alone. A template that differs from the live one while the
//! cause is unchanged was changed by the operator.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::drift::hash_of;
use super::secrets::referenced;
use crate::api::MemcachedSpec;

/// Workload annotation: the [`cause`] of the pod template the workload runs.
pub const CAUSE_ANNOTATION: &str = "cache.example.com/template-cause";

/// The hash of what the instance's owner controls of its pod template: the spec without its sizes (a
/// scale rolls no pod; the scale subresource and autoscalers change them), and the version of each
/// Secret it names (`versions`: name and resourceVersion, `None` for a missing one). The Secrets'
/// versions, not their content's hash: that hash is keyed with the operator's digest key, whose change
/// is the operator's.
pub fn cause(spec: &MemcachedSpec, versions: &[(String, Option<String>)]) -> String {
    let mut spec = serde_json::to_value(spec).unwrap_or(Value::Null);
    if let Some(fields) = spec.as_object_mut() {
        fields.remove("size");
        if let Some(proxy) = fields.get_mut("proxy").and_then(Value::as_object_mut) {
            proxy.remove("replicas");
        }
    }
    hash_of(&(spec, versions))
}

/// The Secrets whose versions go into [`cause`]: those the servers' pods mount, by name.
pub fn secret_names(spec: &MemcachedSpec) -> Vec<String> {
    referenced(spec).into_iter().map(|r| r.name).collect()
}

/// The cause a live workload records (`None`: a workload of an operator before this record).
pub fn recorded(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(CAUSE_ANNOTATION)
        .map(String::as_str)
}

/// Sets (or with `None` removes) the cause a desired workload records.
pub fn record(meta: &mut ObjectMeta, cause: Option<&str>) {
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    match cause {
        Some(cause) => annotations.insert(CAUSE_ANNOTATION.to_owned(), cause.to_owned()),
        None => annotations.remove(CAUSE_ANNOTATION),
    };
}

/// How many instances the operator rolls at once for its own changes (`--fleet-rollout-budget`): a
/// number, or a percentage of the instances it manages; never less than one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Instances(u32),
    Percent(u32),
}

/// Default of `--fleet-rollout-budget`.
pub const DEFAULT_BUDGET: Budget = Budget::Percent(5);

impl Budget {
    /// The instances that may roll at once among `instances` (at least one).
    pub fn slots(self, instances: usize) -> usize {
        let slots = match self {
            Budget::Instances(n) => n as usize,
            Budget::Percent(p) => instances.saturating_mul(p as usize) / 100,
        };
        slots.max(1)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Instances(n) => write!(f, "{n}"),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl FromStr for Budget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (digits, percent) = match s.strip_suffix('%') {
            Some(digits) => (digits, true),
            None => (s, false),
        };
        let n: u32 = digits
            .parse()
            .map_err(|_| format!("{s:?}: a number of instances (3) or a percentage (5%)"))?;
        match (percent, n) {
            (_, 0) => Err(format!("{s:?}: at least one instance must be able to roll")),
            (true, 101..) => Err(format!("{s:?}: a percentage is at most 100%")),
            (true, _) => Ok(Budget::Percent(n)),
            (false, _) => Ok(Budget::Instances(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemcachedSpec;

    fn spec(value: serde_json::Value) -> MemcachedSpec {
        serde_json::from_value(value).expect("a spec")
    }

    #[test]
    fn sizes_are_not_a_cause_and_everything_else_of_the_spec_is() {
        let base = cause(&spec(serde_json::json!({"size": 1})), &[]);
        assert_eq!(base, cause(&spec(serde_json::json!({"size": 7})), &[]));
        let proxied = |replicas: i32| {
            let proxy = serde_json::json!({"enabled": true, "replicas": replicas});
            cause(&spec(serde_json::json!({"size": 1, "proxy": proxy})), &[])
        };
        assert_eq!(proxied(2), proxied(5));
        assert_ne!(base, proxied(2));
        let image = spec(serde_json::json!({"size": 1, "image": "memcached:1.6.40"}));
        assert_ne!(base, cause(&image, &[]));
    }

    #[test]
    fn a_new_version_of_a_named_secret_is_a_cause() {
        let tls = spec(serde_json::json!({
            "size": 1,
            "security": {"tls": {"enabled": true, "secretName": "t"}}
        }));
        assert_eq!(secret_names(&tls), ["t"]);
        let at = |version: &str| cause(&tls, &[("t".to_owned(), Some(version.to_owned()))]);
        assert_eq!(at("5"), at("5"));
        assert_ne!(at("5"), at("6"));
    }

    #[test]
    fn the_cause_is_recorded_and_removed_on_the_metadata() {
        let mut meta = ObjectMeta::default();
        assert_eq!(recorded(&meta), None);
        record(&mut meta, Some("abc"));
        assert_eq!(recorded(&meta), Some("abc"));
        record(&mut meta, None);
        assert_eq!(recorded(&meta), None);
    }

    #[test]
    fn budgets_parse_and_give_at_least_one_slot() {
        assert_eq!("5%".parse(), Ok(Budget::Percent(5)));
        assert_eq!(" 3 ".parse(), Ok(Budget::Instances(3)));
        for refused in ["0", "0%", "101%", "-1", "five", "%", ""] {
            assert!(refused.parse::<Budget>().is_err(), "{refused}");
        }
        assert_eq!(Budget::Percent(5).slots(10), 1);
        assert_eq!(Budget::Percent(5).slots(300), 15);
        assert_eq!(Budget::Percent(10).slots(40), 4);
        assert_eq!(Budget::Instances(3).slots(2), 3);
        assert_eq!(Budget::Percent(5).slots(0), 1);
        assert_eq!(DEFAULT_BUDGET.to_string(), "5%");
    }
}

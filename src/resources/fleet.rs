//! The fleet rollout, in pure terms: what caused a change of an instance's pod template, and how many
//! instances the operator may roll at once for its own changes.
//!
//! A pod template is built from two kinds of input: the instance's own (its spec, the Secrets it names)
//! and the operator's (its version's builders, its defaults such as the image, the key of the Secrets'
//! hash). A change of the first kind is the instance owner's rollout and rolls at once; a change of the
//! second kind reaches every instance together (an operator upgrade), and the operator paces it over the
//! fleet ([`Budget`]). The workload records, in [`CAUSE_ANNOTATION`], the [`Cause`] of the template it
//! runs: a hash of what the owner controls of the spec, the hash of the template the operator built,
//! and which digest key hashed the Secrets in the template. A template the operator now builds
//! differently while the spec's hash is unchanged, and whose Secrets' hash changed only with the digest
//! key (or not at all), was changed by the operator ([`changed`]).

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::drift::hash_of;
use crate::api::MemcachedSpec;

/// Workload annotation: the [`Cause`] of the pod template the workload runs.
pub const CAUSE_ANNOTATION: &str = "cache.example.com/template-cause";

/// Spec fields no pod template reads: the sizes (a scale rolls no pod; the scale subresource and
/// autoscalers change them), the Services, the drain, the autoscaler, the clients' hashing, the proxy
/// (its own Deployment), the rollout's pace (the workload's, not its pods'), the budget, the
/// ServiceMonitor and the NetworkPolicy. Left out of [`spec_hash`], so that changing them writes nothing to the workload. A
/// field wrongly listed here would only make an owner's change of it wait for a free slot like the
/// operator's.
const NOT_IN_TEMPLATE: &[&[&str]] = &[
    &["size"],
    &["service"],
    &["scaling"],
    &["autoscaling"],
    &["clients"],
    &["proxy"],
    &["rollout"],
    &["highAvailability", "podDisruptionBudget"],
    &["monitoring", "serviceMonitor"],
    &["security", "networkPolicy"],
];

/// Spec fields the proxy's pod template does not read (see [`NOT_IN_TEMPLATE`]): the same but the
/// proxy and what the servers' template reads, which the proxy's may too (the port, TLS, the image's
/// defaults). A field read by the servers alone only lets an owner's change of it carry a waiting change
/// of the proxy's template at once.
const NOT_IN_PROXY_TEMPLATE: &[&[&str]] = &[
    &["size"],
    &["scaling"],
    &["autoscaling"],
    &["rollout"],
    &["proxy", "replicas"],
    &["highAvailability", "podDisruptionBudget"],
    &["monitoring", "serviceMonitor"],
    &["security", "networkPolicy"],
];

/// The hash of what the instance's owner controls of its servers' pod template in its spec: the spec
/// without the fields no such template reads ([`NOT_IN_TEMPLATE`]).
pub fn spec_hash(spec: &MemcachedSpec) -> String {
    hash_without(spec, NOT_IN_TEMPLATE)
}

/// The same for the proxy's pod template ([`NOT_IN_PROXY_TEMPLATE`]).
pub fn proxy_spec_hash(spec: &MemcachedSpec) -> String {
    hash_without(spec, NOT_IN_PROXY_TEMPLATE)
}

fn hash_without(spec: &MemcachedSpec, unread: &[&[&str]]) -> String {
    let mut spec = serde_json::to_value(spec).unwrap_or(Value::Null);
    for path in unread {
        let (last, parents) = path.split_last().expect("a path");
        let parent = parents
            .iter()
            .try_fold(&mut spec, |value, key| value.get_mut(*key));
        if let Some(fields) = parent.and_then(Value::as_object_mut) {
            fields.remove(*last);
        }
    }
    prune(&mut spec);
    hash_of(&spec)
}

/// Drops null fields and the objects left empty, so that an unset field and one set to nothing (or
/// holding only unread fields) hash alike.
fn prune(value: &mut Value) {
    if let Some(fields) = value.as_object_mut() {
        for field in fields.values_mut() {
            prune(field);
        }
        fields.retain(|_, field| {
            !(field.is_null() || field.as_object().is_some_and(|o| o.is_empty()))
        });
    }
}

/// What caused a workload's pod template, as [`CAUSE_ANNOTATION`] records it
/// (`<spec>/<template>[/<key>]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// [`spec_hash`] of the spec the template was built from.
    pub spec: String,
    /// The hash of the template as the operator built it (before warm handover's gate), to tell a
    /// template someone else changed (drift, put back at once) from one the operator now builds
    /// differently.
    pub template: String,
    /// With Secrets hashed in the template: an identity of the digest key that hashed them (a keyed
    /// hash of a constant, short; it tells nothing of the key).
    pub key: Option<String>,
}

impl Cause {
    pub fn to_annotation(&self) -> String {
        match &self.key {
            Some(key) => format!("{}/{}/{key}", self.spec, self.template),
            None => format!("{}/{}", self.spec, self.template),
        }
    }

    /// The cause an annotation records (`None`: not one this operator wrote).
    pub fn parse(annotation: &str) -> Option<Self> {
        let mut parts = annotation.split('/');
        let (spec, template) = (parts.next()?, parts.next()?);
        let key = parts.next().map(str::to_owned);
        parts.next().is_none().then(|| Cause {
            spec: spec.to_owned(),
            template: template.to_owned(),
            key,
        })
    }
}

/// Who changed the template the workload runs, now that the operator builds `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// Nobody since the recorded cause (or only someone else, by hand: drift to put back).
    Nobody,
    /// The owner: the spec, or (under the same digest key) a Secret's content.
    Owner,
    /// The operator: its builders, its defaults or its digest key.
    Operator,
}

/// Who changed the template from the one `recorded` was built for to the one `now` causes
/// (`secret_hashes`: the Secrets' hash on the live template and on the desired one). A workload without
/// a record (written before the record existed) was changed by the operator.
pub fn changed(
    recorded: Option<&Cause>,
    now: &Cause,
    secret_hashes: (Option<&str>, Option<&str>),
) -> Changed {
    let Some(recorded) = recorded else {
        return Changed::Operator;
    };
    let secrets_changed = secret_hashes.0 != secret_hashes.1 && recorded.key == now.key;
    if recorded.spec != now.spec || secrets_changed {
        Changed::Owner
    } else if recorded.template == now.template && recorded.key == now.key {
        Changed::Nobody
    } else {
        Changed::Operator
    }
}

/// The cause a live workload records (`None`: a workload of an operator before this record).
pub fn recorded(meta: &ObjectMeta) -> Option<Cause> {
    meta.annotations
        .as_ref()?
        .get(CAUSE_ANNOTATION)
        .and_then(|annotation| Cause::parse(annotation))
}

/// Sets (or with `None` removes) the cause a desired workload records.
pub fn record(meta: &mut ObjectMeta, cause: Option<&Cause>) {
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    match cause {
        Some(cause) => annotations.insert(CAUSE_ANNOTATION.to_owned(), cause.to_annotation()),
        None => annotations.remove(CAUSE_ANNOTATION),
    };
}

/// What the fleet rollout leaves of a pod template the operator built: the cause its workload records,
/// and, while the instance waits for its turn, the live template it keeps (see
/// `Instance::proxy_fleet` for the proxy's Deployment).
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub cause: Option<Cause>,
    pub template: Option<PodTemplateSpec>,
}

impl Held {
    /// Records the cause on a built workload's `meta`, and puts the kept template in place of `template`.
    pub fn apply(&self, meta: &mut ObjectMeta, template: &mut PodTemplateSpec) {
        record(meta, self.cause.as_ref());
        if let Some(kept) = &self.template {
            *template = kept.clone();
        }
    }
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

    fn cause(spec: &str, template: &str, key: Option<&str>) -> Cause {
        Cause {
            spec: spec.to_owned(),
            template: template.to_owned(),
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn only_what_the_pod_template_reads_is_in_the_specs_hash() {
        let base = spec_hash(&spec(serde_json::json!({"size": 1})));
        let unread = [
            serde_json::json!({"size": 7}),
            serde_json::json!({"size": 1, "proxy": {"enabled": true, "replicas": 3}}),
            serde_json::json!({"size": 1, "service": {"type": "NodePort"}}),
            serde_json::json!({"size": 1, "rollout": {"warmupSeconds": 30}}),
            serde_json::json!({"size": 1, "highAvailability": {"podDisruptionBudget": {"enabled": false}}}),
            serde_json::json!({"size": 1, "highAvailability": {}}),
        ];
        for unread in unread {
            assert_eq!(base, spec_hash(&spec(unread.clone())), "{unread}");
        }
        let read = [
            serde_json::json!({"size": 1, "image": "memcached:1.6.40"}),
            serde_json::json!({"size": 1, "highAvailability": {"terminationGracePeriodSeconds": 60}}),
            serde_json::json!({"size": 1, "memcached": {"maxMemoryMB": 65}}),
        ];
        for read in read {
            assert_ne!(base, spec_hash(&spec(read.clone())), "{read}");
        }
    }

    #[test]
    fn the_proxys_spec_hash_reads_the_proxy_but_not_its_replicas() {
        let base = proxy_spec_hash(&spec(
            serde_json::json!({"size": 1, "proxy": {"enabled": true}}),
        ));
        let unread = serde_json::json!({"size": 3, "proxy": {"enabled": true, "replicas": 4}});
        assert_eq!(base, proxy_spec_hash(&spec(unread)));
        let read = [
            serde_json::json!({"size": 1, "proxy": {"enabled": true, "image": "memcached:1.6.40"}}),
            serde_json::json!({"size": 1, "proxy": {"enabled": true}, "containerPort": 11212}),
        ];
        for read in read {
            assert_ne!(base, proxy_spec_hash(&spec(read.clone())), "{read}");
        }
    }

    #[test]
    fn the_owner_changes_the_spec_or_a_secret_and_the_operator_the_rest() {
        let was = cause("s1", "t1", Some("k1"));
        let same = (Some("h1"), Some("h1"));
        // Nothing the operator builds changed: a different live template is drift.
        assert_eq!(changed(Some(&was), &was, same), Changed::Nobody);
        // A new version of a Secret, under the same key: the owner's.
        assert_eq!(
            changed(Some(&was), &was, (Some("h1"), Some("h2"))),
            Changed::Owner
        );
        // A new template from the same spec: the operator's; so are the same Secrets rekeyed.
        let rebuilt = cause("s1", "t2", Some("k1"));
        assert_eq!(changed(Some(&was), &rebuilt, same), Changed::Operator);
        let rekeyed = cause("s1", "t2", Some("k2"));
        assert_eq!(
            changed(Some(&was), &rekeyed, (Some("h1"), Some("h3"))),
            Changed::Operator
        );
        // A changed spec: the owner's, whatever else changed.
        let respecced = cause("s2", "t2", Some("k2"));
        assert_eq!(
            changed(Some(&was), &respecced, (Some("h1"), Some("h3"))),
            Changed::Owner
        );
        // No record (an earlier build's workload): the operator's.
        assert_eq!(changed(None, &was, same), Changed::Operator);
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

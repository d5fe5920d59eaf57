//! Label selectors of lists and watches, as the `labelSelector` query parameter spells them.
//!
//! Hand-rolled: kube's `Selector` builds and matches selectors but does not parse their text form, and
//! the fake reads that form. Equality (`k=v`, `k==v`), inequality (`k!=v`) and existence (`k`, `!k`) are
//! served; set-based requirements (`in`, `notin`) are refused, so a client that starts using them finds
//! out at once rather than getting every object.

use serde_json::Value;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Missing(String),
}

/// A parsed selector: every requirement must hold. Empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// A selector the fake does not serve.
#[derive(Debug, thiserror::Error)]
#[error("the fake API server does not serve the label selector {0:?}")]
pub struct Unsupported(pub String);

impl Selector {
    /// Parses the text of a `labelSelector` parameter (already percent-decoded).
    pub fn parse(text: &str) -> Result<Self, Unsupported> {
        let unsupported = || Unsupported(text.to_owned());
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
                return Err(unsupported());
            }
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) =
                part.split_once("==").or_else(|| part.split_once('='))
            {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::Missing(key.trim().to_owned())
            } else {
                Requirement::Exists(part.to_owned())
            };
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    /// Whether an object with these `labels` (its `metadata.labels`, or null) is selected.
    pub fn matches(&self, labels: &Value) -> bool {
        let label = |key: &str| labels.get(key).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => label(key) == Some(value.as_str()),
            // As on the API server, an object without the label satisfies `!=`.
            Requirement::NotEquals(key, value) => label(key) != Some(value.as_str()),
            Requirement::Exists(key) => label(key).is_some(),
            Requirement::Missing(key) => label(key).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equality_inequality_and_existence_select_by_label() {
        let managed =
            json!({"app.kubernetes.io/managed-by": "memcached-operator", "tier": "cache"});
        let foreign = json!({"tier": "cache"});
        let by = |text| Selector::parse(text).unwrap();
        assert!(by("app.kubernetes.io/managed-by=memcached-operator").matches(&managed));
        assert!(!by("app.kubernetes.io/managed-by=memcached-operator").matches(&foreign));
        assert!(!by("app.kubernetes.io/managed-by!=memcached-operator").matches(&managed));
        assert!(by("app.kubernetes.io/managed-by!=memcached-operator").matches(&foreign));
        assert!(by("app.kubernetes.io/managed-by!=memcached-operator").matches(&Value::Null));
        assert!(by("tier==cache,!app.kubernetes.io/managed-by").matches(&foreign));
        assert!(!by("tier,!app.kubernetes.io/managed-by").matches(&managed));
        assert!(by("").matches(&Value::Null));
    }

    #[test]
    fn set_based_requirements_are_refused() {
        assert!(Selector::parse("tier in (cache,web)").is_err());
        assert!(Selector::parse("tier notin (web)").is_err());
    }
}

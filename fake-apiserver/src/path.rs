//! A request path taken apart: `/api/v1/namespaces/ns/pods/name/status`, `/apis/apps/v1/deployments`.

/// What a path names: a collection, maybe namespaced, maybe one object of it and its subresource.
#[derive(Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// `v1` for the core group, `group/version` otherwise.
    pub api_version: String,
    pub plural: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

/// The target of `path`, or `None` for a path that names no collection (discovery, anything else).
pub fn parse(path: &str) -> Option<Target<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        rest => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return None,
    };
    Some(Target {
        api_version,
        plural,
        namespace,
        name,
        subresource,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_version_collection_namespace_object_and_subresource() {
        assert_eq!(
            parse("/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds/a/status"),
            Some(Target {
                api_version: "cache.example.com/v1alpha1".into(),
                plural: "memcacheds",
                namespace: Some("ns"),
                name: Some("a"),
                subresource: Some("status")
            })
        );
        assert_eq!(
            parse("/api/v1/pods"),
            Some(Target {
                api_version: "v1".into(),
                plural: "pods",
                namespace: None,
                name: None,
                subresource: None
            })
        );
        assert_eq!(parse("/apis/monitoring.coreos.com/v1"), None);
    }
}

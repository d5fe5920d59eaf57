//! Whether the collector may read an instance's stats over plain TCP with credentials: only when its
//! spec says so (`spec.security.auth.allowPlaintextStats`). Without TLS the operator's credential goes
//! in the clear on the pod network at every read, and anyone who sees it may use that instance's cache
//! as the operator can; so by default such an instance is not read, and says why.

use crate::api::MemcachedSpec;

/// The read result (`memcached_operator_stats_reads_total{result}`) of a pod not read for this reason.
pub const NOT_IN_CLEAR: &str = "not_in_clear";

/// Why the instance of `spec` is not read (a message for the log), or `None` when it may be: with TLS,
/// without auth, or with auth and `allowPlaintextStats`.
pub fn refused(spec: &MemcachedSpec) -> Option<String> {
    let auth = spec.auth()?;
    if spec.tls().is_some() || auth.allow_plaintext_stats {
        return None;
    }
    Some(
        "not reading stats: spec.security.auth without spec.security.tls would send the operator's \
         credential in the clear at every read; set spec.security.tls, or \
         spec.security.auth.allowPlaintextStats: true to read over plain TCP anyway"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> MemcachedSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_auth_without_tls_and_without_the_opt_in_is_refused() {
        let auth = serde_json::json!({"secretName": "auth"});
        let tls = serde_json::json!({"secretName": "tls"});
        assert!(refused(&spec(serde_json::json!({}))).is_none());
        assert!(refused(&spec(serde_json::json!({"security": {"tls": tls}}))).is_none());
        let plain = refused(&spec(serde_json::json!({"security": {"auth": auth}}))).unwrap();
        assert!(plain.contains("allowPlaintextStats"), "{plain}");
        assert!(
            refused(&spec(
                serde_json::json!({"security": {"auth": auth, "tls": tls}})
            ))
            .is_none()
        );
        let opted = serde_json::json!({"secretName": "auth", "allowPlaintextStats": true});
        assert!(refused(&spec(serde_json::json!({"security": {"auth": opted}}))).is_none());
    }
}

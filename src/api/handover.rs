//! How the operator copies items to a server that takes over keys (`spec.handover`).
//!
//! A server the operator starts is empty. Before it takes keys over from another (a replacement during a
//! rollout, a scale-down's drained servers, a scale-up's new one under a declared hashing), the operator
//! can copy the items concerned to it, so clients find them there (see docs/clients.md, "Warm
//! handover"). These fields bound that copy: it may slow the servers' network, and it must never hold a
//! rollout or a scale for long.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The default byte rate of a copy: 64 MiB/s, under a tenth of a 10 Gbit/s link, a 1 GiB cache in 16 s.
pub const DEFAULT_MAX_BYTES_PER_SECOND: i64 = 64 * 1024 * 1024;
/// The default time bound of one copy: a 1 GiB cache at the default rate, with room to spare.
pub const DEFAULT_HANDOVER_TIMEOUT_SECONDS: i32 = 120;

/// Copying items to servers that take keys over (`spec.handover`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmHandover {
    /// Whether the operator copies items to a server that takes keys over: a rollout's new server gets
    /// the items of the server it replaces before it is published (a Deployment's straight from the old
    /// server; a StatefulSet's through a spare server, `<name>-handover`, that the operator runs while the
    /// rollout lasts); under a declared `spec.clients.hashing`, a scale's items that change server are
    /// copied to their new owner (a scale-down's before its drained pods go, a scale-up's before its new
    /// servers are published); scaling with `hashing: unknown` starts its new servers empty. `false`
    /// leaves every new server empty, as before handovers existed, and runs no spare server; a new pod
    /// already waiting behind the
    /// handover readiness gate then has the gate opened at once, without a copy. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// The most bytes of item values one copy sends per second (each copy is one source server to one
    /// target server). Default 67108864 (64 MiB/s); at least 65536.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65536, max = 10737418240_i64))]
    pub max_bytes_per_second: Option<i64>,

    /// The most seconds one copy may take. A copy that is not done by then stops where it is (the items
    /// copied stay) and the change it was for proceeds with the rest cold. Default 120; the operator
    /// caps it (`--handover-max-timeout-seconds`, default 600), as it ends a copy whose source sends
    /// under 64 KiB in 30 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<i32>,
}

impl WarmHandover {
    /// `enabled`, or its default, true.
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// `maxBytesPerSecond`, or its default.
    pub fn max_bytes_per_second(&self) -> u64 {
        let rate = self
            .max_bytes_per_second
            .unwrap_or(DEFAULT_MAX_BYTES_PER_SECOND);
        u64::try_from(rate).unwrap_or(1)
    }

    /// `timeoutSeconds`, or its default.
    pub fn timeout_seconds(&self) -> u64 {
        let seconds = self
            .timeout_seconds
            .unwrap_or(DEFAULT_HANDOVER_TIMEOUT_SECONDS);
        u64::try_from(seconds).unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use crate::api::MemcachedSpec;

    #[test]
    fn an_absent_section_is_enabled_with_the_defaults() {
        let spec: MemcachedSpec = serde_json::from_str(r#"{"size": 3}"#).unwrap();
        let handover = spec.handover();
        assert!(handover.enabled());
        assert_eq!(handover.max_bytes_per_second(), 64 * 1024 * 1024);
        assert_eq!(handover.timeout_seconds(), 120);
    }

    #[test]
    fn set_fields_are_camel_case_and_kept() {
        let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({"handover": {
            "enabled": false, "maxBytesPerSecond": 1048576, "timeoutSeconds": 30
        }}))
        .unwrap();
        let handover = spec.handover();
        assert!(!handover.enabled());
        assert_eq!(handover.max_bytes_per_second(), 1_048_576);
        assert_eq!(handover.timeout_seconds(), 30);
    }
}

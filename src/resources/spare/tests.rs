use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, PodAntiAffinity};

use super::*;
use crate::api::{MemcachedSpec, Workload};
use crate::handover::plan::rollout::{GATE, add_template_gate, has_gate};
use crate::resources::testing::memcached;
use crate::resources::{Defaults, pod};

#[test]
fn the_spare_runs_the_new_template_but_is_no_server() {
    let mc = memcached(
        "cache",
        MemcachedSpec {
            size: 3,
            workload: Workload::StatefulSet,
            ..MemcachedSpec::default()
        },
    );
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).unwrap();
    let mut template = pod::template(&instance, Some("hash"));
    add_template_gate(&mut template);
    let spec = template.spec.as_mut().unwrap();
    spec.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity::default()),
        pod_anti_affinity: Some(PodAntiAffinity::default()),
        ..Affinity::default()
    });
    let built = spare(&instance, &template);

    assert_eq!(built.metadata.name.as_deref(), Some("cache-handover"));
    let labels = built.metadata.labels.clone().unwrap();
    assert!(is_spare(&labels));
    // Not selected by the Services, the PodDisruptionBudget or the StatefulSet (all select these).
    let selected = labels::selector_labels("cache")
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    assert!(!selected, "{labels:?}");
    assert_eq!(
        labels.get(labels::MANAGED_BY_KEY).map(String::as_str),
        Some(labels::MANAGER_NAME),
        "within the operator's pod watch"
    );
    assert_eq!(
        labels.get(labels::INSTANCE_KEY).map(String::as_str),
        Some("cache")
    );
    let owner = &built.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Memcached", Some(true))
    );
    assert_eq!(
        built.metadata.annotations,
        template.metadata.as_ref().unwrap().annotations,
        "the Secrets' hash, as the new servers"
    );

    let spec = built.spec.unwrap();
    let wanted = template.spec.as_ref().unwrap();
    assert_eq!(
        spec.containers, wanted.containers,
        "the new servers' memcached"
    );
    assert_eq!(spec.volumes, wanted.volumes, "their TLS and auth files");
    assert!(spec.readiness_gates.is_none(), "no gate: nothing opens it");
    let affinity = spec.affinity.unwrap();
    assert!(
        affinity.pod_anti_affinity.is_none(),
        "it is not spread with the servers"
    );
    assert!(
        affinity.node_affinity.is_some(),
        "it runs where servers may"
    );
    assert!(has_gate(&template), "the template itself is left as it was");
    assert!(
        !serde_json::to_string(&spec.readiness_gates)
            .unwrap()
            .contains(GATE)
    );
}

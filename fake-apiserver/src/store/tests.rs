use super::*;
use std::sync::{Arc, Mutex};

/// A store serving two kinds of children besides its own collections.
fn store() -> Store {
    Store::serving(&[
        Collection::new("apps/v1", "deployments", "Deployment"),
        Collection::new("v1", "services", "Service"),
    ])
}

fn all() -> WatchFilter {
    WatchFilter {
        namespace: None,
        selector: Selector::default(),
        metadata_only: false,
    }
}

#[test]
fn writes_bump_versions_and_generations_and_unchanged_writes_are_no_ops() {
    let mut store = store();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    store.on_change(Box::new(move |change| {
        log.lock().unwrap().push((change.kind, change.spec_changed));
    }));
    let created = store
        .create(
            "deployments",
            json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"replicas": 1}}),
        )
        .unwrap();
    assert_eq!(created["metadata"]["generation"], 1);
    let same = store.update("deployments", created.clone()).unwrap();
    assert_eq!(same, created, "nothing changed");
    let scaled = store
        .modify("deployments", "ns", "a", |d| {
            d["spec"]["replicas"] = json!(2)
        })
        .unwrap();
    assert_eq!(scaled["metadata"]["generation"], 2);
    let status = store
        .modify("deployments", "ns", "a", |d| {
            d["status"] = json!({"replicas": 2})
        })
        .unwrap();
    assert_eq!(status["metadata"]["generation"], 2, "a status is no spec");
    store.delete("deployments", "ns", "a");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (ChangeKind::Added, true),
            (ChangeKind::Modified, true),
            (ChangeKind::Modified, false),
            (ChangeKind::Deleted, false)
        ]
    );
    let (lines, _) = store.changes_after("deployments", 0, &all()).unwrap();
    let types: Vec<String> = std::str::from_utf8(&lines)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].to_string())
        .collect();
    assert_eq!(
        types,
        ["\"ADDED\"", "\"MODIFIED\"", "\"MODIFIED\"", "\"DELETED\""]
    );
}

#[test]
fn lists_and_watches_keep_to_their_namespace_and_selector() {
    let mut store = store();
    for (ns, name, managed) in [("a", "x", true), ("a", "y", false), ("b", "z", true)] {
        let labels = if managed {
            json!({"app.kubernetes.io/managed-by": "memcached-operator"})
        } else {
            json!({})
        };
        store
            .create(
                "services",
                json!({"metadata": {"name": name, "namespace": ns, "labels": labels}}),
            )
            .unwrap();
    }
    let managed = Selector::parse("app.kubernetes.io/managed-by=memcached-operator").unwrap();
    let list = store.list("services", Some("a"), &managed, true).unwrap();
    let names: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["metadata"]["name"])
        .collect();
    assert_eq!(names, [&json!("x")]);
    assert_eq!(list["items"][0]["kind"], "PartialObjectMetadata");
    let filter = WatchFilter {
        namespace: Some("a".into()),
        selector: Selector::parse("app.kubernetes.io/managed-by!=memcached-operator").unwrap(),
        metadata_only: false,
    };
    let (lines, _) = store.changes_after("services", 0, &filter).unwrap();
    let text = std::str::from_utf8(&lines).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"y\""), "{text}");
}

#[test]
fn an_object_being_deleted_goes_with_its_last_finalizer() {
    let mut store = store();
    store
        .create(
            "memcacheds",
            json!({"metadata": {"name": "a", "namespace": "ns", "finalizers": ["f"],
                                "deletionTimestamp": TIMESTAMP}}),
        )
        .unwrap();
    store
        .modify("memcacheds", "ns", "a", |mc| {
            mc["metadata"]["finalizers"] = json!([]);
        })
        .unwrap();
    assert!(store.get("memcacheds", "ns", "a").is_none());
}

#[test]
fn a_restart_expires_every_version_handed_out() {
    let mut store = store();
    let before = store
        .create(
            "pods",
            json!({"metadata": {"name": "p", "namespace": "ns"}}),
        )
        .unwrap();
    let rv: u64 = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(store.expired(rv).is_none());
    store.expire_versions();
    assert!(store.expired(rv).is_some());
}

/// A CRD's collection is served only once its CRD is installed, and its group's discovery lists it then.
#[test]
fn a_crds_collection_is_served_only_where_installed() {
    let crd = Collection::new(
        "monitoring.coreos.com/v1",
        "servicemonitors",
        "ServiceMonitor",
    )
    .of_crd(true);
    let mut store = Store::serving(&[crd]);
    assert!(!store.serves(&crd));
    assert!(store.served_in("monitoring.coreos.com/v1").is_empty());
    store.settings.installed = vec!["servicemonitors"];
    assert!(store.serves(&crd));
    assert_eq!(store.served_in("monitoring.coreos.com/v1"), [crd]);
}

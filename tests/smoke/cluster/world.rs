//! The cluster as the operator finds it when it starts: the objects the fake API server holds then, and
//! which of its lists are slow.

use std::time::Duration;

use fake_apiserver::Fake;
use serde_json::{Value, json};

/// The objects the fake holds at the start, and how slowly it lists them.
#[derive(Clone)]
pub struct World {
    pub memcacheds: Vec<Value>,
    /// Children of any kind of the operator's table, each stored in the collection of its `apiVersion`
    /// and `kind`.
    pub children: Vec<Value>,
    pub pods: Vec<Value>,
    /// Full Secrets: the operator lists and watches them metadata-only, and gets them whole by name.
    pub secrets: Vec<Value>,
    /// The kinds of CRDs the cluster serves, by plural (a kind of the operator's table that the cluster
    /// may not serve is served only when named here).
    pub installed: Vec<&'static str>,
    /// List paths answered only after this delay, as a large list or a busy API server would be.
    pub slow_lists: Vec<(&'static str, Duration)>,
}

impl Default for World {
    /// One instance and nothing else: the operator has never run.
    fn default() -> Self {
        Self {
            memcacheds: vec![memcached()],
            children: vec![],
            pods: vec![],
            secrets: vec![],
            installed: vec![],
            slow_lists: vec![],
        }
    }
}

impl World {
    /// Stores every object in `fake` (each keeps the uid, generation and creation time it has; the
    /// store gives it a resource version) and makes its slow lists slow.
    pub fn seed(self, fake: &Fake) {
        let mut store = fake.store();
        for child in self.children {
            let text = |field: &str| child[field].as_str().unwrap_or_default().to_owned();
            let (api_version, kind) = (text("apiVersion"), text("kind"));
            let collection = store
                .find_kind(&api_version, &kind)
                .unwrap_or_else(|| panic!("the fake serves no {api_version} {kind}"));
            store
                .create(collection.plural, child)
                .unwrap_or_else(|e| panic!("cannot seed a {kind}: {e}"));
        }
        let collections = [
            ("memcacheds", self.memcacheds),
            ("pods", self.pods),
            ("secrets", self.secrets),
        ];
        for (plural, objects) in collections {
            for obj in objects {
                store
                    .create(plural, obj)
                    .unwrap_or_else(|e| panic!("cannot seed {plural}: {e}"));
            }
        }
        drop(store);
        for (path, delay) in self.slow_lists {
            fake.slow_list(path, delay);
        }
    }
}

/// The instance of most tests.
pub fn memcached() -> Value {
    memcached_named("cache", "uid-1")
}

/// An existing instance: 2 memcached pods on port 11211.
pub fn memcached_named(name: &str, uid: &str) -> Value {
    json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "Memcached",
        "metadata": {
            "name": name, "namespace": "default", "uid": uid, "generation": 1,
            "resourceVersion": "1", "creationTimestamp": "2024-01-01T00:00:00Z"
        },
        "spec": {"size": 2, "containerPort": 11211}
    })
}

/// The finalizer earlier builds of the operator put on every instance.
pub const LEGACY_FINALIZER: &str = "cache.example.com/finalizer";

/// `mc` as an earlier build of the operator left it: carrying its finalizer.
pub fn with_legacy_finalizer(mut mc: Value) -> Value {
    mc["metadata"]["finalizers"] = json!([LEGACY_FINALIZER]);
    mc
}

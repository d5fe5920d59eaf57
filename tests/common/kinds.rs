//! The table of child kinds (`memcached_operator::store::kinds`) as the test fakes need it: the
//! collections the fake API server serves for them, and their paths in [`NS`]. Nothing here names a kind:
//! a new entry in the table reaches every fake, mock and path through these.

use fake_apiserver::collections::Collection;
use memcached_operator::store::{ChildKind, EachKind, Served, each_kind, kind_names};

use super::scripted::NS;

/// The fake API server's collection of each kind of child, in the table's order: a kind the cluster may
/// not serve is a CRD's, served only where the fake is told it is installed.
pub fn collections() -> Vec<Collection> {
    kind_names()
        .into_iter()
        .map(|k| {
            Collection::new(k.api_version, k.plural, k.kind).of_crd(k.served == Served::IfInstalled)
        })
        .collect()
}

/// The path of the collection of kind `K` in [`NS`]: where it is listed, watched and created.
pub fn collection_path<K: ChildKind>() -> &'static str {
    K::url_path(&(), Some(NS)).leak()
}

/// The path of the object `name` of kind `K` in [`NS`].
pub fn object_path<K: ChildKind>(name: &str) -> &'static str {
    format!("{}/{name}", K::url_path(&(), Some(NS))).leak()
}

/// The path of the collection of each kind of child every cluster serves in [`NS`], in the table's order:
/// a CRD's kind ([`Served::IfInstalled`]) is left out, as a cluster without its CRD never lists it.
pub fn collection_paths() -> Vec<&'static str> {
    struct Paths(Vec<&'static str>);
    impl EachKind for Paths {
        fn kind<K: ChildKind>(&mut self) {
            if K::SERVED == Served::Always {
                self.0.push(collection_path::<K>());
            }
        }
    }
    let mut paths = Paths(Vec::new());
    each_kind(&mut paths);
    paths.0
}

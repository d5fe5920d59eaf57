//! The fake serves every kind of child in the operator's table (`store::kinds`). The fake is
//! kind-agnostic JSON and links no operator code (the bench uses it without linking the operator), so
//! its list of collections is checked against the table here instead of derived from it: a new kind of
//! child that the fake does not serve fails this test, not a smoke scenario's 404.

use memcached_operator::store::{ChildKind, EachKind, each_kind};

struct Unserved(Vec<String>);

impl EachKind for Unserved {
    fn kind<K: ChildKind>(&mut self) {
        let served = fake_apiserver::collections::find(K::API_VERSION, K::URL_PATH_SEGMENT)
            .is_some_and(|c| c.kind == K::KIND);
        if !served {
            self.0
                .push(format!("{} {}", K::API_VERSION, K::URL_PATH_SEGMENT));
        }
    }
}

#[test]
fn the_fake_serves_every_kind_of_child() {
    let mut unserved = Unserved(Vec::new());
    each_kind(&mut unserved);
    assert!(
        unserved.0.is_empty(),
        "add to fake-apiserver/src/collections.rs: {:?}",
        unserved.0
    );
}

use super::*;

/// A self-signed CA certificate (PEM) with common name `name`.
fn ca(name: &str) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().pem()
}

fn identity(name: &str, prefixes: &[&str]) -> RouteIdentity {
    RouteIdentity {
        name: name.to_owned(),
        common_name: format!("{name}.clients"),
        prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        read_only: false,
    }
}

#[test]
fn a_bundle_keeps_its_certificates_only_reencoded_and_fingerprinted() {
    let (one, two) = (ca("one"), ca("two"));
    let bundle = format!("# comment\n{one}\nsome text\n{two}");
    let parsed = ClientCa::parse(bundle.as_bytes()).unwrap();
    assert_eq!(parsed.fingerprints.len(), 2);
    assert!(!parsed.pem.contains("comment") && !parsed.pem.contains("text"));
    assert_eq!(parsed.pem.matches("BEGIN CERTIFICATE").count(), 2);
    // The re-encoded bundle parses to the same certificates.
    assert_eq!(ClientCa::parse(parsed.pem.as_bytes()).unwrap(), parsed);
}

#[test]
fn bad_bundles_are_refused_with_a_reason() {
    assert_eq!(ClientCa::parse(b"hello"), Err(CaError::Empty));
    let broken = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
    assert_eq!(ClientCa::parse(broken.as_bytes()), Err(CaError::NotPem(1)));
    let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
    assert_eq!(ClientCa::parse(not_der.as_bytes()), Err(CaError::NotCa(1)));
    let open = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n";
    assert_eq!(ClientCa::parse(open.as_bytes()), Err(CaError::NotPem(1)));
    let big = vec![b'a'; MAX_CA_BYTES + 1];
    assert_eq!(
        ClientCa::parse(&big),
        Err(CaError::TooLarge(MAX_CA_BYTES + 1))
    );
}

#[test]
fn the_epoch_stays_while_cas_are_added_and_changes_when_one_leaves() {
    let (one, two) = (ca("one"), ca("two"));
    let first = ClientCa::parse(one.as_bytes()).unwrap();
    let both = ClientCa::parse(format!("{one}{two}").as_bytes()).unwrap();
    let second = ClientCa::parse(two.as_bytes()).unwrap();

    let start = trust(None, &first);
    assert_eq!(start.trusted, first.fingerprints.join(","));
    // Adding a CA: the running pods load it on SIGHUP, same epoch.
    let added = trust(Some((&start.trusted, &start.epoch)), &both);
    assert_eq!(added.epoch, start.epoch);
    assert_eq!(added.trusted, both.fingerprints.join(","));
    // Level-based: the same answer again.
    assert_eq!(trust(Some((&added.trusted, &added.epoch)), &both), added);
    // Removing the old one: a new epoch, which replaces the pods.
    let removed = trust(Some((&added.trusted, &added.epoch)), &second);
    assert_ne!(removed.epoch, added.epoch);
    assert_eq!(removed.trusted, second.fingerprints.join(","));
    assert_eq!(
        trust(Some((&removed.trusted, &removed.epoch)), &second),
        removed
    );
    // A Deployment without the annotations (made before access was on): an epoch from the bundle.
    assert_eq!(trust(Some(("", "")), &first).epoch, start.epoch);
}

#[test]
fn route_access_is_checked_as_the_schema_bounds_it() {
    let ca = ClientCa::parse(ca("one").as_bytes()).unwrap();
    let good = RouteAccess {
        epoch: "0123abcd".to_owned(),
        client_ca: ca.pem.clone(),
        identities: vec![
            identity("orders", &["orders:"]),
            identity("reports", &["r:"]),
        ],
    };
    assert_eq!(good.check(), Ok(()));
    let with = |change: &dyn Fn(&mut RouteAccess)| {
        let mut access = good.clone();
        change(&mut access);
        access.check()
    };
    assert!(with(&|a| a.epoch = "x".to_owned()).is_err());
    assert!(with(&|a| a.client_ca = "nope".to_owned()).is_err());
    assert!(with(&|a| a.identities.clear()).is_err());
    assert!(with(&|a| a.identities[1].name = "orders".to_owned()).is_err());
    assert!(with(&|a| a.identities[1].common_name = "orders.clients".to_owned()).is_err());
    assert!(with(&|a| a.identities[0].name = "Orders".to_owned()).is_err());
    assert!(with(&|a| a.identities[0].common_name = "a\nb".to_owned()).is_err());
    assert!(with(&|a| a.identities[0].prefixes = vec!["a b".to_owned()]).is_err());
    assert!(with(&|a| a.identities[0].prefixes = vec![String::new()]).is_err());
    assert!(with(&|a| a.identities[0].prefixes = vec!["p".to_owned(); 9]).is_err());
    assert!(with(&|a| a.identities = vec![identity("a", &["a"]); 33]).is_err());
}

#[test]
fn routes_quote_every_value_and_tag_the_client_listener() {
    let ca = ClientCa::parse(ca("one").as_bytes()).unwrap();
    let mut reader = identity("reports", &["orders:", "r\"x"]);
    reader.read_only = true;
    reader.common_name = "CN with \"quote\"".to_owned();
    let access = RouteAccess {
        epoch: "ab".to_owned(),
        client_ca: ca.pem,
        identities: vec![reader],
    };
    let quote = |s: &str| format!("<{s}>");
    let lua = render_routes(&access, "route_null{}", quote);
    assert_eq!(
        lua,
        "routes{\n    tag = <client>,\n    default = route_access{\n        identities = {\n            \
         [<CN with \"quote\">] = { name = <reports>, prefixes = { <orders:>, <r\"x> }, read_only = \
         true },\n        },\n        child = route_null{},\n    },\n}\n"
    );
}

#[test]
fn the_library_tags_what_the_routes_tag() {
    assert!(LIBRARY.contains(&format!("local CLIENT <const> = \"{CLIENT_TAG}\"")));
    assert!(LIBRARY.contains("register_route_handlers({ \"access\" })"));
}

#[test]
fn the_library_publishes_requests_as_often_as_documented() {
    assert!(LIBRARY.contains(&format!("local PUBLISH_EVERY <const> = {PUBLISH_EVERY}\n")));
}

#[test]
fn a_deployment_records_its_trust_on_itself_and_its_epoch_on_its_pods() {
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"annotations": {TRUSTED_ANNOTATION: "a,b"}},
        "spec": {
            "selector": {},
            "template": {"metadata": {"annotations": {EPOCH_ANNOTATION: "e1"}}}
        }
    }))
    .expect("a Deployment");
    assert_eq!(recorded(&deployment), ("a,b".to_owned(), "e1".to_owned()));
    assert_eq!(
        recorded(&Deployment::default()),
        (String::new(), String::new())
    );
}

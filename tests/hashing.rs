//! Every `spec.clients.hashing` scheme against the placements real client libraries chose
//! (tests/fixtures/hashing/*.json, written by hack/hashing-vectors.py):
//!
//! - `ketama` and `modula`: pylibmc 1.6.3 over Debian's libmemcached 1.1.4 (libmemcached11 1.1.4-1);
//! - `rendezvous`: pymemcache 4.0.0's HashClient;
//! - `jump`: jump-consistent-hash 3.6.0 (its C extension).
//!
//! Each fixture names the library and settings that produced it; one differing pick fails the test and
//! names the key, the list and both choices.

use std::path::Path;

use memcached_operator::hashing::{Placement, Scheme};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    scheme: String,
    library: String,
    keys: Vec<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    servers: Vec<String>,
    picks: Vec<usize>,
}

fn load(name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hashing")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("fixture keys are hex"))
        .collect()
}

/// Checks every pick of the fixture and returns how many were checked.
fn check(name: &str, scheme: Scheme) -> usize {
    let fixture = load(name);
    assert_eq!(fixture.scheme, name);
    let keys: Vec<Vec<u8>> = fixture.keys.iter().map(|k| unhex(k)).collect();
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for case in &fixture.cases {
        assert_eq!(case.picks.len(), keys.len(), "{name}: {:?}", case.servers);
        let placement = Placement::new(scheme, &case.servers).expect("published entries");
        for (key, &expected) in keys.iter().zip(&case.picks) {
            let got = placement.server(key);
            if got != Some(expected) {
                mismatches.push(format!(
                    "key {} over {:?}: {} chose {expected}, we chose {got:?}",
                    String::from_utf8_lossy(key),
                    case.servers,
                    fixture.library
                ));
            }
            checked += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {checked} picks differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    checked
}

/// Each fixture covers lists of 1, 3, 4 and 5 servers with at least 150 keys each.
fn assert_covers(checked: usize, name: &str) {
    let fixture = load(name);
    let sizes: Vec<usize> = fixture.cases.iter().map(|c| c.servers.len()).collect();
    for size in [1, 3, 4, 5] {
        assert!(sizes.contains(&size), "{name}: no list of {size}");
    }
    assert!(
        fixture.keys.len() >= 150,
        "{name}: {} keys",
        fixture.keys.len()
    );
    assert_eq!(checked, fixture.keys.len() * fixture.cases.len());
}

#[test]
fn ketama_places_keys_as_libmemcached_ketama_weighted() {
    let checked = check("ketama", Scheme::Ketama);
    assert_covers(checked, "ketama");
}

#[test]
fn modula_places_keys_as_libmemcached_default() {
    let checked = check("modula", Scheme::Modula);
    assert_covers(checked, "modula");
}

#[test]
fn rendezvous_places_keys_as_pymemcache_hash_client() {
    let checked = check("rendezvous", Scheme::Rendezvous);
    assert_covers(checked, "rendezvous");
}

#[test]
fn jump_places_keys_as_jump_consistent_hash_over_md5() {
    let checked = check("jump", Scheme::Jump);
    assert_covers(checked, "jump");
}

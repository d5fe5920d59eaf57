use super::*;
use crate::hashing::Placement;

const SCHEMES: [Scheme; 4] = [
    Scheme::Ketama,
    Scheme::Rendezvous,
    Scheme::Jump,
    Scheme::Modula,
];

/// Pod IPs as a Deployment publishes them.
fn list(ips: &[u8]) -> Vec<String> {
    ips.iter().map(|i| format!("10.244.1.{i}:11211")).collect()
}

fn keys() -> impl Iterator<Item = String> {
    (0..10_000).map(|i| format!("user:{i}:profile"))
}

/// Checks `copies` against every key: a key whose server changes from `old` to `new` is taken by exactly
/// one copy, from its owner under `old` to its owner under `new`, and a key that stays by none. Returns
/// the keys that move and those no copy takes to their new owner.
fn uncovered(scheme: Scheme, old: &[String], new: &[String], copies: &[Copy]) -> (usize, usize) {
    let (before, after) = (
        Placement::new(scheme, old).unwrap(),
        Placement::new(scheme, new).unwrap(),
    );
    let (mut moving, mut missed) = (0, 0);
    for key in keys() {
        let key = key.as_bytes();
        let (from, to) = (before.server(key).unwrap(), after.server(key).unwrap());
        let taken: Vec<Pair> = copies
            .iter()
            .filter(|c| c.filter.as_ref().is_none_or(|f| f(key)))
            .map(|c| c.pair)
            .collect();
        if old[from] == new[to] {
            assert!(
                taken.iter().all(|p| p.source != from),
                "{scheme:?}: a key that stays on {} is copied: {taken:?}",
                old[from]
            );
            continue;
        }
        moving += 1;
        let expected = Pair {
            source: from,
            target: to,
        };
        if !taken.contains(&expected) {
            missed += 1;
        }
        assert!(
            taken.iter().filter(|p| p.source == from).count() <= 1,
            "{scheme:?}: a key taken twice from its owner: {taken:?}"
        );
    }
    (moving, missed)
}

/// Every key that changes server is planned to be copied to its new owner from its old one.
fn assert_covered(scheme: Scheme, old: &[String], new: &[String]) -> usize {
    let copies = copies(Some(scheme), old, new).unwrap();
    let (moving, missed) = uncovered(scheme, old, new, &copies);
    assert_eq!(
        missed, 0,
        "{scheme:?} {old:?} -> {new:?}: {missed} of {moving} keys not copied"
    );
    moving
}

#[test]
fn a_deployment_rollout_under_every_hashing_copies_every_moving_key_to_its_new_owner() {
    let old = list(&[1, 2, 3, 4]);
    for scheme in SCHEMES {
        for slot in 0..4 {
            let mut new = old.clone();
            new[slot] = "10.244.2.9:11211".into();
            let moving = assert_covered(scheme, &old, &new);
            assert!(moving > 1000, "{scheme:?}: the replaced server's keys move");
        }
    }
}

#[test]
fn under_ketama_and_rendezvous_a_rollout_moves_keys_between_the_other_servers_too() {
    let old = list(&[1, 2, 3, 4]);
    let mut new = old.clone();
    new[1] = "10.244.2.9:11211".into();
    for scheme in [Scheme::Ketama, Scheme::Rendezvous] {
        let copies = copies(Some(scheme), &old, &new).unwrap();
        let pairs: Vec<Pair> = copies.iter().map(|c| c.pair).collect();
        // From the replaced server to the others, and from every server to the new one.
        for other in [0, 2, 3] {
            assert!(pairs.contains(&Pair {
                source: 1,
                target: other
            }));
            assert!(pairs.contains(&Pair {
                source: other,
                target: 1
            }));
        }
        assert!(pairs.contains(&Pair {
            source: 1,
            target: 1
        }));
        assert_eq!(
            pairs.len(),
            7,
            "{scheme:?}: no pair between servers that both stay"
        );
        assert!(copies.iter().all(|c| c.filter.is_some()));
    }
}

/// What a rollout copied before this planner: the replaced server's every item to its new server at the
/// same slot, and nothing else. Under ketama and rendezvous it leaves most moving keys cold.
#[test]
fn the_slot_to_slot_copy_misses_keys_under_ketama_and_rendezvous_only() {
    let old = list(&[1, 2, 3, 4]);
    let mut new = old.clone();
    new[2] = "10.244.2.9:11211".into();
    let slot_to_slot = [Copy {
        pair: Pair {
            source: 2,
            target: 2,
        },
        filter: None,
    }];
    for scheme in [Scheme::Ketama, Scheme::Rendezvous] {
        let (moving, missed) = uncovered(scheme, &old, &new, &slot_to_slot);
        assert!(
            missed * 2 > moving,
            "{scheme:?}: slot to slot missed {missed} of {moving}"
        );
        assert_covered(scheme, &old, &new);
    }
    for scheme in [Scheme::Jump, Scheme::Modula] {
        let (_, missed) = uncovered(scheme, &old, &new, &slot_to_slot);
        assert_eq!(missed, 0, "{scheme:?}: slot order keeps keys at their slot");
        assert_eq!(
            pairs(Some(scheme), &old, &new),
            [Pair {
                source: 2,
                target: 2
            }]
        );
    }
}

#[test]
fn scales_under_every_hashing_copy_every_moving_key_to_its_new_owner() {
    for scheme in SCHEMES {
        // Scale-up 3 -> 5, scale-down 5 -> 3 (ketama across its rounding size: `scale` tests).
        assert_covered(scheme, &list(&[1, 2, 3]), &list(&[1, 2, 3, 4, 5]));
        assert_covered(scheme, &list(&[1, 2, 3, 4, 5]), &list(&[1, 2, 3]));
    }
}

#[test]
fn a_replaced_pod_and_a_scale_at_once_copy_every_moving_key() {
    for scheme in SCHEMES {
        // Scale-up 3 -> 4 while slot 1's pod was replaced.
        assert_covered(scheme, &list(&[1, 2, 3]), &list(&[1, 9, 3, 4]));
        // Scale-down 4 -> 3 while slot 0's pod was replaced.
        assert_covered(scheme, &list(&[1, 2, 3, 4]), &list(&[9, 2, 3]));
        // Two pods replaced at once.
        assert_covered(scheme, &list(&[1, 2, 3, 4]), &list(&[8, 2, 9, 4]));
    }
}

#[test]
fn without_a_declared_hashing_a_replaced_slot_hands_over_every_item_and_a_scale_nothing() {
    let old = list(&[1, 2, 3, 4]);
    let mut new = old.clone();
    new[3] = "10.244.2.9:11211".into();
    let planned = copies(None, &old, &new).unwrap();
    assert_eq!(planned.len(), 1);
    assert_eq!(
        planned[0].pair,
        Pair {
            source: 3,
            target: 3
        }
    );
    assert!(planned[0].filter.is_none(), "every item of the slot");
    assert!(
        copies(None, &old, &list(&[1, 2, 3, 4, 5]))
            .unwrap()
            .is_empty()
    );
    assert!(copies(None, &old, &list(&[1, 2, 3])).unwrap().is_empty());
    assert!(copies(None, &old, &old).unwrap().is_empty());
}

#[test]
fn an_unchanged_list_needs_no_copy_under_any_hashing() {
    let old = list(&[1, 2, 3]);
    for scheme in SCHEMES {
        assert!(copies(Some(scheme), &old, &old).unwrap().is_empty());
    }
}

#[test]
fn an_entry_that_is_not_host_and_port_is_refused() {
    let bad = vec!["no-port".to_owned(), "10.0.0.1:11211".to_owned()];
    assert!(copies(Some(Scheme::Ketama), &list(&[1, 2]), &bad).is_err());
}

use super::*;
use crate::handover::KeyFilter;
use crate::handover::plan::filter;
use crate::hashing::Placement;
use k8s_openapi::jiff::Timestamp;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn entries(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.0.0.{}:11211", i + 1)).collect()
}

fn servers(n: usize, published: usize) -> Vec<Server> {
    (0..n)
        .map(|i| Server {
            slot: i as i32,
            pod: Some(format!("pod-{i}")),
            address: (i < published).then(|| format!("10.0.0.{}:11211", i + 1)),
            ready: true,
        })
        .collect()
}

fn change(scheme: Scheme, old: usize, new: usize) -> Change {
    Change {
        direction: if new < old {
            Direction::Down
        } else {
            Direction::Up
        },
        scheme,
        old: entries(old),
        new: entries(new),
        new_slots: (0..new as i32).collect(),
        started: None,
    }
}

fn pair(source: usize, target: usize) -> Pair {
    Pair { source, target }
}

#[test]
fn a_consistent_scale_down_copies_from_the_removed_servers_only() {
    for scheme in [Scheme::Jump, Scheme::Rendezvous, Scheme::Ketama] {
        let pairs = change(scheme, 4, 3).pairs();
        assert_eq!(pairs, [pair(3, 0), pair(3, 1), pair(3, 2)], "{scheme:?}");
    }
}

#[test]
fn a_consistent_scale_up_copies_to_the_added_servers_only() {
    for scheme in [Scheme::Jump, Scheme::Rendezvous, Scheme::Ketama] {
        let pairs = change(scheme, 3, 5).pairs();
        let expected: Vec<Pair> = (0..3).flat_map(|s| [pair(s, 3), pair(s, 4)]).collect();
        assert_eq!(pairs, expected, "{scheme:?}");
    }
}

#[test]
fn modula_and_ketama_across_a_rounding_size_copy_between_every_two_servers() {
    assert_eq!(change(Scheme::Modula, 4, 3).pairs().len(), 4 * 3 - 3);
    assert_eq!(change(Scheme::Modula, 3, 5).pairs().len(), 3 * 5 - 3);
    // 25 servers have 156 points each, 24 have 160: every server's points move.
    assert_eq!(change(Scheme::Ketama, 25, 24).pairs().len(), 25 * 24 - 24);
}

/// Every key that changes owner is selected by exactly one pair's filter, and a key that stays by none:
/// the pairs the pruning leaves out hold no key.
#[test]
fn each_moving_key_is_taken_by_exactly_one_copy() {
    let schemes = [
        Scheme::Jump,
        Scheme::Rendezvous,
        Scheme::Ketama,
        Scheme::Modula,
    ];
    for scheme in schemes {
        for (old, new) in [(4, 3), (3, 5), (5, 1), (1, 3), (24, 25)] {
            let change = change(scheme, old, new);
            let handover = change.handover().unwrap();
            let filters: Vec<(Pair, KeyFilter)> = change
                .pairs()
                .into_iter()
                .map(|p| (p, filter(handover.clone(), p)))
                .collect();
            let before = Placement::new(scheme, &change.old).unwrap();
            let after = Placement::new(scheme, &change.new).unwrap();
            for i in 0..2000 {
                let key = format!("key:{i}");
                let (from, to) = (
                    before.server(key.as_bytes()).unwrap(),
                    after.server(key.as_bytes()).unwrap(),
                );
                let taken: Vec<Pair> = filters
                    .iter()
                    .filter(|(_, f)| f(key.as_bytes()))
                    .map(|(p, _)| *p)
                    .collect();
                if change.old[from] == change.new[to] {
                    assert!(taken.is_empty(), "{scheme:?} {old}->{new} {key}");
                } else {
                    assert_eq!(taken, [pair(from, to)], "{scheme:?} {old}->{new} {key}");
                }
            }
        }
    }
}

#[test]
fn a_replaced_entry_at_the_same_jump_slot_is_a_pair() {
    let mut change = change(Scheme::Jump, 3, 3);
    change.new[1] = "10.0.9.9:11211".into();
    assert_eq!(change.pairs(), [pair(1, 1)]);
}

#[test]
fn a_scale_down_needs_a_declared_hashing_and_the_recorded_list() {
    let drain = Drain {
        from_size: 4,
        to_size: 3,
        started_at: at(0),
        servers: entries(4),
    };
    let now = servers(3, 3);
    assert_eq!(
        scale_down(None, Some(&drain), &now),
        None,
        "unknown hashing"
    );
    let unrecorded = Drain {
        servers: Vec::new(),
        ..drain.clone()
    };
    assert_eq!(
        scale_down(Some(Scheme::Jump), Some(&unrecorded), &now),
        None
    );
    let change = scale_down(Some(Scheme::Jump), Some(&drain), &now).unwrap();
    assert_eq!(change.direction, Direction::Down);
    assert_eq!((change.old.len(), change.new.len()), (4, 3));
    assert_eq!(
        change.started,
        Some(at(0)),
        "the time bound starts with the drain"
    );
    let fresh = Drain {
        started_at: Time(at(0).0 + k8s_openapi::jiff::SignedDuration::from_millis(300)),
        ..drain.clone()
    };
    assert_eq!(
        scale_down(Some(Scheme::Jump), Some(&fresh), &now),
        Some(change),
        "a drain just started and as the status keeps it (whole seconds) are one change"
    );
}

#[test]
fn a_scale_up_is_the_slots_getting_their_first_address() {
    let before = servers(5, 3);
    assert_eq!(scale_up(Some(Scheme::Jump), &before, &servers(5, 3)), None);
    let ready = servers(5, 5);
    assert_eq!(scale_up(None, &before, &ready), None, "unknown hashing");
    let change = scale_up(Some(Scheme::Jump), &before, &ready).unwrap();
    assert_eq!(change.direction, Direction::Up);
    assert_eq!((change.old, change.new), (entries(3), entries(5)));
    assert_eq!(change.new_slots, [0, 1, 2, 3, 4]);
    assert_eq!(
        scale_up(Some(Scheme::Jump), &[], &ready),
        None,
        "a new instance has nothing to copy"
    );
}

#[test]
fn withholding_keeps_the_joining_slots_out_of_the_list_only() {
    let before = servers(5, 3);
    let mut now = servers(5, 5);
    withhold(&before, &mut now);
    assert_eq!(now, before);
    assert!(now.iter().all(|s| s.ready && s.pod.is_some()));
}

#[test]
fn publication_waits_for_the_copies_and_never_past_the_timeout() {
    let mut up = change(Scheme::Jump, 3, 5);
    let now = at(100);
    assert!(holds(&up, &Copies::NotStarted, &now, 120), "about to start");
    let running = Copies::Running { since: at(0) };
    assert!(holds(&up, &running, &now, 120));
    assert!(!holds(&up, &running, &now, 100), "the time bound passed");
    assert!(!holds(&up, &Copies::Ended, &now, 120));

    // A scale-down's bound starts with its drain, also for copies a restarted operator starts again.
    up.direction = Direction::Down;
    up.started = Some(at(0));
    assert!(holds(&up, &Copies::NotStarted, &at(119), 120));
    assert!(!holds(&up, &Copies::NotStarted, &at(120), 120));
    let restarted = Copies::Running { since: at(110) };
    assert!(!holds(&up, &restarted, &at(120), 120));
}

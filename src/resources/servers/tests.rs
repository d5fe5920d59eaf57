use super::*;
use crate::api::{MemcachedSpec, Workload};
use crate::resources::Defaults;
use crate::resources::testing::memcached;

fn member(name: &str, ip: &str, ready: bool, created: i64) -> Member {
    Member {
        name: name.into(),
        ip: Some(ip.into()),
        ready,
        terminating: false,
        created: Some(Timestamp::from_second(created).unwrap()),
        ..Member::default()
    }
}

fn server(slot: i32, pod: &str, address: &str, ready: bool) -> Server {
    Server {
        slot,
        pod: Some(pod.into()),
        address: Some(address.into()),
        ready,
    }
}

fn three() -> Vec<Server> {
    vec![
        server(0, "a", "10.0.0.1:11211", true),
        server(1, "b", "10.0.0.2:11211", true),
        server(2, "c", "10.0.0.3:11211", true),
    ]
}

#[test]
fn first_assignment_takes_pods_oldest_first_and_lists_only_ready_ones() {
    let pods = [
        member("z", "10.0.0.3", true, 100),
        member("y", "10.0.0.2", false, 200),
        member("x", "10.0.0.1", true, 100),
    ];
    assert_eq!(
        assign_deployment(&[], &pods, 3, 11211),
        [
            server(0, "x", "10.0.0.1:11211", true),
            Server {
                slot: 1,
                pod: Some("z".into()),
                address: Some("10.0.0.3:11211".into()),
                ready: true
            },
            Server {
                slot: 2,
                pod: Some("y".into()),
                address: None,
                ready: false
            },
        ],
        "ties by name; a slot without a ready pod yet has no address"
    );
}

#[test]
fn a_replacement_keeps_the_old_address_until_ready_and_others_do_not_move() {
    let mut b = member("b", "10.0.0.2", true, 1);
    b.terminating = true;
    let pods = [
        member("a", "10.0.0.1", true, 1),
        b,
        member("c", "10.0.0.3", true, 1),
        member("d", "10.0.0.9", false, 50),
    ];
    let servers = assign_deployment(&three(), &pods, 3, 11211);
    assert_eq!(
        servers,
        [
            server(0, "a", "10.0.0.1:11211", true),
            server(1, "d", "10.0.0.2:11211", false),
            server(2, "c", "10.0.0.3:11211", true),
        ]
    );
    assert_eq!(
        ready_addresses(&servers),
        ["10.0.0.1:11211", "10.0.0.3:11211"]
    );

    // Once ready, the slot flips to the new pod's address; nothing else changes.
    let pods = [
        member("a", "10.0.0.1", true, 1),
        member("c", "10.0.0.3", true, 1),
        member("d", "10.0.0.9", true, 50),
    ];
    assert_eq!(
        assign_deployment(&servers, &pods, 3, 11211),
        [
            server(0, "a", "10.0.0.1:11211", true),
            server(1, "d", "10.0.0.9:11211", true),
            server(2, "c", "10.0.0.3:11211", true),
        ]
    );
}

#[test]
fn a_vacant_slot_goes_to_a_ready_pod_before_one_still_waiting() {
    // Slot 1's old pod went; "r" (ready: its copy of slot 1 is done) and "q" (the next surge pod,
    // waiting behind its gate) were created in the same second, and "q" sorts first by name.
    let mut b = member("b", "10.0.0.2", true, 1);
    b.terminating = true;
    let pods = [
        member("a", "10.0.0.1", true, 1),
        b,
        member("c", "10.0.0.3", true, 1),
        member("r", "10.0.0.8", true, 50),
        member("q", "10.0.0.9", false, 50),
    ];
    assert_eq!(
        assign_deployment(&three(), &pods, 3, 11211),
        [
            server(0, "a", "10.0.0.1:11211", true),
            server(1, "r", "10.0.0.8:11211", true),
            server(2, "c", "10.0.0.3:11211", true),
        ]
    );
}

#[test]
fn scale_up_appends_slots_and_scale_down_drops_the_highest() {
    let mut pods = vec![
        member("a", "10.0.0.1", true, 1),
        member("b", "10.0.0.2", true, 1),
        member("c", "10.0.0.3", true, 1),
    ];
    pods.push(member("n", "10.0.0.4", true, 9));
    let up = assign_deployment(&three(), &pods, 4, 11211);
    assert_eq!(up[..3], three()[..]);
    assert_eq!(up[3], server(3, "n", "10.0.0.4:11211", true));

    let down = assign_deployment(&up, &pods, 2, 11211);
    assert_eq!(down, three()[..2]);
    let drained: Vec<&str> = unslotted(&down, &pods)
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(drained, ["c", "n"]);
}

#[test]
fn ipv6_addresses_are_bracketed() {
    let pods = [member("a", "fd00::1", true, 1)];
    assert_eq!(
        assign_deployment(&[], &pods, 1, 11211)[0]
            .address
            .as_deref(),
        Some("[fd00::1]:11211")
    );
}

fn sts() -> crate::api::Memcached {
    memcached(
        "cache",
        MemcachedSpec {
            size: 3,
            workload: Workload::StatefulSet,
            ..MemcachedSpec::default()
        },
    )
}

#[test]
fn statefulset_slots_are_ordinals_at_stable_names() {
    let (mc, defaults) = (sts(), Defaults::default());
    let instance = Instance::new(&mc, &defaults).unwrap();
    let pods = [
        member("cache-1", "10.0.0.2", true, 1),
        member("cache-0", "10.0.0.1", true, 1),
        member("cache-2", "10.0.0.3", false, 1),
    ];
    let servers = assign_statefulset(&instance, &[], &pods, 3);
    assert_eq!(
        servers[0],
        server(
            0,
            "cache-0",
            "cache-0.cache-headless.default.svc:11211",
            true
        )
    );
    assert_eq!(
        servers[1].address.as_deref(),
        Some("cache-1.cache-headless.default.svc:11211")
    );
    assert_eq!(servers[2].address, None, "enters the list once ready");

    // A replaced pod keeps its slot and address, not ready meanwhile.
    let pods = [
        member("cache-0", "10.0.0.7", false, 9),
        member("cache-1", "10.0.0.2", true, 1),
    ];
    let again = assign_statefulset(&instance, &servers, &pods, 3);
    assert_eq!(
        again[0],
        server(
            0,
            "cache-0",
            "cache-0.cache-headless.default.svc:11211",
            false
        )
    );
    assert_eq!(
        again[2],
        Server {
            slot: 2,
            ..Server::default()
        }
    );
}

#[test]
fn the_proxy_routes_to_ready_pods_addresses_and_keeps_a_not_ready_slots_last_one() {
    let (mc, defaults) = (sts(), Defaults::default());
    let instance = Instance::new(&mc, &defaults).unwrap();
    let name = |slot: i32| stable_address(&instance, slot);
    let pods = [
        member("cache-0", "10.0.0.1", true, 1),
        member("cache-1", "10.0.0.2", true, 1),
        member("cache-2", "10.0.0.3", false, 1),
    ];
    let servers = assign_statefulset(&instance, &[], &pods, 3);
    let routed = route_servers(&servers, &pods, 11211, &BTreeMap::new());
    assert_eq!(
        published_addresses(&routed),
        ["10.0.0.1:11211", "10.0.0.2:11211"],
        "slot order; a slot never ready is in neither list"
    );
    assert_eq!(
        published_addresses(&servers),
        [name(0), name(1)],
        "the published list keeps the names"
    );
    let written: Vec<String> = published_addresses(&routed)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let by_slot = routed_by_slot(&servers, &written);
    assert_eq!(by_slot.get(&1).map(String::as_str), Some("10.0.0.2:11211"));

    // Slot 0's pod replaced (not ready, a new IP), slot 1's restarting (terminating counts as gone),
    // slot 2's ready for the first time.
    let mut terminating = member("cache-1", "10.0.0.2", true, 1);
    terminating.terminating = true;
    let pods = [
        member("cache-0", "10.0.0.7", false, 9),
        terminating,
        member("cache-2", "10.0.0.3", true, 1),
    ];
    let next = assign_statefulset(&instance, &servers, &pods, 3);
    let routed = route_servers(&next, &pods, 11211, &by_slot);
    assert_eq!(
        published_addresses(&routed),
        ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"],
        "not-ready slots keep their last address, in place"
    );
    assert_eq!(
        routed.iter().map(|s| (s.slot, s.ready)).collect::<Vec<_>>(),
        next.iter().map(|s| (s.slot, s.ready)).collect::<Vec<_>>()
    );

    // The replacement ready: its new address.
    let pods = [member("cache-0", "10.0.0.7", true, 9)];
    let routed = route_servers(&next, &pods, 11211, &by_slot);
    assert_eq!(routed[0].address.as_deref(), Some("10.0.0.7:11211"));

    // Nothing known of a not-ready slot (no route yet, or one that does not match): its DNS name.
    let routed = route_servers(&next, &[], 11211, &BTreeMap::new());
    assert_eq!(published_addresses(&routed), [name(0), name(1), name(2)]);
}

#[test]
fn a_route_that_does_not_match_the_published_slots_says_nothing_of_them() {
    let published = [
        server(0, "cache-0", "cache-0.x:11211", true),
        Server {
            slot: 1,
            ..Server::default()
        },
        server(2, "cache-2", "cache-2.x:11211", false),
    ];
    let route = ["10.0.0.1:11211".to_owned(), "10.0.0.3:11211".to_owned()];
    assert_eq!(
        routed_by_slot(&published, &route),
        BTreeMap::from([(0, route[0].clone()), (2, route[1].clone())]),
        "positions are the published slots, a slot without an address skipped"
    );
    assert!(routed_by_slot(&published, &route[..1]).is_empty());
    assert!(routed_by_slot(&[], &route).is_empty());
}

#[test]
fn config_map_content_is_exact() {
    let mc = memcached("cache", MemcachedSpec::default());
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).unwrap();
    let mut servers = three();
    servers[1].ready = false;
    servers.push(Server {
        slot: 3,
        pod: Some("d".into()),
        address: None,
        ready: false,
    });
    let cm = config_map(&instance, &servers);
    assert_eq!(cm.metadata.name.as_deref(), Some("cache-servers"));
    assert_eq!(
        cm.metadata.labels,
        Some(crate::resources::labels::common_labels("cache"))
    );
    assert!(cm.metadata.owner_references.is_some());
    let data = cm.data.unwrap();
    assert_eq!(
        data["servers"],
        "10.0.0.1:11211\n10.0.0.2:11211\n10.0.0.3:11211\n"
    );
    assert_eq!(
        data["servers.json"],
        r#"[
  {
    "slot": 0,
    "pod": "a",
    "address": "10.0.0.1:11211",
    "ready": true
  },
  {
    "slot": 1,
    "pod": "b",
    "address": "10.0.0.2:11211",
    "ready": false
  },
  {
    "slot": 2,
    "pod": "c",
    "address": "10.0.0.3:11211",
    "ready": true
  }
]
"#
    );
    assert_eq!(
        data["mcrouter.json"],
        r#"{
  "pools": {
    "cache": {
      "servers": [
        "10.0.0.1:11211",
        "10.0.0.2:11211",
        "10.0.0.3:11211"
      ]
    }
  },
  "route": "PoolRoute|cache"
}
"#
    );
    assert_eq!(data.len(), 3);
}

#[test]
fn an_empty_list_renders_empty_values() {
    let mc = memcached("cache", MemcachedSpec::default());
    let defaults = Defaults::default();
    let instance = Instance::new(&mc, &defaults).unwrap();
    let data = config_map(&instance, &[]).data.unwrap();
    assert_eq!(data["servers"], "");
    assert_eq!(data["servers.json"], "[]\n");
}

#[test]
fn there_is_something_to_publish_once_a_slot_has_an_address() {
    assert!(!publishes(&[]), "no slot");
    let waiting = Server {
        slot: 0,
        pod: Some("a".into()),
        address: None,
        ready: false,
    };
    assert!(
        !publishes(std::slice::from_ref(&waiting)),
        "a pod that is not ready yet"
    );
    assert!(publishes(&[
        waiting,
        server(1, "b", "10.0.0.2:11211", true)
    ]));
    let replaced = Server {
        ready: false,
        ..server(0, "a", "10.0.0.1:11211", false)
    };
    assert!(
        publishes(&[replaced]),
        "a slot whose pod is being replaced keeps its address"
    );
}

#[test]
fn members_read_readiness_termination_and_the_drain_mark() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "creationTimestamp": "2023-11-14T22:13:20Z",
                     "deletionTimestamp": "2023-11-14T22:14:20Z",
                     "annotations": {DELETION_COST_ANNOTATION: DRAINED_COST}},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap();
    let m = Member::of(&pod).unwrap();
    assert!(m.ready && m.terminating && m.marked);
    assert_eq!(m.ip.as_deref(), Some("10.0.0.1"));
    assert_eq!(m.created.map(|t| t.as_second()), Some(1_700_000_000));
}

#[test]
fn drain_marks_go_on_exactly_the_unslotted_pods_and_come_off_slotted_ones() {
    let mut c = member("c", "10.0.0.3", true, 1);
    let mut gone = member("z", "10.0.0.9", true, 1);
    gone.terminating = true;
    let pods = vec![
        member("a", "10.0.0.1", true, 1),
        member("b", "10.0.0.2", true, 1),
        c.clone(),
        gone,
    ];
    let two = &three()[..2];
    assert_eq!(drain_marks(two, &pods, true), [("c".to_owned(), true)]);
    assert!(
        drain_marks(two, &pods, false).is_empty(),
        "no new marks outside a drain"
    );

    // Marked already: nothing to do while draining, and the mark stays after it (the pod is leaving).
    c.marked = true;
    let pods = vec![
        member("a", "10.0.0.1", true, 1),
        member("b", "10.0.0.2", true, 1),
        c,
    ];
    assert!(drain_marks(two, &pods, true).is_empty());
    assert!(drain_marks(two, &pods, false).is_empty());
    // The drain is cancelled: c holds slot 2 again and loses its mark.
    assert_eq!(
        drain_marks(&three(), &pods, false),
        [("c".to_owned(), false)]
    );
}

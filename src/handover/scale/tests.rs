use super::*;
use crate::handover::copier::{Copier, refused_copier};
use crate::handover::plan::scale::Direction;
use crate::handover::tasks::{Prepared, Tasks};
use crate::hashing::Scheme;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn change(old: usize, new: usize) -> Change {
    let entries =
        |n: usize| -> Vec<String> { (0..n).map(|i| format!("10.0.0.{}:11211", i + 1)).collect() };
    Change {
        direction: Direction::Up,
        scheme: Scheme::Jump,
        old: entries(old),
        new: entries(new),
        new_slots: (0..new as i32).collect(),
        started: None,
    }
}

fn key() -> Key {
    ("ns".to_owned(), "cache".to_owned(), Subject::Scale)
}

fn prepared(change: &Change, mut copier: impl FnMut() -> Result<Copier, String>) -> Vec<Prepared> {
    change
        .pairs()
        .into_iter()
        .map(|pair| Prepared {
            source: format!("s{}", pair.source),
            target: format!("t{}", pair.target),
            slot: change.slot(pair.target),
            copier: copier(),
        })
        .collect()
}

fn start(tasks: &Tasks, change: &Change, prepared: Vec<Prepared>) {
    let meta = Meta {
        slot: -1,
        source: String::new(),
        since: at(0),
        bound: Some(at(0)),
        change: Some(change.clone()),
    };
    tasks.start(key(), meta, prepared);
}

#[tokio::test]
async fn each_target_is_reported_once_when_all_its_copies_ended() {
    let tasks = Tasks::default();
    let mut triggers = Box::pin(tasks.triggers());
    let up = change(3, 5);
    start(&tasks, &up, prepared(&up, || Ok(refused_copier())));
    use futures::StreamExt;
    // Six copies (three sources to each of two targets) end, each bringing the instance back.
    for _ in 0..6 {
        assert!(triggers.next().await.is_some());
    }
    let mut recorded = 0;
    let reports = tasks
        .with(&key(), |job| {
            take_reports(&mut job.copies, |_| recorded += 1)
        })
        .unwrap();
    assert_eq!(recorded, 6, "every copy counted in the metrics");
    let targets: Vec<(&str, i32, usize)> = reports
        .iter()
        .map(|r| (r.target.as_str(), r.slot, r.failures.len()))
        .collect();
    assert_eq!(targets, [("t3", 3, 3), ("t4", 4, 3)]);
    let (done, note) = reports[0].event(&up);
    assert!(!done && note.contains("(connect)"), "{note}");
    assert!(!reports[0].is_empty(), "a failure is worth its event");
    assert!(
        Report::default().is_empty(),
        "nothing copied, nothing failed: no event"
    );
    let again = tasks
        .with(&key(), |job| take_reports(&mut job.copies, |_| ()))
        .unwrap();
    assert!(again.is_empty(), "reported once");
}

/// A target whose items were all there already (a plan 3 -> 4 copied them before 3 -> 5 replaced it)
/// was handed over all the same: one `HandedOver` event saying so, not silence.
#[test]
fn a_target_that_held_its_items_already_still_gets_its_event() {
    let up = change(3, 5);
    let mut report = Report {
        target: "t3".into(),
        slot: 3,
        ..Report::default()
    };
    for source in ["s0", "s1", "s2"] {
        let done = Snapshot {
            existing: 100,
            ..Snapshot::default()
        };
        report.add(source, &Ended::Copied(Ok(done)));
    }
    assert!(!report.is_empty(), "items there already are a handover");
    let (done, note) = report.event(&up);
    assert!(done, "{note}");
    assert_eq!(
        note,
        "Copied 0 items (0 bytes) that move to t3 (slot 3) from 3 servers for the scale from 3 to 5 \
         servers; 300 were there already"
    );
}

#[tokio::test]
async fn a_copy_that_cannot_start_ends_the_plan_at_once() {
    let tasks = Tasks::default();
    let mut triggers = Box::pin(tasks.triggers());
    let up = change(1, 2);
    start(&tasks, &up, prepared(&up, || Err("no pod".into())));
    assert_eq!(
        tasks.with(&key(), |job| job.copies()),
        Some(crate::handover::plan::scale::Copies::Ended)
    );
    use futures::StreamExt;
    assert!(triggers.next().await.is_some(), "the instance comes back");
    let reports = tasks
        .with(&key(), |job| {
            take_reports(&mut job.copies, |_| panic!("never ran"))
        })
        .unwrap();
    assert_eq!(reports.len(), 1);
    assert!(reports[0].event(&up).1.contains("from s0: no pod"));
}

#[tokio::test]
async fn the_time_bound_ends_the_running_copies_cold() {
    let tasks = Tasks::default();
    let up = change(1, 2);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = crate::connection::Target::plain(listener.local_addr().unwrap());
    let silent = Copier::new(target.clone(), target, crate::handover::Settings::default());
    let mut copiers = vec![Ok(silent)];
    start(&tasks, &up, prepared(&up, || copiers.pop().unwrap()));
    assert_eq!(tasks.progress("ns", "cache").len(), 1, "slot 1 copying");
    tasks.time_out("ns", "cache", &at(120), 120);
    let reports = tasks
        .with(&key(), |job| take_reports(&mut job.copies, |_| ()))
        .unwrap();
    let (done, note) = reports[0].event(&up);
    assert!(!done && note.contains("ended cold (timeout)"), "{note}");
}

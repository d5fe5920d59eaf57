use super::*;
use crate::connection::Target;
use crate::handover::{Settings, refused_copier};
use crate::hashing::Scheme;
use crate::resources::scale_handover::Direction;
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

fn handovers() -> (
    ScaleHandovers,
    mpsc::UnboundedReceiver<ObjectRef<Memcached>>,
) {
    let (triggers, receiver) = mpsc::unbounded_channel();
    (
        ScaleHandovers::new((Arc::new(Semaphore::new(3)), triggers)),
        receiver,
    )
}

/// A copy to a listener that accepts and never answers: it runs until cancelled.
async fn silent() -> (tokio::net::TcpListener, Copier) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = Target::plain(listener.local_addr().unwrap());
    let copier = Copier::new(target.clone(), target, Settings::default());
    (listener, copier)
}

fn prepared(change: &Change, mut copier: impl FnMut() -> Result<Copier, String>) -> Vec<Prepared> {
    change
        .pairs()
        .into_iter()
        .map(|pair| Prepared {
            pair,
            source: format!("s{}", pair.source),
            target: format!("t{}", pair.target),
            copier: copier(),
        })
        .collect()
}

fn key() -> Key {
    ("ns".to_owned(), "cache".to_owned())
}

#[tokio::test]
async fn each_target_is_reported_once_when_all_its_copies_ended() {
    let (handovers, mut triggers) = handovers();
    let up = change(3, 5);
    handovers.start(
        key(),
        up.clone(),
        at(0),
        prepared(&up, || Ok(refused_copier())),
    );
    assert!(matches!(
        handovers.copies("ns", "cache", &up),
        Copies::Running { .. }
    ));
    // Six copies (three sources to each of two targets) end, each bringing the instance back.
    for _ in 0..6 {
        assert_eq!(
            triggers.recv().await,
            Some(ObjectRef::new("cache").within("ns"))
        );
    }
    assert_eq!(handovers.copies("ns", "cache", &up), Copies::Ended);
    let mut recorded = 0;
    let reports = handovers.take_reports(&key(), |_| recorded += 1);
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
    assert!(
        handovers.take_reports(&key(), |_| ()).is_empty(),
        "reported once"
    );
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
    let (handovers, mut triggers) = handovers();
    let up = change(1, 2);
    handovers.start(
        key(),
        up.clone(),
        at(0),
        prepared(&up, || Err("no pod".into())),
    );
    assert_eq!(handovers.copies("ns", "cache", &up), Copies::Ended);
    assert!(triggers.recv().await.is_some(), "the instance comes back");
    let reports = handovers.take_reports(&key(), |_| panic!("never ran"));
    assert_eq!(reports.len(), 1);
    assert!(reports[0].event(&up).1.contains("from s0: no pod"));
}

#[tokio::test]
async fn another_change_or_the_time_bound_ends_the_running_copies() {
    let (handovers, _triggers) = handovers();
    let up = change(1, 2);
    let (_listener, copier) = silent().await;
    let mut copiers = vec![Ok(copier)];
    handovers.start(
        key(),
        up.clone(),
        at(0),
        prepared(&up, || copiers.pop().unwrap()),
    );
    assert_eq!(handovers.progress(&key()).len(), 1, "slot 1 copying");
    assert_eq!(handovers.running_since(&key()), Some(at(0)));
    handovers.time_out(&key(), Duration::from_secs(120));
    assert_eq!(handovers.copies("ns", "cache", &up), Copies::Ended);
    let reports = handovers.take_reports(&key(), |_| ());
    let (done, note) = reports[0].event(&up);
    assert!(!done && note.contains("ended cold (timeout)"), "{note}");

    assert!(
        handovers.retire(&key(), Some(&up)),
        "the same change is kept"
    );
    assert!(!handovers.retire(&key(), Some(&change(1, 3))));
    assert_eq!(
        handovers.copies("ns", "cache", &up),
        Copies::NotStarted,
        "another change drops the plan"
    );
}

#[tokio::test]
async fn a_gone_instance_or_a_stopped_operator_cancels_the_copies() {
    use tokio::io::AsyncReadExt;
    let (handovers, _triggers) = handovers();
    let up = change(1, 2);
    let (listener, copier) = silent().await;
    let mut copiers = vec![Ok(copier)];
    handovers.start(
        key(),
        up.clone(),
        at(0),
        prepared(&up, || copiers.pop().unwrap()),
    );
    let (mut accepted, _) = listener.accept().await.unwrap();
    handovers.forget_instance("ns", "cache");
    assert_eq!(handovers.copies("ns", "cache", &up), Copies::NotStarted);
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), accepted.read_to_end(&mut buf))
        .await
        .expect("the copy's connection closes with its instance");
    assert!(read.is_ok());
}

use super::*;
use crate::connection::Target;
use crate::handover::bounds::Settings;
use crate::handover::copier::refused_copier;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn key(pod: &str) -> Key {
    (
        "ns".to_owned(),
        "cache".to_owned(),
        Subject::Pod(pod.to_owned()),
    )
}

fn meta(slot: i32, source: &str) -> Meta {
    Meta {
        slot,
        source: source.to_owned(),
        since: at(0),
        bound: None,
        change: None,
    }
}

fn one(source: &str, target: &str, slot: i32, copier: Copier) -> Vec<Prepared> {
    vec![Prepared {
        source: source.to_owned(),
        target: target.to_owned(),
        slot,
        copier: Ok(copier),
    }]
}

fn member(name: &str, waiting: bool) -> Member {
    Member {
        name: name.into(),
        waiting,
        ..Member::default()
    }
}

/// A copy to a listener that accepts and never answers: it runs until cancelled.
async fn silent() -> (tokio::net::TcpListener, Target) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = Target::plain(listener.local_addr().unwrap());
    (listener, target)
}

fn copier(target: &Target) -> Copier {
    Copier::new(target.clone(), target.clone(), Settings::default())
}

#[tokio::test]
async fn one_job_per_pod_its_end_taken_once_and_the_instance_triggered() {
    let tasks = Tasks::default();
    let mut triggers = Box::pin(tasks.triggers());
    tasks.start(
        key("new"),
        meta(1, "old"),
        one("old", "new", 1, refused_copier()),
    );
    tasks.start(
        key("new"),
        meta(1, "other"),
        one("other", "new", 1, refused_copier()),
    );
    assert_eq!(
        tasks.open("ns", "cache"),
        BTreeMap::from([("new".to_owned(), "old".to_owned())]),
        "a second start for the same pod is no second job"
    );
    assert_eq!(
        triggers.next().await,
        Some(ObjectRef::new("cache").within("ns"))
    );
    let ended = tasks.take_ended("ns", "cache");
    assert_eq!(ended.len(), 1);
    let (pod, job) = &ended[0];
    assert_eq!(
        (pod.as_str(), job.slot, job.source.as_str()),
        ("new", 1, "old")
    );
    let State::Ended(Ended::Copied(Err(failure))) = &job.copies[0].state else {
        panic!("the copy ended refused");
    };
    assert_eq!(failure.error.reason(), "connect");
    assert!(tasks.take_ended("ns", "cache").is_empty(), "taken once");
}

#[tokio::test]
async fn an_opened_gate_is_remembered_until_the_pod_waits_no_more() {
    let tasks = Tasks::default();
    tasks.close(key("new"), -1, Phase::Opened, at(0));
    tasks.forget_gone("ns", "cache", &[member("new", true)]);
    assert!(
        tasks.open("ns", "cache").contains_key("new"),
        "the cache does not show the condition yet: not waiting for a copy"
    );
    tasks.forget_gone("ns", "cache", &[member("new", false)]);
    assert!(tasks.open("ns", "cache").is_empty());
}

#[tokio::test]
async fn a_copy_to_the_spare_is_staged_until_the_spare_goes() {
    let tasks = Tasks::default();
    let spare = key("cache-handover");
    tasks.start(
        spare.clone(),
        meta(3, "cache-3"),
        one("cache-3", "cache-handover", 3, refused_copier()),
    );
    assert_eq!(tasks.phase(&spare).map(|(slot, _)| slot), Some(3));
    tasks.forget(&spare);
    tasks.close(spare.clone(), 3, Phase::Staged, at(0));
    assert_eq!(tasks.phase(&spare), Some((3, Phase::Staged)));
    assert!(tasks.progress("ns", "cache").is_empty(), "no copy runs");
    assert!(
        tasks.take_ended("ns", "cache").is_empty(),
        "nothing to report"
    );
    tasks.forget_gone("ns", "cache", &[member("cache-handover", false)]);
    assert!(tasks.phase(&spare).is_some());
    tasks.forget_gone("ns", "cache", &[]);
    assert_eq!(tasks.phase(&spare), None, "the spare went");
}

#[tokio::test]
async fn a_copy_whose_pod_or_instance_goes_is_cancelled_and_a_scale_stays_with_its_instance() {
    let tasks = Tasks::default();
    let (_listener, target) = silent().await;
    tasks.start(key("a"), meta(0, "x"), one("x", "a", 0, copier(&target)));
    tasks.start(key("b"), meta(1, "y"), one("y", "b", 1, copier(&target)));
    let scale = ("ns".to_owned(), "cache".to_owned(), Subject::Scale);
    tasks.start(
        scale.clone(),
        meta(-1, ""),
        one("z", "c", 2, copier(&target)),
    );
    assert_eq!(
        tasks.progress("ns", "cache").len(),
        3,
        "one per target slot"
    );
    tasks.forget_gone("ns", "cache", &[member("b", true)]);
    assert_eq!(tasks.open("ns", "cache").len(), 1);
    assert!(tasks.with(&scale, |_| ()).is_some(), "a scale is no pod's");
    tasks.forget_instance("ns", "cache");
    assert!(tasks.open("ns", "cache").is_empty());
    assert!(tasks.with(&scale, |_| ()).is_none());
}

#[tokio::test]
async fn a_jobs_own_time_bound_ends_its_running_copies_and_only_its_own() {
    let tasks = Tasks::default();
    let (_listener, target) = silent().await;
    let bounded = Meta {
        bound: Some(at(0)),
        ..meta(0, "x")
    };
    tasks.start(key("a"), bounded, one("x", "a", 0, copier(&target)));
    tasks.start(key("b"), meta(1, "y"), one("y", "b", 1, copier(&target)));
    tasks.time_out("ns", "cache", &at(119), 120);
    assert_eq!(tasks.phase(&key("a")), Some((0, Phase::Running)));
    tasks.time_out("ns", "cache", &at(120), 120);
    assert_eq!(tasks.phase(&key("a")), Some((0, Phase::Ended)));
    assert_eq!(
        tasks.phase(&key("b")),
        Some((1, Phase::Running)),
        "bounded by its copy's own bound only"
    );
    let ended = tasks.take_ended("ns", "cache");
    let State::Ended(Ended::Copied(Err(failure))) = &ended[0].1.copies[0].state else {
        panic!("timed out");
    };
    assert_eq!(failure.error.reason(), "timeout");
}

#[tokio::test]
async fn stopping_the_operator_closes_the_copies_connections() {
    use tokio::io::AsyncReadExt;
    let tasks = Tasks::default();
    let (listener, target) = silent().await;
    tasks.start(key("a"), meta(0, "x"), one("x", "a", 0, copier(&target)));
    let (mut accepted, _) = listener.accept().await.unwrap();
    drop(tasks);
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), accepted.read_to_end(&mut buf))
        .await
        .expect("the copy's connection closes when the operator's tasks are dropped");
    assert!(read.is_ok());
}

/// Whether `future` is done within a moment.
async fn soon<T>(future: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(Duration::from_millis(300), future)
        .await
        .ok()
}

#[tokio::test]
async fn a_namespace_queueing_many_copies_leaves_the_next_free_slot_to_another() {
    let tasks = Tasks::default();
    // Namespace a queues two copies more than there are slots, then namespace b one. A copy that has a
    // slot connects to its target first: to its own listener here, which never answers.
    let mut queued = Vec::new();
    for i in 0..MOST_COPIES + 2 {
        let (listener, target) = silent().await;
        let pod = format!("a-{i}");
        let key = (
            "a".to_owned(),
            "cache".to_owned(),
            Subject::Pod(pod.clone()),
        );
        let slot = i32::try_from(i).unwrap();
        let source = format!("a-old-{i}");
        tasks.start(
            key,
            meta(slot, &source),
            one(&source, &pod, slot, copier(&target)),
        );
        queued.push(listener);
    }
    let (other, target) = silent().await;
    let key = (
        "b".to_owned(),
        "cache".to_owned(),
        Subject::Pod("b-0".to_owned()),
    );
    tasks.start(
        key,
        meta(0, "b-old"),
        one("b-old", "b-0", 0, copier(&target)),
    );
    let mut running = Vec::new();
    for listener in &queued[..MOST_COPIES] {
        let (stream, _) = soon(listener.accept())
            .await
            .expect("a's first copies take every slot")
            .unwrap();
        running.push(stream);
    }
    assert!(soon(other.accept()).await.is_none(), "b's copy waits");
    // a's first copy ends (its target closes the connection): its slot frees.
    drop(running.remove(0));
    let _b_running = soon(other.accept())
        .await
        .expect("b's copy takes the freed slot, ahead of a's queue");
    assert!(
        soon(queued[MOST_COPIES].accept()).await.is_none(),
        "a's next copy waits for the next free slot"
    );
}

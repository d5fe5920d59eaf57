//! What converging costs in requests, across the reconciles of one operator process (one context): a
//! new instance converges in seven (its workload, two Services, one event and its first status,
//! `Creating`; then, with its first ready server, the server list and its status), no second write of anything the watch has not brought
//! back yet (read-your-writes), and status changes that only move counts paced (issue #9).

mod common;

use common::mock::*;

/// A child as the API server stores it after the apply (a resource version the caches have not seen).
fn stored(body: &Value) -> Value {
    as_stored(body)
}

/// The instance as the API server stores it after a status apply: the whole object, a newer version.
fn stored_status(body: &Value) -> Value {
    let mut mc = serde_json::to_value(memcached(1)).unwrap();
    mc["metadata"]["resourceVersion"] = json!("11");
    mc["status"] = body["status"].clone();
    mc
}

/// The reconcile asked to run again when the pace is over, not at the safety requeue.
fn assert_runs_again_soon(action: &Action) {
    assert_runs_again_within(action, Settings::default().status_pace);
}

/// The reconcile asked to run again when a wait of `wait` that began just now is over: at most `wait`,
/// and a reconcile takes well under 100 ms.
fn assert_runs_again_within(action: &Action, wait: Duration) {
    // A reconcile runs again within the requeue interval (300 s) however long a hold is.
    let wait = wait.min(Settings::default().requeue_after);
    let later = (1..=wait.as_millis() as u64)
        .map(|ms| Action::requeue(Duration::from_millis(ms)))
        .collect::<Vec<_>>();
    assert!(
        later[later.len().saturating_sub(100)..].contains(action),
        "runs again within {wait:?}: {action:?}"
    );
}

/// The create path, every answer an object as stored: the workload, the Services, one event, the first
/// status (`Creating`). No server list (no server is ready yet).
fn creation() -> Vec<Exchange> {
    vec![
        expect(Method::PATCH, *DEPLOYMENTS).create().answer(stored),
        expect(Method::PATCH, *SERVICES).create().answer(stored),
        expect(Method::PATCH, *HEADLESS).create().answer(stored),
        event(),
        expect(Method::PATCH, STATUS).apply().answer(stored_status),
    ]
}

#[tokio::test]
async fn a_reconcile_before_the_watches_catch_up_writes_nothing_again() {
    let mut cluster = Cluster::new();
    let session = Session::start(&cluster, settings(), creation(), NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    // Another watch event triggers the instance while every cache is still as it was: the instance
    // without its status, no children. Nothing is applied again, no event, no status.
    let again = session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    assert_eq!(again, Action::requeue(Duration::from_secs(300)));
    let seen = session.finish().await;
    assert_eq!(seen.len(), 5, "one creation, nothing more: {seen:#?}");
}

#[tokio::test]
async fn a_child_deleted_for_good_is_not_deleted_twice_while_the_cache_still_shows_it() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 2).await;
    cluster.child::<Deployment>(settled(&deployment));
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = with_spec(
        2,
        json!({"highAvailability": {"podDisruptionBudget": {"enabled": false}}}),
    );
    mc.metadata.generation = Some(2);
    let script = vec![
        expect(Method::DELETE, *PDBS),
        event(),
        expect(Method::PATCH, STATUS).apply().answer(|body| {
            let mut mc = serde_json::to_value(memcached(2)).unwrap();
            mc["metadata"]["resourceVersion"] = json!("12");
            mc["metadata"]["generation"] = json!(2);
            mc["spec"]["highAvailability"] = json!({"podDisruptionBudget": {"enabled": false}});
            mc["status"] = body["status"].clone();
            mc
        }),
    ];
    let session = Session::start(&cluster, settings(), script, NOW);
    session.reconcile(&mut cluster, mc.clone()).await.unwrap();
    // The PodDisruptionBudget cache has not seen the deletion yet.
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(
        seen[1].body["note"],
        "Deleted PodDisruptionBudget cache: the spec no longer wants it"
    );
    assert_eq!(seen.len(), 3, "{seen:#?}");
}

#[tokio::test]
async fn with_pacing_a_published_server_is_written_at_once() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 1).await;
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = memcached(1);
    mc.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
    cluster.child::<Deployment>(settled(&deployment));
    cluster.pod(ready_pod_at("cache-7d9f-a", "127.0.0.1"));

    // The workload was just scaled by this process (pace running), yet the server that became ready is
    // published (the list created with it), and its status written, at once.
    let session = Session::start(
        &cluster,
        Settings::default(),
        vec![
            expect(Method::PATCH, *CONFIG_MAPS).create(),
            expect(Method::PATCH, STATUS).apply(),
        ],
        NOW,
    );
    session.ctx.memory.pace.wrote(NS, NAME);
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen[0].body["data"]["servers"], "127.0.0.1:11211\n");
    assert_eq!(
        seen[1].body["status"]["serverList"],
        json!(["127.0.0.1:11211"])
    );
}

#[tokio::test]
async fn with_pacing_a_count_that_moves_within_the_pace_waits() {
    let mut cluster = Cluster::new();
    let (deployment, service, status) = create(&mut cluster, 2).await;
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let mut mc = memcached(2);
    mc.status = Some(serde_json::from_value(status["status"].clone()).unwrap());
    // Past its creation (a status that says `Creating` holds such changes longer: see the new-instance
    // scenarios below).
    for c in &mut mc.status.as_mut().unwrap().conditions {
        if c.type_ == "Progressing" {
            c.reason = "ScalingUp".into();
        }
    }
    // The Deployment's controller has counted one pod (not ready): only counts move.
    let mut counted = settled(&deployment);
    let counts = counted.status.as_mut().unwrap();
    counts.ready_replicas = Some(0);
    counts.available_replicas = Some(0);
    counts.replicas = Some(1);
    cluster.child::<Deployment>(counted);

    let session = Session::start(&cluster, Settings::default(), vec![], NOW);
    session.ctx.memory.pace.wrote(NS, NAME);
    let action = session.reconcile(&mut cluster, mc.clone()).await.unwrap();
    assert!(session.finish().await.is_empty());
    assert_runs_again_soon(&action);

    // Without a recent write the same change is written at once.
    let session = Session::start(
        &cluster,
        Settings::default(),
        vec![expect(Method::PATCH, STATUS).apply()],
        NOW,
    );
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen[0].body["status"]["replicas"], 1);
}

#[tokio::test]
async fn a_child_deleted_right_after_it_was_applied_comes_back_at_once() {
    let mut cluster = Cluster::new();
    let mut script = creation();
    // Someone deletes the Deployment before the operator's cache has even seen it; the watch delivers the
    // deletion, and the reconcile it triggers applies the Deployment again.
    script.extend([
        expect(Method::PATCH, *DEPLOYMENTS).create().answer(stored),
        event(),
    ]);
    let session = Session::start(&cluster, settings(), script, NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let mut deleted: Deployment = serde_json::from_value(json!({"metadata": {
        "name": NAME, "namespace": NS, "resourceVersion": "13"}}))
    .unwrap();
    session.ctx.writer.written.observe_deleted(&deleted, &());
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(seen.len(), 7, "{seen:#?}");
    assert_eq!(
        seen[6].body["note"],
        "Created Deployment cache with 1 replicas"
    );

    // The deletion of an older version (seen after the operator wrote a newer one) changes nothing.
    deleted.metadata.resource_version = Some("9".into());
    let written = memcached_operator::store::Written::default();
    let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 1}});
    written.remember(Arc::new(Compact::encode(&settled(&applied)).unwrap()), &());
    written.observe_deleted(&deleted, &());
    assert_eq!(written.len(), 1);
}

// ---------------------------------------------------------------------------------------------------
// A new instance with the default settings: seven requests in all, its first status at once.

/// The pod of a new instance: scheduled, its container being created, not ready.
fn starting_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "cache-7d9f-a", "namespace": NS,
                     "creationTimestamp": "2023-11-14T22:13:21Z", "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "status": {"phase": "Pending",
                   "containerStatuses": [{"name": "memcached", "image": "memcached:1.6-alpine",
                       "imageID": "", "ready": false, "restartCount": 0,
                       "state": {"waiting": {"reason": "ContainerCreating"}}}],
                   "conditions": [{"type": "PodScheduled", "status": "True"},
                                  {"type": "Ready", "status": "False"}]}
    }))
    .unwrap()
}

/// What the watches bring back after the first reconcile: the Deployment (`applied`, as stored) as its
/// controller reports it while the pod starts (one replica, none ready), the Services, and the pod.
fn catch_up_with_the_creation(cluster: &mut Cluster, applied: &Value, services: &[Value]) {
    let mut deployment = as_stored(applied);
    deployment["status"] = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                  "unavailableReplicas": 1});
    cluster.child::<Deployment>(serde_json::from_value(deployment).unwrap());
    for service in services {
        cluster.child::<Service>(serde_json::from_value(as_stored(service)).unwrap());
    }
    cluster.pod(starting_pod());
}

/// The pod is ready at 10.0.0.1, and the Deployment (`applied`) says so.
fn the_pod_is_ready(cluster: &mut Cluster, applied: &Value) {
    cluster.pod(ready_pod_at("cache-7d9f-a", "10.0.0.1"));
    cluster.child::<Deployment>(settled(applied));
}

/// The instance with the status in the body of a status apply, as the watch brings it back.
fn with_status(status_apply: &Value) -> Memcached {
    let mut mc = memcached(1);
    mc.status = Some(serde_json::from_value(status_apply["status"].clone()).unwrap());
    mc
}

/// The first reconcile of a new instance with the default settings; the caches then catch up with it
/// (the pod still starting). Returns the Deployment as applied and the instance with its first status.
async fn create_new(cluster: &mut Cluster) -> (Value, Memcached) {
    let session = Session::start(cluster, Settings::default(), creation(), NOW);
    session.reconcile(cluster, memcached(1)).await.unwrap();
    let seen = session.finish().await;
    catch_up_with_the_creation(
        cluster,
        &seen[0].body,
        &[seen[1].body.clone(), seen[2].body.clone()],
    );
    (seen[0].body.clone(), with_status(&seen[4].body))
}

/// The same process as the one that created the instance's children moments ago (its pacing remembers
/// the creation), answering `script`.
fn same_process(cluster: &Cluster, script: Vec<Exchange>) -> Session {
    let session = Session::start(cluster, Settings::default(), script, NOW);
    session.ctx.memory.pace.wrote(NS, NAME);
    session
}

/// The server list and the status, once the pod is ready.
fn published() -> Vec<Exchange> {
    vec![
        expect(Method::PATCH, *CONFIG_MAPS).create().answer(stored),
        expect(Method::PATCH, STATUS).apply().answer(stored_status),
    ]
}

#[tokio::test]
async fn a_new_instance_first_sends_its_workload_its_services_one_event_and_its_first_status() {
    let mut cluster = Cluster::new();
    let session = Session::start(&cluster, Settings::default(), creation(), NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();
    let seen = session.finish().await;
    let requests: Vec<(&Method, &str)> =
        seen.iter().map(|s| (&s.method, s.path.as_str())).collect();
    assert_eq!(
        requests,
        [
            (&Method::PATCH, *DEPLOYMENTS),
            (&Method::PATCH, *SERVICES),
            (&Method::PATCH, *HEADLESS),
            (&Method::POST, EVENTS),
            (&Method::PATCH, STATUS),
        ],
        "no finalizer, no server list (nothing to publish)"
    );
    assert_eq!(
        seen[3].body["note"],
        "Created Deployment cache with 1 replicas, Service cache, Service cache-headless"
    );
    // What `kubectl get memcached` shows right after `kubectl apply`: the instance is being created.
    let status = &seen[4].body;
    assert_eq!(condition(status, "Progressing")["status"], "True");
    assert_eq!(condition(status, "Progressing")["reason"], "Creating");
    assert_eq!(condition(status, "Available")["status"], "False");
    assert_eq!(condition(status, "Degraded")["status"], "False");
    assert_eq!(status["status"]["observedGeneration"], 1);
}

/// One turn (`--concurrency=1`), a new instance in the cache, and the script of its creation with its first
/// status first: what a new instance that waits for its turn sends.
fn one_turn_for_a_new_instance() -> (Cluster, Session) {
    let mut cluster = Cluster::new();
    let mut script = vec![expect(Method::PATCH, STATUS).apply().answer(stored_status)];
    script.extend(creation().into_iter().take(4));
    let one_at_a_time = Settings {
        concurrency: 1,
        ..Settings::default()
    };
    let session = Session::start(&cluster, one_at_a_time, script, NOW);
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Apply(memcached(1)));
    (cluster, session)
}

/// Under a burst, reconciles queue for their turns (`--concurrency`); a new instance that has to wait says
/// `Creating` at once, then gets its children when its turn comes, and no second status: still five
/// requests.
#[tokio::test]
async fn a_new_instance_waiting_for_its_turn_says_creating_first() {
    // The cluster lives as long as the session reads its stores.
    let (_cluster, session) = one_turn_for_a_new_instance();
    // Another instance's reconcile holds the only turn.
    let busy = session.ctx.memory.turns.apply().await;
    let waiting = tokio::spawn(reconcile_in_turns(
        Arc::new(memcached(1)),
        session.ctx.clone(),
    ));
    let first_status = async {
        while session
            .ctx
            .writer
            .written
            .fresher::<Memcached>(NS, NAME, &(), None)
            .object
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), first_status)
        .await
        .expect("the first status is written while the reconcile waits for its turn");
    assert!(!waiting.is_finished(), "it waits for its turn");
    drop(busy);
    let action = waiting.await.unwrap().unwrap();
    assert_runs_again_within(&action, memcached_operator::controller::pace::CREATING_HOLD);
    let seen = session.finish().await;
    let requests: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        requests,
        [STATUS, *DEPLOYMENTS, *SERVICES, *HEADLESS, EVENTS],
        "the first status, then the children and their event; the status after them says the same"
    );
    let progressing = condition(&seen[0].body, "Progressing");
    assert_eq!(
        (
            &progressing["status"],
            &progressing["reason"],
            &progressing["message"]
        ),
        (
            &json!("True"),
            &json!("Creating"),
            &json!("creating the Deployment; waiting for its controller to start the pods")
        )
    );
    assert_eq!(condition(&seen[0].body, "Available")["status"], "False");
}

/// Under a burst of new instances, one whose turn comes creates its workload and then gives the turn up to
/// the new instances waiting for theirs; its Services and its one `Created` event come in a second turn,
/// once no new instance waits. The same five requests, in the same order.
#[tokio::test]
async fn a_new_instance_gives_its_turn_up_after_its_workload_while_others_wait_for_theirs() {
    // The cluster lives as long as the session reads its stores.
    let (_cluster, session) = one_turn_for_a_new_instance();
    let ctx = session.ctx.clone();
    // Another instance's reconcile holds the only turn.
    let busy = ctx.memory.turns.apply().await;
    let waiting = tokio::spawn(reconcile_in_turns(Arc::new(memcached(1)), ctx.clone()));
    while !ctx.memory.turns.new_waiting() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A second new instance asks for its turn after this one: what its turn finds written.
    let other = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _turn = ctx.memory.turns.apply_new().await;
            let deployment = ctx
                .writer
                .written
                .fresher::<Deployment>(NS, NAME, &(), None);
            let service = ctx.writer.written.fresher::<Service>(NS, NAME, &(), None);
            (deployment.object.is_some(), service.object.is_some())
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(busy);
    let seen_by_the_other = tokio::time::timeout(Duration::from_secs(5), other)
        .await
        .expect("the other new instance gets its turn")
        .unwrap();
    assert_eq!(
        seen_by_the_other,
        (true, false),
        "the other's turn came after this instance's Deployment and before its Services"
    );
    // A reconcile triggered while the second turn is waited for (its Deployment seen, say) leaves the
    // instance to the wait, though a turn is free: nothing sent, no second `Created` event.
    let meanwhile = reconcile(Arc::new(memcached(1)), ctx.clone())
        .await
        .unwrap();
    assert_eq!(meanwhile, Action::await_change());
    let action = tokio::time::timeout(
        memcached_operator::controller::turns::QUIET + Duration::from_secs(5),
        waiting,
    )
    .await
    .expect("the second turn comes once no new instance has waited for a while")
    .unwrap()
    .unwrap();
    // The status's hold began with the first turn, a quiet time before the second.
    let hold = memcached_operator::controller::pace::CREATING_HOLD
        .min(Settings::default().requeue_after)
        .as_millis() as u64;
    let quiet = memcached_operator::controller::turns::QUIET.as_millis() as u64;
    assert!(
        (hold - quiet - 1000..=hold).any(|ms| action == Action::requeue(Duration::from_millis(ms))),
        "runs again when the status's hold is over: {action:?}"
    );
    drop(ctx);
    let seen = session.finish().await;
    let requests: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        requests,
        [STATUS, *DEPLOYMENTS, *SERVICES, *HEADLESS, EVENTS]
    );
    assert_eq!(
        seen[4].body["note"],
        "Created Deployment cache with 1 replicas, Service cache, Service cache-headless",
        "one event for the children of both turns"
    );
}

/// At the start of a burst nobody waits for a turn yet: the first new instances take theirs at once. One
/// that finds another new instance in its first turn writes its first status right after its workload, not
/// after its Services (the slowest writes of a burst), then goes on in the same turn. The same five
/// requests, the status second, and no second status write (the final one compares with the first).
#[tokio::test]
async fn a_new_instance_in_a_burst_writes_its_first_status_before_its_services() {
    let mut cluster = Cluster::new();
    let script = vec![
        expect(Method::PATCH, *DEPLOYMENTS).create().answer(stored),
        expect(Method::PATCH, STATUS).apply().answer(stored_status),
        expect(Method::PATCH, *SERVICES).create().answer(stored),
        expect(Method::PATCH, *HEADLESS).create().answer(stored),
        event(),
    ];
    let session = Session::start(&cluster, Settings::default(), script, NOW);
    // Another new instance in its first turn.
    let other = session.ctx.memory.turns.first_pass();
    tokio::time::timeout(
        Duration::from_secs(5),
        session.reconcile(&mut cluster, memcached(1)),
    )
    .await
    .expect("one turn")
    .unwrap();
    drop(other);
    let seen = session.finish().await;
    let status = &seen[1].body;
    assert_eq!(condition(status, "Progressing")["reason"], "Creating");
    assert_eq!(
        seen[4].body["note"],
        "Created Deployment cache with 1 replicas, Service cache, Service cache-headless",
        "one event for the children of both turns"
    );
}

#[tokio::test]
async fn a_new_instance_whose_pod_is_starting_writes_nothing_while_it_is_created() {
    let mut cluster = Cluster::new();
    let (_, mc) = create_new(&mut cluster).await;
    // The workload and the pod moved: the status would say "1 pod, none ready", a change of counts only,
    // while it says Creating: held, and due when the hold is over (its first ready server comes first).
    let session = same_process(&cluster, vec![]);
    let action = session.reconcile(&mut cluster, mc).await.unwrap();
    assert!(session.finish().await.is_empty());
    assert_runs_again_within(&action, memcached_operator::controller::pace::CREATING_HOLD);
}

#[tokio::test]
async fn a_new_instance_whose_pod_is_ready_writes_its_server_list_and_status_only() {
    let mut cluster = Cluster::new();
    let (deployment, mc) = create_new(&mut cluster).await;
    the_pod_is_ready(&mut cluster, &deployment);
    let session = same_process(&cluster, published());
    let action = session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert_eq!(seen.len(), 2, "no event for the server list: {seen:#?}");
    assert_eq!(seen[0].body["data"]["servers"], "10.0.0.1:11211\n");
    let status = &seen[1].body;
    assert_eq!(condition(status, "Available")["status"], "True");
    assert_eq!(condition(status, "Progressing")["reason"], "Complete");
    assert_eq!(status["status"]["serverList"], json!(["10.0.0.1:11211"]));
    assert_eq!(status["status"]["observedGeneration"], 1);
}

#[tokio::test]
async fn a_new_instance_once_settled_sends_nothing() {
    let mut cluster = Cluster::new();
    let (deployment, mc) = create_new(&mut cluster).await;
    the_pod_is_ready(&mut cluster, &deployment);
    let session = same_process(&cluster, published());
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    cluster.child::<ConfigMap>(serde_json::from_value(as_stored(&seen[0].body)).unwrap());
    let mc = with_status(&seen[1].body);

    let session = same_process(&cluster, vec![]);
    let action = session.reconcile(&mut cluster, mc).await.unwrap();
    assert!(session.finish().await.is_empty());
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
}

/// The whole life of a new instance in one process, every answer an object as stored and the caches
/// catching up between reconciles with what the operator wrote: seven requests.
#[tokio::test]
async fn a_new_instance_converges_in_seven_requests_in_one_process() {
    let mut cluster = Cluster::new();
    let mut script = creation();
    script.extend(published());
    let session = Session::start(&cluster, Settings::default(), script, NOW);
    session.reconcile(&mut cluster, memcached(1)).await.unwrap();

    // The answers the operator kept are what its watches bring back.
    let written = &session.ctx.writer.written;
    let deployment = serde_json::to_value(
        written
            .fresher::<Deployment>(NS, NAME, &(), None)
            .object
            .expect("the Deployment as stored")
            .as_ref(),
    )
    .unwrap();
    let services: Vec<Value> = [NAME, "cache-headless"]
        .into_iter()
        .map(|name| {
            let service = written.fresher::<Service>(NS, name, &(), None).object;
            serde_json::to_value(service.expect("the Service as stored").as_ref()).unwrap()
        })
        .collect();
    // The instance as the watch brings it back after the operator's last status write.
    let latest = || {
        written
            .fresher::<Memcached>(NS, NAME, &(), None)
            .object
            .expect("the instance with its status, as stored")
            .as_ref()
            .clone()
    };
    let mc = latest();
    assert!(mc.status.is_some(), "the first status, as stored");
    catch_up_with_the_creation(&mut cluster, &deployment, &services);
    // Within the pace of the creation the counts wait; the reconcile asked for then finds the pod ready.
    session.reconcile(&mut cluster, mc.clone()).await.unwrap();

    the_pod_is_ready(&mut cluster, &deployment);
    session.reconcile(&mut cluster, mc.clone()).await.unwrap();

    let list = written
        .fresher::<ConfigMap>(NS, "cache-servers", &(), None)
        .object
        .expect("the server list as stored");
    cluster.child::<ConfigMap>(list.as_ref().clone());
    let settled = session.reconcile(&mut cluster, latest()).await.unwrap();
    assert_eq!(settled, Action::requeue(Duration::from_secs(300)));

    let seen = session.finish().await;
    let requests: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        requests,
        [
            *DEPLOYMENTS,
            *SERVICES,
            *HEADLESS,
            EVENTS,
            STATUS,
            *CONFIG_MAPS,
            STATUS
        ]
    );
}

#[tokio::test]
async fn a_new_instance_whose_pod_cannot_start_says_so_at_once() {
    let mut cluster = Cluster::new();
    let (_, mc) = create_new(&mut cluster).await;
    let mut pod = starting_pod();
    pod.status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .waiting
        .as_mut()
        .unwrap()
        .reason = Some("ImagePullBackOff".into());
    cluster.pod(pod);
    // Within the pace of the creation, but a new Degraded reason is never held.
    let session = same_process(
        &cluster,
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    );
    session.reconcile(&mut cluster, mc).await.unwrap();
    let seen = session.finish().await;
    assert_degraded(&seen[0].body, "ImagePullFailed", "cache-7d9f-a");
    assert_eq!(seen[1].body["type"], "Warning");
}

//! What goes wrong and how it is reported: API errors retried with backoff, rejected applies and specs that
//! cannot be realised Degraded without retrying, pod trouble in the status.

use super::*;

#[tokio::test]
async fn transient_api_errors_are_retried_with_growing_backoff() {
    for (code, reason) in [(500, "InternalError"), (409, "Conflict")] {
        let mut cluster = Cluster::new();
        let run = run(
            &mut cluster,
            memcached(1),
            vec![
                expect(Method::PATCH, *DEPLOYMENTS)
                    .create()
                    .fail(code, reason),
                event(),
            ],
        )
        .await;
        let error = run.result.unwrap_err();
        assert_eq!(error.kind(), "apply");
        assert!(
            error.problem().is_none(),
            "a {code} is not reported as Degraded"
        );
        assert_eq!(run.seen[1].body["reason"], "ReconcileFailed");
        assert_eq!(run.seen[1].body["type"], "Warning");
        assert!(
            run.metrics
                .encode()
                .contains("memcached_operator_reconcile_errors_total{kind=\"apply\"} 1")
        );
    }
}

/// A child that fails midway: what was changed before it is still recorded, in one event, before the failure.
#[tokio::test]
async fn changes_made_before_a_failing_child_are_recorded_before_the_failure() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS).create(),
            expect(Method::PATCH, *SERVICES)
                .create()
                .fail(500, "InternalError"),
            event(),
            event(),
        ],
    )
    .await;
    assert_eq!(run.result.unwrap_err().kind(), "apply");
    assert_eq!(run.seen[2].body["reason"], "Created");
    assert_eq!(
        run.seen[2].body["note"],
        "Created Deployment cache with 1 replicas"
    );
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
    assert_eq!(run.seen[3].body["type"], "Warning");
}

/// A context over `cluster`'s caches whose client is never answered: for what happens without requests.
fn offline_context(cluster: &Cluster) -> Arc<Context> {
    let (service, _handle) = mock::pair::<Request<Body>, Response<Body>>();
    Arc::new(Context::new(
        Client::new(service, NS),
        Settings::default(),
        cluster.stores.clone(),
        Arc::new(Metrics::default()),
        None,
        Arc::new(|| Time(Timestamp::from_second(NOW).unwrap())),
    ))
}

#[tokio::test]
async fn error_policy_backs_off_per_object_and_resets_on_success() {
    let mut cluster = Cluster::new();
    let ctx = offline_context(&cluster);
    let mc = Arc::new(memcached(1));
    let mut other = memcached(1);
    other.metadata.name = Some("other".into());
    // Both are in the instance cache: a failure of an instance that is gone is not counted (see below).
    for instance in [mc.as_ref(), &other] {
        cluster
            .memcacheds
            .apply_watcher_event(&watcher::Event::Apply(instance.clone()));
    }
    let err = Error::Malformed("test".into());
    let delays: Vec<Duration> = (0..6)
        .map(|_| requeue_of(error_policy(mc.clone(), &err, ctx.clone())))
        .collect();
    // Jitter keeps each delay within [ceiling/2, ceiling] of 1, 2, 4, 8, 16, 32 seconds.
    for (i, d) in delays.iter().enumerate() {
        let ceiling = Duration::from_secs(1 << i);
        assert!(*d <= ceiling && *d >= ceiling / 2, "attempt {i}: {d:?}");
    }
    assert!(requeue_of(error_policy(Arc::new(other), &err, ctx.clone())) <= Duration::from_secs(1));

    // A successful reconcile (no writes needed) resets the count.
    ctx.memory
        .backoff
        .reset(&kube::runtime::reflector::ObjectRef::from_obj(mc.as_ref()));
    assert!(requeue_of(error_policy(mc, &err, ctx)) <= Duration::from_secs(1));
    cluster.pods.apply_watcher_event(&watcher::Event::InitDone);
}

/// No reconcile follows a deletion, so nothing would reset the failures of an instance deleted while it
/// was failing: the watch that sees the deletion makes the context forget it, and a failure counted after
/// the instance left the cache is dropped at once.
#[tokio::test]
async fn a_deleted_instance_leaves_nothing_behind_in_memory() {
    let mut cluster = Cluster::new();
    let ctx = offline_context(&cluster);
    let mc = memcached(1);
    let key = kube::runtime::reflector::ObjectRef::from_obj(&mc);
    let err = Error::Malformed("test".into());
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Apply(mc.clone()));
    for _ in 0..3 {
        error_policy(Arc::new(mc.clone()), &err, ctx.clone());
    }
    ctx.memory.pace.wrote(NS, NAME);
    let mut written = mc.clone();
    written.metadata.resource_version = Some("5".into());
    ctx.writer
        .written
        .remember(Arc::new(Compact::encode(&written).unwrap()), &());
    // What was kept of a Secret only this instance names (here, the served auth file it wrote).
    let served = (NS.to_owned(), format!("{NAME}-auth-file"));
    let named = std::collections::BTreeSet::from([served.clone()]);
    ctx.memory
        .secrets
        .cache()
        .name(&(NS.into(), NAME.into()), named);
    ctx.memory
        .secrets
        .wrote_served(NS, &served.1, "3".into(), "hash".into());
    assert_eq!(ctx.memory.backoff.failures(&key), 3);
    assert_eq!(ctx.writer.written.len(), 1);
    assert!(ctx.memory.secrets.cache().holds(NS, &served.1));

    // The watch sees the deletion: the cache drops the instance, then the context forgets it.
    let mut deleted = mc.clone();
    deleted.metadata.resource_version = Some("6".into());
    cluster
        .memcacheds
        .apply_watcher_event(&watcher::Event::Delete(deleted.clone()));
    ctx.forget(&deleted);
    assert_eq!(ctx.memory.backoff.failures(&key), 0);
    assert!(ctx.writer.written.is_empty());
    assert!(
        ctx.memory.secrets.cache().is_empty(),
        "its Secrets go with it"
    );
    let status = MemcachedStatus {
        replicas: 1,
        ..MemcachedStatus::default()
    };
    assert_eq!(
        ctx.memory.pace.hold(NS, NAME, None, &status),
        None,
        "no first-status wait or gap left"
    );

    // A reconcile that was under way fails after the deletion: its failure is not kept either.
    error_policy(Arc::new(mc), &err, ctx.clone());
    assert_eq!(ctx.memory.backoff.failures(&key), 0);
}

fn requeue_of(action: Action) -> Duration {
    // Action has no accessor; its Debug form is stable: `Action { requeue_after: Some(1.5s) }`.
    let text = format!("{action:?}");
    let secs = text
        .split("Some(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no requeue in {text}"));
    if let Some(ms) = secs.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().unwrap() / 1000.0)
    } else {
        Duration::from_secs_f64(secs.trim_end_matches('s').parse().unwrap())
    }
}

#[tokio::test]
async fn rejected_apply_is_reported_as_degraded() {
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS)
                .create()
                .fail(422, "Invalid"),
            expect(Method::PATCH, STATUS).apply(),
            event(),
            event(),
        ],
    )
    .await;
    assert!(run.result.is_err());
    assert_degraded(&run.seen[1].body, "ApplyRejected", "mock says Invalid");
    assert_eq!(run.seen[2].body["reason"], "ApplyRejected");
    assert_eq!(run.seen[3].body["reason"], "ReconcileFailed");
}

#[tokio::test]
async fn names_that_cannot_be_realised_are_degraded_without_retrying() {
    let mut cluster = Cluster::new();
    let mut mc = memcached(1);
    mc.metadata.name = Some("1cache".into());
    let status_path =
        "/apis/cache.example.com/v1alpha1/namespaces/default/memcacheds/1cache/status";
    let run = run(
        &mut cluster,
        mc.clone(),
        vec![expect(Method::PATCH, status_path).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "InvalidName");
    assert_eq!(
        run.seen[0].body["status"]["selector"],
        "app.kubernetes.io/instance=1cache,app.kubernetes.io/name=memcached"
    );
    assert_eq!(run.seen[1].body["reason"], "InvalidName");

    // Recorded once: the next reconcile finds the same status and sends nothing.
    mc.status = Some(serde_json::from_value(run.seen[0].body["status"].clone()).unwrap());
    let again = run_named(&mut cluster, mc).await;
    assert!(again.is_empty());
}

async fn run_named(cluster: &mut Cluster, mc: Memcached) -> Vec<Seen> {
    run(cluster, mc, vec![]).await.seen
}

#[tokio::test]
async fn pod_trouble_shows_in_status() {
    let mut cluster = Cluster::new();
    let (deployment, service, _) = create(&mut cluster, 1).await;
    let mut stuck = settled(&deployment);
    stuck.status.as_mut().unwrap().ready_replicas = Some(0);
    cluster.child::<Deployment>(stuck);
    cluster.child::<Service>(serde_json::from_value(as_stored(&service)).unwrap());
    let mut pod = ready_pod("cache-x");
    pod.status = Some(
        serde_json::from_value(json!({"containerStatuses": [{"name": "memcached", "image": "memcached:nope",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}))
        .unwrap(),
    );
    cluster.pod(pod);
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    run.result.unwrap();
    let degraded = condition(&run.seen[0].body, "Degraded");
    assert_eq!(degraded["reason"], "ImagePullFailed");
    assert_eq!(run.seen[1].body["type"], "Warning");
    assert_eq!(run.seen[1].body["reason"], "ImagePullFailed");
}

#[tokio::test]
async fn invalid_config_is_degraded_and_nothing_is_applied() {
    let mut cluster = Cluster::new();
    let mc = with_spec(1, json!({"memcached": {"extraArgs": ["-m", "4096"]}}));
    let run = run(
        &mut cluster,
        mc,
        vec![expect(Method::PATCH, STATUS).apply(), event()],
    )
    .await;
    assert_eq!(
        run.result.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_degraded(&run.seen[0].body, "InvalidConfig", "extraArgs[0]");
}

/// A managed option smuggled past a server without the CRD's CEL rule (bundled, attached, abbreviated or
/// inside `-o`) is caught by the operator's own walk: Degraded, and no Deployment written.
#[tokio::test]
async fn a_smuggled_managed_option_is_degraded_and_nothing_is_applied() {
    for (args, named) in [
        (
            json!(["-o", "lru_crawler", "-Cp", "1"]),
            "extraArgs[2] \"-Cp\" sets -p/--port",
        ),
        (json!(["-ossl_verify_mode=0"]), "sub-option ssl_verify_mode"),
        (json!(["--udp=11211"]), "sets -U/--udp-port"),
    ] {
        let mut cluster = Cluster::new();
        let mc = with_spec(1, json!({"memcached": {"extraArgs": args}}));
        let run = run(
            &mut cluster,
            mc,
            vec![expect(Method::PATCH, STATUS).apply(), event()],
        )
        .await;
        assert_eq!(
            run.result.unwrap(),
            Action::requeue(Duration::from_secs(300))
        );
        assert_degraded(&run.seen[0].body, "InvalidConfig", named);
    }
}

#[tokio::test]
async fn a_request_without_answer_is_retried_quietly() {
    // The API server went away mid-reconcile: no ReconcileFailed event (it could not be published
    // either), no Degraded status; the error goes to the retry, and the outage is reported once elsewhere.
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![expect(Method::PATCH, *DEPLOYMENTS).create().unanswered()],
    )
    .await;
    let error = run.result.unwrap_err();
    assert!(error.unanswered(), "{error}");
    assert_eq!(run.seen.len(), 1);
    assert!(
        run.metrics
            .encode()
            .contains("memcached_operator_reconcile_errors_total{kind=\"apply\"} 1"),
        "still counted: {}",
        run.metrics.encode()
    );
}

/// Every reconcile runs in a `reconcile` span naming its instance, which ends with the reconcile's
/// outcome: the warning a failure logs says which instance failed, and the span's end says `failed`.
#[tokio::test]
async fn the_reconcile_span_names_the_instance_and_ends_with_the_outcome() {
    let logged = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || Sink(sink.clone()))
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let mut cluster = Cluster::new();
    let run = run(
        &mut cluster,
        memcached(1),
        vec![
            expect(Method::PATCH, *DEPLOYMENTS)
                .create()
                .fail(500, "InternalError"),
            event(),
        ],
    )
    .await;
    assert!(run.result.is_err());
    let text = String::from_utf8(logged.lock().unwrap().clone()).unwrap();
    let line = |words: &str| {
        text.lines()
            .find(|line| line.contains(words))
            .unwrap_or_else(|| panic!("no line says {words:?}:\n{text}"))
    };
    let instance = format!("reconcile{{memcached={NAME} namespace={NS}");
    assert!(line("reconcile failed").contains(&instance), "{text}");
    // The reconcile span's own end (the handover step's span, inside it, ends first).
    let end = line("controller::reconcile: close");
    assert!(end.contains(&instance), "{text}");
    assert!(end.contains("outcome=\"failed\""), "{text}");
}

/// What a test's subscriber writes, kept for the test to read.
struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

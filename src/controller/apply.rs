//! Applying an instance's children, in a fixed order: the auth file the servers load (with
//! `spec.security.auth`, see [`super::secrets::serve_auth_file`]), the drain marks, the server list ConfigMap, the
//! workload, then every kind the table builds ([`crate::store::kinds`], in its order: Services,
//! PodDisruptionBudget, NetworkPolicy, HorizontalPodAutoscaler, ..., the ServiceMonitor last). Only what
//! differs is sent, optional children no longer wanted are removed, a kind the cluster does not serve is
//! a status problem, and what changed is recorded.
//!
//! The server list goes before the workload, so a scale-down is published before any server is removed;
//! it exists only once there was a server to publish. A new instance may give its turn up after its
//! workload (see [`super::turns`]).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use tracing::info;

use super::changes::Changes;
use super::children::{self, Source};
use super::context::Context;
use super::error::Error;
use super::fleet_turn::{Part, template_turn};
use super::pool::{self, Pool};
use super::report::{self, Children, Published};
use super::view::View;
use crate::api::{Server, Workload};
use crate::handover::{self, Rollout};
use crate::resources::scaling::Step;
use crate::resources::{
    Instance, deployment, drift, fleet, labels, pod, proxy, rollout, servers, statefulset,
};
use crate::status::{FleetWait, HandoverProgress, Problem, WorkloadStatus};
use crate::store::compact::{Compact, Compactable};
use crate::store::events::normal;
use crate::store::kinds::{ChildKind, Desired, EachKind, Role, each_kind};
use crate::store::{Publisher, Writer};

/// The workload as applied, and the handovers its rollout runs.
struct AppliedWorkload {
    status: WorkloadStatus,
    created: bool,
    handovers: Vec<HandoverProgress>,
    wait: Option<Duration>,
    /// The operator's change of the template, waiting for the instance's turn.
    fleet: Option<FleetWait>,
}

/// Applies the children (see the module doc) and records what changed in `changes`.
///
/// When `may_yield`, the workload was created now and other new instances wait for their turns, it stops
/// after the workload. When other new instances take their first turns meanwhile (a burst that nobody
/// waits in yet), the instance's first status is written right after its workload.
pub(super) async fn children(
    ctx: &Context,
    view: &View<'_>,
    changes: &mut Changes,
    may_yield: bool,
) -> Result<Children, Error> {
    let secret_hash = view.secret_hash.as_deref();
    let (mc, instance) = (view.mc, view.instance);
    let (writer, events) = (&ctx.writer, &ctx.writer.events);
    let plan = pool::plan(&ctx.handover, &(ctx.clock)(), mc, instance, view.pods);
    unclaimed_names(view)?;
    // Before the workload: its pods load that file.
    let user_file = view.auth_file.as_ref();
    super::secrets::serve_auth_file(writer, &ctx.memory.secrets, instance, user_file).await?;
    drain_events(events, view, &plan, |step| {
        matches!(step, Step::Cancelled { .. })
    })
    .await;
    pool::apply_marks(writer, instance, &plan.marks).await?;
    server_list(writer, view, &plan.servers).await?;
    drain_events(events, view, &plan, |step| {
        matches!(step, Step::Draining { .. })
    })
    .await;
    // The proxy's Deployment carries the hash of what the proxy reads of the Secrets, and with access
    // control the CAs its pods may trust; its template takes the instance's fleet turn with the
    // workload's.
    let proxied = instance
        .with_proxy_secret_hash(view.proxy_secret_hash.clone())
        .with_proxy_access(view.proxy_access.clone());
    let proxy = proxy_part(ctx, view, &proxied).await;
    let parts = (secret_hash, proxy.as_ref());
    let applied = match instance.spec.workload {
        Workload::Deployment => deployment(ctx, view, &plan, parts, changes).await?,
        Workload::StatefulSet => statefulset(ctx, view, &plan, parts, changes).await?,
    };
    let held = proxy.map(|part| Arc::new(part.held(applied.fleet.is_some())));
    let proxied = proxied.with_proxy_fleet(held);
    let handovers = applied.handovers;
    let mut children = Children {
        workload: applied.status,
        servers: plan.servers.clone(),
        drain: plan.drain.clone(),
        pods: view.pods.to_vec(),
        problem: None,
        handovers,
        fleet: applied.fleet,
        wait: [plan.wait, applied.wait].into_iter().flatten().min(),
        yielded: false,
        wrote_first_status: false,
    };
    let turns = &ctx.memory.turns;
    if may_yield && applied.created && turns.new_waiting() {
        children.yielded = true;
        children.wait = None;
        return Ok(children);
    }
    // At the start of a burst nobody waits for a turn yet: the first new instances take theirs at once and
    // find each other here. Their first statuses go now, not after their Services (each allocates a
    // ClusterIP, the slowest writes of a burst); their Services follow in the same turn.
    if applied.created && mc.status.is_none() && turns.other_new_instances() {
        first_status(ctx, view, &children).await?;
        children.wrote_first_status = true;
    }
    drain_events(events, view, &plan, |step| {
        matches!(step, Step::Drained { .. })
    })
    .await;
    children.problem = built(&proxied, view, writer, changes).await?;
    Ok(children)
}

/// The proxy's Deployment as a part of the instance's fleet turn, while the proxy is on (`proxied`: the
/// instance with what the proxy reads of the Secrets).
async fn proxy_part(ctx: &Context, view: &View<'_>, proxied: &Instance<'_>) -> Option<Part> {
    let desired = proxy::deployment(proxied)?;
    let name = proxy::proxy_name(view.instance.name);
    // One not the instance's (another owner's, or not the operator's) is refused when the proxy's
    // Deployment is applied, after the workload, as every optional child: no part to take a turn for.
    let live = children::cached::<Deployment>(view.instance, &name, &view.source()).ok()?;
    let replicas = desired.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let built = desired.spec.as_ref().map(|s| drift::hash_of(&s.template));
    let spec = fleet::proxy_spec_hash(view.instance.spec);
    let built = (spec, built.unwrap_or_default(), replicas);
    Some(Part::of(ctx, view.instance, built, &desired, live.as_deref()).await)
}

/// Publishes an event for each step of the drain that `which` selects.
async fn drain_events(events: &Publisher, view: &View<'_>, plan: &Pool, which: fn(&Step) -> bool) {
    let reference = view.mc.object_ref(&());
    for step in plan.steps.iter().filter(|step| which(step)) {
        let (reason, note) = match *step {
            Step::Cancelled { from, to, size } => (
                "DrainCancelled",
                format!(
                    "Cancelled the drain from {from} to {to} servers: spec.size is {size} again; every \
                     server stays"
                ),
            ),
            Step::Draining { from, to } => (
                "Draining",
                format!(
                    "Draining: published {to} of {from} servers; the other {} go after {} s",
                    from - to,
                    view.instance.spec.drain_seconds()
                ),
            ),
            Step::Drained { from, to } => (
                "Drained",
                format!(
                    "Drained: removing {} servers after the drain ({from} to {to})",
                    from - to
                ),
            ),
        };
        events
            .record(&reference, normal(reason, "Scale", note))
            .await;
    }
}

/// The server list: created with the first published server, in the one write that fills it; from then
/// on kept current, an empty list included.
async fn server_list(writer: &Writer, view: &View<'_>, published: &[Server]) -> Result<(), Error> {
    let instance = view.instance;
    let list = servers::config_map(instance, published);
    let name = list.name_any();
    let source = view.source();
    if !servers::publishes(published) && children::cached(instance, &name, &source)?.is_none() {
        return Ok(());
    }
    let api = writer.api(instance.namespace);
    let applied = children::ensure(instance, list, &source, api).await?;
    // Not an event: it comes with the first ready server, not with the instance's creation, and the
    // list changes with every server that comes and goes. One event per instance says "Created".
    if applied.changed && applied.previous.is_none() {
        info!(config_map = %name, "created the server list with the first ready server");
    }
    proxy_routes(writer, view, published).await
}

/// The proxy's route configuration, over the same list, in the same step: a scale-down reaches the
/// proxy before its servers go. Created with the proxy (over an empty list, if need be: its pods wait
/// for it), deleted with it. Not an event either: it changes with the list.
async fn proxy_routes(writer: &Writer, view: &View<'_>, published: &[Server]) -> Result<(), Error> {
    // With access control the route carries the client CA and the trust epoch the Deployment records.
    let instance = &view.instance.with_proxy_access(view.proxy_access.clone());
    let source = view.source();
    let api = writer.api(instance.namespace);
    let routed = match instance.spec.workload {
        Workload::StatefulSet if instance.spec.proxy().is_some() => pod_routes(view, published)?,
        _ => published.to_vec(),
    };
    match proxy::routes::config_map(instance, &routed) {
        Some(routes) => {
            children::ensure(instance, routes, &source, api).await?;
        }
        None => {
            children::remove(instance, &proxy::proxy_name(instance.name), &source, api).await?;
        }
    }
    Ok(())
}

/// A StatefulSet's published slots as the proxy's route lists them: by their ready pods' addresses, not
/// their DNS names (see [`servers::route_servers`]); a slot whose pod is not ready keeps the address the
/// route as last written (the cached ConfigMap, against the previous `status.servers`) gave it.
fn pod_routes(view: &View<'_>, published: &[Server]) -> Result<Vec<Server>, Error> {
    let instance = view.instance;
    let source = view.source();
    let live: Option<Arc<ConfigMap>> =
        children::cached(instance, &proxy::proxy_name(instance.name), &source)?;
    let written = live
        .as_deref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(proxy::routes::DATA_KEY))
        .and_then(|data| proxy::routes::Route::parse(data).ok())
        .map(|route| route.servers)
        .unwrap_or_default();
    let before = view
        .mc
        .status
        .as_ref()
        .map(|s| s.servers.as_slice())
        .unwrap_or_default();
    let routed = servers::routed_by_slot(before, &written);
    let members: Vec<servers::Member> = view
        .pods
        .iter()
        .filter_map(|p| servers::Member::of(p))
        .collect();
    let port = instance.spec.container_port;
    Ok(servers::route_servers(published, &members, port, &routed))
}

/// The Deployment, with the handover gate on its template while a rollout can be warm, and the copies
/// to the pods that wait behind it.
async fn deployment(
    ctx: &Context,
    view: &View<'_>,
    plan: &Pool,
    (secret_hash, proxy): (Option<&str>, Option<&Part>),
    changes: &mut Changes,
) -> Result<AppliedWorkload, Error> {
    let instance = view.instance;
    let mut desired = deployment::deployment(instance, plan.replicas, secret_hash);
    let live: Option<Arc<Deployment>> = children::cached(instance, instance.name, &view.source())?;
    // Without a surge the old pod goes before the new one starts: nothing to copy from.
    let warm = instance.spec.handover().enabled() && !pod::hard_anti_affinity(instance.spec);
    let turn = (warm, plan.replicas);
    let workload = (&mut desired, live.as_deref());
    let fleet = template_turn(ctx, view, turn, workload, proxy).await;
    // The list a scale changes is published (or held back) above; its copies run from here on.
    let step = ctx
        .handover
        .step(handover(view, plan, Rollout::Deployment))
        .await?;
    let applied = ensure_workload(&ctx.writer, view, desired, plan.replicas, changes, |d| {
        d.spec.as_ref().and_then(|s| s.replicas)
    })
    .await?;
    Ok(AppliedWorkload {
        status: WorkloadStatus::from(applied.as_ref()),
        created: live.is_none(),
        handovers: step.progress,
        wait: step.wait,
        fleet,
    })
}

/// The StatefulSet, its partition stepped by the paced rollout and the spare server's handovers.
async fn statefulset(
    ctx: &Context,
    view: &View<'_>,
    plan: &Pool,
    (secret_hash, proxy): (Option<&str>, Option<&Part>),
    changes: &mut Changes,
) -> Result<AppliedWorkload, Error> {
    let instance = view.instance;
    let mut desired = statefulset::statefulset(instance, plan.replicas, secret_hash, 0);
    let live = children::cached(instance, instance.name, &view.source())?;
    let enabled = instance.spec.handover().enabled();
    let turn = (enabled, plan.replicas);
    let workload = (&mut desired, live.as_deref());
    let fleet = template_turn(ctx, view, turn, workload, proxy).await;
    let pod_refs: Vec<&Pod> = view.pods.iter().map(Arc::as_ref).collect();
    let pace = rollout::paced(
        &desired,
        live.as_deref(),
        &pod_refs,
        instance.spec.warmup_seconds(),
        enabled,
        &(ctx.clock)(),
    );
    let rollout = Rollout::StatefulSet {
        template: desired.spec.as_ref().map(|s| &s.template),
        pace: &pace,
        live: live.as_deref(),
    };
    let staging = ctx.handover.step(handover(view, plan, rollout)).await?;
    statefulset::set_partition(&mut desired, staging.partition.unwrap_or(pace.partition));
    let applied = ensure_workload(&ctx.writer, view, desired, plan.replicas, changes, |s| {
        s.spec.as_ref().and_then(|s| s.replicas)
    })
    .await?;
    Ok(AppliedWorkload {
        status: WorkloadStatus::from(applied.as_ref()),
        created: live.is_none(),
        handovers: staging.progress,
        wait: [pace.wait, staging.wait].into_iter().flatten().min(),
        fleet,
    })
}

/// What warm handover is told of this reconcile (see `crate::handover`): the instance, its pods, the
/// slots as published, the change of the list a scale makes, and the workload's rollout.
fn handover<'v>(view: &'v View<'_>, plan: &'v Pool, rollout: Rollout<'v>) -> handover::View<'v> {
    handover::View {
        mc: view.mc,
        instance: view.instance,
        pods: view.pods,
        servers: &plan.servers,
        hold: &plan.hold,
        rollout,
    }
}

/// Applies the workload (`replicas` of them) and records it as created, scaled or updated.
async fn ensure_workload<K: ChildKind>(
    writer: &Writer,
    view: &View<'_>,
    desired: K,
    replicas: i32,
    changes: &mut Changes,
    replicas_of: fn(&K) -> Option<i32>,
) -> Result<Arc<K>, Error> {
    let (instance, kind) = (view.instance, K::kind(&()));
    let api = writer.api(instance.namespace);
    let applied = children::ensure(instance, desired, &view.source(), api).await?;
    if applied.changed {
        changes.workload();
        let name = instance.name;
        // A workload without replicas has the API server's default, 1.
        let before = applied
            .previous
            .as_deref()
            .map(|p| replicas_of(p).unwrap_or(1));
        match before {
            None => changes.created(format!("{kind} {name} with {replicas} replicas")),
            Some(before) if before != replicas => changes.scaled(format!(
                "{kind} {name} from {before} to {replicas} replicas"
            )),
            Some(_) => changes.updated(format!("{kind} {name}")),
        }
        let rolled = before.is_none_or(|before| before == replicas);
        if rolled && instance.spec.auth().is_some() && instance.spec.tls().is_none() {
            changes.credentials_in_clear(name);
        }
    }
    applied.current()
}

/// Writes the instance's first status from what was just applied (in a burst, before its Services).
async fn first_status(ctx: &Context, view: &View<'_>, children: &Children) -> Result<(), Error> {
    let early = Published {
        servers: children.servers.clone(),
        drain: children.drain.clone(),
        pods: children.pods.clone(),
        handovers: children.handovers.clone(),
        fleet: children.fleet,
    };
    let selector = Some(labels::selector_string(view.instance.name));
    let workload = Some(children.workload.clone());
    report::report(view.mc, ctx, workload, early, None, selector).await?;
    Ok(())
}

/// Refuses, before anything is written, an instance whose server list, workload or Services would have
/// the name of an object the operator does not manage (the table's required names); the optional
/// children are checked as they are applied.
fn unclaimed_names(view: &View<'_>) -> Result<(), Error> {
    struct Unclaimed<'v, 'a> {
        view: &'v View<'a>,
        result: Result<(), Error>,
    }
    impl EachKind for Unclaimed<'_, '_> {
        fn kind<K: ChildKind>(&mut self) {
            if self.result.is_err() {
                return;
            }
            let source = self.view.source::<K>();
            self.result = K::required_names(self.view.instance)
                .iter()
                .try_for_each(|name| children::unclaimed(self.view.instance, name, &source));
        }
    }
    let mut unclaimed = Unclaimed {
        view,
        result: Ok(()),
    };
    each_kind(&mut unclaimed);
    unclaimed.result
}

/// One child of a kind the table builds, to apply (or delete, when `desired` is `None`).
struct Built<K> {
    name: String,
    desired: Option<K>,
}

/// A [`Built`] child of any kind, applied in turn.
trait Apply: Send {
    fn apply<'f>(
        self: Box<Self>,
        writer: &'f Writer,
        view: &'f View<'f>,
        changes: &'f mut Changes,
    ) -> BoxFuture<'f, Result<(), Error>>;
}

impl<K: ChildKind> Apply for Built<K> {
    fn apply<'f>(
        self: Box<Self>,
        writer: &'f Writer,
        view: &'f View<'f>,
        changes: &'f mut Changes,
    ) -> BoxFuture<'f, Result<(), Error>> {
        Box::pin(async move {
            let api = writer.api(view.instance.namespace);
            sync_child(view, &self.name, self.desired, &view.source(), api, changes).await
        })
    }
}

/// Applies every child the table's builders make for `instance` (with what the proxy reads and its fleet
/// turn): those of the [`Role::Built`] kinds in the table's order, then those of the other kinds (see
/// [`ChildKind::desired`]). A child of a kind the cluster does not serve is a problem for the status, not
/// an error: the first such kind is returned.
async fn built(
    instance: &Instance<'_>,
    view: &View<'_>,
    writer: &Writer,
    changes: &mut Changes,
) -> Result<Option<Problem>, Error> {
    struct Collect<'i> {
        instance: &'i Instance<'i>,
        view: &'i View<'i>,
        children: Vec<Box<dyn Apply>>,
        /// The other kinds' (the proxy's Deployment), after the ServiceAccount its pods need.
        last: Vec<Box<dyn Apply>>,
        unserved: Option<Problem>,
    }
    impl EachKind for Collect<'_> {
        fn kind<K: ChildKind>(&mut self) {
            let desired = K::desired(self.instance);
            if !self.view.served::<K>() {
                // Nothing of it exists (its cache is empty), so there is nothing to delete either.
                self.unserved = self.unserved.take().or_else(|| unserved(&desired));
                return;
            }
            for (name, desired) in desired {
                let child: Box<dyn Apply> = Box::new(Built::<K> { name, desired });
                match K::ROLE {
                    Role::Built => self.children.push(child),
                    _ => self.last.push(child),
                }
            }
        }
    }
    let mut collect = Collect {
        instance,
        view,
        children: Vec::new(),
        last: Vec::new(),
        unserved: None,
    };
    each_kind(&mut collect);
    for child in collect.children.into_iter().chain(collect.last) {
        child.apply(writer, view, changes).await?;
    }
    Ok(collect.unserved)
}

/// The status problem of an instance whose `desired` children are of a kind the cluster did not serve at
/// start: none when it asks for none of them.
fn unserved<K: ChildKind>(desired: &Desired<K>) -> Option<Problem> {
    desired.iter().any(|(_, child)| child.is_some()).then(|| Problem {
        reason: format!("{}Unavailable", K::KIND),
        message: format!(
            "the spec asks for a {kind}, but the cluster did not serve {api_version} {kind} when the \
             operator started; install its CRD and restart the operator, or ask for none",
            kind = K::KIND,
            api_version = K::API_VERSION,
        ),
    })
}

/// Applies the child `name` as `desired`, or deletes it when nothing is desired (and the cache shows
/// one), and records what changed.
async fn sync_child<K>(
    view: &View<'_>,
    name: &str,
    desired: Option<K>,
    source: &Source<'_, K>,
    api: Api<Compact<K>>,
    changes: &mut Changes,
) -> Result<(), Error>
where
    K: Compactable + Debug + Send + Sync,
    K::DynamicType: Clone + Eq + Hash,
{
    let what = format!("{} {name}", K::kind(source.dt));
    let instance = view.instance;
    match desired {
        Some(desired) => {
            let applied = children::ensure(instance, desired, source, api).await?;
            match (applied.changed, applied.previous.is_some()) {
                (true, false) => changes.created(what),
                (true, true) => changes.updated(what),
                (false, _) => {}
            }
        }
        None => {
            if children::remove(instance, name, source, api).await? {
                changes.deleted(what);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MemcachedSpec;
    use crate::api::external::VerticalPodAutoscaler;
    use crate::resources::Defaults;
    use crate::resources::testing::memcached;

    /// An instance that asks for a child of a kind the cluster does not serve (the test-only
    /// VerticalPodAutoscaler of the table) is Degraded for it; one that asks for none is not.
    #[test]
    fn a_child_of_an_unserved_kind_is_a_problem_only_when_asked_for() {
        let defaults = Defaults::default();
        let desired = |name: &str| {
            let mc = memcached(name, MemcachedSpec::default());
            VerticalPodAutoscaler::desired(&Instance::new(&mc, &defaults).unwrap())
        };
        let problem = unserved(&desired("cache-vpa")).expect("asked for one");
        assert_eq!(problem.reason, "VerticalPodAutoscalerUnavailable");
        assert!(
            problem.message.contains("autoscaling.k8s.io/v1"),
            "{}",
            problem.message
        );
        assert_eq!(unserved(&desired("cache")), None);
    }
}

//! The stats collector: every `--stats-interval`, the `stats` of every ready server of every instance,
//! into the operand metrics, `status.stats` and eviction events; and, when the proxy is on, its pods'
//! `stats` and `stats proxybe` into the proxy's metrics and `status.stats.proxy` ([`proxies`]).
//!
//! It runs as its own task in the leading replica (it is started by the controller, which only the
//! leader runs) and shares nothing with the reconciler but the caches it reads: a slow or dead server
//! delays neither a reconcile nor another instance. Each pod is read by its own task, under a timeout
//! ([`READ_TIMEOUT`]) and a global bound on connections in flight ([`MAX_READS_IN_FLIGHT`]); each instance
//! is summarised, written and warned about as soon as its own reads are done. A collection starts when
//! the previous one has finished, so a cluster with many dead pods is read less often, never twice at
//! once.
//!
//! Status writes: a server-side apply of only `status.stats`, under its own field manager
//! ([`FIELD_MANAGER`]), so the reconciler's status apply (which never sends `stats`) keeps it and this
//! never touches the reconciler's fields. It is sent only when a value changed and at most once per
//! instance per `--stats-status-interval` (see [`super::summary::should_write`]). Its watch event wakes
//! one reconcile, which finds nothing to do.
//!
//! Certificates: over TLS each read also says which certificate the server presented; a server that
//! presents another than its TLS Secret's `tls.crt` is asked to reload its files (`refresh_certs`) with
//! backoff, and one event per rotation says when they all did (`CertificatesReloaded`) or that they do not
//! ([`super::reload`]).
//!
//! Failures are values, not errors: a server that cannot be read is `memcached_up 0` and counts out of
//! `serversRead`; an instance that cannot be read at all (a missing Secret, unusable credentials, or auth
//! without TLS and without `spec.security.auth.allowPlaintextStats`: [`super::in_clear`]) is logged
//! once when that starts and once when it ends, never per collection.

// Its parts: what the collector holds and shares between its tasks (`state`), reading each pod under the
// bounds (`each`), the proxy pods (`proxies`), the `status.stats` write (`status`) and the events it
// publishes (`events`).
mod each;
mod events;
mod proxies;
mod state;
mod status;

use each::{Gathered, Subject, addresses};
use events::reload_event;
pub use events::{EVICTING, evicting_note};
use proxies::ProxyReads;
pub use state::{
    Collector, IndexedPods, MAX_READS_IN_FLIGHT, MAX_WRITES_IN_FLIGHT, Network, READ_TIMEOUT,
    Reader, Settings, Sources,
};
pub use status::{FIELD_MANAGER, stats_patch};

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::client::{
    CertificateDigest, ExpectedCertificate, Presented, RefreshAnswer, ServerNames, Target,
};
use super::episodes::{self, Counter};
use super::in_clear;
use super::metrics::{InstanceKey, PodSamples};
use super::proxy::ProxySample;
use super::reload::{Observed, Outcome, Reload};
use super::stats::Stats;
use super::summary::{should_write, summarize, summarize_proxy};
use crate::api::{CacheStats, Memcached};
use crate::resources::secrets::Owner;
use crate::store::pod_index::still_at;
use crate::store::secrets::Transport;

/// What the reads of one instance gave.
struct Reads {
    samples: PodSamples,
    /// Per pod read over TLS: the certificate it presented.
    presented: BTreeMap<String, Presented>,
    problem: Option<String>,
}

/// What an instance's collection does after its reads.
struct Next {
    /// `status.stats` is due.
    write: bool,
    /// Evictions started, with how many: one Warning.
    evicting: Option<u64>,
    /// What the certificate reloads came to.
    reloaded: Outcome,
}

impl Collector {
    /// Collects every `interval`, the first time at once, until `shutdown`; then removes the operand
    /// series (a replica that stopped leading no longer knows them).
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) {
        if self.settings.interval.is_zero() {
            // Zero means off (`--stats-interval=0`); the manager does not even start the task then.
            return;
        }
        info!(interval = ?self.settings.interval, status_interval = ?self.settings.status_interval,
            "collecting memcached stats");
        let mut ticks = tokio::time::interval(self.settings.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticks.tick() => {}
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = self.collect() => {}
            }
        }
        self.metrics.clear();
        info!("stopped collecting memcached stats");
    }

    /// One collection of every instance; returns when each is done.
    pub async fn collect(self: &Arc<Self>) {
        let instances = self.memcacheds.state();
        let mut live = HashSet::new();
        let mut tasks = JoinSet::new();
        for mc in instances {
            let key = (mc.namespace().unwrap_or_default(), mc.name_any());
            if mc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            live.insert(key.clone());
            tasks.spawn(self.clone().collect_instance(key, mc));
        }
        while tasks.join_next().await.is_some() {}
        // Deleted instances (and those being deleted): their series and memory go. (What was read of
        // their Secrets goes when the controller forgets them: see `crate::store::secrets`.)
        self.metrics.retain_instances(|key| live.contains(key));
        self.lock_state().retain(|key, _| live.contains(key));
    }

    async fn collect_instance(self: Arc<Self>, key: InstanceKey, mc: Arc<Memcached>) {
        let servers = self.servers(&key, &mc);
        if mc.spec.tls().is_none() {
            // TLS turned off: nothing to reload, no previous CA to trust.
            if let Some(state) = self.lock_state().get_mut(&key) {
                state.reload = Reload::default();
            }
        }
        let proxies = self.proxies(&key, &mc);
        let (reads, proxy_reads) = self.read_instance(&key, &mc, &servers, &proxies).await;
        for shown in reads.presented.values() {
            match &shown.refresh {
                Some(RefreshAnswer::Reloaded) => self.metrics.count_refresh("ok"),
                Some(RefreshAnswer::Refused(_)) => self.metrics.count_refresh("refused"),
                None => {}
            }
        }
        self.metrics
            .set_instance(key.clone(), reads.samples.clone());
        let read: Vec<Stats> = reads.samples.values().flatten().cloned().collect();
        let pods = self.pods.index.pods(&self.pods.store, &key.0, &key.1);
        let routed = {
            let mut state = self.lock_state();
            let routed = &mut state.entry(key.clone()).or_default().routed;
            proxies::remember_routed(routed, &mc, &pods);
            routed.clone()
        };
        let proxy_samples = proxy_reads.samples(&mc, &routed);
        let proxy_read: Vec<ProxySample> = proxy_samples.values().flatten().cloned().collect();
        self.metrics.set_proxies(key.clone(), proxy_samples);
        let proxy = summarize_proxy(proxies.len(), &proxy_read);
        let summary = summarize(servers.len(), &read, proxy);
        let now = Instant::now();
        let next = self.step_state(&key, &mc, &servers, reads, summary.as_ref(), now);
        if next.write
            && self.write_status(&key, summary.as_ref()).await
            && let Some(state) = self.lock_state().get_mut(&key)
        {
            state.last_write = Some(now);
        }
        if let Some(evicted) = next.evicting {
            self.warn_evicting(&key, &mc, evicted, &read).await;
        }
        if let Outcome::Reloaded { servers, .. } = &next.reloaded {
            self.metrics
                .count_reloads(u64::try_from(*servers).unwrap_or(u64::MAX));
        }
        if let Some(event) = reload_event(&mc, &next.reloaded) {
            self.publish(&key, &mc, event).await;
        }
    }

    /// Reads every server and proxy pod of the instance with the transport its Secrets give (none to
    /// read: nothing; Secrets that cannot be used: every pod unreadable, and why).
    async fn read_instance(
        &self,
        key: &InstanceKey,
        mc: &Memcached,
        servers: &[(String, SocketAddr)],
        proxies: &[(String, SocketAddr)],
    ) -> (Reads, ProxyReads) {
        if servers.is_empty() && proxies.is_empty() {
            let reads = Reads {
                samples: PodSamples::new(),
                presented: BTreeMap::new(),
                problem: None,
            };
            return (reads, ProxyReads::default());
        }
        // Told the TLS Secret's certificate and CA, gives the previous CA to trust during a rotation.
        let previous = |certificate: Result<CertificateDigest, String>, ca: Option<&[u8]>| {
            let mut state = self.lock_state();
            let reload = &mut state.entry(key.clone()).or_default().reload;
            reload.secret(certificate, ca);
            reload.previous_ca().map(<[u8]>::to_vec)
        };
        let owner = Owner {
            namespace: &key.0,
            uid: mc.metadata.uid.as_deref().unwrap_or_default(),
        };
        let transport = match in_clear::refused(&mc.spec) {
            Some(refused) => Err(refused),
            None => {
                let transport = self.secrets.transport(&key.1, &owner, &mc.spec, &previous);
                transport.await
            }
        };
        match transport {
            Ok(transport) => {
                if transport.presents_server_certificate {
                    self.note_shared_identity(key);
                }
                let (mut reads, mut proxy) = tokio::join!(
                    self.read_all(key, servers, &transport),
                    self.read_proxies(key, proxies, &transport)
                );
                reads.problem = match (reads.problem, proxy.problem.take()) {
                    (Some(servers), Some(proxies)) => Some(format!("{servers}; {proxies}")),
                    (servers, proxies) => servers.or(proxies),
                };
                (reads, proxy)
            }
            Err(reason) => {
                let result = match in_clear::refused(&mc.spec) {
                    Some(_) => in_clear::NOT_IN_CLEAR,
                    None => "unreadable",
                };
                for _ in servers.iter().chain(proxies) {
                    self.metrics.count_read(result);
                }
                let reads = Reads {
                    samples: servers.iter().map(|(pod, _)| (pod.clone(), None)).collect(),
                    presented: BTreeMap::new(),
                    problem: Some(reason),
                };
                (reads, ProxyReads::unreadable(proxies))
            }
        }
    }

    /// Moves the instance's kept state on from what was read: the certificate reloads, the problem
    /// logged, the eviction episode, and whether `status.stats` is due.
    fn step_state(
        &self,
        key: &InstanceKey,
        mc: &Memcached,
        servers: &[(String, SocketAddr)],
        reads: Reads,
        summary: Option<&CacheStats>,
        now: Instant,
    ) -> Next {
        let counters: BTreeMap<String, Counter> = reads
            .samples
            .iter()
            .filter_map(|(pod, stats)| {
                let s = stats.as_ref()?;
                let counter = Counter {
                    uptime_seconds: s.uptime_seconds,
                    evictions: s.evictions,
                };
                Some((pod.clone(), counter))
            })
            .collect();
        let stored = mc.status.as_ref().and_then(|s| s.stats.as_ref());
        let mut state = self.lock_state();
        let state = state.entry(key.clone()).or_default();
        let observed: Vec<Observed<'_>> = servers
            .iter()
            .map(|(pod, _)| Observed {
                pod,
                presented: reads.presented.get(pod),
            })
            .collect();
        let reloaded = if mc.spec.tls().is_some() {
            state.reload.observe(now, self.settings.interval, &observed)
        } else {
            Outcome::Nothing
        };
        if state.problem != reads.problem {
            log_problem(key, state.problem.as_deref(), reads.problem.as_deref());
            state.problem = reads.problem;
        }
        let evicted = episodes::evicted(&state.counters, &counters);
        let (episode, started) = episodes::step(&state.episode, evicted);
        state.episode = episode;
        state.counters = counters;
        let interval = self.settings.status_interval;
        Next {
            write: should_write(stored, summary, state.last_write, now, interval),
            evicting: started.then_some(evicted.unwrap_or_default()),
            reloaded,
        }
    }

    /// Says once per instance (and leader) that the operator presents the server's own certificate to the
    /// instance's servers: it works when that certificate may be used for client authentication, but the
    /// operator then has no identity of its own, which `clientSecretName` gives it.
    fn note_shared_identity(&self, key: &InstanceKey) {
        let mut state = self.lock_state();
        let state = state.entry(key.clone()).or_default();
        if !state.identity_noted {
            state.identity_noted = true;
            let (namespace, name) = key;
            info!(memcached = %name, %namespace,
                "clientAuth is on without spec.security.tls.clientSecretName: the operator presents the \
                 server certificate (tls.crt of spec.security.tls.secretName) as its client certificate \
                 when it reads stats; set clientSecretName to give it a certificate of its own");
        }
    }

    /// The instance's ready, non-terminating pods with an address: (pod name, podIP:containerPort).
    fn servers(
        &self,
        (namespace, name): &InstanceKey,
        mc: &Memcached,
    ) -> Vec<(String, SocketAddr)> {
        let Ok(port) = u16::try_from(mc.spec.container_port) else {
            return Vec::new();
        };
        let pods = self.pods.index.pods(&self.pods.store, namespace, name);
        addresses(&pods, port)
    }

    /// Reads every server, each in its own task; the samples by pod, and what failed, if anything.
    async fn read_all(
        &self,
        (namespace, name): &InstanceKey,
        servers: &[(String, SocketAddr)],
        transport: &Transport,
    ) -> Reads {
        let key = (namespace.clone(), name.clone());
        let may_refresh: Vec<bool> = {
            let state = self.lock_state();
            let reload = state.get(&key).map(|state| &state.reload);
            servers
                .iter()
                .map(|(pod, _)| reload.is_none_or(|reload| reload.may_refresh(pod)))
                .collect()
        };
        let mut reads = Vec::new();
        for ((pod, address), refresh) in servers.iter().zip(may_refresh) {
            let names = match transport.tls {
                Some(_) => {
                    ServerNames::for_pod(name, namespace, pod, &self.settings.cluster_domain)
                }
                None => ServerNames::default(),
            };
            let target = Target {
                address: *address,
                tls: transport.tls.clone(),
                names,
                credentials: transport.credentials.clone(),
                still_the_pod: Some(still_at(&self.pods.store, namespace, pod, address.ip())),
                certificate: transport
                    .certificate
                    .clone()
                    .and_then(Result::ok)
                    .filter(|_| transport.tls.is_some())
                    .map(|digest| ExpectedCertificate { digest, refresh }),
            };
            reads.push((pod.clone(), self.reader.read(target, READ_TIMEOUT)));
        }
        let subject = Subject {
            stats: "memcached stats",
            pods: "servers",
        };
        let Gathered { readings, problem } = self.read_each(reads, subject).await;
        let mut samples = PodSamples::new();
        let mut presented = BTreeMap::new();
        for (pod, reading) in readings {
            let stats = reading.map(|reading| {
                if let Some(shown) = reading.certificate {
                    presented.insert(pod.clone(), shown);
                }
                reading.stats
            });
            samples.insert(pod, stats);
        }
        Reads {
            samples,
            presented,
            problem,
        }
    }
}

fn log_problem((namespace, name): &InstanceKey, before: Option<&str>, now: Option<&str>) {
    match now {
        Some(problem) => {
            warn!(memcached = %name, %namespace, %problem, "cannot read memcached stats")
        }
        None if before.is_some() => {
            info!(memcached = %name, %namespace, "memcached stats readable again")
        }
        None => {}
    }
}

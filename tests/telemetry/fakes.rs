//! What the collector talks to in these tests: fake memcached servers on 127.0.x.y addresses (Linux
//! answers all of 127.0.0.0/8 on the loopback interface, so pods can have distinct IPs and share the
//! container port), the scripted API server's rules for what the collector asks of it
//! ([`crate::common::scripted`]), and the caches as the operator's watches would fill them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Client;
use kube::api::PartialObjectMeta;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use memcached_operator::api::Memcached;
use memcached_operator::store::{Cache, CacheWriter, Compact, PodIndex, Publisher, cache};
use memcached_operator::telemetry::metrics::OperandMetrics;
use memcached_operator::telemetry::{Collector, IndexedPods, Network, Settings, Sources};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto::ring};

pub use crate::common::memcached::Mode;
use crate::common::memcached::converse;
use crate::common::scripted::writes;
pub use crate::common::scripted::{Api, NS, Secrets};

// ---------------------------------------------------------------------------------------------------
// Fake memcached servers.

/// What a fake server reports; changed between collections by the tests.
#[derive(Clone, Debug)]
pub struct Values {
    pub uptime: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub items: u64,
    pub bytes: u64,
    pub limit: u64,
    pub connections: u64,
}

impl Default for Values {
    fn default() -> Self {
        Self {
            uptime: 100,
            hits: 2,
            misses: 1,
            evictions: 0,
            items: 5,
            bytes: 1024,
            limit: 64 * 1024 * 1024,
            connections: 3,
        }
    }
}

impl Values {
    fn reply(&self) -> String {
        format!(
            "STAT pid 1\r\nSTAT uptime {}\r\nSTAT curr_connections {}\r\nSTAT rejected_connections 0\r\n\
             STAT get_hits {}\r\nSTAT get_misses {}\r\nSTAT bytes_read 10\r\nSTAT bytes_written 20\r\n\
             STAT limit_maxbytes {}\r\nSTAT bytes {}\r\nSTAT curr_items {}\r\nSTAT evictions {}\r\nEND\r\n",
            self.uptime,
            self.connections,
            self.hits,
            self.misses,
            self.limit,
            self.bytes,
            self.items,
            self.evictions
        )
    }
}

/// A running fake memcached: its address, what it reports, and how many connections it accepted.
pub struct Server {
    pub address: SocketAddr,
    pub values: Arc<Mutex<Values>>,
    pub connections: Arc<AtomicUsize>,
}

impl Server {
    pub fn set(&self, change: impl FnOnce(&mut Values)) {
        change(&mut self.values.lock().unwrap());
    }
}

/// Options of a fake server: TLS, and the `user password` the auth `set` must carry.
#[derive(Clone, Default)]
pub struct Security {
    pub tls: Option<Arc<ServerConfig>>,
    pub auth: Option<String>,
}

/// Starts a fake memcached on `ip:port` (`port` 0: any).
pub async fn server(ip: &str, port: u16, mode: Mode, security: Security) -> Server {
    let listener = TcpListener::bind((ip, port))
        .await
        .expect("bind a fake memcached");
    let address = listener.local_addr().unwrap();
    let values = Arc::new(Mutex::new(Values::default()));
    let connections = Arc::new(AtomicUsize::new(0));
    let (v, c) = (values.clone(), connections.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let (values, security) = (v.clone(), security.clone());
            tokio::spawn(async move {
                let reply = values.lock().unwrap().reply();
                match &security.tls {
                    Some(config) => {
                        if let Ok(tls) = TlsAcceptor::from(config.clone()).accept(stream).await {
                            converse(tls, mode, security.auth.as_deref(), reply.as_bytes()).await;
                        }
                    }
                    None => {
                        converse(stream, mode, security.auth.as_deref(), reply.as_bytes()).await
                    }
                }
            });
        }
    });
    Server {
        address,
        values,
        connections,
    }
}

/// An address on `ip` where nothing listens: a dead pod.
pub async fn dead(ip: &str, port: u16) -> SocketAddr {
    let listener = TcpListener::bind((ip, port)).await.expect("bind");
    let address = listener.local_addr().unwrap();
    drop(listener);
    address
}

// ---------------------------------------------------------------------------------------------------
// Certificates, made at test time.

pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate chain and its key, PEM.
pub struct Leaf {
    pub chain: String,
    pub key: String,
}

impl Pki {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(DnType::CommonName, "instance CA");
        Self {
            ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The instance's certificate, as a Secret with `clientAuth` holds it: the servers present it, and
    /// the operator presents it as its client identity, so it is good for both.
    pub fn leaf(&self) -> Leaf {
        let mut params = CertificateParams::new(vec!["cache.default.svc".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "cache");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.ca).unwrap();
        Leaf {
            chain: certificate.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server that presents `leaf` and requires a client certificate signed by this CA.
    pub fn mutual_server(&self, leaf: &Leaf) -> Arc<ServerConfig> {
        let provider = Arc::new(ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .unwrap();
        let chain = CertificateDer::pem_slice_iter(leaf.chain.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap();
        Arc::new(
            ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .unwrap(),
        )
    }
}

// ---------------------------------------------------------------------------------------------------
// The API server.

/// The scripted API server as the collector needs it: the Secrets in `secrets`, and every write (status
/// applies, events) echoed.
pub fn api(secrets: &Secrets) -> (Client, Api) {
    Api::start(vec![], vec![secrets.rule(), writes()])
}

// ---------------------------------------------------------------------------------------------------
// Caches and the collector.

pub struct Caches {
    pub memcacheds: Writer<Memcached>,
    pub pods: CacheWriter<Pod>,
    pub secrets: Writer<PartialObjectMeta<Secret>>,
    pod_index: PodIndex,
    stores: (
        Store<Memcached>,
        Cache<Pod>,
        Store<PartialObjectMeta<Secret>>,
    ),
}

impl Caches {
    pub fn new() -> Self {
        let (m, mut memcacheds) = reflector::store();
        let (p, mut pods) = cache();
        let (s, mut secrets) = reflector::store();
        memcacheds.apply_watcher_event(&watcher::Event::InitDone);
        pods.apply_watcher_event(&watcher::Event::InitDone);
        secrets.apply_watcher_event(&watcher::Event::InitDone);
        Self {
            memcacheds,
            pods,
            secrets,
            pod_index: PodIndex::default(),
            stores: (m, p, s),
        }
    }

    pub fn instance(&mut self, mc: &Memcached) {
        self.memcacheds
            .apply_watcher_event(&watcher::Event::Apply(mc.clone()));
    }

    pub fn remove_instance(&mut self, mc: &Memcached) {
        self.memcacheds
            .apply_watcher_event(&watcher::Event::Delete(mc.clone()));
    }

    pub fn pod(&mut self, pod: &Pod) {
        let event = watcher::Event::Apply(Compact::encode(pod).unwrap());
        self.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }

    pub fn remove_pod(&mut self, pod: &Pod) {
        let event = watcher::Event::Delete(Compact::encode(pod).unwrap());
        self.pod_index.observe(&event);
        self.pods.apply_watcher_event(&event);
    }

    /// A Secret as the metadata-only watch sees it.
    pub fn secret(&mut self, name: &str, version: &str) {
        let meta: PartialObjectMeta<Secret> = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "namespace": NS, "resourceVersion": version}
        }))
        .unwrap();
        self.secrets
            .apply_watcher_event(&watcher::Event::Apply(meta));
    }

    /// A collector over these caches, reading over the network, writing to `client`.
    pub fn collector(
        &self,
        client: Client,
        status_interval: Duration,
    ) -> (Arc<Collector>, Arc<OperandMetrics>) {
        let metrics = Arc::new(OperandMetrics::default());
        let events = Arc::new(Publisher::new(
            client.clone(),
            Reporter {
                controller: "memcached-operator".into(),
                instance: Some("test".into()),
            },
            std::time::Duration::from_secs(5),
        ));
        let collector = Collector::new(
            Settings {
                interval: Duration::from_secs(30),
                status_interval,
                cluster_domain: "cluster.local".into(),
            },
            Sources {
                client: client.clone(),
                memcacheds: self.stores.0.clone(),
                pods: IndexedPods {
                    store: self.stores.1.clone(),
                    index: self.pod_index.clone(),
                },
                secrets: memcached_operator::store::SecretReader::new(
                    client.clone(),
                    self.stores.2.clone(),
                    Default::default(),
                    memcached_operator::store::digest_key::DigestKey::fixed(DIGEST_KEY),
                ),
            },
            metrics.clone(),
            events,
            Arc::new(Network),
        );
        (Arc::new(collector), metrics)
    }
}

/// An instance on `port`, with `spec` fields merged in.
pub fn instance(name: &str, port: u16, spec: Value) -> Memcached {
    let mut full = json!({"size": 1, "containerPort": port});
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "generation": 1},
        "spec": full
    }))
    .unwrap()
}

/// A pod of `instance` at `ip`; `ready` and `terminating` as given.
pub fn pod(instance: &str, name: &str, ip: &str, ready: bool, terminating: bool) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS, "labels": {
            "app.kubernetes.io/name": "memcached", "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/managed-by": "memcached-operator"}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    });
    if terminating {
        pod["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    }
    serde_json::from_value(pod).unwrap()
}

/// The value of the series `name{labels}` in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The operand metrics as exposed.
pub fn exposition(metrics: &Arc<OperandMetrics>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(metrics.clone()));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

/// The digest key the collector is given.
pub const DIGEST_KEY: &[u8] = &[7; 32];

/// The `user password` the operator authenticates to the servers of instance `name` with: its own entry
/// of the served auth file, derived from [`DIGEST_KEY`] and the instance's namespace and UID.
pub fn operator_auth(name: &str) -> String {
    use memcached_operator::resources::auth_file::OPERATOR_USER;
    use memcached_operator::resources::secrets::{Owner, operator_password};
    let uid = format!("uid-{name}");
    let owner = Owner {
        namespace: NS,
        uid: &uid,
    };
    format!(
        "{OPERATOR_USER} {}",
        operator_password(DIGEST_KEY, &owner).as_str()
    )
}

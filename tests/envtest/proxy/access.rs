//! Access control through the proxy (`spec.proxy.access`), end to end on real servers and a real proxy:
//! two identities with disjoint key prefixes (`orders:`, `reports:`), each a pymemcache client presenting
//! its certificate (signed by the client CA of the Secret `clients-ca`), fill their keys and read every
//! one back after a scale and a rollout of the pool; each is refused on the other's keys; a client
//! without a certificate, and one whose certificate (with the same common name) another CA signed, fail
//! the handshake; `stats`, `flush_all`, `watch` and `version` from a client are refused. Then the
//! identities change and a CA is added, each reaching the running proxy within the route's bound and
//! without restarting it; and a CA removed from the Secret replaces the proxy pod (memcached keeps a CA
//! it loaded until it restarts), after which that CA's clients are refused. The operator reads the
//! proxy's stats on its own listener throughout (`status.stats.proxy`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::{Value, json};

use super::{
    RouteWatch, VALUE_LEN, proxy_available, proxy_follows, proxy_pod, proxy_tls_secret,
    reloads_in_time, same_proxy,
};
use crate::instances::{apply, memcacheds};
use crate::real_clients::{drive, published};
use crate::secrets::apply as apply_secret;
use crate::{Scenario, wait_for};

/// Keys of each identity.
const KEYS: usize = 5_000;
/// The proxy's plain listener on its loopback (the stand-in kubelet moves it to the pod's IP).
const LOOPBACK_PORT: u16 = 11299;
/// Stats every 2 s, each change written: the operator's read of the proxy shows in the status soon.
const OPERATOR_ARGS: &[&str] = &["--stats-interval", "2s", "--stats-status-interval", "2s"];
const DENIED: &str = "CLIENT_ERROR access denied";

fn spec(size: usize, memory: i64, reports_prefixes: &[&str]) -> Value {
    json!({
        "size": size,
        "memcached": {"maxMemoryMB": memory},
        "scaling": {"drainSeconds": 2},
        "highAvailability": {"preStopDelaySeconds": 1, "terminationGracePeriodSeconds": 5},
        "security": {"tls": {"secretName": "cache-tls"}},
        "proxy": {
            "enabled": true, "replicas": 1, "image": "example.com/memcached:1.6-proxy-tls",
            "access": {
                "clientCA": {"secretName": "clients-ca"},
                "identities": [
                    {"name": "orders", "commonName": "orders.clients", "prefixes": ["orders:"]},
                    {"name": "reports", "commonName": "reports.clients", "prefixes": reports_prefixes},
                ],
            },
        },
    })
}

/// A CA, its certificate's PEM.
fn ca(name: &str) -> (CertifiedIssuer<'static, KeyPair>, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    let pem = issuer.pem();
    (issuer, pem)
}

/// A client certificate with common name `cn`, signed by `ca`, as `clients.py` takes it.
fn client(ca: &CertifiedIssuer<'static, KeyPair>, cn: &str) -> Value {
    let key = KeyPair::generate().expect("client key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
    params.distinguished_name.push(DnType::CommonName, cn);
    let cert = params.signed_by(&key, ca).expect("client certificate");
    json!({"cert": cert.pem(), "key": key.serialize_pem()})
}

/// Writes the client CA Secret with `pems`.
async fn client_cas(s: &Scenario, pems: &[&str]) {
    let data = [("ca.crt".to_owned(), ByteString(pems.concat().into_bytes()))]
        .into_iter()
        .collect();
    apply_secret(s, "clients-ca", "Opaque", data).await;
}

/// The proxy as clients reach it: the Service's name (resolved to the pod by the client's hosts
/// file), its port, and the CA the proxy's certificate is checked against.
struct Proxy<'a> {
    s: &'a Scenario,
    address: String,
    ca: &'a str,
}

impl Proxy<'_> {
    fn request(&self, mut request: Value, cert: Option<&Value>) -> Value {
        let name = format!("cache-proxy.{}.svc", self.s.namespace);
        let (ip, port) = self.address.rsplit_once(':').expect("ip:port");
        request["servers"] = json!([format!("{name}:{port}")]);
        request["hosts"] = json!({name: ip});
        request["tls_ca"] = json!(self.ca);
        if let Some(cert) = cert {
            request["tls_cert"] = cert.clone();
        }
        request
    }

    /// `op` (`fill` or `count`) of [`KEYS`] keys under `prefix` as `cert`: keys stored or hit.
    async fn keys(&self, op: &str, cert: &Value, prefix: &str) -> usize {
        let request = json!({"op": op, "hashing": "plain", "keys": KEYS, "value_len": VALUE_LEN,
                             "key_prefix": prefix});
        let answer = drive(self.request(request, Some(cert)))
            .await
            .unwrap_or_else(|e| panic!("{op} of {prefix} keys: {e}"));
        answer["hits"]
            .as_u64()
            .unwrap_or_else(|| panic!("{answer}")) as usize
    }

    /// Each of `commands` on a new connection as `cert`: the first line of each answer.
    async fn raw(&self, cert: Option<&Value>, commands: &[&str]) -> Vec<String> {
        let answer = drive(self.request(json!({"op": "raw", "commands": commands}), cert))
            .await
            .unwrap_or_else(|e| panic!("raw commands: {e}"));
        serde_json::from_value(answer["answers"].clone())
            .unwrap_or_else(|e| panic!("{e}: {answer}"))
    }
}

/// Both identities' keys all hit after `step`.
async fn both_hit(s: &Scenario, proxy: &Proxy<'_>, orders: &Value, reports: &Value, step: &str) {
    let hits = (
        proxy.keys("count", orders, "orders:").await,
        proxy.keys("count", reports, "reports:").await,
    );
    s.step(&format!(
        "after the {step}: orders hit {} of {KEYS}, reports hit {} of {KEYS}",
        hits.0, hits.1
    ));
    assert_eq!(
        hits,
        (KEYS, KEYS),
        "every key of each identity hits after the {step}"
    );
}

/// Polls `check` every 50 ms for up to 30 s: how long it took to hold.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if check().await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 30 s");
}

#[tokio::test]
async fn two_identities_keep_their_own_keys_and_nothing_else() {
    let Some(s) = super::start_with("proxy-access", OPERATOR_ARGS).await else {
        return;
    };
    let server_ca = proxy_tls_secret(&s).await;
    let (clients_ca, clients_pem) = ca("clients CA");
    let (other_ca, other_pem) = ca("other CA");
    let orders = client(&clients_ca, "orders.clients");
    let reports = client(&clients_ca, "reports.clients");
    let forged = client(&other_ca, "orders.clients");
    client_cas(&s, &[&clients_pem]).await;

    apply(&s, "cache", spec(2, 64, &["reports:"])).await;
    let list = published(&s, 2, &BTreeSet::new(), Duration::from_secs(120)).await;
    let pod = proxy_pod(&s).await;
    proxy_available(&s).await;
    let proxy = Proxy {
        s: &s,
        address: pod.0.clone(),
        ca: &server_ca,
    };
    let (ip, _) = pod.0.rsplit_once(':').expect("ip:port");
    let plain_stats = format!("{ip}:{LOOPBACK_PORT}");
    let mut reloads = proxy_follows(&s, &plain_stats, &list, 1).await;

    let stored = (
        proxy.keys("fill", &orders, "orders:").await,
        proxy.keys("fill", &reports, "reports:").await,
    );
    s.step(&format!(
        "stored through the proxy: orders {} and reports {} of {KEYS}",
        stored.0, stored.1
    ));
    assert_eq!(stored, (KEYS, KEYS));

    // Each identity is refused on the other's keys, reads and writes alike.
    let theirs = [
        "get reports:real-client-key-00000\r\n",
        "set reports:x 0 0 1\r\nx\r\n",
        "delete reports:real-client-key-00001\r\n",
        "mg reports:real-client-key-00002 v\r\n",
        "get orders:real-client-key-00000 reports:real-client-key-00000\r\n",
    ];
    let answers = proxy.raw(Some(&orders), &theirs).await;
    s.step(&format!("orders on reports' keys: {answers:?}"));
    assert_eq!(answers[..4], [DENIED; 4]);
    assert!(
        answers[4].starts_with("VALUE orders:"),
        "its own key of a multi-get: {answers:?}"
    );
    let answers = proxy
        .raw(
            Some(&reports),
            &[
                "get orders:real-client-key-00000\r\n",
                "set orders:x 0 0 1\r\nx\r\n",
            ],
        )
        .await;
    s.step(&format!("reports on orders' keys: {answers:?}"));
    assert_eq!(answers, [DENIED; 2]);

    // Every other command, from a client: refused (an error, or the connection closed).
    let others = [
        "stats\r\n",
        "flush_all\r\n",
        "watch\r\n",
        "version\r\n",
        "lru_crawler metadump all\r\n",
    ];
    let answers = proxy.raw(Some(&orders), &others).await;
    s.step(&format!("other commands from a client: {answers:?}"));
    for (command, answer) in others.iter().zip(&answers) {
        assert!(
            answer.starts_with("CLIENT_ERROR") || answer == "closed",
            "{command:?}: {answer}"
        );
    }
    // Without a certificate, or with one of another CA (the same common name): no handshake.
    let strangers = (
        proxy
            .raw(None, &["get orders:real-client-key-00000\r\n"])
            .await,
        proxy
            .raw(Some(&forged), &["get orders:real-client-key-00000\r\n"])
            .await,
    );
    s.step(&format!(
        "no certificate: {:?}; another CA's: {:?}",
        strangers.0, strangers.1
    ));
    assert!(strangers.0[0].starts_with("error") || strangers.0[0] == "closed");
    assert!(strangers.1[0].starts_with("error") || strangers.1[0] == "closed");

    // A scale and a rollout of the pool: every key of each identity still hits.
    for (step, size, memory, rolls) in [
        ("scale 2 -> 3", 3, 64, false),
        ("rollout (-m 64 -> 65)", 3, 65, true),
    ] {
        let watch = RouteWatch::start(&s, &plain_stats);
        apply(&s, "cache", spec(size, memory, &["reports:"])).await;
        let replaced = if rolls {
            list.uids.clone()
        } else {
            BTreeSet::new()
        };
        let list = published(&s, size, &replaced, Duration::from_secs(300)).await;
        reloads = proxy_follows(&s, &plain_stats, &list, reloads + 1).await;
        reloads_in_time(&s, step, &watch.stop().await, true);
        both_hit(&s, &proxy, &orders, &reports, step).await;
        same_proxy(&s, &pod, step).await;
    }

    // Changed identities reach the running proxy within the route's bound.
    let watch = RouteWatch::start(&s, &plain_stats);
    let applied = Instant::now();
    apply(&s, "cache", spec(3, 65, &["reports:", "shared:"])).await;
    let took = until("reports may write shared: keys", async || {
        proxy
            .raw(Some(&reports), &["set shared:1 0 0 1\r\nx\r\n"])
            .await
            == ["STORED"]
    })
    .await;
    reloads_in_time(&s, "identities changed", &watch.stop().await, true);
    s.step(&format!(
        "reports may write shared: {:.2} s after the spec changed (the poll took {:.2} s)",
        applied.elapsed().as_secs_f64(),
        took.as_secs_f64()
    ));
    same_proxy(&s, &pod, "identities changed").await;

    // An added CA, too, without replacing the proxy.
    let watch = RouteWatch::start(&s, &plain_stats);
    client_cas(&s, &[&clients_pem, &other_pem]).await;
    let took = until("the other CA's client is let in", async || {
        proxy
            .raw(Some(&forged), &["get orders:real-client-key-00000\r\n"])
            .await[0]
            .starts_with("VALUE")
    })
    .await;
    reloads_in_time(&s, "a CA added", &watch.stop().await, true);
    s.step(&format!(
        "a CA added: its client let in after {:.2} s",
        took.as_secs_f64()
    ));
    same_proxy(&s, &pod, "a CA added").await;

    // A CA removed: the proxy pod is replaced, and the removed CA's clients are refused.
    client_cas(&s, &[&other_pem]).await;
    let replaced = wait_for("a new proxy pod", Duration::from_secs(120), || async {
        let now = proxy_pod(&s).await;
        (now.1 != pod.1)
            .then_some(now)
            .ok_or(format!("still {}", pod.1))
    })
    .await;
    let proxy = Proxy {
        s: &s,
        address: replaced.0.clone(),
        ca: &server_ca,
    };
    let answers = (
        proxy
            .raw(Some(&orders), &["get orders:real-client-key-00000\r\n"])
            .await,
        proxy
            .raw(Some(&forged), &["get orders:real-client-key-00000\r\n"])
            .await,
    );
    s.step(&format!(
        "a CA removed: proxy pod {} replaced by {}; the removed CA's client: {:?}; the remaining CA's: {:?}",
        pod.1, replaced.1, answers.0, answers.1
    ));
    assert!(answers.0[0].starts_with("error") || answers.0[0] == "closed");
    assert!(answers.1[0].starts_with("VALUE"), "{answers:?}");

    // The operator reads the proxy's stats on its own listener.
    let api = memcacheds(&s);
    let read = wait_for(
        "status.stats.proxy with the proxy pod read",
        Duration::from_secs(60),
        || async {
            let mc = api.get("cache").await.map_err(|e| e.to_string())?;
            match mc.status.and_then(|st| st.stats).and_then(|st| st.proxy) {
                Some(proxy) if proxy.proxies_read == 1 => Ok(format!("{proxy:?}")),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    s.step(&format!(
        "the operator read the proxy on its stats listener: {read}"
    ));
}

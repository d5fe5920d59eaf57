//! The Secrets an instance with TLS and auth needs, made at test time.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::{FIELD_MANAGER, Scenario};

pub async fn apply(s: &Scenario, name: &str, type_: &str, data: BTreeMap<String, ByteString>) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(s.namespace.clone()),
            ..Default::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(data),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&secret).expect("a Secret serializes");
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    Api::<Secret>::namespaced(s.client.clone(), &s.namespace)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&value),
        )
        .await
        .unwrap_or_else(|e| panic!("applying Secret {name}: {e}"));
}

/// A `kubernetes.io/tls` Secret `name` with a server certificate for instance `instance`'s Services,
/// signed by a CA made here (in `ca.crt`, for client certificates).
pub async fn tls_secret(s: &Scenario, name: &str, instance: &str) {
    let ns = &s.namespace;
    let names = vec![
        format!("{instance}.{ns}.svc"),
        format!("*.{instance}-headless.{ns}.svc"),
    ];
    tls_secrets(s, name, names, None).await;
}

/// A `kubernetes.io/tls` Secret `name` with a server certificate for `names`, signed by a CA made here (in
/// `ca.crt`); and, with `client`, a `kubernetes.io/tls` Secret of that name with a client certificate from
/// the same CA (what `spec.security.tls.clientSecretName` names).
/// Returns the CA, to issue more from ([`reissue_tls_secret`]).
pub async fn tls_secrets(
    s: &Scenario,
    name: &str,
    names: Vec<String>,
    client: Option<&str>,
) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Subjects that differ from the CA's: OpenSSL (memcached) takes a certificate whose subject is its
    // issuer's for self-signed, and refuses such a client certificate.
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
        .expect("CA certificate");
    reissue_tls_secret(s, name, names, &ca).await;
    if let Some(client) = client {
        let key = KeyPair::generate().expect("client key");
        let mut params =
            CertificateParams::new(vec!["memcached-operator".to_owned()]).expect("client params");
        params
            .distinguished_name
            .push(DnType::CommonName, "memcached-operator");
        let cert = params.signed_by(&key, &ca).expect("client certificate");
        let data = [("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
            .collect();
        apply(s, client, "kubernetes.io/tls", data).await;
    }
    ca
}

/// (Re)writes the `kubernetes.io/tls` Secret `name` with a new server certificate and key for `names`
/// from `ca`, as cert-manager renews one; returns the new certificate's PEM.
pub async fn reissue_tls_secret(
    s: &Scenario,
    name: &str,
    names: Vec<String>,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
) -> String {
    let key = rcgen::KeyPair::generate().expect("server key");
    let cert = rcgen::CertificateParams::new(names)
        .expect("server params")
        .signed_by(&key, ca)
        .expect("server certificate");
    let data = [
        ("tls.crt", cert.pem()),
        ("tls.key", key.serialize_pem()),
        ("ca.crt", ca.pem()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
    .collect();
    apply(s, name, "kubernetes.io/tls", data).await;
    cert.pem()
}

/// A TLS client that trusts `ca` and presents the client certificate of the `kubernetes.io/tls` Secret
/// `client` (what `spec.security.tls.clientSecretName` names), as the operator connects to the servers.
pub async fn client_tls(
    s: &Scenario,
    client: &str,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
) -> memcached_operator::connection::TlsClient {
    let identity = Api::<Secret>::namespaced(s.client.clone(), &s.namespace)
        .get(client)
        .await
        .unwrap_or_else(|e| panic!("Secret {client}: {e}"))
        .data
        .expect("its data");
    memcached_operator::connection::TlsClient::new(&memcached_operator::connection::TlsMaterial {
        ca: Some(ca.pem().into_bytes()),
        client_identity: Some((identity["tls.crt"].0.clone(), identity["tls.key"].0.clone())),
    })
    .expect("a TLS client")
}

/// An `Opaque` Secret `name` holding memcached's credentials file `content` under `key`.
pub async fn auth_secret(s: &Scenario, name: &str, key: &str, content: &str) {
    let data = [(key.to_owned(), ByteString(content.as_bytes().to_vec()))].into();
    apply(s, name, "Opaque", data).await;
}

//! The server certificate verifiers of a connection to memcached: one [`Verifier`], which checks the
//! handshake's signatures with the provider's algorithms, around one of two decisions on the certificate
//! ([`CertificatePolicy`]):
//!
//! - [`InstanceVerifier`] (the Secret has `ca.crt`): the chain, validity and usage, by rustls' own
//!   [`WebPkiServerVerifier`], and the name against the set of names an instance's pod may present
//!   ([`ServerNames`]) or the IP dialled.
//! - [`UnverifiedServer`] (no `ca.crt`): only the handshake signatures; the client then never sends
//!   credentials (see `read_stats`).
//!
//! Why a custom verifier at all: rustls checks a certificate against the one [`ServerName`] a connection is
//! opened with, and the operator opens a connection to a pod IP while the certificate legitimately names
//! any of several Service names. rustls' verifier does the chain and signature work; this adds only the
//! "valid for any of these names" rule, with rustls' own [`verify_server_name`] per name.

use std::fmt;
use std::sync::Arc;

use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::crypto::{self, CryptoProvider, WebPkiSupportedAlgorithms};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, Error, OtherError, SignatureScheme,
};

use super::names::ServerNames;

/// Accepts a server whose chain leads to the instance's CA and whose certificate is valid for the IP
/// dialled or for any of `names`.
#[derive(Debug)]
pub struct InstanceVerifier {
    /// rustls' verifier over the instance's CA: chain, validity period, `serverAuth` usage, and the name
    /// of the connection (the pod IP).
    pub chain: Arc<WebPkiServerVerifier>,
    pub names: ServerNames,
}

/// The certificate is valid for none of the names a pod of the instance may have. [`fmt::Debug`] is the
/// message, since rustls shows the `Debug` of the errors it carries.
struct NoAcceptedName {
    ip: String,
    names: usize,
}

impl fmt::Display for NoAcceptedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server certificate is valid neither for the pod IP {} nor for any of the {} Service \
             names of the instance (<name>[.<namespace>[.svc[.<cluster domain>]]], the same for \
             <name>-headless, and <pod>.<name>-headless.<namespace>.svc[.<cluster domain>])",
            self.ip, self.names
        )
    }
}

impl fmt::Debug for NoAcceptedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for NoAcceptedName {}

/// The decision on the server's certificate, which is what differs between the verifiers: the handshake's
/// signatures are checked the same way whatever it is ([`Verifier`]).
pub trait CertificatePolicy: fmt::Debug + Send + Sync {
    /// [`ServerCertVerifier::verify_server_cert`].
    fn verify_certificate(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error>;
}

/// A server certificate verifier: `policy` decides on the certificate, and the handshake's signatures are
/// checked with the crypto provider's algorithms (those rustls' [`WebPkiServerVerifier`] uses when built
/// with the same provider).
#[derive(Debug)]
pub struct Verifier<P> {
    pub policy: P,
    pub algorithms: WebPkiSupportedAlgorithms,
}

impl<P> Verifier<P> {
    /// `policy`, with the signature algorithms of `provider`.
    pub fn new(policy: P, provider: &CryptoProvider) -> Self {
        Self {
            policy,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl<P: CertificatePolicy> ServerCertVerifier for Verifier<P> {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.policy
            .verify_certificate(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl CertificatePolicy for InstanceVerifier {
    fn verify_certificate(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        // rustls' verifier checks the chain first and the name last, so a name error means the chain is
        // good (see the tests: a certificate from another CA fails even when it names the IP).
        match self.chain.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => {
                let certificate = ParsedCertificate::try_from(end_entity)?;
                if self
                    .names
                    .dns()
                    .iter()
                    .any(|name| verify_server_name(&certificate, name).is_ok())
                {
                    return Ok(ServerCertVerified::assertion());
                }
                Err(Error::InvalidCertificate(CertificateError::Other(
                    OtherError(Arc::new(NoAcceptedName {
                        ip: server_name.to_str().into_owned(),
                        names: self.names.dns().len(),
                    })),
                )))
            }
            other => other,
        }
    }
}

/// Without a CA: accepts any certificate; [`Verifier`] still checks the handshake signatures, which prove
/// that the server holds the key of the certificate it shows (the session keys are its own), not who it
/// is. The connection is encrypted against a passive listener, not against an impostor: the client sends
/// no credentials over it.
#[derive(Debug)]
pub struct UnverifiedServer;

impl CertificatePolicy for UnverifiedServer {
    fn verify_certificate(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, SanType, date_time_ymd,
    };
    use tokio_rustls::rustls::RootCertStore;
    use tokio_rustls::rustls::crypto::ring;

    use super::*;

    const POD_IP: [u8; 4] = [10, 1, 2, 3];

    fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
    }

    /// A server certificate for `names` (DNS names, or IP addresses as IP SANs) issued by `ca`.
    fn leaf(
        ca: &CertifiedIssuer<'static, KeyPair>,
        names: &[&str],
        expired: bool,
    ) -> CertificateDer<'static> {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = names
            .iter()
            .map(|name| match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into().expect("DNS name")),
            })
            .collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        params.signed_by(&key, ca).expect("leaf").der().clone()
    }

    /// The verifier of pod `cache-0` (IP [`POD_IP`]) of instance `cache` in namespace `shop`, trusting `ca`.
    fn verifier(ca: &CertifiedIssuer<'static, KeyPair>) -> InstanceVerifier {
        let mut roots = RootCertStore::empty();
        roots.add(ca.der().clone()).expect("root");
        let chain = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(ring::default_provider()),
        )
        .build()
        .expect("verifier");
        InstanceVerifier {
            chain,
            names: ServerNames::for_pod("cache", "shop", "cache-0", "cluster.local"),
        }
    }

    fn verify(verifier: &InstanceVerifier, certificate: &CertificateDer<'_>) -> Result<(), Error> {
        let ip = ServerName::IpAddress(IpAddr::from(POD_IP).into());
        verifier
            .verify_certificate(certificate, &[], &ip, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn a_certificate_for_a_service_name_of_the_instance_is_accepted() {
        let ca = ca("instance CA");
        let verifier = verifier(&ca);
        for name in [
            "cache.shop.svc",
            "cache.shop.svc.cluster.local",
            "cache-headless.shop.svc",
            "cache-0.cache-headless.shop.svc.cluster.local",
            "*.cache-headless.shop.svc",
        ] {
            verify(&verifier, &leaf(&ca, &[name], false)).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn a_certificate_for_the_pod_ip_is_accepted() {
        let ca = ca("instance CA");
        verify(&verifier(&ca), &leaf(&ca, &["10.1.2.3"], false)).expect("IP SAN of the pod");
    }

    #[test]
    fn a_certificate_from_the_same_ca_for_another_name_is_refused() {
        let ca = ca("instance CA");
        let verifier = verifier(&ca);
        for names in [
            &["evil.example.com"][..],
            &["other.shop.svc", "other.shop.svc.cluster.local"],
            &["cache.elsewhere.svc"],
            &["cache-1.other-headless.shop.svc"],
            &["10.1.2.4"],
        ] {
            let error = verify(&verifier, &leaf(&ca, names, false)).expect_err("another name");
            assert!(
                error
                    .to_string()
                    .contains("valid neither for the pod IP 10.1.2.3"),
                "{names:?}: {error}"
            );
        }
    }

    /// A CA shared between tenants (a cluster-wide issuer) signs another namespace's certificate for its
    /// instance of the same name, with every name cert-manager users give one: it is not this instance's.
    #[test]
    fn a_certificate_for_the_same_named_instance_of_another_namespace_is_refused() {
        let ca = ca("cluster-wide CA");
        let verifier = verifier(&ca);
        let theirs = [
            "cache",
            "cache-headless",
            "cache.other",
            "cache-headless.other",
            "cache.other.svc",
            "cache.other.svc.cluster.local",
            "*.cache-headless.other.svc",
        ];
        for name in theirs {
            verify(&verifier, &leaf(&ca, &[name], false)).expect_err(name);
        }
        verify(&verifier, &leaf(&ca, &theirs, false)).expect_err("all of them");
        // The short forms of this namespace's own instance are not enough either: they are the same
        // in every namespace, or names outside the cluster.
        for name in ["cache", "cache.shop", "cache-headless.shop"] {
            verify(&verifier, &leaf(&ca, &[name], false)).expect_err(name);
        }
    }

    #[test]
    fn a_certificate_from_another_ca_is_refused_whatever_it_names() {
        let (ca, other) = (ca("instance CA"), ca("other CA"));
        let verifier = verifier(&ca);
        for names in [&["cache.shop.svc"][..], &["10.1.2.3"]] {
            let error = verify(&verifier, &leaf(&other, names, false)).expect_err("foreign CA");
            assert!(
                matches!(
                    error,
                    Error::InvalidCertificate(CertificateError::UnknownIssuer)
                ),
                "{names:?}: {error:?}"
            );
        }
    }

    #[test]
    fn an_expired_certificate_with_the_right_name_is_refused() {
        let ca = ca("instance CA");
        let error =
            verify(&verifier(&ca), &leaf(&ca, &["cache.shop.svc"], true)).expect_err("expired");
        assert!(
            matches!(
                error,
                Error::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. }
                )
            ),
            "{error:?}"
        );
    }
}

//! TLS to memcached servers: a rustls client configuration built from an instance's TLS Secret.
//!
//! The operator reaches pods by IP address (`podIP:containerPort`), and server certificates almost never name
//! pod IPs: they name the Service (`<name>.<namespace>.svc`), because that is what the cache's clients use.
//! Checking the name would therefore fail on every correctly configured instance. So, with a CA:
//!
//! - the server's chain **is** verified against that CA (signature, validity period, `serverAuth` usage),
//!   by rustls' own webpki chain check;
//! - the name is **not** checked: any certificate issued by the instance's CA is accepted for any of its pods.
//!
//! What that leaves open: a party holding another certificate from the same CA could answer in a pod's place,
//! if it could also take over the pod's IP address. It would learn the auth credentials (sent after the
//! handshake) and could feed the operator wrong stats. With a CA dedicated to the instance that is a party
//! that already holds the instance's keys; with a CA shared across a cluster it is any holder of that CA's
//! certificates, which is the trade-off to know when sharing a CA.
//!
//! Without a CA (the Secret has no `ca.crt`), the connection is encrypted but the server is not verified:
//! the operator cannot verify a chain nobody gave it a root for, and the system roots are no authority over
//! in-cluster certificates. Reading stats over an encrypted, unauthenticated channel still beats not reading
//! them; the same residual risk as above applies, with any certificate instead of one from the CA.
//!
//! The crypto provider is `ring`, the one kube's rustls already links, named explicitly so the configuration
//! never depends on a process-wide default provider.

use std::fmt;
use std::sync::Arc;

use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::verify_server_cert_signed_by_trust_anchor;
use tokio_rustls::rustls::crypto::{WebPkiSupportedAlgorithms, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::ParsedCertificate;
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// What the instance's TLS Secret gives the client: the CA (PEM) to verify the server against, when the
/// Secret has `ca.crt`, and the certificate chain + private key (PEM) to present when the server requires
/// client certificates (`clientAuth: true`, memcached's `ssl_verify_mode=2`).
///
/// Held in memory only. [`Debug`] shows what is present, never the key.
#[derive(Clone, Default)]
pub struct TlsMaterial {
    /// PEM certificates of the CA(s) that issued the server certificates.
    pub ca: Option<Vec<u8>>,
    /// PEM certificate chain and PEM private key that the client presents.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca", &self.ca.as_ref().map(|_| "<present>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<present>"),
            )
            .finish()
    }
}

/// Why [`TlsMaterial`] does not make a client configuration. Messages never quote the material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `ca` holds no PEM certificate, or one that is not a usable trust anchor.
    #[error("the CA has no usable PEM certificate")]
    Ca,
    /// The client certificate holds no PEM certificate.
    #[error("the client certificate has no PEM certificate")]
    ClientCertificate,
    /// The client key holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("the client key has no PEM private key")]
    ClientKey,
    /// rustls refused the configuration (for example a key that does not match the certificate).
    #[error("TLS configuration refused: {0}")]
    Config(#[source] rustls::Error),
}

/// A TLS connector for one instance's servers.
///
/// - With `ca`: the server's chain must lead to that CA (signatures, validity period, `serverAuth` usage),
///   but the server's **name is not checked**, because the operator dials pod IPs and certificates name the
///   Service. Any certificate from the instance's CA is thus accepted for any of its pods.
/// - Without `ca`: encrypted, **not verified** — there is no root to verify against, and the system roots
///   are no authority over in-cluster certificates. Credentials sent next go to whoever answers.
/// - With `client_identity`: presented when the server asks for a client certificate (mutual TLS).
///
/// Build it once per instance and Secret version, and share it between the instance's pods: it holds the
/// parsed roots and the client identity. Fails on material that is not PEM, without quoting it.
pub fn tls_connector(material: &TlsMaterial) -> Result<TlsConnector, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let roots = match &material.ca {
        Some(ca) => Some(Arc::new(roots(ca)?)),
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = Arc::new(PodVerifier { roots, algorithms });
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &material.client_identity {
        Some((certificate, key)) => {
            let chain = CertificateDer::pem_slice_iter(certificate)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| TlsError::ClientCertificate)?;
            if chain.is_empty() {
                return Err(TlsError::ClientCertificate);
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| TlsError::ClientKey)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::Config)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The trust anchors in a PEM bundle: every certificate must parse and be usable, and there must be one.
fn roots(ca: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(certificate.map_err(|_| TlsError::Ca)?)
            .map_err(|_| TlsError::Ca)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Ca);
    }
    Ok(roots)
}

/// What the operator checks of a server's certificate (module documentation): with `roots` (the instance's
/// CA), the chain and not the name; without, nothing but the handshake signatures, which prove that the
/// server holds the key of the certificate it shows (the session keys are its own), not who it is.
#[derive(Debug)]
struct PodVerifier {
    roots: Option<Arc<RootCertStore>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PodVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let certificate = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(
                &certificate,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn material_that_is_not_pem_is_refused_without_quoting_it() {
        let not_pem = b"-----BEGIN PRIVATE KEY-----\nsecretbytes\n".to_vec();
        for material in [
            TlsMaterial {
                ca: Some(b"not a certificate".to_vec()),
                client_identity: None,
            },
            TlsMaterial {
                ca: Some(Vec::new()),
                client_identity: None,
            },
            TlsMaterial {
                ca: None,
                client_identity: Some((b"nothing".to_vec(), not_pem.clone())),
            },
        ] {
            let error = tls_connector(&material).err().expect("unusable material");
            assert!(!format!("{error} {error:?}").contains("secretbytes"));
        }
    }

    #[test]
    fn debug_shows_presence_only() {
        let material = TlsMaterial {
            ca: Some(b"ca".to_vec()),
            client_identity: Some((b"c".to_vec(), b"key!".to_vec())),
        };
        let debug = format!("{material:?}");
        assert!(
            debug.contains("<present>") && !debug.contains("key!"),
            "{debug}"
        );
    }

    #[test]
    fn no_material_gives_an_unverified_connector() {
        assert!(tls_connector(&TlsMaterial::default()).is_ok());
    }
}

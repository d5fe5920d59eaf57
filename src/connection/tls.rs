//! TLS to memcached servers: a rustls client configuration built from an instance's TLS Secret.
//!
//! With a CA (the Secret's `ca.crt`), a server is accepted when its chain leads to that CA (signatures,
//! validity period, `serverAuth` usage) and its certificate is valid for the pod IP dialled or for one of
//! the instance's Service names ([`ServerNames`], checked by [`InstanceVerifier`]). A certificate from the
//! same CA for another name (another instance, `evil.example.com`) is refused.
//!
//! Without a CA, the connection is encrypted but the server is not verified: the operator cannot verify a
//! chain nobody gave it a root for, and the system roots are no authority over in-cluster certificates.
//! Stats are still read over it (they are not secret, and encrypted beats plain), but **credentials are
//! never sent** over such a connection: `read_stats` refuses to authenticate to an unverified server (reason
//! `tls`). A user who wants no unverified connection at all sets `ca.crt`.
//!
//! The crypto provider is `ring`, the one kube's rustls already links, named explicitly so the configuration
//! never depends on a process-wide default provider.

use std::fmt;
use std::sync::Arc;

use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use super::names::ServerNames;
use super::verifier::{InstanceVerifier, UnverifiedServer, Verifier};

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

/// The TLS client of one instance's servers: built once per instance and Secret version, shared by its
/// pods (it holds the parsed roots and the client identity); [`TlsClient::connector`] makes the connector
/// of one pod, which checks that pod's names.
///
/// - With `ca`: see the module documentation; the server must prove it is one of the instance's.
/// - Without `ca`: encrypted, **not verified**; [`TlsClient::verifies_server`] is false and no credentials
///   may be sent.
/// - With `client_identity`: presented when the server asks for a client certificate (mutual TLS).
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    /// rustls' verifier over the instance's CA, when the Secret has one.
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsClient")
            .field("verifies_server", &self.verifies_server())
            .finish()
    }
}

impl TlsClient {
    /// The client for `material`. Fails on material that is not PEM, without quoting it.
    pub fn new(material: &TlsMaterial) -> Result<Self, TlsError> {
        let provider = Arc::new(ring::default_provider());
        let chain = match &material.ca {
            Some(ca) => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca)?), provider.clone())
                    .build()
                    .map_err(|_| TlsError::Ca)?,
            ),
            None => None,
        };
        // The configuration's own verifier is replaced per pod (`connector`) when there is a CA; without
        // one, it is the one used.
        let verifier: Arc<dyn ServerCertVerifier> = match &chain {
            Some(chain) => Arc::new(Verifier::new(
                InstanceVerifier {
                    chain: chain.clone(),
                    names: ServerNames::default(),
                },
                &provider,
            )),
            None => Arc::new(Verifier::new(UnverifiedServer, &provider)),
        };
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
        Ok(Self {
            config: Arc::new(config),
            chain,
        })
    }

    /// Whether servers are verified (the Secret has a CA). Credentials go only over verified connections.
    pub fn verifies_server(&self) -> bool {
        self.chain.is_some()
    }

    /// The connector of one pod, which accepts a certificate valid for the pod IP or any of `names`.
    ///
    /// A copy of the instance's configuration with that pod's verifier: the copy shares the roots, the
    /// identity and the session cache, and is made once per read (a short-lived connection anyway).
    pub fn connector(&self, names: &ServerNames) -> TlsConnector {
        let Some(chain) = &self.chain else {
            return TlsConnector::from(self.config.clone());
        };
        let mut config = ClientConfig::clone(&self.config);
        let verifier = Verifier::new(
            InstanceVerifier {
                chain: chain.clone(),
                names: names.clone(),
            },
            self.config.crypto_provider(),
        );
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(verifier));
        TlsConnector::from(Arc::new(config))
    }
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
            let error = TlsClient::new(&material).expect_err("unusable material");
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
    fn no_ca_gives_a_client_that_does_not_verify_and_a_ca_one_that_does() {
        let unverified = TlsClient::new(&TlsMaterial::default()).expect("client");
        assert!(!unverified.verifies_server());
        let ca = rcgen::CertifiedIssuer::self_signed(
            {
                let mut params =
                    rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
                params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
                params
            },
            rcgen::KeyPair::generate().expect("key"),
        )
        .expect("CA");
        let verified = TlsClient::new(&TlsMaterial {
            ca: Some(ca.pem().into_bytes()),
            client_identity: None,
        })
        .expect("client");
        assert!(verified.verifies_server());
    }
}

//! Which certificate a server presents, and which one it should: the SHA-256 of the leaf certificate's
//! DER, on both sides. Certificates are public, so their digests may be logged and put in events.

use std::fmt;

use sha2::{Digest, Sha256};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::sign::CertifiedKey;

/// The SHA-256 of one certificate's DER encoding (its fingerprint).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertificateDigest([u8; 32]);

impl CertificateDigest {
    /// The digest of a DER certificate, as a TLS handshake gives it.
    pub fn of_der(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }

    /// The digest of the first certificate of a PEM chain (the leaf, as `tls.crt` holds it first), or
    /// `None` when it has no certificate that parses.
    pub fn of_pem_leaf(pem: &[u8]) -> Option<Self> {
        let leaf = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
        Some(Self::of_der(&leaf))
    }
}

/// The leaf digest of a certificate chain and private key (PEM) that belong together, or what is wrong
/// with them (never quoting the key).
///
/// Checked before a server is asked to load them: memcached 1.6.18, told to reload a certificate whose
/// key does not match, answers with OpenSSL's complaint and then fails every TLS handshake until it
/// loads a matching pair.
pub fn matching_pair(chain: &[u8], key: &[u8]) -> Result<CertificateDigest, String> {
    let chain = CertificateDer::pem_slice_iter(chain)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "tls.crt is not a PEM certificate chain".to_owned())?;
    let Some(leaf) = chain.first() else {
        return Err("tls.crt holds no certificate".to_owned());
    };
    let digest = CertificateDigest::of_der(leaf);
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| "tls.key holds no PEM private key".to_owned())?;
    CertifiedKey::from_der(chain, key, &ring::default_provider())
        .map_err(|error| format!("tls.key does not go with tls.crt ({error})"))?;
    Ok(digest)
}

/// `sha256:` and the first 8 bytes in hex: enough to tell certificates apart in a message.
impl fmt::Display for CertificateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        for byte in self.0.iter().take(8) {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CertificateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(name: &str) -> rcgen::CertifiedKey<rcgen::KeyPair> {
        rcgen::generate_simple_self_signed(vec![name.to_owned()]).expect("certificate")
    }

    #[test]
    fn the_leaf_of_a_pem_chain_matches_its_der() {
        let (leaf, other) = (certificate("a.example"), certificate("b.example"));
        let chain = format!("{}{}", leaf.cert.pem(), other.cert.pem());
        let digest = CertificateDigest::of_pem_leaf(chain.as_bytes()).expect("a leaf");
        assert_eq!(digest, CertificateDigest::of_der(leaf.cert.der()));
        assert_ne!(digest, CertificateDigest::of_der(other.cert.der()));
        assert!(digest.to_string().starts_with("sha256:"));
        assert_eq!(digest.to_string().len(), "sha256:".len() + 16);
    }

    #[test]
    fn a_pair_is_checked_before_it_is_used() {
        let (a, b) = (certificate("a.example"), certificate("b.example"));
        let (chain, key) = (a.cert.pem(), a.signing_key.serialize_pem());
        assert_eq!(
            matching_pair(chain.as_bytes(), key.as_bytes()),
            Ok(CertificateDigest::of_der(a.cert.der()))
        );
        let other_key = b.signing_key.serialize_pem();
        let error = matching_pair(chain.as_bytes(), other_key.as_bytes()).unwrap_err();
        assert!(
            error.starts_with("tls.key does not go with tls.crt"),
            "{error}"
        );
        assert!(!error.contains("PRIVATE"), "{error}");
        assert!(matching_pair(b"", key.as_bytes()).is_err());
        assert!(matching_pair(chain.as_bytes(), b"nope").is_err());
    }

    #[test]
    fn pem_without_a_certificate_has_no_leaf() {
        assert_eq!(CertificateDigest::of_pem_leaf(b"not pem"), None);
        assert_eq!(CertificateDigest::of_pem_leaf(b""), None);
    }
}

//! Throwaway PKI for the TLS tests: a CA generated at test time and the certificates it issues (no key is
//! ever committed). Shared by `tests/telemetry_client.rs` and `tests/handover.rs`.

use memcached_operator::telemetry::client::TlsMaterial;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// A CA, and leaf certificates it issues, generated for one test.
pub struct Pki {
    pub ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate chain and key, in PEM.
pub struct Leaf {
    pub chain: String,
    pub key: String,
}

impl Pki {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        Self {
            ca: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    pub fn ca_pem(&self) -> Vec<u8> {
        self.ca.pem().into_bytes()
    }

    /// What a client that trusts this CA, and has no identity of its own, holds.
    pub fn trusted(&self) -> TlsMaterial {
        TlsMaterial {
            ca: Some(self.ca_pem()),
            client_identity: None,
        }
    }

    pub fn issue(&self, names: &[&str], usage: ExtendedKeyUsagePurpose, expired: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, "leaf");
        params.extended_key_usages = vec![usage];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("leaf key");
        let certificate = params.signed_by(&key, &self.ca).expect("leaf certificate");
        Leaf {
            chain: certificate.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate that names the Service, not the IP the client connects to, as in a cluster.
    pub fn server(&self) -> Leaf {
        self.issue(
            &["memcached.cache.svc"],
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
        )
    }

    pub fn client(&self) -> Leaf {
        self.issue(
            &["memcached-operator"],
            ExtendedKeyUsagePurpose::ClientAuth,
            false,
        )
    }
}

//! The control plane's keys and certificates, made at start with rcgen (nothing from openssl): a CA, the
//! API server's serving certificate for 127.0.0.1 signed by it, and the service-account signing key.
//!
//! A fresh CA per run means a client can verify the API server properly (no `insecure-skip-tls-verify`,
//! which kube-rs's rustls client would handle differently from a real cluster), and the CA doubles as the
//! root CA the controller-manager publishes into every namespace (`kube-root-ca.crt`).

use std::collections::hash_map::RandomState;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Paths of the PEM files written by [`Pki::create`].
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    /// ECDSA P-256 in PKCS#8: the API server signs service-account tokens with it, the
    /// controller-manager signs legacy token Secrets with it.
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
}

impl Pki {
    /// Creates the CA, the serving certificate (for the names below and `extra_names`) and the
    /// service-account key in `dir`.
    pub fn create(dir: &Path, extra_names: &[String]) -> Result<Pki> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let failed = |what: &str, e: rcgen::Error| anyhow::anyhow!("cannot make the {what}: {e}");

        let mut ca_params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| failed("CA's parameters", e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "envtest-ca");
        let ca_key = KeyPair::generate().map_err(|e| failed("CA's key", e))?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)
            .map_err(|e| failed("CA's certificate", e))?;

        // The names a client inside the cluster would use, too (a pod's in-cluster config), although
        // nothing here routes 10.0.0.1.
        let names = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.0.0.1",
        ];
        let names: Vec<String> = names
            .iter()
            .map(|n| (*n).to_owned())
            .chain(extra_names.iter().cloned())
            .collect();
        let mut serving_params = CertificateParams::new(names)
            .map_err(|e| failed("serving certificate's parameters", e))?;
        serving_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let serving_key = KeyPair::generate().map_err(|e| failed("serving key", e))?;
        let serving = serving_params
            .signed_by(&serving_key, &ca)
            .map_err(|e| failed("serving certificate", e))?;

        let sa_key = KeyPair::generate().map_err(|e| failed("service-account key", e))?;

        let pki = Pki {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            service_account_key: dir.join("sa.key"),
            service_account_pub: dir.join("sa.pub"),
        };
        write_file(&pki.ca_cert, &ca.pem(), 0o644)?;
        write_file(&pki.serving_cert, &serving.pem(), 0o644)?;
        write_file(&pki.serving_key, &serving_key.serialize_pem(), 0o600)?;
        write_file(&pki.service_account_key, &sa_key.serialize_pem(), 0o600)?;
        write_file(&pki.service_account_pub, &sa_key.public_key_pem(), 0o644)?;
        Ok(pki)
    }
}

/// A bearer token for the admin user: 128 random bits in hex, from the OS-seeded hasher keys std already
/// draws (good enough for a cluster that listens on loopback and lives for one test run).
pub fn random_token() -> String {
    let mut token = String::new();
    for _ in 0..2 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        token.push_str(&format!("{:016x}", hasher.finish()));
    }
    token
}

/// Writes `text` to `path` with `mode` (0600 for keys and tokens), replacing what was there.
pub fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
        assert_eq!(random_token().len(), 32);
    }
}

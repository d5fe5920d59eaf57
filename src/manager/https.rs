//! HTTPS for `/metrics`: a certificate from `--metrics-cert-dir` (re-read when its files change, so a
//! certificate cert-manager renews is served without a restart) or a self-signed one generated at start.
//! HTTP/1.1 only, unless `--metrics-enable-http2` has `h2` offered by ALPN too; served within the limits
//! of [`super::server`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};

use super::server::{self, Limits};

/// File names in `--metrics-cert-dir`, as in a `kubernetes.io/tls` Secret.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
/// How often the certificate files are compared with what is served.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// Why the metrics server's certificate cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("unusable key in {path}: {source}")]
    Key {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate and key in `dir`.
pub fn load(dir: &Path) -> Result<CertifiedKey, TlsError> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    fn read(path: &Path) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError + '_ {
        move |source| TlsError::Read {
            path: path.to_owned(),
            source,
        }
    }
    let certs = CertificateDer::pem_file_iter(&cert_path)
        .map_err(read(&cert_path))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read(&cert_path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_path));
    }
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(read(&key_path))?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|source| TlsError::Key {
        path: key_path,
        source,
    })
}

/// A self-signed certificate for `localhost` and the pod's name: scrapers must skip verification
/// (`insecureSkipVerify`) or be given a certificate through `--metrics-cert-dir`.
pub fn self_signed() -> Result<CertifiedKey, TlsError> {
    let mut names = vec!["localhost".to_owned()];
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        names.push(pod);
    }
    let generated = rcgen::generate_simple_self_signed(names)?;
    let key = PrivateKeyDer::Pkcs8(generated.signing_key.serialize_der().into());
    Ok(CertifiedKey::from_der(
        vec![generated.cert.der().clone()],
        key,
        &provider(),
    )?)
}

/// The certificate served, swapped when the files change.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The TLS configuration for the metrics server: from `cert_dir` (and re-read every
/// [`RELOAD_INTERVAL`] in the background; a broken update keeps the previous certificate, with a warning),
/// or self-signed. ALPN offers `http/1.1`, and `h2` before it when `http2`.
pub fn server_config(cert_dir: Option<&Path>, http2: bool) -> Result<Arc<ServerConfig>, TlsError> {
    let current = Arc::new(Current(RwLock::new(Arc::new(match cert_dir {
        Some(dir) => load(dir)?,
        None => self_signed()?,
    }))));
    if let Some(dir) = cert_dir {
        tokio::spawn(reload(dir.to_owned(), current.clone()));
    }
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(current);
    config.alpn_protocols = match http2 {
        true => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        false => vec![b"http/1.1".to_vec()],
    };
    Ok(Arc::new(config))
}

/// The certificate and key files' bytes, to notice a change (a mounted Secret's update swaps a symlink, so
/// modification times are not reliable).
type Files = (Option<Vec<u8>>, Option<Vec<u8>>);

fn files(dir: &Path) -> Files {
    (
        std::fs::read(dir.join(CERT_FILE)).ok(),
        std::fs::read(dir.join(KEY_FILE)).ok(),
    )
}

async fn reload(dir: PathBuf, current: Arc<Current>) {
    let mut seen = files(&dir);
    loop {
        tokio::time::sleep(RELOAD_INTERVAL).await;
        refresh(&dir, &current, &mut seen);
    }
}

/// Serves the files in `dir` from now on if they changed since `seen` and load; true when swapped.
fn refresh(dir: &Path, current: &Current, seen: &mut Files) -> bool {
    let now = files(dir);
    if now == *seen {
        return false;
    }
    match load(dir) {
        Ok(key) => {
            *current.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
            *seen = now;
            tracing::info!(dir = %dir.display(), "reloaded the metrics certificate");
            true
        }
        // A half-written pair (certificate updated, key not yet) settles at the next look.
        Err(error) => {
            tracing::warn!(%error, "keeping the previous metrics certificate");
            false
        }
    }
}

/// Binds `addr` now (so a taken port fails the start) and serves `router` over TLS in the background,
/// within the default [`Limits`].
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    config: Arc<ServerConfig>,
) -> std::io::Result<SocketAddr> {
    server::serve(addr, router, Some(config), Limits::default()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path) -> CertificateDer<'static> {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(dir.join(CERT_FILE), generated.cert.pem()).unwrap();
        std::fs::write(dir.join(KEY_FILE), generated.signing_key.serialize_pem()).unwrap();
        generated.cert.der().clone()
    }

    fn served(current: &Current) -> CertificateDer<'static> {
        current.0.read().unwrap().cert[0].clone()
    }

    #[test]
    fn a_changed_certificate_is_served_and_a_broken_one_is_not() {
        let dir = std::env::temp_dir().join(format!("metrics-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = write_pair(&dir);
        let current = Current(RwLock::new(Arc::new(load(&dir).unwrap())));
        let mut seen = files(&dir);
        assert!(!refresh(&dir, &current, &mut seen), "unchanged files");
        assert_eq!(served(&current), first);

        let renewed = write_pair(&dir);
        assert!(refresh(&dir, &current, &mut seen));
        assert_eq!(
            served(&current),
            renewed,
            "the renewed certificate is served"
        );

        // A certificate written before its key: the renewed pair stays until both are there.
        std::fs::write(dir.join(CERT_FILE), "not a certificate").unwrap();
        assert!(!refresh(&dir, &current, &mut seen));
        assert_eq!(served(&current), renewed);
        let last = write_pair(&dir);
        assert!(refresh(&dir, &current, &mut seen));
        assert_eq!(served(&current), last);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

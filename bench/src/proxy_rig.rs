//! The servers and proxies the proxy benches measure, prepared as the operator runs them: a memcached
//! server in plain text and one serving TLS, and three proxies' launches with the operator's own
//! arguments and route configurations (written by its configuration writer): plain text; serving TLS
//! and speaking it to the server (`spec.security.tls`); and that with access control
//! (`spec.proxy.access`: an `mtls:` client listener tagged `client`, the access library after routelib,
//! the client CA, and the route rendered with one identity, the common name of the bench's client
//! certificate, allowed the bench's key prefix, so every key is checked and passes). The CA, the
//! servers' certificate and the client's are made at run time in the scratch directory. The servers
//! start with [`Rig::prepare`]; each bench starts the proxies its own way ([`Rig::start`], or under a
//! profiler from their [`Launch`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memcached_operator::proxy_config::Files;
use memcached_operator::resources::proxy::identities::{
    CLIENT_TAG, ClientCa, RouteAccess, RouteIdentity,
};
use memcached_operator::resources::proxy::proxy_args_in;
use memcached_operator::resources::proxy::routes::{self, Route};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tokio_rustls::rustls::client::Resumption;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::process::Scratch;
use crate::proxy_hop::{Process, binaries, free_port, start, start_on};

/// The certificates of a TLS run, in the scratch directory, and the client's configurations.
pub(crate) struct Pki {
    /// The CA's certificate (PEM): it signs the servers' and the client's.
    ca: String,
    /// Without a client certificate.
    pub client: Arc<ClientConfig>,
    /// With the client certificate of common name [`CLIENT_CN`].
    pub identified: Arc<ClientConfig>,
}

/// The client certificate's common name, an identity allowed [`PREFIX`].
const CLIENT_CN: &str = "bench.clients";
const PREFIX: &str = "bench:";

/// Makes a CA, one serving certificate for 127.0.0.1 (the server's and the proxy's, as the operator's
/// proxy serves the instance's certificate) and writes them as `tls.crt`, `tls.key` and `ca.crt` in `dir`.
fn pki(dir: &Path) -> Result<Pki, String> {
    fn failed(what: &'static str) -> impl Fn(rcgen::Error) -> String {
        move |e| format!("cannot make the {what}: {e}")
    }
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed("CA"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "bench CA");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(failed("CA key"))?)
        .map_err(failed("CA"))?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(failed("serving certificate"))?;
    params.distinguished_name.push(DnType::CommonName, "bench");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(failed("serving key"))?;
    let serving = params
        .signed_by(&key, &ca)
        .map_err(failed("serving certificate"))?;
    for (name, pem) in [
        ("tls.crt", serving.pem()),
        ("tls.key", key.serialize_pem()),
        ("ca.crt", ca.pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, pem).map_err(|e| format!("cannot write {name}: {e}"))?;
        // memcached reads them as nobody.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("cannot open {name} to memcached: {e}"))?;
    }
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(failed("client certificate"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, CLIENT_CN);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().map_err(failed("client key"))?;
    let client_cert = params
        .signed_by(&client_key, &ca)
        .map_err(failed("client certificate"))?;
    let mut roots = RootCertStore::empty();
    roots
        .add(ca.der().clone())
        .map_err(|e| format!("cannot trust the CA: {e}"))?;
    let builder = || {
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots.clone()))
            .map_err(|e| e.to_string())
    };
    let mut client = builder()?.with_no_client_auth();
    let mut identified = builder()?
        .with_client_auth_cert(
            vec![CertificateDer::from(client_cert.der().to_vec())],
            PrivateKeyDer::try_from(client_key.serialize_der())
                .map_err(|e| format!("the client key: {e}"))?,
        )
        .map_err(|e| format!("the client certificate: {e}"))?;
    // Every connection a full handshake, on every path alike (the proxy with access control resumes
    // sessions since it runs with memcached's session cache; without it, memcached refused a resumed
    // session with an `internal_error` alert when it verifies client certificates).
    client.resumption = Resumption::disabled();
    identified.resumption = Resumption::disabled();
    Ok(Pki {
        ca: ca.pem(),
        client: Arc::new(client),
        identified: Arc::new(identified),
    })
}

/// The proxy's arguments as the operator gives them, for the bench: the port is given by
/// [`start_on`], so `-p` goes, and so does `-l`; returned apart: the clients' listener of the operator's
/// `-l` (with access control, `mtls:tag[client]:…`) on loopback, without the operator's own listeners
/// (`stats`, reloads), which the bench does not use; else `127.0.0.1`.
fn bench_args(args: Vec<String>, extra: &[String]) -> (String, Vec<String>) {
    let mut out = Vec::with_capacity(args.len());
    let mut listen = "127.0.0.1".to_owned();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-p" => {
                args.next();
            }
            "-l" => {
                if let Some(clients) = args.next().as_deref().and_then(|l| l.split(',').next())
                    && clients.starts_with("mtls:")
                {
                    listen = clients.replace(":*:", ":127.0.0.1:");
                }
            }
            _ => out.push(arg),
        }
    }
    out.extend(extra.iter().cloned());
    (listen, out)
}

/// How a proxy is started: its listeners (`-l`, which include loopback `port`), its port, and the rest
/// of its arguments (the operator's, without its pod's listeners and paths).
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub listen: String,
    pub port: u16,
    pub args: Vec<String>,
}

impl Launch {
    /// The arguments as the bench passes them, for its report.
    pub fn describe(&self) -> Vec<String> {
        std::iter::once(format!("-l {}", self.listen))
            .chain(self.args.iter().cloned())
            .collect()
    }
}

/// The servers, running, and the proxies' launches, their files written.
pub(crate) struct Rig {
    /// Stopped (dropped) before the scratch directory is removed.
    _servers: Vec<Process>,
    _scratch: Scratch,
    pub server_binary: PathBuf,
    pub proxy_binary: PathBuf,
    pub pki: Pki,
    /// The plain-text server's port, and the TLS server's.
    pub plain_port: u16,
    pub tls_port: u16,
    pub proxy: Launch,
    pub tls_proxy: Launch,
    pub access_proxy: Launch,
}

impl Rig {
    /// Makes the certificates, starts the two servers, and writes the proxies' configurations; `extra`
    /// goes after the operator's arguments of each proxy.
    pub fn prepare(extra: &[String]) -> Result<Rig, String> {
        let (server_binary, proxy_binary) = binaries()?;
        let scratch = Scratch::new()?;
        open_to_memcached(scratch.path())?;
        let dir = scratch.path().to_string_lossy().into_owned();
        let pki = pki(scratch.path())?;
        let server_args = ["-m", "64", "-t", "2"].map(str::to_owned);
        let plain_port = free_port()?;
        let plain_server = start(&server_binary, plain_port, &server_args)?;
        let tls_port = free_port()?;
        let mut tls_server_args = server_args.to_vec();
        tls_server_args.extend([
            "-Z".to_owned(),
            "-o".to_owned(),
            format!("ssl_chain_cert={dir}/tls.crt,ssl_key={dir}/tls.key"),
        ]);
        let tls_server = start(&server_binary, tls_port, &tls_server_args)?;

        // Plain text: the proxy over the plain server.
        let plain_dir = sub_dir(scratch.path(), "plain")?;
        let plain_address = format!("127.0.0.1:{plain_port}");
        write_config(
            &plain_dir,
            routes::config("bench", &[plain_address.as_str()]),
        )?;
        let proxy = launch(&plain_dir, None, false, extra)?;

        // TLS: serving TLS and speaking it to the TLS server.
        let tls_dir = sub_dir(scratch.path(), "tls")?;
        let tls_address = format!("127.0.0.1:{tls_port}");
        write_config(
            &tls_dir,
            routes::tls_config("bench", &[tls_address.as_str()]),
        )?;
        let tls_proxy = launch(&tls_dir, Some(&dir), false, extra)?;

        // Access control: the same, plus client certificates of the CA required on the clients'
        // listener and the access library checking each key against the certificate's identity.
        let access_dir = sub_dir(scratch.path(), "access")?;
        write_access_files(&access_dir, &pki, &tls_address)?;
        let access_proxy = launch(&access_dir, Some(&dir), true, extra)?;
        if !access_proxy.listen.contains(&format!("tag[{CLIENT_TAG}]")) {
            return Err(format!(
                "the operator's access listener is not tagged {CLIENT_TAG}: {}",
                access_proxy.listen
            ));
        }
        Ok(Rig {
            _servers: vec![plain_server, tls_server],
            _scratch: scratch,
            server_binary,
            proxy_binary,
            pki,
            plain_port,
            tls_port,
            proxy,
            tls_proxy,
            access_proxy,
        })
    }

    /// Starts the proxy of `launch` and waits for it to accept.
    pub fn start(&self, launch: &Launch) -> Result<Process, String> {
        start_on(
            &self.proxy_binary,
            &launch.listen,
            launch.port,
            &launch.args,
        )
    }
}

/// The order of the paths in round `round`: forward, then backward, and so on, so that a drift of the
/// machine's speed during a step (another process, the CPU's clock) weighs on every path alike instead of
/// on the one measured last.
pub fn round_order(round: usize, paths: usize) -> Vec<usize> {
    let forward = 0..paths;
    match round % 2 {
        0 => forward.collect(),
        _ => forward.rev().collect(),
    }
}

/// memcached runs as nobody when the bench is root: it reads the files of `path` and writes its pid file
/// there.
fn open_to_memcached(path: &Path) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| format!("cannot open {} to memcached: {e}", path.display()))
}

fn sub_dir(scratch: &Path, name: &str) -> Result<PathBuf, String> {
    let dir = scratch.join(name);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    open_to_memcached(&dir)?;
    Ok(dir)
}

fn write_config(dir: &Path, config: String) -> Result<(), String> {
    std::fs::write(dir.join(routes::CONFIG_KEY), config)
        .map_err(|e| format!("cannot write the route configuration: {e}"))
}

/// The access proxy's files, as the operator's configuration writer writes them: the route to the TLS
/// server at `address` with one identity (the client certificate's common name, allowed [`PREFIX`]),
/// the client CA, the trust epoch and the library.
fn write_access_files(dir: &Path, pki: &Pki, address: &str) -> Result<(), String> {
    let bundle = ClientCa::parse(pki.ca.as_bytes()).map_err(|e| format!("the client CA: {e}"))?;
    let access = RouteAccess {
        epoch: "b0".to_owned(),
        client_ca: bundle.pem.clone(),
        identities: vec![RouteIdentity {
            name: "bench".to_owned(),
            common_name: CLIENT_CN.to_owned(),
            prefixes: vec![PREFIX.to_owned()],
            read_only: false,
        }],
    };
    let route = Route {
        servers: vec![address.to_owned()],
        backend_tls: true,
        access: Some(access.clone()),
    };
    Route::parse(&route.to_data()).map_err(|e| e.to_string())?;
    Files {
        config: routes::render("bench", &route),
        client_ca: Some(access.client_ca.clone()),
        epoch: Some(access.epoch.clone()),
    }
    .write(dir)
    .map_err(|e| format!("cannot write the access configuration: {e}"))?;
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644));
    }
    Ok(())
}

/// The launch of a proxy whose files are in `dir` (`tls_dir`: where the serving certificate is), on a
/// free port.
fn launch(
    dir: &Path,
    tls_dir: Option<&str>,
    access: bool,
    extra: &[String],
) -> Result<Launch, String> {
    let port = free_port()?;
    let (listen, args) = bench_args(
        proxy_args_in(i32::from(port), &dir.to_string_lossy(), tls_dir, access),
        extra,
    );
    Ok(Launch { listen, port, args })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_order_of_the_paths() {
        assert_eq!(round_order(0, 3), [0, 1, 2]);
        assert_eq!(round_order(1, 3), [2, 1, 0]);
        assert_eq!(round_order(2, 3), [0, 1, 2]);
    }

    #[test]
    fn the_operators_arguments_lose_their_listeners_and_pod_paths() {
        let extra = ["-t".to_owned(), "2".to_owned()];
        let (listen, args) = bench_args(
            proxy_args_in(11211, "/scratch/tls", Some("/scratch"), false),
            &extra,
        );
        assert_eq!(listen, "127.0.0.1");
        assert!(!args.iter().any(|a| a == "-p" || a == "-l"));
        assert!(
            args.iter()
                .any(|a| a.contains("ssl_chain_cert=/scratch/tls.crt"))
        );
        assert_eq!(args[args.len() - 2..], ["-t", "2"]);
        let (listen, args) = bench_args(
            proxy_args_in(11211, "/scratch/access", Some("/scratch"), true),
            &extra,
        );
        assert_eq!(listen, "mtls:tag[client]:127.0.0.1:11211");
        assert!(args.iter().any(|a| a.contains("access.lua")));
    }
}

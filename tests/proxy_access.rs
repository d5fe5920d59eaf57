//! Access control through the proxy (`spec.proxy.access`) against a real proxy-capable memcached running
//! exactly what a proxy pod runs: the operator's arguments (`resources::proxy::proxy_args_in` with
//! access), and the files its configuration writer writes (`proxy_config::Files`: the route
//! configuration, the access library, the client CA bundle). Certificates are made here.
//!
//! Needs a memcached 1.6.30 or later built with `--enable-proxy` and `--enable-tls`, named by
//! `MEMCACHED_PROXY_BINARY`; the test passes with a message saying so when it is unset (CI has none).
//! The same binary runs the backend, as a plain server.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memcached_operator::proxy_config::Files;
use memcached_operator::resources::proxy::identities::{ClientCa, RouteAccess, RouteIdentity};
use memcached_operator::resources::proxy::routes::{Route, render};
use memcached_operator::resources::proxy::{ops_port, proxy_args_in};
use memcached_operator::telemetry::proxy::{AccessCounters, AccessNames, parse_access};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

mod common;
use common::proxy::{Process, free_port, proxy_binary, start};

/// A CA: its PEM and what signs with it.
struct Ca {
    pem: String,
    der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        der: cert.der().clone(),
        issuer: Issuer::new(params, key),
    }
}

/// A certificate with common name `cn` (and `localhost` as its DNS name), signed by `ca`: its PEM,
/// DER and key.
fn leaf(ca: &Ca, cn: &str) -> (String, CertificateDer<'static>, KeyPair) {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), cert.der().clone(), key)
}

/// A client of the proxy: TLS trusting `server_ca`, presenting `identity` when given.
fn connect(
    port: u16,
    server_ca: &Ca,
    identity: Option<&(String, CertificateDer<'static>, KeyPair)>,
) -> std::io::Result<StreamOwned<ClientConnection, TcpStream>> {
    connect_with(port, client_config(server_ca, identity))
}

/// The TLS configuration of a client (rustls resumes sessions of one configuration by default).
fn client_config(
    server_ca: &Ca,
    identity: Option<&(String, CertificateDer<'static>, KeyPair)>,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(server_ca.der.clone()).unwrap();
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let config = match identity {
        Some((_, der, key)) => builder
            .with_client_auth_cert(
                vec![der.clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// [`connect`] with `config`.
fn connect_with(
    port: u16,
    config: Arc<ClientConfig>,
) -> std::io::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = ServerName::try_from("localhost").unwrap();
    let connection = ClientConnection::new(config, name).unwrap();
    let socket = TcpStream::connect(("127.0.0.1", port))?;
    socket.set_read_timeout(Some(Duration::from_secs(3)))?;
    let mut stream = StreamOwned::new(connection, socket);
    // Finish the handshake (and see a refused certificate) before the first request.
    stream.write_all(b"mn\r\n")?;
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line)?;
    if line != "MN\r\n" {
        return Err(std::io::Error::other(format!("handshake: {line:?}")));
    }
    Ok(stream)
}

/// Sends `command` and reads one reply: up to `END`/`MN`, or a single line for anything else; an empty
/// reply when the proxy closes the connection.
fn ask(stream: &mut StreamOwned<ClientConnection, TcpStream>, command: &str) -> String {
    if stream.write_all(command.as_bytes()).is_err() {
        return String::new();
    }
    // A multi-get's answer ends with END; a single get's refusal is its only line.
    let keys = command.split_whitespace().count().saturating_sub(1);
    let multi = command.starts_with("get ") && keys > 1 || command.starts_with("stats");
    let mut reply = String::new();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return reply,
            Ok(_) => reply.push_str(&line),
        }
        let value = line.starts_with("VALUE") || reply.starts_with("VALUE") && line != "END\r\n";
        if line == "END\r\n" || !multi && !value {
            return reply;
        }
    }
}

fn identity(name: &str, cn: &str, prefixes: &[&str], read_only: bool) -> RouteIdentity {
    RouteIdentity {
        name: name.to_owned(),
        common_name: cn.to_owned(),
        prefixes: prefixes.iter().map(|p| (*p).to_owned()).collect(),
        read_only,
    }
}

/// Writes what the configuration writer writes for `route`.
fn write(dir: &Path, route: &Route) {
    let access = route.access.as_ref().unwrap();
    Files {
        config: render("cache-proxy", route),
        client_ca: Some(access.client_ca.clone()),
        epoch: Some(access.epoch.clone()),
    }
    .write(dir)
    .unwrap();
}

/// SIGHUP to the proxy, as the writer sends it.
fn hup(pid: u32) {
    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Polls `check` for up to 2 s (the bound route changes have); how long it took.
fn within_two_seconds(mut check: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        if check() {
            let took = started.elapsed();
            assert!(took <= Duration::from_secs(2), "took {took:?}");
            return took;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("not within 2 s");
}

#[test]
fn identities_reach_their_prefixes_only_and_changes_apply_in_place() {
    let Some(binary) = proxy_binary() else {
        eprintln!("MEMCACHED_PROXY_BINARY is not set: skipping the proxy access test");
        return;
    };
    let scratch = tempdir();
    let dir = scratch.as_path();
    let backend_port = free_port();
    let _backend = start(&binary, backend_port, &[]);

    let server_ca = ca("servers");
    let (server_pem, _, server_key) = leaf(&server_ca, "cache-proxy");
    std::fs::write(dir.join("tls.crt"), server_pem).unwrap();
    std::fs::write(dir.join("tls.key"), server_key.serialize_pem()).unwrap();
    let clients = ca("clients");
    let other = ca("other clients");
    let orders = leaf(&clients, "orders.clients");
    let reports = leaf(&clients, "reports.clients");
    let stranger = leaf(&clients, "stranger.clients");
    let forged = leaf(&other, "orders.clients");

    let bundle = ClientCa::parse(clients.pem.as_bytes()).unwrap();
    let mut route = Route {
        servers: vec![format!("127.0.0.1:{backend_port}")],
        backend_tls: false,
        access: Some(RouteAccess {
            epoch: "e1".to_owned(),
            client_ca: bundle.pem.clone(),
            identities: vec![
                identity("orders", "orders.clients", &["orders:"], false),
                identity("reports", "reports.clients", &["orders:", "reports:"], true),
            ],
        }),
    };
    write(dir, &route);
    let port = free_port();
    let dir_text = dir.to_str().unwrap();
    let mut args = proxy_args_in(i32::from(port), dir_text, Some(dir_text), true);
    args.extend(["-U", "0", "-t", "2", "-u", "nobody"].map(str::to_owned));
    let ops = u16::try_from(ops_port(i32::from(port))).unwrap();
    let child = Command::new(&binary)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _proxy = Process(child);
    let started = Instant::now();
    while connect(port, &server_ca, Some(&orders)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(5), "no proxy");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Each identity on its own prefixes; nothing else.
    let mut o = connect(port, &server_ca, Some(&orders)).unwrap();
    assert_eq!(ask(&mut o, "set orders:1 0 0 2\r\nok\r\n"), "STORED\r\n");
    assert_eq!(
        ask(&mut o, "get orders:1\r\n"),
        "VALUE orders:1 0 2\r\nok\r\nEND\r\n"
    );
    let denied = "CLIENT_ERROR access denied\r\n";
    assert_eq!(ask(&mut o, "set reports:1 0 0 2\r\nno\r\n"), denied);
    assert_eq!(ask(&mut o, "get reports:1\r\n"), denied);
    assert_eq!(ask(&mut o, "delete reports:1\r\n"), denied);
    assert_eq!(ask(&mut o, "mg reports:1 v\r\n"), denied);
    // A base64 key (meta flag b) is not checked by its encoding: refused whatever it decodes to.
    assert_eq!(
        ask(&mut o, "mg b3JkZXJzOjE= b v\r\n"),
        denied,
        "orders:1 in base64"
    );
    assert_eq!(ask(&mut o, "mg orders:1 v\r\n"), "VA 2\r\n");
    // A multi-get is split per key: the refused key's answer is an error line in the stream.
    assert_eq!(
        ask(&mut o, "get orders:1 reports:1\r\n"),
        format!("VALUE orders:1 0 2\r\nok\r\n{denied}END\r\n")
    );
    let mut r = connect(port, &server_ca, Some(&reports)).unwrap();
    assert_eq!(
        ask(&mut r, "get orders:1\r\n"),
        "VALUE orders:1 0 2\r\nok\r\nEND\r\n"
    );
    assert_eq!(
        ask(&mut r, "set reports:1 0 0 2\r\nno\r\n"),
        denied,
        "read-only"
    );
    assert_eq!(ask(&mut r, "delete orders:1\r\n"), denied, "read-only");
    // A client that resumes its TLS session (rustls does by default, so do Go's and Java's clients with a
    // session cache) is served on every connection, and keeps its identity.
    let resuming = client_config(&server_ca, Some(&orders));
    for round in 0..3 {
        let mut c = connect_with(port, resuming.clone())
            .unwrap_or_else(|e| panic!("connection {round} of a resuming client: {e}"));
        assert_eq!(
            ask(&mut c, "get orders:1\r\n"),
            "VALUE orders:1 0 2\r\nok\r\nEND\r\n",
            "round {round}"
        );
    }
    // A certificate of the CA that names no identity.
    let mut s = connect(port, &server_ca, Some(&stranger)).unwrap();
    assert_eq!(ask(&mut s, "get orders:1\r\n"), denied);

    // Every other command is refused to clients, with an error or by closing the connection.
    let refused = "CLIENT_ERROR command not allowed through this proxy\r\n";
    for command in ["stats\r\n", "stats proxy\r\n", "watch\r\n", "version\r\n"] {
        let mut c = connect(port, &server_ca, Some(&orders)).unwrap();
        assert_eq!(ask(&mut c, command), refused, "{command:?}");
    }
    for command in [
        "flush_all\r\n",
        "lru_crawler metadump all\r\n",
        "verbosity 1\r\n",
        "refresh_certs\r\n",
        "shutdown\r\n",
        "cache_memlimit 10\r\n",
        "slabs automove 1\r\n",
    ] {
        let mut c = connect(port, &server_ca, Some(&orders)).unwrap();
        let reply = ask(&mut c, command);
        assert!(
            reply.is_empty() || reply.starts_with("CLIENT_ERROR"),
            "{command:?}: {reply:?}"
        );
        assert_eq!(
            ask(&mut c, "get orders:1\r\n"),
            "",
            "{command:?} left the connection open"
        );
    }
    let mut check = connect(port, &server_ca, Some(&orders)).unwrap();
    assert_eq!(
        ask(&mut check, "get orders:1\r\n"),
        "VALUE orders:1 0 2\r\nok\r\nEND\r\n"
    );

    // No certificate, or one of another CA: the handshake fails.
    assert!(connect(port, &server_ca, None).is_err());
    assert!(connect(port, &server_ca, Some(&forged)).is_err());

    // The operator's stats listener: stats, and per identity counters; nothing else.
    let mut stats = connect_ops(ops, &server_ca);
    let reply = ask(&mut stats, "stats proxy\r\n");
    assert!(
        reply.contains("STAT user_access_orders_requests "),
        "{reply}"
    );
    assert!(
        reply.contains("STAT user_access_orders_refused "),
        "{reply}"
    );
    assert!(
        reply.contains("STAT user_access_unknown_refused 1\r\n"),
        "{reply}"
    );
    // What the collector keeps of it: the spec's identities and `unknown`, with their exact counts
    // (orders: 10 requests up to its last refusal, of which 6 denied, published by its connection's
    // worker at that refusal; its 4 later requests wait in their workers' tables for the 64th;
    // reports: 3 and 2; the stranger's one request).
    let access: memcached_operator::api::ProxyAccess = serde_json::from_value(serde_json::json!({
        "clientCA": {"secretName": "clients"},
        "identities": [{"name": "orders", "prefixes": ["orders:"]}],
    }))
    .unwrap();
    let kept = parse_access(reply.as_bytes(), &AccessNames::of(&access)).unwrap();
    let counted = |requests, refused| AccessCounters { requests, refused };
    assert_eq!(
        kept,
        BTreeMap::from([
            ("orders".to_owned(), counted(10, 6)),
            ("unknown".to_owned(), counted(1, 1)),
        ]),
        "reports is not in this spec: left out"
    );
    assert!(ask(&mut stats, "stats\r\n").contains("STAT proxy_conn_requests"));
    assert_eq!(ask(&mut stats, "get orders:1\r\n"), refused);
    assert_eq!(ask(&mut stats, "watch\r\n"), refused);

    // Changed identities reach the running proxy on SIGHUP within 2 s.
    route.access.as_mut().unwrap().identities[0].prefixes = vec!["reports:".to_owned()];
    write(dir, &route);
    hup(pid);
    let took = within_two_seconds(|| {
        let mut c = connect(port, &server_ca, Some(&orders)).unwrap();
        ask(&mut c, "get orders:1\r\n") == denied
    });
    eprintln!("changed identities applied in {took:?}");

    // An added CA too; a removed one stays trusted until memcached restarts (why the operator
    // replaces the pods then).
    let access = route.access.as_mut().unwrap();
    access.client_ca = format!("{}{}", bundle.pem, other.pem);
    write(dir, &route);
    hup(pid);
    let took = within_two_seconds(|| connect(port, &server_ca, Some(&forged)).is_ok());
    eprintln!("an added CA applied in {took:?}");
    route.access.as_mut().unwrap().client_ca = bundle.pem.clone();
    write(dir, &route);
    hup(pid);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        connect(port, &server_ca, Some(&forged)).is_ok(),
        "memcached 1.6.45 keeps a loaded CA after SIGHUP; if this fails, it no longer does"
    );

    // Access control turned off: until its pod is replaced, the proxy serves the plain route to every
    // client that still gets through its TLS listener (the library no longer refuses anything).
    route.access = None;
    Files {
        config: render("cache-proxy", &route),
        client_ca: None,
        epoch: None,
    }
    .write(dir)
    .unwrap();
    hup(pid);
    within_two_seconds(|| {
        let mut c = connect(port, &server_ca, Some(&orders)).unwrap();
        ask(&mut c, "get reports:1\r\n").ends_with("END\r\n")
    });
}

fn connect_ops(port: u16, server_ca: &Ca) -> StreamOwned<ClientConnection, TcpStream> {
    let mut roots = RootCertStore::empty();
    roots.add(server_ca.der.clone()).unwrap();
    let config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let connection = ClientConnection::new(Arc::new(config), name).unwrap();
    let socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    StreamOwned::new(connection, socket)
}

/// A scratch directory readable by `nobody` (memcached drops to it when run as root), removed at drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn as_path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Scratch {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("proxy-access-{}", std::process::id()));
    std::fs::create_dir_all(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    Scratch(path)
}

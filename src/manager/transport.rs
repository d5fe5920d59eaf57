//! The connection to the API server: HTTP/2 whenever the server offers it over TLS, as client-go does.
//!
//! kube's own client stack speaks HTTP/1.1 only (its TLS connector offers `http/1.1` alone), so every
//! request in flight needs a connection of its own: with 64 reconciles in flight, some 75 TCP and TLS
//! connections of about 80 KB each, more memory than the 300 instances they serve (`make bench`, whose
//! fake API server offers both). Over HTTP/2 every request and watch of a client shares one connection.
//!
//! [`builder`] assembles the stack kube's `ClientBuilder::try_from` builds, from the same parts kube
//! exports ([`ConfigExt`]): its TLS settings (certificate authority, client certificate, the in-cluster
//! CA file re-read on rotation, `tls-server-name`), authentication (tokens, token files, exec plugins,
//! with their refresh), impersonation headers, the base URI and the connect, read and write timeouts.
//! What differs: the TLS connector offers `h2` before `http/1.1`, TCP_NODELAY is set, and HTTP/2
//! keep-alive pings find a connection that went silent (a control-plane node gone without a reset)
//! within [`KEEP_ALIVE_INTERVAL`] + [`KEEP_ALIVE_TIMEOUT`], so the requests and watches sharing it fail
//! and start over instead of hanging. A plain `http://` server (`kubectl proxy`, the test fakes) gets
//! HTTP/1.1 as before; h2c is not attempted.
//!
//! kube's request tracing (debug spans named `HTTP`) is left out: the operator's own layer
//! ([`crate::observe`]) counts and reports every request. A kubeconfig with a `proxy-url` keeps kube's
//! own stack, as before: this build enables none of kube's proxy features, so kube refuses it with an
//! error that names the missing feature.

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::Config;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use tokio_rustls::rustls::pki_types::ServerName;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt as _};

/// The boxed service under a kube client: the type kube's own `ClientBuilder::try_from` gives, so either
/// stack takes the operator's layers alike.
pub type Service = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// After this long without a frame from the server, the client pings it (client-go's `ReadIdleTimeout`
/// is the same 30 s).
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A ping unanswered for this long closes the connection (client-go's `PingTimeout`: 15 s).
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(15);

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("invalid tls-server-name {name:?}: {reason}")]
    ServerName { name: String, reason: String },
}

/// A client builder for `config` whose connections negotiate HTTP/2 (see the module documentation).
pub fn builder(config: Config) -> Result<ClientBuilder<Service>, Error> {
    if config.proxy_url.is_some() {
        return Ok(ClientBuilder::try_from(config)?);
    }
    let default_namespace = config.default_namespace.clone();

    let mut tcp = HttpConnector::new();
    // The scheme is the TLS connector's business: `https` gets TLS, `http` stays plain.
    tcp.enforce_http(false);
    // HTTP/2 writes a request as several frames; Nagle's algorithm would hold the later ones back until
    // the server acknowledges the first. Go's clients set TCP_NODELAY too.
    tcp.set_nodelay(true);
    let mut tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let server_name = ServerName::try_from(name.clone()).map_err(|e| Error::ServerName {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        tls = tls.with_server_name_resolver(FixedServerNameResolver::new(server_name));
    }
    let mut connector = TimeoutConnector::new(tls.enable_all_versions().wrap_connector(tcp));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);

    let http: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        // Watches hold the connection open between their events: it is checked then too.
        .http2_keep_alive_while_idle(true)
        .build(connector);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // Innermost, so that the authentication's two variants (a fixed header, or a token refreshed in
        // front of each request) fail with one error type.
        .map_err(BoxError::from)
        .service(http)
        .map_response(|response| {
            response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
        })
        .boxed();
    Ok(ClientBuilder::new(service, default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> Config {
        Config::new(url.parse().expect("a valid URL"))
    }

    #[tokio::test]
    async fn builds_for_https_and_plain_http_servers() {
        for url in ["https://127.0.0.1:6443", "http://127.0.0.1:8001"] {
            let client = builder(config(url)).map(ClientBuilder::build);
            assert!(client.is_ok(), "{url}: {:?}", client.err());
        }
    }

    #[test]
    fn an_invalid_tls_server_name_is_named_in_the_error() {
        let mut config = config("https://127.0.0.1:6443");
        config.tls_server_name = Some("not a host name".into());
        let error = builder(config).err().expect("an invalid name is refused");
        assert!(
            matches!(&error, Error::ServerName { name, .. } if name == "not a host name"),
            "{error}"
        );
    }

    #[test]
    fn a_proxy_gets_the_answer_of_kubes_own_stack() {
        let mut with_proxy = config("https://127.0.0.1:6443");
        with_proxy.proxy_url = Some("http://proxy.example:3128".parse().expect("a valid URL"));
        let ours = builder(with_proxy.clone()).err().map(|e| e.to_string());
        let kubes = ClientBuilder::try_from(with_proxy)
            .err()
            .map(|e| e.to_string());
        // This build enables none of kube's proxy features, so kube refuses the proxy; so must we.
        assert!(kubes.is_some());
        assert_eq!(ours, kubes);
    }
}

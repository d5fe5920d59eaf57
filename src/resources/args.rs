//! The memcached command line, from `spec.memcached`, TLS and auth.
//!
//! Flags whose value equals memcached's own default are left out unless the spec sets them, so an
//! instance's command line (and so its pods) only changes when its spec does.

use crate::api::MemcachedSpec;

/// Where the TLS Secret is mounted.
pub const TLS_DIR: &str = "/etc/memcached/tls";
/// Where the auth Secret is mounted.
pub const AUTH_DIR: &str = "/etc/memcached/auth";

/// The program the container runs. Set explicitly so the image's entrypoint script is not relied on.
pub fn command() -> Vec<String> {
    vec!["memcached".to_owned()]
}

/// Arguments for memcached. Starts with the tutorials' `-p <port> -m 64 -o modern`.
pub fn args(spec: &MemcachedSpec) -> Vec<String> {
    let config = spec.memcached();
    let mut args = vec![
        "-p".to_owned(),
        spec.container_port.to_string(),
        "-m".to_owned(),
        config.max_memory_mb().to_string(),
    ];
    if let Some(c) = config.max_connections {
        args.extend(["-c".to_owned(), c.to_string()]);
    }
    if let Some(t) = config.threads {
        args.extend(["-t".to_owned(), t.to_string()]);
    }
    if let Some(size) = &config.max_item_size {
        args.extend(["-I".to_owned(), size.clone()]);
    }
    match config.verbosity.unwrap_or(0) {
        0 => {}
        1 => args.push("-v".to_owned()),
        _ => args.push("-vv".to_owned()),
    }
    let mut options = vec!["modern".to_owned()];
    if let Some(tls) = spec.tls() {
        options.push(format!("ssl_chain_cert={TLS_DIR}/tls.crt"));
        options.push(format!("ssl_key={TLS_DIR}/tls.key"));
        if tls.client_auth {
            options.push(format!("ssl_ca_cert={TLS_DIR}/ca.crt"));
            // 2 = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT: a client certificate is required.
            options.push("ssl_verify_mode=2".to_owned());
            // The session cache gives resumed sessions a context: without one, OpenSSL refuses a client
            // that resumes a session when certificates are verified (an `internal_error` alert; checked
            // with memcached 1.6.18 and 1.6.45), which rustls, Go and Java clients do by default.
            options.push("ssl_session_cache".to_owned());
        }
    }
    args.extend(["-o".to_owned(), options.join(",")]);
    if spec.tls().is_some() {
        args.push("-Z".to_owned());
    }
    if let Some(auth) = spec.auth() {
        args.extend(["-Y".to_owned(), format!("{AUTH_DIR}/{}", auth.key())]);
    }
    args.extend(config.extra_args.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AuthConfig, MemcachedConfig, Security, TlsConfig};

    #[test]
    fn defaults_render_the_tutorial_flags() {
        let spec = MemcachedSpec {
            container_port: 11311,
            ..MemcachedSpec::default()
        };
        assert_eq!(args(&spec).join(" "), "-p 11311 -m 64 -o modern");
        assert_eq!(command(), ["memcached"]);
    }

    #[test]
    fn every_setting_renders_its_flag() {
        let spec = MemcachedSpec {
            memcached: Some(Box::new(MemcachedConfig {
                max_memory_mb: Some(1024),
                max_connections: Some(4096),
                threads: Some(8),
                max_item_size: Some("2m".into()),
                verbosity: Some(2),
                extra_args: vec!["-o".into(), "lru_crawler".into()],
            })),
            security: Some(Box::new(Security {
                tls: Some(TlsConfig {
                    secret_name: "tls".into(),
                    client_auth: true,
                    client_secret_name: None,
                }),
                auth: Some(AuthConfig {
                    secret_name: "auth".into(),
                    key: None,
                    allow_plaintext_stats: false,
                }),
                network_policy: None,
            })),
            ..MemcachedSpec::default()
        };
        assert_eq!(
            args(&spec).join(" "),
            "-p 11211 -m 1024 -c 4096 -t 8 -I 2m -vv \
             -o modern,ssl_chain_cert=/etc/memcached/tls/tls.crt,ssl_key=/etc/memcached/tls/tls.key,\
             ssl_ca_cert=/etc/memcached/tls/ca.crt,ssl_verify_mode=2,ssl_session_cache -Z -Y /etc/memcached/auth/auth-file \
             -o lru_crawler"
        );
    }
}

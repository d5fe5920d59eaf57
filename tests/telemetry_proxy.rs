//! The collector's read of a proxy pod (`telemetry::client::read_proxy`) against a real proxy-capable
//! memcached in front of two servers running the route configuration the operator generates: requests
//! counted, then one server stopped, its slot marked down and backend failures counted, and the slot up
//! again once a server answers there.
//!
//! Needs a memcached 1.6.23 or later built with `--enable-proxy`, named by `MEMCACHED_PROXY_BINARY`; the
//! test passes with a message saying so when it is unset or missing (CI has none). The same binary runs
//! the servers.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use memcached_operator::api::Server;
use memcached_operator::resources::proxy::routes;
use memcached_operator::telemetry::client::{ProxyReading, Target, read_proxy};
use memcached_operator::telemetry::proxy::backends;

mod common;
use common::proxy::{Process, free_port, proxy_binary, start};

/// Sets and gets `count` keys through the proxy, on one connection; how many answers were errors.
fn traffic(port: u16, count: usize) -> usize {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut errors = 0;
    let mut line = String::new();
    for i in 0..count {
        stream
            .write_all(format!("set key{i} 0 0 5\r\nvalue\r\nget key{i}\r\n").as_bytes())
            .unwrap();
        for _ in 0..2 {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.starts_with("SERVER_ERROR") {
                errors += 1;
            } else if line.starts_with("VALUE") {
                for _ in 0..2 {
                    line.clear();
                    reader.read_line(&mut line).unwrap();
                }
            }
        }
    }
    errors
}

async fn read(port: u16) -> ProxyReading {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    read_proxy(&Target::plain(address), Duration::from_secs(2))
        .await
        .expect("the proxy's stats")
}

#[tokio::test]
async fn a_stopped_server_is_marked_down_in_its_slot_and_up_again_when_it_answers() {
    let Some(binary) = proxy_binary() else {
        eprintln!(
            "skipped: MEMCACHED_PROXY_BINARY does not name a proxy-capable memcached (1.6.23 or later \
             built with --enable-proxy)"
        );
        return;
    };
    let ports = [free_port(), free_port()];
    let mut servers: Vec<Process> = ports.iter().map(|&p| start(&binary, p, &[])).collect();
    let published: Vec<Server> = ports
        .iter()
        .enumerate()
        .map(|(slot, port)| Server {
            slot: i32::try_from(slot).unwrap(),
            pod: None,
            address: Some(format!("127.0.0.1:{port}")),
            ready: true,
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("telemetry-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join(routes::CONFIG_KEY);
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let list: Vec<&str> = addresses.iter().map(String::as_str).collect();
    std::fs::write(&config, routes::config("pool", &list)).unwrap();
    let proxy_port = free_port();
    let _proxy = start(
        &binary,
        proxy_port,
        &[
            "-o".to_owned(),
            format!("proxy_config=routelib,proxy_arg={}", config.display()),
        ],
    );

    let idle = read(proxy_port).await;
    assert_eq!(idle.counters.config_reloads, 1, "{idle:?}");
    assert_eq!(traffic(proxy_port, 100), 0);
    let healthy = read(proxy_port).await;
    assert_eq!(
        healthy.counters.requests,
        idle.counters.requests + 200,
        "each set and get counted, the operator's reads not"
    );
    assert!(healthy.down.is_empty(), "{healthy:?}");
    assert!(
        backends(&published, &BTreeMap::new(), &healthy.down)
            .iter()
            .all(|b| !b.down)
    );

    // Slot 1's server stops: its keys fail, and the proxy marks it down.
    drop(servers.pop());
    let errors = traffic(proxy_port, 100);
    assert!(errors > 0, "no key of the stopped server's slot");
    let down = read(proxy_port).await;
    assert!(down.counters.backend_failures > 0, "{down:?}");
    assert!(down.counters.backends_marked_bad > 0, "{down:?}");
    let marks: Vec<(i32, bool)> = backends(&published, &BTreeMap::new(), &down.down)
        .iter()
        .map(|b| (b.slot, b.down))
        .collect();
    assert_eq!(marks, [(0, false), (1, true)], "{down:?}");

    // A server answers there again: the proxy's retry marks it up.
    let _back = start(&binary, ports[1], &[]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = read(proxy_port).await;
        if now.down.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still down: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(traffic(proxy_port, 100), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

//! Loopback ports and readiness by TCP connect.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A port that was free on 127.0.0.1 a moment ago: the kernel's choice for port 0. Another process may
/// take it before our child binds it; that shows up as the child exiting at start, not as a silent mix-up.
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind(("127.0.0.1", 0)).context("cannot bind a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// `N` ports free on 127.0.0.1 a moment ago, distinct: each listener is held until all are chosen (two
/// [`free_port`] calls in a row can get the same port back, the kernel reusing the one just released).
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).context("cannot bind a free port on 127.0.0.1")?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

/// Waits until something accepts TCP connections at `ip:port`.
pub async fn wait_for_listener(ip: IpAddr, port: u16, timeout: Duration) -> Result<()> {
    let addr = SocketAddr::new(ip, port);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("nothing listens on {addr} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_chosen_together_are_distinct() {
        for _ in 0..50 {
            let [a, b] = free_ports::<2>().unwrap();
            assert_ne!(a, b);
        }
    }
}

//! The fake's front door: a TCP relay on the address the operator's kubeconfig names, in front of the
//! fake's HTTP server. Closing it is an API-server outage as a client sees one: new connections are
//! refused (nothing listens), and every open connection, held watches included, is cut at once, as when
//! the API server process dies. Opening it again listens on the same address.

use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{AbortHandle, JoinSet};

pub struct Door {
    /// The address clients use.
    pub addr: SocketAddr,
    /// The fake's HTTP server behind it.
    backend: SocketAddr,
    /// The accept loop and every relayed connection, while open.
    tasks: Mutex<Option<Open>>,
}

struct Open {
    accept: AbortHandle,
    connections: std::sync::Arc<Mutex<JoinSet<()>>>,
}

impl Door {
    /// Opens a door on a free loopback port in front of `backend`.
    pub async fn open_for(backend: SocketAddr) -> Self {
        let listener = bind("127.0.0.1:0".parse().unwrap());
        let door = Self {
            addr: listener.local_addr().unwrap(),
            backend,
            tasks: Mutex::new(None),
        };
        door.serve(listener);
        door
    }

    /// Cuts every connection and stops listening.
    pub fn close(&self) {
        if let Some(open) = self.tasks.lock().unwrap().take() {
            open.accept.abort();
            // Dropping the relays drops both sockets of every connection.
            open.connections.lock().unwrap().abort_all();
        }
    }

    /// Listens on the same address again.
    pub fn open(&self) {
        if self.tasks.lock().unwrap().is_none() {
            self.serve(bind(self.addr));
        }
    }

    fn serve(&self, listener: TcpListener) {
        let backend = self.backend;
        let connections = std::sync::Arc::new(Mutex::new(JoinSet::new()));
        let relays = connections.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                relays.lock().unwrap().spawn(relay(client, backend));
            }
        })
        .abort_handle();
        *self.tasks.lock().unwrap() = Some(Open {
            accept,
            connections,
        });
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.close();
    }
}

/// Binds `addr` with `SO_REUSEADDR`, so the door reopens on its port while closed connections linger in
/// `TIME_WAIT`.
fn bind(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket
        .bind(addr)
        .unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
    socket.listen(128).unwrap()
}

async fn relay(mut client: TcpStream, backend: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

//! The fake's front door: a TCP relay on the address the clients' kubeconfig names, in front of the
//! fake's HTTP (or TLS) server. Closing it is an API-server outage as a client sees one: new connections
//! are refused (nothing listens), and every open connection, held watches included, is cut at once, as
//! when the API server process dies. Opening it again listens on the same address.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{AbortHandle, JoinSet};

pub(crate) struct Door {
    /// The address clients use.
    pub addr: SocketAddr,
    /// The fake's server behind it.
    backend: SocketAddr,
    /// The accept loop and every relayed connection, while open.
    tasks: Mutex<Option<Open>>,
}

struct Open {
    accept: AbortHandle,
    connections: Arc<Mutex<JoinSet<()>>>,
}

/// A lock that a panicking holder did not leave unusable: the door's state is valid between statements.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Door {
    /// Opens a door on a free loopback port in front of `backend`.
    pub fn open_for(backend: SocketAddr) -> io::Result<Self> {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let door = Self {
            addr: listener.local_addr()?,
            backend,
            tasks: Mutex::new(None),
        };
        door.serve(listener);
        Ok(door)
    }

    /// Cuts every connection and stops listening.
    pub fn close(&self) {
        if let Some(open) = lock(&self.tasks).take() {
            open.accept.abort();
            // Dropping the relays drops both sockets of every connection.
            lock(&open.connections).abort_all();
        }
    }

    /// Listens on the same address again.
    pub fn open(&self) -> io::Result<()> {
        if lock(&self.tasks).is_none() {
            self.serve(bind(self.addr)?);
        }
        Ok(())
    }

    fn serve(&self, listener: TcpListener) {
        let backend = self.backend;
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let relays = connections.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                lock(&relays).spawn(relay(client, backend));
            }
        })
        .abort_handle();
        *lock(&self.tasks) = Some(Open {
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
fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

async fn relay(mut client: TcpStream, backend: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

//! The listener: accepts connections up to `max_connections` and drains them on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::broker::Broker;
use crate::connection;

pub struct Server {
    listener: TcpListener,
    broker: Arc<Broker>,
}

impl Server {
    pub async fn bind(addr: &str, broker: Arc<Broker>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self { listener, broker })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` turns true, then stops accepting and waits for connections to
    /// finish their in-flight requests.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let limit = Arc::new(Semaphore::new(self.broker.settings.max_connections.max(1)));
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                accepted = self.listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(pair) => pair,
                        Err(err) => {
                            // Typically EMFILE: back off instead of spinning on the error.
                            warn!(error = %err, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        self.broker.metrics.refused.inc();
                        warn!(
                            %peer,
                            "connection limit reached, refusing connection: raise \
                             kafka.max_connections if clients need more"
                        );
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let broker = self.broker.clone();
                    let stop = shutdown.clone();
                    broker.metrics.accepted.inc();
                    broker.metrics.connections.inc();
                    connections.spawn(async move {
                        connection::serve(broker.clone(), stream, peer, stop).await;
                        broker.metrics.connections.dec();
                        drop(permit);
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        info!(
            open = connections.len(),
            "listener stopped, draining connections"
        );
        while connections.join_next().await.is_some() {}
    }
}

//! The accept loop (instead of `axum::serve`, which has no timeouts): HTTP/1.1 through hyper with
//! - a header-read timeout, which hyper starts whenever a connection waits for a request head, so it
//!   also closes silent connections, half-sent headers and idle keep-alive connections;
//! - a connection cap: past it a new connection is closed at once and the refusal logged (at most
//!   once a second, with the count since the last line);
//! - graceful shutdown: no new connections; a connection that never sent a full request is closed at
//!   once, every other one finishes its in-flight request and closes (an idle one at once), so
//!   shutdown waits only for requests.
//!
//! The body-read timeout is a layer on the router (`tower_http`'s request-body timeout). A connection
//! upgraded to a WebSocket (`GET /v1/responses`) leaves this loop's count; its own limits are the
//! WebSocket mode's (`protocols/responses/socket.rs`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// The router as a hyper service that counts the requests a connection started.
#[derive(Clone)]
struct Counted {
    router: Router,
    started: Arc<AtomicUsize>,
}

type BoxFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for Counted {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = BoxFuture;

    fn call(&self, req: hyper::Request<Incoming>) -> BoxFuture {
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut router = self.router.clone();
        Box::pin(tower_service::Service::call(
            &mut router,
            req.map(axum::body::Body::new),
        ))
    }
}

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Time for a request head to arrive (from when the connection waits for one).
    pub header_read: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `shutdown` resolves, then until every connection closed.
pub async fn serve(listener: TcpListener, router: Router, limits: ConnLimits, shutdown: impl Future<Output = ()>) {
    let open = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut refused = 0u64;
    let mut last_refusal_log: Option<Instant> = None;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // e.g. out of file descriptors: say so, back off, keep serving
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if open.load(Ordering::SeqCst) >= limits.max_connections {
            refused += 1;
            // logged before the close, so whoever sees the close can also find the line
            if last_refusal_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                warn!(
                    max_connections = limits.max_connections,
                    refused, "connection refused: --max-connections open at once"
                );
                last_refusal_log = Some(Instant::now());
                refused = 0;
            }
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        open.fetch_add(1, Ordering::SeqCst);
        let open = open.clone();
        let mut stop = stop_rx.clone();
        let started = Arc::new(AtomicUsize::new(0));
        let svc = Counted {
            router: router.clone(),
            started: started.clone(),
        };
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), svc)
                // a WebSocket (`GET /v1/responses`) takes the connection over; it then lives on in
                // its own task, outside this loop's count
                .with_upgrades();
            tokio::pin!(conn);
            let stopped = async move {
                loop {
                    let now = *stop.borrow_and_update();
                    if now {
                        return;
                    }
                    if stop.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            };
            let r = tokio::select! {
                r = conn.as_mut() => r,
                _ = stopped => {
                    if started.load(Ordering::SeqCst) == 0 {
                        // never sent a full request: nothing to finish
                        Ok(())
                    } else {
                        // finish the request in flight (or close at once when idle); a later
                        // half-sent head is bounded by the header-read timeout
                        conn.as_mut().graceful_shutdown();
                        conn.as_mut().await
                    }
                }
            };
            if let Err(e) = r {
                debug!(peer = %peer, error = %e, "connection ended");
            }
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while open.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Raises the soft limit on open files to hold `connections` sockets besides the model and spill files
/// (never above the hard limit); returns the soft limit now in force (`None` when it cannot be read).
pub fn raise_open_files(connections: usize) -> Option<u64> {
    let want = connections as libc::rlim_t + 256;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    Some(lim.rlim_cur)
}

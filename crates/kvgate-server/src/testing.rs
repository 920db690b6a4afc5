//! In-process servers for tests (feature `test-utils`): the router `serve` builds, from the same flags,
//! over the tiny in-memory model (or a scripted engine behind the [`Inference`] seam), listening on a
//! free loopback port of this process. No binary, no weights, no download.

use std::net::SocketAddr;
use std::sync::Arc;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use tokio::sync::oneshot;

use crate::http::state::{AppState, ServedModel};
use crate::infer::Inference;
use crate::startup::build::{build, BuildOptions};
use crate::startup::config;
use crate::startup::router::assemble;

/// A server running in this process; stops on drop.
pub struct TestServer {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Settings every test server gets unless the test gives them: a small cache.
fn argv(args: &[&str]) -> Vec<String> {
    let mut v = vec!["serve".to_string()];
    if !args.contains(&"--kv-cache-memory") && !args.contains(&"--num-kv-blocks") {
        v.extend(["--num-kv-blocks".to_string(), "512".to_string()]);
    }
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

impl TestServer {
    /// `serve <args>` over the tiny model, with the test hooks routed.
    pub fn tiny(args: &[&str]) -> TestServer {
        Self::tiny_with(args, TinySpec::default())
    }

    /// Like [`TestServer::tiny`] with another tiny model (a longer context, say).
    pub fn tiny_with(args: &[&str], spec: TinySpec) -> TestServer {
        Self::try_tiny_with(args, spec).expect("the tiny server builds")
    }

    /// Like [`TestServer::tiny_with`], returning the startup error `serve` would print instead of
    /// panicking.
    pub fn try_tiny_with(args: &[&str], spec: TinySpec) -> Result<TestServer, String> {
        let args = config::load(argv(args)).map_err(|e| e.to_string())?;
        let loaded = tiny_model(spec).expect("tiny model");
        let opts = BuildOptions {
            test_hooks: true,
            ..Default::default()
        };
        let built = build(args, loaded, opts).map_err(|e| e.to_string())?;
        Ok(Self::serve(built.router, built.state))
    }

    /// `serve <args>` with `engine` behind the seam (the tiny model's tokenizer and chat template).
    pub fn with_engine(args: &[&str], engine: Arc<dyn Inference>) -> TestServer {
        let args = config::load(argv(args)).expect("valid test flags");
        let loaded = tiny_model(TinySpec::default()).expect("tiny model");
        let model = ServedModel {
            tokenizer: Arc::new(loaded.tokenizer),
            chat: loaded.chat_template,
            defaults: loaded.defaults,
            eos_token_ids: loaded.eos_token_ids,
            vocab_size: loaded.model.config().vocab_size,
            served_names: vec![loaded.name],
            fitted: None,
        };
        let (router, state, _, _) = assemble(engine, model, &args, None, true);
        Self::serve(router, state)
    }

    fn serve(router: axum::Router, state: Arc<AppState>) -> TestServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        listener.set_nonblocking(true).expect("non-blocking");
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        TestServer {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The shared state behind the router.
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.state.engine().shutdown();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! The `serve` binary: configuration, logging, the default model, model load, then [`build`] (KV-cache
//! sizing, the engine, the shared state, the router — the same code the in-process HTTP tests run over
//! the tiny model), then listening and graceful shutdown (SIGTERM/SIGINT: stop accepting, let in-flight
//! requests finish within `--shutdown-timeout`, exit 0). Every start-up failure is a [`StartError`]
//! that names the flag and the value at fault.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use kvgate_engine::metrics as m;
use kvgate_model::{load_unprepared, Configured, LoadOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::{error, info, warn};

use crate::startup::backends::device_available;
pub use crate::startup::build::{build, BuildOptions, Built, CacheFacts};
use crate::startup::config::{self, Activations, Args, ConfigError, LogFormat};
use crate::startup::default_model;
pub use crate::startup::error::StartError;
pub use crate::startup::router::assemble;

fn init_logging(args: &Args) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log written to a file or a pipe gets no ANSI escapes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => {
            let _ = builder.json().flatten_event(true).try_init();
        }
        LogFormat::Text => {
            let _ = builder.try_init();
        }
    }
}

/// Entry point of `serve`.
pub fn main() -> ExitCode {
    let args = match config::load(std::env::args_os()) {
        Ok(a) => a,
        Err(ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("serve: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&args);
    if let Some(t) = args.threads {
        if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(t).build_global() {
            warn!(error = %e, "could not size the compute thread pool");
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("serve: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("serve: {e}");
            ExitCode::from(1)
        }
    }
}

fn install_metrics() -> Option<PrometheusHandle> {
    let buckets = [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    ];
    let mut b = PrometheusBuilder::new();
    for h in m::HISTOGRAMS {
        b = b.set_buckets_for_metric(Matcher::Full(h.to_string()), &buckets).ok()?;
    }
    match b.install_recorder() {
        Ok(h) => Some(h),
        Err(e) => {
            warn!(error = %e, "metrics exporter not installed");
            None
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

async fn run(args: Args) -> Result<(), StartError> {
    // refused before the model loads
    device_available(args.device).map_err(StartError::Backend)?;
    let is_default = args.model.is_none();
    let path: PathBuf = match &args.model {
        Some(p) if p.eq_ignore_ascii_case(crate::startup::encoder_model::NAME) && !Path::new(p).exists() => {
            tokio::task::spawn_blocking(|| crate::startup::encoder_model::ensure_minilm(false))
                .await
                .map_err(|e| StartError::DefaultModel(e.to_string()))?
                .map_err(|e| StartError::DefaultModel(e.to_string()))?
        }
        Some(p) => PathBuf::from(p),
        None => tokio::task::spawn_blocking(|| default_model::ensure_default_model(false))
            .await
            .map_err(|e| StartError::DefaultModel(e.to_string()))?
            .map_err(|e| StartError::DefaultModel(e.to_string()))?,
    };
    if !path.exists() {
        return Err(StartError::ModelMissing(path.display().to_string()));
    }
    let metrics = install_metrics();
    if let Some(h) = metrics.clone() {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                h.run_upkeep();
            }
        });
    }
    let (host, port, block_size, shutdown_timeout) =
        (args.host.clone(), args.port, args.block_size, args.shutdown_timeout);
    let conn_limits = crate::startup::listen::ConnLimits {
        header_read: Duration::from_secs(args.header_read_timeout.max(1)),
        max_connections: args.max_connections.max(1),
    };
    match crate::startup::listen::raise_open_files(conn_limits.max_connections) {
        Some(n) if (n as usize) < conn_limits.max_connections + 64 => warn!(
            open_files = n,
            max_connections = conn_limits.max_connections,
            "the open-file limit is below --max-connections; connections past it fail at accept (raise ulimit -n)"
        ),
        _ => {}
    }
    let kv_events = match args
        .kv_events_config
        .as_deref()
        .map(crate::startup::kv_events::KvEventsConfig::parse)
    {
        Some(Ok(c)) if c.publishes() => Some(
            crate::startup::kv_events::start(&c, args.block_size)
                .await
                .map_err(StartError::KvEvents)?,
        ),
        Some(Err(e)) => return Err(StartError::KvEvents(e)),
        _ => None,
    };
    let opts = BuildOptions {
        is_default,
        metrics,
        test_hooks: std::env::var("KVGATE_TEST_HOOKS").is_ok_and(|v| v == "1"),
        kv_events,
    };
    let int8 = args.activations == Activations::Int8;
    let (built, source, arch, layers) = if kvgate_cpu::encoder::is_encoder_dir(&path) {
        if args.chat_template.is_some() {
            warn!("--chat-template is ignored: an encoder model renders no chat");
        }
        let p2 = path.clone();
        let built = tokio::task::spawn_blocking(move || crate::startup::encoder_model::build_encoder(args, &p2, opts))
            .await
            .map_err(|e| StartError::Server(e.to_string()))??;
        (built, path.display().to_string(), "bert (encoder)".to_string(), 0)
    } else {
        let chat_template = args.chat_template.as_ref().map(chat_template_source).transpose()?;
        let lopts = LoadOptions {
            max_model_len: args.max_model_len,
            int8_activations: args.activations == Activations::Int8,
            f32_weights: false,
            chat_template,
        };
        let p2 = path.clone();
        let load_error = |msg: String| StartError::Load {
            path: path.display().to_string(),
            msg,
        };
        let t0 = std::time::Instant::now();
        let loaded = tokio::task::spawn_blocking(move || load_unprepared(&p2, &lopts))
            .await
            .map_err(|e| load_error(e.to_string()))?
            .map_err(|e| load_error(e.to_string()))?;
        info!(
            ms = t0.elapsed().as_millis() as u64,
            "model file read (tensors mapped in place, tokenizer and template built)"
        );
        let (source, arch, layers) = (
            loaded.source.clone(),
            loaded.model.config().arch,
            loaded.model.config().num_layers,
        );
        (build(args, loaded, opts)?, source, format!("{arch:?}"), layers)
    };
    let addr = format!("{host}:{port}");
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| StartError::Listen {
            addr: addr.clone(),
            msg: e.to_string(),
        })?;
    let local = listener.local_addr().map_err(|e| StartError::Listen {
        addr: addr.clone(),
        msg: e.to_string(),
    })?;
    let max_model_len = built.state.engine().limits().max_model_len;
    info!(
        model = %built.state.model_name(),
        source = %source,
        arch = %arch,
        layers,
        max_model_len,
        "model loaded"
    );
    match &built.cache {
        Some(c) => info!(
            "KV cache: {} blocks x {block_size} tokens = {} tokens, dtype {}, {} bytes/block, {:.1} MiB",
            c.num_blocks,
            c.num_blocks * block_size,
            c.shape.dtype(),
            c.shape.bytes_per_block(),
            c.kv_bytes as f64 / (1 << 20) as f64
        ),
        None => info!("an embedding model (sentence encoder): /v1/embeddings only, no KV cache"),
    }
    info!(
        "activations: {}",
        if int8 {
            "int8 for completions where the weights have the integer kernel (decisions stay f32)"
        } else {
            "f32"
        }
    );
    info!("{}", built.policy.describe());
    info!(
        "auth: {}",
        if built.keys.0.is_empty() {
            "no API key (every route is open)".to_string()
        } else {
            format!(
                "{} API key(s); open routes: /health /ping /version /metrics",
                built.keys.0.len()
            )
        }
    );
    info!("kvgate {} listening on http://{local}", env!("CARGO_PKG_VERSION"));
    let timeout = Duration::from_secs(shutdown_timeout);
    let engine = built.state.engine().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = crate::startup::listen::serve(listener, built.router, conn_limits, async move {
        shutdown_signal().await;
        info!(
            "shutdown requested: no new connections; finishing in-flight requests (up to {}s)",
            timeout.as_secs()
        );
        let _ = tx.send(());
    });
    let deadline = async move {
        if rx.await.is_ok() {
            tokio::time::sleep(timeout).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = server => {}
        _ = deadline => warn!("shutdown timeout reached with requests still in flight; exiting"),
    }
    // the engine writes its hot cache to the spill file (with --kv-offload-dir) before it stops
    engine.shutdown();
    let t0 = std::time::Instant::now();
    while engine.is_alive() && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    info!("kvgate stopped");
    Ok(())
}

/// `--chat-template`'s source, read and compiled once here so that a bad file or template is named by
/// the flag rather than reported as the model's.
fn chat_template_source(t: &crate::startup::config::ChatTemplateSetting) -> Result<String, StartError> {
    let src = t.source().map_err(StartError::ChatTemplate)?;
    kvgate_model::ChatTemplate::new(&src, "", "").map_err(|e| StartError::ChatTemplate(e.to_string()))?;
    Ok(src)
}

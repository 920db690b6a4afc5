//! The `serve` binary: configuration, logging, the default model, model load, KV-cache sizing, the
//! engine, metrics, the router, and graceful shutdown (SIGTERM/SIGINT: stop accepting, let in-flight
//! requests finish within `--shutdown-timeout`, exit 0).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kvgate_engine::{metrics as m, EngineConfig};
use kvgate_kv::{CacheShape, KvDtype};
use kvgate_model::{load, LoadOptions};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::{error, info, warn};

use crate::config::{self, parse_bytes, Args, ConfigError};
use crate::middleware::{CorsPolicy, Keys};
use crate::state::AppState;
use crate::systemone::labels::LabelTable;
use crate::{app, default_model};

fn init_logging(args: &Args) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_format == "json" {
        let _ = builder.json().flatten_event(true).try_init();
    } else {
        let _ = builder.try_init();
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

/// Default KV memory: a quarter of the available memory, at most 4 GiB, at least 64 MiB.
fn default_kv_memory() -> u64 {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30);
    (avail / 4).clamp(64 << 20, 4 << 30)
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

async fn run(args: Args) -> Result<(), String> {
    if args.device != "cpu" {
        return Err(format!(
            "--device {}: this build runs on the CPU only (CUDA kernels are in kvgate-cuda behind the `cuda` feature; the model itself does not run on CUDA yet)",
            args.device
        ));
    }
    let policy = Arc::new(CorsPolicy {
        origins: args.allowed_origins.clone(),
        methods: args.allowed_methods.clone(),
        headers: args.allowed_headers.clone(),
        credentials: args.allow_credentials,
    });
    let is_default = args.model.is_none();
    let path: PathBuf = match &args.model {
        Some(p) => PathBuf::from(p),
        None => tokio::task::spawn_blocking(|| default_model::ensure_default_model(false))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?,
    };
    if !path.exists() {
        return Err(format!("--model {}: no such file or directory", path.display()));
    }
    let opts = LoadOptions {
        max_model_len: args.max_model_len,
    };
    let p2 = path.clone();
    let loaded = tokio::task::spawn_blocking(move || load(&p2, &opts))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
    let mc = loaded.model.config().clone();
    if let Some(l) = args.max_model_len {
        if l > mc.max_position_embeddings {
            return Err(format!(
                "--max-model-len {l} exceeds the model's context length of {} tokens",
                mc.max_position_embeddings
            ));
        }
    }
    let dtype = KvDtype::parse(&args.kv_cache_dtype)
        .map_err(|e| e.to_string())?
        .unwrap_or(KvDtype::F32);
    dtype.check(mc.head_dim, args.block_size).map_err(|e| e.to_string())?;
    let shape = CacheShape {
        num_layers: mc.num_layers,
        num_kv_heads: mc.num_kv_heads,
        head_dim: mc.head_dim,
        block_size: args.block_size,
        dtype,
    };
    let (num_blocks, memory) = match (args.num_kv_blocks, &args.kv_cache_memory) {
        (Some(n), _) => (n, n as u64 * shape.bytes_per_block() as u64),
        (None, Some(mem)) => {
            let bytes = parse_bytes(mem)?;
            (shape.blocks_for_bytes(bytes).map_err(|e| e.to_string())?, bytes)
        }
        (None, None) => {
            let bytes = default_kv_memory();
            (shape.blocks_for_bytes(bytes).map_err(|e| e.to_string())?, bytes)
        }
    };
    let max_model_len = loaded.max_model_len.min(num_blocks * args.block_size);
    if max_model_len < loaded.max_model_len {
        warn!(
            requested = loaded.max_model_len,
            served = max_model_len,
            "the KV cache holds fewer tokens than the context length: max_model_len lowered to what fits"
        );
    }
    let served_names = if !args.served_model_name.is_empty() {
        args.served_model_name.clone()
    } else if is_default {
        vec![default_model::SERVED_NAME.to_string()]
    } else {
        vec![loaded.name.clone()]
    };
    let metrics = install_metrics();
    let labels = LabelTable::new(&loaded.tokenizer);
    let tokenizer = Arc::new(loaded.tokenizer);
    let chat = loaded.chat_template.map(Arc::new);
    let ecfg = EngineConfig {
        block_size: args.block_size,
        num_blocks,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_queue: args.max_queue,
        prefix_caching: args.enable_prefix_caching,
        kv_dtype: dtype,
        kv_scales: if dtype.is_scaled() {
            loaded.kv_scales.clone()
        } else {
            None
        },
        calculate_kv_scales: args.calculate_kv_scales && !(dtype.is_scaled() && loaded.kv_scales.is_some()),
        max_model_len,
        model_name: served_names[0].clone(),
    };
    let engine = kvgate_engine::start(loaded.model, tokenizer.clone(), loaded.eos_token_ids.clone(), ecfg)
        .map_err(|e| e.to_string())?;
    metrics::gauge!(m::CACHE_CONFIG,
        "model_name" => served_names[0].clone(),
        "block_size" => args.block_size.to_string(),
        "num_gpu_blocks" => num_blocks.to_string(),
        "cache_dtype" => dtype.name().to_string(),
        "enable_prefix_caching" => args.enable_prefix_caching.to_string(),
        "bytes_per_block" => shape.bytes_per_block().to_string(),
        "device" => "cpu".to_string())
    .set(1.0);
    if dtype.is_scaled() {
        let how = if loaded.kv_scales.is_some() {
            "k/v scales from the checkpoint"
        } else if args.calculate_kv_scales {
            "k/v scales calibrated from the first prefill"
        } else {
            "k/v scales 1.0 (the checkpoint has none; --calculate-kv-scales calibrates them)"
        };
        info!("KV cache dtype {dtype}: {how}");
    }
    let body_limit = parse_bytes(&args.max_request_body)?;
    let keys = Arc::new(Keys(args.api_key.clone()));
    let st = Arc::new(AppState {
        engine,
        tokenizer,
        chat,
        served_names: served_names.clone(),
        max_model_len,
        vocab_size: mc.vocab_size,
        defaults: loaded.defaults.clone(),
        metrics: metrics.clone(),
        args: Arc::new(args.clone()),
        body_limit,
        labels,
        created: crate::events::now_secs(),
    });
    if let Some(h) = metrics {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                h.run_upkeep();
            }
        });
    }
    let app = app::router(st, policy.clone(), keys.clone());
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    info!(
        model = %served_names[0],
        source = %loaded.source,
        arch = ?mc.arch,
        layers = mc.num_layers,
        max_model_len,
        "model loaded"
    );
    info!(
        "KV cache: {num_blocks} blocks x {} tokens = {} tokens, dtype {dtype}, {} bytes/block, {:.1} MiB",
        args.block_size,
        num_blocks * args.block_size,
        shape.bytes_per_block(),
        memory as f64 / (1 << 20) as f64
    );
    info!("{}", policy.describe());
    info!(
        "auth: {}",
        if keys.0.is_empty() {
            "no API key (every route is open)".to_string()
        } else {
            format!(
                "{} API key(s); open routes: /health /ping /version /metrics",
                keys.0.len()
            )
        }
    );
    info!("kvgate {} listening on http://{local}", env!("CARGO_PKG_VERSION"));
    let timeout = Duration::from_secs(args.shutdown_timeout);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
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
        r = server => r.map_err(|e| e.to_string())?,
        _ = deadline => warn!("shutdown timeout reached with requests still in flight; exiting"),
    }
    info!("kvgate stopped");
    Ok(())
}

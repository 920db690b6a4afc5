//! The `serve` binary: configuration, logging, the default model, model load, then [`build`] (KV-cache
//! sizing, the engine, the shared state, the router — the same code the in-process HTTP tests run over
//! the tiny model), then listening and graceful shutdown (SIGTERM/SIGINT: stop accepting, let in-flight
//! requests finish within `--shutdown-timeout`, exit 0). Every start-up failure is a [`StartError`]
//! that names the flag and the value at fault.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use kvgate_engine::{metrics as m, Admission, BackendError, EngineConfig, EngineError, KvMemory, TierConfig};
use kvgate_kv::{CacheShape, KvError};
use kvgate_model::{load_unprepared, Configured, LoadOptions, LoadedModel};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::{error, info, warn};

use crate::http::middleware::{CorsPolicy, Keys};
use crate::http::state::{AppState, ServedModel};
use crate::startup::backends::{device_available, open_backend, BackendSpec, ModelWeights};
use crate::startup::config::{
    self, Activations, AdmissionPolicy, Args, ByteSize, ConfigError, DecisionTemperatureSetting, KvCacheDtype,
    KvCacheMethod, LogFormat,
};
use crate::startup::speculative;
use crate::{http::app, startup::default_model};

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The backend for `--device` could not be opened (a device this build has no backend for).
    #[error("{0}")]
    Backend(BackendError),
    /// The default model could not be fetched.
    #[error("{0}")]
    DefaultModel(String),
    /// The KV event publisher could not start (a socket that does not bind).
    #[error("--kv-events-config: {0}")]
    KvEvents(String),
    /// `--speculative-config` cannot be used.
    #[error("--speculative-config: {0}")]
    Speculative(String),
    /// `--model` names nothing.
    #[error("--model {0}: no such file or directory")]
    ModelMissing(String),
    /// The model failed to load.
    #[error("--model {path}: cannot load: {msg}")]
    Load {
        /// The model path.
        path: String,
        /// Why.
        msg: String,
    },
    /// `--max-model-len` above the model's context.
    #[error("--max-model-len {value} exceeds the model's context length of {max} tokens")]
    MaxModelLen {
        /// Given.
        value: usize,
        /// The model's.
        max: usize,
    },
    /// The cache dtype cannot store this model.
    #[error("--kv-cache-dtype {dtype}: {err}")]
    KvDtype {
        /// Given.
        dtype: KvCacheDtype,
        /// Why.
        err: KvError,
    },
    /// The cache method cannot write this dtype or model.
    #[error("--kv-cache-method {method} with --kv-cache-dtype {dtype}: {err}")]
    KvMethod {
        /// Given.
        method: KvCacheMethod,
        /// Given.
        dtype: KvCacheDtype,
        /// Why.
        err: KvError,
    },
    /// The cache memory holds no block.
    #[error("--kv-cache-memory {bytes}: {err}")]
    KvMemory {
        /// Bytes offered.
        bytes: u64,
        /// Why.
        err: KvError,
    },
    /// The engine did not start.
    #[error("cannot start the engine: {0}")]
    Engine(#[from] EngineError),
    /// The address cannot be bound.
    #[error("--host/--port {addr}: cannot listen: {msg}")]
    Listen {
        /// host:port.
        addr: String,
        /// Why.
        msg: String,
    },
    /// The async runtime or the server itself failed.
    #[error("server: {0}")]
    Server(String),
}

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

/// What [`build`] made: the router to serve and the facts the start-up log reports.
pub struct Built {
    /// The application.
    pub router: Router,
    /// The shared state behind it.
    pub state: Arc<AppState>,
    /// The CORS policy.
    pub policy: Arc<CorsPolicy>,
    /// The API keys.
    pub keys: Arc<Keys>,
    /// The KV cache (`None`: an encoder, which has none).
    pub cache: Option<CacheFacts>,
}

/// The KV cache [`build`] sized, for the start-up log.
pub struct CacheFacts {
    /// Its shape.
    pub shape: CacheShape,
    /// Blocks in it.
    pub num_blocks: usize,
    /// Its bytes.
    pub kv_bytes: u64,
}

/// How [`build`] is run beyond the settings.
#[derive(Default)]
pub struct BuildOptions {
    /// The model is the default one (it is served under the default name).
    pub is_default: bool,
    /// The Prometheus exporter, when installed.
    pub metrics: Option<PrometheusHandle>,
    /// Route the test hooks (`/debug/panic`, `/debug/stop-engine`).
    pub test_hooks: bool,
    /// Where the engine publishes its KV events (`--kv-events-config`, started by [`run`]).
    pub kv_events: Option<kvgate_engine::KvEventSink>,
}

/// Sizes the KV cache, starts the engine on `loaded` (its weights as stored, laid out by the backend;
/// or a CPU model built in memory), and builds the shared state and the router from the settings
/// (everything `serve` does between loading a model and listening).
pub fn build<M>(args: Args, loaded: LoadedModel<M>, opts: BuildOptions) -> Result<Built, StartError>
where
    M: Configured + Into<ModelWeights>,
{
    let is_default = opts.is_default;
    let mc = loaded.model.config().clone();
    if let Some(l) = args.max_model_len {
        if l > mc.max_position_embeddings {
            return Err(StartError::MaxModelLen {
                value: l,
                max: mc.max_position_embeddings,
            });
        }
    }
    let dtype = args.kv_cache_dtype.resolve(args.device);
    let shape = mc
        .cache_shape(args.block_size, dtype)
        .map_err(|err| StartError::KvDtype {
            dtype: args.kv_cache_dtype,
            err,
        })?;
    let quant = args.kv_cache_method.resolve(dtype);
    let shape = shape.with_quant(quant).map_err(|err| StartError::KvMethod {
        method: args.kv_cache_method,
        dtype: args.kv_cache_dtype,
        err,
    })?;
    // The backend sizes its own cache (`--kv-cache-memory`, or its device's default share).
    let spec = BackendSpec {
        device: args.device,
        shape,
        memory: match (args.num_kv_blocks, args.kv_cache_memory) {
            (Some(n), _) => KvMemory::Blocks(n),
            (None, Some(b)) => KvMemory::Bytes(b.bytes()),
            (None, None) => KvMemory::Auto,
        },
        int8_activations: args.activations == Activations::Int8,
        gpu_memory_utilization: args.gpu_memory_utilization,
    };
    let vocab_size = mc.vocab_size;
    let fitted = kvgate_decide::temperature::fitted_for(kvgate_decide::temperature::ModelShape {
        hidden: mc.hidden_size,
        layers: mc.num_layers,
        vocab: mc.vocab_size,
    });
    if let Some(f) = fitted {
        let how = match args.decision_temperature {
            DecisionTemperatureSetting::Auto => "used (--decision-temperature auto)",
            DecisionTemperatureSetting::Fixed(_) => "overridden by --decision-temperature",
        };
        info!(
            "decision calibration fitted for {}: temperatures {} ({how}), {} option order(s) per choice{}",
            f.model,
            f.temperature,
            f.orders,
            if args.decision_orders.is_some() {
                " (overridden by --decision-orders)"
            } else {
                ""
            }
        );
    }
    let t0 = std::time::Instant::now();
    let backend = open_backend(loaded.model, &spec).map_err(|e| match e {
        BackendError::Cache(err @ KvError::TooSmall { bytes, .. }) => StartError::KvMemory { bytes, err },
        e => StartError::Backend(e),
    })?;
    info!(
        ms = t0.elapsed().as_millis() as u64,
        "weights laid out for the device and KV cache allocated"
    );
    let capacity = backend.capacity();
    let (num_blocks, kv_bytes) = (capacity.num_blocks, capacity.budget_bytes);
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
    // checked when the flags were read; a config file's value is checked here
    let speculation = (args.speculative_config.as_deref())
        .map(speculative::parse)
        .transpose()
        .map_err(StartError::Speculative)?;
    let draft = match speculation.as_ref().and_then(|s| s.draft_model.as_deref()) {
        Some(p) => {
            Some(speculative::open_draft(p, &spec, &loaded.tokenizer, num_blocks).map_err(StartError::Speculative)?)
        }
        None => None,
    };
    let tokenizer = Arc::new(loaded.tokenizer);
    let scaled = dtype.is_scaled();
    let ecfg = EngineConfig {
        kv_events: opts.kv_events.clone(),
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_queue: args.max_queue,
        prefix_caching: args.enable_prefix_caching,
        kv_scales: if scaled { loaded.kv_scales.clone() } else { None },
        calculate_kv_scales: args.calculate_kv_scales && !(scaled && loaded.kv_scales.is_some()),
        max_model_len,
        model_name: served_names[0].clone(),
        max_pinned_blocks: args.max_pinned_blocks,
        // with several keys each key's pins get a fair share of the pin cap unless told otherwise
        max_pinned_blocks_per_tenant: args.max_pinned_blocks_per_key.or_else(|| {
            (args.api_key.len() > 1).then(|| args.max_pinned_blocks.unwrap_or(num_blocks / 2) / args.api_key.len())
        }),
        max_retained_blocks: args.max_retained_blocks,
        speculation: speculation.map(|s| s.config),
        decode_share: args.decode_floor,
        session_window: args.session_window(),
        admission: match args.admission {
            AdmissionPolicy::CacheAware => Admission::cache_aware((args.admission_max_wait * 1000.0) as u64),
            AdmissionPolicy::Fifo => Admission::default(),
        },
        tier: TierConfig {
            memory_bytes: args.kv_offload_memory.map_or(0, ByteSize::bytes),
            dir: args.kv_offload_dir.clone(),
            disk_bytes: args.kv_offload_disk.bytes(),
        },
    };
    let eos_token_ids = loaded.eos_token_ids.clone();
    let engine = kvgate_engine::start_with_draft(backend, draft, tokenizer.clone(), loaded.eos_token_ids, ecfg)?;
    metrics::gauge!(m::CACHE_CONFIG,
        "model_name" => served_names[0].clone(),
        "block_size" => args.block_size.to_string(),
        "num_gpu_blocks" => num_blocks.to_string(),
        "cache_dtype" => dtype.name().to_string(),
        "cache_method" => quant.name().to_string(),
        "enable_prefix_caching" => args.enable_prefix_caching.to_string(),
        "bytes_per_block" => shape.bytes_per_block().to_string(),
        "device" => args.device.to_string())
    .set(1.0);
    if dtype.is_quantized() {
        let how = if !scaled {
            "an f16 scale per 32 elements of every stored vector"
        } else if loaded.kv_scales.is_some() {
            "k/v scales from the checkpoint"
        } else if args.calculate_kv_scales {
            "k/v scales calibrated from the first prefill"
        } else {
            "k/v scales 1.0 (the checkpoint has none; --calculate-kv-scales calibrates them)"
        };
        let offsets = if quant.smooth {
            "; K/V channel offsets from the first prefill"
        } else {
            ""
        };
        info!("KV cache dtype {dtype}, method {}: {how}{offsets}", quant.name());
    }
    let model = ServedModel {
        tokenizer,
        chat: loaded.chat_template,
        defaults: loaded.defaults,
        eos_token_ids,
        vocab_size,
        served_names,
        fitted,
    };
    let state = AppState::new(Arc::new(engine), model, args, opts.metrics);
    let (router, state, policy, keys) = assemble(state, opts.test_hooks);
    Ok(Built {
        router,
        state,
        policy,
        keys,
        cache: Some(CacheFacts {
            shape,
            num_blocks,
            kv_bytes,
        }),
    })
}

/// The router over a state, with the CORS policy and keys its settings name.
pub fn assemble(state: AppState, test_hooks: bool) -> (Router, Arc<AppState>, Arc<CorsPolicy>, Arc<Keys>) {
    let (policy, keys) = (state.settings().cors.clone(), state.settings().keys.clone());
    let state = Arc::new(state);
    let router = app::router(state.clone(), policy.clone(), keys.clone(), test_hooks);
    (router, state, policy, keys)
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
        let p2 = path.clone();
        let built = tokio::task::spawn_blocking(move || crate::startup::encoder_model::build_encoder(args, &p2, opts))
            .await
            .map_err(|e| StartError::Server(e.to_string()))??;
        (built, path.display().to_string(), "bert (encoder)".to_string(), 0)
    } else {
        let lopts = LoadOptions {
            max_model_len: args.max_model_len,
            int8_activations: args.activations == Activations::Int8,
            f32_weights: false,
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

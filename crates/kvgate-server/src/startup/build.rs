//! [`build`]: from the flags and a loaded model to a servable application — the KV cache sized for the
//! device and `--kv-cache-memory`, the backend opened, the engine (and a draft model's) started, the
//! shared state and the router assembled. `serve` and the in-process test servers run exactly this.

use std::sync::Arc;

use axum::Router;
use kvgate_engine::{metrics as m, Admission, BackendError, EngineConfig, KvMemory, SharedConfig, TierConfig};
use kvgate_kv::{CacheShape, KvError};
use kvgate_model::{Configured, LoadedModel};
use metrics_exporter_prometheus::PrometheusHandle;
use tracing::{info, warn};

use crate::http::middleware::{CorsPolicy, Keys};
use crate::http::state::{AppState, ServedModel};
use crate::startup::backends::{open_backend, BackendSpec, ModelWeights};
use crate::startup::config::{Activations, AdmissionPolicy, Args, ByteSize, DecisionTemperatureSetting};
use crate::startup::default_model;
use crate::startup::error::StartError;
use crate::startup::router::assemble;
use crate::startup::speculative;

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
            "decision calibration fitted for {}: read {}{}, temperatures {} ({how}), {} option order(s) per choice, yes/no {}calibrated{}",
            f.model,
            f.read.name(),
            if args.decision_read.is_some() {
                " (overridden by --decision-read)"
            } else {
                ""
            },
            f.temperature,
            f.orders,
            if f.yes_no_calibration { "" } else { "un" },
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
    let draft = match speculation
        .as_ref()
        .and_then(|s| Some((s.draft_model.as_deref()?, s.draft_vocab)))
    {
        Some((p, vocab)) => Some(
            speculative::open_draft(p, &spec, &loaded.tokenizer, num_blocks, vocab).map_err(StartError::Speculative)?,
        ),
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
            shared: args.kv_shared.clone().map(|url| SharedConfig {
                url,
                ttl: std::time::Duration::from_secs(args.kv_shared_ttl),
                timeout: std::time::Duration::from_millis(args.kv_shared_timeout),
            }),
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
    let (router, state, policy, keys) = assemble(Arc::new(engine), model, &args, opts.metrics, opts.test_hooks);
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

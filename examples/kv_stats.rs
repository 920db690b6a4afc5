//! How the KV-cache dtypes and methods perturb the default model's next-token distribution on a prompt,
//! with scales 1.0 and with scales calibrated from the prompt itself: a fast probe before the full
//! `kv_report`. `cargo run --release --example kv_stats`.

use kvgate_cpu::{load, Batch};
use kvgate_kv::{CpuAttention, KvCache, KvDtype, KvQuant};
use kvgate_model::LoadOptions;

fn logprobs(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z: f64 = x.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|v| *v as f64 - z).collect()
}

fn main() {
    let path = kvgate_server::default_model::ensure_default_model(false).unwrap();
    let m = load(
        &path,
        &LoadOptions {
            max_model_len: Some(4096),
            int8_activations: false,
            f32_weights: false,
            chat_template: None,
        },
    )
    .unwrap();
    let c = m.model.config().clone();
    let text = "<|im_start|>user\nHelp! My payouts have been failing for 3 days and customers are complaining. Does this convey urgency?<|im_end|>\n<|im_start|>assistant\n";
    let ids = m.tokenizer.encode(text, false).unwrap();
    let run = |dtype: KvDtype, quant: KvQuant, scales: Option<(Vec<f32>, Vec<f32>, f32)>| {
        let shape = c.cache_shape(16, dtype).unwrap().with_quant(quant).unwrap();
        let mut cache = KvCache::new(shape, ids.len().div_ceil(16));
        if let Some((k, v, range)) = scales {
            for l in 0..c.num_layers {
                cache
                    .set_scales(
                        l,
                        kvgate_engine::kv_scale(k[l], range),
                        kvgate_engine::kv_scale(v[l], range),
                    )
                    .unwrap();
            }
        }
        let mut b = Batch::single_sequence(&ids, 16);
        b.outputs = vec![kvgate_cpu::Output {
            row: ids.len() - 1,
            want: kvgate_cpu::Want::Logits,
        }];
        let (lg, a) = m.model.forward_with_amax(&b, &mut cache, &CpuAttention).unwrap();
        (logprobs(&lg), a)
    };
    let (base, amax) = run(KvDtype::F32, KvQuant::PLAIN, None);
    let yes = m.tokenizer.token_to_id("Yes").unwrap() as usize;
    for (dtype, range) in [
        (KvDtype::BF16, 0.0),
        (KvDtype::Fp8E4m3, 448.0),
        (KvDtype::Fp8E5m2, 57344.0),
        (KvDtype::Nvfp4, 2688.0),
    ] {
        for calibrated in [false, true] {
            if calibrated && range == 0.0 {
                continue;
            }
            // the `smooth` methods need offsets from the engine's calibration: `kv_report` measures them
            let methods = KvQuant::methods_for(if range == 0.0 { KvDtype::F32 } else { dtype });
            for &quant in methods.iter().filter(|q| !q.smooth) {
                let (lp, _) = run(
                    dtype,
                    quant,
                    calibrated.then(|| (amax.k.clone(), amax.v.clone(), range)),
                );
                let kl: f64 = base.iter().zip(&lp).map(|(p, q)| p.exp() * (p - q)).sum();
                println!(
                    "{dtype:>9} {:>8} {:>10}: KL {kl:.6}, logP(Yes) {:.4} vs {:.4}",
                    quant.name(),
                    if calibrated { "calibrated" } else { "scale 1" },
                    lp[yes],
                    base[yes]
                );
            }
        }
    }
}

//! The host cache's tests: round trips per dtype, copy-on-write copies, frozen scales and offsets.

use super::*;

fn shape(dtype: KvDtype) -> CacheShape {
    CacheShape::new(2, 2, 32, 4, dtype).unwrap()
}

#[test]
fn write_then_read_back_each_dtype() {
    for dtype in KvDtype::ALL {
        let mut c = KvCache::new(shape(dtype), 3);
        let k: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 8.0).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        c.write(1, &[9], &k, &v);
        let mut scratch = vec![0f32; 32];
        for h in 0..2 {
            let got = c.layer(1).vector(Which::K, 2, h, 1, &mut scratch).to_vec();
            let tol = match dtype {
                KvDtype::F32 => 0.0,
                KvDtype::F16 | KvDtype::BF16 => 0.02,
                // int8: half a step of the vector's amax (here ≤ 4.25) over 127
                KvDtype::Int8 => 0.017,
                KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => 0.25,
                KvDtype::Nvfp4 => 0.5,
            };
            for (g, w) in got.iter().zip(&k[h * 32..h * 32 + 32]) {
                assert!((g - w).abs() <= tol * w.abs().max(1.0), "{dtype} {g} vs {w}");
            }
            // untouched slots stay zero
            assert!(c
                .layer(1)
                .vector(Which::V, 2, h, 0, &mut scratch)
                .iter()
                .all(|&x| x == 0.0));
            assert!(c
                .layer(0)
                .vector(Which::K, 2, h, 1, &mut scratch)
                .iter()
                .all(|&x| x == 0.0));
        }
    }
}

/// With calibrated scales (amax mapped near the format's top) the round trip stays within the
/// format's relative precision.
#[test]
fn scaled_round_trip() {
    for (dtype, range, tol) in [
        (KvDtype::Fp8E4m3, 448.0, 0.07),
        (KvDtype::Fp8E5m2, 57344.0, 0.13),
        (KvDtype::Nvfp4, 2688.0, 0.26),
    ] {
        let mut c = KvCache::new(shape(dtype), 3);
        let amax = 17.0f32;
        let s = 2.0 * amax / range;
        c.set_scales(0, s, s).unwrap();
        let k: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 32.0) / 32.0 * amax).collect();
        c.write(0, &[5], &k, &k);
        let mut scratch = vec![0f32; 32];
        for h in 0..2 {
            let got = c.layer(0).vector(Which::K, 1, h, 1, &mut scratch).to_vec();
            let want = &k[h * 32..h * 32 + 32];
            // nvfp4's error is relative to its group's amax, fp8's to each value.
            let gmax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (g, w) in got.iter().zip(want) {
                let bound = if dtype == KvDtype::Nvfp4 {
                    tol * gmax
                } else {
                    tol * w.abs() + 1e-3
                };
                assert!((g - w).abs() <= bound, "{dtype}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn copy_block_copies_every_layer() {
    for dtype in KvDtype::ALL {
        let mut c = KvCache::new(shape(dtype), 3);
        let k: Vec<f32> = (0..64).map(|i| i as f32 / 16.0).collect();
        c.write(0, &[1], &k, &k);
        c.write(1, &[2], &k, &k);
        c.copy_block(0, 2);
        let mut a = vec![0f32; 32];
        let mut b = vec![0f32; 32];
        for l in 0..2 {
            for t in 0..4 {
                let x = c.layer(l).vector(Which::K, 0, 1, t, &mut a).to_vec();
                let y = c.layer(l).vector(Which::K, 2, 1, t, &mut b).to_vec();
                assert_eq!(x, y);
            }
        }
    }
}

/// Every quantized dtype with every method: what is read back is the rotated input (when the method
/// rotates) within the format's precision, and un-rotating it gives the input back.
#[test]
fn every_method_reads_back_what_it_wrote() {
    use crate::quant::{self, KvQuant, Rotation};
    for dtype in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2, KvDtype::Nvfp4] {
        for q in KvQuant::ALL {
            let shape = shape(dtype).with_quant(q).unwrap();
            let mut c = KvCache::new(shape, 3);
            // a range of ±89.6 for fp8 (±537 for nvfp4): the outliers below fit
            c.set_scales(0, 0.2, 0.2).unwrap();
            // one outlier channel per head, as real keys have
            let mut k: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 32.0) / 16.0).collect();
            k[3] = 40.0;
            k[32 + 17] = -25.0;
            c.write(0, &[6], &k, &k);
            let signs = quant::sign_mask(32);
            let mut scratch = vec![0f32; 32];
            for h in 0..2 {
                let mut got = c.layer(0).vector(Which::V, 1, h, 2, &mut scratch).to_vec();
                if q.rotation == Rotation::Hadamard {
                    quant::unrotate(&mut got, &signs);
                }
                let want = &k[h * 32..h * 32 + 32];
                let norm = want.iter().map(|x| x * x).sum::<f32>().sqrt();
                let err = got.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
                let tol = match dtype {
                    KvDtype::Fp8E4m3 => 0.05,
                    KvDtype::Fp8E5m2 => 0.1,
                    _ => 0.3,
                };
                assert!(err <= tol * norm, "{dtype} {}: relative error {}", q.name(), err / norm);
            }
        }
    }
}

#[test]
fn fp8_fine_keeps_an_exponent_byte_per_vector_after_the_data() {
    use crate::quant::{KvQuant, Scales};
    let q = KvQuant {
        scales: Scales::Fine,
        ..KvQuant::PLAIN
    };
    let shape = shape(KvDtype::Fp8E4m3).with_quant(q).unwrap();
    assert_eq!(shape.bytes_per_vector(), 33);
    assert_eq!(shape.layer_block_bytes(), 2 * 4 * 33);
    let mut c = KvCache::new(shape, 2);
    // amax 3.0 → 3 ≤ 448·2^-7 = 3.5: exponent -7, byte 120
    let k: Vec<f32> = (0..64)
        .map(|i| if i % 32 == 0 { 3.0 } else { 0.01 * i as f32 })
        .collect();
    c.write(0, &[5], &k, &k);
    let Buf::Bytes(b) = c.layer(0).raw(Which::K) else {
        panic!()
    };
    let (_, sc) = shape.byte_offsets(1, 0, 1);
    assert_eq!(sc, shape.layer_block_bytes() + 2 * 4 * 32 + 1);
    assert_eq!(b[sc], 120);
    let mut scratch = vec![0f32; 32];
    assert_eq!(c.layer(0).vector(Which::K, 1, 0, 1, &mut scratch)[0], 3.0);
}

#[test]
fn scales_are_frozen_by_the_first_write() {
    let mut c = KvCache::new(shape(KvDtype::Fp8E4m3), 2);
    c.set_scales(1, 0.5, 0.5).unwrap();
    assert_eq!(c.set_scales(5, 0.5, 0.5), Err(KvError::NoLayer(5)));
    c.write(0, &[0], &[1.0; 64], &[1.0; 64]);
    assert_eq!(c.set_scales(1, 0.25, 0.25), Err(KvError::Frozen { layer: 1 }));
    // offsets: only for a smoothing method, of the right length, before the first write
    assert!(c.set_offsets(0, vec![], vec![]).is_err());
    let smooth = shape(KvDtype::Fp8E4m3)
        .with_quant(crate::quant::KvQuant::ALL[4])
        .unwrap();
    let mut d = KvCache::new(smooth, 2);
    assert!(d.set_offsets(0, vec![0.5; 3], vec![]).is_err());
    d.set_offsets(0, vec![0.5; 64], vec![0.25; 64]).unwrap();
    assert_eq!(d.layer(0).offsets(Which::V).map(|o| o.len()), Some(64));
    d.write(0, &[0], &[1.0; 64], &[1.0; 64]);
    assert_eq!(d.set_offsets(0, vec![], vec![]), Err(KvError::Frozen { layer: 0 }));
    assert_eq!(c.layer(1).k_scale, 0.5);
}

#[test]
fn methods_need_a_quantized_dtype_and_a_rotatable_head() {
    use crate::quant::KvQuant;
    for q in &KvQuant::ALL[1..] {
        assert!(shape(KvDtype::F32).with_quant(*q).is_err());
        assert!(shape(KvDtype::BF16).with_quant(*q).is_err());
        assert!(shape(KvDtype::Fp8E4m3).with_quant(*q).is_ok());
    }
    let odd = CacheShape::new(1, 1, 40, 16, KvDtype::Fp8E4m3).unwrap();
    assert!(odd.with_quant(KvQuant::ALL[1]).is_err(), "head_dim 40: a block of 8");
    assert!(odd.with_quant(KvQuant::ALL[2]).is_ok(), "fine scales need no rotation");
    let b6 = CacheShape::new(1, 1, 64, 6, KvDtype::Fp8E4m3).unwrap();
    assert!(
        b6.with_quant(KvQuant::ALL[2]).is_err(),
        "fp8 fine needs block_size % 4 == 0"
    );
}

/// A block's bytes read out and written into another block (of another cache) read back bitwise the
/// same vectors, for every dtype; a wrong length or block is refused with nothing written.
#[test]
fn block_bytes_round_trip_each_dtype() {
    for dtype in KvDtype::ALL {
        let mut a = KvCache::new(shape(dtype), 3);
        let k: Vec<f32> = (0..64 * 4).map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0).collect();
        let v: Vec<f32> = k.iter().map(|x| x * 0.5 - 1.0).collect();
        for l in 0..2 {
            a.write(l, &[4, 5, 6, 7], &k, &v);
        }
        let mut bytes = vec![];
        a.read_block(1, &mut bytes).unwrap();
        assert_eq!(bytes.len(), a.shape().bytes_per_block());
        let mut b = KvCache::new(shape(dtype), 3);
        b.write_block(2, &bytes).unwrap();
        let (mut s1, mut s2) = (vec![0f32; 32], vec![0f32; 32]);
        for l in 0..2 {
            for which in [Which::K, Which::V] {
                for h in 0..2 {
                    for t in 0..4 {
                        let x = a.layer(l).vector(which, 1, h, t, &mut s1).to_vec();
                        let y = b.layer(l).vector(which, 2, h, t, &mut s2).to_vec();
                        assert_eq!(x, y, "{dtype} layer {l} head {h} token {t}");
                    }
                }
            }
        }
        let mut again = vec![];
        b.read_block(2, &mut again).unwrap();
        assert_eq!(again, bytes);
        assert!(matches!(b.write_block(2, &bytes[1..]), Err(KvError::BlockBytes { .. })));
        assert!(matches!(b.write_block(3, &bytes), Err(KvError::BlockBytes { .. })));
        assert!(b.read_block(3, &mut again).is_err());
    }
}

/// int8 at a head_dim that is not a multiple of its group (40 = 32 + 8): each group has its own scale,
/// so a small group next to a large one keeps its precision.
#[test]
fn int8_groups_keep_their_own_scales() {
    let shape = CacheShape::new(1, 1, 40, 4, KvDtype::Int8).unwrap();
    assert_eq!(shape.bytes_per_vector(), 40 + 4);
    let mut c = KvCache::new(shape, 2);
    // a large first group, a tiny second one
    let k: Vec<f32> = (0..40)
        .map(|i| {
            if i < 32 {
                (i as f32 - 16.0) * 10.0
            } else {
                (i as f32 - 36.0) * 1e-3
            }
        })
        .collect();
    c.write(0, &[5], &k, &k);
    let mut scratch = vec![0f32; 40];
    let got = c.layer(0).vector(Which::K, 1, 0, 1, &mut scratch).to_vec();
    for (i, (g, w)) in got.iter().zip(&k).enumerate() {
        let step = if i < 32 { 160.0 / 127.0 } else { 4e-3 / 127.0 };
        assert!((g - w).abs() <= 0.51 * step + 1e-9, "{i}: {g} vs {w}");
    }
}

//! Tests of `lanes.rs`: the lane kernels give the row kernels' bits.
use super::*;

/// Both register widths give every score [`super::super::dot2x4`]'s bits and every weighted sum the
/// row path's (one FMA chain per element), for odd key counts and partial query registers.
#[test]
fn lane_kernels_give_the_row_kernels_bits() {
    let mut seed = 11u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
    };
    for (hd, nq, cnt) in [
        (64usize, 48usize, 16usize),
        (64, 112, 7),
        (32, 9, 5),
        (128, 20, 3),
        (40, 33, 11),
    ] {
        let qs: Vec<Vec<f32>> = (0..nq).map(|_| (0..hd).map(|_| next()).collect()).collect();
        let keys: Vec<f32> = (0..cnt * hd).map(|_| next()).collect();
        let widths: &[usize] = if std::arch::is_x86_feature_detected!("avx512f") {
            &[8, 16]
        } else {
            &[8]
        };
        for &lanes in widths {
            let nqp = nq.next_multiple_of(lanes);
            let mut qt = vec![0f32; hd * nqp];
            for (q, v) in qs.iter().enumerate() {
                v.iter().enumerate().for_each(|(d, &x)| qt[d * nqp + q] = x);
            }
            let mut out = vec![0f32; cnt * nqp];
            // SAFETY: each width only where this machine has it; lengths as the kernels require.
            unsafe {
                if lanes == 16 {
                    avx512::scores(&qt, nqp, hd, &keys, &mut out);
                } else {
                    avx2::scores(&qt, nqp, hd, &keys, &mut out);
                }
            }
            for q in 0..nq {
                for j in 0..cnt {
                    let k = &keys[j * hd..(j + 1) * hd];
                    let want = super::super::dot2x4(&qs[q], &qs[q], &[k, k, k, k])[0];
                    assert_eq!(
                        out[j * nqp + q].to_bits(),
                        want.to_bits(),
                        "hd {hd} lanes {lanes} q {q} k {j}"
                    );
                }
            }
            // weighted sums against one FMA chain per element
            let w: Vec<f32> = (0..cnt * nqp).map(|_| next()).collect();
            let start: Vec<f32> = (0..hd * nqp).map(|_| next()).collect();
            let mut acc = start.clone();
            // SAFETY: as above.
            unsafe {
                if lanes == 16 {
                    avx512::weighted_sums(&w, nqp, &keys, &mut acc);
                } else {
                    avx2::weighted_sums(&w, nqp, &keys, &mut acc);
                }
            }
            for q in 0..nq {
                for d in 0..hd {
                    let mut x = start[d * nqp + q];
                    for j in 0..cnt {
                        x = w[j * nqp + q].mul_add(keys[j * hd + d], x);
                    }
                    assert_eq!(
                        acc[d * nqp + q].to_bits(),
                        x.to_bits(),
                        "hd {hd} lanes {lanes} q {q} d {d}"
                    );
                }
            }
        }
    }
}

/// The 16-lane exps and sums give the 8-lane path's bits (below-range and −∞ inputs included).
#[test]
fn wide_exps_give_the_eight_lane_bits() {
    if !*AVX512 {
        return;
    }
    let (nqp, rows) = (32usize, 21usize);
    let mut w: Vec<f32> = (0..rows * nqp)
        .map(|i| ((i as f32) * 0.731).sin() * 60.0 - 20.0)
        .collect();
    w[5] = f32::NEG_INFINITY;
    w[40] = -200.0;
    let m: Vec<f32> = (0..nqp).map(|q| (q as f32 * 0.37).cos() * 10.0).collect();
    let (mut a, mut b) = (w.clone(), w.clone());
    let (mut sa, mut sb) = (vec![0f32; 8 * nqp], vec![0f32; 8 * nqp]);
    // SAFETY: AVX-512F detected; whole rows of nqp.
    unsafe { exp512::exps(&mut a, nqp, &m, &mut sa, 3) };
    for (j, row) in b.chunks_exact_mut(nqp).enumerate() {
        exp_sub(row, &m);
        let s = &mut sb[(3 + j) % 8 * nqp..][..nqp];
        s.iter_mut().zip(row.iter()).for_each(|(s, &e)| *s += e);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
    assert_eq!(bits(&sa), bits(&sb));
}

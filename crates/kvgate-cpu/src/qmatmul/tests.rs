//! Tests of the packed matmul: against the dequantized matmul in f64, batch invariance at every row
//! count and chunking, the SIMD path bit for bit against the scalar one, stacking, and block decoding.

use super::*;

fn blocks(kind: &str, n: usize, k: usize, seed: u32) -> Vec<u8> {
    let mut s = seed;
    let mut rnd = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (s >> 8) as u8
    };
    let mut out = vec![];
    for _ in 0..n * k / 32 {
        let d = half::f16::from_f32(0.01 + (rnd() as f32) / 4000.0).to_le_bytes();
        out.extend(d);
        match kind {
            "q4_1" => {
                out.extend(half::f16::from_f32(-0.05 + rnd() as f32 / 3000.0).to_le_bytes());
                (0..16).for_each(|_| out.push(rnd()));
            }
            "q4_0" => (0..16).for_each(|_| out.push(rnd())),
            _ => (0..32).for_each(|_| out.push(rnd())),
        }
    }
    out
}

/// `q4_0`, `q4_1`, `q8_0` (f16 scales; offsets only for the first two), `q5_0` (5-bit, offsets `−16d`), or `f32` (4-bit quants with
/// scales and offsets no f16 holds, as repacked K-quants have).
fn matrix(kind: &str, n: usize, k: usize, seed: u32) -> QMatrix {
    let data = blocks(kind, n, k, seed);
    match kind {
        "q4_0" => QMatrix::from_q4_0(&data, n, k),
        "q4_1" => QMatrix::from_q4_1(&data, n, k),
        "f32" => {
            let blocks = n * k / QK;
            let d = (0..blocks).map(|i| 0.01 + i as f32 * 1.1e-5).collect();
            let m = (0..blocks).map(|i| -0.03 - i as f32 * 0.7e-5).collect();
            let qs = data.chunks_exact(34).flat_map(|b| b[2..18].to_vec()).collect();
            QMatrix::from_parts(QKind::Q4, n, k, d, m, qs, None)
        }
        "q5" => {
            // 5-bit quants 0..31 with scales and offsets (Q5_1 / Q5_K kept at 5 bits)
            let blocks = n * k / QK;
            let d = (0..blocks).map(|i| 0.01 + i as f32 * 1.1e-5).collect();
            let m = (0..blocks).map(|i| -0.03 - i as f32 * 0.7e-5).collect();
            let qs = data.iter().cycle().take(n * k).map(|&b| b % 32).collect();
            QMatrix::from_parts(QKind::Q5, n, k, d, m, qs, None)
        }
        "q5_0" => {
            // Q5_0 kept at 5 bits: offsets exactly −16 times f16 scales (left out of the records)
            let d: Vec<f32> = (0..n * k / QK)
                .map(|i| half::f16::from_f32(0.01 + i as f32 * 1.1e-5).to_f32())
                .collect();
            let m = d.iter().map(|d| -16.0 * d).collect();
            let qs = data.iter().cycle().take(n * k).map(|&b| b % 32).collect();
            QMatrix::from_parts(QKind::Q5, n, k, d, m, qs, None)
        }
        "q6" | "q6s" => {
            // 6-bit quants in blocks of 16 in the 8-bit layout (`q6`) or the 6-bit one (`q6s`)
            let d = (0..n * k / 16).map(|i| 0.002 + i as f32 * 1.3e-6).collect();
            let q = data.iter().cycle().take(n * k).map(|&b| (b % 64) as i8 - 32).collect();
            let kind = if kind == "q6s" { QKind::Q6 } else { QKind::Q8 };
            QMatrix::from_blocks16(kind, n, k, d, q, None)
        }
        "f16" | "bf16" => {
            let vals = (0..n * k).map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 1500.0);
            let (kind, bits): (QKind, Vec<u16>) = if kind == "f16" {
                (QKind::F16, vals.map(|v| half::f16::from_f32(v).to_bits()).collect())
            } else {
                (QKind::Bf16, vals.map(|v| half::bf16::from_f32(v).to_bits()).collect())
            };
            QMatrix::from_halves(kind, &bits, n, k).unwrap()
        }
        "q4k" | "q5k" | "q6k" | "q6ks" => factored(kind, n, k, seed, true),
        _ => QMatrix::from_q8_0(&data, n, k),
    }
}

/// A K-quant-like matrix (`q4k`: 4-bit, `q5k`: 5-bit, both with offsets; `q6k`: 6-bit quants in the
/// 8-bit layout in blocks of 16, no offsets; `q6ks`: the same in the 6-bit layout) whose scales and offsets are f16 super-block factors times 6- or 8-bit integers,
/// built with those factors (`with`) or from the products alone.
fn factored(kind: &str, n: usize, k: usize, seed: u32, with: bool) -> QMatrix {
    let mut s = seed;
    let mut rnd = || {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        s >> 8
    };
    let six = kind.starts_with("q6k");
    let bl = if six { 16 } else { QK };
    let nb = k / bl;
    // several super-blocks per column where the block count allows it
    let g = [8, 4, 2, 1]
        .into_iter()
        .find(|g| nb.is_multiple_of(*g) && *g < nb)
        .unwrap_or(1);
    let mut f = Factors::default();
    for _ in 0..n * nb / g {
        f.sd.push(half::f16::from_f32(0.001 + (rnd() % 1000) as f32 * 1e-5).to_f32());
        f.sm.push(if six {
            0.0
        } else {
            -half::f16::from_f32((rnd() % 1000) as f32 * 2e-5).to_f32()
        });
    }
    for _ in 0..n * nb {
        f.sc.push(if six {
            (rnd() % 256) as u8 as i8
        } else {
            (rnd() % 64) as i8
        });
        f.mn.push(if six { 0 } else { (rnd() % 64) as i8 });
    }
    let d: Vec<f32> = (0..n * nb).map(|i| f.sd[i / g] * f.sc[i] as f32).collect();
    let m: Vec<f32> = (0..n * nb).map(|i| f.sm[i / g] * f.mn[i] as f32).collect();
    let f = Some(&f).filter(|_| with);
    match kind {
        "q6k" | "q6ks" => {
            let q = (0..n * k).map(|_| (rnd() % 64) as i8 - 32).collect();
            let kind = if kind == "q6ks" { QKind::Q6 } else { QKind::Q8 };
            QMatrix::from_blocks16(kind, n, k, d, q, f)
        }
        "q4k" => {
            let qs = (0..n * k / 2).map(|_| rnd() as u8).collect();
            QMatrix::from_parts(QKind::Q4, n, k, d, m, qs, f)
        }
        _ => {
            let qs = (0..n * k).map(|_| (rnd() % 32) as u8).collect();
            QMatrix::from_parts(QKind::Q5, n, k, d, m, qs, f)
        }
    }
}

#[test]
fn k_quant_factors_change_no_bit_and_save_bytes() {
    let (n, k) = (45, 512);
    for kind in ["q4k", "q5k", "q6k", "q6ks"] {
        let (w, plain) = (factored(kind, n, k, 5, true), factored(kind, n, k, 5, false));
        assert!(w.sub.is_some() && plain.sub.is_none(), "{kind}: record format");
        assert!(
            w.bytes() * 10 < plain.bytes() * 9,
            "{kind}: {} vs {} bytes",
            w.bytes(),
            plain.bytes()
        );
        for c in 0..n {
            for i in 0..k {
                assert_eq!(w.value(c, i).to_bits(), plain.value(c, i).to_bits(), "{kind} {c} {i}");
            }
        }
        for rows in [1, 3, 9, 70] {
            let x = acts(rows, k);
            assert_eq!(w.matmul(&x, rows), plain.matmul(&x, rows), "{kind}: f32 rows {rows}");
            let int8 = vec![true; rows];
            assert_eq!(
                w.matmul_rows(&x, rows, &int8),
                plain.matmul_rows(&x, rows, &int8),
                "{kind}: 8-bit rows {rows}"
            );
        }
        // stacking keeps the factors and each part's outputs
        let other = factored(kind, 13, k, 9, true);
        let both = QMatrix::concat(&[&w, &other]).unwrap();
        assert!(both.sub.is_some(), "{kind}: stacked format");
        let x = acts(2, k);
        let (ya, yb, yab) = (w.matmul(&x, 2), other.matmul(&x, 2), both.matmul(&x, 2));
        for r in 0..2 {
            assert_eq!(&yab[r * (n + 13)..r * (n + 13) + n], &ya[r * n..(r + 1) * n]);
            assert_eq!(&yab[r * (n + 13) + n..(r + 1) * (n + 13)], &yb[r * 13..(r + 1) * 13]);
        }
        // a part without factors stacks into plain heads, with the same values
        let mixed = QMatrix::concat(&[&w, &factored(kind, 13, k, 9, false)]).unwrap();
        assert!(mixed.sub.is_none(), "{kind}: mixed stack");
        assert_eq!(mixed.matmul(&x, 2), yab, "{kind}: mixed stack values");
    }
}

fn acts(rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect()
}

#[test]
fn matches_the_dequantized_matmul_and_is_batch_invariant() {
    // n = 37: a partial panel and padding panels; rows = 70 > ROW_CHUNK: two row chunks.
    let (n, k) = (37, 96);
    for kind in [
        "q4_0", "q4_1", "q8_0", "f32", "q5", "q5_0", "q6", "f16", "bf16", "q4k", "q5k", "q6k",
    ] {
        let w = matrix(kind, n, k, 7);
        let rows = 70;
        let x = acts(rows, k);
        let y = w.matmul(&x, rows);
        for r in 0..rows {
            for c in 0..n {
                let want: f64 = (0..k).map(|i| w.value(c, i) as f64 * x[r * k + i] as f64).sum();
                assert!(
                    (y[r * n + c] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{kind} {r} {c}"
                );
            }
        }
        for r in 0..rows {
            let alone = w.matmul(&x[r * k..(r + 1) * k], 1);
            assert_eq!(
                &y[r * n..(r + 1) * n],
                alone.as_slice(),
                "{kind}: row {r} depends on the batch"
            );
        }
        for split in [3, 5, 64] {
            let head = w.matmul(&x[..split * k], split);
            assert_eq!(&y[..split * n], head.as_slice(), "{kind}: first {split} rows differ");
        }
    }
}

#[test]
fn the_simd_path_gives_the_scalar_bits() {
    let (n, k) = (70, 128);
    for kind in [
        "q4_0", "q4_1", "q8_0", "f32", "q5", "q5_0", "q6", "q6s", "f16", "bf16", "q4k", "q5k", "q6k", "q6ks",
    ] {
        let w = matrix(kind, n, k, 11);
        if !matches!(kind, "q6" | "q6s" | "f16" | "bf16" | "q4k" | "q5k" | "q6k" | "q6ks") {
            let ratio = match kind {
                "q4_0" => Some(-8.0),
                "q5_0" => Some(-16.0),
                _ => None,
            };
            assert_eq!(
                (w.half, w.offsets, w.ratio),
                (!matches!(kind, "f32" | "q5"), kind != "q8_0", ratio),
                "{kind}: record format"
            );
            // offsets left out when implied: one f16 scale per column of a record, then the quants
            if ratio.is_some() {
                assert_eq!(w.head, 2 * P, "{kind}: record head");
            }
        }
        let nb = w.nb();
        for rr in 1..=kernel::max_rows() {
            let x = acts(rr, k);
            let xs: Vec<f32> = x.chunks_exact(w.bl).map(|b| b.iter().fold(0.0, |s, v| s + v)).collect();
            for p0 in (0..w.np).step_by(TILE_PANELS) {
                let mut slow: kernel::Acc = [[0.0; P]; kernel::MAX_ROWS * TILE_PANELS];
                kernel::scalar(&w, p0, &x, &xs[..rr * nb], rr, &mut slow);
                // the records' heads, and (K-quant factors) the tile's expanded ones
                let expanded = w.expand_heads(p0);
                assert_eq!(expanded.is_some(), w.sub.is_some(), "{kind}");
                for heads in [None, expanded.as_deref()] {
                    let mut fast: kernel::Acc = [[0.0; P]; kernel::MAX_ROWS * TILE_PANELS];
                    kernel::run(&w, p0, &x, &xs[..rr * nb], heads, rr, kernel::Walk::Stream, &mut fast);
                    // this machine's path, and every SIMD path it has (AVX2 and AVX-512 on an
                    // AVX-512 host): the ISAs stay bit-identical
                    let mut each = kernel::run_each(&w, p0, &x, &xs[..rr * nb], heads, rr);
                    each.push(("this machine's", fast));
                    for (path, fast) in each {
                        for i in 0..rr * TILE_PANELS {
                            for j in 0..P {
                                assert_eq!(
                                    fast[i][j].to_bits(),
                                    slow[i][j].to_bits(),
                                    "{path} {kind} rows {rr} panel {p0} expanded {}: {i} {j}",
                                    heads.is_some()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn stacked_matrices_equal_their_parts() {
    let k = 64;
    let (a, b) = (matrix("q4_1", 13, k, 1), matrix("q4_1", 21, k, 2));
    let ab = QMatrix::concat(&[&a, &b]).unwrap();
    assert_eq!(ab.rows(), 34);
    let x = acts(3, k);
    let (ya, yb, yab) = (a.matmul(&x, 3), b.matmul(&x, 3), ab.matmul(&x, 3));
    for r in 0..3 {
        assert_eq!(&yab[r * 34..r * 34 + 13], &ya[r * 13..(r + 1) * 13]);
        assert_eq!(&yab[r * 34 + 13..(r + 1) * 34], &yb[r * 21..(r + 1) * 21]);
    }
    assert!(QMatrix::concat(&[&a, &matrix("q8_0", 4, k, 3)]).is_none());
    let (a, b) = (matrix("bf16", 9, k, 1), matrix("bf16", 5, k, 2));
    let ab = QMatrix::concat(&[&a, &b]).unwrap();
    let (ya, yb, yab) = (a.matmul(&x, 3), b.matmul(&x, 3), ab.matmul(&x, 3));
    for r in 0..3 {
        assert_eq!(&yab[r * 14..r * 14 + 9], &ya[r * 9..(r + 1) * 9]);
        assert_eq!(&yab[r * 14 + 9..(r + 1) * 14], &yb[r * 5..(r + 1) * 5]);
    }
}

#[test]
fn decodes_gguf_blocks() {
    // one Q4_1 block: d = 0.5, m = -1, nibbles 0..15 low and 15..0 high
    let mut b = vec![];
    b.extend(half::f16::from_f32(0.5).to_le_bytes());
    b.extend(half::f16::from_f32(-1.0).to_le_bytes());
    for j in 0..16u8 {
        b.push(j | ((15 - j) << 4));
    }
    let w = QMatrix::from_q4_1(&b, 1, 32);
    assert_eq!(w.value(0, 0), -1.0);
    assert_eq!(w.value(0, 3), 0.5);
    assert_eq!(w.value(0, 16), 6.5);
    let mut q0 = vec![];
    q0.extend(half::f16::from_f32(2.0).to_le_bytes());
    q0.extend([0x8Fu8; 16]);
    let w = QMatrix::from_q4_0(&q0, 1, 32);
    assert_eq!(w.value(0, 0), 14.0);
    assert_eq!(w.value(0, 16), 0.0);
    let y = w.matmul(&[1.0; 32], 1);
    assert_eq!(y, vec![16.0 * 14.0]);
}

#[test]
fn the_integer_kernel_gives_the_scalar_bits() {
    let (n, k) = (70, 128);
    for kind in [
        "q4_0", "q4_1", "q8_0", "f32", "q5", "q5_0", "q6", "q6s", "q4k", "q5k", "q6k", "q6ks",
    ] {
        let w = matrix(kind, n, k, 13);
        assert!(w.has_int8(), "{kind}");
        let nb = w.nb();
        for rr in 1..=kernel::max_rows() {
            // rows 2 .. 2 + rr of a quantized batch (the kernel's row offset)
            let x = acts(rr + 2, k);
            let q = w.quantize(&x, &vec![true; rr + 2]);
            let xs: Vec<f32> = x[2 * k..]
                .chunks_exact(w.bl)
                .map(|b| b.iter().fold(0.0, |s, v| s + v))
                .collect();
            for p0 in (0..w.np).step_by(TILE_PANELS) {
                let mut fast: kernel::Acc = [[0.0; P]; kernel::MAX_ROWS * TILE_PANELS];
                let mut slow = fast;
                kernel_int::run_int(&w, p0, &q, 2, &xs[..rr * nb], None, rr, kernel::Walk::Stream, &mut fast);
                kernel_int::scalar_int(&w, p0, &q, 2, &xs[..rr * nb], rr, &mut slow);
                let mut each = kernel_int::run_int_each(&w, p0, &q, 2, &xs[..rr * nb], None, rr);
                // a 6-bit tile widened for a prefill's integer rows: every path, and the scalar
                // kernel on it, give the 6-bit tile's bits
                if w.kind == QKind::Q6 {
                    let b = w.tile_as_bytes(p0 / TILE_PANELS);
                    assert_eq!(b.kind, QKind::Q6x);
                    each.extend(kernel_int::run_int_each(&b, 0, &q, 2, &xs[..rr * nb], None, rr));
                    let mut on_bytes = fast;
                    kernel_int::scalar_int(&b, 0, &q, 2, &xs[..rr * nb], rr, &mut on_bytes);
                    each.push(("scalar on widened bytes", on_bytes));
                }
                each.push(("this machine's", fast));
                // K-quant factors: the tile's expanded heads on every path too
                if let Some(h) = w.expand_heads(p0) {
                    each.extend(kernel_int::run_int_each(&w, p0, &q, 2, &xs[..rr * nb], Some(&h), rr));
                }
                for (path, fast) in each {
                    for i in 0..rr * TILE_PANELS {
                        for j in 0..P {
                            assert_eq!(
                                fast[i][j].to_bits(),
                                slow[i][j].to_bits(),
                                "{path} {kind} rows {rr} panel {p0}: {i} {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn integer_rows_stay_within_their_rounding_bound_and_are_batch_invariant() {
    let (n, k, rows) = (37, 96, 70);
    for kind in [
        "q4_0", "q4_1", "q8_0", "f32", "q5", "q5_0", "q6", "q6s", "bf16", "q4k", "q5k", "q6k", "q6ks",
    ] {
        let w = matrix(kind, n, k, 7);
        let x = acts(rows, k);
        // mixed batch: runs of integer and f32 rows
        let int8: Vec<bool> = (0..rows).map(|r| r % 7 < 4).collect();
        let y = w.matmul_rows(&x, rows, &int8);
        let y32 = w.matmul(&x, rows);
        for r in 0..rows {
            let row = &y[r * n..(r + 1) * n];
            if !int8[r] || !w.has_int8() {
                assert_eq!(row, &y32[r * n..(r + 1) * n], "{kind}: f32 row {r} changed");
                continue;
            }
            assert_ne!(row, &y32[r * n..(r + 1) * n], "{kind}: row {r} took the f32 kernel");
            // exactly the matmul of the dequantized weights with the dequantized activations (up to
            // f32 rounding): every weight `d·q + m` meets the same quantized input
            let wide = w.wide_acts();
            let q = w.quantize(&x[r * k..(r + 1) * k], &[true]);
            for (c, &got) in row.iter().enumerate() {
                let (mut want, mut mag) = (0f64, 0f64);
                for i in 0..k {
                    let t = w.value(c, i) as f64 * q.value(k, 0, i) as f64 * q.sx[i / 32] as f64;
                    want += t;
                    mag += t.abs();
                }
                let err = (got as f64 - want).abs();
                assert!(err <= 1e-5 * (1.0 + mag), "{kind} row {r} col {c}: {got} vs {want}");
            }
            for c in 0..n {
                // each input moves by at most half a step of its group (amax / 254; 8-bit weights
                // meet 16-bit codes: amax / 65534)
                let half_steps = if wide { 65534.0 } else { 254.0 };
                let bound: f64 = (0..k)
                    .map(|i| {
                        let g = &x[r * k + i / 32 * 32..r * k + i / 32 * 32 + 32];
                        let amax = g.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                        (w.value(c, i) as f64).abs() * amax / half_steps
                    })
                    .sum();
                let err = (row[c] as f64 - y32[r * n + c] as f64).abs();
                assert!(err <= bound * 1.001 + 1e-5, "{kind} row {r} col {c}: {err} > {bound}");
            }
            let alone = w.matmul_rows(&x[r * k..(r + 1) * k], 1, &[true]);
            assert_eq!(row, alone.as_slice(), "{kind}: integer row {r} depends on the batch");
        }
    }
}

#[test]
fn six_bit_records_give_the_eight_bit_layouts_f32_bits_from_fewer_bytes() {
    // every row count a call takes (1..8 and a prefill's chunks), f32 and 8-bit activations, plain
    // heads and K-quant factors, a width that pads its last tile
    let (n, k) = (45, 512);
    for (six, eight) in [("q6s", "q6"), ("q6ks", "q6k")] {
        let (a, b) = (matrix(six, n, k, 21), matrix(eight, n, k, 21));
        assert_eq!((a.kind, b.kind), (QKind::Q6, QKind::Q8), "{six}");
        // 6 bits a weight plus the same heads: 96 of 128 quant bytes per record
        assert!(
            a.bytes() * 100 < b.bytes() * 82,
            "{six}: {} vs {} bytes",
            a.bytes(),
            b.bytes()
        );
        for c in 0..n {
            for i in (0..k).step_by(7) {
                assert_eq!(a.value(c, i).to_bits(), b.value(c, i).to_bits(), "{six} {c} {i}");
            }
        }
        for rows in [1, 2, 3, 5, 8, 9, 70] {
            let x = acts(rows, k);
            assert_eq!(a.matmul(&x, rows), b.matmul(&x, rows), "{six}: f32 rows {rows}");
            // mixed: the f32 rows still the 8-bit layout's (a prefill's through the widened tile);
            // the integer rows meet byte codes (the 8-bit layout's meet 16-bit ones), each the
            // same as alone (the bound on them: `integer_rows_stay_within_their_rounding_bound…`)
            let int8: Vec<bool> = (0..rows).map(|r| r % 3 != 1).collect();
            let (ya, yb) = (a.matmul_rows(&x, rows, &int8), b.matmul_rows(&x, rows, &int8));
            for r in 0..rows {
                let (ra, rb) = (&ya[r * n..(r + 1) * n], &yb[r * n..(r + 1) * n]);
                if int8[r] {
                    let alone = a.matmul_rows(&x[r * k..(r + 1) * k], 1, &[true]);
                    assert_eq!(ra, alone.as_slice(), "{six}: 8-bit row {r} of {rows}");
                } else {
                    assert_eq!(ra, rb, "{six}: f32 row {r} of {rows}");
                }
            }
        }
    }
}

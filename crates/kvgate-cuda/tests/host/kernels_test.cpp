// The CUDA kernels of kernels/*.cu run on the host (cuda_host.h emulates threads, warps and blocks) and
// checked against plain references computed here in double: the model kernels (matmul over f32 and
// Q8_0 rows with a dense tail, batch invariance of a row, embedding, RMSNorm, RoPE in both pairings,
// gated activations, softcap, residual add, row gathers, log-probabilities) and the KV kernels the CUDA
// backend adds or generalized (f32/f16/bf16/fp8 stores, paged attention of query rows over their own
// ranges: prefill rows, sliding windows, softcap, GQA, head_dim 16 and 64; single pass and split-K with
// its merge, a one-split row bit-equal to the single pass). Prints one line per check;
// exit status 1 on any failure. Built and run by tests/host_kernels.rs.
#include <cstdio>
#include <random>

#include "cuda_host.h"

namespace mk {
#include "model.cu"
}
namespace kv {
#include "kv_cache.cu"
}

static int failures = 0;
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            failures++;                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);   \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
        }                                                 \
    } while (0)

static std::mt19937 rng(42);
static float urand(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static std::vector<float> rvec(size_t n, float a = -1.0f, float b = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = urand(a, b);
    return v;
}
static unsigned cdiv(unsigned a, unsigned b) { return (a + b - 1) / b; }

// A weight matrix in `fmt` with its rows dequantized by the kernels' own dequantizer (checked against
// candle by tests/host_dequant.rs).
struct Mat {
    int fmt, rows, cols;
    size_t row_bytes;
    std::vector<unsigned char> bytes;
    std::vector<float> deq;
};

static Mat make_mat(int fmt, int rows, int cols) {
    Mat m{fmt, rows, cols, 0, {}, {}};
    if (fmt == WF_F32) {
        m.row_bytes = (size_t)cols * 4;
        auto v = rvec((size_t)rows * cols);
        m.bytes.resize(v.size() * 4);
        memcpy(m.bytes.data(), v.data(), m.bytes.size());
    } else {  // Q8_0: an f16 scale (2^-6) and 32 random int8 per block
        m.row_bytes = (size_t)cols / 32 * 34;
        m.bytes.resize(m.row_bytes * rows);
        for (size_t b = 0; b < m.bytes.size() / 34; b++) {
            m.bytes[b * 34] = 0x00;
            m.bytes[b * 34 + 1] = 0x24;  // f16 0x2400 = 2^-6
            for (int i = 0; i < 32; i++) m.bytes[b * 34 + 2 + i] = (unsigned char)(rng() & 0xFF);
        }
    }
    m.deq.resize((size_t)rows * cols);
    float w[32];
    for (int r = 0; r < rows; r++)
        for (int c = 0; 32 * c < cols; c++) {
            mk::dequant_chunk(m.bytes.data() + r * m.row_bytes, fmt, c, cols, w);
            for (int i = 0; i < 32 && 32 * c + i < cols; i++) m.deq[(size_t)r * cols + 32 * c + i] = w[i];
        }
    return m;
}

static std::vector<float> run_matmul(const Mat& m, const std::vector<float>& x, int n, const std::vector<float>& bias) {
    std::vector<float> y((size_t)n * m.rows, -7.0f);
    launch({cdiv(m.rows, MM_WARPS), cdiv(n, MM_ROWS), 1}, MM_WARPS * 32, 0, [&] {
        mk::matmul(y.data(), x.data(), m.bytes.data(), m.fmt, m.row_bytes, bias.data(), 1, m.rows, m.cols, n);
    });
    return y;
}

static void test_matmul() {
    for (auto [fmt, cols] : {std::pair{WF_F32, 80}, std::pair{WF_Q8_0, 96}}) {
        Mat m = make_mat(fmt, 21, cols);
        auto bias = rvec(m.rows);
        auto x = rvec((size_t)17 * cols);
        auto y = run_matmul(m, x, 17, bias);
        double worst = 0;
        for (int r = 0; r < 17; r++)
            for (int j = 0; j < m.rows; j++) {
                double ref = bias[j];
                for (int k = 0; k < cols; k++) ref += (double)m.deq[(size_t)j * cols + k] * x[(size_t)r * cols + k];
                worst = std::max(worst, std::abs(ref - y[(size_t)r * m.rows + j]) / std::max(1.0, std::abs(ref)));
            }
        CHECK(worst < 1e-5, "matmul fmt %d: %g", fmt, worst);
        // a row's bits do not depend on the rows beside it
        int same = 0;
        for (int r : {0, 9, 16}) {
            std::vector<float> xr(x.begin() + (size_t)r * cols, x.begin() + (size_t)(r + 1) * cols);
            auto y1 = run_matmul(m, xr, 1, bias);
            same += memcmp(y1.data(), y.data() + (size_t)r * m.rows, 4 * m.rows) == 0;
        }
        CHECK(same == 3, "matmul fmt %d: a row alone differs from the same row among 17", fmt);
        printf("matmul fmt %d (%d cols): worst %.2e, rows bitwise batch-invariant\n", fmt, cols, worst);
        // embedding rows: the dequantized rows times the scale
        std::vector<unsigned> tok = {3, 0, 20, 3};
        std::vector<float> e(tok.size() * cols);
        launch({cdiv(cdiv(cols, 32), 64), (unsigned)tok.size(), 1}, 64, 0,
               [&] { mk::embed(e.data(), m.bytes.data(), fmt, m.row_bytes, tok.data(), cols, 1.5f); });
        bool ok = true;
        for (size_t i = 0; i < tok.size(); i++)
            for (int k = 0; k < cols; k++) ok &= e[i * cols + k] == m.deq[(size_t)tok[i] * cols + k] * 1.5f;
        CHECK(ok, "embed fmt %d", fmt);
    }
}

// The fused launches compute exactly what the separate ones do.
static void test_fused() {
    // matmul3 over three matrices of different formats and sizes, against matmul each
    Mat a = make_mat(WF_F32, 12, 64), b = make_mat(WF_Q8_0, 7, 64), c = make_mat(WF_F32, 20, 64);
    int n = 11;
    auto x = rvec((size_t)n * 64);
    auto ba = rvec(12), bb = rvec(7), bc = rvec(20);
    std::vector<float> ya(n * 12), yb(n * 7), yc(n * 20), none(1);
    launch({cdiv(39, MM_WARPS), cdiv(n, MM_ROWS), 1}, MM_WARPS * 32, 0, [&] {
        mk::matmul3(ya.data(), yb.data(), yc.data(), x.data(), a.bytes.data(), b.bytes.data(), c.bytes.data(), a.fmt,
                    b.fmt, c.fmt, a.row_bytes, b.row_bytes, c.row_bytes, ba.data(), bb.data(), bc.data(), 1, 1, 0,
                    12, 7, 20, 64, n);
    });
    auto ra = run_matmul(a, x, n, ba), rb = run_matmul(b, x, n, bb);
    std::vector<float> rc((size_t)n * 20);
    launch({cdiv(20, MM_WARPS), cdiv(n, MM_ROWS), 1}, MM_WARPS * 32, 0, [&] {
        mk::matmul(rc.data(), x.data(), c.bytes.data(), c.fmt, c.row_bytes, bc.data(), 0, 20, 64, n);
    });
    CHECK(memcmp(ya.data(), ra.data(), 4 * ya.size()) == 0 && memcmp(yb.data(), rb.data(), 4 * yb.size()) == 0 &&
              memcmp(yc.data(), rc.data(), 4 * yc.size()) == 0,
          "matmul3 differs from matmul");
    // gate·up with the activation in one launch, against matmul, matmul, gated_act (matrices a and c's
    // first 12 rows: same width)
    for (int act = 0; act < 2; act++) {
        std::vector<float> yg(n * 12);
        launch({cdiv(12, MM_WARPS), cdiv(n, MM_ROWS), 1}, MM_WARPS * 32, 0, [&] {
            mk::matmul_gated(yg.data(), x.data(), a.bytes.data(), c.bytes.data(), a.fmt, c.fmt, a.row_bytes,
                             c.row_bytes, 12, 64, n, act);
        });
        auto g2 = run_matmul(a, x, n, std::vector<float>(12, 0.0f));
        auto u2 = run_matmul(c, x, n, std::vector<float>(20, 0.0f));
        std::vector<float> u12((size_t)n * 12);
        for (int r = 0; r < n; r++)
            for (int j = 0; j < 12; j++) u12[r * 12 + j] = u2[r * 20 + j];
        launch({1, 1, 1}, 256, 0, [&] { mk::gated_act(g2.data(), u12.data(), g2.size(), act); });
        CHECK(memcmp(yg.data(), g2.data(), 4 * yg.size()) == 0, "matmul_gated act %d differs", act);
    }
    // add + rms_norm in one launch
    int rows = 3, d = 200;
    auto x0 = rvec((size_t)rows * d), y0 = rvec((size_t)rows * d), w = rvec(d);
    auto x1 = x0, x2 = x0;
    std::vector<float> h1(x0.size()), h2(x0.size());
    launch({(unsigned)rows, 1, 1}, 256, 0,
           [&] { mk::add_rms_norm(x1.data(), y0.data(), h1.data(), w.data(), d, 1e-6f, 1); });
    launch({cdiv(x2.size(), 256), 1, 1}, 256, 0, [&] { mk::add(x2.data(), y0.data(), x2.size()); });
    launch({(unsigned)rows, 1, 1}, 256, 0, [&] { mk::rms_norm(h2.data(), x2.data(), w.data(), d, 1e-6f, 1); });
    CHECK(memcmp(x1.data(), x2.data(), 4 * x1.size()) == 0 && memcmp(h1.data(), h2.data(), 4 * h1.size()) == 0,
          "add_rms_norm differs from add then rms_norm");
    // rope over q and k in one launch
    int nh = 4, nkv = 2, hd = 16, maxp = 9;
    auto cs = rvec((size_t)maxp * hd / 2), sn = rvec((size_t)maxp * hd / 2);
    std::vector<unsigned> pos = {0, 8, 3};
    for (int style = 0; style < 2; style++) {
        auto q1 = rvec(pos.size() * nh * hd), k1 = rvec(pos.size() * nkv * hd);
        auto q2 = q1, k2 = k1;
        unsigned total = pos.size() * (nh + nkv) * hd / 2;
        launch({cdiv(total, 256), 1, 1}, 256, 0, [&] {
            mk::rope_qk(q1.data(), k1.data(), cs.data(), sn.data(), pos.data(), (int)pos.size(), nh, nkv, hd, style);
        });
        launch({cdiv(total, 256), 1, 1}, 256, 0, [&] {
            mk::rope(q2.data(), cs.data(), sn.data(), pos.data(), (int)pos.size(), nh, hd, style);
        });
        launch({cdiv(total, 256), 1, 1}, 256, 0, [&] {
            mk::rope(k2.data(), cs.data(), sn.data(), pos.data(), (int)pos.size(), nkv, hd, style);
        });
        CHECK(memcmp(q1.data(), q2.data(), 4 * q1.size()) == 0 && memcmp(k1.data(), k2.data(), 4 * k1.size()) == 0,
              "rope_qk style %d differs from rope twice", style);
    }
    printf("fused launches (matmul3, matmul_gated, add_rms_norm, rope_qk): bit for bit the separate ones\n");
}

static void test_rowwise() {
    // RMSNorm, plain and 1 + w, into a buffer and in place
    int rows = 5, d = 300;
    auto x = rvec((size_t)rows * d, -3, 3), w = rvec(d);
    for (int p1 = 0; p1 < 2; p1++) {
        std::vector<float> out(x.size()), inplace = x;
        launch({(unsigned)rows, 1, 1}, 256, 0, [&] { mk::rms_norm(out.data(), x.data(), w.data(), d, 1e-5f, p1); });
        launch({(unsigned)rows, 1, 1}, 256, 0, [&] { mk::rms_norm_inplace(inplace.data(), w.data(), d, 1e-5f, p1); });
        double worst = 0;
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
            double inv = 1.0 / std::sqrt(ss / d + 1e-5);
            for (int i = 0; i < d; i++) {
                double ref = x[r * d + i] * inv * (p1 ? 1.0 + w[i] : w[i]);
                worst = std::max(worst, std::abs(ref - out[r * d + i]));
            }
        }
        CHECK(worst < 1e-5, "rms_norm plus_one=%d: %g", p1, worst);
        CHECK(memcmp(out.data(), inplace.data(), 4 * out.size()) == 0, "rms_norm in place differs");
        printf("rms_norm plus_one=%d: worst %.2e, in place identical\n", p1, worst);
    }
    // RoPE, both pairings, with arbitrary tables
    int heads = 3, hd = 16, half = 8, maxp = 10;
    auto cs = rvec((size_t)maxp * half), sn = rvec((size_t)maxp * half);
    std::vector<unsigned> pos = {0, 7, 9, 2};
    auto q = rvec(pos.size() * heads * hd);
    for (int style = 0; style < 2; style++) {
        auto y = q;
        unsigned total = pos.size() * heads * half;
        launch({cdiv(total, 256), 1, 1}, 256, 0,
               [&] { mk::rope(y.data(), cs.data(), sn.data(), pos.data(), (int)pos.size(), heads, hd, style); });
        double worst = 0;
        for (size_t r = 0; r < pos.size(); r++)
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < half; i++) {
                    const float* v = &q[(r * heads + h) * hd];
                    int ia = style == 0 ? 2 * i : i, ib = style == 0 ? 2 * i + 1 : i + half;
                    double c = cs[pos[r] * half + i], s = sn[pos[r] * half + i];
                    double ra = v[ia] * c - v[ib] * s, rb = v[ia] * s + v[ib] * c;
                    const float* o = &y[(r * heads + h) * hd];
                    worst = std::max({worst, std::abs(ra - o[ia]), std::abs(rb - o[ib])});
                }
        CHECK(worst < 1e-6, "rope style %d: %g", style, worst);
        printf("rope style %d: worst %.2e\n", style, worst);
    }
    // gated activations, softcap, add, gather
    auto g = rvec(1000, -6, 6), u = rvec(1000);
    for (int act = 0; act < 2; act++) {
        auto y = g;
        launch({4, 1, 1}, 256, 0, [&] { mk::gated_act(y.data(), u.data(), 1000, act); });
        double worst = 0;
        for (int i = 0; i < 1000; i++) {
            double a = g[i];
            double ref = act == 0 ? a / (1 + std::exp(-a)) * u[i]
                                  : 0.5 * a * (1 + std::tanh(0.7978845608 * (a + 0.044715 * a * a * a))) * u[i];
            worst = std::max(worst, std::abs(ref - y[i]));
        }
        CHECK(worst < 1e-5, "gated_act %d: %g", act, worst);
    }
    auto y = g;
    launch({4, 1, 1}, 256, 0, [&] { mk::softcap(y.data(), 1000, 2.5f); });
    double worst = 0;
    for (int i = 0; i < 1000; i++) worst = std::max(worst, std::abs(2.5 * std::tanh(g[i] / 2.5) - y[i]));
    CHECK(worst < 1e-5, "softcap %g", worst);
    auto z = g;
    launch({4, 1, 1}, 256, 0, [&] { mk::add(z.data(), u.data(), 1000); });
    bool ok = true;
    for (int i = 0; i < 1000; i++) ok &= z[i] == g[i] + u[i];
    CHECK(ok, "add");
    std::vector<unsigned> sel = {9, 0, 9, 4};
    std::vector<float> gathered(sel.size() * 100);
    launch({1, (unsigned)sel.size(), 1}, 256, 0, [&] { mk::gather_rows(gathered.data(), g.data(), sel.data(), 100); });
    ok = true;
    for (size_t k = 0; k < sel.size(); k++)
        for (int i = 0; i < 100; i++) ok &= gathered[k * 100 + i] == g[sel[k] * 100 + i];
    CHECK(ok, "gather_rows");
    // log-probabilities of a few ids per row (a row with none too)
    int vocab = 1003;
    auto logits = rvec(3 * (size_t)vocab, -20, 20);
    std::vector<unsigned> ids = {5, 1002, 0, 17, 17}, first = {0, 3, 3, 5};
    std::vector<float> lp(ids.size());
    launch({3, 1, 1}, 256, 0, [&] { mk::logprobs(lp.data(), logits.data(), vocab, ids.data(), first.data()); });
    worst = 0;
    for (int r = 0; r < 3; r++) {
        double mx = -1e30, s = 0;
        for (int i = 0; i < vocab; i++) mx = std::max(mx, (double)logits[r * vocab + i]);
        for (int i = 0; i < vocab; i++) s += std::exp(logits[r * vocab + i] - mx);
        for (unsigned k = first[r]; k < first[r + 1]; k++)
            worst = std::max(worst, std::abs(logits[r * vocab + ids[k]] - (mx + std::log(s)) - lp[k]));
    }
    CHECK(worst < 1e-5, "logprobs %g", worst);
    printf("gated activations, softcap, add, gather, logprobs (worst %.2e): checked\n", worst);
}

// Paged attention of query rows over their own ranges, for one cache dtype.
static void test_attention(int dt, int hd, bool every_case) {
    const int nkv = 2, nh = 4, bs = 4, nblocks = 32;
    std::vector<int> lens = {13, 6, 21};
    int max_blocks = 6;
    // tables: a shuffled set of blocks per sequence
    std::vector<int> perm(nblocks);
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> tables(lens.size() * max_blocks, -1);
    int next = 0;
    for (size_t s = 0; s < lens.size(); s++)
        for (int b = 0; b < (lens[s] + bs - 1) / bs; b++) tables[s * max_blocks + b] = perm[next++];
    // every token's K and V, stored through the store kernel of the dtype
    int ntok = 0;
    for (int l : lens) ntok += l;
    std::vector<long long> slots;
    std::vector<std::pair<int, int>> tok_of;  // (seq, pos)
    for (size_t s = 0; s < lens.size(); s++)
        for (int p = 0; p < lens[s]; p++) {
            slots.push_back((long long)tables[s * max_blocks + p / bs] * bs + p % bs);
            tok_of.push_back({(int)s, p});
        }
    auto k = rvec((size_t)ntok * nkv * hd), v = rvec((size_t)ntok * nkv * hd);
    size_t elems = (size_t)nblocks * nkv * bs * hd;
    int esize = dt == DT_F32 ? 4 : (dt == DT_F16 || dt == DT_BF16) ? 2 : 1;
    std::vector<unsigned char> kc(elems * esize), vc(elems * esize);
    float kscale = 0.5f, vscale = 0.25f;
    unsigned grid = cdiv(ntok * nkv * hd, 256);
    for (auto [src, cache, sc] : {std::tuple{&k, &kc, kscale}, std::tuple{&v, &vc, vscale}}) {
        launch({grid, 1, 1}, 256, 0, [&, src = src, cache = cache, sc = sc] {
            if (dt == DT_F32) kv::store_f32(src->data(), slots.data(), (float*)cache->data(), ntok, nkv, hd, bs);
            if (dt == DT_F16) kv::store_f16(src->data(), slots.data(), (unsigned short*)cache->data(), ntok, nkv, hd, bs);
            if (dt == DT_BF16) kv::store_bf16(src->data(), slots.data(), (unsigned short*)cache->data(), ntok, nkv, hd, bs);
            if (dt == DT_E4M3) kv::store_fp8(src->data(), slots.data(), cache->data(), 1.0f / sc, 0, ntok, nkv, hd, bs);
        });
    }
    // the stored values, read back as the kernels decode them
    auto stored = [&](const std::vector<unsigned char>& c, size_t i, float sc) -> double {
        if (dt == DT_F32) return ((const float*)c.data())[i];
        if (dt == DT_F16) return kv::f16_to_f32(((const unsigned short*)c.data())[i]);
        if (dt == DT_BF16) return kv::bf16_to_f32(((const unsigned short*)c.data())[i]);
        return kv::e4m3_to_f32(c[i]) * sc;
    };
    auto at = [&](int s, int p, int h, int d) {
        size_t block = tables[s * max_blocks + p / bs];
        return ((block * nkv + h) * bs + p % bs) * hd + d;
    };
    // the stores themselves: f32 exact, the 16-bit formats within their rounding
    double store_err = 0;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < nkv; h++)
            for (int d = 0; d < hd; d++) {
                double x = k[((size_t)t * nkv + h) * hd + d];
                store_err = std::max(store_err, std::abs(stored(kc, at(tok_of[t].first, tok_of[t].second, h, d), kscale) - x));
            }
    double store_tol = dt == DT_F32 ? 0 : dt == DT_F16 ? 1e-3 : dt == DT_BF16 ? 8e-3 : 0.1;
    CHECK(store_err <= store_tol, "store dt %d: %g", dt, store_err);
    // query rows: every position of every sequence (prefill rows), under each window and softcap
    for (int window : {0, 5})
        for (float cap : {0.0f, 1.5f}) {
            if (!every_case && !(window && cap > 0)) continue;
            // rows at every third position (first, middle and last blocks of each sequence)
            std::vector<int> rows;
            for (size_t s = 0; s < lens.size(); s++)
                for (int p = (int)s % 3; p < lens[s]; p += 3) {
                    int end = p + 1, first = window ? std::max(0, end - window) : 0;
                    rows.insert(rows.end(), {(int)s, first, end});
                }
            int nrows = rows.size() / 3;
            auto q = rvec((size_t)nrows * nh * hd);
            std::vector<float> out((size_t)nrows * nh * hd, -9.0f), dummy(1, 0.0f);
            float scale = 1.0f / std::sqrt((float)hd);
            size_t smem = (hd + 8 * (hd + 2)) * 4;
            // single pass, then split-K in splits of 4 positions (merged by attention_merge)
            int split = 0;
            std::vector<float> partial(1, 0.0f);
            auto attend = [&](unsigned nsplit) {
            launch({(unsigned)nh, (unsigned)nrows, nsplit}, 256, smem, [&] {
                const unsigned char *K = kc.data(), *V = vc.data();
                if (dt == DT_F32)
                    kv::paged_attention_f32(out.data(), q.data(), K, V, tables.data(), max_blocks, rows.data(), nh, nkv,
                                            hd, bs, scale, kscale, vscale, 0, 0, 1.0f, dummy.data(), 0, cap, split, partial.data(), 0,
                                            nullptr, nullptr);
                if (dt == DT_F16)
                    kv::paged_attention_f16(out.data(), q.data(), K, V, tables.data(), max_blocks, rows.data(), nh, nkv,
                                            hd, bs, scale, kscale, vscale, 0, 0, 1.0f, dummy.data(), 0, cap, split, partial.data(), 0,
                                            nullptr, nullptr);
                if (dt == DT_BF16)
                    kv::paged_attention_bf16(out.data(), q.data(), K, V, tables.data(), max_blocks, rows.data(), nh,
                                             nkv, hd, bs, scale, kscale, vscale, 0, 0, 1.0f, dummy.data(), 0, cap, split, partial.data(), 0,
                                            nullptr, nullptr);
                if (dt == DT_E4M3)
                    kv::paged_attention_e4m3(out.data(), q.data(), K, V, tables.data(), max_blocks, rows.data(), nh,
                                             nkv, hd, bs, scale, kscale, vscale, 0, 0, 1.0f, dummy.data(), 0, cap, split, partial.data(), 0,
                                            nullptr, nullptr);
            });
            };
            attend(1);
            std::vector<float> single = out;
            split = 4;
            int max_span = 0;
            for (int r = 0; r < nrows; r++) max_span = std::max(max_span, rows[3 * r + 2] - rows[3 * r + 1]);
            unsigned nsplit = cdiv(max_span, split);
            partial.assign((size_t)nrows * nh * nsplit * (hd + 2), -5.0f);
            attend(nsplit);
            launch({(unsigned)nh, (unsigned)nrows, 1}, 128, hd * 4, [&] {
                kv::attention_merge(out.data(), partial.data(), rows.data(), nh, nkv, hd, (int)nsplit, split, 0, 1.0f,
                                    dummy.data(), 0);
            });
            // a row of one split: the merged bits are the single pass's
            int short_rows = 0, same = 0;
            for (int r = 0; r < nrows; r++)
                if (rows[3 * r + 2] - rows[3 * r + 1] <= split) {
                    short_rows++;
                    same += memcmp(&out[(size_t)r * nh * hd], &single[(size_t)r * nh * hd], 4 * nh * hd) == 0;
                }
            CHECK(short_rows > 0 && same == short_rows, "split-K changed %d of %d one-split rows", short_rows - same,
                  short_rows);
            double worst = 0;
            for (int r = 0; r < nrows; r++) {
                int s = rows[3 * r], first = rows[3 * r + 1], end = rows[3 * r + 2];
                for (int h = 0; h < nh; h++) {
                    int kvh = h / (nh / nkv);
                    const float* qv = &q[((size_t)r * nh + h) * hd];
                    std::vector<double> sc;
                    double mx = -1e300;
                    for (int p = first; p < end; p++) {
                        double dot = 0;
                        for (int d = 0; d < hd; d++) dot += (double)(qv[d] * scale) * stored(kc, at(s, p, kvh, d), kscale);
                        if (cap > 0) dot = cap * std::tanh(dot / cap);
                        sc.push_back(dot);
                        mx = std::max(mx, dot);
                    }
                    double z = 0;
                    for (double& x : sc) z += (x = std::exp(x - mx));
                    for (int d = 0; d < hd; d++) {
                        double o = 0;
                        for (int p = first; p < end; p++) o += sc[p - first] / z * stored(vc, at(s, p, kvh, d), vscale);
                        worst = std::max({worst, std::abs(o - out[((size_t)r * nh + h) * hd + d]),
                                          std::abs(o - single[((size_t)r * nh + h) * hd + d])});
                    }
                }
            }
            CHECK(worst < 2e-5, "attention dt %d hd %d window %d cap %g: %g", dt, hd, window, cap, worst);
            printf("attention dt %d hd %d window %d softcap %.1f: %d rows, single pass and %u splits of 4 within %.2e "
                   "(store %.1e), one-split rows bitwise equal\n", dt, hd, window, cap, nrows, nsplit, worst, store_err);
        }
}

int main() {
    test_matmul();
    test_fused();
    test_rowwise();
    // every window/softcap case on f32 at both head sizes; the other formats' loads once each
    test_attention(DT_F32, 16, true);
    test_attention(DT_F32, 64, false);
    for (int dt : {DT_F16, DT_BF16, DT_E4M3}) test_attention(dt, 64, false);
    printf("%s: %d failures\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}

// kvgate model kernels: the layer code of crates/kvgate-model/src/{model,ops}.rs on the GPU, over
// weights as the file stores them (GGUF quant blocks, f32/f16/bf16 rows) — embedding gather, matmul with
// dequantize-on-the-fly, RMSNorm, RoPE from the CPU's own cos/sin tables, the gated activations,
// soft-capping, row gathers and the log-probabilities of a few ids.
//
// Self-contained (no #include): NVRTC compiles this file at run time to an sm_90 CUBIN. The dequantizers
// also build on the host (g++, with the shims of crates/kvgate-cuda/tests/host_dequant.rs), so CI checks
// every format's bit layout against candle's dequantization without a GPU.
//
// Every kernel is per row, and a row's result never depends on which other rows share the launch: the
// matmul gives each output to one warp whose lanes take fixed 32-element chunks in a fixed order, then a
// fixed butterfly reduction, whatever row tile the row falls in. So a row computes the same bits alone or
// in a batch of any size (batch invariance), as on the CPU.
//
// Weight formats (WF_*): a matrix is `rows` rows of `row_bytes` bytes each; a row is `cols` elements,
// in 32-element chunks. The GGUF layouts are ggml's (block_q4_0 … block_q6_K), dequantized as ggml's
// dequantize_row_* does.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define WF_F32 0
#define WF_F16 1
#define WF_BF16 2
#define WF_Q4_0 3
#define WF_Q4_1 4
#define WF_Q5_0 5
#define WF_Q5_1 6
#define WF_Q8_0 7
#define WF_Q4_K 8
#define WF_Q5_K 9
#define WF_Q6_K 10

#define M_INF __int_as_float(0xff800000)

__device__ __forceinline__ float h2f(u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // the host build of the dequantizers (crates/kvgate-cuda/tests/host_dequant.rs): IEEE half by hand
    u32 sign = (u32)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1Fu) return __uint_as_float(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        float v = (float)man * 5.9604644775390625e-8f;  // 2^-24
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
#endif
}

__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// The 32 elements of chunk c (elements 32c .. 32c+31) of one row, as f32. Dense rows past `cols` read 0.
__device__ __forceinline__ void dequant_chunk(const u8* __restrict__ row, int fmt, int c, int cols, float* w) {
    switch (fmt) {
        case WF_F32: {
            const float* p = (const float*)row + 32 * c;
#pragma unroll
            for (int i = 0; i < 32; i++) w[i] = (32 * c + i < cols) ? p[i] : 0.0f;
            break;
        }
        case WF_F16: {
            const u16* p = (const u16*)row + 32 * c;
#pragma unroll
            for (int i = 0; i < 32; i++) w[i] = (32 * c + i < cols) ? h2f(p[i]) : 0.0f;
            break;
        }
        case WF_BF16: {
            const u16* p = (const u16*)row + 32 * c;
#pragma unroll
            for (int i = 0; i < 32; i++) w[i] = (32 * c + i < cols) ? __uint_as_float(((u32)p[i]) << 16) : 0.0f;
            break;
        }
        case WF_Q4_0: {
            const u8* b = row + (u64)c * 18;
            float d = h2f(ld16(b));
            const u8* qs = b + 2;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                w[j] = (float)((int)(qs[j] & 0xF) - 8) * d;
                w[j + 16] = (float)((int)(qs[j] >> 4) - 8) * d;
            }
            break;
        }
        case WF_Q4_1: {
            const u8* b = row + (u64)c * 20;
            float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
            const u8* qs = b + 4;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                w[j] = (float)(qs[j] & 0xF) * d + m;
                w[j + 16] = (float)(qs[j] >> 4) * d + m;
            }
            break;
        }
        case WF_Q5_0: {
            const u8* b = row + (u64)c * 22;
            float d = h2f(ld16(b));
            u32 qh = ld32(b + 2);
            const u8* qs = b + 6;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                u32 h0 = ((qh >> j) << 4) & 0x10u;
                u32 h1 = (qh >> (j + 12)) & 0x10u;
                w[j] = (float)((int)((qs[j] & 0xFu) | h0) - 16) * d;
                w[j + 16] = (float)((int)((qs[j] >> 4) | h1) - 16) * d;
            }
            break;
        }
        case WF_Q5_1: {
            const u8* b = row + (u64)c * 24;
            float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
            u32 qh = ld32(b + 4);
            const u8* qs = b + 8;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                u32 h0 = ((qh >> j) << 4) & 0x10u;
                u32 h1 = (qh >> (j + 12)) & 0x10u;
                w[j] = (float)((qs[j] & 0xFu) | h0) * d + m;
                w[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
            }
            break;
        }
        case WF_Q8_0: {
            const u8* b = row + (u64)c * 34;
            float d = h2f(ld16(b));
            const i8* qs = (const i8*)(b + 2);
#pragma unroll
            for (int j = 0; j < 32; j++) w[j] = (float)qs[j] * d;
            break;
        }
        case WF_Q4_K: {
            const u8* b = row + (u64)(c >> 3) * 144;
            int s = c & 7;
            float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
            float sc, m;
            scale_min_k4(s, b + 4, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            const u8* q = b + 16 + 32 * (s >> 1);
            int shift = (s & 1) * 4;
#pragma unroll
            for (int l = 0; l < 32; l++) w[l] = d1 * (float)((q[l] >> shift) & 0xF) - m1;
            break;
        }
        case WF_Q5_K: {
            const u8* b = row + (u64)(c >> 3) * 176;
            int s = c & 7;
            float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
            float sc, m;
            scale_min_k4(s, b + 4, &sc, &m);
            float d1 = d * sc, m1 = dmin * m;
            const u8* qh = b + 16;
            const u8* q = b + 48 + 32 * (s >> 1);
            int shift = (s & 1) * 4;
#pragma unroll
            for (int l = 0; l < 32; l++)
                w[l] = d1 * (float)(((q[l] >> shift) & 0xF) + (((qh[l] >> s) & 1) << 4)) - m1;
            break;
        }
        case WF_Q6_K: {
            const u8* b = row + (u64)(c >> 3) * 210;
            int s = c & 7, h = s >> 2, t = s & 3;
            const u8* ql = b + 64 * h + (t & 1) * 32;
            const u8* qh = b + 128 + 32 * h;
            const i8* sc = (const i8*)(b + 192) + 8 * h + 2 * t;
            float d = h2f(ld16(b + 208));
            int lshift = (t >> 1) * 4, hshift = 2 * t;
#pragma unroll
            for (int l = 0; l < 32; l++) {
                int q = (int)(((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
                w[l] = d * (float)sc[l >> 4] * (float)q;
            }
            break;
        }
        default: {
#pragma unroll
            for (int i = 0; i < 32; i++) w[i] = 0.0f;
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---------------------------------------------------------------- embedding, matmul

// out[r, :] = row tokens[r] of the table, times `scale`. Grid (ceil(chunks / 64), n), 64 threads: one
// thread per 32-element chunk.
extern "C" __global__ void embed(float* __restrict__ out, const u8* __restrict__ table, int fmt, u64 row_bytes,
                                 const u32* __restrict__ tokens, int dim, float scale) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y;
    if (32 * c >= dim) return;
    float w[32];
    dequant_chunk(table + (u64)tokens[r] * row_bytes, fmt, c, dim, w);
    float* o = out + (u64)r * dim + 32 * c;
#pragma unroll
    for (int i = 0; i < 32; i++)
        if (32 * c + i < dim) o[i] = scale == 1.0f ? w[i] : w[i] * scale;
}

#define MM_WARPS 4
#define MM_ROWS 8

// Output j of one matrix for the rows r0 .. r0 + MM_ROWS − 1 (below n), by one warp: each lane
// dequantizes its chunks (lane, lane + 32, …) once and takes the dot product with every row of the tile;
// the lanes' sums meet in a fixed butterfly (every lane ends with the same v[r]). The same arithmetic
// whatever the launch around it.
__device__ __forceinline__ void matmul_tile(const float* __restrict__ x, const u8* __restrict__ wt, int fmt,
                                            u64 row_bytes, int cols, int n, int j, float* v) {
    int lane = threadIdx.x & 31;
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n - r0);
    const u8* row = wt + (u64)j * row_bytes;
    int chunks = (cols + 31) / 32;
    float acc[MM_ROWS];
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) acc[r] = 0.0f;
    float w[32];
    for (int c = lane; c < chunks; c += 32) {
        dequant_chunk(row, fmt, c, cols, w);
        int base = 32 * c;
#pragma unroll
        for (int r = 0; r < MM_ROWS; r++) {
            if (r < nr) {
                const float* xr = x + (u64)(r0 + r) * cols + base;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) s += w[i] * ((base + i < cols) ? xr[i] : 0.0f);
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++) v[r] = warp_sum(acc[r]);
}

__device__ __forceinline__ void matmul_output(float* __restrict__ y, const float* __restrict__ x,
                                              const u8* __restrict__ wt, int fmt, u64 row_bytes,
                                              const float* __restrict__ bias, int has_bias, int out_dim,
                                              int cols, int n, int j) {
    float v[MM_ROWS];
    matmul_tile(x, wt, fmt, row_bytes, cols, n, j, v);
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n - r0);
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++)
        if ((threadIdx.x & 31) == 0 && r < nr) y[(u64)(r0 + r) * out_dim + j] = has_bias ? v[r] + bias[j] : v[r];
}

__device__ __forceinline__ float gate_act(float x, float u, int act) {
    if (act == 0) return x / (1.0f + expf(-x)) * u;
    const float C = 0.7978846f;
    return 0.5f * x * (1.0f + tanhf(C * (x + 0.044715f * x * x * x))) * u;
}

// The MLP's first half in one launch: y[r, j] = act(gate_j · x[r]) · (up_j · x[r]) (act 0: SiLU, 1:
// GELU-tanh), each dot product computed as `matmul` computes it and the activation as `gated_act`: the
// same bits as matmul, matmul, gated_act. Grid (ceil(inter / MM_WARPS), ceil(n / MM_ROWS)).
extern "C" __global__ void matmul_gated(float* __restrict__ y, const float* __restrict__ x,
                                        const u8* __restrict__ wg, const u8* __restrict__ wu, int fg, int fu,
                                        u64 rbg, u64 rbu, int inter, int cols, int n, int act) {
    int j = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (j >= inter) return;  // warp-uniform
    float g[MM_ROWS], u[MM_ROWS];
    matmul_tile(x, wg, fg, rbg, cols, n, j, g);
    matmul_tile(x, wu, fu, rbu, cols, n, j, u);
    int r0 = blockIdx.y * MM_ROWS;
    int nr = min(MM_ROWS, n - r0);
#pragma unroll
    for (int r = 0; r < MM_ROWS; r++)
        if ((threadIdx.x & 31) == 0 && r < nr) y[(u64)(r0 + r) * inter + j] = gate_act(g[r], u[r], act);
}

// y[r, j] = sum_k W[j, k] x[r, k] (+ bias[j]) for r < n, j < out_dim; x is n × cols, y n × out_dim.
// Grid (ceil(out_dim / MM_WARPS), ceil(n / MM_ROWS)), MM_WARPS * 32 threads: one warp per output j and
// tile of MM_ROWS rows.
extern "C" __global__ void matmul(float* __restrict__ y, const float* __restrict__ x, const u8* __restrict__ wt,
                                  int fmt, u64 row_bytes, const float* __restrict__ bias, int has_bias,
                                  int out_dim, int cols, int n) {
    int j = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (j >= out_dim) return;  // warp-uniform
    matmul_output(y, x, wt, fmt, row_bytes, bias, has_bias, out_dim, cols, n, j);
}

// Up to three matrices over the same input in one launch (q·k·v, gate·up): outputs 0 .. o0 − 1 are
// matrix 0's into y0, the next o1 matrix 1's into y1, the next o2 matrix 2's into y2 — each computed
// exactly as `matmul` computes it. Grid (ceil((o0 + o1 + o2) / MM_WARPS), ceil(n / MM_ROWS)).
extern "C" __global__ void matmul3(float* __restrict__ y0, float* __restrict__ y1, float* __restrict__ y2,
                                   const float* __restrict__ x, const u8* __restrict__ w0,
                                   const u8* __restrict__ w1, const u8* __restrict__ w2, int f0, int f1, int f2,
                                   u64 rb0, u64 rb1, u64 rb2, const float* __restrict__ b0,
                                   const float* __restrict__ b1, const float* __restrict__ b2, int hb0, int hb1,
                                   int hb2, int o0, int o1, int o2, int cols, int n) {
    int j = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (j < o0) matmul_output(y0, x, w0, f0, rb0, b0, hb0, o0, cols, n, j);
    else if (j < o0 + o1) matmul_output(y1, x, w1, f1, rb1, b1, hb1, o1, cols, n, j - o0);
    else if (j < o0 + o1 + o2) matmul_output(y2, x, w2, f2, rb2, b2, hb2, o2, cols, n, j - o0 - o1);
}

// ---------------------------------------------------------------- per-row element-wise ops

__device__ float block_sum(float v, float* shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < warps; i++) t += shared[i];
    return t;
}

__device__ float block_max(float v, float* shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = M_INF;
    for (int i = 0; i < warps; i++) t = fmaxf(t, shared[i]);
    return t;
}

__device__ void rms_norm_row(float* out, const float* x, const float* __restrict__ w, int d, float eps,
                             int plus_one) {
    __shared__ float shared[32];
    const float* xr = x + (u64)blockIdx.x * d;
    float* orow = out + (u64)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, shared);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = plus_one ? 1.0f + w[i] : w[i];
        orow[i] = xr[i] * r * g;
    }
}

// out[r] = x[r] · rsqrt(mean(x[r]²) + eps) · w (or · (1 + w)), rows of width d. Grid (rows), 256 threads.
extern "C" __global__ void rms_norm(float* __restrict__ out, const float* __restrict__ x,
                                    const float* __restrict__ w, int d, float eps, int plus_one) {
    rms_norm_row(out, x, w, d, eps, plus_one);
}

// The same in place (each thread rewrites only the elements it read).
extern "C" __global__ void rms_norm_inplace(float* x, const float* __restrict__ w, int d, float eps,
                                            int plus_one) {
    rms_norm_row(x, x, w, d, eps, plus_one);
}

// x[r] += y[r], then out[r] = RMSNorm(x[r]) (the residual add and the next norm in one pass; the same
// values and reduction as `add` then `rms_norm`). Grid (rows), 256 threads.
extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out,
                                        const float* __restrict__ w, int d, float eps, int plus_one) {
    __shared__ float shared[32];
    float* xr = x + (u64)blockIdx.x * d;
    const float* yr = y + (u64)blockIdx.x * d;
    float* orow = out + (u64)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, shared);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float g = plus_one ? 1.0f + w[i] : w[i];
        orow[i] = xr[i] * r * g;
    }
}

// x += y, n elements.
extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// Rotates every head of every row (x: rows × heads × hd) by its row's position, with the tables
// cos/sin (max_pos × hd/2, the CPU's Rope tables). style 0: pairs (2i, 2i+1); 1: pairs (i, i + hd/2).
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, const u32* __restrict__ pos, int rows, int heads,
                                int hd, int style) {
    int half = hd / 2;
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)rows * heads * half;
    if (idx >= total) return;
    int i = (int)(idx % half);
    u64 rh = idx / half;
    int r = (int)(rh / heads);
    float* h = x + rh * hd;
    u64 p = pos[r];
    float c = cos_t[p * half + i], s = sin_t[p * half + i];
    int ia = style == 0 ? 2 * i : i, ib = style == 0 ? 2 * i + 1 : i + half;
    float a = h[ia], b = h[ib];
    h[ia] = a * c - b * s;
    h[ib] = style == 0 ? a * s + b * c : b * c + a * s;
}

// `rope` over q (rows × nh heads) and k (rows × nkv heads) in one launch.
extern "C" __global__ void rope_qk(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ cos_t,
                                   const float* __restrict__ sin_t, const u32* __restrict__ pos, int rows, int nh,
                                   int nkv, int hd, int style) {
    int half = hd / 2;
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 nq = (u64)rows * nh * half;
    u64 total = nq + (u64)rows * nkv * half;
    if (idx >= total) return;
    bool is_q = idx < nq;
    int heads = is_q ? nh : nkv;
    u64 e = is_q ? idx : idx - nq;
    int i = (int)(e % half);
    u64 rh = e / half;
    int r = (int)(rh / heads);
    float* h = (is_q ? q : k) + rh * hd;
    u64 p = pos[r];
    float c = cos_t[p * half + i], s = sin_t[p * half + i];
    int ia = style == 0 ? 2 * i : i, ib = style == 0 ? 2 * i + 1 : i + half;
    float a = h[ia], b = h[ib];
    h[ia] = a * c - b * s;
    h[ib] = style == 0 ? a * s + b * c : b * c + a * s;
}

// gate = act(gate) · up; act 0: SiLU, 1: GELU (tanh approximation).
extern "C" __global__ void gated_act(float* __restrict__ g, const float* __restrict__ u, u64 n, int act) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = gate_act(g[i], u[i], act);
}

// x = cap · tanh(x / cap).
extern "C" __global__ void softcap(float* __restrict__ x, u64 n, float cap) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// out[k, :] = x[rows[k], :], rows of width d. Grid (ceil(d / 256), k), 256 threads.
extern "C" __global__ void gather_rows(float* __restrict__ out, const float* __restrict__ x,
                                       const u32* __restrict__ rows, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d) out[(u64)blockIdx.y * d + i] = x[(u64)rows[blockIdx.y] * d + i];
}

// Log-probabilities of a few ids per logits row: out[k] = logits[row_of[k], ids[k]] − lse(row), with
// lse = max + log(Σ exp(v − max)) summed in f64 (as kvgate_backend::log_sum_exp). Grid (rows), 256
// threads; first[r] .. first[r + 1] are row r's entries of ids/out.
extern "C" __global__ void logprobs(float* __restrict__ out, const float* __restrict__ logits, int vocab,
                                    const u32* __restrict__ ids, const u32* __restrict__ first) {
    __shared__ float shared[32];
    __shared__ double dshared[32];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float mx = M_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, row[i]);
    mx = block_max(mx, shared);
    double s = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += exp((double)(row[i] - mx));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) dshared[warp] = s;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < warps; i++) t += dshared[i];
    float lse = (float)log(t) + mx;
    for (u32 k = first[blockIdx.x] + threadIdx.x; k < first[blockIdx.x + 1]; k += blockDim.x)
        out[k] = row[ids[k]] - lse;
}

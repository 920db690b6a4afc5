// kvgate KV-cache kernels: quantize-on-store (reshape-and-cache) and paged attention over f32, f16,
// bf16, fp8 (e4m3 / e5m2) and nvfp4 blocks: one query row per CTA row, each attending to its own range
// of its sequence (decode rows and the rows of a prefill chunk alike: causal, sliding window, softcap).
//
// Self-contained (no #include): NVRTC compiles this file at run time to an sm_90 CUBIN (the tests also
// build it for the host, emulating threads, warps and blocks: crates/kvgate-cuda/tests/host_kernels.rs). The codecs are
// bit-for-bit the CPU reference of crates/kvgate-kv/src/codec (round to nearest even, saturating, NaN to
// one defined code whatever its sign, since the GPU's arithmetic returns the canonical positive NaN),
// done in software: sm_90 has no e2m1 conversion instruction.
//
// Cache layout (one layer's K or V, identical to kvgate_kv::CacheShape): block b holds, for every
// (kv head h, token slot o) in [h][o] order, head_dim elements; for nvfp4 first every vector's packed
// data (head_dim / 2 bytes, element 2i in the low nibble) and then every vector's scale bytes
// (head_dim / 16 E4M3 scales); for fp8 with per-vector ("fine") scales first every vector's data and
// then one exponent byte per vector (scale 2^(byte - 127)).
//
// Quantization methods (kvgate_kv::quant, the reference): an optional rotation R = H·D/sqrt(b) of each
// head vector (blockwise Walsh–Hadamard, b the largest power of two dividing head_dim, D fixed signs
// from splitmix64) applied to K and V on store and to q in attention, whose output is rotated back;
// "smooth" per-channel offsets subtracted on store (K's drop out of softmax, V's are added to the output);
// "fine" scales (fp8: a power-of-two scale per vector; nvfp4: each group's E4M3 scale chosen by least
// squared error). The arithmetic is the CPU's step for step, without fused multiply-adds, so stores
// agree byte for byte.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define KV_INF __int_as_float(0x7f800000)

// Dynamic shared memory; the host build of the kernels (crates/kvgate-cuda/tests/host_kernels.rs) gives
// each emulated block its own buffer.
#ifdef __CUDA_ARCH__
#define DYNAMIC_SHARED(name) extern __shared__ float name[]
#else
#define DYNAMIC_SHARED(name) float* name = host_dynamic_shared()
#endif

// ---------------------------------------------------------------- codecs

__device__ __forceinline__ u8 f32_to_e4m3(float x) {
    u32 bits = __float_as_uint(x);
    u8 sign = (u8)((bits >> 24) & 0x80u);
    if (x != x) return (u8)0x7Fu;
    float ax = fabsf(x);
    if (ax >= 448.0f) return (u8)(sign | 0x7Eu);
    if (ax < 0.015625f) return (u8)(sign | (u32)rintf(ax * 512.0f));
    u32 u = __float_as_uint(ax);
    int e = (int)(u >> 23) - 127;
    u32 mant = u & 0x7FFFFFu;
    u32 code = ((u32)(e + 7) << 3) | (mant >> 20);
    u32 rem = mant & 0xFFFFFu;
    if (rem > 0x80000u || (rem == 0x80000u && (code & 1u))) code++;
    if (code > 0x7Eu) code = 0x7Eu;
    return (u8)(sign | code);
}

__device__ __forceinline__ u8 f32_to_e5m2(float x) {
    u32 bits = __float_as_uint(x);
    u8 sign = (u8)((bits >> 24) & 0x80u);
    if (x != x) return (u8)0x7Fu;
    float ax = fabsf(x);
    if (ax >= 57344.0f) return (u8)(sign | 0x7Bu);
    if (ax < 6.103515625e-5f) return (u8)(sign | (u32)rintf(ax * 65536.0f));
    u32 u = __float_as_uint(ax);
    int e = (int)(u >> 23) - 127;
    u32 mant = u & 0x7FFFFFu;
    u32 code = ((u32)(e + 15) << 2) | (mant >> 21);
    u32 rem = mant & 0x1FFFFFu;
    if (rem > 0x100000u || (rem == 0x100000u && (code & 1u))) code++;
    if (code > 0x7Bu) code = 0x7Bu;
    return (u8)(sign | code);
}

__device__ __forceinline__ u8 f32_to_e2m1(float x) {
    if (x != x) return 0;
    u8 sign = (__float_as_uint(x) >> 31) ? 8 : 0;
    float a = fabsf(x);
    u8 m;
    if (a <= 0.25f) m = 0;
    else if (a < 0.75f) m = 1;
    else if (a <= 1.25f) m = 2;
    else if (a < 1.75f) m = 3;
    else if (a <= 2.5f) m = 4;
    else if (a < 3.5f) m = 5;
    else if (a <= 5.0f) m = 6;
    else m = 7;
    return (u8)(sign | m);
}

// Decoders, branch-free for the attention loop, each exact: the code's bits are placed in an f32 and scaled
// by a power of two (f32 subnormals are kept: NVRTC compiles without flush-to-zero).
__device__ __forceinline__ float e4m3_to_f32(u32 b) {
    u32 mag = b & 0x7Fu;
    float v = __uint_as_float(((b & 0x80u) << 24) | (mag << 20)) * __uint_as_float(0x7B800000u);  // 2^120
    return mag == 0x7Fu ? __int_as_float(0x7FC00000) : v;
}

__device__ __forceinline__ float e5m2_to_f32(u32 b) {
    u32 mag = b & 0x7Fu;
    float v = __uint_as_float(((b & 0x80u) << 24) | (mag << 21)) * __uint_as_float(0x77800000u);  // 2^112
    if (mag >= 0x7Cu) v = mag == 0x7Cu ? ((b & 0x80u) ? -KV_INF : KV_INF) : __int_as_float(0x7FC00000);
    return v;
}

// E2M1 nibble → f32 without a table (a per-lane table index serialises constant-memory reads).
__device__ __forceinline__ float e2m1_to_f32(u32 q) {
    u32 e = (q >> 1) & 3u, m = q & 1u;
    float v = e ? __uint_as_float(((e + 126u) << 23) | (m << 22)) : 0.5f * (float)m;
    return (q & 8u) ? -v : v;
}

// bf16 as the `half` crate rounds it: NaN keeps its top bits with the quiet bit set; otherwise round
// to nearest, ties to even.
__device__ __forceinline__ u16 f32_to_bf16(float value) {
    u32 x = __float_as_uint(value);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((x >> 16) | 0x0040u);
    u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (u16)((x >> 16) + 1u);
    return (u16)(x >> 16);
}

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// IEEE half, round to nearest even (the `half` crate's f16::from_f32 for finite values and infinities).
__device__ __forceinline__ u16 f32_to_f16(float x) {
#ifdef __CUDA_ARCH__
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    _Float16 h = (_Float16)x;  // the host build (tests/host_kernels.rs): the compiler's correctly rounded cast
    u16 b;
    memcpy(&b, &h, 2);
    return b;
#endif
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#endif
}

// ---------------------------------------------------------------- quantize-on-store

// x: [ntok, nkv, hd] f32; slots[t] = block * bs + offset (negative: skip). One thread per element.
extern "C" __global__ void store_bf16(const float* __restrict__ x, const i64* __restrict__ slots,
                                      u16* __restrict__ cache, int ntok, int nkv, int hd, int bs) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)ntok * nkv * hd;
    if (idx >= total) return;
    int d = (int)(idx % hd);
    int h = (int)((idx / hd) % nkv);
    int t = (int)(idx / ((u64)hd * nkv));
    i64 slot = slots[t];
    if (slot < 0) return;
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    cache[((block * nkv + h) * bs + off) * hd + d] = f32_to_bf16(x[idx]);
}

// f32 and f16 caches: the value itself (f16 rounded to nearest even).
extern "C" __global__ void store_f32(const float* __restrict__ x, const i64* __restrict__ slots,
                                     float* __restrict__ cache, int ntok, int nkv, int hd, int bs) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)ntok * nkv * hd;
    if (idx >= total) return;
    int d = (int)(idx % hd);
    int h = (int)((idx / hd) % nkv);
    int t = (int)(idx / ((u64)hd * nkv));
    i64 slot = slots[t];
    if (slot < 0) return;
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    cache[((block * nkv + h) * bs + off) * hd + d] = x[idx];
}

extern "C" __global__ void store_f16(const float* __restrict__ x, const i64* __restrict__ slots,
                                     u16* __restrict__ cache, int ntok, int nkv, int hd, int bs) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)ntok * nkv * hd;
    if (idx >= total) return;
    int d = (int)(idx % hd);
    int h = (int)((idx / hd) % nkv);
    int t = (int)(idx / ((u64)hd * nkv));
    i64 slot = slots[t];
    if (slot < 0) return;
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    cache[((block * nkv + h) * bs + off) * hd + d] = f32_to_f16(x[idx]);
}

// fmt 0 = e4m3, 1 = e5m2; stores code(x * inv_scale).
extern "C" __global__ void store_fp8(const float* __restrict__ x, const i64* __restrict__ slots,
                                     u8* __restrict__ cache, float inv_scale, int fmt, int ntok, int nkv,
                                     int hd, int bs) {
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)ntok * nkv * hd;
    if (idx >= total) return;
    int d = (int)(idx % hd);
    int h = (int)((idx / hd) % nkv);
    int t = (int)(idx / ((u64)hd * nkv));
    i64 slot = slots[t];
    if (slot < 0) return;
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    float v = x[idx] * inv_scale;
    cache[((block * nkv + h) * bs + off) * hd + d] = fmt == 0 ? f32_to_e4m3(v) : f32_to_e5m2(v);
}

// One thread per 16-element group: sf = e4m3(gs * amax / 6), q_i = e2m1(x_i * gs / f32(sf)).
extern "C" __global__ void store_nvfp4(const float* __restrict__ x, const i64* __restrict__ slots,
                                       u8* __restrict__ cache, float gs, int ntok, int nkv, int hd, int bs) {
    int groups = hd / 16;
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)ntok * nkv * groups;
    if (idx >= total) return;
    int g = (int)(idx % groups);
    int h = (int)((idx / groups) % nkv);
    int t = (int)(idx / ((u64)groups * nkv));
    i64 slot = slots[t];
    if (slot < 0) return;
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    const float* src = x + ((u64)t * nkv + h) * hd + (u64)g * 16;
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        float a = fabsf(src[i]);
        if (a > amax) amax = a;
    }
    u8 sf = f32_to_e4m3(gs * amax / 6.0f);
    float sf_f = e4m3_to_f32(sf);
    float mul = (sf_f == 0.0f || !isfinite(sf_f)) ? 0.0f : gs / sf_f;
    u64 data_bytes = (u64)hd / 2, scale_bytes = (u64)hd / 16;
    u64 base = block * (u64)nkv * bs * (data_bytes + scale_bytes);
    u64 vec = (u64)h * bs + off;
    u8* data = cache + base + vec * data_bytes + (u64)g * 8;
    for (int i = 0; i < 8; i++) {
        u8 lo = f32_to_e2m1(src[2 * i] * mul);
        u8 hi = f32_to_e2m1(src[2 * i + 1] * mul);
        data[i] = (u8)(lo | (hi << 4));
    }
    cache[base + (u64)nkv * bs * data_bytes + vec * scale_bytes + g] = sf;
}


// ---------------------------------------------------------------- rotation and fine scales

// Whether element i's sign is flipped by D (kvgate_kv::quant::sign_flipped).
__device__ __forceinline__ bool sign_flipped(u32 i) {
    u64 z = 0x6b76676174650001ull + (u64)i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 63) == 1ull;
}

// The butterflies of a blockwise Walsh–Hadamard transform of x[0..hd) in shared memory, by `nthreads`
// threads numbered `tid` (stages separated by `sync`, which the caller's group size decides).
template <bool BLOCK_SYNC>
__device__ __forceinline__ void hadamard_butterflies(float* x, int hd, int tid, int nthreads) {
    int b = hd & -hd;
    for (int h = 1; h < b; h <<= 1) {
        for (int p = tid; p < hd / 2; p += nthreads) {
            int blk = p / (b / 2), r = p % (b / 2);
            int j = blk * b + (r / h) * 2 * h + (r % h);
            float a = x[j], c = x[j + h];
            x[j] = __fadd_rn(a, c);
            x[j + h] = __fsub_rn(a, c);
        }
        if (BLOCK_SYNC) __syncthreads(); else __syncwarp();
    }
}

// x ← H·D·x / sqrt(b) (kvgate_kv::quant::rotate); `norm` = 1/sqrt(b) from the host.
template <bool BLOCK_SYNC>
__device__ __forceinline__ void rotate_vec(float* x, int hd, float norm, int tid, int nthreads) {
    for (int i = tid; i < hd; i += nthreads)
        if (sign_flipped((u32)i)) x[i] = -x[i];
    if (BLOCK_SYNC) __syncthreads(); else __syncwarp();
    hadamard_butterflies<BLOCK_SYNC>(x, hd, tid, nthreads);
    for (int i = tid; i < hd; i += nthreads) x[i] = __fmul_rn(x[i], norm);
    if (BLOCK_SYNC) __syncthreads(); else __syncwarp();
}

// x ← D·H·x / sqrt(b) (kvgate_kv::quant::unrotate).
template <bool BLOCK_SYNC>
__device__ __forceinline__ void unrotate_vec(float* x, int hd, float norm, int tid, int nthreads) {
    hadamard_butterflies<BLOCK_SYNC>(x, hd, tid, nthreads);
    for (int i = tid; i < hd; i += nthreads) {
        float v = __fmul_rn(x[i], norm);
        x[i] = sign_flipped((u32)i) ? -v : v;
    }
    if (BLOCK_SYNC) __syncthreads(); else __syncwarp();
}

// 2^e as an f32 for e in -126..127.
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float((u32)(e + 127) << 23); }

// fp8 fine: the least e with amax <= max·2^e (max = 1.75·2^m), from the bits (kvgate_kv::quant::
// fp8_vector_exponent); 0 for a zero, subnormal or non-finite amax.
__device__ __forceinline__ int fp8_vector_exponent(float amax, int m) {
    u32 bits = __float_as_uint(amax) & 0x7FFFFFFFu;
    int field = (int)(bits >> 23);
    if (field == 0 || field == 0xFF) return 0;
    return field - 127 - m + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
}

// Squared error of one group of 16 stored with scale byte `code` (kvgate_kv::quant::nvfp4_best_scale).
__device__ __forceinline__ float nvfp4_group_err(const float* x, float gs, u8 code) {
    float sf = e4m3_to_f32(code);
    float e = 0.0f;
    if (sf == 0.0f || !isfinite(sf)) {
        for (int i = 0; i < 16; i++) {
            float d = __fmul_rn(x[i], gs);
            e = __fadd_rn(e, __fmul_rn(d, d));
        }
        return e;
    }
    float mul = gs / sf;
    for (int i = 0; i < 16; i++) {
        u8 q = f32_to_e2m1(__fmul_rn(x[i], mul));
        float d = __fsub_rn(__fmul_rn(x[i], gs), __fmul_rn(e2m1_to_f32(q), sf));
        e = __fadd_rn(e, __fmul_rn(d, d));
    }
    return e;
}

// The least-squares scale byte of a group: from one code below e4m3(gs·amax/6) up to e4m3(gs·amax/4);
// the standard code wins ties, then the lowest.
__device__ __forceinline__ u8 nvfp4_best_scale(const float* x, float gs, float amax) {
    u8 standard = f32_to_e4m3(gs * amax / 6.0f);
    u8 top = f32_to_e4m3(gs * amax / 4.0f);
    if (top > 0x7Eu) top = 0x7Eu;
    if (top < standard) top = standard;
    u8 best = standard;
    float best_err = nvfp4_group_err(x, gs, standard);
    for (u32 code = standard > 0 ? standard - 1u : 0u; code <= top; code++) {
        if (code == standard) continue;
        float e = nvfp4_group_err(x, gs, (u8)code);
        if (e < best_err) {
            best = (u8)code;
            best_err = e;
        }
    }
    return best;
}

// Quantize-on-store with a method: one warp per (token, kv head) vector, `hd` floats of dynamic shared
// memory per warp (blockDim = 32 × vectors per block). fmt 0 = e4m3, 1 = e5m2, 2 = nvfp4; `layer`: fp8
// 1/scale, nvfp4 the global scale gs; `rotate`, `fine`: the method's switches; `norm` = 1/sqrt(b).
// `offsets` (nkv × hd, used when has_offsets): subtracted from each vector first (`smooth` methods).
extern "C" __global__ void store_quant(const float* __restrict__ x, const i64* __restrict__ slots,
                                       u8* __restrict__ cache, float layer, int fmt, int rotate, int fine,
                                       float norm, const float* __restrict__ offsets, int has_offsets,
                                       int ntok, int nkv, int hd, int bs) {
    DYNAMIC_SHARED(svec);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 vid = (u64)blockIdx.x * (blockDim.x >> 5) + w;
    if (vid >= (u64)ntok * nkv) return;
    int h = (int)(vid % nkv);
    int t = (int)(vid / nkv);
    i64 slot = slots[t];
    if (slot < 0) return;
    float* v = svec + (u64)w * hd;
    const float* src = x + vid * hd;
    for (int i = lane; i < hd; i += 32) v[i] = has_offsets ? __fsub_rn(src[i], offsets[h * hd + i]) : src[i];
    __syncwarp();
    if (rotate) rotate_vec<false>(v, hd, norm, lane, 32);
    u64 block = (u64)(slot / bs), off = (u64)(slot % bs);
    u64 vec = (u64)h * bs + off;
    if (fmt == 2) {
        u64 data_bytes = (u64)hd / 2, scale_bytes = (u64)hd / 16;
        u64 base = block * (u64)nkv * bs * (data_bytes + scale_bytes);
        for (int g = lane; g < hd / 16; g += 32) {
            const float* xs = v + g * 16;
            float amax = 0.0f;
            for (int i = 0; i < 16; i++) {
                float a = fabsf(xs[i]);
                if (a > amax) amax = a;
            }
            u8 sf = fine ? nvfp4_best_scale(xs, layer, amax) : f32_to_e4m3(layer * amax / 6.0f);
            float sf_f = e4m3_to_f32(sf);
            float mul = (sf_f == 0.0f || !isfinite(sf_f)) ? 0.0f : layer / sf_f;
            u8* data = cache + base + vec * data_bytes + (u64)g * 8;
            for (int i = 0; i < 8; i++) {
                u8 lo = f32_to_e2m1(__fmul_rn(xs[2 * i], mul));
                u8 hi = f32_to_e2m1(__fmul_rn(xs[2 * i + 1], mul));
                data[i] = (u8)(lo | (hi << 4));
            }
            cache[base + (u64)nkv * bs * data_bytes + vec * scale_bytes + g] = sf;
        }
        return;
    }
    u64 per = (u64)hd + (fine ? 1 : 0);
    u64 base = block * (u64)nkv * bs * per;
    float inv = layer;
    if (fine) {
        float amax = 0.0f;
        for (int i = lane; i < hd; i += 32) {
            float a = fabsf(v[i]);
            if (a > amax) amax = a;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float other = __shfl_xor_sync(0xffffffffu, amax, o);
            if (other > amax) amax = other;
        }
        int e = fp8_vector_exponent(amax, fmt == 0 ? 8 : 15);
        if (lane == 0) cache[base + (u64)nkv * bs * hd + vec] = (u8)(e + 127);
        inv = pow2f(-e);
    }
    u8* data = cache + base + vec * hd;
    for (int i = lane; i < hd; i += 32) {
        float y = __fmul_rn(v[i], inv);
        data[i] = fmt == 0 ? f32_to_e4m3(y) : f32_to_e5m2(y);
    }
}

// ---------------------------------------------------------------- paged attention (decode)

#define DT_BF16 0
#define DT_E4M3 1
#define DT_E5M2 2
#define DT_NVFP4 3
#define DT_F32 4
#define DT_F16 5
#define WARPS 8

// Loads the PER consecutive elements starting at `d` of the vector (block, kvh, off), dequantized, with
// the widest aligned loads PER allows (d is a multiple of PER).
// With `fine` (fp8 only) the vector's own scale 2^(byte - 127) replaces `scale`.
template <int DT, int PER>
__device__ __forceinline__ void load_vec(const u8* __restrict__ cache, u64 block, int kvh, int off, int nkv,
                                         int hd, int bs, int d, float scale, int fine, float* out) {
    u64 vec = (u64)kvh * bs + off;
    if (DT == DT_F32) {
        const float* p = (const float*)cache + (block * nkv * bs + vec) * hd + d;
        if (PER % 4 == 0) {
#pragma unroll
            for (int i = 0; i < PER; i += 4) {
                float4 w = *(const float4*)(p + i);
                out[i] = w.x;
                out[i + 1] = w.y;
                out[i + 2] = w.z;
                out[i + 3] = w.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++) out[i] = p[i];
        }
    } else if (DT == DT_F16) {
        const u16* p = (const u16*)cache + (block * nkv * bs + vec) * hd + d;
#pragma unroll
        for (int i = 0; i < PER; i++) out[i] = f16_to_f32(p[i]);
    } else if (DT == DT_BF16) {
        const u16* p = (const u16*)cache + (block * nkv * bs + vec) * hd + d;
        if (PER % 4 == 0) {
#pragma unroll
            for (int i = 0; i < PER; i += 4) {
                uint2 w = *(const uint2*)(p + i);
                out[i] = __uint_as_float(w.x << 16);
                out[i + 1] = __uint_as_float(w.x & 0xFFFF0000u);
                out[i + 2] = __uint_as_float(w.y << 16);
                out[i + 3] = __uint_as_float(w.y & 0xFFFF0000u);
            }
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++) out[i] = bf16_to_f32(p[i]);
        }
    } else if (DT == DT_E4M3 || DT == DT_E5M2) {
        u64 base = block * nkv * bs * ((u64)hd + (fine ? 1 : 0));
        const u8* p = cache + base + vec * hd + d;
        if (fine) scale = pow2f((int)cache[base + (u64)nkv * bs * hd + vec] - 127);
        if (PER % 4 == 0) {
#pragma unroll
            for (int i = 0; i < PER; i += 4) {
                u32 w = *(const u32*)(p + i);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    u32 b = (w >> (8 * j)) & 0xFFu;
                    out[i + j] = (DT == DT_E4M3 ? e4m3_to_f32(b) : e5m2_to_f32(b)) * scale;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++)
                out[i] = (DT == DT_E4M3 ? e4m3_to_f32(p[i]) : e5m2_to_f32(p[i])) * scale;
        }
    } else {
        u64 data_bytes = (u64)hd / 2, scale_bytes = (u64)hd / 16;
        u64 base = block * (u64)nkv * bs * (data_bytes + scale_bytes);
        const u8* data = cache + base + vec * data_bytes;
        const u8* scales = cache + base + (u64)nkv * bs * data_bytes + vec * scale_bytes;
        if (PER % 4 == 0 && 16 % PER == 0) {
            // One group's scale covers the lane's elements; PER / 2 data bytes, an aligned u16 or u32.
            float s = e4m3_to_f32(scales[d >> 4]) / (1.0f / scale);
            u32 w = PER == 4 ? (u32) * (const u16*)(data + (d >> 1)) : *(const u32*)(data + (d >> 1));
#pragma unroll
            for (int i = 0; i < PER; i++) out[i] = e2m1_to_f32((w >> (4 * i)) & 0xFu) * s;
            return;
        }
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            int e = d + i;
            // A lane's elements may straddle two 16-element groups (head_dim / 32 not a power of two).
            if (i == 0 || (e & 15) == 0) s = e4m3_to_f32(scales[e >> 4]) / (1.0f / scale);
            u8 byte = data[e >> 1];
            u32 q = (e & 1) ? (byte >> 4) : (byte & 0xFu);
            out[i] = e2m1_to_f32(q) * s;
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Partial softmax results — (max, sum, unnormalised output[hd]) at stride hd + 2: a CTA's warps, or a
// row's splits — merged in order.
__device__ __forceinline__ float parts_max(const float* p, int count, int hd) {
    float big = -KV_INF;
    for (int i = 0; i < count; i++) big = fmaxf(big, p[i * (hd + 2)]);
    return big;
}

__device__ __forceinline__ float parts_total(const float* p, int count, int hd, float big) {
    float total = 0.0f;
    for (int i = 0; i < count; i++) {
        float m = p[i * (hd + 2)];
        if (m != -KV_INF) total += p[i * (hd + 2) + 1] * expf(m - big);
    }
    return total;
}

__device__ __forceinline__ float parts_out(const float* p, int count, int hd, float big, int d) {
    float o = 0.0f;
    for (int i = 0; i < count; i++) {
        float m = p[i * (hd + 2)];
        if (m != -KV_INF) o += p[i * (hd + 2) + 2 + d] * expf(m - big);
    }
    return o;
}

// One head's output row from its partial results: normalised; without rotation each element goes
// straight out, with it the vector is gathered in `vec` (hd floats of shared memory) and rotated back
// first; V offsets (smooth) are added last — the weights sum to one, so an offset comes back whole.
// Every thread of the block calls it.
__device__ void write_row(float* __restrict__ orow, const float* parts, int count, int hd, int rotate, float norm,
                          float* vec, const float* __restrict__ v_offsets, int has_offsets, int kvh) {
    float big = parts_max(parts, count, hd);
    float total = parts_total(parts, count, hd, big);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = parts_out(parts, count, hd, big, d);
        o = total > 0.0f ? o / total : 0.0f;
        if (rotate) vec[d] = o;
        else orow[d] = has_offsets ? o + v_offsets[kvh * hd + d] : o;
    }
    if (rotate) {
        __syncthreads();
        unrotate_vec<true>(vec, hd, norm, threadIdx.x, blockDim.x);
        for (int d = threadIdx.x; d < hd; d += blockDim.x)
            orow[d] = has_offsets ? vec[d] + v_offsets[kvh * hd + d] : vec[d];
    }
}

// Whether a tree row sees position t of its sequence: every position before `base`, and from it on those
// whose bit is set in its mask words (`off`: the row's first word in `words`; −1: a causal row, all).
__device__ __forceinline__ bool tree_sees(int t, int base, int off, const unsigned long long* __restrict__ words) {
    if (off < 0 || t < base) return true;
    int i = t - base;
    return ((words[off + (i >> 6)] >> (i & 63)) & 1ull) != 0;
}

// out, q: [nrows, nh, hd] f32; tables: [nseq, max_blocks]; rows: [nrows, 3] = (sequence, first position,
// end position) of each query row, which attends to positions first .. end-1 of its sequence (a decode row:
// 0 .. ctx; a prefill row at position p: 0 .. p+1, or its window's tail). With has_masks, mrows: [nrows, 2]
// = (base, first word in mwords or −1) of each row: a tree row attends only to the positions it sees
// (tree_sees); a causal row's bits are unchanged. Grid (nh, nrows), WARPS * 32
// threads, dynamic shared memory (hd + WARPS * (hd + 2)) floats. Each warp takes UNROLL (4 or 8) consecutive
// tokens at a time (their K and V loads in flight together) with an online softmax; lane l owns elements
// l*per .. l*per+per-1; the warps' partial results are merged at the end.
template <int DT, int PER>
__device__ void paged_attention(float* __restrict__ out, const float* __restrict__ q, const u8* __restrict__ kc,
                                const u8* __restrict__ vc, const int* __restrict__ tables, int max_blocks,
                                const int* __restrict__ rows, int nh, int nkv, int hd, int bs, float scale,
                                float k_scale, float v_scale, int rotate, int fine, float norm,
                                const float* __restrict__ v_offsets, int has_offsets, float softcap,
                                int split_len, float* __restrict__ partial, int has_masks,
                                const int* __restrict__ mrows, const unsigned long long* __restrict__ mwords) {
    DYNAMIC_SHARED(smem);
    int head = blockIdx.x, row = blockIdx.y;
    int seq = rows[3 * row], first = rows[3 * row + 1], n = rows[3 * row + 2];
    int mbase = has_masks ? mrows[2 * row] : 0, moff = has_masks ? mrows[2 * row + 1] : -1;
    // split-K: this CTA takes split_len positions of the row from first + blockIdx.z · split_len (a row
    // shorter than that has nothing for it: the whole CTA leaves before any barrier)
    if (split_len > 0) {
        int lo = first + (int)blockIdx.z * split_len;
        if (lo >= n) return;
        first = lo;
        n = min(n, lo + split_len);
    }
    int kvh = head / (nh / nkv);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* qs = smem;
    float* part = smem + hd;  // per warp: m, l, acc[hd]
    const float* qrow = q + ((u64)row * nh + head) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qrow[d] * scale;
    __syncthreads();
    // The cache holds R·k: scores from R·q.
    if (rotate) rotate_vec<true>(qs, hd, norm, threadIdx.x, blockDim.x);
    const int per = PER;  // hd / 32, a compile-time constant so the per-lane arrays stay in registers
    int d0 = lane * per;
    // head_dim below 32 (PER 1): lanes past the vector hold nothing and read nothing
    bool live = d0 < hd;
    float qv[PER];
#pragma unroll
    for (int i = 0; i < per; i++) qv[i] = live ? qs[d0 + i] : 0.0f;
    float m = -KV_INF, l = 0.0f, acc[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) acc[i] = 0.0f;
    const int* table = tables + (u64)seq * max_blocks;
    // Tokens in flight per warp: 8 for the byte formats; nvfp4's dequantization needs more registers per
    // token, and 8 measured slower there than 4 on the H200.
    constexpr int UNROLL = DT == DT_NVFP4 ? 4 : 8;
    float buf[UNROLL][PER];
    for (int t0 = first + warp * UNROLL; t0 < n; t0 += WARPS * UNROLL) {
        float s[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int t = t0 + u;
            if (t < n && live) load_vec<DT, PER>(kc, (u64)table[t / bs], kvh, t % bs, nkv, hd, bs, d0, k_scale, fine, buf[u]);
            else
                for (int i = 0; i < per; i++) buf[u][i] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float d = 0.0f;
            for (int i = 0; i < per; i++) d += qv[i] * buf[u][i];
            s[u] = warp_sum(d);
            if (softcap > 0.0f) s[u] = softcap * tanhf(s[u] / softcap);
        }
        // the positions this row reads: inside its range and, for a tree row, seen
        bool ok[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) ok[u] = t0 + u < n && tree_sees(t0 + u, mbase, moff, mwords);
        float m_new = m;
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            if (ok[u]) m_new = fmaxf(m_new, s[u]);
        // nothing seen yet (a tree row's unseen run): nothing to rescale
        float c = m_new == -KV_INF ? 1.0f : expf(m - m_new);
        float p[UNROLL];
        l *= c;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            p[u] = ok[u] ? expf(s[u] - m_new) : 0.0f;
            l += p[u];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int t = t0 + u;
            if (t < n && live) load_vec<DT, PER>(vc, (u64)table[t / bs], kvh, t % bs, nkv, hd, bs, d0, v_scale, fine, buf[u]);
            else
                for (int i = 0; i < per; i++) buf[u][i] = 0.0f;
        }
        for (int i = 0; i < per; i++) {
            float a = acc[i] * c;
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (ok[u]) a += p[u] * buf[u][i];
            acc[i] = a;
        }
        m = m_new;
    }
    float* mine = part + warp * (hd + 2);
    if (lane == 0) {
        mine[0] = m;
        mine[1] = l;
    }
    if (live)
        for (int i = 0; i < per; i++) mine[2 + d0 + i] = acc[i];
    __syncthreads();
    if (split_len > 0) {
        // this split's (max, sum, unnormalised output): attention_merge finishes the row
        float* pp = partial + (((u64)row * nh + head) * gridDim.z + blockIdx.z) * (hd + 2);
        float big = parts_max(part, WARPS, hd);
        if (threadIdx.x == 0) {
            pp[0] = big;
            pp[1] = parts_total(part, WARPS, hd, big);
        }
        for (int d = threadIdx.x; d < hd; d += blockDim.x) pp[2 + d] = parts_out(part, WARPS, hd, big, d);
        return;
    }
    // qs is free once every lane holds its q: it gathers the vector to rotate back
    write_row(out + ((u64)row * nh + head) * hd, part, WARPS, hd, rotate, norm, qs, v_offsets, has_offsets, kvh);
}

#define PA_CASE(P)                                                                                            \
    case P:                                                                                                   \
        paged_attention<DT, P>(out, q, kc, vc, tables, max_blocks, rows, nh, nkv, hd, bs, scale, k_scale,     \
                               v_scale, rotate, fine, norm, v_offsets, has_offsets, softcap, split_len,       \
                               partial, has_masks, mrows, mwords);                                            \
        break;

// head_dim is below 32 or a multiple of 32 up to 256 (checked by the host): one instantiation per
// head_dim / 32.
template <int DT>
__device__ void paged_attention_dispatch(float* __restrict__ out, const float* __restrict__ q,
                                         const u8* __restrict__ kc, const u8* __restrict__ vc,
                                         const int* __restrict__ tables, int max_blocks,
                                         const int* __restrict__ rows, int nh, int nkv, int hd, int bs,
                                         float scale, float k_scale, float v_scale, int rotate, int fine,
                                         float norm, const float* __restrict__ v_offsets, int has_offsets,
                                         float softcap, int split_len, float* __restrict__ partial,
                                         int has_masks, const int* __restrict__ mrows,
                                         const unsigned long long* __restrict__ mwords) {
    switch (hd / 32) {
        case 0:  // head_dim below 32: one element per lane
        PA_CASE(1)
        PA_CASE(2)
        PA_CASE(3)
        PA_CASE(4)
        PA_CASE(5)
        PA_CASE(6)
        PA_CASE(7)
        PA_CASE(8)
        default:
            break;
    }
}

#define PAGED_ATTENTION_ENTRY(name, DT)                                                                       \
    extern "C" __global__ void name(float* __restrict__ out, const float* __restrict__ q,                    \
                                    const u8* __restrict__ kc, const u8* __restrict__ vc,                    \
                                    const int* __restrict__ tables, int max_blocks,                          \
                                    const int* __restrict__ rows, int nh, int nkv, int hd, int bs,           \
                                    float scale, float k_scale, float v_scale, int rotate, int fine,         \
                                    float norm, const float* __restrict__ v_offsets, int has_offsets,        \
                                    float softcap, int split_len, float* __restrict__ partial,               \
                                    int has_masks, const int* __restrict__ mrows,                            \
                                    const unsigned long long* __restrict__ mwords) {                         \
        paged_attention_dispatch<DT>(out, q, kc, vc, tables, max_blocks, rows, nh, nkv, hd, bs, scale,      \
                                     k_scale, v_scale, rotate, fine, norm, v_offsets, has_offsets, softcap,   \
                                     split_len, partial, has_masks, mrows, mwords);                           \
    }

PAGED_ATTENTION_ENTRY(paged_attention_f32, DT_F32)
PAGED_ATTENTION_ENTRY(paged_attention_f16, DT_F16)
PAGED_ATTENTION_ENTRY(paged_attention_bf16, DT_BF16)
PAGED_ATTENTION_ENTRY(paged_attention_e4m3, DT_E4M3)
PAGED_ATTENTION_ENTRY(paged_attention_e5m2, DT_E5M2)
PAGED_ATTENTION_ENTRY(paged_attention_nvfp4, DT_NVFP4)

// Finishes split-K attention: per (head, row), the splits' (max, sum, unnormalised output) of
// paged_attention_* with split_len > 0 merged in split order, normalised, rotated back and offset as the
// single pass does. A row of one split comes out bit for bit as the single pass computes it (every
// factor is exp(0) = 1), so whether a batch splits does not change a short row. Grid (nh, nrows),
// 128 threads, hd floats of dynamic shared memory.
extern "C" __global__ void attention_merge(float* __restrict__ out, const float* __restrict__ partial,
                                           const int* __restrict__ rows, int nh, int nkv, int hd, int nsplit,
                                           int split_len, int rotate, float norm,
                                           const float* __restrict__ v_offsets, int has_offsets) {
    DYNAMIC_SHARED(vec);
    int head = blockIdx.x, row = blockIdx.y;
    int kvh = head / (nh / nkv);
    int first = rows[3 * row + 1], end = rows[3 * row + 2];
    int splits = (end - first + split_len - 1) / split_len;
    const float* pp = partial + ((u64)row * nh + head) * nsplit * (hd + 2);
    write_row(out + ((u64)row * nh + head) * hd, pp, splits, hd, rotate, norm, vec, v_offsets, has_offsets, kvh);
}

// Runs kvgate's CUDA kernels on the host, for tests without a GPU: every CUDA thread of a block is an OS
// thread; __syncthreads is a barrier over the block, __syncwarp and the warp shuffles barriers over the
// warp (threads that return drop out of both, as exited CUDA threads do); blocks run one after another,
// so `__shared__` arrays are plain statics shared by the block running. Only what kernels/*.cu use is
// here. Exact float semantics need -ffp-contract=off (no fused multiply-adds the device would not do
// either, where the kernels spell out __fmul_rn / __fadd_rn).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

using std::isfinite;
using std::max;
using std::min;

struct dim3_ {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local dim3_ threadIdx, blockIdx;
inline dim3_ blockDim, gridDim;
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static

inline std::barrier<>* g_block = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> g_warps;
inline std::vector<double> g_xchg;
inline std::vector<float> g_dyn;

inline float* host_dynamic_shared() { return g_dyn.data(); }
inline void __syncthreads() { g_block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_warps[threadIdx.x / 32]->arrive_and_wait(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
    g_xchg[t] = (double)v;  // lossless for float and double
    g_warps[w]->arrive_and_wait();
    T r = (T)g_xchg[w * 32 + (lane ^ (unsigned)o)];
    g_warps[w]->arrive_and_wait();
    return r;
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

// Runs `kernel` (a callable taking no arguments) over `grid` blocks of `threads` threads (1-D blocks),
// with `smem` bytes of dynamic shared memory. One OS thread per CUDA thread for the whole launch; the
// blocks run one after another, each with fresh block and warp barriers.
template <class F>
void launch(dim3_ grid, unsigned threads, size_t smem, F kernel) {
    gridDim = grid;
    blockDim = {threads, 1, 1};
    g_xchg.assign(threads, 0.0);
    std::vector<dim3_> blocks;
    for (unsigned z = 0; z < std::max(grid.z, 1u); z++)
        for (unsigned y = 0; y < std::max(grid.y, 1u); y++)
            for (unsigned x = 0; x < std::max(grid.x, 1u); x++) blocks.push_back({x, y, z});
    std::barrier<> phase((std::ptrdiff_t)threads);
    std::unique_ptr<std::barrier<>> block_bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++)
        ts.emplace_back([&, t] {
            for (const dim3_& b : blocks) {
                phase.arrive_and_wait();  // the previous block is done everywhere
                if (t == 0) {
                    g_dyn.assign(smem / 4 + 1, 0.0f);
                    block_bar.reset(new std::barrier<>((std::ptrdiff_t)threads));
                    g_block = block_bar.get();
                    g_warps.clear();
                    for (unsigned w = 0; w * 32 < threads; w++)
                        g_warps.emplace_back(new std::barrier<>((std::ptrdiff_t)std::min(32u, threads - 32 * w)));
                }
                phase.arrive_and_wait();  // this block's barriers are ready
                threadIdx = {t, 0, 0};
                blockIdx = b;
                kernel();
                g_warps[t / 32]->arrive_and_drop();
                g_block->arrive_and_drop();
            }
        });
    for (auto& th : ts) th.join();
}

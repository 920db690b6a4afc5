// Runs kvgate's CUDA kernels on the host, for tests without a GPU. Every CUDA thread of a block is a
// fiber on the calling OS thread (x86-64: a hand-written context switch, a few nanoseconds); a fiber runs
// until it waits at a barrier — __syncthreads over the block, __syncwarp and each warp shuffle over its
// warp — and the fibers are resumed round-robin until all have finished. Threads that return drop out
// of their barriers, as exited CUDA threads do. Blocks run one after another, so `__shared__` arrays are
// plain statics belonging to the block that runs. Deterministic and single-threaded. Only what
// kernels/*.cu use is here. Exact float semantics need -ffp-contract=off (no fused multiply-adds the
// device would not do either, where the kernels spell out __fmul_rn / __fadd_rn).
#pragma once
#if !defined(__x86_64__)
#error "the emulated device's context switch is written for x86-64"
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

using std::isfinite;
using std::max;
using std::min;

struct dim3_ {
    unsigned x = 0, y = 0, z = 0;
};
inline dim3_ threadIdx, blockIdx, blockDim, gridDim;
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

// ---------------------------------------------------------------- fibers

extern "C" void kvgate_fiber_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl kvgate_fiber_switch
.type kvgate_fiber_switch, @function
kvgate_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size kvgate_fiber_switch, .-kvgate_fiber_switch
)");

struct Barrier {
    int expected = 0, arrived = 0, gen = 0;
};
struct Fiber {
    void* sp = nullptr;
    bool done = false;
};
inline constexpr size_t FIBER_STACK = 256 * 1024;
inline std::vector<Fiber> g_fibers;
inline std::vector<char*> g_stacks;
inline void* g_sched_sp = nullptr;
inline unsigned g_current = 0;
inline const std::function<void()>* g_kernel = nullptr;
inline Barrier g_block;
inline std::vector<Barrier> g_warps;
inline std::vector<double> g_xchg;
inline std::vector<float> g_dyn;

inline void fiber_yield() { kvgate_fiber_switch(&g_fibers[g_current].sp, g_sched_sp); }

inline void barrier_arrive(Barrier& b) {
    int g = b.gen;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        b.gen++;
        return;
    }
    while (b.gen == g) fiber_yield();
}

inline void barrier_drop(Barrier& b) {
    b.expected--;
    if (b.expected > 0 && b.arrived == b.expected) {
        b.arrived = 0;
        b.gen++;
    }
}

inline void fiber_main() {
    (*g_kernel)();
    unsigned t = g_current;
    barrier_drop(g_warps[t / 32]);
    barrier_drop(g_block);
    g_fibers[t].done = true;
    kvgate_fiber_switch(&g_fibers[t].sp, g_sched_sp);
    abort();  // never resumed
}

// A fresh fiber on `stack` whose first switch enters fiber_main (entered as if called: rsp ≡ 8 mod 16).
inline void* fiber_start(char* stack) {
    uintptr_t top = ((uintptr_t)(stack + FIBER_STACK)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;                     // fiber_main's return address (never used)
    *--sp = (void*)&fiber_main;          // popped by the switch's ret
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // rbp, rbx, r12–r15
    return sp;
}

inline float* host_dynamic_shared() { return g_dyn.data(); }
inline void __syncthreads() { barrier_arrive(g_block); }
inline void __syncwarp(unsigned = 0xffffffffu) { barrier_arrive(g_warps[threadIdx.x / 32]); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
    g_xchg[t] = (double)v;  // lossless for float and double
    barrier_arrive(g_warps[w]);
    T r = (T)g_xchg[w * 32 + (lane ^ (unsigned)o)];
    barrier_arrive(g_warps[w]);
    return r;
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

// Runs `kernel` (a callable taking no arguments) over `grid` blocks of `threads` threads (1-D blocks),
// with `smem` bytes of dynamic shared memory.
template <class F>
void launch(dim3_ grid, unsigned threads, size_t smem, F kernel) {
    std::function<void()> k = kernel;
    g_kernel = &k;
    gridDim = grid;
    blockDim = {threads, 1, 1};
    g_xchg.assign(threads, 0.0);
    while (g_stacks.size() < threads) g_stacks.push_back((char*)malloc(FIBER_STACK));
    g_fibers.assign(threads, Fiber{});
    for (unsigned z = 0; z < std::max(grid.z, 1u); z++)
        for (unsigned y = 0; y < std::max(grid.y, 1u); y++)
            for (unsigned x = 0; x < std::max(grid.x, 1u); x++) {
                blockIdx = {x, y, z};
                g_dyn.assign(smem / 4 + 1, 0.0f);
                g_block = Barrier{(int)threads, 0, 0};
                g_warps.assign((threads + 31) / 32, Barrier{});
                for (unsigned w = 0; w < g_warps.size(); w++) g_warps[w].expected = (int)std::min(32u, threads - 32 * w);
                for (unsigned t = 0; t < threads; t++) g_fibers[t] = Fiber{fiber_start(g_stacks[t]), false};
                unsigned live = threads;
                while (live > 0)
                    for (unsigned t = 0; t < threads; t++) {
                        if (g_fibers[t].done) continue;
                        g_current = t;
                        threadIdx = {t, 0, 0};
                        kvgate_fiber_switch(&g_sched_sp, g_fibers[t].sp);
                        if (g_fibers[t].done) live--;
                    }
            }
    g_kernel = nullptr;
}

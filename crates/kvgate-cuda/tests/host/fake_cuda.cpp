// A stand-in CUDA driver (libcuda.so.1) and NVRTC (libnvrtc.so.13) for tests without a GPU: the same
// binary, unchanged, loads these through cudarc's dlopen when LD_LIBRARY_PATH points at them, and every
// kernel launch runs the kernels of kernels/*.cu on the host (cuda_host.h: a fiber per CUDA thread,
// barriers for block and warp synchronisation). Device memory is host memory (a CUdeviceptr is the
// address), streams and events are synchronous, NVRTC "compiles" to a marker the module loader accepts,
// and a function is found by its kernel name. Only the entry points cudarc reaches from kvgate are here;
// anything else is a missing symbol, which cudarc reports by name.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "cuda_host.h"

namespace mk {
#include "model.cu"
}
namespace kv {
#include "kv_cache.cu"
}

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUmodule;
typedef void (*Thunk)(void** p);
struct Func {
    const char* name;
    Thunk run;
};

#define A(i, T) (*(T*)p[i])
#define F(T) A(0, T)

static void th_embed(void** p) {
    mk::embed(A(0, float*), A(1, const mk::u8*), A(2, int), A(3, mk::u64), A(4, const mk::u32*), A(5, int), A(6, float));
}
static void th_matmul(void** p) {
    mk::matmul(A(0, float*), A(1, const float*), A(2, const mk::u8*), A(3, int), A(4, mk::u64), A(5, const float*),
               A(6, int), A(7, int), A(8, int), A(9, int));
}
static void th_matmul3(void** p) {
    mk::matmul3(A(0, float*), A(1, float*), A(2, float*), A(3, const float*), A(4, const mk::u8*),
                A(5, const mk::u8*), A(6, const mk::u8*), A(7, int), A(8, int), A(9, int), A(10, mk::u64),
                A(11, mk::u64), A(12, mk::u64), A(13, const float*), A(14, const float*), A(15, const float*),
                A(16, int), A(17, int), A(18, int), A(19, int), A(20, int), A(21, int), A(22, int), A(23, int));
}
static void th_matmul_gated(void** p) {
    mk::matmul_gated(A(0, float*), A(1, const float*), A(2, const mk::u8*), A(3, const mk::u8*), A(4, int), A(5, int),
                     A(6, mk::u64), A(7, mk::u64), A(8, int), A(9, int), A(10, int), A(11, int));
}
static void th_add_rms_norm(void** p) {
    mk::add_rms_norm(A(0, float*), A(1, const float*), A(2, float*), A(3, const float*), A(4, int), A(5, float),
                     A(6, int));
}
static void th_rope_qk(void** p) {
    mk::rope_qk(A(0, float*), A(1, float*), A(2, const float*), A(3, const float*), A(4, const mk::u32*), A(5, int),
                A(6, int), A(7, int), A(8, int), A(9, int));
}
static void th_rms_norm(void** p) {
    mk::rms_norm(A(0, float*), A(1, const float*), A(2, const float*), A(3, int), A(4, float), A(5, int));
}
static void th_rms_norm_inplace(void** p) {
    mk::rms_norm_inplace(A(0, float*), A(1, const float*), A(2, int), A(3, float), A(4, int));
}
static void th_add(void** p) { mk::add(A(0, float*), A(1, const float*), A(2, mk::u64)); }
static void th_rope(void** p) {
    mk::rope(A(0, float*), A(1, const float*), A(2, const float*), A(3, const mk::u32*), A(4, int), A(5, int),
             A(6, int), A(7, int));
}
static void th_gated_act(void** p) { mk::gated_act(A(0, float*), A(1, const float*), A(2, mk::u64), A(3, int)); }
static void th_softcap(void** p) { mk::softcap(A(0, float*), A(1, mk::u64), A(2, float)); }
static void th_gather_rows(void** p) {
    mk::gather_rows(A(0, float*), A(1, const float*), A(2, const mk::u32*), A(3, int));
}
static void th_logprobs(void** p) {
    mk::logprobs(A(0, float*), A(1, const float*), A(2, int), A(3, const mk::u32*), A(4, const mk::u32*));
}
#define STORE16(name, T)                                                                                 \
    static void th_##name(void** p) {                                                                    \
        kv::name(A(0, const float*), A(1, const kv::i64*), A(2, T*), A(3, int), A(4, int), A(5, int), A(6, int)); \
    }
STORE16(store_f32, float)
STORE16(store_f16, kv::u16)
STORE16(store_bf16, kv::u16)
static void th_store_fp8(void** p) {
    kv::store_fp8(A(0, const float*), A(1, const kv::i64*), A(2, kv::u8*), A(3, float), A(4, int), A(5, int),
                  A(6, int), A(7, int), A(8, int));
}
static void th_store_nvfp4(void** p) {
    kv::store_nvfp4(A(0, const float*), A(1, const kv::i64*), A(2, kv::u8*), A(3, float), A(4, int), A(5, int),
                    A(6, int), A(7, int));
}
static void th_store_quant(void** p) {
    kv::store_quant(A(0, const float*), A(1, const kv::i64*), A(2, kv::u8*), A(3, float), A(4, int), A(5, int),
                    A(6, int), A(7, float), A(8, const float*), A(9, int), A(10, int), A(11, int), A(12, int),
                    A(13, int));
}
#define ATTN(name)                                                                                         \
    static void th_##name(void** p) {                                                                      \
        kv::name(A(0, float*), A(1, const float*), A(2, const kv::u8*), A(3, const kv::u8*), A(4, const int*), \
                 A(5, int), A(6, const int*), A(7, int), A(8, int), A(9, int), A(10, int), A(11, float),      \
                 A(12, float), A(13, float), A(14, int), A(15, int), A(16, float), A(17, const float*),       \
                 A(18, int), A(19, float), A(20, int), A(21, float*), A(22, int), A(23, const int*),           \
                 A(24, const unsigned long long*));                                                           \
    }
ATTN(paged_attention_f32)
ATTN(paged_attention_f16)
ATTN(paged_attention_bf16)
ATTN(paged_attention_e4m3)
ATTN(paged_attention_e5m2)
ATTN(paged_attention_nvfp4)
static void th_attention_merge(void** p) {
    kv::attention_merge(A(0, float*), A(1, const float*), A(2, const int*), A(3, int), A(4, int), A(5, int),
                        A(6, int), A(7, int), A(8, int), A(9, float), A(10, const float*), A(11, int));
}

#define K(n) {#n, th_##n}
static Func FUNCS[] = {K(embed), K(matmul), K(matmul3), K(matmul_gated), K(add_rms_norm), K(rope_qk), K(rms_norm), K(rms_norm_inplace), K(add), K(rope), K(gated_act),
                       K(softcap), K(gather_rows), K(logprobs), K(store_f32), K(store_f16), K(store_bf16),
                       K(store_fp8), K(store_nvfp4), K(store_quant), K(paged_attention_f32),
                       K(paged_attention_f16), K(paged_attention_bf16), K(paged_attention_e4m3),
                       K(paged_attention_e5m2), K(paged_attention_nvfp4), K(attention_merge)};

static int g_ctx, g_module, g_stream, g_event;
static size_t g_allocated;
static std::map<CUdeviceptr, size_t> g_allocs;
static const size_t TOTAL_MEM = (size_t)4 << 30;

static CUresult alloc(CUdeviceptr* d, size_t n) {
    void* m = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    if (!m) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
    *d = (CUdeviceptr)m;
    g_allocs[*d] = n;
    g_allocated += n;
    return 0;
}
static CUresult release(CUdeviceptr d) {
    auto it = g_allocs.find(d);
    if (it != g_allocs.end()) {
        g_allocated -= it->second;
        g_allocs.erase(it);
        free((void*)d);
    }
    return 0;
}

extern "C" {
CUresult cuInit(unsigned) { return 0; }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int* n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char* name, int len, CUdevice) { snprintf(name, len, "kvgate emulated device (host fibers)"); return 0; }
CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice) {
    *v = attr == 75 ? 9 : attr == 76 ? 0 : 0;  // compute capability 9.0; no memory pools, nothing else
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* b, CUdevice) { *b = TOTAL_MEM; return 0; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) { *c = &g_ctx; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return 0; }
CUresult cuCtxSetCurrent(CUcontext) { return 0; }
CUresult cuCtxGetCurrent(CUcontext* c) { *c = &g_ctx; return 0; }
CUresult cuCtxPushCurrent_v2(CUcontext) { return 0; }
CUresult cuCtxPopCurrent_v2(CUcontext* c) { if (c) *c = &g_ctx; return 0; }
CUresult cuCtxSynchronize() { return 0; }
CUresult cuCtxGetDevice(CUdevice* d) { *d = 0; return 0; }
CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total) {
    *total = TOTAL_MEM;
    *free_b = TOTAL_MEM > g_allocated ? TOTAL_MEM - g_allocated : 0;
    return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr* d, size_t n) { return alloc(d, n); }
CUresult cuMemAllocAsync(CUdeviceptr* d, size_t n, CUstream) { return alloc(d, n); }
CUresult cuMemFree_v2(CUdeviceptr d) { return release(d); }
CUresult cuMemFreeAsync(CUdeviceptr d, CUstream) { return release(d); }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) { memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, CUstream) { memcpy((void*)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) { memcpy(d, (const void*)s, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, CUstream) { memcpy(d, (const void*)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) { memmove((void*)d, (const void*)s, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream) { memmove((void*)d, (const void*)s, n); return 0; }
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void*)d, v, n); return 0; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream) { memset((void*)d, v, n); return 0; }
CUresult cuStreamCreate(CUstream* s, unsigned) { *s = &g_stream; return 0; }
CUresult cuStreamCreateWithPriority(CUstream* s, unsigned, int) { *s = &g_stream; return 0; }
CUresult cuStreamDestroy_v2(CUstream) { return 0; }
CUresult cuStreamSynchronize(CUstream) { return 0; }
CUresult cuStreamQuery(CUstream) { return 0; }
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return 0; }
CUresult cuEventCreate(CUevent* e, unsigned) { *e = &g_event; return 0; }
CUresult cuEventDestroy_v2(CUevent) { return 0; }
CUresult cuEventRecord(CUevent, CUstream) { return 0; }
CUresult cuEventSynchronize(CUevent) { return 0; }
CUresult cuEventQuery(CUevent) { return 0; }
CUresult cuEventElapsedTime(float* ms, CUevent, CUevent) { *ms = 1.0f; return 0; }
CUresult cuEventElapsedTime_v2(float* ms, CUevent, CUevent) { *ms = 1.0f; return 0; }
CUresult cuModuleLoadData(CUmodule* m, const void*) { *m = &g_module; return 0; }
CUresult cuModuleUnload(CUmodule) { return 0; }
CUresult cuModuleGetFunction(void** f, CUmodule, const char* name) {
    for (auto& k : FUNCS)
        if (strcmp(k.name, name) == 0) {
            *f = &k;
            return 0;
        }
    return 500;  // CUDA_ERROR_NOT_FOUND
}
CUresult cuFuncSetAttribute(void*, int, int) { return 0; }
CUresult cuFuncGetAttribute(int* v, int, void*) { *v = 0; return 0; }
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream, void** params, void**) {
    if (by != 1 || bz != 1) return 1;  // the kernels use 1-D blocks
    Func* k = (Func*)f;
    launch({gx, gy, gz}, bx, smem, [&] { k->run(params); });
    return 0;
}
CUresult cuGetErrorString(CUresult, const char** s) { *s = "emulated device error"; return 0; }
CUresult cuGetErrorName(CUresult, const char** s) { *s = "CUDA_ERROR_EMULATED"; return 0; }

// NVRTC: a program is its name; the "CUBIN" an ELF-marked blob the module loader ignores.
typedef int nvrtcResult;
static const char CUBIN[] = "\x7f" "ELF kvgate emulated module";
// a version no real NVRTC has, so an emulated "CUBIN" can never be cached under a real one's key
nvrtcResult nvrtcVersion(int* major, int* minor) { *major = 13; *minor = 99; return 0; }
nvrtcResult nvrtcCreateProgram(void** prog, const char*, const char*, int, const char* const*, const char* const*) {
    *prog = (void*)CUBIN;
    return 0;
}
nvrtcResult nvrtcCompileProgram(void*, int, const char* const*) { return 0; }
nvrtcResult nvrtcDestroyProgram(void** prog) { *prog = nullptr; return 0; }
nvrtcResult nvrtcGetProgramLogSize(void*, size_t* n) { *n = 1; return 0; }
nvrtcResult nvrtcGetProgramLog(void*, char* log) { log[0] = 0; return 0; }
nvrtcResult nvrtcGetCUBINSize(void*, size_t* n) { *n = sizeof(CUBIN); return 0; }
nvrtcResult nvrtcGetCUBIN(void*, char* out) { memcpy(out, CUBIN, sizeof(CUBIN)); return 0; }
nvrtcResult nvrtcGetPTXSize(void*, size_t* n) { *n = sizeof(CUBIN); return 0; }
nvrtcResult nvrtcGetPTX(void*, char* out) { memcpy(out, CUBIN, sizeof(CUBIN)); return 0; }
const char* nvrtcGetErrorString(nvrtcResult) { return "emulated NVRTC error"; }
}

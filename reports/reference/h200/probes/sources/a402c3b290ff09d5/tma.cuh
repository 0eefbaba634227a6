// perfscope: the TMA, mbarrier and packing helpers that hopper.cu and blackwell.cu share.
//
// Every wrapper is one PTX instruction (PTX ISA 9.0: "cp.async.bulk.tensor", "mbarrier",
// "Parallel Synchronization and Communication Instructions: fence"); nothing here is
// specific to one stage. Written for perfscope from the PTX ISA; no code is taken from
// CUTLASS or other libraries.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// CUtensorMap without <cuda.h>: the driver fills 128 opaque bytes, 64-byte aligned.
// Kernels take it by value as a `const __grid_constant__` parameter, so the TMA unit
// reads it from parameter memory (the host encodes it with cuTensorMapEncodeTiled).
struct alignas(64) TensorMap2D {
    unsigned long long opaque[16];
};

namespace tma {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------- mbarriers
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA, tensor cores) and the cluster.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arms the barrier for `bytes` of TMA traffic and counts the caller's arrival.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Arrives on the mbarrier at offset `bar` of CTA `cta` of this cluster (this one too).
// Default semantics (release at CTA scope): the caller only signals that its wgmmas have
// finished reading a slot; a cluster-scope release would add a GPU-wide MEMBAR per arrive.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned cta) {
    asm volatile(
        "{\n"
        ".reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
        "}\n" :: "r"(bar), "r"(cta) : "memory");
}
// Spins until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}

// -------------------------------------------------------------------- clusters
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// Every thread of every CTA of the cluster: writes before it are visible after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// ------------------------------------------------------------------------- TMA
__device__ __forceinline__ void prefetch_tmap(const TensorMap2D* tmap) {
    asm volatile("prefetch.tensormap [%0];\n"
                 :: "l"(reinterpret_cast<unsigned long long>(tmap)) : "memory");
}
// 2-D tile load into shared memory, completing on `bar` (complete_tx::bytes).
// Coordinates are innermost first: (column, row) of the box's first element; parts of
// the box outside the tensor arrive as zeros and still count towards the bytes.
__device__ __forceinline__ void load_2d(unsigned dst, const TensorMap2D* tmap, unsigned bar,
                                        int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(x), "r"(y)
        : "memory");
}
// The same load for every CTA of the cluster in ctaMask: the box lands at offset `dst` of
// each one's shared memory and completes on the mbarrier at offset `bar` of each.
__device__ __forceinline__ void load_2d_multicast(unsigned dst, const TensorMap2D* tmap,
                                                  unsigned bar, int x, int y,
                                                  unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(bar), "r"(x), "r"(y),
           "h"(cta_mask)
        : "memory");
}
// 2-D tile store from shared memory; rows and columns outside the tensor are not written.
__device__ __forceinline__ void store_2d(const TensorMap2D* tmap, unsigned src, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
        :: "l"(reinterpret_cast<unsigned long long>(tmap)), "r"(src), "r"(x), "r"(y)
        : "memory");
}
__device__ __forceinline__ void store_commit() {
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until at most N committed store groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
// Waits until every committed store group has completed (its writes are performed).
__device__ __forceinline__ void store_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Orders this thread's ordinary shared-memory writes before later async-proxy reads
// (a TMA store or wgmma reading what st.shared wrote).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ------------------------------------------------------------------- packing
template <typename T> struct Pack;
template <> struct Pack<__half> {
    static __device__ __forceinline__ unsigned two(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};
template <> struct Pack<__nv_bfloat16> {
    static __device__ __forceinline__ unsigned two(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};

}  // namespace tma

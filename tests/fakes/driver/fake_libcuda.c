/* A stand-in for libcuda.so.1, for the CPU tests of perfscope/native/mapcapture.c.
 *
 * It implements the entry points the capture library wraps or asks for, with the ABI of
 * cuda.h: cuGetProcAddress_v2 (the per-thread-stream launch variants are functions of
 * their own, as in the driver), cuTensorMapEncodeTiled (the 128 bytes are a function of
 * every argument, so two maps differ where their arguments do), cuTensorMapReplaceAddress,
 * cuLaunchKernel[_ptsz], cuLaunchKernelEx[_ptsz] (which count the launches they are
 * handed), cuFuncGetName and cuFuncGetParamInfo (read from a FakeFunction).
 */
#include <stdint.h>
#include <string.h>

#include "fake_cuda.h"

int fake_launches;   /* launches that reached this driver */

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull; }

int cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, uint32_t rank, void *address,
                           const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                           const uint32_t *elem_strides, int interleave, int swizzle, int l2,
                           int oob)
{
    if (!map || rank == 0 || rank > 5) return 1;   /* CUDA_ERROR_INVALID_VALUE */
    uint64_t h = 0xcbf29ce484222325ull;
    h = mix(mix(mix(h, (uint64_t)dtype), rank), (uint64_t)(uintptr_t)address);
    for (uint32_t i = 0; i < rank; i++) {
        h = mix(mix(mix(h, dims[i]), box[i]), elem_strides[i]);
        if (i + 1 < rank) h = mix(h, strides[i]);
    }
    h = mix(mix(mix(mix(h, (uint64_t)interleave), (uint64_t)swizzle), (uint64_t)l2), (uint64_t)oob);
    map->opaque[0] = (uint64_t)(uintptr_t)address;
    for (int i = 1; i < 16; i++) map->opaque[i] = h = mix(h, (uint64_t)i);
    return 0;
}

int cuTensorMapReplaceAddress(CUtensorMap *map, void *address)
{
    map->opaque[0] = (uint64_t)(uintptr_t)address;
    return 0;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void *stream, void **params, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)stream;
    (void)params, (void)extra;
    fake_launches++;
    return f ? 0 : 400;   /* CUDA_ERROR_INVALID_HANDLE */
}

int cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                        void **extra)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
}

int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra)
{
    (void)params, (void)extra;
    fake_launches++;
    return config && f ? 0 : 400;
}

int cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, void *f, void **params, void **extra)
{
    return cuLaunchKernelEx(config, f, params, extra);
}

int cuFuncGetName(const char **name, void *f)
{
    if (!name || !f) return 1;
    *name = ((FakeFunction *)f)->name;
    return 0;
}

int cuFuncGetParamInfo(void *f, size_t index, size_t *offset, size_t *size)
{
    FakeFunction *fn = f;
    if (!fn || index >= fn->nparams) return 1;
    size_t at = 0;
    for (size_t i = 0; i <= index; i++) {
        size_t align = fn->sizes[i] >= 128 ? 64 : fn->sizes[i];
        at = (at + align - 1) / align * align;
        if (i < index) at += fn->sizes[i];
    }
    *offset = at;
    *size = fn->sizes[index];
    return 0;
}

int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status)
{
    (void)version;
    const int ptds = (flags & 2) != 0;
    static const struct { const char *name; void *fn, *ptsz; } table[] = {
        {"cuTensorMapEncodeTiled", (void *)cuTensorMapEncodeTiled, 0},
        {"cuTensorMapReplaceAddress", (void *)cuTensorMapReplaceAddress, 0},
        {"cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
        {"cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
        {"cuFuncGetName", (void *)cuFuncGetName, 0},
        {"cuFuncGetParamInfo", (void *)cuFuncGetParamInfo, 0},
        {"cuGetProcAddress", (void *)cuGetProcAddress_v2, 0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (!strcmp(symbol, table[i].name)) {
            *pfn = ptds && table[i].ptsz ? table[i].ptsz : table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    }
    *pfn = 0;
    if (status) *status = 1;   /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return 500;                /* CUDA_ERROR_NOT_FOUND */
}

/* mapcapture: record the tensor maps a program encodes and the launches that pass them.
 *
 * Nsight Compute records no tensor map, so a report cannot say how a kernel's TMA boxes lay
 * over its operands. `perfscope profile --tensor-maps -- COMMAND` preloads this library
 * into the program (LD_PRELOAD, after whatever the program preloads); it watches the
 * driver entry points a program reaches, however it reaches them:
 *   - dlsym(handle, "cuX")            (ctypes, Triton's launcher, cudart's loader)
 *   - cuGetProcAddress("cuX", ...)    (cudart, cuda-bindings, CUTLASS)
 *   - a direct call to an exported cuX (a program linked against libcuda)
 * and hands back its own wrappers of cuTensorMapEncodeTiled, cuTensorMapReplaceAddress,
 * cuLaunchKernel and cuLaunchKernelEx, which call the driver's and remember.
 *
 * Each encode is kept (its 128 bytes and its arguments) in a ring of the most recent
 * ones. At each launch the kernel's parameters are scanned, at the 64-byte alignment a
 * CUtensorMap has in the parameter space, for the bytes of a kept map: a map passed by
 * value (__grid_constant__), alone or inside a struct. A match writes one JSON line per
 * launch, and the map's arguments once, to $PERFSCOPE_TENSOR_MAPS:
 *   {"pid":P,"encode":E,"dtype":9,"rank":2,"dims":[..],"strides":[..],"box":[..],...}
 *   {"pid":P,"launch":L,"kernel":"_Z...","grid":[..],"block":[..],"maps":[[param,offset,E]]}
 * A map the kernel reads through a pointer to device memory (copied there by the
 * program) is not seen. The driver's results are returned unchanged; the library never
 * fails a call it wraps. Written for perfscope; types are declared here so that it builds
 * with a plain C compiler and no CUDA headers (their ABI is cuda.h's, CUDA 12.4-13.0).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef struct { _Alignas(64) uint64_t opaque[16]; } CUtensorMap;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

typedef CUresult (*encode_fn)(CUtensorMap *, int, uint32_t, void *, const uint64_t *,
                              const uint64_t *, const uint32_t *, const uint32_t *, int, int,
                              int, int);
typedef CUresult (*replace_fn)(CUtensorMap *, void *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*getproc_fn)(const char *, void **, int, uint64_t, int *);
typedef CUresult (*getproc_v1_fn)(const char *, void **, int, uint64_t);
typedef CUresult (*name_fn)(const char **, CUfunction);
typedef CUresult (*param_fn)(CUfunction, size_t, size_t *, size_t *);
typedef void *(*dlsym_fn)(void *, const char *);

#define MAP_BYTES 128
#define MAP_ALIGN 64
#define RING 1024          /* encodes kept for matching */
#define MAX_PARAMS 1024    /* the parameter space holds at most 32 KB */
#define MAX_MATCHES 16     /* maps reported per launch */
#define MAX_LINES 20000    /* launch lines per process, then one "truncated" line */
#define MAX_RANK 5

typedef struct {
    CUtensorMap map;
    long id;               /* 0: empty */
    int written;
    int dtype, interleave, swizzle, l2, oob;
    uint32_t rank;
    uint64_t address;
    uint64_t dims[MAX_RANK], strides[MAX_RANK];
    uint32_t box[MAX_RANK], elem_strides[MAX_RANK];
} Encode;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Encode ring[RING];
static long encodes, launches, lines;
static FILE *out;
static int out_failed;

static dlsym_fn real_dlsym_fn;
static void *cuda_handle;            /* the handle a driver symbol was first found in */
static getproc_fn real_getproc;
static getproc_v1_fn real_getproc_v1;
static encode_fn real_encode;
static replace_fn real_replace;
static name_fn real_name;
static param_fn real_param;
static int resolved_info;
/* Set while a wrapper is in the driver: a driver that calls its own exports through the
 * PLT reaches this library's again, and one call is recorded once. */
static __thread int inside;

/* Two slots per launch entry point: the legacy-stream and the per-thread-stream variants
 * (or any two distinct driver pointers a program is handed for one name). */
static launch_fn real_launch[2];
static launch_ex_fn real_launch_ex[2];

static void *real_dlsym(void *handle, const char *symbol)
{
    if (!real_dlsym_fn) {
        real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!real_dlsym_fn) real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (!real_dlsym_fn) real_dlsym_fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    }
    return real_dlsym_fn ? real_dlsym_fn(handle, symbol) : NULL;
}

static void *driver_symbol(const char *symbol)
{
    void *p = NULL;
    if (real_getproc && real_getproc(symbol, &p, 12040, 0, NULL) == 0 && p) return p;
    if (cuda_handle && (p = real_dlsym(cuda_handle, symbol))) return p;
    return real_dlsym(RTLD_NEXT, symbol);
}

static FILE *output(void)
{
    if (!out && !out_failed) {
        const char *path = getenv("PERFSCOPE_TENSOR_MAPS");
        out = path ? fopen(path, "a") : NULL;
        out_failed = out == NULL;
    }
    return out;
}

static void write_u64s(FILE *f, const char *key, const uint64_t *v, uint32_t n)
{
    fprintf(f, ",\"%s\":[", key);
    for (uint32_t i = 0; i < n; i++) fprintf(f, i ? ",%llu" : "%llu", (unsigned long long)v[i]);
    fputc(']', f);
}

static void write_u32s(FILE *f, const char *key, const uint32_t *v, uint32_t n)
{
    fprintf(f, ",\"%s\":[", key);
    for (uint32_t i = 0; i < n; i++) fprintf(f, i ? ",%u" : "%u", v[i]);
    fputc(']', f);
}

static void write_encode(FILE *f, Encode *e)
{
    fprintf(f, "{\"pid\":%d,\"encode\":%ld,\"dtype\":%d,\"rank\":%u,\"address\":\"0x%llx\"",
            (int)getpid(), e->id, e->dtype, e->rank, (unsigned long long)e->address);
    write_u64s(f, "dims", e->dims, e->rank);
    write_u64s(f, "strides", e->strides, e->rank ? e->rank - 1 : 0);
    write_u32s(f, "box", e->box, e->rank);
    write_u32s(f, "elem_strides", e->elem_strides, e->rank);
    fprintf(f, ",\"interleave\":%d,\"swizzle\":%d,\"l2\":%d,\"oob\":%d}\n", e->interleave,
            e->swizzle, e->l2, e->oob);
    e->written = 1;
}

static Encode *find(const void *bytes)
{
    for (int i = 0; i < RING; i++)
        if (ring[i].id && memcmp(&ring[i].map, bytes, MAP_BYTES) == 0) return &ring[i];
    return NULL;
}

typedef struct { size_t param, offset; Encode *e; } Match;

static int scan(const unsigned char *bytes, size_t size, size_t param, Match *m, int n)
{
    for (size_t off = 0; off + MAP_BYTES <= size && n < MAX_MATCHES; off += MAP_ALIGN) {
        Encode *e = find(bytes + off);
        if (e) m[n++] = (Match){param, off, e};
    }
    return n;
}

/* The launch's parameters, as kernelParams (one pointer per parameter, sizes from the
 * driver) or as extra's single buffer. */
static int matches(CUfunction f, void **params, void **extra, Match *m)
{
    int n = 0;
    if (params && real_param) {
        for (size_t i = 0; i < MAX_PARAMS; i++) {
            size_t offset = 0, size = 0;
            if (real_param(f, i, &offset, &size) != 0) break;
            if (size >= MAP_BYTES && params[i]) n = scan(params[i], size, i, m, n);
        }
    } else if (extra) {
        const unsigned char *buf = NULL;
        size_t size = 0;
        for (int i = 0; extra[i] && i < 8; i += 2) {
            if (extra[i] == (void *)1) buf = extra[i + 1];
            else if (extra[i] == (void *)2 && extra[i + 1]) size = *(size_t *)extra[i + 1];
        }
        if (buf) n = scan(buf, size, 0, m, n);
    }
    return n;
}

static void record_launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                          void **params, void **extra)
{
    pthread_mutex_lock(&lock);
    long index = launches++;
    if (!resolved_info) {
        real_name = (name_fn)driver_symbol("cuFuncGetName");
        real_param = (param_fn)driver_symbol("cuFuncGetParamInfo");
        resolved_info = 1;
    }
    Match m[MAX_MATCHES];
    int n = encodes ? matches(f, params, extra, m) : 0;
    FILE *o = n ? output() : NULL;
    if (o && lines <= MAX_LINES) {
        if (lines++ == MAX_LINES) {
            fprintf(o, "{\"pid\":%d,\"truncated\":%ld}\n", (int)getpid(), index);
        } else {
            const char *name = "";
            if (!real_name || real_name(&name, f) != 0 || !name) name = "";
            for (int i = 0; i < n; i++)
                if (!m[i].e->written) write_encode(o, m[i].e);
            fprintf(o, "{\"pid\":%d,\"launch\":%ld,\"kernel\":\"", (int)getpid(), index);
            for (const char *c = name; *c; c++)   /* mangled names are plain ASCII */
                if (*c != '"' && *c != '\\' && (unsigned char)*c >= 0x20) fputc(*c, o);
            fprintf(o, "\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"maps\":[", grid[0],
                    grid[1], grid[2], block[0], block[1], block[2]);
            for (int i = 0; i < n; i++)
                fprintf(o, i ? ",[%zu,%zu,%ld]" : "[%zu,%zu,%ld]", m[i].param, m[i].offset,
                        m[i].e->id);
            fputs("]}\n", o);
        }
        fflush(o);
    }
    pthread_mutex_unlock(&lock);
}

/* ------------------------------------------------------------------ the wrappers */

static CUresult encode_wrapper(CUtensorMap *map, int dtype, uint32_t rank, void *address,
                               const uint64_t *dims, const uint64_t *strides,
                               const uint32_t *box, const uint32_t *elem_strides,
                               int interleave, int swizzle, int l2, int oob)
{
    if (!real_encode) real_encode = (encode_fn)driver_symbol("cuTensorMapEncodeTiled");
    if (!real_encode) return 999;   /* CUDA_ERROR_UNKNOWN: there is no driver to call */
    inside++;
    CUresult r = real_encode(map, dtype, rank, address, dims, strides, box, elem_strides,
                             interleave, swizzle, l2, oob);
    inside--;
    if (r != 0 || inside || rank == 0 || rank > MAX_RANK) return r;
    pthread_mutex_lock(&lock);
    Encode *e = &ring[encodes % RING];
    memset(e, 0, sizeof *e);
    memcpy(&e->map, map, MAP_BYTES);
    e->id = ++encodes;
    e->dtype = dtype, e->interleave = interleave, e->swizzle = swizzle, e->l2 = l2, e->oob = oob;
    e->rank = rank;
    e->address = (uint64_t)(uintptr_t)address;
    for (uint32_t i = 0; i < rank; i++) {
        e->dims[i] = dims[i];
        e->box[i] = box[i];
        e->elem_strides[i] = elem_strides ? elem_strides[i] : 1;
        if (i + 1 < rank) e->strides[i] = strides[i];
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult replace_wrapper(CUtensorMap *map, void *address)
{
    if (!real_replace) real_replace = (replace_fn)driver_symbol("cuTensorMapReplaceAddress");
    if (!real_replace) return 999;
    CUtensorMap before;
    memcpy(&before, map, MAP_BYTES);
    inside++;
    CUresult r = real_replace(map, address);
    inside--;
    if (r != 0 || inside) return r;
    pthread_mutex_lock(&lock);
    Encode *e = find(&before);
    if (e) {   /* the same geometry over other memory: the map keeps its identity */
        memcpy(&e->map, map, MAP_BYTES);
        e->address = (uint64_t)(uintptr_t)address;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

#define LAUNCH_WRAPPER(slot)                                                                  \
    static CUresult launch_wrapper##slot(CUfunction f, unsigned gx, unsigned gy, unsigned gz,  \
                                         unsigned bx, unsigned by, unsigned bz, unsigned smem, \
                                         CUstream s, void **params, void **extra)              \
    {                                                                                         \
        unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};                             \
        if (!inside) record_launch(f, grid, block, params, extra);                            \
        inside++;                                                                             \
        CUresult r = real_launch[slot](f, gx, gy, gz, bx, by, bz, smem, s, params, extra);    \
        inside--;                                                                             \
        return r;                                                                             \
    }                                                                                         \
    static CUresult launch_ex_wrapper##slot(const CUlaunchConfig *c, CUfunction f,            \
                                            void **params, void **extra)                      \
    {                                                                                         \
        if (c && !inside) {                                                                   \
            unsigned grid[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};                       \
            unsigned block[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};                   \
            record_launch(f, grid, block, params, extra);                                     \
        }                                                                                     \
        inside++;                                                                             \
        CUresult r = real_launch_ex[slot](c, f, params, extra);                               \
        inside--;                                                                             \
        return r;                                                                             \
    }
LAUNCH_WRAPPER(0)
LAUNCH_WRAPPER(1)

static void *slot_of(void **slots, void *real, void *w0, void *w1)
{
    if (real == w0 || real == w1) return real;   /* already ours */
    for (int i = 0; i < 2; i++) {
        if (!slots[i]) slots[i] = real;
        if (slots[i] == real) return i ? w1 : w0;
    }
    return real;   /* a third variant: handed back unwatched */
}

static CUresult getproc_wrapper(const char *, void **, int, uint64_t, int *);
static CUresult getproc_v1_wrapper(const char *, void **, int, uint64_t);

static int exported(void *p);

/* The wrapper for a driver symbol found at real (or real itself, for any other symbol). */
static void *wrap(const char *symbol, void *real)
{
    if (!real || !symbol || strncmp(symbol, "cu", 2) != 0) return real;
    /* A driver whose own table names its exports through the PLT hands out this library's
     * functions as its own: the driver's are then found past this library. */
    if (exported(real) && !(real = real_dlsym(RTLD_NEXT, symbol))) return NULL;
    void *w = real;
    pthread_mutex_lock(&lock);
    if (!strcmp(symbol, "cuTensorMapEncodeTiled")) {
        if (real != (void *)encode_wrapper) real_encode = (encode_fn)real;
        w = (void *)encode_wrapper;
    } else if (!strcmp(symbol, "cuTensorMapReplaceAddress")) {
        if (real != (void *)replace_wrapper) real_replace = (replace_fn)real;
        w = (void *)replace_wrapper;
    } else if (!strncmp(symbol, "cuLaunchKernelEx", 16) && (!symbol[16] || !strcmp(symbol + 16, "_ptsz"))) {
        w = slot_of((void **)real_launch_ex, real, (void *)launch_ex_wrapper0, (void *)launch_ex_wrapper1);
    } else if (!strncmp(symbol, "cuLaunchKernel", 14) && (!symbol[14] || !strcmp(symbol + 14, "_ptsz"))) {
        w = slot_of((void **)real_launch, real, (void *)launch_wrapper0, (void *)launch_wrapper1);
    } else if (!strcmp(symbol, "cuGetProcAddress_v2") || !strcmp(symbol, "cuGetProcAddress_v2_ptsz")) {
        if (real != (void *)getproc_wrapper) real_getproc = (getproc_fn)real;
        w = (void *)getproc_wrapper;
    } else if (!strcmp(symbol, "cuGetProcAddress")) {
        if (real != (void *)getproc_v1_wrapper) real_getproc_v1 = (getproc_v1_fn)real;
        w = (void *)getproc_v1_wrapper;
    }
    pthread_mutex_unlock(&lock);
    return w;
}

/* cuGetProcAddress's names carry no _v2 or _ptsz; the symbol asked for "cuGetProcAddress"
 * through it is the version-2 function from CUDA 12.0 on (the ABI of the caller's version). */
static CUresult getproc_wrapper(const char *symbol, void **pfn, int version, uint64_t flags,
                                int *status)
{
    CUresult r = real_getproc(symbol, pfn, version, flags, status);
    if (r == 0 && pfn && *pfn && symbol) {
        if (!strcmp(symbol, "cuGetProcAddress"))
            *pfn = wrap(version >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress", *pfn);
        else
            *pfn = wrap(symbol, *pfn);
    }
    return r;
}

static CUresult getproc_v1_wrapper(const char *symbol, void **pfn, int version, uint64_t flags)
{
    CUresult r = real_getproc_v1(symbol, pfn, version, flags);
    if (r == 0 && pfn && *pfn && symbol) {
        if (!strcmp(symbol, "cuGetProcAddress"))
            *pfn = wrap(version >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress", *pfn);
        else
            *pfn = wrap(symbol, *pfn);
    }
    return r;
}

/* A forked child writes under its own pid: the maps its parent described are described
 * again, under that pid, when the child first passes them. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < RING; i++) ring[i].written = 0;
    lines = 0;
}

__attribute__((constructor)) static void init(void)
{
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* ------------------------------------------------------------------ exported entry points */

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *symbol)
{
    /* RTLD_NEXT is resolved after this library, not after its caller: the wrapper puts it
     * last in LD_PRELOAD, so an interposer preloaded before it still reaches what follows.
     * (Walking the objects after the caller with dlopen(RTLD_NOLOAD) hung under ncu on the
     * H200: its injection looks symbols up while it holds its own locks.) */
    void *p = real_dlsym(handle, symbol);
    if (p && symbol[0] == 'c' && symbol[1] == 'u') {
        void *w = wrap(symbol, p);
        if (w != p && !cuda_handle && handle != RTLD_NEXT && handle != RTLD_DEFAULT)
            cuda_handle = handle;
        return w;
    }
    return p;
}

/* A program linked against libcuda resolves these to the library preloaded first. */
CUresult cuTensorMapEncodeTiled(CUtensorMap *, int, uint32_t, void *, const uint64_t *,
                                const uint64_t *, const uint32_t *, const uint32_t *, int, int,
                                int, int);
CUresult cuTensorMapReplaceAddress(CUtensorMap *, void *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuGetProcAddress_v2(const char *, void **, int, uint64_t, int *);

static int exported(void *p)
{
    return p == (void *)cuTensorMapEncodeTiled || p == (void *)cuTensorMapReplaceAddress ||
           p == (void *)cuLaunchKernel || p == (void *)cuLaunchKernelEx ||
           p == (void *)cuGetProcAddress_v2;
}

__attribute__((visibility("default"))) CUresult
cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, uint32_t rank, void *address,
                       const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                       const uint32_t *elem_strides, int interleave, int swizzle, int l2, int oob)
{
    return encode_wrapper(map, dtype, rank, address, dims, strides, box, elem_strides,
                          interleave, swizzle, l2, oob);
}

__attribute__((visibility("default"))) CUresult cuTensorMapReplaceAddress(CUtensorMap *map, void *address)
{
    return replace_wrapper(map, address);
}

__attribute__((visibility("default"))) CUresult
cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
               unsigned bz, unsigned smem, CUstream s, void **params, void **extra)
{
    /* Resolved once: the driver's function, and this library's wrapper of it. */
    static launch_fn w;
    if (!w) {
        void *real = real_dlsym(RTLD_NEXT, "cuLaunchKernel");
        if (!real) return 999;
        w = (launch_fn)wrap("cuLaunchKernel", real);
    }
    return w(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}

__attribute__((visibility("default"))) CUresult
cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    static launch_ex_fn w;
    if (!w) {
        void *real = real_dlsym(RTLD_NEXT, "cuLaunchKernelEx");
        if (!real) return 999;
        w = (launch_ex_fn)wrap("cuLaunchKernelEx", real);
    }
    return w(c, f, params, extra);
}

__attribute__((visibility("default"))) CUresult
cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status)
{
    if (!real_getproc) real_getproc = (getproc_fn)real_dlsym(RTLD_NEXT, "cuGetProcAddress_v2");
    if (!real_getproc) return 999;
    return getproc_wrapper(symbol, pfn, version, flags, status);
}

/* A program for the CPU tests of perfscope/native/mapcapture.c, run against the stand-in
 * driver (fake_libcuda.c), which it is also linked against.
 *
 *   map_app LIBCUDA [NAME GRIDX GRIDY BLOCKX]
 *
 * It reaches the driver the three ways programs do (dlsym on a dlopen handle, the
 * functions cuGetProcAddress hands out, a direct call to a linked symbol) and launches:
 *   1. NAME (default _Z2k1) on GRIDX x GRIDY blocks of BLOCKX threads (128 x 1 of 128),
 *      maps A and B by value, legacy stream
 *   2. _Z2k2 by cuLaunchKernelEx (per-thread stream), map B at byte 64 of a struct
 *   3. _Z2k3 with no map
 *   4. NAME again, after map A was moved to other memory (cuTensorMapReplaceAddress)
 *   5. _Z2k4 with its parameters in one extra buffer, map B at byte 128
 *   6. _Z2k5 through the linked cuLaunchKernel, map D (encoded by the linked symbol)
 *   7. NAME once more, from a forked child
 * Map C is encoded and never passed. It prints "launches N": those the driver received in
 * the parent process.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

typedef int (*encode_fn)(CUtensorMap *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                         const uint32_t *, const uint32_t *, int, int, int, int);
typedef int (*replace_fn)(CUtensorMap *, void *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
typedef int (*launch_ex_fn)(const CUlaunchConfig *, void *, void **, void **);
typedef int (*getproc_fn)(const char *, void **, int, uint64_t, int *);

/* The linked driver's own symbols (resolved to the preloaded library when there is one). */
int cuTensorMapEncodeTiled(CUtensorMap *, int, uint32_t, void *, const uint64_t *,
                           const uint64_t *, const uint32_t *, const uint32_t *, int, int, int, int);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   void *, void **, void **);

#define CHECK(x) do { if ((x) != 0) { fprintf(stderr, "failed: %s\n", #x); return 1; } } while (0)

enum { BF16 = 9, SWIZZLE_128B = 3, L2_256B = 3 };

static int encode(encode_fn f, CUtensorMap *map, void *address, uint64_t cols, uint64_t rows,
                  uint32_t box_cols, uint32_t box_rows)
{
    uint64_t dims[2] = {cols, rows}, strides[1] = {cols * 2};
    uint32_t box[2] = {box_cols, box_rows}, ones[2] = {1, 1};
    return f(map, BF16, 2, address, dims, strides, box, ones, 0, SWIZZLE_128B, L2_256B, 0);
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 6) {
        fprintf(stderr, "usage: map_app LIBCUDA [NAME GRIDX GRIDY BLOCKX]\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    encode_fn enc = (encode_fn)dlsym(h, "cuTensorMapEncodeTiled");
    getproc_fn getproc = (getproc_fn)dlsym(h, "cuGetProcAddress_v2");
    void *p;
    CHECK(getproc("cuTensorMapEncodeTiled", &p, 12000, 0, NULL));
    encode_fn enc2 = (encode_fn)p;
    CHECK(getproc("cuTensorMapReplaceAddress", &p, 12000, 0, NULL));
    replace_fn replace = (replace_fn)p;
    CHECK(getproc("cuLaunchKernel", &p, 12000, 0, NULL));
    launch_fn launch = (launch_fn)p;
    CHECK(getproc("cuLaunchKernelEx", &p, 12000, 2, NULL));   /* per-thread default stream */
    launch_ex_fn launch_ex = (launch_ex_fn)p;

    static char a_mem[64], a_moved[64], b_mem[64], c_mem[64], d_mem[64];
    static CUtensorMap a, b, c, d;
    CHECK(encode(enc, &a, a_mem, 8192, 16, 64, 16));       /* A: 16 x 8192, 64 x 16 boxes */
    CHECK(encode(enc2, &b, b_mem, 8192, 8192, 64, 64));    /* B: 8192 x 8192, 64 x 64 boxes */
    CHECK(encode(enc2, &c, c_mem, 4096, 4096, 64, 128));
    CHECK(cuTensorMapEncodeTiled(&d, BF16, 2, d_mem, (uint64_t[]){4096, 14336},
                                 (uint64_t[]){8192}, (uint32_t[]){64, 128}, (uint32_t[]){1, 1},
                                 0, SWIZZLE_128B, L2_256B, 0));

    const char *name = argc == 6 ? argv[2] : "_Z2k1";
    unsigned grid = argc == 6 ? (unsigned)atoi(argv[3]) : 128;
    unsigned grid_y = argc == 6 ? (unsigned)atoi(argv[4]) : 1;
    unsigned block = argc == 6 ? (unsigned)atoi(argv[5]) : 128;
    FakeFunction k1 = {name, 3, {4, 128, 128}}, k2 = {"_Z2k2", 2, {8, 192}},
                 k3 = {"_Z2k3", 1, {8}}, k4 = {"_Z2k4", 2, {8, 128}}, k5 = {"_Z2k5", 1, {128}};
    int m = 16;
    void *params1[] = {&m, &a, &b};
    CHECK(launch(&k1, grid, grid_y, 1, block, 1, 1, 0, NULL, params1, NULL));

    struct { _Alignas(64) char pad[64]; CUtensorMap b; } args2;
    memset(args2.pad, 0, sizeof args2.pad);
    args2.b = b;
    void *ptr = NULL;
    void *params2[] = {&ptr, &args2};
    CUlaunchConfig cfg = {132, 1, 1, 384, 1, 1, 0, NULL, NULL, 0};
    CHECK(launch_ex(&cfg, &k2, params2, NULL));

    void *params3[] = {&ptr};
    CHECK(launch(&k3, 1, 1, 1, 32, 1, 1, 0, NULL, params3, NULL));

    CHECK(replace(&a, a_moved));
    CHECK(launch(&k1, grid, grid_y, 1, block, 1, 1, 0, NULL, params1, NULL));

    static _Alignas(64) unsigned char buf[256];
    memcpy(buf + 128, &b, sizeof b);
    size_t size = sizeof buf;
    void *extra[] = {(void *)1, buf, (void *)2, &size, NULL};
    CHECK(launch(&k4, 8, 1, 1, 64, 1, 1, 0, NULL, NULL, extra));

    void *params5[] = {&d};
    CHECK(cuLaunchKernel(&k5, 112, 1, 1, 128, 1, 1, 0, NULL, params5, NULL));

    /* 7. a forked child launches NAME once more: its lines carry its own pid */
    pid_t child = fork();
    if (child == 0) _exit(launch(&k1, grid, grid_y, 1, block, 1, 1, 0, NULL, params1, NULL));
    int status = 1;
    if (child < 0 || waitpid(child, &status, 0) != child || status != 0) return 1;

    int *launches = (int *)dlsym(h, "fake_launches");
    printf("launches %d\n", launches ? *launches : -1);
    return 0;
}

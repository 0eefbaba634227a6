/* The types the stand-in driver and the test program share (cuda.h's ABI), and a kernel
 * as the stand-in driver sees one: the CUfunction handed to it points at a FakeFunction. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H
#include <stddef.h>
#include <stdint.h>

typedef struct { _Alignas(64) uint64_t opaque[16]; } CUtensorMap;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream, *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

typedef struct {
    const char *name;
    size_t nparams;
    size_t sizes[8];
} FakeFunction;

#endif

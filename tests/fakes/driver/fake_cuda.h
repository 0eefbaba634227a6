/* A kernel as the stand-in driver sees one: the CUfunction handed to it points here. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H
#include <stddef.h>

typedef struct {
    const char *name;
    size_t nparams;
    size_t sizes[8];
} FakeFunction;

#endif

/* An interposer preloaded beside the capture library: its foo reaches the next foo through
 * dlsym(RTLD_NEXT), as malloc hooks, sanitizers and profilers do. Handed its own foo back
 * it would recurse; it stops after three calls and says so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

const char *foo(void)
{
    static int depth;
    static char out[64];
    if (++depth > 3) return "recursed";
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "foo");
    snprintf(out, sizeof out, "B>%s", next ? next() : "none");
    return out;
}

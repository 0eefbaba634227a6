/* The library an interposer's RTLD_NEXT lookup must reach (test of mapcapture.c's dlsym). */
const char *foo(void) { return "C"; }

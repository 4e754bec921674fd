// The parts of the C ABI that never need the Go runtime: the version string
// and the per-thread last error (like dlerror), so a waiter thread's failure
// never clobbers the message the training thread is about to read.
#include <stddef.h>
#include <string.h>

#define DDPSHIM_VERSION_STRING "ddpshim 0.3.0 (abi 1)"

static __thread char last_error[1024];

const char *ddpshim_version(void) { return DDPSHIM_VERSION_STRING; }

const char *ddpshim_last_error(void) { return last_error; }

/* Internal: hidden, so the library exports only the functions of ddpshim.h. */
__attribute__((visibility("hidden"))) void ddpshim_set_error(const char *msg, size_t n) {
    if (n >= sizeof last_error) n = sizeof last_error - 1;
    memcpy(last_error, msg, n);
    last_error[n] = 0;
}

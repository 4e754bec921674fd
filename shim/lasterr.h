#include <stddef.h>
const char *ddpshim_version(void);
void ddpshim_set_error(const char *msg, size_t n);

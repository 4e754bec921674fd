/* shim_side.c: the layout table from the shim's declarations (ddpnccl.h). */
#include "ddpnccl.h"
#include "layout.h"

static ncclConfig_t shim_init(void) {
  ncclConfig_t c;
  ddpnccl_config_init(&c, 1);
  return c;
}

#define LAYOUT_VERSION DDPNCCL_VERSION
#define LAYOUT_INIT shim_init()

LAYOUT_TABLE_FUNC(shim_table)
const long long shim_config_size = sizeof(ncclConfig_t);
const long long shim_config_version = DDPNCCL_CONFIG_VERSION;

long long shim_version(int major, int minor, int patch) { return DDPNCCL_VERSION(major, minor, patch); }

/* main.c: prints the layout tables side by side, one tab-separated line per
 * item, for layout_test.go to judge:
 *
 *   value  NAME  SHIM  NCCL  SHIM_TYPE  NCCL_TYPE   an item both sides define (NCCL "absent"
 *                                                   when the header predates it)
 *   func   NAME  1|0                                the shim's pointer type is NCCL's prototype
 *   info   NAME  VALUE                              facts about the header
 */
#include <stdio.h>

#include "layout.h"

int main(void) {
  static struct layout_entry shim[256], nccl[256];
  int ns = shim_table(shim, 256), nn = nccl_table(nccl, 256);
  if (ns != nn || ns > 256) {
    fprintf(stderr, "layout: %d shim entries, %d nccl entries (room for 256)\n", ns, nn);
    return 2;
  }
  for (int i = 0; i < ns; i++) {
    printf("value\t%s\t%lld\t", shim[i].name, shim[i].value);
    if (nccl[i].value == LAYOUT_ABSENT)
      printf("absent");
    else
      printf("%lld", nccl[i].value);
    printf("\t%s\t%s\n", shim[i].type, nccl[i].type);
  }
  printf("value\tNCCL_VERSION(header)\t%lld\t%lld\t\t\n", shim_version(nccl_major, nccl_minor, nccl_patch),
         nccl_version(nccl_major, nccl_minor, nccl_patch));
  struct layout_entry f[64];
  int n = nccl_funcs(f, 64);
  for (int i = 0; i < n; i++) printf("func\t%s\t%lld\n", f[i].name, f[i].value);
  printf("info\tNCCL_VERSION_CODE\t%lld\n", nccl_version_code);
  printf("info\tNCCL_MAJOR.MINOR.PATCH\t%d.%d.%d\n", nccl_major, nccl_minor, nccl_patch);
  printf("info\tsizeof(ncclConfig_t)\t%lld\t%lld\n", shim_config_size, nccl_config_size);
  printf("info\tDDPNCCL_CONFIG_VERSION\t%lld\n", shim_config_version);
  return 0;
}

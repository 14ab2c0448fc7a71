/* quota_paths.c resolving every function through cuGetProcAddress_v2 (argv[1] = v2) or the CUDA 11.3
 * cuGetProcAddress (argv[1] = v1), itself found with dlsym. */
#include "quota_paths.c"

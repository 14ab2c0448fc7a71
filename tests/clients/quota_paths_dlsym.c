/* quota_paths.c resolving every function with dlopen("libcuda.so.1") + dlsym (argv[1] = dlsym). */
#include "quota_paths.c"

/* quota_paths.c calling the driver directly (linked with -lcuda). */
#define QUOTA_LINKED 1
#include "quota_paths.c"

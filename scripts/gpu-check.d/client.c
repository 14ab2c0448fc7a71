/* The real-GPU check's CUDA client (scripts/gpu-check): one process per probe step, run by probes.py
 * on NVIDIA's driver or simgpu, with or without gpuslice preloaded. It reaches the driver by
 * dlopen("libcuda.so.1") + dlsym, as cudarc and numba do (under gpuslice the interposed dlsym answers
 * with its hooks), and NVML the same way. Everything is printed as `key=value` lines.
 *
 * Every `view NAME` line set is: NAME_free, NAME_total (cuMemGetInfo), NAME_proc (NVML: this
 * process's used memory, -1 when NVML does not list it), NAME_dev_used (NVML: the device's used).
 *
 * Modes (argv[1]), KERNELS = the path of kernels.ptx:
 *   info                         driver version, device name, total memory
 *   events KERNELS               a spin kernel between two events in the primary context; another
 *                                thread with no current context queries, synchronises and times them
 *   memory KERNELS HOW           views around: the context, a load (HOW: module or library), the
 *                                first kernel's lookup, its first launch, a second lookup + launch
 *   modules N                    views before and after loading N small PTX modules (one kernel
 *                                each, looked up and launched)
 *   localmem KERNELS             views before and after launching a kernel with 4 KiB of local
 *                                memory per thread on 1024 blocks of 1024 threads
 *   limits STACK HEAP            views after setting the stack size, then the malloc heap
 *   graphmem MIB                 a graph with a memory node of MIB and its free node, launched;
 *                                views after the launch and after cuDeviceGraphMemTrim
 *   hold MIB                     MIB allocated; ready=1; waits for stdin to close
 *   ipcexport MIB / ipcimport    exporter prints handle=HEX, waits for stdin to close; the importer
 *                                reads the handle from stdin, views before and after opening it
 *   fdexport MIB SOCK / fdimport SOCK
 *                                cuMemCreate (POSIX fd), the fd sent over the Unix socket SOCK
 *                                (SCM_RIGHTS); the importer maps it; views before and after
 *   launch KERNELS N             host ns per cuLaunchKernel of `trivial` (N launches, 8 batches)
 *   chain KERNELS N US HOW       N spin(US) kernels back to back on one stream, queued behind a 200 ms
 *                                kernel; HOW: plain, event (an
 *                                event recorded between them), pdl (programmatic stream
 *                                serialization allowed); gap_us = device time (events around
 *                                the chain) per kernel - US; host_gap_us the same from wall time
 *   spin KERNELS MS US           spin(US) kernels back to back for MS ms; kernels=, per_s=
 *   slice KERNELS MS US          spin(US) kernels each followed by an event, for MS ms; the gaps
 *                                between consecutive events longer than 3 x US: gaps=, gap_median_us=
 *   latency KERNELS N US         N requests, each one spin(US) kernel and a synchronise, 2 ms apart:
 *                                p50_us=, p99_us=
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define API(X)                                                     \
    X(cuInit, "cuInit")                                            \
    X(cuDriverGetVersion, "cuDriverGetVersion")                    \
    X(cuGetErrorName, "cuGetErrorName")                            \
    X(cuDeviceGet, "cuDeviceGet")                                  \
    X(cuDeviceGetName, "cuDeviceGetName")                          \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2")                     \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")        \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                          \
    X(cuCtxGetCurrent, "cuCtxGetCurrent")                          \
    X(cuCtxSynchronize, "cuCtxSynchronize")                        \
    X(cuCtxSetLimit, "cuCtxSetLimit")                              \
    X(cuMemGetInfo, "cuMemGetInfo_v2")                             \
    X(cuMemAlloc, "cuMemAlloc_v2")                                 \
    X(cuMemFree, "cuMemFree_v2")                                   \
    X(cuModuleLoadData, "cuModuleLoadData")                        \
    X(cuModuleGetFunction, "cuModuleGetFunction")                  \
    X(cuLibraryLoadData, "cuLibraryLoadData")                      \
    X(cuLibraryGetKernel, "cuLibraryGetKernel")                    \
    X(cuKernelGetFunction, "cuKernelGetFunction")                  \
    X(cuLaunchKernel, "cuLaunchKernel")                            \
    X(cuLaunchKernelEx, "cuLaunchKernelEx")                        \
    X(cuStreamCreate, "cuStreamCreate")                            \
    X(cuStreamSynchronize, "cuStreamSynchronize")                  \
    X(cuEventCreate, "cuEventCreate")                              \
    X(cuEventRecord, "cuEventRecord")                              \
    X(cuEventQuery, "cuEventQuery")                                \
    X(cuEventSynchronize, "cuEventSynchronize")                    \
    X(cuEventElapsedTime, "cuEventElapsedTime")                    \
    X(cuGraphCreate, "cuGraphCreate")                              \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode")            \
    X(cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode")              \
    X(cuGraphInstantiate, "cuGraphInstantiateWithFlags")           \
    X(cuGraphLaunch, "cuGraphLaunch")                              \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim")                \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle")                      \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2")                 \
    X(cuMemCreate, "cuMemCreate")                                  \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle") \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle") \
    X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity") \
    X(cuMemAddressReserve, "cuMemAddressReserve")                  \
    X(cuMemMap, "cuMemMap")                                        \
    X(cuMemSetAccess, "cuMemSetAccess")

/* cuEventElapsedTime's original signature (cuda.h names the CUDA 12.8 one's _v2). */
typedef CUresult (*elapsed_fn)(float *, CUevent, CUevent);
#define FIELD(name, sym) __typeof__(&name) name;
static struct {
    API(FIELD)
} A;
#undef FIELD

static CUdevice dev;
static CUcontext ctx;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static const char *err(CUresult rc) {
    const char *s = NULL;
    if (A.cuGetErrorName == NULL || A.cuGetErrorName(rc, &s) != CUDA_SUCCESS || s == NULL)
        return "?";
    return s;
}

#define CK(call)                                                                        \
    do {                                                                                \
        CUresult rc_ = (call);                                                          \
        if (rc_ != CUDA_SUCCESS) {                                                      \
            printf("error=%s failed: %d %s (line %d)\n", #call, (int)rc_, err(rc_), __LINE__); \
            fflush(stdout);                                                             \
            exit(3);                                                                    \
        }                                                                               \
    } while (0)

static void bind_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen libcuda.so.1: %s\n", dlerror());
        exit(2);
    }
#define BIND(name, sym) *(void **)&A.name = dlsym(h, sym);
    API(BIND)
#undef BIND
#define REQUIRE(name, sym)                                           \
    if (A.name == NULL && strcmp(sym, "cuLaunchKernelEx") != 0) {    \
        printf("error=the driver lacks %s\n", sym);                  \
        exit(2);                                                     \
    }
    API(REQUIRE)
#undef REQUIRE
}

/* ---- NVML (this process's used memory) ---- */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvml_proc_v2;
static int (*nvml_init)(void);
static int (*nvml_handle)(unsigned int, void **);
static int (*nvml_procs)(void *, unsigned int *, nvml_proc_v2 *);
static int (*nvml_memory)(void *, unsigned long long *);
static void *nvml_dev;

static void nvml_bind(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return;
    *(void **)&nvml_init = dlsym(h, "nvmlInit_v2");
    *(void **)&nvml_handle = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml_procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2");
    *(void **)&nvml_memory = dlsym(h, "nvmlDeviceGetMemoryInfo");
    if (nvml_init == NULL || nvml_handle == NULL || nvml_init() != 0 || nvml_handle(0, &nvml_dev) != 0)
        nvml_dev = NULL;
}

static long long nvml_proc_used(void) {
    if (nvml_dev == NULL || nvml_procs == NULL)
        return -1;
    nvml_proc_v2 p[256];
    unsigned int n = 256;
    if (nvml_procs(nvml_dev, &n, p) != 0)
        return -1;
    for (unsigned int i = 0; i < n; i++)
        if (p[i].pid == (unsigned int)getpid())
            return (long long)p[i].usedGpuMemory;
    return -1;
}

static long long nvml_dev_used(void) {
    unsigned long long m[3];
    if (nvml_dev == NULL || nvml_memory == NULL || nvml_memory(nvml_dev, m) != 0)
        return -1;
    return (long long)m[2];
}

static void nvml_pids(const char *name) {
    if (nvml_dev == NULL || nvml_procs == NULL)
        return;
    nvml_proc_v2 p[256];
    unsigned int n = 256;
    if (nvml_procs(nvml_dev, &n, p) != 0)
        return;
    printf("%s_pids=", name);
    for (unsigned int i = 0; i < n; i++)
        printf("%s%u", i ? "," : "", p[i].pid);
    printf("\n%s_getpid=%d\n", name, (int)getpid());
}

static void view(const char *name) {
    size_t free_b = 0, total_b = 0;
    CUresult rc = A.cuMemGetInfo(&free_b, &total_b);
    printf("%s_rc=%d\n%s_free=%zu\n%s_total=%zu\n%s_proc=%lld\n%s_dev_used=%lld\n", name, (int)rc, name,
           free_b, name, total_b, name, nvml_proc_used(), name, nvml_dev_used());
    fflush(stdout);
}

static void context(void) {
    CK(A.cuInit(0));
    CK(A.cuDeviceGet(&dev, 0));
    CK(A.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(A.cuCtxSetCurrent(ctx));
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        printf("error=cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1);
    if (b == NULL || fread(b, 1, (size_t)n, f) != (size_t)n) {
        printf("error=cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    return b;
}

static CUfunction kernel(const char *ptx, const char *name) {
    CUmodule m;
    CUfunction f;
    CK(A.cuModuleLoadData(&m, ptx));
    CK(A.cuModuleGetFunction(&f, m, name));
    return f;
}

static void launch(CUfunction f, CUstream s, void **params, unsigned grid, unsigned block) {
    CK(A.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, params, NULL));
}

static void spin_on(CUfunction f, CUstream s, uint64_t us) {
    void *p[] = {&us};
    launch(f, s, p, 1, 1);
}

/* ---- events from a thread with no current context ---- */
static CUevent ev0, ev1;
static void *no_context_thread(void *arg) {
    (void)arg;
    CUcontext cur = (CUcontext)1;
    A.cuCtxGetCurrent(&cur);
    printf("thread_context_null=%d\n", cur == NULL);
    int q = (int)A.cuEventQuery(ev1);
    printf("query_rc=%d\nquery_name=%s\n", q, err((CUresult)q));
    int s = (int)A.cuEventSynchronize(ev1);
    printf("sync_rc=%d\nsync_name=%s\n", s, err((CUresult)s));
    float ms = -1;
    int e = (int)((elapsed_fn)(void *)A.cuEventElapsedTime)(&ms, ev0, ev1);
    printf("elapsed_rc=%d\nelapsed_name=%s\nelapsed_ms=%.3f\n", e, err((CUresult)e), ms);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the small modules ---- */
static const char *SMALL_PTX =
    ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry small%d()\n{\n\tret;\n}\n";

/* ---- fd passing ---- */
static int unix_socket(const char *path, int listen_side) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (listen_side) {
        unlink(path);
        if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 1) != 0)
            return -1;
        return s;
    }
    for (int i = 0; i < 200; i++) {
        if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
            return s;
        usleep(50000);
    }
    return -1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        printf("error=usage: client MODE ...\n");
        return 2;
    }
    const char *mode = argv[1];
    bind_driver();
    nvml_bind();
#define ARG(i) (argc > (i) ? argv[i] : (printf("error=mode %s needs argument %d\n", mode, i), exit(2), ""))
    if (strcmp(mode, "info") == 0) {
        int v = 0;
        CK(A.cuInit(0));
        CK(A.cuDriverGetVersion(&v));
        char name[256] = "";
        size_t total = 0;
        CK(A.cuDeviceGet(&dev, 0));
        CK(A.cuDeviceGetName(name, sizeof name, dev));
        CK(A.cuDeviceTotalMem(&total, dev));
        printf("driver_version=%d\ndevice=%s\ntotal=%zu\n", v, name, total);
    } else if (strcmp(mode, "events") == 0) {
        char *ptx = read_file(ARG(2));
        context();
        CUfunction spin = kernel(ptx, "spin");
        CUstream s;
        CK(A.cuStreamCreate(&s, 0));
        CK(A.cuEventCreate(&ev0, 0));
        CK(A.cuEventCreate(&ev1, 0));
        CK(A.cuEventRecord(ev0, s));
        spin_on(spin, s, 200000);
        CK(A.cuEventRecord(ev1, s));
        pthread_t t;
        pthread_create(&t, NULL, no_context_thread, NULL);
        pthread_join(t, NULL);
    } else if (strcmp(mode, "memory") == 0) {
        char *ptx = read_file(ARG(2));
        const char *how = ARG(3);
        view("start");
        context();
        view("context");
        nvml_pids("context");
        CUfunction f0, f1;
        if (strcmp(how, "library") == 0) {
            CUlibrary lib;
            CUkernel k0, k1;
            CK(A.cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
            view("load");
            CK(A.cuLibraryGetKernel(&k0, lib, "trivial"));
            view("lookup");
            CK(A.cuKernelGetFunction(&f0, k0));
            launch(f0, NULL, NULL, 1, 1);
            CK(A.cuCtxSynchronize());
            view("launch");
            CK(A.cuLibraryGetKernel(&k1, lib, "localmem"));
            CK(A.cuKernelGetFunction(&f1, k1));
            view("lookup2");
        } else {
            CUmodule m;
            CK(A.cuModuleLoadData(&m, ptx));
            view("load");
            CK(A.cuModuleGetFunction(&f0, m, "trivial"));
            view("lookup");
            launch(f0, NULL, NULL, 1, 1);
            CK(A.cuCtxSynchronize());
            view("launch");
            CK(A.cuModuleGetFunction(&f1, m, "localmem"));
            view("lookup2");
        }
    } else if (strcmp(mode, "modules") == 0) {
        int n = atoi(ARG(2));
        context();
        view("before");
        char text[512];
        for (int i = 0; i < n; i++) {
            char name[32];
            snprintf(text, sizeof text, SMALL_PTX, i);
            snprintf(name, sizeof name, "small%d", i);
            CUfunction f = kernel(text, name);
            launch(f, NULL, NULL, 1, 1);
        }
        CK(A.cuCtxSynchronize());
        view("after");
        printf("modules=%d\n", n);
    } else if (strcmp(mode, "localmem") == 0) {
        char *ptx = read_file(ARG(2));
        context();
        CUfunction f = kernel(ptx, "localmem");
        CUdeviceptr out;
        CK(A.cuMemAlloc(&out, 1024 * 1024 * 4));
        CK(A.cuCtxSynchronize());
        view("before");
        void *p[] = {&out};
        launch(f, NULL, p, 1024, 1024);
        CK(A.cuCtxSynchronize());
        view("after");
    } else if (strcmp(mode, "limits") == 0) {
        size_t stack = strtoull(ARG(2), NULL, 10), heap = strtoull(ARG(3), NULL, 10);
        context();
        view("before");
        printf("stack_rc=%d\n", (int)A.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack));
        view("stack");
        printf("heap_rc=%d\n", (int)A.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, heap));
        view("heap");
    } else if (strcmp(mode, "graphmem") == 0) {
        size_t mib = strtoull(ARG(2), NULL, 10);
        context();
        view("before");
        CUgraph g;
        CUgraphNode an, fn;
        CK(A.cuGraphCreate(&g, 0));
        CUDA_MEM_ALLOC_NODE_PARAMS ap;
        memset(&ap, 0, sizeof ap);
        ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        ap.poolProps.location.id = dev;
        ap.bytesize = mib << 20;
        CK(A.cuGraphAddMemAllocNode(&an, g, NULL, 0, &ap));
        CK(A.cuGraphAddMemFreeNode(&fn, g, &an, 1, ap.dptr));
        CUgraphExec ge;
        CK(A.cuGraphInstantiate(&ge, g, 0));
        CK(A.cuGraphLaunch(ge, NULL));
        CK(A.cuCtxSynchronize());
        view("launched");
        printf("trim_rc=%d\n", (int)A.cuDeviceGraphMemTrim(dev));
        CK(A.cuCtxSynchronize());
        view("trimmed");
    } else if (strcmp(mode, "hold") == 0) {
        size_t mib = strtoull(ARG(2), NULL, 10);
        context();
        CUdeviceptr p;
        CK(A.cuMemAlloc(&p, mib << 20));
        view("held");
        printf("ready=1\n");
        char line[64];
        while (fgets(line, sizeof line, stdin) != NULL) {
        }
    } else if (strcmp(mode, "ipcexport") == 0) {
        size_t mib = strtoull(ARG(2), NULL, 10);
        context();
        CUdeviceptr p;
        CK(A.cuMemAlloc(&p, mib << 20));
        CUipcMemHandle h;
        CK(A.cuIpcGetMemHandle(&h, p));
        printf("handle=");
        for (size_t i = 0; i < sizeof h.reserved; i++)
            printf("%02x", (unsigned char)h.reserved[i]);
        printf("\nready=1\n");
        char line[64];
        while (fgets(line, sizeof line, stdin) != NULL) {
        }
    } else if (strcmp(mode, "ipcimport") == 0) {
        char hex[512] = "";
        if (fgets(hex, sizeof hex, stdin) == NULL) {
            printf("error=no handle on stdin\n");
            return 2;
        }
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        for (size_t i = 0; i < sizeof h.reserved; i++) {
            unsigned v = 0;
            sscanf(hex + 2 * i, "%2x", &v);
            h.reserved[i] = (char)v;
        }
        context();
        view("before");
        CUdeviceptr p = 0;
        printf("open_rc=%d\n", (int)A.cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        view("after");
    } else if (strcmp(mode, "fdexport") == 0) {
        size_t mib = strtoull(ARG(2), NULL, 10);
        const char *sock = ARG(3);
        context();
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUmemGenericAllocationHandle mh;
        CK(A.cuMemCreate(&mh, mib << 20, &prop, 0));
        int fd = -1;
        CK(A.cuMemExportToShareableHandle(&fd, mh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        int ls = unix_socket(sock, 1);
        printf("ready=1\n");
        int c = ls < 0 ? -1 : accept(ls, NULL, NULL);
        if (c < 0) {
            printf("error=socket %s\n", sock);
            return 2;
        }
        char byte = 'f';
        struct iovec io = {.iov_base = &byte, .iov_len = 1};
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        printf("sent=%d\n", sendmsg(c, &msg, 0) == 1);
        char line[64];
        while (fgets(line, sizeof line, stdin) != NULL) {
        }
    } else if (strcmp(mode, "fdimport") == 0) {
        size_t mib = strtoull(ARG(2), NULL, 10);
        const char *sock = ARG(3);
        context();
        view("before");
        int s = unix_socket(sock, 0);
        char byte;
        struct iovec io = {.iov_base = &byte, .iov_len = 1};
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct msghdr msg = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        int fd = -1;
        if (s >= 0 && recvmsg(s, &msg, 0) == 1 && CMSG_FIRSTHDR(&msg) != NULL)
            memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof fd);
        printf("received=%d\n", fd >= 0);
        CUmemGenericAllocationHandle mh;
        int rc = (int)A.cuMemImportFromShareableHandle(&mh, (void *)(uintptr_t)fd,
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        printf("import_rc=%d\n", rc);
        view("imported");
        if (rc == 0) {
            CUdeviceptr va;
            CK(A.cuMemAddressReserve(&va, mib << 20, 0, 0, 0));
            CK(A.cuMemMap(va, mib << 20, 0, mh, 0));
            CUmemAccessDesc ad;
            memset(&ad, 0, sizeof ad);
            ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            ad.location.id = dev;
            ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CK(A.cuMemSetAccess(va, mib << 20, &ad, 1));
        }
        view("after");
    } else if (strcmp(mode, "launch") == 0) {
        char *ptx = read_file(ARG(2));
        int n = atoi(ARG(3));
        context();
        CUfunction f = kernel(ptx, "trivial");
        CUstream s;
        CK(A.cuStreamCreate(&s, 0));
        double best = 1e18, sum = 0;
        for (int b = 0; b < 8; b++) {
            double t0 = now_ns();
            for (int i = 0; i < n / 8; i++)
                launch(f, s, NULL, 1, 1);
            double per = (now_ns() - t0) / (double)(n / 8);
            CK(A.cuStreamSynchronize(s));
            sum += per;
            if (per < best)
                best = per;
        }
        printf("ns_per_launch=%.0f\nns_per_launch_best=%.0f\n", sum / 8, best);
    } else if (strcmp(mode, "chain") == 0) {
        char *ptx = read_file(ARG(2));
        int n = atoi(ARG(3));
        uint64_t us = strtoull(ARG(4), NULL, 10);
        const char *how = ARG(5);
        context();
        CUfunction f = kernel(ptx, "spin");
        CUstream s;
        CK(A.cuStreamCreate(&s, 0));
        CUevent e;
        CK(A.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
        spin_on(f, s, us);
        CK(A.cuStreamSynchronize(s));
        /* A 200 ms kernel first: the chain is queued behind it, so the device runs it at its own pace
         * whatever the host's. */
        spin_on(f, s, 200000);
        int pdl_rc = 0;
        CUevent ta, tb;
        CK(A.cuEventCreate(&ta, 0));
        CK(A.cuEventCreate(&tb, 0));
        CK(A.cuEventRecord(ta, s));
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
            if (strcmp(how, "pdl") == 0 && A.cuLaunchKernelEx != NULL) {
                CUlaunchAttribute at;
                memset(&at, 0, sizeof at);
                at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                at.value.programmaticStreamSerializationAllowed = 1;
                CUlaunchConfig c;
                memset(&c, 0, sizeof c);
                c.gridDimX = c.gridDimY = c.gridDimZ = 1;
                c.blockDimX = c.blockDimY = c.blockDimZ = 1;
                c.hStream = s;
                c.attrs = &at;
                c.numAttrs = 1;
                uint64_t v = us;
                void *p[] = {&v};
                CUresult rc = A.cuLaunchKernelEx(&c, f, p, NULL);
                if (rc != CUDA_SUCCESS) {
                    pdl_rc = (int)rc;
                    spin_on(f, s, us);
                }
            } else {
                spin_on(f, s, us);
            }
            if (strcmp(how, "event") == 0)
                CK(A.cuEventRecord(e, s));
        }
        CK(A.cuEventRecord(tb, s));
        CK(A.cuStreamSynchronize(s));
        double wall_us = (now_ns() - t0) / 1e3;
        float dev_ms = 0;
        CK(((elapsed_fn)(void *)A.cuEventElapsedTime)(&dev_ms, ta, tb));
        double dev_us = dev_ms * 1000.0;
        printf("pdl_rc=%d\nwall_us=%.1f\ndevice_us=%.1f\nper_kernel_us=%.3f\ngap_us=%.3f\nhost_gap_us=%.3f\n", pdl_rc,
               wall_us, dev_us, dev_us / n, dev_us / n - (double)us, wall_us / n - (double)us);
    } else if (strcmp(mode, "spin") == 0 || strcmp(mode, "slice") == 0) {
        char *ptx = read_file(ARG(2));
        double ms = atof(ARG(3));
        uint64_t us = strtoull(ARG(4), NULL, 10);
        int slice = strcmp(mode, "slice") == 0;
        context();
        CUfunction f = kernel(ptx, "spin");
        CUstream s;
        CK(A.cuStreamCreate(&s, 0));
        /* Kernels are kept WINDOW deep in the stream (an event after each, the one WINDOW back
         * waited for): the context always has work queued, as a busy program does. */
        enum { MAXEV = 40000, WINDOW = 16 };
        CUevent *evs = calloc(MAXEV, sizeof(CUevent));
        long nev = 0;
        printf("ready=1\n");
        double t0 = now_ns(), end = t0 + ms * 1e6;
        long kernels = 0;
        while (now_ns() < end) {
            spin_on(f, s, us);
            kernels++;
            long slot = slice ? nev : nev % (WINDOW + 1);
            if (slice && nev >= MAXEV)
                break;
            if (evs[slot] == NULL)
                CK(A.cuEventCreate(&evs[slot], 0));
            CK(A.cuEventRecord(evs[slot], s));
            nev++;
            if (nev > WINDOW) {
                long back = slice ? nev - 1 - WINDOW : (nev - 1 - WINDOW) % (WINDOW + 1);
                CK(A.cuEventSynchronize(evs[back]));
            }
        }
        CK(A.cuStreamSynchronize(s));
        double wall = (now_ns() - t0) / 1e9;
        printf("kernels=%ld\nper_s=%.1f\nwall_s=%.3f\n", kernels, (double)kernels / wall, wall);
        if (slice && nev > 1) {
            double *gaps = calloc((size_t)nev, sizeof(double));
            int ng = 0;
            for (int i = 1; i < nev; i++) {
                float dt = 0;
                if (((elapsed_fn)(void *)A.cuEventElapsedTime)(&dt, evs[i - 1], evs[i]) == CUDA_SUCCESS &&
                    dt * 1000.0 > 3.0 * (double)us)
                    gaps[ng++] = dt * 1000.0 - (double)us;
            }
            qsort(gaps, (size_t)ng, sizeof(double), cmp_double);
            printf("gaps=%d\ngap_median_us=%.1f\n", ng, ng ? gaps[ng / 2] : 0.0);
        }
    } else if (strcmp(mode, "latency") == 0) {
        char *ptx = read_file(ARG(2));
        int n = atoi(ARG(3));
        uint64_t us = strtoull(ARG(4), NULL, 10);
        context();
        CUfunction f = kernel(ptx, "spin");
        CUstream s;
        CK(A.cuStreamCreate(&s, 0));
        double *lat = calloc((size_t)n, sizeof(double));
        for (int i = 0; i < n; i++) {
            double t0 = now_ns();
            spin_on(f, s, us);
            CK(A.cuStreamSynchronize(s));
            lat[i] = (now_ns() - t0) / 1e3;
            usleep(2000);
        }
        qsort(lat, (size_t)n, sizeof(double), cmp_double);
        printf("p50_us=%.1f\np99_us=%.1f\n", lat[n / 2], lat[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1]);
    } else {
        printf("error=unknown mode %s\n", mode);
        return 2;
    }
    printf("done=1\n");
    return 0;
}

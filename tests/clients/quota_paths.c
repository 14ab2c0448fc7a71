/* gpuslice's memory quota through every interception path and every allocation path.
 *
 * One source, compiled three ways (tests/shim_paths.rs):
 *   quota_paths_linked.c     QUOTA_LINKED: calls the driver directly, linked with -lcuda
 *   quota_paths_dlsym.c      dlopen("libcuda.so.1") + dlsym for every function
 *   quota_paths_procaddr.c   every function through cuGetProcAddress_v2 (`v2`) or the CUDA 11.3
 *                            cuGetProcAddress (`v1`), itself found with dlsym
 * Usage: quota_paths [dlsym|v1|v2] MODE, MODE = matrix | fill | hold.
 *
 * matrix: for each allocation kind K, with A and B two allocations (sizes in tests/shim_paths.rs):
 *   K.start  (before anything)          K.a  (A allocated)        K.b (B attempted, A held)
 *   kind-specific steps freeing A       K.a_freed                 K.b2 (B again), K.end (B freed)
 * each printed as K.STEP.rc / .free / .total (cuMemGetInfo_v2 after the step). Around B's first
 * attempt the client writes `quota_paths: begin K` / `quota_paths: end K` to stderr, so the test can
 * count gpuslice's warnings per attempt.
 * fill: for each kind, 64 MiB allocations until one fails: K.fill_count, K.fill_rc, then everything
 * freed: K.fill_free_after.
 * hold: cuMemAlloc of A, ready=1, then wait until stdin closes and free it.
 * Both print bound.FIELD=OBJECT!SYMBOL (dladdr of each function the client obtained) and done=1. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef QUOTA_LINKED
/* Per-thread-default-stream exports, declared as cuda.h does under CUDA_API_PER_THREAD_DEFAULT_STREAM. */
extern __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
extern __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
extern __typeof__(cuStreamSynchronize) cuStreamSynchronize_ptsz;
#endif

/* X(field, prototype, exported symbol, cuGetProcAddress name, cuGetProcAddress flags) */
#define API_LIST(X)                                                                                \
    X(init, cuInit, cuInit, "cuInit", 0)                                                           \
    X(getErrorName, cuGetErrorName, cuGetErrorName, "cuGetErrorName", 0)                           \
    X(deviceGet, cuDeviceGet, cuDeviceGet, "cuDeviceGet", 0)                                       \
    X(deviceGetUuid, cuDeviceGetUuid, cuDeviceGetUuid, "cuDeviceGetUuid", 0)                       \
    X(deviceTotalMem, cuDeviceTotalMem_v2, cuDeviceTotalMem_v2, "cuDeviceTotalMem", 0)             \
    X(primaryRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0) \
    X(primaryRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2,                  \
      "cuDevicePrimaryCtxRelease", 0)                                                              \
    X(ctxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", 0)                       \
    X(memGetInfo, cuMemGetInfo_v2, cuMemGetInfo_v2, "cuMemGetInfo", 0)                             \
    X(memAlloc, cuMemAlloc_v2, cuMemAlloc_v2, "cuMemAlloc", 0)                                     \
    X(memFree, cuMemFree_v2, cuMemFree_v2, "cuMemFree", 0)                                         \
    X(memAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch_v2, "cuMemAllocPitch", 0)                 \
    X(memAllocManaged, cuMemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", 0)               \
    X(streamCreate, cuStreamCreate, cuStreamCreate, "cuStreamCreate", 0)                           \
    X(streamDestroy, cuStreamDestroy_v2, cuStreamDestroy_v2, "cuStreamDestroy", 0)                 \
    X(streamSynchronize, cuStreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize", 0)       \
    X(memAllocAsync, cuMemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", 0)                       \
    X(memFreeAsync, cuMemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", 0)                           \
    X(streamSynchronizePtsz, cuStreamSynchronize, cuStreamSynchronize_ptsz, "cuStreamSynchronize", 2) \
    X(memAllocAsyncPtsz, cuMemAllocAsync, cuMemAllocAsync_ptsz, "cuMemAllocAsync", 2)              \
    X(memFreeAsyncPtsz, cuMemFreeAsync, cuMemFreeAsync_ptsz, "cuMemFreeAsync", 2)                  \
    X(memAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync,                     \
      "cuMemAllocFromPoolAsync", 0)                                                                \
    X(memPoolCreate, cuMemPoolCreate, cuMemPoolCreate, "cuMemPoolCreate", 0)                       \
    X(memPoolDestroy, cuMemPoolDestroy, cuMemPoolDestroy, "cuMemPoolDestroy", 0)                   \
    X(memPoolTrimTo, cuMemPoolTrimTo, cuMemPoolTrimTo, "cuMemPoolTrimTo", 0)                       \
    X(memPoolSetAttribute, cuMemPoolSetAttribute, cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 0) \
    X(memGetAllocationGranularity, cuMemGetAllocationGranularity, cuMemGetAllocationGranularity,   \
      "cuMemGetAllocationGranularity", 0)                                                          \
    X(memCreate, cuMemCreate, cuMemCreate, "cuMemCreate", 0)                                       \
    X(memRelease, cuMemRelease, cuMemRelease, "cuMemRelease", 0)                                   \
    X(memAddressReserve, cuMemAddressReserve, cuMemAddressReserve, "cuMemAddressReserve", 0)       \
    X(memAddressFree, cuMemAddressFree, cuMemAddressFree, "cuMemAddressFree", 0)                   \
    X(memMap, cuMemMap, cuMemMap, "cuMemMap", 0)                                                   \
    X(memUnmap, cuMemUnmap, cuMemUnmap, "cuMemUnmap", 0)                                           \
    X(memSetAccess, cuMemSetAccess, cuMemSetAccess, "cuMemSetAccess", 0)                           \
    X(arrayCreate, cuArrayCreate_v2, cuArrayCreate_v2, "cuArrayCreate", 0)                         \
    X(array3DCreate, cuArray3DCreate_v2, cuArray3DCreate_v2, "cuArray3DCreate", 0)                 \
    X(arrayDestroy, cuArrayDestroy, cuArrayDestroy, "cuArrayDestroy", 0)                           \
    X(mipmappedArrayCreate, cuMipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0) \
    X(mipmappedArrayDestroy, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy,                     \
      "cuMipmappedArrayDestroy", 0)

#define API_FIELD(field, proto, sym, base, flags) __typeof__(&proto) field;
static struct {
    API_LIST(API_FIELD)
} A;

#define MIB ((size_t)1 << 20)

static const char *err_name(CUresult rc) {
    const char *name = NULL;
    if (A.getErrorName == NULL || A.getErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
        return "?";
    return name;
}

/* A setup step that fails ends the client, naming the call and the error. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            printf("error=%s returned %d (%s), expected CUDA_SUCCESS (line %d)\n", #call, (int)rc_, \
                   err_name(rc_), __LINE__);                                                       \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void print_bound(const char *field, void *p) {
    Dl_info info;
    const char *obj = "unknown", *sym = "unknown";
    if (p != NULL && dladdr(p, &info) != 0) {
        if (info.dli_fname != NULL) {
            const char *slash = strrchr(info.dli_fname, '/');
            obj = slash ? slash + 1 : info.dli_fname;
        }
        if (info.dli_sname != NULL && info.dli_saddr == p)
            sym = info.dli_sname;
    }
    printf("bound.%s=%s!%s\n", field, obj, sym);
}

#ifdef QUOTA_LINKED
static void bind_all(const char *how) {
    (void)how;
#define BIND(field, proto, sym, base, flags) A.field = &sym;
    API_LIST(BIND)
#undef BIND
}
#else
typedef CUresult (*gpa_v1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *resolve(void *h, const char *how, const char *sym, const char *base, cuuint64_t flags) {
    void *p = NULL;
    if (strcmp(how, "dlsym") == 0) {
        p = dlsym(h, sym);
        if (p == NULL)
            printf("error=dlsym(libcuda.so.1, %s) returned NULL (%s)\n", sym, dlerror());
        return p;
    }
    /* The CUDA version the program was built for (QUOTA_CUDA_VERSION: 13000 plays a CUDA 13 program). */
    const char *version_text = getenv("QUOTA_CUDA_VERSION");
    int version = version_text ? atoi(version_text) : 12000;
    if (strcmp(how, "v2") == 0) {
        static gpa_v2_t gpa;
        if (gpa == NULL && (gpa = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2")) == NULL) {
            printf("error=dlsym(libcuda.so.1, cuGetProcAddress_v2) returned NULL\n");
            return NULL;
        }
        CUdriverProcAddressQueryResult status = (CUdriverProcAddressQueryResult)-1;
        CUresult rc = gpa(base, &p, version, flags, &status);
        if (rc != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || p == NULL) {
            printf("error=cuGetProcAddress_v2(%s, %d, flags %llu) returned rc %d status %d pfn %p, "
                   "expected 0 0 non-NULL\n",
                   base, version, (unsigned long long)flags, (int)rc, (int)status, p);
            return NULL;
        }
        return p;
    }
    if (strcmp(how, "v1") == 0) {
        static gpa_v1_t gpa;
        if (gpa == NULL && (gpa = (gpa_v1_t)dlsym(h, "cuGetProcAddress")) == NULL) {
            printf("error=dlsym(libcuda.so.1, cuGetProcAddress) returned NULL\n");
            return NULL;
        }
        CUresult rc = gpa(base, &p, version, flags);
        if (rc != CUDA_SUCCESS || p == NULL) {
            printf("error=cuGetProcAddress(%s, %d, flags %llu) returned rc %d pfn %p, expected 0 "
                   "non-NULL\n",
                   base, version, (unsigned long long)flags, (int)rc, p);
            return NULL;
        }
        return p;
    }
    printf("error=unknown binding %s (expected dlsym, v1 or v2)\n", how);
    exit(2);
}

static void bind_all(const char *how) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("error=dlopen(libcuda.so.1) failed: %s\n", dlerror());
        exit(1);
    }
    int missing = 0;
#define BIND(field, proto, sym, base, flags)                                                       \
    A.field = (__typeof__(A.field))resolve(h, how, #sym, base, flags);                             \
    missing += A.field == NULL;
    API_LIST(BIND)
#undef BIND
    if (missing) {
        fflush(stdout);
        exit(1);
    }
}
#endif

static void print_all_bound(void) {
#define PRINT(field, proto, sym, base, flags) print_bound(#field, (void *)A.field);
    API_LIST(PRINT)
#undef PRINT
}

/* ---- state shared by the kinds ---- */

static CUdevice dev;
static CUstream stream;
static CUmemoryPool own_pool;

static void step(const char *kind, const char *name, CUresult rc) {
    size_t free_b = 0, total_b = 0;
    CUresult info = A.memGetInfo(&free_b, &total_b);
    printf("%s.%s.rc=%d\n%s.%s.free=%zu\n%s.%s.total=%zu\n", kind, name, (int)rc, kind, name, free_b,
           kind, name, total_b);
    if (info != CUDA_SUCCESS)
        printf("%s.%s.meminfo_rc=%d\n", kind, name, (int)info);
}

/* One allocation of any kind. */
struct obj {
    CUdeviceptr ptr;
    CUarray arr;
    CUmipmappedArray mip;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    size_t size;
};

enum which { SIZE_A, SIZE_B, SIZE_CHUNK };

static size_t linear_bytes(enum which w) {
    return w == SIZE_A ? 768 * MIB : w == SIZE_B ? 512 * MIB : 64 * MIB;
}

static CUmemAllocationProp vmm_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

/* CUDA_ARRAY3D_DESCRIPTOR of float4 texels (16 bytes). */
static CUDA_ARRAY3D_DESCRIPTOR float4_desc(size_t w, size_t h, size_t d) {
    CUDA_ARRAY3D_DESCRIPTOR desc;
    memset(&desc, 0, sizeof desc);
    desc.Width = w;
    desc.Height = h;
    desc.Depth = d;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 4;
    return desc;
}

static CUresult alloc_kind(const char *kind, enum which w, struct obj *o) {
    memset(o, 0, sizeof *o);
    size_t bytes = linear_bytes(w);
    if (strcmp(kind, "alloc") == 0)
        return A.memAlloc(&o->ptr, bytes);
    if (strcmp(kind, "pitch") == 0) {
        /* 8192-byte rows (already a multiple of the pitch alignment): pitch x height = bytes. */
        size_t pitch = 0;
        CUresult rc = A.memAllocPitch(&o->ptr, &pitch, 8192, bytes / 8192, 16);
        if (rc == CUDA_SUCCESS && pitch != 8192)
            printf("%s.pitch_unexpected=%zu\n", kind, pitch);
        return rc;
    }
    if (strcmp(kind, "managed") == 0)
        return A.memAllocManaged(&o->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (strcmp(kind, "async") == 0)
        return A.memAllocAsync(&o->ptr, bytes, stream);
    if (strcmp(kind, "async_ptsz") == 0)
        return A.memAllocAsyncPtsz(&o->ptr, bytes, NULL); /* the per-thread default stream */
    if (strcmp(kind, "pool") == 0)
        return A.memAllocFromPoolAsync(&o->ptr, bytes, own_pool, stream);
    if (strcmp(kind, "vmm") == 0) {
        CUmemAllocationProp prop = vmm_prop();
        o->size = bytes;
        CUresult rc = A.memCreate(&o->handle, bytes, &prop, 0);
        if (rc != CUDA_SUCCESS)
            return rc;
        CHECK(A.memAddressReserve(&o->va, bytes, 0, 0, 0));
        CHECK(A.memMap(o->va, bytes, 0, o->handle, 0));
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(A.memSetAccess(o->va, bytes, &access, 1));
        return rc;
    }
    if (strcmp(kind, "array") == 0) {
        /* float4 texels: 8192 x rows x 16 bytes = bytes. */
        CUDA_ARRAY_DESCRIPTOR desc;
        memset(&desc, 0, sizeof desc);
        desc.Width = 8192;
        desc.Height = bytes / (8192 * 16);
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 4;
        return A.arrayCreate(&o->arr, &desc);
    }
    if (strcmp(kind, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = float4_desc(1024, 1024, bytes / (1024 * 1024 * 16));
        return A.array3DCreate(&o->arr, &desc);
    }
    if (strcmp(kind, "mipmap") == 0) {
        /* A and B: 8192 x 4096 float4, 2 levels = 512 + 128 MiB; a chunk: 2048 x 2048, 1 level. */
        if (w == SIZE_CHUNK) {
            CUDA_ARRAY3D_DESCRIPTOR desc = float4_desc(2048, 2048, 0);
            return A.mipmappedArrayCreate(&o->mip, &desc, 1);
        }
        CUDA_ARRAY3D_DESCRIPTOR desc = float4_desc(8192, 4096, 0);
        return A.mipmappedArrayCreate(&o->mip, &desc, 2);
    }
    printf("error=unknown kind %s\n", kind);
    exit(2);
}

/* Frees `o`; with `verbose`, prints the kind's intermediate steps. */
static void free_kind(const char *kind, struct obj *o, int verbose) {
    if (strcmp(kind, "alloc") == 0 || strcmp(kind, "pitch") == 0 || strcmp(kind, "managed") == 0) {
        CHECK(A.memFree(o->ptr));
    } else if (strcmp(kind, "async") == 0) {
        CHECK(A.memFreeAsync(o->ptr, stream));
        if (verbose)
            step(kind, "free_async", CUDA_SUCCESS); /* the block is still the pool's */
        CHECK(A.streamSynchronize(stream));
    } else if (strcmp(kind, "async_ptsz") == 0) {
        CHECK(A.memFreeAsyncPtsz(o->ptr, NULL));
        if (verbose)
            step(kind, "free_async", CUDA_SUCCESS);
        CHECK(A.streamSynchronizePtsz(NULL));
    } else if (strcmp(kind, "pool") == 0) {
        /* The own pool keeps everything (release threshold = max) until trimmed. */
        CHECK(A.memFreeAsync(o->ptr, stream));
        if (verbose)
            step(kind, "free_async", CUDA_SUCCESS);
        CHECK(A.streamSynchronize(stream));
        if (verbose)
            step(kind, "synced", CUDA_SUCCESS);
        CHECK(A.memPoolTrimTo(own_pool, 0));
    } else if (strcmp(kind, "vmm") == 0) {
        CHECK(A.memRelease(o->handle));
        if (verbose)
            step(kind, "released", CUDA_SUCCESS); /* still mapped: still device memory */
        CHECK(A.memUnmap(o->va, o->size));
        CHECK(A.memAddressFree(o->va, o->size));
    } else if (strcmp(kind, "array") == 0 || strcmp(kind, "array3d") == 0) {
        CHECK(A.arrayDestroy(o->arr));
    } else if (strcmp(kind, "mipmap") == 0) {
        CHECK(A.mipmappedArrayDestroy(o->mip));
    }
}

static const char *const KINDS[] = {"alloc", "pitch", "managed", "async", "async_ptsz",
                                    "pool",  "vmm",   "array",   "array3d", "mipmap"};
#define NKINDS (sizeof KINDS / sizeof KINDS[0])

static void matrix_kind(const char *kind) {
    struct obj a, b;
    step(kind, "start", CUDA_SUCCESS);
    CUresult rc_a = alloc_kind(kind, SIZE_A, &a);
    step(kind, "a", rc_a);
    fprintf(stderr, "quota_paths: begin %s\n", kind);
    fflush(stderr);
    CUresult rc_b = alloc_kind(kind, SIZE_B, &b);
    fprintf(stderr, "quota_paths: end %s\n", kind);
    fflush(stderr);
    step(kind, "b", rc_b);
    if (rc_b == CUDA_SUCCESS)
        free_kind(kind, &b, 0);
    if (rc_a == CUDA_SUCCESS)
        free_kind(kind, &a, 1);
    step(kind, "a_freed", CUDA_SUCCESS);
    rc_b = alloc_kind(kind, SIZE_B, &b);
    step(kind, "b2", rc_b);
    if (rc_b == CUDA_SUCCESS)
        free_kind(kind, &b, 0);
    step(kind, "end", CUDA_SUCCESS);
}

static void fill_kind(const char *kind) {
    enum { MAX = 512 };
    static struct obj objs[MAX];
    int n = 0;
    CUresult rc = CUDA_SUCCESS;
    while (n < MAX && (rc = alloc_kind(kind, SIZE_CHUNK, &objs[n])) == CUDA_SUCCESS)
        n++;
    printf("%s.fill_count=%d\n%s.fill_rc=%d\n", kind, n, kind, (int)rc);
    for (int i = 0; i < n; i++)
        free_kind(kind, &objs[i], 0);
    size_t free_b = 0, total_b = 0;
    CHECK(A.memGetInfo(&free_b, &total_b));
    printf("%s.fill_free_after=%zu\n%s.fill_total_after=%zu\n", kind, free_b, kind, total_b);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef QUOTA_LINKED
    const char *how = "linked";
#else
    if (argc < 2) {
        fprintf(stderr, "usage: %s dlsym|v1|v2 matrix|fill\n", argv[0]);
        return 2;
    }
    const char *how = argv[1];
    argc--;
    argv++;
#endif
    const char *mode = argc > 1 ? argv[1] : "matrix";
    bind_all(how);
    print_all_bound();

    CHECK(A.init(0));
    CHECK(A.deviceGet(&dev, 0));
    CUuuid uuid;
    CHECK(A.deviceGetUuid(&uuid, dev));
    const unsigned char *u = (const unsigned char *)uuid.bytes;
    printf("device_uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
    size_t total = 0;
    CHECK(A.deviceTotalMem(&total, dev));
    printf("total_mem=%zu\n", total);

    CUcontext ctx;
    CHECK(A.primaryRetain(&ctx, dev));
    CHECK(A.ctxSetCurrent(ctx));
    CHECK(A.streamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CHECK(A.memPoolCreate(&own_pool, &props));
    cuuint64_t keep_all = UINT64_MAX;
    CHECK(A.memPoolSetAttribute(own_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    size_t granularity = 0;
    CUmemAllocationProp prop = vmm_prop();
    CHECK(A.memGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("vmm_granularity=%zu\n", granularity);

    if (strcmp(mode, "hold") == 0) {
        /* Hold A (cuMemAlloc) until stdin closes: another process of the tenant looks meanwhile. */
        struct obj a;
        CHECK(alloc_kind("alloc", SIZE_A, &a));
        printf("ready=1\n");
        fflush(stdout);
        char buf[64];
        while (fread(buf, 1, sizeof buf, stdin) > 0)
            ;
        free_kind("alloc", &a, 0);
    }
    if (strcmp(mode, "reuse") == 0) {
        /* Stream-ordered memory reused before any synchronisation: the pool hands the freed block
         * out again without growing, so the quota must not refuse it. Then a second block that does
         * not fit beside the first: the pool would have to grow past the quota. */
        struct obj a, b, c;
        memset(&b, 0, sizeof b);
        CUresult rc = alloc_kind("async", SIZE_A, &a);
        printf("reuse.first=%d\n", (int)rc);
        CHECK(A.memFreeAsync(a.ptr, stream));
        rc = alloc_kind("async", SIZE_A, &b);
        printf("reuse.again=%d\n", (int)rc);
        if (rc != CUDA_SUCCESS)
            b.ptr = 0;
        rc = alloc_kind("async", SIZE_A, &c);
        printf("reuse.beside=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS)
            CHECK(A.memFreeAsync(c.ptr, stream));
        if (b.ptr != 0)
            CHECK(A.memFreeAsync(b.ptr, stream));
        CHECK(A.streamSynchronize(stream));
        size_t free_b = 0, total_b = 0;
        CHECK(A.memGetInfo(&free_b, &total_b));
        printf("reuse.free_after=%zu\n", free_b);
        mode = "done";
    }
    for (size_t k = 0; k < NKINDS && strcmp(mode, "hold") != 0 && strcmp(mode, "done") != 0; k++) {
        if (strcmp(mode, "matrix") == 0)
            matrix_kind(KINDS[k]);
        else if (strcmp(mode, "fill") == 0)
            fill_kind(KINDS[k]);
        else {
            printf("error=unknown mode %s (expected matrix or fill)\n", mode);
            return 2;
        }
    }

    CHECK(A.memPoolDestroy(own_pool));
    CHECK(A.streamDestroy(stream));
    CHECK(A.primaryRelease(dev));
    printf("done=1\n");
    return 0;
}

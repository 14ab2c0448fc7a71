/* cuGetProcAddress (11.3 entry point, resolved by dlsym as old runtimes do) and _v2 answers. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

typedef CUresult (*gpa_v1)(const char *, void **, int, cuuint64_t);

int main(void) {
    int bad = 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    gpa_v1 v1 = (gpa_v1)dlsym(lib, "cuGetProcAddress");
    void *fn = (void *)0x1234;
    /* Before cuInit: allowed. */
    CUresult r = v1("cuMemAlloc", &fn, 11030, 0);
    bad |= r != CUDA_SUCCESS || fn != dlsym(lib, "cuMemAlloc_v2");
    fn = (void *)0x1234;
    r = v1("cuNope", &fn, 11030, 0);
    bad |= r != CUDA_ERROR_NOT_FOUND || fn != (void *)0x1234;
    r = v1("cuMemAlloc", &fn, 1000, 0);
    bad |= r != CUDA_ERROR_NOT_FOUND || fn != (void *)0x1234;
    r = v1("cuMemAlloc", &fn, 11030, 8);
    bad |= r != CUDA_ERROR_INVALID_VALUE || fn != (void *)0x1234;
    r = v1(NULL, &fn, 11030, 0);
    bad |= r != CUDA_ERROR_INVALID_VALUE;
    r = v1("cuMemcpy", &fn, 11030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    bad |= r != CUDA_SUCCESS || fn != dlsym(lib, "cuMemcpy_ptds");
    /* v2 with a NULL status pointer. */
    r = cuGetProcAddress("cuNope", &fn, 12000, 0, NULL);
    bad |= r != CUDA_SUCCESS || fn != NULL;
    printf(bad ? "FAILED\n" : "ALL OK\n");
    return bad;
}

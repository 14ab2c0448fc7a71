/* Two processes share one device: the child's allocation shows in the parent's cuMemGetInfo, and
 * the parent cannot allocate what the child holds. Run with SIMGPU_MEMORY=1GiB. */
#include <cuda.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    int p2c[2], c2p[2];
    if (pipe(p2c) || pipe(c2p)) return 2;
    pid_t pid = fork();
    CUcontext ctx;
    CUdevice dev;
    char b = 0;
    if (pid == 0) {
        cuInit(0);
        cuDeviceGet(&dev, 0);
        cuDevicePrimaryCtxRetain(&ctx, 0);
        cuCtxSetCurrent(ctx);
        CUdeviceptr d;
        CUresult r = cuMemAlloc(&d, 400 << 20);
        b = r == CUDA_SUCCESS;
        if (write(c2p[1], &b, 1) != 1) return 2;
        if (read(p2c[0], &b, 1) != 1) return 2; /* hold it until the parent has looked */
        return 0;
    }
    if (read(c2p[0], &b, 1) != 1 || !b) { printf("FAILED: child alloc\n"); return 1; }
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    size_t free_, total;
    cuMemGetInfo(&free_, &total);
    CUdeviceptr d;
    CUresult r = cuMemAlloc(&d, 400 << 20); /* 2 contexts + 400 MiB held: must not fit */
    printf("parent sees free %zu of %zu; 400 MiB alloc -> %d\n", free_, total, r);
    int bad = r != CUDA_ERROR_OUT_OF_MEMORY;
    if (write(p2c[1], &b, 1) != 1) return 2;
    waitpid(pid, NULL, 0);
    cuMemGetInfo(&free_, &total);
    r = cuMemAlloc(&d, 400 << 20);
    printf("after child exit: free %zu; 400 MiB alloc -> %d\n", free_, r);
    bad |= r != CUDA_SUCCESS;
    printf(bad ? "FAILED\n" : "ALL OK\n");
    return bad;
}

/* An IPC exporter and an importer of one tenant in one pod (tests/node_reconcile.rs), as vLLM's
 * custom all-reduce or UCX share buffers between the processes of a job: the program forks before
 * CUDA is initialised; the parent exports, the child imports. An unmodified CUDA program linked
 * with -lcuda on device 0's primary context. The parent prints key=value lines (each CUresult, 0 =
 * success) and waits for a line of stdin after each step, where the test compares the counters;
 * the child acts when the parent tells it through a pipe and answers its CUresult.
 *
 * Usage: ipc_pod MIB
 *   both processes' primary contexts: pid=, host_pid= (the parent's), child_pid=, child_host_pid=,
 *   ready=1, wait; the parent allocates MIB MiB and exports it (export_rc), and opens its own
 *   handle (self_rc, a driver refuses: 201) and the child's open with a flag it does not know
 *   (badflag_rc, 1): exported=1, wait; the child opens the handle (import_rc): imported=1, wait;
 *   the parent frees the allocation (free_rc): freed=1, wait; the child writes through its mapping
 *   (kept_rc) and the parent fills the tenant's quota with 2 MiB allocations until one is refused
 *   (fill_mib=), then frees them: kept=1, wait; the child closes its mapping (close_rc): closed=1,
 *   wait; both exit.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MIB (1024ull * 1024ull)

enum { OPEN = 1, OPEN_BAD_FLAG, WRITE, CLOSE, EXIT };

static void wait_line(void) {
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) exit(0);
}

/* The host PID: this process as the host's /proc (bind-mounted at $SIMGPU_HOST_PROC) names it. */
static long host_pid(void) {
    const char *proc = getenv("SIMGPU_HOST_PROC");
    char path[512], target[64];
    if (!proc) return -1;
    snprintf(path, sizeof path, "%s/self", proc);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return -1;
    target[n] = 0;
    return strtol(target, 0, 10);
}

static void put(int fd, const void *p, size_t n) {
    if (write(fd, p, n) != (ssize_t)n) exit(3);
}

static void get(int fd, void *p, size_t n) {
    if (read(fd, p, n) != (ssize_t)n) exit(0);
}

static void context(void) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

/* The importer: acts on each command (with the handle where it needs one) and answers a CUresult. */
static void importer(int in, int out) {
    context();
    long ids[2] = {(long)getpid(), host_pid()};
    put(out, ids, sizeof ids);
    CUdeviceptr mapped = 0;
    for (;;) {
        int cmd = 0, rc = 0;
        CUipcMemHandle handle;
        get(in, &cmd, sizeof cmd);
        if (cmd == OPEN || cmd == OPEN_BAD_FLAG) get(in, &handle, sizeof handle);
        if (cmd == OPEN) {
            rc = cuIpcOpenMemHandle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        } else if (cmd == OPEN_BAD_FLAG) {
            CUdeviceptr p;
            rc = cuIpcOpenMemHandle(&p, handle, 0x80);
        } else if (cmd == WRITE) {
            rc = cuMemsetD8(mapped, 0x5a, 1 << 20);
            if (rc == CUDA_SUCCESS) rc = cuCtxSynchronize();
        } else if (cmd == CLOSE) {
            rc = cuIpcCloseMemHandle(mapped);
        } else {
            exit(0);
        }
        put(out, &rc, sizeof rc);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: ipc_pod MIB\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], 0, 10) * MIB;
    int down[2], up[2];
    if (pipe(down) || pipe(up)) return 3;
    pid_t child = fork();
    if (child < 0) return 3;
    if (child == 0) {
        close(down[1]);
        close(up[0]);
        importer(down[0], up[1]);
        return 0;
    }
    close(down[0]);
    close(up[1]);
    int to = down[1], from = up[0];
    context();
    long ids[2];
    get(from, ids, sizeof ids);
    printf("pid=%ld\nhost_pid=%ld\nchild_pid=%ld\nchild_host_pid=%ld\nready=1\n", (long)getpid(),
           host_pid(), ids[0], ids[1]);
    wait_line();

    int cmd, rc;
    CUdeviceptr p;
    CUipcMemHandle handle;
    CHECK(cuMemAlloc(&p, bytes));
    printf("export_rc=%d\n", (int)cuIpcGetMemHandle(&handle, p));
    CUdeviceptr self;
    printf("self_rc=%d\n", (int)cuIpcOpenMemHandle(&self, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    cmd = OPEN_BAD_FLAG;
    put(to, &cmd, sizeof cmd);
    put(to, &handle, sizeof handle);
    get(from, &rc, sizeof rc);
    printf("badflag_rc=%d\nexported=1\n", rc);
    wait_line();

    cmd = OPEN;
    put(to, &cmd, sizeof cmd);
    put(to, &handle, sizeof handle);
    get(from, &rc, sizeof rc);
    printf("import_rc=%d\nimported=1\n", rc);
    wait_line();

    printf("free_rc=%d\nfreed=1\n", (int)cuMemFree(p));
    wait_line();

    cmd = WRITE;
    put(to, &cmd, sizeof cmd);
    get(from, &rc, sizeof rc);
    printf("kept_rc=%d\n", rc);
    static CUdeviceptr chunks[1 << 14];
    int n = 0;
    while (n < (int)(sizeof chunks / sizeof *chunks) && cuMemAlloc(&chunks[n], 2 * MIB) == CUDA_SUCCESS) n++;
    printf("fill_mib=%d\n", 2 * n);
    while (n > 0) CHECK(cuMemFree(chunks[--n]));
    printf("kept=1\n");
    wait_line();

    cmd = CLOSE;
    put(to, &cmd, sizeof cmd);
    get(from, &rc, sizeof rc);
    printf("close_rc=%d\nclosed=1\n", rc);
    wait_line();

    cmd = EXIT;
    put(to, &cmd, sizeof cmd);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
}

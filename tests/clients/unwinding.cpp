/* A C++ program linked with -lcuda that throws and catches exceptions across frames while gpuslice is
 * loaded: libstdc++'s exceptions unwind with libgcc_s, gpuslice's panics with the unwinder linked
 * into gpuslice (shim-c/static_unwinder.rs). Calls the driver from destructors run while
 * an exception unwinds, and with `panic` asks for the debug build's test-only panic device
 * (src/hooks/info.rs, `PANIC_DEVICE`) from such a destructor: gpuslice must catch its panic and
 * answer an error, and the C++ exception must still reach its handler.
 * Prints key=value lines: total, total_rc, caught, destructor_calls, panic_rc (with `panic`), after_rc. Build: c++ -I<cuda
 * include> unwinding.cpp -L<driver dir> -lcuda. Usage: unwinding [panic]. */
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

static const CUdevice PANIC_DEVICE = -0x00504e43;
static int calls_in_destructors = 0;
static int panic_rc = -1;
static bool ask_panic = false;

struct CallsTheDriver {
    bool panic_here;
    ~CallsTheDriver() {
        size_t bytes = 0;
        if (cuDeviceTotalMem(&bytes, 0) == CUDA_SUCCESS && bytes > 0) calls_in_destructors++;
        if (panic_here) panic_rc = (int)cuDeviceTotalMem(&bytes, PANIC_DEVICE);
    }
};

__attribute__((noinline)) static void deep(int depth, int panic_at) {
    CallsTheDriver guard{ask_panic && depth == panic_at};
    if (depth == 0) throw std::runtime_error("from the deepest frame");
    deep(depth - 1, panic_at);
}

static int throw_and_catch(int depth, int panic_at) {
    try {
        deep(depth, panic_at);
    } catch (const std::runtime_error &e) {
        return std::strcmp(e.what(), "from the deepest frame") == 0 ? 1 : 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    ask_panic = argc > 1 && std::string(argv[1]) == "panic";
    if (cuInit(0) != CUDA_SUCCESS) {
        std::printf("error=cuInit\n");
        return 1;
    }
    size_t total = 0;
    CUresult rc = cuDeviceTotalMem(&total, 0);
    std::printf("total=%zu\ntotal_rc=%d\n", total, (int)rc);
    int caught = 0;
    caught += throw_and_catch(5, 3);  /* the panic (if asked) in a destructor mid-unwind */
    caught += throw_and_catch(8, -1); /* and exceptions after it */
    try {
        throw 42;
    } catch (int v) {
        caught += v == 42;
    }
    std::printf("caught=%d\ndestructor_calls=%d\n", caught, calls_in_destructors);
    if (ask_panic) std::printf("panic_rc=%d\n", panic_rc);
    size_t again = 0;
    std::printf("after_rc=%d\n", (int)cuDeviceTotalMem(&again, 0));
    std::fflush(stdout);
    return 0;
}

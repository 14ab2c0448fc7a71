"""What the compute benchmarks share (scripts/bench/compute_contended.py, shares_matrix.py): the
release build of the shim and simgpu, simgpu installed as a driver in a private directory, and the
compute client (tests/clients/compute_client.c) built against NVIDIA's header and that driver."""
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(prefix):
    """Builds, installs and compiles; returns (release dir, private work dir, simgpu's lib dir,
    the compute client's path). The caller removes the work dir."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    if not os.path.isabs(target):
        target = os.path.join(ROOT, target)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "gpuslice", "-p", "simgpu-cuda",
                    "-p", "simgpu-nvml", "-p", "simgpu-core"], cwd=ROOT, check=True)
    rel = os.path.join(target, "release")
    work = tempfile.mkdtemp(prefix=prefix)
    lib = os.path.join(work, "lib")
    subprocess.run(["bash", "scripts/install-simgpu.sh", rel, lib], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    client = os.path.join(work, "compute_client")
    subprocess.run(["cc", "-O2", "-Wall", "-I", os.path.join(ROOT, "target/nvidia/include/cu13"),
                    os.path.join(ROOT, "tests/clients/compute_client.c"), "-o", client,
                    "-L", lib, "-lcuda", "-ldl", "-lpthread"], check=True)
    return rel, work, lib, client

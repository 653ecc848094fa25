"""Repositories for LibTorch 2.x: the pinned PyTorch wheel, or $PP_LIBTORCH_DIR.

Two repositories, so that a build only fetches what its config uses:

  @libtorch2        --config=torch2 and --config=cuda: LibTorch's headers and
                    libraries. Target :torch_cpu links c10 + torch_cpu only.
  @libtorch2_cuda   --config=cuda only: fetches the CUDA libraries libtorch_cuda
                    needs that the CUDA toolkit does not ship (cuFile,
                    cuSPARSELt, NVSHMEM); @libtorch2//:torch_cuda, which adds
                    torch_cuda, c10_cuda and NCCL, depends on it as data.

Without PP_LIBTORCH_DIR the pinned wheels below are downloaded once (pip,
sha256 checked) into ~/.cache/pipe (or $XDG_CACHE_HOME/pipe) and unpacked into
one folder shared by every clone; see fetch_wheels.py. With PP_LIBTORCH_DIR set
to a LibTorch folder (include/ and lib/: an unpacked LibTorch archive, or the
torch/ folder of an installed PyTorch) nothing is downloaded.
"""

# The pinned LibTorch: PyTorch 2.11.0 for CUDA 13.0, the version lent GPU
# machines have carried. The C++ libraries in the wheel do not depend on the
# Python tag; cp311 is just one fixed file.
TORCH2_VERSION = "2.11.0"
_FOLDER = "torch-2.11.0-cu130"

# "<pip spec> <file> <sha256> <members to unpack>"
_TORCH_WHEELS = [
    "torch==2.11.0 torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl " +
    "7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a torch/include/,torch/lib/",
    # libtorch_cpu.so itself needs libcudart.so.13 and libcupti.so.13 (Kineto's
    # CUPTI is linked in), so even a CPU run loads these two; they are the only
    # CUDA libraries the CPU config needs, and they work without a GPU.
    "nvidia-cuda-runtime==13.0.96 nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl " +
    "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 nvidia/",
    "nvidia-cuda-cupti==13.0.85 nvidia_cuda_cupti-13.0.85-py3-none-manylinux_2_25_x86_64.whl " +
    "4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8 nvidia/",
]

# Named by the torch wheel's metadata; libtorch_cuda.so needs them and the CUDA
# 13.0 toolkit does not have them. cuBLAS, cuDNN, cuFFT, cuRAND, cuSPARSE,
# nvJitLink and NCCL come from the installed toolkit.
_CUDA_WHEELS = [
    "nvidia-cufile==1.15.1.6 nvidia_cufile-1.15.1.6-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl " +
    "08a3ecefae5a01c7f5117351c64f17c7c62efa5fffdbe24fc7d298da19cd0b44 nvidia/",
    "nvidia-cusparselt-cu13==0.8.0 nvidia_cusparselt_cu13-0.8.0-py3-none-manylinux2014_x86_64.whl " +
    "25e30a8a7323935d4ad0340b95a0b69926eee755767e8e0b1cf8dd85b197d3fd nvidia/",
    "nvidia-nvshmem-cu13==3.4.5 nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl " +
    "290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80 nvidia/",
]

_ENV = ["PP_LIBTORCH_DIR", "XDG_CACHE_HOME", "HOME", "CUDA_HOME"]

def _cache_dir(ctx):
    xdg = ctx.os.environ.get("XDG_CACHE_HOME", "")
    if xdg:
        return xdg + "/pipe"
    return ctx.os.environ.get("HOME", "/tmp") + "/.cache/pipe"

def _torch_root(ctx):
    """The LibTorch folder (has include/ and lib/)."""
    user = ctx.os.environ.get("PP_LIBTORCH_DIR", "")
    if user:
        return user.rstrip("/")
    return _cache_dir(ctx) + "/" + _FOLDER + "/torch"

def _fetch(ctx, wheels):
    script = ctx.path(Label("//third_party/torch:fetch_wheels.py"))
    python = ctx.which("python3")
    if not python:
        fail("python3 is needed to fetch the pinned LibTorch wheel (or set PP_LIBTORCH_DIR)")
    cache = _cache_dir(ctx)
    args = [python, script, "--cache", cache, "--dest", cache + "/" + _FOLDER]
    for w in wheels:
        args += ["--wheel", w]
    result = ctx.execute(args, timeout = 3600, quiet = False)
    if result.return_code != 0:
        fail("fetching the pinned LibTorch %s failed:\n%s%s" % (TORCH2_VERSION, result.stdout, result.stderr))

def _libtorch2_impl(ctx):
    user = ctx.os.environ.get("PP_LIBTORCH_DIR", "")
    _fetch(ctx, [] if user else _TORCH_WHEELS)
    root = _torch_root(ctx)
    include = ctx.path(root + "/include")
    if not include.exists:
        fail("%s has no include/ folder; PP_LIBTORCH_DIR must name a LibTorch folder (include/ and lib/)" % root)

    # Headers are declared (Bazel checks every inclusion), minus the copy of
    # protobuf's headers bundled in the wheel, which would shadow the system
    # protobuf pipe's generated code is compiled against, and pybind11.
    for entry in include.readdir():
        if entry.basename not in ["google", "pybind11"]:
            ctx.symlink(entry, "include/" + entry.basename)
    lib = root + "/lib"
    nvidia = root + "/../nvidia"
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# CPU: c10 + torch_cpu only (libtorch.so would pull in libtorch_cuda.so).
cc_library(
    name = "torch_cpu",
    hdrs = glob(["include/**"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["USE_C10D_GLOO"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-Wl,-rpath-link,{nvidia}/cu13/lib",
        "-Wl,--no-as-needed",
        "-ltorch_cpu",
        "-lc10",
        "-Wl,--as-needed",
        "-lpthread",
    ],
)

# No USE_C10D_NCCL here: //common:torch_compat, the one target that uses NCCL's
# headers, sets it for itself (tools/pp.bzl NCCL_LOCAL_DEFINES). And @libtorch2_cuda (which fetches the CUDA
# wheels) is a data dependency, not a deps one: Bazel adds an -iquote per
# repository of a target's deps to every compile command, which would make
# every file's command differ from --config=torch2's. So every other file
# compiles the same under both configs, and they share one set of objects.
cc_library(
    name = "torch_cuda",
    data = ["@libtorch2_cuda//:fetched"],
    linkopts = [
        "-Wl,--no-as-needed",
        "-ltorch_cuda",
        "-lc10_cuda",
        "-Wl,--as-needed",
    ] + {cuda_link_dirs},
    deps = [":torch_cpu"],
)
""".format(lib = lib, nvidia = nvidia, cuda_link_dirs = repr(_cuda_link_options(ctx))))

libtorch2_repository = repository_rule(
    implementation = _libtorch2_impl,
    environ = _ENV,
    local = True,
)

def _cuda_link_options(ctx):
    """Where the linker finds the libraries libtorch_cuda.so needs (the
    wheels @libtorch2_cuda fetches, and the toolkit). At run time the wheel's
    own $ORIGIN/../../nvidia/... run paths and ld.so.conf find them."""
    nvidia = _torch_root(ctx) + "/../nvidia"
    cuda_home = ctx.os.environ.get("CUDA_HOME", "") or "/usr/local/cuda"
    link_dirs = [nvidia + "/" + d + "/lib" for d in ["cu13", "cusparselt", "nvshmem", "nccl", "cudnn"]]
    link_dirs.append(cuda_home + "/lib64")
    return ["-Wl,-rpath-link," + d for d in link_dirs]

def _libtorch2_cuda_impl(ctx):
    user = ctx.os.environ.get("PP_LIBTORCH_DIR", "")
    _fetch(ctx, [] if user else _TORCH_WHEELS + _CUDA_WHEELS)
    ctx.file("fetched", "the CUDA wheels of LibTorch %s are unpacked\n" % TORCH2_VERSION)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# Fetching this repository unpacks the CUDA wheels; @libtorch2//:torch_cuda
# depends on this file as data (see there why not as deps).
exports_files(["fetched"])
""")

libtorch2_cuda_repository = repository_rule(
    implementation = _libtorch2_cuda_impl,
    environ = _ENV,
    local = True,
)

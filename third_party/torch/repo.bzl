"""A repository for a CUDA-built LibTorch named by $PP_LIBTORCH_CUDA_DIR (--config=cuda).

The default build uses Debian's CPU LibTorch and never needs this repository's
contents; without the variable the repository is a stub whose target fails with
a message saying what to set, so nothing is ever downloaded.
"""

def _libtorch_cuda_impl(ctx):
    root = ctx.os.environ.get("PP_LIBTORCH_CUDA_DIR", "")
    if root:
        ctx.symlink(root, "libtorch")
        includes = [root + "/include", root + "/include/torch/csrc/api/include"]
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    linkopts = [
        "-L{lib}", "-Wl,-rpath,{lib}", "-Wl,--no-as-needed",
        "-ltorch", "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10",
        "-Wl,--as-needed",
    ],
    defines = ["USE_C10D_GLOO", "USE_C10D_NCCL"],
)
""".format(lib = root + "/lib"))
    else:
        includes = []
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

genrule(
    name = "torch_missing",
    outs = ["torch_missing.txt"],
    cmd = "echo '--config=cuda needs PP_LIBTORCH_CUDA_DIR=<dir with include/ and lib/ of a CUDA LibTorch>' >&2; false",
)

cc_library(
    name = "torch",
    srcs = [":torch_missing"],
)
""")
    ctx.file("defs.bzl", "CUDA_TORCH_INCLUDES = %r\n" % includes)

libtorch_cuda_repository = repository_rule(
    implementation = _libtorch_cuda_impl,
    environ = ["PP_LIBTORCH_CUDA_DIR"],
    local = True,
)

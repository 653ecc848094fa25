"""pp_cc_fuzz_test: a libFuzzer target that is also a bounded test.

    pp_cc_fuzz_test(
        name = "manifest_fuzzer",
        srcs = ["manifest_fuzzer.cc"],   # defines LLVMFuzzerTestOneInput
        corpus = glob(["testdata/manifest_corpus/*"]),
        deps = [":checkpoint_dir"],
    )

makes `<name>` (a test: the seed corpus, then mutations from a fixed seed for
at most `seconds` or `runs` inputs; tools/fuzz/fuzz_driver.cc) and
`<name>_bin`. With --config=fuzz (.bazelrc: clang, -fsanitize=fuzzer,address)
`<name>_bin` is a libFuzzer binary:

    ./bazelw build --config=fuzz //checkpoint/model:manifest_fuzzer_bin
    bazel-bin/checkpoint/model/manifest_fuzzer_bin checkpoint/model/testdata/manifest_corpus
"""

load("//tools:pp.bzl", "PP_COPTS", "TORCH_COPTS")

def pp_cc_fuzz_test(name, srcs, corpus, deps = [], runs = 20000, seconds = 20, **kwargs):
    fuzz = "//tools/fuzz:libfuzzer"
    native.cc_binary(
        name = name + "_bin",
        testonly = True,
        srcs = srcs,
        copts = PP_COPTS + TORCH_COPTS,
        linkopts = select({fuzz: ["-fsanitize=fuzzer"], "//conditions:default": []}),
        deps = deps + select({fuzz: [], "//conditions:default": ["//tools/fuzz:fuzz_driver"]}),
    )
    native.sh_test(
        name = name,
        srcs = ["//tools/fuzz:run_fuzz_test.sh"],
        args = [
            "$(location :%s_bin)" % name,
            "--runs=%d" % runs,
            "--seconds=%d" % seconds,
        ] + ["$(location %s)" % c for c in corpus],
        data = [":" + name + "_bin"] + corpus,
        **kwargs
    )

"""A precompiled header of LibTorch's C++ API for every pipe target.

Parsing <torch/torch.h> takes gcc about 20 s of the 22 s a small pipe source
file costs to compile, and nearly every file includes it, so a cold build was
mostly the same header parsed a thousand times (docs/build_and_ci.md). gcc
reads a precompiled header instead when `-include H` finds `H.gch` beside H
and the `.gch` was built with the same options. `pp_precompiled_header`
builds it with this configuration's own compile command (the toolchain's
features, --copt/--cxxopt and the given copts) into the directory `H.gch/`
(gcc tries every file there and takes the first valid one). A `.gch` gcc finds
invalid (a target's own -O2, say) is ignored and the header is parsed as text:
slower, never wrong.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "CPP_COMPILE_ACTION_NAME")

def _precompiled_header_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    features = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    header = ctx.actions.declare_file(ctx.attr.header)
    ctx.actions.write(header, "".join(["#include <%s>\n" % h for h in ctx.attr.includes]))
    deps_context = cc_common.merge_cc_infos(
        cc_infos = [d[CcInfo] for d in ctx.attr.deps],
    ).compilation_context
    compiler = cc_common.get_tool_for_action(
        feature_configuration = features,
        action_name = CPP_COMPILE_ACTION_NAME,
    )
    outputs = [header]
    # -fPIC only: the default and sanitizer builds compile every file with
    # it (a `-c opt` binary's non-PIC objects parse the header as text). One
    # variant per entry of `variants` (extra flags: the hot loops' -O2).
    for kind, extra_flags in [("pic", [])] + [
        ("pic_" + name, flags)
        for name, flags in ctx.attr.variants.items()
    ]:
        gch = ctx.actions.declare_file(ctx.attr.header + ".gch/" + kind + ".h")
        # Built with its dependencies recorded, so that a file compiled with
        # -fpch-deps (tools/pp.bzl) lists LibTorch's headers in its own .d file
        # as if it had parsed them: Bazel then recompiles it when they change.
        dependencies = ctx.actions.declare_file(ctx.attr.header + "." + kind + ".d")
        variables = cc_common.create_compile_variables(
            feature_configuration = features,
            cc_toolchain = cc_toolchain,
            user_compile_flags = (ctx.fragments.cpp.copts + ctx.fragments.cpp.cxxopts +
                                  ctx.attr.copts + extra_flags),
            source_file = header.path,
            output_file = gch.path,
            include_directories = deps_context.includes,
            quote_include_directories = deps_context.quote_includes,
            system_include_directories = deps_context.system_includes,
            preprocessor_defines = deps_context.defines,
            use_pic = True,
        )
        command_line = cc_common.get_memory_inefficient_command_line(
            feature_configuration = features,
            action_name = CPP_COMPILE_ACTION_NAME,
            variables = variables,
        )
        ctx.actions.run(
            executable = compiler,
            # -x before the file: a .h is C to gcc otherwise.
            arguments = ["-x", "c++-header"] + command_line + ["-MD", "-MF", dependencies.path],
            env = cc_common.get_environment_variables(
                feature_configuration = features,
                action_name = CPP_COMPILE_ACTION_NAME,
                variables = variables,
            ),
            inputs = depset([header], transitive = [cc_toolchain.all_files, deps_context.headers]),
            outputs = [gch, dependencies],
            mnemonic = "CppPrecompileHeader",
            progress_message = "Precompiling %s (%s)" % (ctx.attr.header, kind),
        )
        outputs.append(gch)
    return [DefaultInfo(files = depset(outputs))]

pp_precompiled_header = rule(
    implementation = _precompiled_header_impl,
    doc = "Writes `header` (one #include per entry of `includes`) and its .gch directory.",
    attrs = {
        "header": attr.string(mandatory = True),
        "includes": attr.string_list(mandatory = True),
        "copts": attr.string_list(),
        # name -> flags: an extra .gch built with these flags added (a
        # target's own copts such as -O2: gcc takes the .gch built like the
        # file).
        "variants": attr.string_list_dict(),
        "deps": attr.label_list(providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)

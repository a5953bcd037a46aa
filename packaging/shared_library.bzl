"""kolo_shared_library: one shared library holding every object of `deps`.

A cc_binary(linkshared = 1) links its deps' objects as archive members
(--start-lib), so only what some object of its own references would end up
in it, which for a library whose API is all in its deps is nothing. This
rule takes the deps' own PIC objects (those of this workspace; system
libraries stay dynamic dependencies) and links all of them, with the deps'
link flags and a version script.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    objects = []
    link_flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            for flag in linker_input.user_link_flags:
                if flag not in link_flags:
                    link_flags.append(flag)
            for library in linker_input.libraries:
                objects.extend(library.pic_objects or library.objects or [])
    unique = {}
    for o in objects:
        unique[o.path] = o
    objects = unique.values()

    link_flags = [
        # GNU ld, not the toolchain's gold: gold keeps exporting the weak
        # std::string members that torch's C++20 headers instantiate in the
        # frontend's objects (four of them, with a pip torch >= 2.13) although
        # the version script makes everything but kolo's names local.
        "-fuse-ld=bfd",
        "-Wl,--version-script=" + ctx.file.version_script.path,
        "-Wl,-soname," + ctx.attr.soname,
    ] + link_flags
    linking_outputs = cc_common.link(
        name = ctx.label.name,
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        compilation_outputs = cc_common.create_compilation_outputs(
            objects = depset(objects),
            pic_objects = depset(objects),
        ),
        user_link_flags = link_flags,
        additional_inputs = [ctx.file.version_script],
        output_type = "dynamic_library",
    )
    # The library itself, not the _solib_* symlink to it.
    library = (linking_outputs.library_to_link.resolved_symlink_dynamic_library or
               linking_outputs.library_to_link.dynamic_library)
    return [DefaultInfo(
        files = depset([library]),
        runfiles = ctx.runfiles(files = [library]),
    )]

kolo_shared_library = rule(
    implementation = _impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "soname": attr.string(mandatory = True),
        "version_script": attr.label(allow_single_file = True, mandatory = True),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

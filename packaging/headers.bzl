"""public_headers: the public headers of cc_library targets, as files."""

def _public_headers_impl(ctx):
    files = []
    for dep in ctx.attr.deps:
        for header in dep[CcInfo].compilation_context.headers.to_list():
            # Source files only (not the _virtual_includes symlinks that
            # strip_include_prefix creates), under one of the prefixes.
            if header.is_source and [p for p in ctx.attr.prefixes if header.short_path.startswith(p)]:
                files.append(header)
    return [DefaultInfo(files = depset(files), runfiles = ctx.runfiles(files = files))]

public_headers = rule(
    implementation = _public_headers_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "prefixes": attr.string_list(mandatory = True),
    },
)

"""torch_configure: the torch of one Python environment as the repository @torch.

KOLO_PYTHON names the interpreter (default /usr/bin/python3, whose torch is
Debian's python3-torch 1.13); the rule asks it, the way third_party/cuda.bzl
looks for CUDA, for torch's version, include and library folders, C++ ABI,
CUDA version and pybind11 build ABI, and for Python's own headers.
Generates:
  @torch//:torch      cc_library: LibTorch's headers and libraries (rpath)
  @torch//:python     cc_library: Python.h and pybind11 (torch's own copy
                      where it ships one, with its build-ABI defines),
                      libtorch_python: for the Python extension only
  @torch//:defs.bzl   TORCH_VERSION, TORCH_CUDA ("" without CUDA),
                      TORCH_COPTS (the C++ standard torch's headers need),
                      PYTHON (the interpreter), EXT_SUFFIX
  @torch//:install.env  shell assignments (TORCH_VERSION, TORCH_CXX_STD,
                      TORCH_INCLUDE_DIRS, TORCH_LIBDIR, TORCH_LIBS,
                      TORCH_NCCL: the libnccl.so.2 of a CUDA wheel) that
                      packaging/install_files.sh writes into the installed
                      CMake config and kolo.pc
A torch the build cannot serve fails here, in one line naming the version
and why: none importable, older than 1.13, or built with the old C++ ABI
(kolo's core links Debian's abseil, protobuf and gloo, built with the new
one). The torch-free core (runtime/, ops/) never depends on @torch.
"""

_OLDEST = (1, 13)

# Printed as one JSON line; warnings of `import torch` go to stderr.
_QUERY = """
import json, os, sys, sysconfig
out = {"python": sys.executable,
       "python_include": sysconfig.get_paths()["include"],
       "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX") or ""}
try:
    import torch
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
else:
    root = os.path.dirname(os.path.realpath(torch.__file__))
    out.update(
        version=torch.__version__.split("+")[0],
        include=os.path.realpath(os.path.join(root, "include")),
        lib=os.path.realpath(os.path.join(root, "lib")),
        cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        cuda=torch.version.cuda or "",
        # The NCCL a CUDA wheel loads (from its nvidia-nccl package).
        nccl=next((os.path.realpath(p) for p in [os.path.join(
            root, "..", "nvidia", "nccl", "lib", "libnccl.so.2")]
            if os.path.exists(p)), ""),
        pybind11_abi=[getattr(torch._C, "_PYBIND11_" + k, None) or ""
                      for k in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")])
print(json.dumps(out))
"""

def _version_tuple(version):
    parts = []
    for p in version.split(".")[:2]:
        digits = ""
        for c in p.elems():
            if not c.isdigit():
                break
            digits += c
        parts.append(int(digits) if digits else 0)
    return tuple(parts)

def _torch_configure_impl(rctx):
    python = rctx.os.environ.get("KOLO_PYTHON", "") or "/usr/bin/python3"
    where = "KOLO_PYTHON=%s" % python
    result = rctx.execute([python, "-c", _QUERY], quiet = True)
    if result.return_code != 0 or not result.stdout.strip():
        fail("%s: cannot run it to find torch: %s" % (
            where,
            (result.stderr.strip().splitlines() or ["exit %d" % result.return_code])[-1],
        ))
    info = json.decode(result.stdout.strip().splitlines()[-1])
    if "error" in info:
        fail("%s has no importable torch (%s): install one (pip install torch) " %
             (where, info["error"]) + "or point KOLO_PYTHON at a Python that has it")
    version = info["version"]
    if _version_tuple(version) < _OLDEST:
        fail("%s has torch %s; kolo needs torch 1.13 or newer" % (where, version))
    if not info["cxx11_abi"]:
        fail(("%s has torch %s built with the old C++ ABI " +
              "(_GLIBCXX_USE_CXX11_ABI=0); kolo links Debian's abseil, protobuf " +
              "and gloo, built with the new one: use a torch built with it " +
              "(PyPI's from 2.7 on)") % (where, version))

    include = info["include"]
    lib = info["lib"]
    api = include + "/torch/csrc/api/include"
    all_h = rctx.read(api + "/torch/all.h") if rctx.path(api + "/torch/all.h").exists else ""
    copts = ["-std=c++20"] if "202002L" in all_h else []
    cuda_libs = ["-ltorch_cuda", "-lc10_cuda"] if rctx.path(lib + "/libc10_cuda.so").exists else []

    # Debian's torch keeps its headers in /usr/include and its libraries in
    # the linker's own path: nothing to declare. Any other torch (pip's, in
    # a venv or the user's site-packages) is declared from its own folders.
    system = rctx.path("/usr/include/torch/csrc/api/include/torch/all.h").exists and \
             include.startswith("/usr/lib/python3/dist-packages/")
    rctx.symlink(info["python_include"], "python_include")
    if system:
        torch_rule = """cc_library(
    name = "torch",
    hdrs = glob(["usr_include/torch/csrc/api/include/**/*.h"]),
    includes = ["usr_include/torch/csrc/api/include"],
    linkopts = {linkopts},
)""".format(linkopts = repr(["-ltorch", "-ltorch_cpu", "-lc10"] + cuda_libs))
        rctx.symlink("/usr/include", "usr_include")
        python_linkopts = ["-ltorch_python"]
    else:
        rctx.symlink(include, "include")
        linkopts = ["-L" + lib, "-Wl,-rpath," + lib, "-ltorch", "-ltorch_cpu", "-lc10"] + cuda_libs
        torch_rule = """cc_library(
    name = "torch",
    hdrs = glob(["include/**"], exclude = ["include/pybind11/**"]),
    includes = ["include", "include/torch/csrc/api/include"],
    linkopts = {linkopts},
)""".format(linkopts = repr(linkopts))
        python_linkopts = ["-L" + lib, "-Wl,-rpath," + lib, "-ltorch_python"]
    pybind11_dir = include + "/pybind11"
    own_pybind11 = (not system) and rctx.path(pybind11_dir).exists
    defines = []
    for name, value in zip(["PYBIND11_COMPILER_TYPE", "PYBIND11_STDLIB", "PYBIND11_BUILD_ABI"],
                           info["pybind11_abi"]):
        if value:
            # One Bash token each (Bazel tokenizes defines): quotes escaped.
            defines.append('%s=\\"%s\\"' % (name, value))

    build = """package(default_visibility = ["//visibility:public"])

exports_files(["install.env"])

# Generated by //third_party:torch.bzl from {python} (torch {version}{cuda}).
{torch_rule}

# Python.h of {python}, pybind11 ({pybind11}) and libtorch_python: for the
# Python extension only.
cc_library(
    name = "python",
    hdrs = glob(["python_include/**/*.h"]){pybind11_hdrs},
    includes = ["python_include"],
    defines = {defines},
    linkopts = {python_linkopts},
    deps = [":torch"],
)
""".format(
        python = python,
        version = version,
        cuda = ", CUDA " + info["cuda"] if info["cuda"] else ", CPU",
        torch_rule = torch_rule,
        pybind11 = "torch's own" if own_pybind11 else "Debian's pybind11-dev",
        pybind11_hdrs = ' + glob(["include/pybind11/**"])' if own_pybind11 else "",
        defines = repr(defines),
        python_linkopts = repr(python_linkopts),
    )
    rctx.file("BUILD.bazel", build)
    rctx.file("defs.bzl", """# Generated by //third_party:torch.bzl.
TORCH_VERSION = {version}
TORCH_CUDA = {cuda}
TORCH_COPTS = {copts}
PYTHON = {python}
EXT_SUFFIX = {suffix}
""".format(
        version = repr(version),
        cuda = repr(info["cuda"]),
        copts = repr(copts),
        python = repr(info["python"]),
        suffix = repr(info["ext_suffix"]),
    ))
    # For tools/install.sh (packaging/install_files.sh): the torch a
    # program built outside Bazel must compile and link against to use the
    # installed libkolo.so.
    if system:
        include_dirs = ["/usr/include/torch/csrc/api/include"]
        libdir = "/usr/lib/x86_64-linux-gnu"
    else:
        include_dirs = [include, api]
        libdir = lib
    rctx.file("install.env", """# Generated by //third_party:torch.bzl from {python}.
TORCH_VERSION='{version}'
TORCH_CXX_STD='{std}'
TORCH_INCLUDE_DIRS='{include_dirs}'
TORCH_LIBDIR='{libdir}'
TORCH_LIBS='torch torch_cpu c10'
TORCH_NCCL='{nccl}'
""".format(
        python = python,
        version = version,
        std = "20" if copts else "17",
        include_dirs = " ".join(include_dirs),
        libdir = libdir,
        nccl = info.get("nccl", ""),
    ))
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)

torch_configure = repository_rule(
    implementation = _torch_configure_impl,
    environ = ["KOLO_PYTHON"],
    local = True,
)

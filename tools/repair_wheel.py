"""Makes the wheel that setup.py builds self-contained (tools/build_wheel.sh
runs this; docs/building.md, "Wheels"):

    repair_wheel.py WHEEL OUTDIR

1. auditwheel repair copies every shared library the wheel's programs need
   into kolo.libs/, under names with a hash in them (libgloo-1a2b3c4d.so.0),
   and tags the wheel with the manylinux platform its symbols allow. Not
   copied: the C/C++ runtime that manylinux allows, torch's own libraries,
   and NCCL and the CUDA runtime: kolo uses the ones torch loaded (the
   nvidia-* wheels beside torch), never a copy of its own.
2. The extension kolo/_C finds torch and those nvidia-* wheels by run paths
   relative to site-packages, as torch's own libraries find theirs, and
   names its own copies first among its dependencies: torch's libraries
   export gloo and protobuf symbols of their own, and the first library in
   that list that defines a name serves it.
3. kolorun and kolo_rank_guard, installed into the environment's bin/, find
   kolo.libs/ from there.
4. Checks that no program of the wheel needs a library that is neither in
   the wheel, nor allowed by its tag, nor torch's.

Runs with auditwheel, patchelf and wheel on PATH (tools/wheel_tools.sh).
A wheel built against Debian's python3-torch (CPU only, no NCCL of its
own) keeps the CUDA folder it was built with as its last run path.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

# Sonames a kolo wheel takes from torch's wheel and the nvidia-* wheels it
# brings, or from Debian's python3-torch: never copied into the wheel.
FROM_TORCH = ["libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so",
              "libtorch_python.so", "libc10.so", "libc10_cuda.so",
              "libnccl.so.*", "libcudart.so.*"]

# Where the extension (site-packages/kolo/_C...so) finds them: torch's lib/,
# and NCCL and the CUDA runtime of the nvidia-* wheels (CUDA 13's layout,
# then CUDA 12's), as torch's own libraries do.
TORCH_RPATH = ["$ORIGIN/../torch/lib", "$ORIGIN/../nvidia/nccl/lib",
               "$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/cuda_runtime/lib"]

LIBS = "kolo.libs"


def run(*args, **kwargs):
    return subprocess.run(args, check=True, text=True, stdout=subprocess.PIPE,
                          **kwargs).stdout


def dynamic(path):
    """(NEEDED sonames in order, run path) of an ELF file."""
    needed = run("patchelf", "--print-needed", path).split()
    rpath = run("patchelf", "--print-rpath", path).strip()
    return needed, rpath


def dynamic_in(wheel, prefix):
    """dynamic() of the one file of WHEEL whose name starts with PREFIX."""
    with zipfile.ZipFile(wheel) as z:
        [member] = [n for n in z.namelist() if n.startswith(prefix)]
        with tempfile.TemporaryDirectory() as d:
            return dynamic(z.extract(member, d))


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def main(wheel, outdir):
    work = tempfile.mkdtemp(prefix="kolo-wheel-")
    try:
        repaired = os.path.join(work, "repaired")
        args = ["auditwheel", "repair", "--plat", "auto", "-w", repaired]
        for soname in FROM_TORCH:
            args += ["--exclude", soname]
        subprocess.run(args + [wheel], check=True, stdout=sys.stderr)
        [name] = os.listdir(repaired)
        # What each copy was: auditwheel renames the extension's dependencies
        # in place, so its lists before and after pair them.
        grafted = {}
        before_needed, built_rpath = dynamic_in(wheel, "kolo/_C")
        for before, after in zip(before_needed,
                                 dynamic_in(os.path.join(repaired, name),
                                            "kolo/_C")[0]):
            if before != after:
                grafted[before] = after
        tree = os.path.join(work, "tree")
        run("wheel", "unpack", "--dest", tree, os.path.join(repaired, name))
        [root] = [os.path.join(tree, d) for d in os.listdir(tree)]
        libs = os.path.join(root, LIBS)
        own = sorted(grafted.values())

        # The wheel's Python, from its tag (kolo-0.1.0-cp312-cp312-...).
        tag = re.search(r"-cp(\d)(\d+)-", name)
        python_dir = "python%s.%s" % tag.groups()
        for dirpath, _, names in os.walk(root):
            for n in names:
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, root)
                if not is_elf(path) or rel.startswith(LIBS + os.sep):
                    continue
                needed, _ = dynamic(path)
                if rel.startswith("kolo" + os.sep) and n.startswith("_C"):
                    rpath = ["$ORIGIN/../" + LIBS] + TORCH_RPATH + \
                        system_torch_rpath(built_rpath)
                    # kolo's own copies first among the dependencies.
                    mine = [s for s in needed if s in own]
                    if mine:
                        remove = []
                        for s in mine:
                            remove += ["--remove-needed", s]
                        run("patchelf", *remove, path)
                        add = []
                        for s in mine:
                            add += ["--add-needed", s]
                        run("patchelf", *add, path)
                elif re.match(r"kolo-[^/]*\.data/data/bin/", rel):
                    # auditwheel copies for the package's programs only:
                    # these need the same libraries, under the copies' names.
                    replace = []
                    for s in needed:
                        if s in grafted:
                            replace += ["--replace-needed", s, grafted[s]]
                    if replace:
                        run("patchelf", *replace, path)
                    # bin/ and lib/pythonX.Y/site-packages/ share a prefix
                    # in a venv, a --user install and a system install.
                    rpath = ["$ORIGIN/../lib/%s/%s/%s" % (python_dir, d, LIBS)
                             for d in ("site-packages", "dist-packages")]
                else:
                    sys.exit("repair_wheel.py: %s is a program of the wheel "
                             "this script does not know where to place" % rel)
                run("patchelf", "--force-rpath", "--set-rpath", ":".join(rpath),
                    path)
                check(path, rel, own)
        os.makedirs(outdir, exist_ok=True)
        run("wheel", "pack", "--dest-dir", outdir, root)
        print(os.path.join(outdir, name))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def system_torch_rpath(built):
    """For a wheel built against Debian's python3-torch (CPU only, in the
    system's folders: no NCCL of its own), the folders it was built with
    (the machine's CUDA); none for a pip torch, whose NCCL is the nvidia
    wheel's."""
    folders = [d for d in built.split(":") if d]
    if any("-packages/torch/lib" in d for d in folders):
        return []
    return folders


# The C/C++ runtime and the system libraries every manylinux platform has.
_SYSTEM = re.compile(r"^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|"
                     r"libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|"
                     r"libstdc\+\+\.so\.6|libgcc_s\.so\.1|libutil\.so\.1)$")


def check(path, rel, own):
    needed, _ = dynamic(path)
    allowed = lambda s: (s in own or _SYSTEM.match(s) or any(
        re.match("^" + p.replace(".", r"\.").replace("*", ".*") + "$", s)
        for p in FROM_TORCH))
    stray = [s for s in needed if not allowed(s)]
    if stray:
        sys.exit("repair_wheel.py: %s needs %s, which the wheel neither "
                 "carries nor takes from torch" % (rel, ", ".join(stray)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: repair_wheel.py WHEEL OUTDIR")
    main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]))

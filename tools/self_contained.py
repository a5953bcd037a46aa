"""Makes kolo's built programs self-contained: every shared library they
need beyond the C/C++ runtime, torch, NCCL and the CUDA runtime is copied
next to them, under a name with a hash of its contents in it
(libgloo-7592c4f9.so.0.5.0), so that it cannot clash with another copy in
the process, and the programs name the copies (docs/building.md, "Wheels").
One rule for the two things kolo ships built:

    self_contained.py wheel WHEEL OUTDIR   # the wheel setup.py builds
    self_contained.py tree LIBDIR FILE...  # tools/install.sh --tarball

wheel: the copies go into kolo.libs/ beside the package; the extension
kolo/_C finds them, torch's lib/ and the nvidia-* wheels' NCCL and CUDA
runtime by run paths relative to site-packages (as torch's own libraries
find theirs); kolorun and kolo_rank_guard, installed into the
environment's bin/, find kolo.libs/ from there. The wheel is then tagged
with the manylinux platform auditwheel reads from its symbol versions.
tree: the copies go into LIBDIR/kolo.libs/, and FILEs (libraries in
LIBDIR, programs anywhere in the tree) find them by $ORIGIN.

In both, the copies come first among a program's dependencies: torch's
libtorch_cpu.so and libtorch_cuda.so export gloo and protobuf symbols of
their own, and the loader serves a name from the first library in that
list that defines it. A library that is neither copied, nor the C/C++
runtime, nor torch's is an error. A program built against Debian's
python3-torch (CPU only, no NCCL of its own) keeps the CUDA folder it was
built with as its last run path.

Runs with auditwheel, patchelf and wheel on PATH (tools/wheel_tools.sh).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Sonames kolo takes from torch's install (its lib/ and the nvidia-* wheels
# it brings) or from Debian's python3-torch: never copied.
FROM_TORCH = re.compile(r"^(libtorch(_cpu|_cuda|_python)?\.so|libc10(_cuda)?\.so|"
                        r"libnccl\.so|libcudart\.so)(\.[0-9.]+)?$")

# The C/C++ runtime every manylinux platform has (auditwheel's list).
SYSTEM = re.compile(r"^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|"
                    r"libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|"
                    r"libstdc\+\+\.so\.6|libgcc_s\.so\.1|libutil\.so\.1|"
                    r"libatomic\.so\.1)$")

# Where the extension (site-packages/kolo/_C...so) finds torch: its lib/,
# and NCCL and the CUDA runtime of the nvidia-* wheels (CUDA 13's layout,
# then CUDA 12's).
TORCH_RPATH = ["$ORIGIN/../torch/lib", "$ORIGIN/../nvidia/nccl/lib",
               "$ORIGIN/../nvidia/cu13/lib", "$ORIGIN/../nvidia/cuda_runtime/lib"]

LIBS = "kolo.libs"


def run(*args, **kwargs):
    return subprocess.run(args, check=True, text=True, stdout=subprocess.PIPE,
                          **kwargs).stdout


def needed(path):
    return run("patchelf", "--print-needed", path).split()


def rpath(path):
    return [d for d in run("patchelf", "--print-rpath", path).strip().split(":") if d]


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def system_libraries():
    """soname -> path of the libraries the loader finds by itself."""
    found = {}
    for line in run("ldconfig", "-p").splitlines()[1:]:
        m = re.match(r"\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)", line)
        if m and m.group(1) not in found:
            found[m.group(1)] = m.group(2)
    return found


def find(soname, wanted_by, system):
    for d in rpath(wanted_by):
        d = d.replace("$ORIGIN", os.path.dirname(wanted_by))
        if os.path.exists(os.path.join(d, soname)):
            return os.path.realpath(os.path.join(d, soname))
    if soname in system:
        return os.path.realpath(system[soname])
    sys.exit("self_contained.py: %s needs %s, which is nowhere here" %
             (wanted_by, soname))


def graft(programs, libs):
    """Copies into LIBS every library PROGRAMS need (and those need) that is
    neither the C/C++ runtime nor torch's, renamed; makes every program and
    copy name the copies, the copies first. Returns {old soname: new}."""
    system = system_libraries()
    copies = {}
    todo = list(programs)
    while todo:
        f = todo.pop()
        for soname in needed(f):
            if soname in copies or SYSTEM.match(soname) or FROM_TORCH.match(soname):
                continue
            source = find(soname, f, system)
            with open(source, "rb") as g:
                digest = hashlib.sha256(g.read()).hexdigest()[:8]
            stem, rest = soname.split(".so", 1)
            copies[soname] = "%s-%s.so%s" % (stem, digest, rest)
            os.makedirs(libs, exist_ok=True)
            target = os.path.join(libs, copies[soname])
            shutil.copyfile(source, target)
            os.chmod(target, 0o755)
            run("patchelf", "--set-soname", copies[soname], target)
            run("patchelf", "--force-rpath", "--set-rpath", "$ORIGIN", target)
            todo.append(target)
    for f in list(programs) + [os.path.join(libs, c) for c in copies.values()]:
        mine = [s for s in needed(f) if s in copies]
        if not mine:
            continue
        # Renamed where they are (--replace-needed renames the symbol
        # version requirements too), then moved first: --add-needed puts
        # its names at the head of the list.
        run("patchelf", *[a for s in mine for a in ("--replace-needed", s, copies[s])], f)
        run("patchelf", *[a for s in mine for a in ("--remove-needed", copies[s])], f)
        run("patchelf", *[a for s in mine for a in ("--add-needed", copies[s])], f)
    for f in programs:
        stray = [s for s in needed(f) if not (
            s in copies.values() or SYSTEM.match(s) or FROM_TORCH.match(s))]
        if stray:
            sys.exit("self_contained.py: %s still needs %s" % (f, ", ".join(stray)))
    return copies


def system_torch_rpath(built):
    """The run path a program built against Debian's python3-torch keeps:
    the folders it was built with (the machine's CUDA, the only NCCL such a
    torch has); none for a pip torch, whose NCCL is the nvidia wheel's."""
    if any("-packages/torch/lib" in d for d in built):
        return []
    return [d for d in built if not d.startswith("$ORIGIN")]


def wheel(path, outdir):
    work = tempfile.mkdtemp(prefix="kolo-wheel-")
    try:
        run("wheel", "unpack", "--dest", work, path)
        [root] = [os.path.join(work, d) for d in os.listdir(work)]
        name = os.path.basename(path)
        python_dir = "python%s.%s" % re.search(r"-cp(\d)(\d+)-", name).groups()
        programs, built = [], {}
        for dirpath, _, names in os.walk(root):
            for n in names:
                f = os.path.join(dirpath, n)
                if is_elf(f):
                    programs.append(f)
                    built[f] = rpath(f)
        graft(programs, os.path.join(root, LIBS))
        for f in programs:
            rel = os.path.relpath(f, root)
            if re.match(r"kolo/_C[^/]*\.so$", rel):
                paths = ["$ORIGIN/../" + LIBS] + TORCH_RPATH + \
                    system_torch_rpath(built[f])
            elif re.match(r"kolo-[^/]*\.data/data/bin/[^/]*$", rel):
                # bin/ and lib/pythonX.Y/site-packages/ share a prefix in a
                # venv, a --user install and a system install.
                paths = ["$ORIGIN/../lib/%s/%s/%s" % (python_dir, d, LIBS)
                         for d in ("site-packages", "dist-packages")]
            else:
                sys.exit("self_contained.py: %s is a program of the wheel this "
                         "script does not know where to place" % rel)
            run("patchelf", "--force-rpath", "--set-rpath", ":".join(paths), f)
        packed = os.path.join(work, "packed")
        os.makedirs(packed)
        run("wheel", "pack", "--dest-dir", packed, root)
        [packed] = [os.path.join(packed, n) for n in os.listdir(packed)]
        # The platform tag auditwheel reads from the symbol versions the
        # wheel's own files use (not torch's: no library folder to look in).
        empty = os.path.join(work, "no-libraries")
        os.makedirs(empty)
        show = json.loads(run("auditwheel", "show", "--json", "--ldpaths",
                              empty, packed))
        tag = show["sym_tag"]
        if tag.startswith("manylinux_"):
            tagged = run("wheel", "tags", "--remove", "--platform-tag", tag,
                         packed).strip().splitlines()[-1]
        else:
            print("self_contained.py: auditwheel reads no manylinux tag in %s "
                  "(%s): it keeps its own" % (name, tag), file=sys.stderr)
            tagged = os.path.basename(packed)
        os.makedirs(outdir, exist_ok=True)
        shutil.move(os.path.join(os.path.dirname(packed), tagged),
                    os.path.join(outdir, tagged))
        print(os.path.join(outdir, tagged))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tree(libdir, files):
    built = {f: rpath(f) for f in files}
    libs = os.path.join(libdir, LIBS)
    graft(files, libs)
    for f in files:
        paths = ["$ORIGIN/" + os.path.relpath(libs, os.path.dirname(f))] + \
            system_torch_rpath(built[f])
        run("patchelf", "--force-rpath", "--set-rpath", ":".join(paths), f)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "wheel":
        wheel(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "tree":
        tree(os.path.abspath(sys.argv[2]), [os.path.abspath(f) for f in sys.argv[3:]])
    else:
        sys.exit("usage: self_contained.py wheel WHEEL OUTDIR\n"
                 "       self_contained.py tree LIBDIR FILE...")

"""pip install --no-build-isolation <checkout>: kolo built against the torch
of the environment pip runs in, as `pip install horovod` is.

setuptools' PEP 517 backend (pyproject.toml) runs this; the build itself is
Bazel's: //frontends/python:site (the package with its extension) and
kolorun/kolo_rank_guard (installed into the environment's bin/), with
KOLO_PYTHON set to this interpreter, so that third_party/torch.bzl builds
against its torch (docs/building.md). The wheel asks for that torch's minor
version (torch==X.Y.*): torch's C++ ABI changes between minor releases.
--no-build-isolation is needed so that the build sees the installed torch.

KOLO_BAZEL_OUTPUT_BASE (optional) names Bazel's output base, to share one
with another build of the same torch (tools/test.sh's); KOLO_BAZEL_DISK_CACHE
(optional) a disk cache shared by several (tools/build_wheel.sh's).

The wheel this makes links Debian's libraries where they are; tools/
build_wheel.sh makes it self-contained (tools/self_contained.py).
"""

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "bazel-pip-bin")
SCRIPTS = ["kolorun", "kolo_rank_guard"]


def _version():
    with open(os.path.join(HERE, "frontends", "python", "kolo",
                           "__init__.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split('"')[1]
    raise RuntimeError("frontends/python/kolo/__init__.py has no __version__")


def _torch_requirement():
    """torch==X.Y.* for the torch this build is for; Debian's 1.13 registers
    as a pre-release (1.13.0a0+gitunknown), which == X.Y.* does not match."""
    try:
        import torch
    except ImportError as e:
        sys.exit("kolo: this Python (%s) has no torch (%s): install one first "
                 "(pip install torch), then pip install --no-build-isolation "
                 "this checkout" % (sys.executable, e))
    version = torch.__version__.split("+")[0]
    major, minor = (int(v) for v in version.split(".")[:2])
    if any(tag in version for tag in ("a", "b", "rc", "dev")):
        return "torch>=%s,<%d.%d" % (version, major, minor + 1)
    return "torch==%d.%d.*" % (major, minor)


def _check_prerequisites():
    """Everything a source build needs, named in one error."""
    missing = []
    for tool, package in (("bazel", "bazel-bootstrap"), ("g++", "g++"),
                          ("protoc", "protobuf-compiler")):
        if shutil.which(tool) is None:
            missing.append("%s (Debian's %s)" % (tool, package))
    for header, package in (("gloo/allreduce.h", "libgloo-dev"),
                            ("absl/status/status.h", "libabsl-dev"),
                            ("google/protobuf/message.h", "libprotobuf-dev"),
                            ("gtest/gtest.h", "libgtest-dev"),
                            ("Python.h", "python3-dev")):
        where = (sysconfig.get_paths()["include"] if header == "Python.h"
                 else "/usr/include")
        if not os.path.exists(os.path.join(where, header)):
            missing.append("%s (Debian's %s)" % (header, package))
    if missing:
        sys.exit("kolo builds from source with Bazel on Debian's packages, and "
                 "this machine lacks: %s. Run tools/install_deps.sh (as root), "
                 "see docs/python.md" % "; ".join(missing))


class BazelBuild(build_py):
    """Builds the package, its extension and the launcher with Bazel, for
    this interpreter's torch, then lays them out for the wheel."""

    def run(self):
        _check_prerequisites()
        env = dict(os.environ, KOLO_PYTHON=sys.executable)
        startup = []
        if os.environ.get("KOLO_BAZEL_OUTPUT_BASE"):
            startup.append("--output_base=" + os.environ["KOLO_BAZEL_OUTPUT_BASE"])
        flags = []
        if os.environ.get("KOLO_BAZEL_DISK_CACHE"):
            flags.append("--disk_cache=" + os.environ["KOLO_BAZEL_DISK_CACHE"])
        subprocess.check_call(
            ["bazel"] + startup + ["build"] + flags + ["--symlink_prefix=bazel-pip-",
                                   "//frontends/python:site",
                                   "//tools/kolorun:kolorun",
                                   "//tools/kolorun:kolo_rank_guard"],
            cwd=HERE, env=env)
        site = os.path.join(BIN, "frontends", "python", "site", "kolo")
        target = os.path.join(self.build_lib, "kolo")
        if os.path.exists(target):
            shutil.rmtree(target)
        for root, _, names in os.walk(site):
            for name in names:
                source = os.path.join(root, name)
                dest = os.path.join(target, os.path.relpath(source, site))
                if name == "_C.so":  # the extension, under its proper suffix
                    dest = os.path.join(os.path.dirname(dest), "_C" +
                                        sysconfig.get_config_var("EXT_SUFFIX"))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copyfile(source, dest)
                os.chmod(dest, 0o755 if name.endswith(".so") else 0o644)
        scripts = os.path.join(self.build_lib, "..", "kolo-scripts")
        os.makedirs(scripts, exist_ok=True)
        for script in SCRIPTS:
            dest = os.path.join(scripts, script)
            shutil.copyfile(os.path.join(BIN, "tools", "kolorun", script), dest)
            os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """A wheel for this platform and Python: the package holds an extension
    that setuptools does not build itself."""

    def has_ext_modules(self):
        return True


setup(
    name="kolo",
    version=_version(),
    description="Collective communication runtime for data-parallel "
    "training; kolo.torch is Horovod's PyTorch API",
    python_requires="==%d.%d.*" % sys.version_info[:2],
    install_requires=[_torch_requirement()],
    packages=["kolo", "kolo.torch"],
    package_dir={"": "frontends/python"},
    # kolorun and kolo_rank_guard are programs (ELF), not Python scripts:
    # installed into the environment's bin/ as data, executable.
    data_files=[("bin", [os.path.join("build", "kolo-scripts", s)
                         for s in SCRIPTS])],
    cmdclass={"build_py": BazelBuild},
    distclass=BinaryDistribution,
    zip_safe=False,
)

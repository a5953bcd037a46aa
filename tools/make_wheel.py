"""Writes kolo's wheel from the built package (tools/build_wheel.sh runs it).

A wheel is a zip file: the package, NAME-VERSION.data/scripts/ (installed
into the environment's bin/), and NAME-VERSION.dist-info/ with METADATA,
WHEEL and RECORD (every file's sha256), as PEP 427 describes.
"""

import argparse
import base64
import hashlib
import os
import re
import stat
import sys
import sysconfig
import zipfile

NAME = "kolo"


def version(site):
    with open(os.path.join(site, "kolo", "__init__.py")) as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(
        hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--site", required=True)
    p.add_argument("--script", action="append", default=[])
    p.add_argument("--out", required=True)
    args = p.parse_args()

    ver = version(args.site)
    py = "cp%d%d" % sys.version_info[:2]
    tag = "%s-%s-linux_x86_64" % (py, py)
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    files = []  # (name in the wheel, bytes, executable)
    for root, _, names in sorted(os.walk(os.path.join(args.site, "kolo"))):
        for n in sorted(names):
            path = os.path.join(root, n)
            arcname = os.path.relpath(path, args.site)
            if n == "_C.so":  # the extension, under its proper suffix
                arcname = os.path.join(os.path.dirname(arcname), "_C" + ext_suffix)
            with open(path, "rb") as f:
                files.append((arcname, f.read(), n == "_C.so"))
    for script in args.script:
        with open(script, "rb") as f:
            files.append(("%s-%s.data/scripts/%s" % (NAME, ver,
                                                     os.path.basename(script)),
                          f.read(), True))
    info = "%s-%s.dist-info" % (NAME, ver)
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: %s" % NAME,
        "Version: %s" % ver,
        "Summary: Collective communication runtime for data-parallel "
        "training; kolo.torch is Horovod's PyTorch API",
        "Requires-Python: ==%d.%d.*" % sys.version_info[:2],
        # Debian's torch registers as 1.13.0a0+gitunknown: ">=1.13" would
        # find no distribution.
        "Requires-Dist: torch>=1.13.0a0",
        "", ""])
    wheel = "\n".join(["Wheel-Version: 1.0", "Generator: kolo make_wheel.py",
                       "Root-Is-Purelib: false", "Tag: %s" % tag, "", ""])
    files.append(("%s/METADATA" % info, metadata.encode(), False))
    files.append(("%s/WHEEL" % info, wheel.encode(), False))
    files.append(("%s/top_level.txt" % info, b"kolo\n", False))
    record = "".join("%s,%s,%d\n" % (n, digest(d), len(d)) for n, d, _ in files)
    record += "%s/RECORD,,\n" % info
    files.append(("%s/RECORD" % info, record.encode(), False))

    path = os.path.join(args.out, "%s-%s-%s.whl" % (NAME, ver, tag))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = (stat.S_IFREG |
                                   (0o755 if executable else 0o644)) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    print(path)


if __name__ == "__main__":
    main()

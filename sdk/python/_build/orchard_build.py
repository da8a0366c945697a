"""A PEP 517 / PEP 660 build backend for sdk/python that needs nothing but
the standard library: it packs the ``orchard`` package into a pure-Python
wheel (or an sdist, or an editable wheel pointing at this folder). Name,
version, summary and Requires-Python are read from pyproject.toml."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "orchard"


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib  # Python 3.11+
        return tomllib.loads(text)["project"]
    except ImportError:  # 3.9, 3.10: the few keys read here, by pattern
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]
        return {k: v for k, v in re.findall(r'^(\w[\w-]*)\s*=\s*"([^"]*)"', section, re.M)}


def _names():
    p = _project()
    dist = re.sub(r"[-_.]+", "_", p["name"]).lower()
    return p, dist, f"{dist}-{p['version']}"


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}", f"Requires-Python: {p.get('requires-python', '>=3.9')}",
             "Provides-Extra: gymnasium", "Requires-Dist: gymnasium; extra == \"gymnasium\""]
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode()


def _package_files():
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".typed", ".pyi")):
                full = os.path.join(dirpath, name)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


class _Wheel:
    def __init__(self, path):
        self.zf = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.records = []

    def add(self, arcname, data):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append(f"{arcname},sha256={digest},{len(data)}")
        # A fixed time keeps the wheel the same for the same sources.
        info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)

    def close(self, dist_info):
        record = f"{dist_info}/RECORD"
        self.records.append(f"{record},,")
        self.zf.writestr(zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(self.records) + "\n")
        self.zf.close()


def _build(wheel_directory, editable):
    p, dist, stem = _names()
    name = f"{stem}-py3-none-any.whl"
    w = _Wheel(os.path.join(wheel_directory, name))
    if editable:
        w.add(f"{dist}.pth", (ROOT + "\n").encode())
    else:
        for full, arc in _package_files():
            with open(full, "rb") as f:
                w.add(arc, f.read())
    dist_info = f"{stem}.dist-info"
    w.add(f"{dist_info}/METADATA", _metadata(p))
    w.add(f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: orchard_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    w.add(f"{dist_info}/top_level.txt", (PACKAGE + "\n").encode())
    w.close(dist_info)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, editable=False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, editable=True)


def build_sdist(sdist_directory, config_settings=None):
    p, _, stem = _names()
    name = f"{stem}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        def add(arc, data):
            info = tarfile.TarInfo(f"{stem}/{arc}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1577836800
            tf.addfile(info, io.BytesIO(data))
        add("PKG-INFO", _metadata(p))
        for rel in ("pyproject.toml", "README.md", "_build/orchard_build.py"):
            with open(os.path.join(ROOT, rel), "rb") as f:
                add(rel, f.read())
        for full, arc in _package_files():
            with open(full, "rb") as f:
                add(arc, f.read())
    return name

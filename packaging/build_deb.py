"""Build dist/lumio-ingestd_<version>_<arch>.deb with the Debian archive's own tools.

`make deb`. The program is a virtualenv made by the system interpreter
(/usr/bin/python3.11) at its final path, /opt/lumio-ingestd: in a private
mount namespace (`unshare -m`) an overlay of /opt lets a staging directory be
bind-mounted there without creating anything under the real /opt. So the
byte-code, the scripts' shebangs (/opt/lumio-ingestd/bin/python3.11) and
pyvenv.cfg carry the final paths, and the build refuses a payload in which
the staging path is left in any file. The dependencies come from
packaging/requirements.lock (pinned, sha256-checked, wheels only); pip and
setuptools are removed from the venv after use. The rest of the tree (units,
sysusers.d, tmpfiles.d, the example configuration, monitoring, the database
role script) is copied from the repository; `dpkg-deb --root-owner-group`
makes the archive. Nothing outside the work directory and dist/ is written.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from email.utils import formatdate
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEB = ROOT / "packaging" / "deb"
LOCK = ROOT / "packaging" / "requirements.lock"
PYTHON = "/usr/bin/python3.11"
VENV = "/opt/lumio-ingestd"
NAME = "lumio-ingestd"
# The interpreter the venv is bound to: its minor version is part of every path in it.
PYTHON_DEP = "python3.11 (>= 3.11.2)"
# Copied into the package: (repository path, path in the package, mode).
FILES = [
    ("systemd/lumio-ingestd.service", "lib/systemd/system/lumio-ingestd.service", 0o644),
    ("systemd/lumio-ingestd@.service", "lib/systemd/system/lumio-ingestd@.service", 0o644),
    ("systemd/lumio-ingestd.sysusers", "usr/lib/sysusers.d/lumio-ingestd.conf", 0o644),
    ("packaging/deb/lumio-ingestd.tmpfiles", "usr/lib/tmpfiles.d/lumio-ingestd.conf", 0o644),
    ("etc/lumio/ingestd.ini", "etc/lumio/ingestd.ini", 0o644),
    ("deploy/database-roles.sql", "usr/share/lumio-ingestd/database-roles.sql", 0o644),
    ("monitoring/grafana/lumio-ingestd.json", "usr/share/lumio-ingestd/monitoring/grafana/lumio-ingestd.json",
     0o644),
    ("monitoring/prometheus/lumio-ingestd.rules.yml",
     "usr/share/lumio-ingestd/monitoring/prometheus/lumio-ingestd.rules.yml", 0o644),
    ("packaging/deb/copyright", "usr/share/doc/lumio-ingestd/copyright", 0o644),
    ("packaging/deb/lintian-overrides", "usr/share/lintian/overrides/lumio-ingestd", 0o644),
]
# Empty directories the package owns: (path, mode).
DIRS = [("etc/lumio/accounts.d", 0o755), ("etc/lumio/credentials", 0o700)]
CONFFILES = ["/etc/lumio/ingestd.ini"]
SCRIPTS = ["postinst", "prerm", "postrm"]
# The source of the program itself (what setup.cfg needs to build it).
SOURCE = ["lumio_ingestd", "setup.cfg", "pyproject.toml", "README.rst"]


def run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def version() -> str:
    text = (ROOT / "lumio_ingestd" / "__init__.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("no __version__ in lumio_ingestd/__init__.py")
    return m.group(1)


def arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True,
                          text=True).stdout.strip()


def copy_source(dest: Path) -> None:
    dest.mkdir()
    for name in SOURCE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)


# Runs inside the private mount namespace: /opt is an overlay whose writes land in
# the work directory, and the staging directory is bind-mounted at /opt/lumio-ingestd.
_IN_NAMESPACE = """
set -eu
mount -t overlay overlay -o lowerdir=/opt,upperdir="$WORK/opt-upper",workdir="$WORK/opt-work" /opt
mkdir -p {venv}
mount --bind "$STAGE" {venv}
{python} -m venv {venv}
py={venv}/bin/python3.11
$py -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \\
    --only-binary=:all: -r "$LOCK"
$py -m pip install --quiet --disable-pip-version-check --no-deps "$WORK/src"
$py -m pip uninstall --quiet --yes pip setuptools
"""


def build_venv(work: Path, stage: Path) -> None:
    stage.mkdir(parents=True)
    for d in ("opt-upper", "opt-work"):
        (work / d).mkdir()
    env = {**os.environ, "WORK": str(work), "STAGE": str(stage), "LOCK": str(LOCK),
           "PYTHONDONTWRITEBYTECODE": ""}
    env.pop("PYTHONDONTWRITEBYTECODE")
    script = _IN_NAMESPACE.format(venv=VENV, python=PYTHON)
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env)
    site = next((stage / "lib").glob("python3.*/site-packages"))
    # pip records where it installed from (a path of this build): not part of the program.
    for direct in site.glob("*.dist-info/direct_url.json"):
        direct.unlink()
        record = direct.parent / "RECORD"
        record.write_text("".join(line for line in record.read_text().splitlines(keepends=True)
                                  if not line.startswith(direct.parent.name + "/direct_url.json,")))


def add_files(root: Path) -> None:
    for src, dest, mode in FILES:
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / src, target)
        target.chmod(mode)
    for d, mode in DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d).chmod(mode)
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin" / NAME).symlink_to(f"{VENV}/bin/{NAME}")


def add_changelog(root: Path, ver: str) -> None:
    text = (f"{NAME} ({ver}) unstable; urgency=medium\n\n"
            f"  * Built from the repository (make deb).\n\n"
            f" -- Lumio <ops@lumio.invalid>  {formatdate(usegmt=False, localtime=False)}\n")
    path = root / "usr/share/doc" / NAME / "changelog.gz"  # a native package
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(text.encode())
    path.chmod(0o644)


def normalise_modes(root: Path) -> None:
    """Directories 0755, files 0644 or 0755 (executables), except what says otherwise."""
    keep = {root / d for d, _ in DIRS}
    for path in [root, *root.rglob("*")]:
        if path.is_symlink() or path in keep:
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            path.chmod(0o755)
        elif ".so" in path.suffixes:  # shared libraries are mapped, not executed
            path.chmod(0o644)
        else:
            # Only the venv's commands run; a library file with an execute bit is a packaging slip.
            command = path.parent == root / VENV.lstrip("/") / "bin"
            path.chmod(0o755 if command and mode & 0o100 else 0o644)


def check_no_build_path(root: Path, *paths: Path) -> None:
    needles = [str(p).encode() for p in paths]
    bad = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(n in data for n in needles):
                bad.append(str(path.relative_to(root)))
    if bad:
        raise SystemExit(f"build paths left in {len(bad)} files, e.g. {bad[:5]}")


def add_control(root: Path, ver: str, arch_: str) -> None:
    debian = root / "DEBIAN"
    debian.mkdir()
    size_kib = sum((p.lstat().st_size + 1023) // 1024 for p in root.rglob("*") if not p.is_dir()) \
        + sum(1 for p in root.rglob("*") if p.is_dir())
    control = (DEB / "control.in").read_text()
    for key, value in {"@VERSION@": ver, "@ARCH@": arch_, "@INSTALLED_SIZE@": str(size_kib),
                       "@PYTHON_DEP@": PYTHON_DEP}.items():
        control = control.replace(key, value)
    (debian / "control").write_text(control)
    (debian / "conffiles").write_text("".join(f"{c}\n" for c in CONFFILES))
    for name in SCRIPTS:
        shutil.copyfile(DEB / name, debian / name)
        (debian / name).chmod(0o755)
    sums = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] == "DEBIAN" or path.is_symlink() or not path.is_file():
            continue
        if "/" + str(rel) in CONFFILES:
            continue
        sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}\n")
    (debian / "md5sums").write_text("".join(sums))
    for name in ("control", "conffiles", "md5sums"):
        (debian / name).chmod(0o644)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "dist"), help="directory of the .deb [dist/]")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("make deb needs root (a private mount namespace for the venv's final path)")
    if not os.access(PYTHON, os.X_OK):
        raise SystemExit(f"{PYTHON} not found: apt-get install python3.11 python3.11-venv")
    started = time.monotonic()
    ver, arch_ = version(), arch()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lumio-deb-") as tmp:
        work = Path(tmp)
        root = work / "root"
        stage = root / VENV.lstrip("/")
        copy_source(work / "src")
        build_venv(work, stage)
        venv_secs = time.monotonic() - started
        add_files(root)
        add_changelog(root, ver)
        normalise_modes(root)
        check_no_build_path(root, work, ROOT)
        add_control(root, ver, arch_)
        deb = out / f"{NAME}_{ver}_{arch_}.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
            stdout=subprocess.DEVNULL)
    size = deb.stat().st_size
    print(f"{deb.relative_to(ROOT) if deb.is_relative_to(ROOT) else deb}: {size / 1e6:.1f} MB "
          f"in {time.monotonic() - started:.0f} s (the venv {venv_secs:.0f} s)")
    if size >= 40 * 1000 * 1000:
        raise SystemExit(f"{deb} is {size} bytes: over the 40 MB budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Install the .deb into a throwaway root and check what an operator relies on: `make deb-test`.

The throwaway root is an overlay of `/` (writes land in an upper directory of
our own) in a private mount namespace (`unshare -m`), entered with chroot;
/run and /tmp in it are fresh tmpfs, so there is no /run/systemd/system and
the maintainer scripts behave as on a host where systemd is not running. The
real PostgreSQL, Redis (on a Unix socket) and the stand-in Twitch run
outside, started by this script (lumio_ingestd.devkit), and are reached over
loopback and a bind-mounted socket directory.

In order, each step failing the run with what it saw:

1. `apt-get install ./lumio-ingestd_*.deb` exits 0; the user, its home and
   shell; the conffile is registered; owners and modes; nothing enabled;
   no build path in the venv; `systemd-analyze verify` of the installed units.
2. The database role is made by the installed database-roles.sql (not a
   superuser); the operator's configuration: an edited ini with a
   `unix://` Redis URL, credentials under /etc/lumio/credentials and a
   drop-in naming them (LoadCredential=).
3. `check-config` and `migrate` as the service user.
4. The unit's own ExecStart= with its Environment=, User=, UMask= and
   LoadCredential= (read from the installed unit and the drop-in, handed
   over as systemd would: $CREDENTIALS_DIRECTORY, $NOTIFY_SOCKET,
   $WATCHDOG_USEC) reaches READY=1 on a notify socket we bind, stores the
   stand-in Twitch's chat exactly once, and exits 0 on SIGTERM.
5. A reinstall keeps the edited ini; remove keeps it and the state; an
   install after remove and an upgrade (the same files under a higher
   version) keep it too.
6. Purge exits 0 and leaves the root as it was: the upper directory holds
   only the user (passwd, group, shadow, gshadow) and dpkg's and apt's own
   records; Redis and the database are untouched.

What it cannot show: systemd is not PID 1 here, so no unit is started by
systemd itself (sandboxing, StateDirectory=, the watchdog's abort, the
maintainer scripts' daemon-reload, try-restart and stop are not exercised).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from lumio_ingestd.devkit.servers import (  # noqa: E402
    PostgresServer,
    RedisServer,
    find_pg_bindir,
    wait_until,
)
from lumio_ingestd.devkit.standins.twitch import TwitchStandin  # noqa: E402
from lumio_ingestd.devkit.standins.twitch_events import chat_event  # noqa: E402

PKG = "lumio-ingestd"
USER = "lumio-ingestd"
UNIT = "lumio-ingestd.service"
INI = "/etc/lumio/ingestd.ini"
CREDS = "/etc/lumio/credentials"
DROPIN = f"/etc/systemd/system/{UNIT}.d/50-credentials.conf"
STATE = "/var/lib/lumio-ingestd"
DB = "lumio"
ROLE = "lumio"
ACCOUNT = 7
CHAT = 40
# Inside the throwaway root: sockets of the servers outside, on its own /run.
REDIS_DIR = "/run/lumio-redis"
NOTIFY = "/run/lumio-notify/notify.sock"
# What purge may leave: the user (never removed, so its ids are never reused) and
# dpkg's and apt's own records.
USER_FILES = {f"etc/{n}{s}" for n in ("passwd", "group", "shadow", "gshadow") for s in ("", "-")}
USER_LOCK = "etc/.pwd.lock"  # the lock systemd-sysusers (like useradd) takes
RECORDS = ("var/lib/dpkg/", "var/log/", "var/cache/apt/", "var/cache/debconf/", "var/lib/apt/",
           "var/cache/ldconfig/")


class Failed(Exception):
    pass


def step(text: str) -> None:
    print(f"deb-test: {text}", flush=True)


def check(ok: object, what: str, detail: object = "") -> None:
    if not ok:
        raise Failed(f"{what}{': ' + str(detail) if detail != '' else ''}")
    print(f"  ok  {what}", flush=True)


def sh(cmd: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=300, check=False, env=env)


# -- the throwaway root ---------------------------------------------------------------------


class Throwaway:
    """An overlay of / at `root`; its changes land in `upper`."""

    def __init__(self, work: Path) -> None:
        self.upper, self._work, self.root = work / "upper", work / "ovl-work", work / "root"
        self.users_before: dict[str, str] = {}
        for d in (self.upper, self._work, self.root):
            d.mkdir()

    def mount(self) -> None:
        """Mounts the root while the host's dpkg is idle, and keeps its own copy of dpkg's database.

        The lower layer is the live `/`: without its own copy, a host apt run
        during the test would show the root a database in the middle of a change.
        """
        with host_dpkg_idle():
            self._mount()
            # The user files as they were, to compare with after purge (the host may change its own).
            self.users_before = {rel: (Path("/") / rel).read_text() for rel in sorted(USER_FILES)
                                 if (Path("/") / rel).is_file()}
            dpkg = self.path("/var/lib/dpkg")
            for name in ("status", "available", "diversions", "statoverride"):
                if (dpkg / name).is_file():  # opening for writing copies the file up
                    os.close(os.open(dpkg / name, os.O_WRONLY | os.O_APPEND))

    def _mount(self) -> None:
        for cmd in (
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir=/,upperdir={self.upper},workdir={self._work}", str(self.root)],
            ["mount", "-t", "proc", "proc", str(self.root / "proc")],
            ["mount", "--rbind", "/dev", str(self.root / "dev")],
            ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(self.root / "run")],
            ["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(self.root / "tmp")],
        ):
            result = sh(cmd)
            if result.returncode != 0:
                raise Failed(f"{' '.join(cmd)}: {result.stderr.strip()}")

    def unmount(self) -> None:
        sh(["umount", "-R", "-l", str(self.root)])

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def run(self, *argv: str, user: tuple[int, int] | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return sh(self.command(argv, user), env=env if env is not None else base_env())

    def command(self, argv: Sequence[str], user: tuple[int, int] | None) -> list[str]:
        spec = [f"--userspec={user[0]}:{user[1]}", f"--groups={user[1]}"] if user else []
        return ["chroot", *spec, str(self.root), *argv]

    def bind(self, source: Path, inside: str) -> None:
        target = self.path(inside)
        target.mkdir(parents=True, exist_ok=True)
        result = sh(["mount", "--bind", str(source), str(target)])
        if result.returncode != 0:
            raise Failed(f"bind {source} -> {inside}: {result.stderr.strip()}")


@contextmanager
def host_dpkg_idle(timeout: float = 300.0) -> Iterator[None]:
    """Holds the host's dpkg frontend lock (apt and dpkg take it with fcntl, as here)."""
    fd = os.open("/var/lib/dpkg/lock-frontend", os.O_RDWR | os.O_CREAT, 0o640)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise Failed("the host's dpkg stayed busy (lock-frontend held)") from None
                time.sleep(1.0)
        yield
    finally:
        os.close(fd)  # releases the lock


def base_env() -> dict[str, str]:
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}


def ok_run(box: Throwaway, what: str, *argv: str, **kwargs: object) -> str:
    result = box.run(*argv, **kwargs)  # type: ignore[arg-type]
    check(result.returncode == 0, what, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result.stdout


# -- the unit, read as systemd reads it -------------------------------------------------------

LIST_KEYS = {"ExecStart", "Environment", "LoadCredential"}


def service_settings(box: Throwaway) -> dict[str, list[str]]:
    """[Service] of the installed unit, then its drop-ins; an empty list assignment resets."""
    files = [box.path(f"/lib/systemd/system/{UNIT}")]
    dropins = box.path(f"/etc/systemd/system/{UNIT}.d")
    if dropins.is_dir():
        files += sorted(dropins.glob("*.conf"))
    out: dict[str, list[str]] = {}
    for path in files:
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                section = line
                continue
            if section != "[Service]":
                continue
            key, _, value = line.partition("=")
            if key in LIST_KEYS:
                if value == "":
                    out[key] = []
                else:
                    out.setdefault(key, []).append(value)
            else:
                out[key] = [value]
    return out


def seconds(text: str) -> float:
    for suffix, factor in (("min", 60.0), ("ms", 0.001), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@dataclass
class Service:
    """What systemd would hand the unit's main process."""

    argv: list[str]
    env: dict[str, str]
    user: tuple[int, int]
    umask: int
    credentials: dict[str, str] = field(default_factory=dict)  # name -> source path


def read_service(box: Throwaway, uid_gid: tuple[int, int]) -> Service:
    s = service_settings(box)
    check(len(s.get("ExecStart", [])) == 1, "the unit has one ExecStart=", s.get("ExecStart"))
    check(s.get("User") == [USER] and s.get("Group") == [USER], "the unit runs as the service user",
          (s.get("User"), s.get("Group")))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "HOME": STATE, "USER": USER, "LOGNAME": USER, "SHELL": "/usr/sbin/nologin"}
    for assignment in s.get("Environment", []):
        for word in shlex.split(assignment):
            key, _, value = word.partition("=")
            env[key] = value
    credentials = {}
    for value in s.get("LoadCredential", []):
        name, _, source = value.partition(":")
        credentials[name] = source
    return Service(shlex.split(s["ExecStart"][0]), env, uid_gid, int(s.get("UMask", ["0022"])[0], 8),
                   credentials)


def hand_credentials(box: Throwaway, service: Service) -> str:
    """LoadCredential=: PID 1 reads each file as root into a directory only the service reads."""
    inside = f"/run/credentials/{UNIT}"
    target = box.path(inside)
    target.mkdir(parents=True)
    for name, source in service.credentials.items():
        src = box.path(source)
        check(src.is_file(), f"LoadCredential={name}: {source} exists (else 243/CREDENTIALS)")
        dest = target / name
        shutil.copyfile(src, dest)
        os.chown(dest, *service.user)
        dest.chmod(0o400)
    os.chown(target, *service.user)
    target.chmod(0o500)
    return inside


# -- the notify socket --------------------------------------------------------------------------


class NotifySocket:
    """What systemd listens on for sd_notify: a datagram socket, every message kept."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o755)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o777)  # the service user sends to it
        self.sock.settimeout(0.1)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="deb-test-notify")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.extend(self.sock.recv(65536).decode().split("\n"))
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


# -- the overlay's upper directory ---------------------------------------------------------------


def changes(box: Throwaway) -> list[str]:
    """Paths the throwaway root changed: files, whiteouts, new directories (not copied-up parents)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(box.upper):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(box.upper))
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                found.append(f"{rel} (deleted)")
            elif stat.S_ISDIR(st.st_mode):
                lower = Path("/") / rel
                if not lower.is_dir() or lower.is_symlink():
                    found.append(f"{rel}/ (new)")
            else:
                found.append(rel)
    return sorted(found)


def user_lines_only(box: Throwaway, rel: str) -> bool:
    """A user file differs from the host's by the service user's lines only."""
    mine = box.upper / rel
    if not mine.exists():
        return True
    ours = sorted(ln for ln in mine.read_text().splitlines() if not ln.startswith(f"{USER}:"))
    # A backup (passwd-) is the file as it was before the last change: the host's file.
    before = [box.users_before.get(rel), box.users_before.get(rel.rstrip("-"))]
    return any(sorted(text.splitlines()) == ours for text in before if text is not None)


# -- the run --------------------------------------------------------------------------------------


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ini_text(pg: PostgresServer, twitch: TwitchStandin) -> str:
    return f"""# Edited by the operator (deb-test).
[daemon]
state_dir = {STATE}
instance_id = deb-test

[redis]
url = unix://{REDIS_DIR}/redis.sock?db=0

[timescale]
dsn = postgresql://{ROLE}@127.0.0.1:{pg.port}/{DB}
password_file = db_password

[chat]
flush_interval_secs = 0.5

[http]
listen = 127.0.0.1:0

[metrics]
listen = 127.0.0.1:0

[twitch]
eventsub_ws_url = {twitch.ws_url}
helix_url = {twitch.helix_url}
oauth_url = {twitch.oauth_url}
client_id = {twitch.client_id}
client_secret_file = twitch_client_secret

[account.{ACCOUNT}]
twitch_user_id = {twitch.user_id}
twitch_token_file = {STATE}/twitch-token-{ACCOUNT}.json
"""


def stored(pg: PostgresServer) -> dict[str, int]:
    conn = pg.connect(DB)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT message_id, count(*) FROM chat_messages WHERE account_id = %s "
                        "GROUP BY message_id", (ACCOUNT,))
            return {str(k): int(v) for k, v in cur.fetchall()}
    finally:
        conn.close()


def redis_keys(server: RedisServer) -> int:
    client = server.client()
    try:
        return int(client.dbsize())
    finally:
        client.close()


def install_checks(box: Throwaway, deb_inside: str) -> tuple[int, int]:
    step("install")
    audit = box.run("dpkg", "--audit")
    check(audit.returncode == 0 and not audit.stdout.strip(), "dpkg's database in the root is consistent",
          audit.stdout)
    ok_run(box, f"apt-get install ./{Path(deb_inside).name} exits 0", "apt-get", "install", "-y", "-q",
           "--no-install-recommends", deb_inside)
    entry = ok_run(box, "the service user exists", "getent", "passwd", USER).strip().split(":")
    uid, gid = int(entry[2]), int(entry[3])
    check(uid < 1000, "it is a system user", uid)
    check(entry[5] == STATE, f"its home is {STATE}", entry[5])
    check(entry[6] in ("/usr/sbin/nologin", "/sbin/nologin"), "it has no login shell", entry[6])
    ok_run(box, "its group exists", "getent", "group", USER)
    conffiles = ok_run(box, "dpkg-query reads the package", "dpkg-query", "-W", "-f=${Conffiles}\n", PKG)
    check(any(line.split()[:1] == [INI] for line in conffiles.splitlines() if line.strip()),
          f"{INI} is the one conffile", conffiles)
    check(len([ln for ln in conffiles.splitlines() if ln.strip()]) == 1, "there is no other", conffiles)

    def mode(inside: str, want_mode: int, want_uid: int, kind: int) -> None:
        st = box.path(inside).lstat()
        check(stat.S_IFMT(st.st_mode) == kind and stat.S_IMODE(st.st_mode) == want_mode
              and st.st_uid == want_uid,
              f"{inside} is {oct(want_mode)} owned by uid {want_uid}",
              f"{oct(st.st_mode)} uid {st.st_uid}")

    mode(STATE, 0o700, uid, stat.S_IFDIR)
    mode(CREDS, 0o700, 0, stat.S_IFDIR)
    check(not any(box.path(CREDS).iterdir()), f"{CREDS} ships empty")
    mode("/etc/lumio/accounts.d", 0o755, 0, stat.S_IFDIR)
    mode(INI, 0o644, 0, stat.S_IFREG)
    mode(f"/lib/systemd/system/{UNIT}", 0o644, 0, stat.S_IFREG)
    mode("/usr/lib/sysusers.d/lumio-ingestd.conf", 0o644, 0, stat.S_IFREG)
    check(os.readlink(box.path("/usr/bin/lumio-ingestd")) == "/opt/lumio-ingestd/bin/lumio-ingestd",
          "/usr/bin/lumio-ingestd points into the venv")
    shebang = box.path("/opt/lumio-ingestd/bin/lumio-ingestd").read_text().splitlines()[0]
    check(shebang == "#!/opt/lumio-ingestd/bin/python3.11", "the shebang is the venv's python3.11",
          shebang)
    check(os.readlink(box.path("/opt/lumio-ingestd/bin/python3.11")) == "/usr/bin/python3.11",
          "the venv runs the system interpreter")
    for sub in ("monitoring/grafana/lumio-ingestd.json", "monitoring/prometheus/lumio-ingestd.rules.yml",
                "database-roles.sql"):
        check(box.path(f"/usr/share/lumio-ingestd/{sub}").is_file(), f"/usr/share/lumio-ingestd/{sub}")
    wants = [p for p in box.path("/etc/systemd/system").glob("*.wants/lumio-ingestd*")]
    check(not wants, "nothing is enabled", wants)
    leaked = sh(["grep", "-rlF", "-e", "/lumio-deb-", "-e", str(ROOT), str(box.path("/opt/lumio-ingestd"))])
    check(leaked.returncode == 1, "no build path in any file of the venv", leaked.stdout[:500])

    step("systemd-analyze verify of the installed units")
    for name in (UNIT, "lumio-ingestd@0.service"):
        result = sh(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no",
                     f"--root={box.root}", name])
        check(result.returncode == 0 and "Unknown" not in result.stderr,
              f"systemd-analyze verify {name}", result.stdout + result.stderr)
    return uid, gid


def configure(box: Throwaway, pg: PostgresServer, twitch: TwitchStandin, uid_gid: tuple[int, int]) -> None:
    step("the database role, from the installed database-roles.sql")
    pg.create_database(DB)
    result = sh([str(find_pg_bindir() / "psql"), "-X", "-q", "-h", pg.host, "-p", str(pg.port),
                 "-U", pg.user, "-d", "postgres", "-v", f"db={DB}", "-v", f"role={ROLE}",
                 "-f", str(box.path("/usr/share/lumio-ingestd/database-roles.sql"))])
    check(result.returncode == 0, "database-roles.sql runs", result.stdout + result.stderr)
    conn = pg.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT rolsuper, pg_has_role(%s, 'pg_read_all_settings', 'MEMBER') "
                        "FROM pg_roles WHERE rolname = %s", (ROLE, ROLE))
            check(cur.fetchone() == (False, False), f"role {ROLE} is not a superuser")
    finally:
        conn.close()

    step("the operator's configuration: the ini, credentials, a drop-in naming them")
    box.path(INI).write_text(ini_text(pg, twitch))
    for name, secret in (("db_password", "unused-with-trust-auth"),
                         ("twitch_client_secret", twitch.client_secret)):
        path = box.path(f"{CREDS}/{name}")
        path.write_text(secret + "\n")
        path.chmod(0o600)
    token = box.path(f"{STATE}/twitch-token-{ACCOUNT}.json")
    token.write_text(json.dumps({"access_token": twitch.access_token, "refresh_token": twitch.refresh_token}))
    os.chown(token, *uid_gid)
    token.chmod(0o600)
    dropin = box.path(DROPIN)
    dropin.parent.mkdir(parents=True)
    dropin.write_text("[Service]\n# No Redis password here: the reset drops the unit's line for it.\n"
                      "LoadCredential=\n"
                      f"LoadCredential=db_password:{CREDS}/db_password\n"
                      f"LoadCredential=twitch_client_secret:{CREDS}/twitch_client_secret\n")
    result = sh(["systemd-analyze", "verify", "--man=no", "--recursive-errors=no", f"--root={box.root}",
                 UNIT])
    check(result.returncode == 0, "systemd-analyze verify with the drop-in", result.stdout + result.stderr)


def run_as_unit(box: Throwaway, pg: PostgresServer, twitch: TwitchStandin,
                uid_gid: tuple[int, int]) -> None:
    service = read_service(box, uid_gid)
    creds = hand_credentials(box, service)
    env = {**service.env, "CREDENTIALS_DIRECTORY": creds}

    step("check-config and migrate as the service user")
    ok_run(box, "lumio-ingestd check-config as the service user", "/usr/bin/lumio-ingestd", "-c", INI,
           "check-config", user=uid_gid, env=env)
    ok_run(box, "lumio-ingestd migrate as the service user, role without superuser",
           "/usr/bin/lumio-ingestd", "-c", INI, "migrate", user=uid_gid, env=env)
    conn = pg.connect(DB)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'chat_messages'")
            check(cur.fetchone() == (ROLE,), f"the tables exist, owned by {ROLE}")
    finally:
        conn.close()

    step("check-config and migrate as root, as the README has them")
    root_env = {**base_env(), "CREDENTIALS_DIRECTORY": CREDS}
    ok_run(box, "lumio-ingestd check-config as root", "lumio-ingestd", "check-config", env=root_env)
    ok_run(box, f"CREDENTIALS_DIRECTORY={CREDS} lumio-ingestd migrate as root (nothing left to apply)",
           "lumio-ingestd", "migrate", env=root_env)
    pyc = sh(["find", str(box.path("/opt/lumio-ingestd")), "-newer", str(box.path(INI)), "-name", "*.pyc"])
    check(pyc.stdout == "", "no byte-code written into the venv at run time", pyc.stdout[:300])

    step(f"the unit's ExecStart= as systemd would run it: {shlex.join(service.argv)}")
    notify = NotifySocket(box.path(NOTIFY))
    env.update({"NOTIFY_SOCKET": NOTIFY, "STATE_DIRECTORY": STATE, "CONFIGURATION_DIRECTORY": "/etc/lumio"})
    watchdog = service_settings(box).get("WatchdogSec")
    if watchdog:
        env["WATCHDOG_USEC"] = str(int(seconds(watchdog[0]) * 1_000_000))
    log = box.path("/tmp/daemon.log")
    umask = service.umask
    with open(log, "wb") as out:
        proc = subprocess.Popen(box.command(service.argv, uid_gid), env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, preexec_fn=lambda: os.umask(umask))  # noqa: PLW1509
    try:
        def logged() -> str:
            return log.read_text(errors="replace")

        check(wait_until(lambda: "READY=1" in notify.messages or proc.poll() is not None, 30)
              and proc.poll() is None, "READY=1 on the notify socket", f"{notify.messages}\n{logged()}")
        status = Path(f"/proc/{proc.pid}/status").read_text()
        uid_line = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()
        check(int(uid_line[1]) == uid_gid[0], "the daemon runs as the service user", uid_line)
        check(wait_until(lambda: "WATCHDOG=1" in notify.messages, 30), "WATCHDOG=1 follows",
              notify.messages)

        step(f"{CHAT} chat messages from the stand-in Twitch")
        session = twitch.wait_session(1, timeout=30)
        ids = [f"deb-{n}" for n in range(CHAT)]
        for message_id in ids:
            twitch.notify("channel.chat.message", chat_event(message_id, f"hello {message_id}",
                                                             broadcaster=twitch.user_id), session=session)
        check(wait_until(lambda: set(stored(pg)) >= set(ids), 30), "every message is stored",
              f"{len(stored(pg))} of {CHAT}\n{logged()}")

        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
        check(code == 0, "SIGTERM: exit 0", f"exit {code}\n{logged()}")
        check("STOPPING=1" in notify.messages, "STOPPING=1 on the notify socket")
        final = stored(pg)
        check(set(final) == set(ids) and all(n == 1 for n in final.values()),
              "each message stored exactly once", {k: v for k, v in final.items() if v != 1})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        notify.close()
        shutil.rmtree(box.path("/run/credentials"), ignore_errors=True)


UPGRADE_SUFFIX = "+upgrade1"


def repack_newer(box: Throwaway, deb_inside: str) -> str:
    """The same package with a higher version: what dpkg and the scripts do on an upgrade."""
    tree = box.path("/tmp/repack")
    result = sh(["dpkg-deb", "-R", str(box.path(deb_inside)), str(tree)])
    check(result.returncode == 0, "dpkg-deb -R", result.stderr)
    control = tree / "DEBIAN" / "control"
    lines = [ln + UPGRADE_SUFFIX if ln.startswith("Version: ") else ln
             for ln in control.read_text().splitlines()]
    control.write_text("\n".join(lines) + "\n")
    out = "/tmp/upgrade.deb"
    result = sh(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "-b", str(tree), str(box.path(out))])
    check(result.returncode == 0, "dpkg-deb -b of the newer version", result.stderr)
    shutil.rmtree(tree)
    return out


def lifecycle(box: Throwaway, deb_inside: str, pg: PostgresServer, redis_server: RedisServer) -> None:
    edited = sha(box.path(INI))
    step("reinstall, remove, install again: the edited ini stays")
    ok_run(box, "apt-get install --reinstall exits 0", "apt-get", "install", "-y", "-q", "--reinstall",
           deb_inside)
    check(sha(box.path(INI)) == edited, "the edited ini survives a reinstall")
    check(not list(box.path("/etc/lumio").glob("ingestd.ini.dpkg-*")), "no .dpkg-dist or -new beside it")
    ok_run(box, "apt-get remove exits 0", "apt-get", "remove", "-y", "-q", PKG)
    check(not box.path("/opt/lumio-ingestd").exists() and not box.path("/usr/bin/lumio-ingestd").exists(),
          "remove takes the program")
    check(sha(box.path(INI)) == edited and box.path(STATE).is_dir(), "remove keeps the ini and the state")
    ok_run(box, "apt-get install after remove exits 0", "apt-get", "install", "-y", "-q", deb_inside)
    check(sha(box.path(INI)) == edited, "the edited ini survives remove and install")
    newer = repack_newer(box, deb_inside)
    ok_run(box, "an upgrade (the same files, a higher version) exits 0", "apt-get", "install", "-y", "-q",
           newer)
    version = ok_run(box, "dpkg-query reads the upgraded package", "dpkg-query", "-W", "-f=${Version}", PKG)
    check(version.endswith(UPGRADE_SUFFIX), "the upgrade is installed", version)
    check(sha(box.path(INI)) == edited, "the edited ini survives the upgrade")

    step("purge")
    # The operator's own files: purge leaves what the package did not make.
    shutil.rmtree(box.path(DROPIN).parent)
    for cred in box.path(CREDS).iterdir():
        cred.unlink()
    rows, keys = sum(stored(pg).values()), redis_keys(redis_server)
    ok_run(box, "apt-get purge exits 0", "apt-get", "purge", "-y", "-q", PKG)
    for gone in (INI, "/etc/lumio", STATE, "/opt/lumio-ingestd", f"/lib/systemd/system/{UNIT}"):
        check(not box.path(gone).exists(), f"purge removed {gone}")
    ok_run(box, "the user stays after purge", "getent", "passwd", USER)
    left = [c for c in changes(box) if c.split(" ")[0].rstrip("/") not in USER_FILES | {USER_LOCK}
            and not c.startswith(RECORDS)]
    check(not left, "the root is as before, but for the user and dpkg's records", left)
    for rel in USER_FILES:
        check(user_lines_only(box, rel), f"/{rel} differs by the service user only")
    check(sum(stored(pg).values()) == rows and redis_keys(redis_server) == keys,
          "the database and Redis are untouched")


def lintian(deb: Path) -> None:
    step("lintian")
    if shutil.which("lintian") is None:
        raise Failed("lintian not found: apt-get install lintian")
    result = sh(["lintian", "--fail-on", "error", str(deb)])
    print("\n".join(f"      {line}" for line in result.stdout.splitlines()), flush=True)
    check(result.returncode == 0, "lintian: no error (each override gives its reason)", result.stderr)


def inside(deb: Path) -> int:
    started = time.monotonic()
    lintian(deb)
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="lumio-deb-test-", dir="/var/tmp"))
        stack.callback(shutil.rmtree, work, True)
        box = Throwaway(work)
        box.mount()
        stack.callback(box.unmount)
        deb_inside = f"/tmp/{deb.name}"
        shutil.copyfile(deb, box.path(deb_inside))

        pg = stack.enter_context(PostgresServer(work / "pg"))
        redis_server = stack.enter_context(RedisServer(work / "redis", unixsocket=True))
        assert redis_server.socket_path is not None
        box.bind(redis_server.socket_path.parent, REDIS_DIR)
        twitch = stack.enter_context(TwitchStandin(client_id="deb-test-client"))

        uid_gid = install_checks(box, deb_inside)
        configure(box, pg, twitch, uid_gid)
        run_as_unit(box, pg, twitch, uid_gid)
        sh(["umount", str(box.path(REDIS_DIR))])
        lifecycle(box, deb_inside, pg, redis_server)
    step(f"passed in {time.monotonic() - started:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="Install the .deb into a throwaway root and check it.")
    parser.add_argument("deb", nargs="?", help="the package [the newest dist/lumio-ingestd_*.deb]")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("deb-test: needs root (a mount namespace, an overlay and chroot)", file=sys.stderr)
        return 2
    if args.deb:
        deb = Path(args.deb).resolve()
    else:
        found = sorted((ROOT / "dist").glob(f"{PKG}_*.deb"), key=lambda p: p.stat().st_mtime)
        if not found:
            print("deb-test: no dist/lumio-ingestd_*.deb: run `make deb` first", file=sys.stderr)
            return 2
        deb = found[-1]
    if not args.inside:
        # A private mount namespace: every mount below vanishes with this process.
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable,
                              str(Path(__file__).resolve()), "--inside", str(deb)])
    try:
        return inside(deb)
    except Failed as exc:
        print(f"deb-test: FAILED: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

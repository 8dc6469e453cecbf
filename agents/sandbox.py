"""What a generator gets from its node: a minimal environment and, where the
agent can give it one, a user of its own.

A generator is the tenant's workload, so it starts from nothing rather than
from the agent's environment (which holds the object store's credentials):

1. the variables in :data:`INHERITED_ENV` (locale, search paths), plus the ones
   a profile names in ``inherit_env``;
2. the profile's ``env`` (search paths such as ``PYTHONPATH`` are prepended to
   an inherited value);
3. the run's own variables (GPUs, job, run, ``HOME``/``TMPDIR`` in its work
   directory), which win.

Whatever a profile names, the first two never carry the agent's credentials:
a variable of the broker client or the object store (:data:`AGENT_ONLY_ENV`)
or whose value names one of the agent's secret files is dropped (a profile
that names one is refused when loaded, :func:`agent_only`).

Identity: an agent running as root with a configured generator user drops the
generator to that (unprivileged) user and hands it the run's work directory;
an agent that is not root cannot switch and runs generators as itself (they
can then read whatever the agent can: docs/operator.md#generators-and-secrets).
With a generator user, the agent refuses to start while one of its secret
files is one that user could read (:func:`exposed`).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH")
PATHLIKE_ENV = frozenset({"PYTHONPATH", "PATH", "LD_LIBRARY_PATH"})
# The agent's own settings that a generator never gets: the broker client's
# (address, SASL principal and password or its file, CA) and the object
# store's (keys, profile, shared credentials file).
AGENT_ONLY_ENV = ("FRAMESPOOL_KAFKA_", "FRAMESPOOL_BROKER", "KAFKA_", "AWS_")
# Variables that name a file of the agent's secrets (their values are secret paths).
SECRET_FILE_ENV = (
    "FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


class SandboxError(ValueError):
    """The configured generator user cannot be used (the operator's fault)."""


def agent_only(name: str) -> bool:
    """A variable that holds (or points at) the agent's credentials."""
    return name.upper().startswith(AGENT_ONLY_ENV)


def secret_files(base: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The files of secrets the agent's environment names (a Kafka password
    file, AWS credentials)."""
    base = os.environ if base is None else base
    return tuple(Path(base[k]) for k in SECRET_FILE_ENV if base.get(k))


def generator_env(
    profile_env: Mapping[str, str],
    inherit: tuple[str, ...] = (),
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
    secrets: Iterable[Path | str] = (),
) -> dict[str, str]:
    """The environment a generator starts with (see the module's list);
    ``secrets``: more files whose paths must not reach it (the secrets file)."""
    base = os.environ if base is None else base
    hidden = {str(p) for p in (*secret_files(base), *secrets)}

    def allowed(key: str, value: str) -> bool:
        return not agent_only(key) and not any(h in value for h in hidden)

    env = {k: base[k] for k in (*INHERITED_ENV, *inherit) if k in base and allowed(k, base[k])}
    env.setdefault("PATH", os.defpath)
    for source in (profile_env, extra or {}):
        for key, value in source.items():
            if source is profile_env and not allowed(key, str(value)):
                continue
            if key in PATHLIKE_ENV and env.get(key) and source is profile_env:
                env[key] = f"{value}{os.pathsep}{env[key]}"
            else:
                env[key] = str(value)
    return env


@dataclass(frozen=True, slots=True)
class Identity:
    """The user and group a generator runs as."""

    uid: int
    gid: int
    name: str


def generator_identity(
    configured: str | int | None,
    euid: int,
    lookup: Callable[[str | int], tuple[int, int, str] | None] | None = None,
) -> tuple[Identity | None, str]:
    """Whom generators run as, and why (for the agent's start-up log).

    ``None`` means "as the agent". Raises :class:`SandboxError` when the agent
    is root and the configured user is missing or root itself: running tenant
    code as root because of a typo would be worse than not starting.
    """
    if configured in (None, ""):
        return None, "no generator user configured: generators run as the agent's user"
    if euid != 0:
        return None, (
            f"agent is not root (uid {euid}): generators run as the agent's user,"
            f" not {configured!r}"
        )
    found = (lookup or _lookup)(configured)
    if found is None:
        raise SandboxError(
            f"generator user {configured!r} does not exist on this node: create it"
            " (an unprivileged user) or leave --generator-user unset"
        )
    uid, gid, name = found
    if uid == 0 or gid == 0:
        raise SandboxError(
            f"generator user {configured!r} is root (uid {uid}, gid {gid}): configure an"
            " unprivileged user"
        )
    return Identity(uid, gid, name), f"generators run as {name} (uid {uid}, gid {gid})"


def _lookup(user: str | int) -> tuple[int, int, str] | None:
    try:
        if isinstance(user, int) or (str(user).isascii() and str(user).isdigit()):
            uid = int(user)
            try:
                entry = pwd.getpwuid(uid)
            except KeyError:
                return uid, uid, str(uid)  # a bare uid needs no passwd entry
        else:
            entry = pwd.getpwnam(str(user))
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid, entry.pw_name


def exposed(path: Path | str, identity: Identity) -> str:
    """Why the generator's user could read the secret file ``path`` ("" if it
    cannot, or if there is no such file): the file must be the agent's, 0600
    (no group or other bits), and lie below a directory that user cannot
    traverse."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return ""
    except OSError as e:
        return f"{path}: {e.strerror}"
    if st.st_uid == identity.uid:
        return f"{path} belongs to the generator user {identity.name}; chown it to the agent's user"
    if stat.S_IMODE(st.st_mode) & 0o077:
        return f"{path} is mode {stat.S_IMODE(st.st_mode):o}; chmod 600 {path}"
    if not any(_closed_to(d, identity) for d in Path(os.path.abspath(path)).parents):
        return (
            f"every directory above {path} lets {identity.name} through; chmod 700 (or o-x)"
            f" its directory, or keep it in one that user cannot enter"
        )
    return ""


def _closed_to(directory: Path, identity: Identity) -> bool:
    """``directory`` cannot be traversed by the generator's user (no x bit for it)."""
    try:
        st = directory.stat()
    except OSError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == identity.uid:
        return not mode & stat.S_IXUSR
    if st.st_gid == identity.gid:
        return not mode & stat.S_IXGRP
    return not mode & stat.S_IXOTH


def unreachable_part(path: Path) -> Path | None:
    """The first directory on the way to ``path`` that other users cannot
    traverse (no ``o+x``), or None: a dropped generator could not reach its
    work directory below it."""
    path = path.resolve()
    for part in (*reversed(path.parents), path):
        if part.exists() and not part.stat().st_mode & 0o001:
            return part
    return None


def hand_over(workdir: Path, identity: Identity | None) -> None:
    """Give the run's work directory (and what the agent put in it) to the
    generator's user; the agent still reads it as root."""
    if identity is None:
        return
    for path in (workdir, *workdir.rglob("*")):
        os.lchown(path, identity.uid, identity.gid)

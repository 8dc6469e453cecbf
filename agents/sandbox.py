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

Identity: an agent running as root with a configured generator user drops the
generator to that (unprivileged) user and hands it the run's work directory;
an agent that is not root cannot switch and runs generators as itself.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH")
PATHLIKE_ENV = frozenset({"PYTHONPATH", "PATH", "LD_LIBRARY_PATH"})


class SandboxError(ValueError):
    """The configured generator user cannot be used (the operator's fault)."""


def generator_env(
    profile_env: Mapping[str, str],
    inherit: tuple[str, ...] = (),
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a generator starts with (see the module's list)."""
    base = os.environ if base is None else base
    env = {k: base[k] for k in (*INHERITED_ENV, *inherit) if k in base}
    env.setdefault("PATH", os.defpath)
    for source in (profile_env, extra or {}):
        for key, value in source.items():
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

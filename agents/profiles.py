"""Model profiles: how to run one model's generator as an opaque subprocess.

A profile says which command line to run (a template), how progress is read
from its stdout, whether and how it checkpoints and resumes, what its output
is called, and how long silence means "hung" (``hang_timeout_s``; before the
generator's first line ``startup_timeout_s``, for a model that loads for
minutes before it says anything). Profiles load from a dict, a
JSON file or a TOML file, so operators add models without code changes.

Placeholders in ``command`` and ``resume_args``: ``{python}``, ``{prompt}``,
``{out}``, ``{params_json}``, ``{checkpoint_dir}``, ``{resume_from}``,
``{time_scale}``, ``{gpus}`` (comma-separated indices), ``{job_id}``,
``{run}``, ``{rank}`` and ``{world_size}`` (this node's place in a multi-node
gang). ``resume_args`` are appended only when the run resumes.

The prompt and the params are a tenant's data, so a profile is refused at load
when they could become anything else (:func:`check_user_data`): never handed to
a shell or spliced into inline code, and never where a generator's option
parser could read them as an option (``--prompt={prompt}``, or after ``--``).

A profile with ``builtin`` instead of a command runs in the agent's process:
``noop`` (report done, write an empty output) costs no process per job, nor does
``hold`` (holds its GPUs for ``params.duration_s``, scaled).

What the generator gets and gives back is bounded by the profile too:
``inherit_env`` names the agent's variables it may see (it sees almost none
otherwise), ``max_output_bytes``/``max_checkpoint_bytes``/``max_checkpoints``
cap what the agent uploads, and ``result_rank`` names the gang rank whose
output is the job's result.
"""

from __future__ import annotations

import json
import os
import re
import signal
import string
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from framespool.agents.sandbox import agent_only
from framespool.configfile import ConfigError, read_document

PLACEHOLDERS = frozenset(
    {
        "python",
        "prompt",
        "out",
        "params_json",
        "checkpoint_dir",
        "resume_from",
        "time_scale",
        "gpus",
        "job_id",
        "run",
        "rank",
        "world_size",
    }
)
USER_DATA = frozenset({"prompt", "params_json"})  # what a tenant chose: data, never code
SHELLS = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "csh", "tcsh", "fish", "busybox"}
)
INTERPRETER = re.compile(r"^(\{python\}|python[0-9.]*|perl|ruby|node|php|lua[0-9.]*|Rscript)$")
INLINE_CODE_FLAGS = frozenset({"-c", "-e", "-E", "--eval", "--command"})
BUILTINS = frozenset({"noop", "hold"})
GIB = 1 << 30

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class ProfileError(ValueError):
    """A profile definition is wrong (the operator's fault); names the field."""


@dataclass(frozen=True, slots=True)
class ProgressFormat:
    """JSON lines on stdout; these keys carry progress (0..1), step and total.
    A line with ``status_key`` only says "alive" (e.g. while encoding the output)."""

    progress_key: str = "progress"
    step_key: str = "step"
    total_key: str = "total_steps"
    status_key: str = "status"


@dataclass(frozen=True, slots=True)
class CheckpointSupport:
    """How to ask for a checkpoint and how the generator reports the file."""

    signal: str = "SIGUSR1"
    path_key: str = "checkpoint"  # stdout JSON line {"checkpoint": path, "step": n}
    step_key: str = "step"
    timeout_s: float = 30.0  # how long a requested checkpoint may take

    @property
    def signum(self) -> int:
        return int(getattr(signal, self.signal))


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    command: tuple[str, ...]
    progress: ProgressFormat = ProgressFormat()
    checkpoint: CheckpointSupport | None = None
    resume_args: tuple[str, ...] = ()
    output_name: str = "output.bin"
    content_type: str = "application/octet-stream"
    hang_timeout_s: float = 120.0
    # Silence allowed before the generator's first JSON line (interpreter and
    # model start-up); None: hang_timeout_s. Not shortened by a time scale.
    startup_timeout_s: float | None = None
    stop_grace_s: float = 10.0
    env: Mapping[str, str] = field(default_factory=dict)
    # Names of the agent's environment variables the generator may see besides
    # the minimal set (the agent's own credentials never go unless named here).
    inherit_env: tuple[str, ...] = ()
    builtin: str = ""  # run in-process instead of a command (see BUILTINS)
    max_output_bytes: int = 16 * GIB  # larger outputs are refused, not uploaded
    max_checkpoint_bytes: int = 16 * GIB
    max_checkpoints: int = 1000  # uploads per run; later checkpoints are dropped
    result_rank: int = 0  # in a multi-node gang, whose output is the job's result
    # What a tenant may ask of this model and what it gets when it asks nothing
    # (the API applies them at submit; ``GET /v1/models`` lists them): GPUs per
    # job from ``min_gpus`` to ``max_gpus`` (0: the deployment's own limit),
    # ``default_gpus`` when the request names none, and ``estimate_s`` as the
    # run-time estimate of a job that gives none (0: the API's default).
    description: str = ""
    min_gpus: int = 1
    max_gpus: int = 0
    default_gpus: int = 1
    estimate_s: float = 0.0

    @property
    def can_checkpoint(self) -> bool:
        return self.checkpoint is not None

    @property
    def can_resume(self) -> bool:
        return bool(self.resume_args)

    def argv(self, **values: Any) -> list[str]:
        """The command line for one run; ``resume_from`` None means a fresh start."""
        resume_from = values.get("resume_from")
        values = {"python": sys.executable, "rank": "0", "world_size": "1", **values}
        values["resume_from"] = resume_from or ""
        missing = PLACEHOLDERS - values.keys()
        if missing:
            raise ProfileError(f"profile {self.name!r}: no value for {sorted(missing)}")
        args = [part.format(**values) for part in self.command]
        if resume_from:
            args += [part.format(**values) for part in self.resume_args]
        return args

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelProfile:
        try:
            name = str(d["name"])
        except KeyError as e:
            raise ProfileError(f"profile is missing required field {e.args[0]!r}") from None
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ProfileError(
                f"profile {name!r}: unknown field(s) {unknown}; a profile has: "
                + ", ".join(sorted(cls.__dataclass_fields__))
            )
        for key in ("command", "resume_args", "inherit_env"):
            value = d.get(key, ())
            if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
                raise ProfileError(
                    f"profile {name!r}: {key} must be a list of strings (one per argument), "
                    f"got {value!r}"
                )
        withheld = sorted(
            n for n in (*d.get("inherit_env", ()), *d.get("env", {})) if agent_only(str(n))
        )
        if withheld:
            raise ProfileError(
                f"profile {name!r}: env/inherit_env name {withheld}, the agent's own broker or "
                "object-store settings: a generator never gets them; remove them (a generator "
                "that needs a service of its own gets its own credentials under other names)"
            )
        builtin = str(d.get("builtin", ""))
        if builtin and builtin not in BUILTINS:
            raise ProfileError(
                f"profile {name!r}: unknown builtin {builtin!r}; known: {sorted(BUILTINS)}"
            )
        if "command" not in d and not builtin:
            raise ProfileError(f"profile {name!r} is missing required field 'command'")
        command = tuple(str(p) for p in d.get("command", ()))
        if builtin and command:
            raise ProfileError(f"profile {name!r}: give either 'builtin' or 'command', not both")
        if not command and not builtin:
            raise ProfileError(f"profile {name!r}: 'command' must not be empty")
        resume_args = tuple(str(p) for p in d.get("resume_args", ()))
        for part in command + resume_args:
            _check_template(name, part)
        check_user_data(name, command + resume_args)
        ckpt = d.get("checkpoint")
        checkpoint = None
        if ckpt:
            checkpoint = (
                CheckpointSupport(**ckpt) if isinstance(ckpt, Mapping) else CheckpointSupport()
            )
            if not hasattr(signal, checkpoint.signal):
                raise ProfileError(
                    f"profile {name!r}: unknown checkpoint signal {checkpoint.signal!r}"
                )
        limits = {
            k: int(d.get(k, cls.__dataclass_fields__[k].default))
            for k in ("max_output_bytes", "max_checkpoint_bytes", "max_checkpoints")
        }
        for k, v in limits.items():
            if v <= 0:
                raise ProfileError(f"profile {name!r}: {k} must be positive, got {v}")
        startup = d.get("startup_timeout_s")
        if startup is not None:
            startup = float(startup)
            if not startup > 0:
                raise ProfileError(
                    f"profile {name!r}: startup_timeout_s must be positive, got {startup}"
                )
        result_rank = int(d.get("result_rank", 0))
        if result_rank < 0:
            raise ProfileError(f"profile {name!r}: result_rank must be >= 0, got {result_rank}")
        gpus = _gpu_limits(name, d)
        estimate_s = float(d.get("estimate_s", 0.0))
        if not 0 <= estimate_s < float("inf"):
            raise ProfileError(
                f"profile {name!r}: estimate_s must be a run time in seconds (0: the API's "
                f"default), got {estimate_s}"
            )
        return cls(
            name=name,
            command=command,
            progress=ProgressFormat(**d.get("progress", {})),
            checkpoint=checkpoint,
            resume_args=resume_args,
            output_name=str(d.get("output_name", "output.bin")),
            content_type=str(d.get("content_type", "application/octet-stream")),
            hang_timeout_s=float(d.get("hang_timeout_s", 120.0)),
            startup_timeout_s=startup,
            stop_grace_s=float(d.get("stop_grace_s", 10.0)),
            env=dict(d.get("env", {})),
            inherit_env=tuple(str(n) for n in d.get("inherit_env", ())),
            builtin=builtin,
            result_rank=result_rank,
            description=str(d.get("description", "")),
            estimate_s=estimate_s,
            **gpus,
            **limits,
        )


def _gpu_limits(name: str, d: Mapping[str, Any]) -> dict[str, int]:
    """``min_gpus``, ``max_gpus`` and ``default_gpus`` of a profile table, checked:
    whole numbers, ``1 <= min <= default <= max`` (``max_gpus`` 0: no limit of its own)."""
    out = {}
    for key, default in (("min_gpus", 1), ("max_gpus", 0), ("default_gpus", 1)):
        value = d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProfileError(f"profile {name!r}: {key} must be a whole number, got {value!r}")
        out[key] = value
    low, high, default = out["min_gpus"], out["max_gpus"], out["default_gpus"]
    if low < 1 or default < low or (high and not low <= default <= high):
        raise ProfileError(
            f"profile {name!r}: GPU limits must satisfy 1 <= min_gpus <= default_gpus <= "
            f"max_gpus (max_gpus 0 = no limit), got min {low}, default {default}, max {high}"
        )
    return out


def _check_template(name: str, part: str) -> None:
    for _, field_name, _, _ in string.Formatter().parse(part):
        if field_name is not None and field_name not in PLACEHOLDERS:
            raise ProfileError(
                f"profile {name!r}: unknown placeholder {{{field_name}}} in {part!r};"
                f" known: {sorted(PLACEHOLDERS)} (write literal braces as {{{{ and }}}})"
            )


def _fields(part: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]


def _word(arg: str) -> str:
    """The program name an argument would be (``env -S "sh -c"`` included)."""
    words = arg.split()
    return os.path.basename(words[0]) if words else ""


def check_user_data(name: str, args: tuple[str, ...]) -> None:
    """Refuse a template where a tenant's prompt or params could become code or
    an option; raises :class:`ProfileError` naming the argument and the fix.

    1. A shell (``sh -c``, also behind ``env``, ``nice``, ``timeout``...) never
       sees user data: a prompt would be shell code.
    2. Nor does an interpreter's inline code (``python -c``, ``perl -e``),
       behind a wrapper or not.
    3. An argument that starts with user data must come after a ``--``
       argument; otherwise a prompt such as ``--fail-at-step=0`` is an option.
       Glued to an option it needs ``=`` (``-p{prompt}`` is ``-p`` alone when
       the prompt is empty, and takes the next argument).
    """
    words = [_word(a) for a in args]
    separated = False
    for i, part in enumerate(args):
        used = USER_DATA.intersection(_fields(part))
        if part == "--":
            separated = True
        if not used:
            continue
        ph = "{" + sorted(used)[0] + "}"
        shell = next((w for w in words[:i] if w in SHELLS), None)
        if shell is not None:
            raise ProfileError(
                f"profile {name!r}: its command runs a shell ({shell}) and hands it {ph}"
                f" in {part!r}: a tenant's text could run as shell code. Run the generator"
                " (or a wrapper script, by its own path) directly, without a shell"
            )
        interpreter = next((w for w in words[:i] if INTERPRETER.match(w)), None)
        if interpreter and i > 0 and args[i - 1] in INLINE_CODE_FLAGS:
            raise ProfileError(
                f"profile {name!r}: {part!r} after {args[i - 1]!r} is inline code for"
                f" {interpreter} and interpolates {ph}: a tenant's text would run as code."
                f" Pass it as an argument of a script instead (--name={ph})"
            )
        prefix = next(iter(string.Formatter().parse(part)))[0]
        if prefix == "" and not separated:
            raise ProfileError(
                f"profile {name!r}: argument {part!r} starts with {ph}, which could be"
                f" read as an option (a prompt may start with '-'): attach it to its"
                f" option (--name={ph}) or put it after a '--' argument"
            )
        if prefix.startswith("-") and not prefix.endswith("=") and not separated:
            raise ProfileError(
                f"profile {name!r}: in {part!r}, {ph} is glued to an option without '=':"
                f" when it is empty the option takes the next argument; write --name={ph}"
            )


def demo_profile() -> ModelProfile:
    """The bundled demo generator (``python -m framespool.agents.demo_generator``)."""
    return ModelProfile.from_dict(
        {
            "name": "demo",
            "command": [
                "{python}",
                "-m",
                "framespool.agents.demo_generator",
                "--prompt={prompt}",
                "--out",
                "{out}",
                "--params-json={params_json}",
                "--checkpoint-dir",
                "{checkpoint_dir}",
                "--time-scale",
                "{time_scale}",
            ],
            "resume_args": ["--resume-from", "{resume_from}"],
            "checkpoint": {"signal": "SIGUSR1", "path_key": "checkpoint", "timeout_s": 10.0},
            "output_name": "output.gif",
            "content_type": "image/gif",
            "hang_timeout_s": 30.0,
            "stop_grace_s": 5.0,
            "env": {"PYTHONPATH": PACKAGE_ROOT, "PYTHONUNBUFFERED": "1"},
        }
    )


def noop_profile() -> ModelProfile:
    """A zero-work generator, run in the agent's process (no shell, no process
    per job): what ``framespool bench pipeline`` runs to measure the pipeline
    itself rather than generation."""
    return ModelProfile.from_dict(
        {
            "name": "noop",
            "builtin": "noop",
            "output_name": "output.bin",
            "hang_timeout_s": 30.0,
            "stop_grace_s": 1.0,
        }
    )


def hold_profile() -> ModelProfile:
    """A generator that holds its GPUs for ``params.duration_s`` (scaled) in the
    agent's process (``framespool.agents.builtin``): backlogs of many jobs on a
    small machine, without a process per job."""
    return ModelProfile.from_dict(
        {
            "name": "hold",
            "builtin": "hold",
            "output_name": "output.bin",
            "hang_timeout_s": 30.0,
            "stop_grace_s": 1.0,
        }
    )


def load_profiles(source: Any = None) -> dict[str, ModelProfile]:
    """Profiles by model name: the built-in ``demo``, ``noop`` and ``hold`` plus any
    from ``source``: a list of dicts, or a path to a .json/.toml file whose
    ``profiles`` list (``[[profiles]]`` tables in TOML) holds them. Other sections
    of the file are other processes' (it may be the whole deployment file that
    ``framespool up --config`` takes) and are left alone. A profile of a file
    that is wrong raises :class:`~framespool.configfile.ConfigError` naming the
    file, the key (``profiles[1]``) and what was expected."""
    profiles = {"demo": demo_profile(), "noop": noop_profile(), "hold": hold_profile()}
    if source is None:
        return profiles
    if isinstance(source, (str, Path)):
        return profiles | profile_tables(Path(source))
    for item in source:
        profile = item if isinstance(item, ModelProfile) else ModelProfile.from_dict(item)
        profiles[profile.name] = profile
    return profiles


def profile_tables(path: Path) -> dict[str, ModelProfile]:
    """The ``profiles`` of the file at ``path``, checked (``load_profiles``);
    ``{config_dir}`` in a command line is the file's directory."""
    if path.suffix != ".toml" and path.is_file() and path.read_text().lstrip().startswith("["):
        doc: Any = {"profiles": json.loads(path.read_text())}  # a bare JSON list of profiles
    else:
        doc = read_document(path)
    tables = expand_config_dir(doc.get("profiles", []), path.resolve().parent)
    return profile_list(tables, path)


def expand_config_dir(tables: Any, directory: Path) -> Any:
    """``tables`` with ``{config_dir}`` in each command line and resume argument
    replaced by ``directory`` (the deployment file's): a generator shipped beside
    the file is found wherever the file is. Anything not a list of tables is
    returned as it is, for ``profile_list`` to refuse."""
    if not isinstance(tables, list):
        return tables
    literal = str(directory).replace("{", "{{").replace("}", "}}")
    out = []
    for table in tables:
        if isinstance(table, Mapping):
            table = dict(table)
            for key in ("command", "resume_args"):
                if isinstance(table.get(key), list):
                    table[key] = [
                        p.replace("{config_dir}", literal) if isinstance(p, str) else p
                        for p in table[key]
                    ]
        out.append(table)
    return out


def profile_list(tables: Any, source: Any = None) -> dict[str, ModelProfile]:
    """Profiles by name from a list of tables; errors name ``source`` (a path, or
    a document that remembers its file) and the key (``profiles[1]``)."""
    path = source if isinstance(source, (str, Path)) or source is None else None
    if path is None:
        path = getattr(source, "source", None)
    if not isinstance(tables, list):
        raise ConfigError(
            f"expected a list of profile tables ([[profiles]] in TOML), got {tables!r}",
            key="profiles",
            file=path,
        )
    found: dict[str, ModelProfile] = {}
    for i, table in enumerate(tables):
        if not isinstance(table, Mapping):
            raise ConfigError(
                f"expected a table with name and command, got {table!r}",
                key=f"profiles[{i}]",
                file=path,
            )
        try:
            profile = ModelProfile.from_dict(table)
        except (ProfileError, TypeError, ValueError) as exc:
            raise ConfigError(str(exc), key=f"profiles[{i}]", file=path) from None
        if profile.name in found:
            raise ConfigError(
                f"a second profile named {profile.name!r}; give each model one profile",
                key=f"profiles[{i}].name",
                file=path,
            )
        found[profile.name] = profile
    return found

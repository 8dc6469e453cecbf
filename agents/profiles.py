"""Model profiles: how to run one model's generator as an opaque subprocess.

A profile says which command line to run (a template), how progress is read
from its stdout, whether and how it checkpoints and resumes, what its output
is called, and how long silence means "hung". Profiles load from a dict, a
JSON file or a TOML file, so operators add models without code changes.

Placeholders in ``command`` and ``resume_args``: ``{python}``, ``{prompt}``,
``{out}``, ``{params_json}``, ``{checkpoint_dir}``, ``{resume_from}``,
``{time_scale}``, ``{gpus}`` (comma-separated indices), ``{job_id}``,
``{run}``. ``resume_args`` are appended only when the run resumes.
"""

from __future__ import annotations

import json
import signal
import string
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    }
)

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
    stop_grace_s: float = 10.0
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def can_checkpoint(self) -> bool:
        return self.checkpoint is not None

    @property
    def can_resume(self) -> bool:
        return bool(self.resume_args)

    def argv(self, **values: Any) -> list[str]:
        """The command line for one run; ``resume_from`` None means a fresh start."""
        resume_from = values.get("resume_from")
        values = {"python": sys.executable, "resume_from": "", **values}
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
            command = tuple(str(p) for p in d["command"])
        except KeyError as e:
            raise ProfileError(f"profile is missing required field {e.args[0]!r}") from None
        if not command:
            raise ProfileError(f"profile {name!r}: 'command' must not be empty")
        resume_args = tuple(str(p) for p in d.get("resume_args", ()))
        for part in command + resume_args:
            _check_template(name, part)
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
        return cls(
            name=name,
            command=command,
            progress=ProgressFormat(**d.get("progress", {})),
            checkpoint=checkpoint,
            resume_args=resume_args,
            output_name=str(d.get("output_name", "output.bin")),
            content_type=str(d.get("content_type", "application/octet-stream")),
            hang_timeout_s=float(d.get("hang_timeout_s", 120.0)),
            stop_grace_s=float(d.get("stop_grace_s", 10.0)),
            env=dict(d.get("env", {})),
        )


def _check_template(name: str, part: str) -> None:
    for _, field_name, _, _ in string.Formatter().parse(part):
        if field_name is not None and field_name not in PLACEHOLDERS:
            raise ProfileError(
                f"profile {name!r}: unknown placeholder {{{field_name}}} in {part!r};"
                f" known: {sorted(PLACEHOLDERS)} (write literal braces as {{{{ and }}}})"
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
                "--prompt",
                "{prompt}",
                "--out",
                "{out}",
                "--params-json",
                "{params_json}",
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
    """A zero-work generator (a shell that reports done and writes an empty
    file): what ``framespool bench pipeline`` runs to measure the pipeline
    itself rather than generation."""
    return ModelProfile.from_dict(
        {
            "name": "noop",
            "command": [
                "/bin/sh",
                "-c",
                "mkdir -p \"${{0%/*}}\" && : > \"$0\" && "
                "echo '{{\"progress\": 1.0, \"step\": 1, \"total_steps\": 1}}'",
                "{out}",
            ],
            "output_name": "output.bin",
            "hang_timeout_s": 30.0,
            "stop_grace_s": 1.0,
        }
    )


def load_profiles(source: Any = None) -> dict[str, ModelProfile]:
    """Profiles by model name: the built-in ``demo`` and ``noop`` plus any from
    ``source`` (a path to .json/.toml holding ``{"profiles": [...]}`` or a list
    of dicts)."""
    profiles = {"demo": demo_profile(), "noop": noop_profile()}
    if source is None:
        return profiles
    if isinstance(source, (str, Path)):
        path = Path(source)
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        source = data.get("profiles", data) if isinstance(data, dict) else data
    for item in source:
        profile = item if isinstance(item, ModelProfile) else ModelProfile.from_dict(item)
        profiles[profile.name] = profile
    return profiles

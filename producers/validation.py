"""Validation of ``POST /v1/jobs`` bodies: every refusal names the field, the limit
and what to do, so a client can fix its request without reading our code.

``validate_submit(body, policy)`` returns the keyword arguments of a ``JobSpec``
(without ``job_id``, ``tenant``, ``user`` and ``submitted_ms``, which the API
adds) or raises ``ValidationError``. It normalises what it accepts (numbers in
``params`` become strings, ``gpus_per_node`` is capped at ``gpus``) so that the
same request always yields the same spec and the same idempotency fingerprint.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from framespool.callbacks.targets import TargetPolicy, check_target
from framespool.producers import patterns
from framespool.producers.auth import TenantPolicy
from framespool.schemas.events import Shape

# matched with fullmatch: "$" would accept a trailing newline
_NAME = re.compile(patterns.NAME)
_PARAM_KEY = re.compile(patterns.PARAM_KEY)
_RESOLUTION = re.compile(patterns.RESOLUTION)


class ValidationError(Exception):
    """The request is wrong (the client's fault); ``status`` is 400, 403, 413 or 422."""

    def __init__(
        self, field: str | None, message: str, status: int = 422, code: str = "invalid_field"
    ) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ModelDefaults:
    """What one model accepts, fills in and produces (from its profile, ``agents.profiles``):
    GPUs per job from ``min_gpus`` to ``max_gpus`` (0: only the deployment's
    ``Limits.gpus_max``), ``default_gpus`` when a request names none, and
    ``estimate_s`` as the run-time estimate of a job that gives none (0: JobSpec's)."""

    min_gpus: int = 1
    max_gpus: int = 0
    default_gpus: int = 1
    estimate_s: float = 0.0
    # what GET /v1/models tells about it besides
    description: str = ""
    output_name: str = ""
    content_type: str = ""
    checkpoints: bool = False


@dataclass(frozen=True)
class Limits:
    prompt_max_chars: int = 4000
    params_max_bytes: int = 4096
    param_value_max_chars: int = 1000
    gpus_max: int = 64
    gpus_per_node_max: int = 8
    duration_max_s: float = 120.0
    fps_min: int = 1
    fps_max: int = 60
    resolution_min: int = 64
    resolution_max: int = 4096
    callback_url_max: int = 2048
    shapes_max: int = 8
    estimate_max_s: float = 86400.0
    # a checkpointing job checkpoints no more often than this (0: never): 1e-9
    # made its agent checkpoint in a loop
    checkpoint_interval_min_s: float = 1.0
    models: frozenset[str] | None = None  # None: any well-formed model name
    default_model: str | None = None  # the model of a request that names none
    # per model: its GPU limits and defaults (absent: 1 GPU, up to gpus_max)
    model_defaults: Mapping[str, ModelDefaults] = field(default_factory=dict, hash=False)


FIELDS = (
    "prompt",
    "model",
    "model_version",
    "params",
    "gpus",
    "gpus_per_node",
    "tier",
    "preemptible",
    "callback_url",
    "shapes",
    "estimate_s",
    "checkpoint_interval_s",
    "gpu_type",
    "cpus",
    "mem_gb",
)


def _int(
    body: dict,
    name: str,
    default: int | None,
    lo: int,
    hi: int,
    hint: str,
    field: str | None = None,
) -> int:
    field = field or name
    value = body.get(name, default)
    if value is None:
        raise ValidationError(field, f"is required: {hint}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ValidationError(field, f"must be between {lo} and {hi}, got {value}; {hint}")
    return value


def _number(
    body: dict, name: str, lo: float, hi: float, *, lo_open: bool = False, field: str | None = None
) -> float | None:
    field = field or name
    value = body.get(name)
    if value is None:
        return None
    low = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValidationError(field, f"must be a number {low} and at most {hi:g}, got {value!r}")
    if value > hi or value < lo or (lo_open and value == lo):
        raise ValidationError(field, f"must be {low} and at most {hi:g}, got {value}")
    return float(value)


def _name(body: dict, name: str, default: str | None, what: str) -> str | None:
    value = body.get(name, default)
    if value is None:
        return None
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValidationError(
            name,
            f"must be a {what}: 1-64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit; got {value!r}",
        )
    return value


def _gang(
    body: dict, prefix: str, limits: Limits, model: ModelDefaults = ModelDefaults()
) -> tuple[int, int]:
    high = min(limits.gpus_max, model.max_gpus or limits.gpus_max)
    low = min(model.min_gpus, high)
    gpus = _int(
        body,
        "gpus",
        min(max(model.default_gpus, low), high),
        low,
        high,
        f"this model runs on {low} to {high} GPUs (GET /v1/models)"
        if (low, high) != (1, limits.gpus_max)
        else f"ask for at most {limits.gpus_max} GPUs or split the work",
        f"{prefix}gpus",
    )
    per_node = _int(
        body,
        "gpus_per_node",
        min(gpus, limits.gpus_per_node_max),
        1,
        limits.gpus_per_node_max,
        f"a node has at most {limits.gpus_per_node_max} GPUs",
        f"{prefix}gpus_per_node",
    )
    if gpus > per_node and gpus % per_node:
        raise ValidationError(
            f"{prefix}gpus_per_node",
            f"must divide gpus ({gpus}) when the job "
            f"spans nodes; got {per_node}: use a divisor such as "
            f"{max(d for d in range(1, per_node + 1) if gpus % d == 0)}",
        )
    return gpus, min(per_node, gpus)


def _params(value: Any, limits: Limits) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(
            "params",
            "must be a JSON object such as "
            '{"resolution": "1280x720", "duration_s": 5, "fps": 24, "seed": 7}',
        )
    out: dict[str, str] = {}
    for key, v in value.items():
        field = f"params.{key}"
        if not _PARAM_KEY.fullmatch(key):
            raise ValidationError(
                field,
                "parameter names are 1-64 lower-case letters, digits "
                "or '_', starting with a letter",
            )
        if key == "resolution":
            out[key] = _resolution(v, limits, field)
        elif key == "duration_s":
            seconds = _number(value, key, 0.0, limits.duration_max_s, lo_open=True, field=field)
            if seconds is None:  # sent as null
                raise ValidationError(
                    field, f"must be a number of seconds, at most {limits.duration_max_s:g}"
                )
            out[key] = json.dumps(int(seconds) if seconds.is_integer() else seconds)
        elif key == "fps":
            out[key] = str(
                _int(
                    value,
                    key,
                    None,
                    limits.fps_min,
                    limits.fps_max,
                    "use a frame rate such as 24 or 30",
                    field,
                )
            )
        elif key == "seed":
            out[key] = str(_int(value, key, None, 0, 2**63 - 1, "any non-negative integer", field))
        elif isinstance(v, bool):
            out[key] = "true" if v else "false"
        elif isinstance(v, (int, float, str)) and not (
            isinstance(v, float) and not math.isfinite(v)
        ):
            if isinstance(v, str) and len(v) > limits.param_value_max_chars:
                raise ValidationError(
                    field, f"is {len(v)} characters; the limit is {limits.param_value_max_chars}"
                )
            out[key] = v if isinstance(v, str) else json.dumps(v)
        else:
            raise ValidationError(field, "must be a string, number or boolean")
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > limits.params_max_bytes:
        raise ValidationError(
            "params",
            f"is {size} bytes of JSON; the limit is "
            f"{limits.params_max_bytes}: drop or shorten parameters",
        )
    return out


def _resolution(value: Any, limits: Limits, field: str) -> str:
    """WIDTHxHEIGHT, from itself or a preset such as 720p (stored as WIDTHxHEIGHT, so both
    spellings of one request have one idempotency fingerprint)."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text in patterns.RESOLUTION_PRESETS:
        text = patterns.RESOLUTION_PRESETS[text]
    m = _RESOLUTION.fullmatch(text) if text is not None else None
    lo, hi = limits.resolution_min, limits.resolution_max
    if not m or not all(lo <= int(x) <= hi and int(x) % 2 == 0 for x in m.groups()):
        raise ValidationError(
            field,
            f"must be WIDTHxHEIGHT such as '1280x720', each an even number from {lo} to "
            f"{hi}, or one of {', '.join(patterns.RESOLUTION_PRESETS)}; got {value!r}",
        )
    return f"{m.group(1)}x{m.group(2)}"


def _unencodable(body: dict) -> tuple[str, str] | None:
    """(field, text) of the first string in ``body`` that is not valid Unicode (a lone
    surrogate from a JSON escape such as \\ud800), or None. Iterative: any depth."""
    stack: list[tuple[str, Any]] = [(k, v) for k, v in reversed(body.items())]
    while stack:
        field, value = stack.pop()
        texts = [value] if isinstance(value, str) else []
        if isinstance(value, dict):
            texts = list(value)
            stack.extend((f"{field}.{k}", v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{field}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        for text in [field, *texts]:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return field, text
    return None


def _shapes(value: Any, limits: Limits, model: ModelDefaults) -> tuple[Shape, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limits.shapes_max:
        raise ValidationError(
            "shapes",
            f"must be a list of at most {limits.shapes_max} objects "
            '{"gpus": 8, "gpus_per_node": 8, "estimate_s": 300}',
        )
    out = []
    for i, shape in enumerate(value):
        prefix = f"shapes[{i}]."
        if not isinstance(shape, dict) or set(shape) - {"gpus", "gpus_per_node", "estimate_s"}:
            raise ValidationError(
                f"shapes[{i}]", "must be an object with gpus, gpus_per_node and estimate_s only"
            )
        gpus, per_node = _gang(shape, prefix, limits, model)
        estimate = _number(
            shape,
            "estimate_s",
            0.0,
            limits.estimate_max_s,
            lo_open=True,
            field=f"{prefix}estimate_s",
        )
        if estimate is None:
            raise ValidationError(
                f"{prefix}estimate_s", "is required: the run time in seconds this shape needs"
            )
        out.append(Shape(gpus=gpus, gpus_per_node=per_node, estimate_s=estimate))
    return tuple(out)


def _callback(value: Any, limits: Limits, url_policy: TargetPolicy) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError("callback_url", "must be an http(s) URL string")
    if len(value) > limits.callback_url_max:
        raise ValidationError(
            "callback_url", f"is {len(value)} characters; the limit is {limits.callback_url_max}"
        )
    problem = check_target(value, url_policy)  # host names are checked again at delivery
    if problem:
        raise ValidationError("callback_url", f"{problem}; use a public http(s) endpoint")
    return value


def validate_submit(
    body: Any,
    policy: TenantPolicy,
    limits: Limits = Limits(),
    url_policy: TargetPolicy = TargetPolicy(),
) -> dict[str, Any]:
    """JobSpec keyword arguments for a valid body; ``ValidationError`` otherwise."""
    if not isinstance(body, dict):
        raise ValidationError(None, "the request body must be a JSON object", 422, "invalid_body")
    bad = _unencodable(body)
    if bad is not None:
        raise ValidationError(
            bad[0],
            "contains a lone UTF-16 surrogate (e.g. \\ud800 without its pair); "
            "send valid Unicode text",
        )
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ValidationError(
            unknown[0],
            f"is not a known field; known fields: {', '.join(FIELDS)}",
            code="unknown_field",
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValidationError("prompt", "is required: a non-empty text describing the video")
    if len(prompt) > limits.prompt_max_chars:
        raise ValidationError(
            "prompt",
            f"is {len(prompt)} characters; the limit is "
            f"{limits.prompt_max_chars}: shorten the prompt",
        )
    if "\x00" in prompt:
        raise ValidationError("prompt", "must not contain NUL characters")
    model = _name(body, "model", limits.default_model, "model name")
    if model is None:
        served = (
            f": one of {', '.join(sorted(limits.models))}" if limits.models else ", e.g. 'demo'"
        )
        raise ValidationError("model", f"is required: the name of the generator model{served}")
    if limits.models is not None and model not in limits.models:
        raise ValidationError(
            "model", f"{model!r} is not served here; available: {', '.join(sorted(limits.models))}"
        )
    if policy.models and model not in policy.models:
        raise ValidationError(
            "model",
            f"{model!r} is not one of your tenant's models ({', '.join(policy.models)}); "
            "GET /v1/models lists what you may submit",
            403,
            "model_not_allowed",
        )
    defaults = limits.model_defaults.get(model, ModelDefaults())
    gpus, per_node = _gang(body, "", limits, defaults)
    tier = body.get("tier", policy.tier)
    if not isinstance(tier, str) or tier not in policy.tiers:
        raise ValidationError(
            "tier",
            f"{tier!r} is not one of your tenant's tiers "
            f"({', '.join(policy.tiers)}); pick one of those",
            403,
            "tier_not_allowed",
        )
    preemptible = body.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise ValidationError("preemptible", f"must be true or false, got {preemptible!r}")
    spec: dict[str, Any] = {
        "prompt": prompt,
        "model": model,
        "gpus": gpus,
        "gpus_per_node": per_node,
        "tier": tier,
        "preemptible": preemptible,
        "params": _params(body.get("params"), limits),
        "callback_url": _callback(body.get("callback_url"), limits, url_policy),
        "shapes": _shapes(body.get("shapes"), limits, defaults),
    }
    if defaults.estimate_s > 0:
        spec["estimate_s"] = defaults.estimate_s  # a model's typical run; the body's wins
    version = _name(body, "model_version", None, "model version")
    if version is not None:
        spec["model_version"] = version
    gpu_type = _name(body, "gpu_type", None, "GPU type")
    if gpu_type is not None:
        spec["gpu_type"] = gpu_type
    for name, hi in (
        ("estimate_s", limits.estimate_max_s),
        ("checkpoint_interval_s", 3600.0),
        ("cpus", 1024.0),
        ("mem_gb", 8192.0),
    ):
        value = _number(body, name, 0.0, hi, lo_open=name == "estimate_s")
        if value is not None:
            spec[name] = value
    interval = spec.get("checkpoint_interval_s", 0.0)
    if 0 < interval < limits.checkpoint_interval_min_s:
        raise ValidationError(
            "checkpoint_interval_s",
            f"must be 0 (no checkpoints) or from {limits.checkpoint_interval_min_s:g} to 3600 "
            f"seconds, got {interval:g}",
        )
    return spec

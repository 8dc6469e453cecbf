"""A small, real text-to-video generator for demos, tests and chaos drills.

Run as ``python -m framespool.agents.demo_generator --prompt "a cat" --out out.gif``.

Theory of operation
-------------------
The "model" keeps a latent: a few numbers per frame (hue, phase, frequency,
amplitude). Each step blends the latent towards fresh noise drawn from a seeded
RNG, like a denoising loop, and sleeps ``seconds_per_step / time_scale`` to
stand in for GPU work. After the last step the latent is rendered to frames
that show the prompt over a moving pattern and written as an animated GIF.

A checkpoint is the whole state — step, RNG state, latent — as JSON, so a run
resumed from any checkpoint produces byte-identical output to an uninterrupted
one. Checkpoints are taken at step boundaries: on SIGUSR1 (as soon as the
current step ends) and every ``--checkpoint-every`` steps.

stdout carries one JSON object per line:
``{"progress": p, "step": s, "total_steps": n}`` after each step (step 0 first),
``{"checkpoint": path, "step": s}`` after each checkpoint,
``{"status": "rendering", ...}`` now and then while the frames are drawn. Exit codes:
0 done, 2 bad arguments, 3 ``--fail-at-step``, 141 stdout closed, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import colorsys
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INJECTED_FAILURE = 3
EXIT_ORPHANED = 141
EXIT_TERMINATED = 143
CHECKPOINT_VERSION = 1
LATENT_DIMS = 4  # hue, phase, frequency, amplitude
PIXEL_BUDGET = 50_000_000  # frames x width x height: keeps memory and render time small
STATUS_EVERY_S = 0.5


class Generator:
    """The generator's state and its pure step function (no IO, no sleeping)."""

    def __init__(
        self,
        *,
        prompt: str,
        width: int,
        height: int,
        frames: int,
        steps: int,
        seed: int,
        fps: int = 12,
    ) -> None:
        self.prompt, self.width, self.height = prompt, width, height
        self.frames, self.steps, self.seed, self.fps = frames, steps, seed, fps
        self.step = 0
        self.rng = random.Random(seed)
        self.latent = [[self.rng.random() for _ in range(LATENT_DIMS)] for _ in range(frames)]

    def advance(self) -> None:
        strength = 1.0 / (self.step + 2)
        for vec in self.latent:
            for i in range(LATENT_DIMS):
                vec[i] = (1 - strength) * vec[i] + strength * self.rng.random()
        self.step += 1

    def state(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "version": CHECKPOINT_VERSION,
            "prompt": self.prompt,
            "seed": self.seed,
            "width": self.width,
            "height": self.height,
            "frames": self.frames,
            "steps": self.steps,
            "step": self.step,
            "rng": [version, list(internal), gauss],
            "latent": self.latent,
        }

    def restore(self, state: dict[str, Any]) -> None:
        for name in ("prompt", "seed", "width", "height", "frames", "steps"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"checkpoint {name}={state[name]!r} does not match this run's"
                    f" {getattr(self, name)!r}; resume with the same prompt and params"
                )
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.latent = [list(v) for v in state["latent"]]
        self.step = int(state["step"])

    def render(self, path: Path, on_frame: Callable[[int], None] | None = None) -> None:
        from PIL import Image, ImageDraw  # imported late: startup stays fast

        images = []
        for f, (hue, phase, freq, amp) in enumerate(self.latent):
            if on_frame is not None:
                on_frame(f)
            img = Image.new("RGB", (self.width, self.height))
            draw = ImageDraw.Draw(img)
            t = f / max(self.frames, 1)
            bands = 3 + int(freq * 6)
            for x in range(0, self.width, 4):
                wave = math.sin(2 * math.pi * (x / self.width * bands + t + phase))
                r, g, b = colorsys.hsv_to_rgb((hue + 0.1 * wave) % 1.0, 0.6, 0.5 + 0.4 * amp)
                top = int(self.height * (0.5 + 0.35 * wave * amp))
                draw.rectangle(
                    [x, top, x + 3, self.height], fill=(int(r * 255), int(g * 255), int(b * 255))
                )
            draw.text((4, 4), self.prompt[:40], fill=(255, 255, 255))
            draw.text((4, self.height - 14), f"{f + 1}/{self.frames}", fill=(255, 255, 255))
            images.append(img.quantize(colors=64, dither=Image.Dither.NONE))
        tmp = path.with_name(path.name + ".tmp")
        images[0].save(
            tmp,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            duration=max(20, int(1000 / max(self.fps, 1))),
            loop=0,
        )
        os.replace(tmp, path)


def emit(obj: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Whoever read our progress is gone; do not keep a GPU busy for nobody.
        os._exit(EXIT_ORPHANED)


def write_checkpoint(gen: Generator, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt-{gen.step:06d}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(gen.state()))
    os.replace(tmp, path)  # atomic: a reader never sees half a checkpoint
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # A tenant's text arrives as --prompt=TEXT / --params-json=JSON and is taken
    # verbatim here: argparse would turn a value of exactly "--" into [].
    data: dict[str, str] = {}
    rest: list[str] = []
    for arg in sys.argv[1:] if argv is None else argv:
        name, eq, value = arg.partition("=")
        if eq and name in ("--prompt", "--params-json") and name not in data:
            data[name] = value
        else:
            rest.append(arg)
    p = argparse.ArgumentParser(
        prog="python -m framespool.agents.demo_generator", description=__doc__.split("\n")[0]
    )
    p.add_argument("--prompt", required="--prompt" not in data)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--params-json",
        default="{}",
        help="JSON object: resolution WxH, duration_s, fps, seed, steps, "
        "seconds_per_step, checkpoint_every, fail_at_step, hang_at_step",
    )
    p.add_argument("--resolution")
    p.add_argument("--duration-s", type=float)
    p.add_argument("--fps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--seconds-per-step", type=float)
    p.add_argument("--time-scale", type=float, default=1.0, help="speed factor; large = no waiting")
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--resume-from", type=Path)
    p.add_argument("--fail-at-step", type=int)
    p.add_argument("--hang-at-step", type=int)
    p.add_argument("--ignore-sigterm", action="store_true", help="chaos: only SIGKILL ends it")
    p.add_argument(
        "--spawn-child",
        action="store_true",
        help="start a helper process (reported as {\"child_pid\": n}) like real multi-GPU workers",
    )
    args = p.parse_args(rest)
    if "--prompt" in data:
        args.prompt = data["--prompt"]
    if "--params-json" in data:
        args.params_json = data["--params-json"]
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Merge --params-json (job params arrive as strings) with explicit flags."""
    try:
        params = json.loads(args.params_json or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"--params-json is not valid JSON: {e}") from None
    s: dict[str, Any] = {
        "resolution": "160x90",
        "duration_s": 2.0,
        "fps": 12,
        "seed": 0,
        "steps": 20,
        "seconds_per_step": 0.5,
        "checkpoint_every": 0,
        "fail_at_step": -1,
        "hang_at_step": -1,
    }
    types = {k: type(v) for k, v in s.items()}
    for k, v in params.items():
        if k in types:
            s[k] = types[k](v) if types[k] is not int else int(float(v))
    for k in s:
        flag = getattr(args, k, None)
        if flag is not None:
            s[k] = types[k](flag)
    try:
        w, h = (int(x) for x in str(s["resolution"]).lower().split("x"))
    except ValueError:
        raise ValueError(
            f"resolution {s['resolution']!r} is not WIDTHxHEIGHT, e.g. 160x90"
        ) from None
    if not (8 <= w <= 1920 and 8 <= h <= 1080):
        raise ValueError(f"resolution {w}x{h} is outside 8x8..1920x1080")
    s["width"], s["height"] = w, h
    s["frames"] = max(1, min(600, round(s["duration_s"] * s["fps"])))
    if s["frames"] * w * h > PIXEL_BUDGET:
        raise ValueError(
            f"{s['frames']} frames of {w}x{h} exceed the demo's budget of "
            f"{PIXEL_BUDGET // 10**6} Mpx: lower duration_s, fps or resolution"
        )
    if s["steps"] < 0:
        raise ValueError("steps must be >= 0")
    return s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        s = settings(args)
    except ValueError as e:
        print(f"demo_generator: {e}", file=sys.stderr)
        return EXIT_USAGE
    gen = Generator(
        prompt=args.prompt,
        width=s["width"],
        height=s["height"],
        frames=s["frames"],
        steps=s["steps"],
        seed=s["seed"],
        fps=s["fps"],
    )
    if args.resume_from:
        try:
            gen.restore(json.loads(args.resume_from.read_text()))
        except (OSError, ValueError, KeyError) as e:
            print(f"demo_generator: cannot resume from {args.resume_from}: {e}", file=sys.stderr)
            return EXIT_USAGE

    checkpoint_requested = False

    def on_usr1(signum: int, frame: Any) -> None:
        nonlocal checkpoint_requested
        checkpoint_requested = True

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(EXIT_TERMINATED)

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_sigterm else on_term)
    if args.spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        emit({"child_pid": child.pid})

    delay = s["seconds_per_step"] / args.time_scale if args.time_scale > 0 else 0.0
    ckpt_dir = args.checkpoint_dir or args.out.parent / "checkpoints"

    def progress() -> None:
        total = gen.steps
        emit(
            {
                "progress": round(gen.step / total, 6) if total else 1.0,
                "step": gen.step,
                "total_steps": total,
            }
        )

    if gen.step < gen.steps:
        progress()
    while gen.step < gen.steps:
        if gen.step == s["hang_at_step"]:
            while True:  # a wedged generator: silent, alive, ignoring work
                time.sleep(3600)
        if gen.step == s["fail_at_step"]:
            print(f"demo_generator: injected failure at step {gen.step}", file=sys.stderr)
            return EXIT_INJECTED_FAILURE
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.02))
        gen.advance()
        every = s["checkpoint_every"]
        if checkpoint_requested or (every > 0 and gen.step % every == 0 and gen.step < gen.steps):
            checkpoint_requested = False
            emit({"checkpoint": str(write_checkpoint(gen, ckpt_dir)), "step": gen.step})
        if gen.step < gen.steps:
            progress()
    # Past the last step there is nothing to checkpoint, and while the interpreter
    # exits it puts a Python handler back to the default (terminate): a late
    # request must not turn a finished run into a death by signal.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    last_status = time.monotonic()

    def rendering(frame: int) -> None:  # liveness while no step completes
        nonlocal last_status
        if time.monotonic() - last_status >= STATUS_EVERY_S:
            last_status = time.monotonic()
            emit({"status": "rendering", "frame": frame, "frames": gen.frames})

    gen.render(args.out, rendering)
    progress()  # the final 1.0 goes out only once the artifact exists
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

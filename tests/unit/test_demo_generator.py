"""The bundled demo generator: honest progress, checkpoint/resume, chaos flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from framespool.agents.demo_generator import (
    EXIT_INJECTED_FAILURE,
    EXIT_TERMINATED,
    EXIT_USAGE,
    Generator,
    parse_args,
    settings,
)

ROOT = str(Path(__file__).resolve().parents[2])
ENV = {
    **os.environ,
    "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    "PYTHONUNBUFFERED": "1",
}


def gen_cmd(out: Path, *args: str, prompt: str = "a fox in the snow") -> list[str]:
    return [
        sys.executable,
        "-m",
        "framespool.agents.demo_generator",
        "--prompt",
        prompt,
        "--out",
        str(out),
        *args,
    ]


def run_gen(out: Path, *args: str, timeout: float = 15) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        gen_cmd(out, *args), env=ENV, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


class Live:
    """A generator process read line by line (for signal tests)."""

    def __init__(self, out: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            gen_cmd(out, *args), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def next_line(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"generator ended: {self.proc.wait()} {self.proc.stderr.read()}"
        return json.loads(line)

    def until(self, pred) -> dict:
        while True:
            msg = self.next_line()
            if pred(msg):
                return msg

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def live():
    started: list[Live] = []

    def _start(*args, **kw):
        g = Live(*args, **kw)
        started.append(g)
        return g

    yield _start
    for g in started:
        g.close()


def test_progress_lines_then_a_real_gif(tmp_path):
    out = tmp_path / "out.gif"
    rc, lines, _ = run_gen(
        out,
        "--steps",
        "5",
        "--time-scale",
        "1000",
        "--params-json",
        json.dumps({"resolution": "64x36", "duration_s": "1", "fps": "6"}),
    )
    assert rc == 0
    assert lines == [{"progress": i / 5, "step": i, "total_steps": 5} for i in range(6)]
    with Image.open(out) as im:
        assert im.format == "GIF" and im.size == (64, 36) and im.n_frames == 6


def test_zero_steps_renders_immediately(tmp_path):
    rc, lines, _ = run_gen(tmp_path / "o.gif", "--steps", "0")
    assert rc == 0 and lines == [{"progress": 1.0, "step": 0, "total_steps": 0}]
    assert (tmp_path / "o.gif").stat().st_size > 0


def test_time_scale_sets_the_pace(tmp_path):
    t0 = time.monotonic()
    rc, _, _ = run_gen(
        tmp_path / "o.gif", "--steps", "4", "--seconds-per-step", "1", "--time-scale", "10"
    )
    assert rc == 0 and 0.4 <= time.monotonic() - t0 < 5


def test_periodic_checkpoints(tmp_path):
    rc, lines, _ = run_gen(
        tmp_path / "o.gif",
        "--steps",
        "7",
        "--checkpoint-every",
        "3",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--time-scale",
        "1000",
    )
    assert rc == 0
    cps = [m for m in lines if "checkpoint" in m]
    assert [m["step"] for m in cps] == [3, 6]
    assert all(Path(m["checkpoint"]).is_file() for m in cps)
    assert json.loads(Path(cps[0]["checkpoint"]).read_text())["step"] == 3


def test_sigusr1_checkpoints_and_resume_gives_identical_bytes(tmp_path, live):
    common = ["--steps", "12", "--seed", "42", "--params-json", '{"resolution": "80x45"}']
    rc, _, _ = run_gen(tmp_path / "straight.gif", *common, "--time-scale", "1000")
    assert rc == 0

    g = live(
        tmp_path / "interrupted.gif",
        *common,
        "--seconds-per-step",
        "0.05",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
    )
    g.until(lambda m: m.get("step", 0) >= 4)
    g.proc.send_signal(signal.SIGUSR1)
    cp = g.until(lambda m: "checkpoint" in m)
    assert 4 <= cp["step"] < 12
    g.proc.send_signal(signal.SIGTERM)
    assert g.proc.wait(5) == EXIT_TERMINATED
    assert not (tmp_path / "interrupted.gif").exists()

    rc, lines, _ = run_gen(
        tmp_path / "resumed.gif", *common, "--time-scale", "1000", "--resume-from", cp["checkpoint"]
    )
    assert rc == 0
    assert lines[0]["step"] == cp["step"]  # continues, does not start over
    assert (tmp_path / "resumed.gif").read_bytes() == (tmp_path / "straight.gif").read_bytes()


def test_resume_from_every_step_is_deterministic():
    def fresh():
        return Generator(prompt="p", width=32, height=18, frames=4, steps=6, seed=3)

    straight = fresh()
    for _ in range(6):
        straight.advance()
    for k in range(7):
        a = fresh()
        for _ in range(k):
            a.advance()
        b = fresh()
        b.restore(json.loads(json.dumps(a.state())))
        while b.step < 6:
            b.advance()
        assert b.latent == straight.latent


def test_resume_with_other_params_is_refused(tmp_path):
    run_gen(
        tmp_path / "o.gif",
        "--steps",
        "4",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--time-scale",
        "1000",
    )
    rc, _, err = run_gen(
        tmp_path / "o2.gif",
        "--steps",
        "4",
        "--seed",
        "9",
        "--time-scale",
        "1000",
        "--resume-from",
        str(tmp_path / "ck" / "ckpt-000002.json"),
    )
    assert rc == EXIT_USAGE and "seed" in err


def test_fail_at_step(tmp_path):
    rc, lines, err = run_gen(
        tmp_path / "o.gif", "--steps", "10", "--fail-at-step", "3", "--time-scale", "1000"
    )
    assert rc == EXIT_INJECTED_FAILURE
    assert lines[-1]["step"] == 3 and "injected failure at step 3" in err
    assert not (tmp_path / "o.gif").exists()


def test_hang_at_step_goes_silent_but_dies_on_sigterm(tmp_path, live):
    g = live(tmp_path / "o.gif", "--steps", "10", "--hang-at-step", "2", "--time-scale", "1000")
    assert g.until(lambda m: m["step"] == 2)["step"] == 2
    time.sleep(0.3)
    assert g.proc.poll() is None  # alive, silent
    g.proc.send_signal(signal.SIGTERM)
    assert g.proc.wait(5) == EXIT_TERMINATED
    assert g.proc.stdout.read() == ""


def test_params_arrive_as_strings_and_flags_win():
    args = parse_args(
        [
            "--prompt",
            "p",
            "--out",
            "o.gif",
            "--params-json",
            '{"resolution": "320x180", "fps": "24", "duration_s": "0.5", "seed": "7", "steps": "3"}',
            "--steps",
            "9",
        ]
    )
    s = settings(args)
    assert (s["width"], s["height"], s["frames"], s["seed"], s["steps"]) == (320, 180, 12, 7, 9)


@pytest.mark.parametrize("params", ['{"resolution": "huge"}', '{"resolution": "5x5"}', "not json"])
def test_bad_params_exit_with_usage_error(tmp_path, params):
    rc, _, err = run_gen(tmp_path / "o.gif", "--params-json", params)
    assert rc == EXIT_USAGE and "demo_generator:" in err


@pytest.mark.parametrize("prompt", ["--fail-at-step=0", "-h", "--", "--out=/etc/passwd"])
def test_a_prompt_given_as_its_options_value_is_only_a_prompt(prompt):
    args = parse_args([f"--prompt={prompt}", "--out", "o.gif", '--params-json={"steps": "2"}'])
    assert args.prompt == prompt and args.out == Path("o.gif") and args.fail_at_step is None

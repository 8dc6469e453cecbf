"""Model profiles: loading, validation and command lines."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from framespool.agents.profiles import ModelProfile, ProfileError, demo_profile, load_profiles
from framespool.agents.runner import COMPLETED, STOPPED

VALUES = dict(
    prompt="a cat",
    out="/o/out.mp4",
    params_json='{"a": "1"}',
    checkpoint_dir="/ck",
    time_scale="1.0",
    gpus="0,1",
    job_id="j",
    run="2",
)

SORA_LIKE = {
    "name": "vidgen-2",
    "command": ["/opt/vidgen/bin/run", "--prompt={prompt}", "--out", "{out}", "--gpus", "{gpus}"],
    "resume_args": ["--resume", "{resume_from}"],
    "checkpoint": {"signal": "SIGUSR2", "path_key": "ckpt_path"},
    "progress": {"progress_key": "pct", "step_key": "it", "total_key": "of"},
    "output_name": "video.mp4",
    "content_type": "video/mp4",
    "hang_timeout_s": 300,
}


def test_argv_fills_placeholders_and_appends_resume_args_only_when_resuming():
    p = ModelProfile.from_dict(SORA_LIKE)
    fresh = p.argv(resume_from=None, **VALUES)
    assert fresh == [
        "/opt/vidgen/bin/run",
        "--prompt=a cat",
        "--out",
        "/o/out.mp4",
        "--gpus",
        "0,1",
    ]
    resumed = p.argv(resume_from="/ck/7", **VALUES)
    assert resumed[-2:] == ["--resume", "/ck/7"]


def test_prompt_is_one_argument_never_a_shell_string():
    p = demo_profile()
    argv = p.argv(resume_from=None, **{**VALUES, "prompt": "x; rm -rf / `id` $(id)"})
    assert "--prompt=x; rm -rf / `id` $(id)" in argv  # one argument, its whole value


def test_fields_load_from_dict():
    p = ModelProfile.from_dict(SORA_LIKE)
    assert p.checkpoint.signum == signal.SIGUSR2 and p.checkpoint.path_key == "ckpt_path"
    assert p.progress.progress_key == "pct" and p.output_name == "video.mp4"
    assert p.hang_timeout_s == 300.0 and p.can_resume and p.can_checkpoint


def test_demo_profile_runs_this_interpreter():
    p = demo_profile()
    argv = p.argv(resume_from="/ck/1", **VALUES)
    assert argv[:3] == [sys.executable, "-m", "framespool.agents.demo_generator"]
    assert argv[-2:] == ["--resume-from", "/ck/1"]
    assert p.output_name == "output.gif" and p.content_type == "image/gif"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"command": ["x"]}, "'name'"),
        ({"name": "n"}, "'command'"),
        ({"name": "n", "command": []}, "must not be empty"),
        ({"name": "n", "command": ["run", "{promt}"]}, "unknown placeholder {promt}"),
        ({"name": "n", "command": ["x"], "checkpoint": {"signal": "SIGNOPE"}}, "SIGNOPE"),
    ],
)
def test_bad_profiles_name_the_problem(bad, message):
    with pytest.raises(ProfileError, match=message.replace("{", r"\{").replace("}", r"\}")):
        ModelProfile.from_dict(bad)


def test_load_from_json_and_toml(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"profiles": [SORA_LIKE]}))
    (tmp_path / "p.toml").write_text(
        '[[profiles]]\nname = "t2v"\ncommand = ["gen", "--", "{prompt}"]\nhang_timeout_s = 5\n'
        '[profiles.checkpoint]\nsignal = "SIGUSR1"\n'
    )
    from_json = load_profiles(tmp_path / "p.json")
    from_toml = load_profiles(tmp_path / "p.toml")
    assert set(from_json) == {"demo", "noop", "hold", "vidgen-2"}
    assert from_toml["t2v"].hang_timeout_s == 5.0 and from_toml["t2v"].can_checkpoint
    assert not from_toml["t2v"].can_resume


# -- hostile tenants: user data (prompt, params) is data, never options or code --
@pytest.mark.parametrize(
    "command",
    [
        ["/bin/sh", "-c", "gen --prompt \"{prompt}\""],
        ["bash", "-c", "gen --params '{params_json}'"],
        ["/usr/bin/env", "sh", "-c", "exec gen \"$0\"", "--", "{prompt}"],
        ["/bin/dash", "-c", "exec gen --prompt=\"$1\"", "gen", "--prompt={prompt}"],
        ["{python}", "-c", "print('{prompt}')"],
        ["nice", "-n", "5", "sh", "-c", "gen {prompt}"],
        ["/usr/bin/env", "-S", "bash -c", "gen --p={prompt}"],
        ["timeout", "60", "{python}", "-c", "print('{params_json}')"],
    ],
)
def test_shell_and_inline_code_templates_with_user_data_are_refused(command):
    with pytest.raises(
        ProfileError, match=r"profile 'evil'.*(shell|code).*\{(prompt|params_json)\}"
    ):
        ModelProfile.from_dict({"name": "evil", "command": command})


def test_shell_templates_without_user_data_still_load():
    p = ModelProfile.from_dict(
        {"name": "wrapper", "command": ["/bin/sh", "-c", "exec gen --out \"$0\"", "{out}"]}
    )
    assert p.command[0] == "/bin/sh"


@pytest.mark.parametrize(
    "command",
    [
        ["gen", "{prompt}"],
        ["gen", "--prompt", "{prompt}"],
        ["gen", "--params-json", "{params_json}"],
        ["gen", "{prompt}.txt", "--", "x"],
        ["gen", "-p{prompt}"],
        ["gen", "--prompt{params_json}"],
    ],
)
def test_user_data_that_could_be_read_as_an_option_is_refused(command):
    with pytest.raises(ProfileError, match=r"(could be read as an option|without '=').*--name=\{"):
        ModelProfile.from_dict({"name": "opt", "command": command})


@pytest.mark.parametrize(
    "command",
    [
        ["gen", "--prompt={prompt}", "--params-json={params_json}"],
        ["gen", "--out", "{out}", "--", "{prompt}"],
        ["gen", "-p={prompt}", "prompt:{prompt}"],
    ],
)
def test_user_data_as_an_option_value_or_after_a_separator_loads(command):
    assert ModelProfile.from_dict({"name": "ok", "command": command}).command == tuple(command)


@pytest.mark.parametrize("prompt", ["--fail-at-step=0", "-h", "--", "--out=/etc/passwd"])
def test_demo_profile_passes_a_dash_prompt_as_one_value(prompt):
    argv = demo_profile().argv(resume_from=None, **{**VALUES, "prompt": prompt})
    assert f"--prompt={prompt}" in argv and prompt not in argv
    assert '--params-json={"a": "1"}' in argv


def test_noop_profile_runs_in_process_without_a_shell():
    noop = load_profiles()["noop"]
    assert noop.builtin == "noop" and noop.command == ()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"name": "n", "builtin": "magic"}, "unknown builtin 'magic'"),
        ({"name": "n", "builtin": "noop", "command": ["x"]}, "either 'builtin' or 'command'"),
        ({"name": "n", "command": ["x"], "max_output_bytes": 0}, "max_output_bytes must be"),
        ({"name": "n", "command": ["x"], "max_checkpoints": -1}, "max_checkpoints must be"),
        ({"name": "n", "command": ["x"], "result_rank": -1}, "result_rank must be >= 0"),
    ],
)
def test_bad_bounds_and_builtins_name_the_field(bad, message):
    with pytest.raises(ProfileError, match=message):
        ModelProfile.from_dict(bad)


def test_bounds_load_from_dict():
    p = ModelProfile.from_dict(
        {
            **SORA_LIKE,
            "inherit_env": ["HF_HOME"],
            "max_output_bytes": 10,
            "max_checkpoint_bytes": 20,
            "max_checkpoints": 3,
            "result_rank": 1,
        }
    )
    assert (p.inherit_env, p.max_output_bytes, p.max_checkpoint_bytes) == (("HF_HOME",), 10, 20)
    assert (p.max_checkpoints, p.result_rank) == (3, 1)


def test_startup_timeout_is_read_and_must_be_positive():
    base = {"name": "t2v", "command": ["gen", "{out}"], "hang_timeout_s": 60}
    assert ModelProfile.from_dict(base).startup_timeout_s is None
    assert ModelProfile.from_dict({**base, "startup_timeout_s": 900}).startup_timeout_s == 900.0
    for bad in (0, -5):
        with pytest.raises(ProfileError, match="startup_timeout_s"):
            ModelProfile.from_dict({**base, "startup_timeout_s": bad})


def test_hold_holds_its_gpus_for_the_scaled_duration_in_steps_then_completes():
    import asyncio

    from framespool.agents.builtin import HOLD_MAX_S, BuiltinRunner, hold_duration_s

    hold = load_profiles()["hold"]
    assert hold.builtin == "hold" and hold.command == ()
    seen = []

    async def run(params, time_scale):
        runner = BuiltinRunner(hold, on_progress=seen.append, params=params, time_scale=time_scale)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await runner.start()
        outcome = await runner.wait()
        return outcome, loop.time() - t0

    outcome, _ = asyncio.run(run({"duration_s": "3"}, 100.0))
    assert outcome.kind == COMPLETED and outcome.output_data == b""
    assert [(p.step, p.total_steps) for p in seen] == [(1, 3), (2, 3), (3, 3)]
    assert seen[-1].progress == 1.0
    # it holds: not done before its scaled duration (a lower bound, not a timing)
    _, took = asyncio.run(run({"duration_s": "2"}, 20.0))
    assert took >= 0.1
    assert hold_duration_s({}) == 1.0
    assert hold_duration_s({"duration_s": "soon"}) == 1.0
    assert hold_duration_s({"duration_s": "nan"}) == 1.0
    assert hold_duration_s({"duration_s": "-5"}) == 0.0
    assert hold_duration_s({"duration_s": "1e9"}) == HOLD_MAX_S


def test_a_stopped_hold_ends_at_once():
    import asyncio

    from framespool.agents.builtin import BuiltinRunner

    async def go():
        runner = BuiltinRunner(load_profiles()["hold"], params={"duration_s": "3600"})
        await runner.start()
        await asyncio.sleep(0.01)
        return await asyncio.wait_for(runner.stop(), 5)

    assert asyncio.run(go()).kind == STOPPED

"""Model profiles: loading, validation and command lines."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from framespool.agents.profiles import ModelProfile, ProfileError, demo_profile, load_profiles

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
    assert "x; rm -rf / `id` $(id)" in argv


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
        '[[profiles]]\nname = "t2v"\ncommand = ["gen", "{prompt}"]\nhang_timeout_s = 5\n'
        '[profiles.checkpoint]\nsignal = "SIGUSR1"\n'
    )
    from_json = load_profiles(tmp_path / "p.json")
    from_toml = load_profiles(tmp_path / "p.toml")
    assert set(from_json) == {"demo", "noop", "vidgen-2"}
    assert from_toml["t2v"].hang_timeout_s == 5.0 and from_toml["t2v"].can_checkpoint
    assert not from_toml["t2v"].can_resume

"""A generator framespool has never seen: the worked example of docs/operator.md.

It turns a prompt into a text flip-book, one page per step, and speaks the
protocol an agent expects of any generator (docs/operator.md, "The generator's
side"):

- arguments from the profile's command template: ``--prompt=TEXT``, ``--out
  PATH``, ``--params-json=JSON``, ``--checkpoint-dir DIR`` and, when resuming,
  ``--resume-from PATH``;
- one JSON object per line on stdout: ``{"progress": p, "step": s,
  "total_steps": n}`` as it works, ``{"checkpoint": path, "step": s}`` after
  writing a checkpoint (on SIGUSR1, the profile's checkpoint signal);
- the result written to ``--out``; exit status 0 when done, anything else is a
  failure (stderr's tail becomes the job's reason).

Parameters (the job's ``params``): ``pages`` (default 8) and
``seconds_per_page`` (default 0.25). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path


def page(prompt: str, n: int, pages: int) -> str:
    """Page ``n``: the prompt sliding across a frame, as a flip-book would draw it."""
    width = max(len(prompt) + pages + 4, 24)
    pad = " " * n
    return "\n".join(
        [
            "+" + "-" * width + "+",
            "|" + (pad + prompt).ljust(width)[:width] + "|",
            "|" + (pad + "*" * (pages - n)).ljust(width)[:width] + "|",
            "+" + "-" * width + f"+ page {n + 1}/{pages}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--params-json", default="{}")
    p.add_argument("--checkpoint-dir", default=".")
    p.add_argument("--resume-from")
    args = p.parse_args(argv)
    params = json.loads(args.params_json)
    pages = int(params.get("pages", 8))
    delay = float(params.get("seconds_per_page", 0.25))
    done: list[str] = []
    if args.resume_from:  # a checkpoint is the pages drawn so far
        done = json.loads(Path(args.resume_from).read_text())["pages"]
    wanted = []
    signal.signal(signal.SIGUSR1, lambda *_: wanted.append(1))

    def say(**doc: object) -> None:
        print(json.dumps(doc), flush=True)

    say(progress=len(done) / pages, step=len(done), total_steps=pages)
    while len(done) < pages:
        time.sleep(delay)
        done.append(page(args.prompt, len(done), pages))
        say(progress=len(done) / pages, step=len(done), total_steps=pages)
        if wanted:
            wanted.clear()
            path = Path(args.checkpoint_dir) / f"flipbook-{len(done)}.json"
            path.write_text(json.dumps({"pages": done}))
            say(checkpoint=str(path), step=len(done))
    Path(args.out).write_text(f"{args.prompt}\n\n" + "\n\n".join(done) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

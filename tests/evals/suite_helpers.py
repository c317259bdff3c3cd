"""Shared helpers of the suite tests: responses files and the CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path

from rise_nemo.cli import main


def write_responses(path: Path, rows) -> Path:
    """rows: (index, response) pairs -> a responses JSONL."""
    path.write_text("".join(json.dumps({"index": i, "response": r}) + "\n" for i, r in rows))
    return path


def reference_rows(suite, items, shift: int = 0):
    """(index, the reference response of item index+shift): shift 0 = right answers, else shuffled."""
    n = len(items)
    return [(it.index, suite.reference_response(items[(k + shift) % n])) for k, it in enumerate(items)]


def run_cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def score_fields(out: str) -> dict[str, str]:
    """The key=value fields of the output's last line, which must be the SCORE line."""
    last = out.strip().splitlines()[-1]
    assert last.startswith("SCORE suite="), last
    return dict(part.split("=", 1) for part in last.split()[1:])


class ScriptedJudge:
    """A judge whose reply to each prompt is ``reply(prompt_text)`` (None = unknown), parsed by the call."""

    def __init__(self, reply):
        self.reply = reply
        self.prompts = []

    def run(self, calls):
        from rise_nemo.evals.judge import prompt_text

        out = []
        for c in calls:
            self.prompts.append(c.messages)
            text = self.reply(prompt_text(c.messages))
            out.append(None if text is None else c.parse(text))
        return out

    def describe(self, prompt_version):
        return {"type": "scripted", "model": "scripted", "prompt_version": prompt_version}

    def close(self):
        pass


def require_bwrap() -> None:
    """Skip where bubblewrap is absent or cannot start a sandbox, except in CI (which installs it)."""
    import os

    import pytest

    from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxUnavailable

    try:
        BubblewrapSandbox().check()
    except SandboxUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))


def run_cli_with_rule_server(argv, capsys, **server_kwargs) -> tuple[int, str, str]:
    """``run_cli(argv + --judge-url <a fresh loopback rule server> --judge-model rule-grader)``."""
    from rise_nemo.evals.judge import rule_reply
    from rise_nemo.judges.rule_server import RuleGraderServer

    server = RuleGraderServer(extra_replies=rule_reply, **server_kwargs).start()
    try:
        return run_cli([*argv, "--judge-url", server.url, "--judge-model", "rule-grader"], capsys)
    finally:
        server.stop()

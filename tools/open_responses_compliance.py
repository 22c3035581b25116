"""Run the Open Responses compliance suite (openresponses/openresponses, ``bin/compliance-test.ts``)
against ``moot serve`` from outside, and print its pass count.

    python tools/open_responses_compliance.py [--suite DIR] [--model moot/vote] [-- SUITE ARGS...]

``--suite`` is a checkout of openresponses/openresponses (default ``$OPENRESPONSES_DIR``, else one is
cloned into ``tmp/open-responses/openresponses``: that needs git and the network). Where GitHub is
out of reach but a mirror of a fork is at hand (a fork's history is upstream's, commit for commit),
a checkout is ``git -C MIRROR archive COMMIT | tar -x -C DIR``; the run of docs/serve.md used
upstream's main at ``92c12d96d7b6`` (2026-07-15), whose ``src/generated`` kubb 4.15.0 and prettier
3.7.4 regenerate byte for byte from its ``public/openapi/openapi.json``. The suite's
``bin/``, ``src/lib/`` and ``src/generated/`` are copied into ``tmp/open-responses/suite`` (ignored by
git) beside a ``node_modules`` holding what the compliance script loads: ``zod`` (the suite's own
version) and ``tsx`` to run it under node, installed with npm on the first run. No other network.

The server is a real ``moot serve`` process, keyed, on a loopback port, its models an in-process fake
OpenAI-compatible server (:class:`moot.testing.fake_openai.FakeOpenAIServer`) whose agents answer
every JSON schema, call a tool when offered one, and answer once its result is in. The suite runs as
its README says (``--base-url``, ``--api-key``, ``--model``); anything after ``--`` is passed to it
(``--filter basic-response``, ``--verbose``). The last line is the count, as
``Open Responses compliance: N passed, M failed, T total``; the exit code is the suite's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "tmp" / "open-responses"
SUITE_REPO = "https://github.com/openresponses/openresponses"
#: What the compliance script loads at run time: the suite's own zod (its package.json), and tsx.
NODE_PACKAGES = ("zod@^3.25.76", "tsx@^4")
#: The suite's last line; since mid-2026 it also counts the tests it skipped.
RESULTS = re.compile(r"Results: (\d+) passed, (\d+) failed(?:, \d+ skipped)?, (\d+) total")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def agent(request: dict[str, Any]) -> str:
    """Each fake agent: JSON that follows the schema it is given, which calls the first tool offered
    until a tool's result is in the conversation, then answers."""
    from moot.testing.fake_openai import example_of, schema_reply

    fmt = request.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    defs = schema.get("$defs", {})
    if "AnswerAction" in defs and "the result of the tool call" in json.dumps(request.get("messages")):
        return json.dumps(example_of(defs["AnswerAction"], defs))
    return schema_reply(request)


def suite_dir(given: str | None) -> Path:
    """The suite's files, beside the node packages (copied from a checkout, cloned if none is given)."""
    source = Path(given or os.environ.get("OPENRESPONSES_DIR") or WORK / "openresponses")
    if not (source / "bin" / "compliance-test.ts").exists():
        if given or os.environ.get("OPENRESPONSES_DIR"):
            sys.exit(f"no bin/compliance-test.ts in {source}: give a checkout of {SUITE_REPO}")
        subprocess.run(["git", "clone", "--depth", "1", SUITE_REPO, str(source)], check=True)
    target = WORK / "suite"
    if source.resolve() != target.resolve():
        shutil.rmtree(target, ignore_errors=True)
        for part in ("bin", "src/lib", "src/generated"):
            shutil.copytree(source / part, target / part)
    return target


def node_packages() -> None:
    if not (WORK / "node_modules" / "zod").exists() or not (WORK / "node_modules" / ".bin" / "tsx").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        if not (WORK / "package.json").exists():
            (WORK / "package.json").write_text('{"name": "moot-open-responses-compliance", "private": true}\n')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", *NODE_PACKAGES], cwd=WORK, check=True)


def node_env() -> dict[str, str]:
    """The suite's environment: its WebSocket tests use the global ``WebSocket``, which node before 22
    has only with ``--experimental-websocket`` (the suite is written for bun)."""
    env = dict(os.environ)
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    major = re.match(r"v(\d+)", version)
    if major is not None and int(major.group(1)) < 22:
        env["NODE_OPTIONS"] = (env.get("NODE_OPTIONS", "") + " --experimental-websocket").strip()
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", help="a checkout of openresponses/openresponses")
    parser.add_argument("--model", default="moot/vote", help="the model the suite asks for")
    parser.add_argument("--src", default=str(ROOT / "src"), help="the moot source to serve (to compare revisions)")
    parser.add_argument("rest", nargs="*", help="passed to the suite (after --)")
    args = parser.parse_args()
    suite = suite_dir(args.suite)
    node_packages()

    from moot.testing.fake_openai import FakeOpenAIServer

    key = "sk-moot-compliance-" + secrets.token_hex(8)
    port = free_port()
    with FakeOpenAIServer(reply=agent) as fake, tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "OPENAI_API_KEY": "sk-fake-upstream", "MOOT_COMPLIANCE_KEY": key}
        env["PYTHONPATH"] = args.src + os.pathsep + env.get("PYTHONPATH", "")
        serve = [sys.executable, "-m", "moot", "serve", "--port", str(port), "--db", f"{scratch}/moot.sqlite"]
        serve += ["--models", "openai:fake", "--base-url", fake.base_url, "--api-key-env", "MOOT_COMPLIANCE_KEY"]
        log = Path(scratch) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen(serve, env=env, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(base + "/protocols", headers={"Authorization": f"Bearer {key}"}).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit("moot serve did not come up:\n" + log.read_text(errors="replace"))
                time.sleep(0.2)
            tsx = str(WORK / "node_modules" / ".bin" / "tsx")
            run = [tsx, "bin/compliance-test.ts", "--base-url", base, "--api-key", key, "--model", args.model]
            done = subprocess.run([*run, *args.rest], cwd=suite, capture_output=True, text=True, env=node_env())
        finally:
            server.terminate()
            server.wait(30)
    output = done.stdout + done.stderr
    print(output, end="")
    counts = RESULTS.search(ANSI.sub("", output))
    if counts is None:
        print("Open Responses compliance: the suite printed no result line")
        return done.returncode or 1
    passed, failed, total = counts.groups()
    print(f"Open Responses compliance: {passed} passed, {failed} failed, {total} total")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

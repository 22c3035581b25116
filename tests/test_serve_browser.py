"""The viewer in a real browser: headless Chromium (Debian's ``chromium`` package) driven by
Playwright's Python package, against ``moot serve`` on a loopback port with the fake OpenAI model.

Start a debate from the page, watch its turns stream in, open the permalink of the finished
debate (rebuilt from the store), download its JSON, and save screenshots as test artifacts (under
pytest's tmp dir, and under ``$MOOT_ARTIFACTS_DIR`` when it is set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from moot.core.types import DebateResult
from moot.server import ServerSettings
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from serving import FAKE_KEY, ServerThread

pytestmark = pytest.mark.browser

QUESTION = "A shop sells pens at 24 cents each. How many cents do 17 pens cost?"


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("MOOT_REQUIRE_BROWSER"):
            pytest.fail("MOOT_REQUIRE_BROWSER is set but Debian's chromium is not installed (apt-get install chromium)")
        pytest.skip("Debian's chromium is not installed here (apt-get install chromium; .ci/run installs it)")
    return path


def society_reply(request: dict[str, Any]) -> str:
    """Three agents on the question; agent 3 starts wrong and corrects itself in round 2."""
    system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
    agent = int(m.group(1)) if (m := re.search(r"Agent (\d)", system)) else 1
    later = "(round 1)" in user
    if agent == 3 and not later:
        reasoning, answer, confidence = "17 x 24: 17 x 20 = 340 and 17 x 4 = 78, so 418.", "418", 0.6
    elif agent == 3:
        reasoning = "The others get 408. Checking again: 17 x 4 is 68, not 78, so 340 + 68 = 408."
        answer, confidence = "408", 0.9
    else:
        reasoning = "17 x 24 = 17 x 25 - 17 = 425 - 17 = 408." if agent == 1 else "24 x 17 = 240 + 168 = 408."
        answer, confidence = "408", 0.85 if later else 0.8
    return json.dumps({"reasoning": reasoning, "answer": answer, "confidence": confidence})


@pytest.fixture
def viewer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with FakeOpenAIServer(latency=0.2, reply=society_reply) as fake:
        fake.faults.extend([Fault.trickle(0.04)] * 6)  # every turn streams word by word, visibly
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite",
            models=["openai:fake"],
            base_url=fake.base_url,
            finished_logs_in_memory=0,  # the permalink is rebuilt from the store
        )
        with ServerThread(settings) as server:
            yield server


def save(shot: Path) -> None:
    target = os.environ.get("MOOT_ARTIFACTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)


def test_the_viewer_starts_a_debate_streams_it_and_keeps_a_permalink(viewer: ServerThread, tmp_path: Path) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is a dev dependency")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(viewer.url + "/")
            page.wait_for_selector("#protocol option[value=society-of-minds]", state="attached")
            page.fill("#question", QUESTION)
            page.select_option("#protocol", "society-of-minds")
            page.click("#start")
            page.wait_for_url(re.compile(r"/debates/[0-9a-f]{32}$"))
            debate_id = page.url.rsplit("/", 1)[1]

            # turns arrive while the debate runs: a cell streaming, with text, before it is done
            page.wait_for_selector("td.turn.streaming .text:not(:empty)", timeout=30_000)
            assert page.locator("#status").inner_text() == "running"
            page.screenshot(path=str(tmp_path / "viewer-live.png"), full_page=True)
            save(tmp_path / "viewer-live.png")

            page.wait_for_selector("body[data-done=complete]", timeout=60_000)
            heads = page.locator("#grid-head th .who").all_inner_texts()
            assert heads == ["Agent 1", "Agent 2", "Agent 3"]
            assert page.locator("td.turn[data-done=true]").count() == 6
            assert page.locator("#final-answer").inner_text() == "408"
            feet = page.locator("tr.round-foot").all_inner_texts()
            assert "agreement 67%" in feet[0] and "agreement 100%" in feet[1] and "1 changed answer" in feet[1]
            cell = page.locator('tr[data-round="1"] td[data-speaker=agent3]')
            assert "418" in cell.inner_text() and "reasoning" in cell.inner_text()  # a typed turn, as its fields
            assert page.locator("#calls").inner_text() == "6"
            page.screenshot(path=str(tmp_path / "viewer-done.png"), full_page=True)
            save(tmp_path / "viewer-done.png")

            # the list shows it, and its permalink replays the stored transcript
            page.goto(viewer.url + "/")
            row = page.locator(f'tr[data-id="{debate_id}"]')
            row.wait_for()
            assert "complete" in row.inner_text() and QUESTION in row.inner_text()
            row.locator("a").click()
            page.wait_for_url(f"**/debates/{debate_id}")
            page.wait_for_selector("body[data-done=complete]", timeout=30_000)
            assert page.locator("td.turn[data-done=true]").count() == 6
            assert page.locator("#final-answer").inner_text() == "408"
            page.screenshot(path=str(tmp_path / "viewer-permalink.png"), full_page=True)
            save(tmp_path / "viewer-permalink.png")

            with page.expect_download() as download:
                page.click("#download")
            saved = tmp_path / "download.json"
            download.value.save_as(saved)
            result = DebateResult.model_validate_json(saved.read_text())
            api = httpx.get(f"{viewer.url}/v1/debates/{debate_id}").json()
            assert result.final_answer == "408" == api["result"]["final_answer"] and result.llm_calls == 6
        finally:
            browser.close()
    assert errors == []
    assert (tmp_path / "viewer-live.png").stat().st_size > 10_000


def test_a_keyed_server_asks_the_viewer_for_its_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is a dev dependency")
    key = "viewer-test-key-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with FakeOpenAIServer(latency=0.05) as fake:
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, api_key=key
        )
        with ServerThread(settings) as server, sync_api.sync_playwright() as pw:
            debate_id = httpx.post(
                server.url + "/v1/debates", json={"question": "Keyed?"}, headers={"Authorization": f"Bearer {key}"}
            ).json()["id"]
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(f"{server.url}/debates/{debate_id}")
                page.wait_for_selector("#auth:not([hidden])")
                page.fill("#auth-key", "wrong-key-0000000000000")
                page.click("#auth-form button")
                page.wait_for_selector("#auth-error:not([hidden])")
                page.fill("#auth-key", key)
                page.click("#auth-form button")
                # the reloaded page follows the debate over EventSource with the session cookie
                page.wait_for_selector("body[data-done=complete]", timeout=60_000)
                assert page.locator("#auth").is_hidden()
                assert page.locator("td.turn[data-done=true]").count() == 4
                cookies = page.context.cookies()
                assert [c["name"] for c in cookies] == ["moot_session"] and key not in cookies[0]["value"]
            finally:
                browser.close()


def test_the_openapi_page_renders_with_no_request_off_this_machine(viewer: ServerThread) -> None:
    executable = chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is a dev dependency")
    outside: list[str] = []

    def only_loopback(route: Any) -> None:
        if route.request.url.startswith(viewer.url):
            route.continue_()
        else:  # a CDN: the page would be blank on a machine without the internet
            outside.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", only_loopback)
            page.goto(viewer.url + "/docs")
            page.wait_for_selector(".swagger-ui .title", timeout=30_000)
            assert "moot" in page.locator(".swagger-ui .title").inner_text()
            page.wait_for_selector('[data-path="/v1/debates"]', state="attached", timeout=30_000)
        finally:
            browser.close()
    assert outside == []

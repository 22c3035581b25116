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
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from moot.core.types import DebateResult
from moot.models.pricing import Price, PriceTable
from moot.server import ServerSettings
from moot.server.state import INTERRUPTED
from moot.server.state.manager import CANCELLED
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from serving import FAKE_KEY, ServerThread, free_port, serve_process, wait_for, wait_until_up

pytestmark = pytest.mark.browser

QUESTION = "A shop sells pens at 24 cents each. How many cents do 17 pens cost?"


#: Set to 1 to skip the browser tests on a machine without Chromium (CI never sets it).
SKIP_BROWSER = "MOOT_SKIP_BROWSER_TESTS"


def missing(what: str, install: str) -> NoReturn:
    """A browser test without its browser fails in one line saying how to install it: a skip would
    pass unnoticed. ``MOOT_SKIP_BROWSER_TESTS=1`` skips instead, saying so (pytest -rs prints it)."""
    if os.environ.get(SKIP_BROWSER) == "1":
        pytest.skip(f"{what} is not installed, and {SKIP_BROWSER}=1 skips the browser tests")
    pytest.fail(
        f"{what} is not installed; the browser tests need it: {install} (or set {SKIP_BROWSER}=1 to skip them)",
        pytrace=False,
    )


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        missing("Chromium", "install it (Debian: apt-get install chromium)")
    return path


def playwright_sync() -> Any:
    """Playwright's sync API (a dev dependency)."""
    try:
        import playwright.sync_api as sync_api
    except ImportError:
        missing("the playwright package", "make dev installs it")
    return sync_api


def test_without_chromium_a_browser_test_fails_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(SKIP_BROWSER, raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        chromium()
    assert "apt-get install chromium" in str(failed.value) and "\n" not in str(failed.value)
    monkeypatch.setenv(SKIP_BROWSER, "1")  # the developer's explicit opt-out: a skip that says why
    with pytest.raises(pytest.skip.Exception, match=f"{SKIP_BROWSER}=1 skips the browser tests"):
        chromium()


def society_reply(request: dict[str, Any]) -> str:
    """Three agents on the question; agent 3 starts wrong and corrects itself in round 2."""
    system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
    agent = int(m.group(1)) if (m := re.search(r"Agent (\d)", system)) else 1
    # A later round: the agent's own conversation goes on (its earlier reply is in the messages).
    later = len(request["messages"]) > 2 or "(round 1)" in user
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
    sync_api = playwright_sync()
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


# ------------------------------------------------------------------------- the viewer as a user sees it

ARGUMENT = (
    "Congestion pricing in Stockholm cut inner-city traffic by about twenty percent within a year, and the "
    "effect persisted after the trial ended; delivery vans and emergency access remain the hard cases."
)
PRICES = PriceTable(prices={"openai:fake": Price(input=0.15, output=0.6)})


def long_fields(request: dict[str, Any]) -> str:
    """A reply that fills every string of the request's schema with a long sentence (the fields a
    reader must be able to read), or two sentences of free text."""

    def fill(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
        if "$ref" in schema:
            return fill(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
        if "enum" in schema:
            return schema["enum"][0]
        if "anyOf" in schema:
            return fill(schema["anyOf"][0], defs)
        kind = schema.get("type")
        if kind == "object":
            return {k: fill(v, defs) for k, v in schema.get("properties", {}).items()}
        if kind == "array":
            return [fill(schema.get("items", {}), defs)]
        return {"number": 0.7, "integer": 3, "boolean": True}.get(str(kind), ARGUMENT)

    form = request.get("response_format")
    if form:
        schema = form["json_schema"]["schema"]
        return json.dumps(fill(schema, schema.get("$defs", {})))
    return f"{ARGUMENT} {ARGUMENT}"


def number(page: Any, selector: str) -> float:
    return float(page.locator(selector).inner_text().replace(",", "").removesuffix(" s"))


def test_six_participants_stream_readably_with_live_totals_budget_and_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moderated-extended (six participants, typed turns) started from the form with a timeout and a
    call budget: while turns stream the header counts calls, tokens and time; every typed field's
    value wraps at the width of its column (1280 and 1920 px), nothing clipped; a turn cut at its
    token limit is flagged, with a warning; the cost is shown at the end."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    errors: list[str] = []
    with FakeOpenAIServer(latency=0.2, reply=long_fields) as fake:
        # Every turn streams word by word, visibly; the fifth call (round 1's refiner, after the four
        # debaters) stops at its token limit.
        fake.faults.extend([Fault.trickle(0.03)] * 4 + [Fault.length()] + [Fault.trickle(0.03)] * 40)
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, prices=PRICES
        )
        with ServerThread(settings) as server, debate_page(errors) as page:
            page.goto(server.url + "/")
            page.wait_for_selector("#protocol option[value=moderated-extended]", state="attached")
            page.fill("#question", "Should cities ban cars downtown?")
            page.select_option("#protocol", "moderated-extended")
            page.fill("#timeout", "300")
            page.fill("#max-calls", "18")
            with page.expect_request("**/v1/debates") as sent:
                page.click("#start")
            assert sent.value.post_data_json["budget"] == {"timeout_s": 300, "max_calls": 18}
            page.wait_for_url(re.compile(r"/debates/[0-9a-f]{32}$"))

            # Live, before any turn is done: calls in flight, tokens and time counting.
            page.wait_for_selector("td.turn.streaming .text:not(:empty)", timeout=60_000)
            page.wait_for_function(
                "document.querySelector('#calls-running').textContent.includes('running')"
                " && parseInt(document.querySelector('#tokens').textContent.replace(/,/g, '')) > 0"
                " && parseFloat(document.querySelector('#elapsed').textContent) > 0",
                timeout=30_000,
            )
            assert page.locator("td.turn[data-done=true]").count() == 0  # the totals came from the stream
            page.screenshot(path=str(tmp_path / "viewer-six-live.png"), full_page=True)
            save(tmp_path / "viewer-six-live.png")

            page.wait_for_selector("body[data-done=complete]", timeout=120_000)
            debate_id = page.url.rsplit("/", 1)[1]
            result = DebateResult.model_validate(httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"])
            assert number(page, "#calls") == result.llm_calls and page.locator("#calls-running").inner_text() == ""
            assert number(page, "#tokens") == result.usage.total_tokens
            assert result.cost is not None and result.cost.usd
            assert page.locator("#cost").inner_text().startswith(f"${result.cost.usd:.6f} · ")
            cut = [t for t in result.turns() if t.finish_reason == "length"]
            assert len(cut) == 1
            flag = cell(page, cut[0].speaker, cut[0].round).locator(".flag.warn")
            assert flag.inner_text() == "cut at its token limit"
            assert "finish_reason: length" in page.locator("#problem-list").inner_text()

            for width in (1280, 1920):
                page.set_viewport_size({"width": width, "height": 900})
                page.goto(f"{server.url}/debates/{debate_id}")  # the permalink, from the store
                page.wait_for_selector("body[data-done=complete]", timeout=60_000)
                heads = page.locator("#grid-head th .who").all_inner_texts()
                assert len(heads) == 6
                values = page.locator("td.turn dl.fields dd")
                assert values.count() >= 18
                # Each value has its column's width (not ~40 px beside its name) and wraps: its text
                # overflows neither its box nor its cell.
                widths = page.evaluate(
                    """() => [...document.querySelectorAll('td.turn dl.fields dd')].map((dd) => {
                        const td = dd.closest('td').getBoundingClientRect(), box = dd.getBoundingClientRect();
                        return [box.width, td.width, dd.scrollWidth - dd.clientWidth, box.right - td.right];
                    })"""
                )
                for value, column, overflow, past in widths:
                    assert value >= 0.8 * (column - 24) and value >= 140 and overflow <= 0 and past <= 0
                grid = page.locator(".grid-wrap").evaluate("(e) => e.scrollWidth - e.clientWidth")
                assert grid <= 0  # six columns fit without scrolling sideways at this width
                page.screenshot(path=str(tmp_path / f"viewer-six-{width}.png"), full_page=True)
                save(tmp_path / f"viewer-six-{width}.png")
    assert errors == []


def synthesis_reply(request: dict[str, Any]) -> str:
    system = request["messages"][0]["content"]
    if system.startswith("You are the Synthesizer"):
        return "Yes, with exemptions for deliveries: both sides agree the traffic gain is real."
    return ("Yes: " if "Affirmative" in system.split(".")[0] else "Not yet: ") + ARGUMENT


def test_a_synthesis_is_shown_once_as_the_final_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The synthesis turn's text is the final answer: printed there once; its block keeps the
    synthesizer's name and numbers."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    errors: list[str] = []
    with (
        FakeOpenAIServer(reply=synthesis_reply) as fake,
        ServerThread(
            ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url)
        ) as server,
        debate_page(errors) as page,
    ):
        debate_id = httpx.post(server.url + "/v1/debates", json={"question": QUESTION, "rounds": 1}).json()["id"]
        page.goto(f"{server.url}/debates/{debate_id}")
        page.wait_for_selector("body[data-done=complete]", timeout=60_000)
        final = page.locator("#final-answer").inner_text()
        assert final == synthesis_reply({"messages": [{"content": "You are the Synthesizer."}]})
        block = page.locator("#decision-turns .turn-block")
        assert block.count() == 1 and block.get_attribute("data-final") == "true"
        assert block.locator(".text").is_hidden() and "final answer below" in block.inner_text()
        assert "tokens out" in block.locator(".foot").inner_text()
        assert page.locator("main").inner_text().count(final.strip()) == 1
        page.screenshot(path=str(tmp_path / "viewer-synthesis.png"), full_page=True)
        save(tmp_path / "viewer-synthesis.png")
    assert errors == []


def test_a_keyed_server_asks_the_viewer_for_its_key_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable = chromium()
    sync_api = playwright_sync()
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
                page = browser.new_page(accept_downloads=True)
                errors: list[str] = []
                # (the browser's own line for each 401 before the key is given is expected)
                page.on(
                    "console", lambda m: errors.append(m.text) if m.type == "error" and "401" not in m.text else None
                )
                page.goto(f"{server.url}/debates/{debate_id}")
                page.wait_for_selector("#auth:not([hidden])")
                page.fill("#auth-key", "wrong-key-0000000000000")
                page.click("#auth-form button")
                page.wait_for_selector("#auth-error:not([hidden])")
                page.fill("#auth-key", key)
                page.click("#auth-form button")
                # the reloaded page follows the debate's event stream with the session's token as its bearer
                page.wait_for_selector("body[data-done=complete]", timeout=60_000)
                assert page.locator("#auth").is_hidden()
                assert page.locator("td.turn[data-done=true]").count() == 4
                # No cookie: one would reach every service on localhost, whatever its port (an outside
                # attack, session 38). The token is this origin's (sessionStorage), never the key.
                assert page.context.cookies() == []
                token = page.evaluate("sessionStorage.getItem('moot.session')")
                assert token and key not in token
                with page.expect_download() as download:  # the download sends the token too
                    page.click("#download")
                saved = tmp_path / "keyed.json"
                download.value.save_as(saved)
                assert DebateResult.model_validate_json(saved.read_text()).task.question == "Keyed?"
                assert errors == [], errors
            finally:
                browser.close()


def test_the_openapi_page_renders_with_no_request_off_this_machine(viewer: ServerThread) -> None:
    executable = chromium()
    sync_api = playwright_sync()
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


# ------------------------------------------------------------------ turns a debate's end cut short


@contextmanager
def debate_page(errors: list[str]) -> Iterator[Any]:
    """A headless Chromium page; its uncaught script errors go to ``errors``."""
    executable = chromium()
    sync_api = playwright_sync()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page
        finally:
            browser.close()


def cell(page: Any, speaker: str, round_: int) -> Any:
    return page.locator(f'tr[data-round="{round_}"] td[data-speaker="{speaker}"]')


def assert_cut_turns_flagged(page: Any, result: DebateResult) -> None:
    """Every turn the result holds with an error is flagged cut short with that error; every other
    turn is shown done, unflagged; no cell is left streaming or blank."""
    turns = [t for r in result.rounds for t in r.turns]
    cut = [t for t in turns if t.error is not None]
    assert cut, "the debate's end cut no turn"
    for t in turns:
        box = cell(page, t.speaker, t.round)
        if t.error is None:
            assert box.get_attribute("data-done") == "true" and box.get_attribute("data-cut") is None
        else:
            assert box.get_attribute("data-cut") == "true" and "failed" in (box.get_attribute("class") or "")
            assert box.locator(".flag.bad").inner_text() == "cut short: " + t.error
    assert page.locator("td.turn[data-cut=true]").count() == len(cut)
    assert page.locator("td.turn.streaming").count() == 0


def test_turns_cut_short_by_the_timeout_are_flagged_live_and_on_the_permalink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    errors: list[str] = []
    with FakeOpenAIServer(reply=society_reply) as fake:
        # Round 1 answers at once; round 2's calls hang until the debate's timeout cuts them. The
        # engine then emits no turn_done for them: only the stored result holds their errors.
        fake.faults.extend([Fault.delay(0)] * 3 + [Fault.delay(3600)] * 3)
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, finished_logs_in_memory=0
        )
        with ServerThread(settings) as server, debate_page(errors) as page:
            body = {"protocol": "society-of-minds", "question": QUESTION, "budget": {"timeout_s": 5}}
            debate_id = httpx.post(server.url + "/v1/debates", json=body).json()["id"]
            page.goto(f"{server.url}/debates/{debate_id}")
            page.wait_for_selector("body[data-done=timeout]", timeout=120_000)
            info = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()
            result = DebateResult.model_validate(info["result"])
            assert info["status"] == "timeout" == page.locator("#status").inner_text()
            # whatever the machine's speed, the timeout cuts the round in flight and only it
            last = result.rounds[-1].index
            cut = [t for r in result.rounds for t in r.turns if t.error is not None]
            assert {t.round for t in cut} == {last}
            assert {t.error for t in cut} == {"cancelled: the debate's timeout expired during this call"}
            assert_cut_turns_flagged(page, result)
            foot = page.locator(f'tr[data-round-foot="{last}"]').inner_text().strip()
            assert foot == f"round {last} cut short (timeout)"
            assert "timed out after 5 s" in page.locator("#problem-list").inner_text()
            page.screenshot(path=str(tmp_path / "viewer-timeout.png"), full_page=True)
            save(tmp_path / "viewer-timeout.png")

            # the permalink, rebuilt from the store, flags the same turns
            page.reload()
            page.wait_for_selector("body[data-done=timeout]", timeout=60_000)
            assert_cut_turns_flagged(page, result)
    assert errors == []


def test_turns_cut_short_by_the_cancel_button_are_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    errors: list[str] = []
    with FakeOpenAIServer(reply=society_reply) as fake:
        fake.faults.extend([Fault.delay(0)] * 3 + [Fault.delay(3600)] * 3)  # round 2 hangs until cancelled
        settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url)
        with ServerThread(settings) as server, debate_page(errors) as page:
            body = {"protocol": "society-of-minds", "question": QUESTION}
            debate_id = httpx.post(server.url + "/v1/debates", json=body).json()["id"]
            page.goto(f"{server.url}/debates/{debate_id}")
            page.wait_for_selector('tr[data-round="2"] td.turn.streaming', timeout=60_000)
            page.click("#cancel")
            page.wait_for_selector("body[data-done=cancelled]", timeout=60_000)
            result = DebateResult.model_validate(httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"])
            assert page.locator("#status").inner_text() == "cancelled" and page.locator("#cancel").is_hidden()
            cut = [t for r in result.rounds for t in r.turns if t.error is not None]
            assert {t.round for t in cut} == {2}
            assert {t.error for t in cut} == {"cancelled: " + CANCELLED}
            assert_cut_turns_flagged(page, result)
    assert errors == []


def test_a_debate_interrupted_by_a_killed_server_flags_its_unfinished_turns(tmp_path: Path) -> None:
    errors: list[str] = []
    db, log = tmp_path / "moot.sqlite", tmp_path / "serve.log"
    with FakeOpenAIServer(reply=society_reply) as fake:
        # Round 1 and one call of round 2 answer at once; the other two calls of round 2 hang.
        fake.faults.extend([Fault.delay(0)] * 4 + [Fault.delay(3600)] * 2)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = ["--port", str(port), "--db", str(db), "--models", "openai:fake", "--base-url", fake.base_url]
        proc = serve_process(args, log)
        try:
            wait_until_up(url, proc)
            body = {"protocol": "society-of-minds", "question": QUESTION}
            debate_id = httpx.post(url + "/v1/debates", json=body).json()["id"]

            def round_2_written() -> bool:
                stored = httpx.get(f"{url}/v1/debates/{debate_id}").json()["result"]
                return bool(stored and len(stored["rounds"]) == 2 and stored["rounds"][1]["turns"])

            # the store holds round 2's three turn_started and one turn_done: then the server dies
            wait_for(round_2_written, "a turn of round 2 to be written", timeout=120)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url)
        with ServerThread(settings) as server, debate_page(errors) as page:
            page.goto(f"{server.url}/debates/{debate_id}")
            page.wait_for_selector("body[data-done=interrupted]", timeout=60_000)
            assert page.locator("#status").inner_text() == "interrupted"
            # the killed server never wrote the two unfinished turns: flagged with the debate's error
            assert page.locator('tr[data-round="1"] td.turn[data-done=true]').count() == 3
            assert page.locator('tr[data-round="2"] td.turn[data-done=true]').count() == 1
            flagged = page.locator('tr[data-round="2"] td.turn[data-cut=true]')
            assert flagged.count() == 2
            for i in range(2):
                assert "failed" in (flagged.nth(i).get_attribute("class") or "")
                assert flagged.nth(i).locator(".flag.bad").inner_text() == "cut short: " + INTERRUPTED
            assert page.locator("td.turn.streaming").count() == 0
            assert page.locator('tr[data-round-foot="2"]').inner_text().strip() == "round 2 cut short (interrupted)"
            page.screenshot(path=str(tmp_path / "viewer-interrupted.png"), full_page=True)
            save(tmp_path / "viewer-interrupted.png")
    assert errors == []
    assert "Traceback" not in log.read_text()


def test_an_unknown_debate_shows_a_not_found_page(viewer: ServerThread) -> None:
    errors: list[str] = []
    with debate_page(errors) as page:
        page.goto(viewer.url + "/debates/0123456789abcdef0123456789abcdef")
        page.wait_for_selector("#status.notfound", timeout=30_000)
        assert page.locator("#status").inner_text() == "not found"
        assert "no debate '0123456789abcdef0123456789abcdef'" in page.locator("#question").inner_text()
        assert page.locator("#download").is_hidden() and page.locator("#cancel").is_hidden()
        assert page.title() == "moot · not found"
    assert errors == []


#: The page's readEvents, driven by a fetch that answers from a script (run in the page, as loaded).
READ_EVENTS = """async () => {
  const stream = (chunks) => new ReadableStream({ start(c) {
    for (const x of chunks) c.enqueue(new TextEncoder().encode(x)); c.close(); } });
  const plans = [
    // a CR and its LF in two pieces, two data lines, a keepalive, an event cut mid-field, then a drop
    () => new Response(stream(["id: 1\\r\\nevent: token\\r\\ndata: a\\r", "\\ndata: b\\r\\n\\r\\n: keepalive\\n\\n",
                               "id: 2\\nevent: turn_done\\nda", "ta: {\\"x\\":1}\\n\\n"]), { status: 200 }),
    () => new Response("busy", { status: 503, headers: { "Retry-After": "0" } }),  // asked again
    () => new Response(stream(["id: 3\\nevent: debate_done\\ndata: {}\\n\\n"]), { status: 200 }),
    () => new Response("gone", { status: 404, statusText: "Not Found" }),  // nothing to try again
  ];
  const sent = [];
  window.fetch = async (path, options) => {
    sent.push(options.headers["Last-Event-ID"] || null);
    return plans.shift()();
  };
  const got = [];
  let done = false;
  const hung = new Promise((_, reject) => setTimeout(() => reject(new Error("readEvents never ended")), 20000));
  await Promise.race([hung, (async () => {
    await readEvents("/e", (name, data) => { got.push([name, data]); done = name === "debate_done"; }, () => done);
    await readEvents("/e", () => {}, () => false);
  })()]);
  return { got, sent, problems: [...document.querySelectorAll("#problem-list li")].map((p) => p.textContent) };
}"""


def test_the_viewers_event_reader_parses_resumes_and_stops_as_eventsource_does(viewer: ServerThread) -> None:
    """The viewer reads its event stream with fetch (EventSource sends no bearer; a review of the
    change, session 38): a CR and its LF in two pieces are one line end, an event's lines come
    together across pieces, a drop resumes with Last-Event-ID, a busy server (503) is asked again, and
    an answer another try cannot change (404) ends it, said on the page."""
    errors: list[str] = []
    with debate_page(errors) as page:
        page.goto(viewer.url + "/debates/0123456789abcdef0123456789abcdef")  # (its own stream: a 404)
        page.wait_for_selector("#status.notfound", timeout=30_000)
        ran = page.evaluate(READ_EVENTS)
    assert ran["got"] == [["token", "a\nb"], ["turn_done", '{"x":1}'], ["debate_done", "{}"]]
    assert ran["sent"] == [None, "2", "2", None]
    assert any("could not be read (404 Not Found)" in p for p in ran["problems"]), ran["problems"]
    assert errors == []

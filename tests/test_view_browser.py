"""``moot view`` in a real browser: headless Chromium (Debian's ``chromium`` package) driven by
Playwright's Python package, against the command itself on a loopback port, over an eval run made
with the scripted model (tests/test_view.py). Screenshots at 1280 px are saved under pytest's tmp dir,
and under ``$MOOT_ARTIFACTS_DIR`` when it is set."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving import free_port, wait_for
from test_serve_browser import chromium, playwright_sync, save
from test_view import FLIPPED, ITEMS, PAYLOAD, A, B, is_up, make_eval_run, view_process

pytestmark = pytest.mark.browser


@pytest.fixture
def viewer(tmp_path: Path) -> Iterator[str]:
    run = make_eval_run(tmp_path / "run")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = view_process(run, port)
    try:
        wait_for(lambda: is_up(url) or proc.poll() is not None, "moot view to serve")
        assert proc.poll() is None, proc.communicate()
        yield url
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_open_a_run_filter_to_disagreements_and_compare_two_protocols_side_by_side(viewer: str, tmp_path: Path) -> None:
    executable = chromium()
    sync_api = playwright_sync()
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(viewer + "/")
            page.wait_for_selector("body[data-loaded=true]")
            assert page.locator("#kind").inner_text() == "eval"
            assert page.locator("#item-rows tr").count() == 6
            stats = page.locator("#stats-body tr").all_inner_texts()
            assert stats[0].split()[:4] == [A, "6", "5", "83.3%"] and stats[1].split()[:4] == [B, "6", "5", "83.3%"]
            # A and B are the run's first two protocols; their paired counts over the whole run
            assert page.locator("#pick-a").input_value() == A and page.locator("#pick-b").input_value() == B
            boxes = dict(
                zip(
                    page.locator("#pair-counts .pair-box").evaluate_all("bs => bs.map(b => b.dataset.pair)"),
                    [int(n) for n in page.locator("#pair-counts .pair-box .n").all_inner_texts()],
                    strict=True,
                )
            )
            assert boxes == {"both_right": 4, "only_a": 1, "only_b": 1, "both_wrong": 0, "disagree": 2}
            # the question's markup is shown as text, and nothing in it ran
            first = page.locator('#item-rows tr[data-id="x1"] a.qtext')
            assert first.inner_text() == ITEMS[0]["question"]
            page.screenshot(path=str(tmp_path / "view-run.png"), full_page=True)
            save(tmp_path / "view-run.png")

            # the debates in which an answer flipped between rounds
            page.check("#f-flipped")
            page.wait_for_selector("body[data-loaded=true]")
            assert set(page.locator("#item-rows tr").evaluate_all("rs => rs.map(r => r.dataset.id)")) == FLIPPED[B]
            page.uncheck("#f-flipped")
            page.wait_for_selector("body[data-loaded=true]")

            # the items where A and B disagree
            page.select_option("#f-pair", "disagree")
            page.wait_for_selector("body[data-loaded=true]")
            rows = page.locator("#item-rows tr")
            assert set(rows.evaluate_all("rs => rs.map(r => r.dataset.id)")) == {"x2", "x6"}
            assert page.locator("#shown").inner_text() == "2 of 6"
            assert page.locator("#pair-counts .pair-box.active").get_attribute("data-pair") == "disagree"
            x2 = page.locator('#item-rows tr[data-id="x2"]')
            assert x2.locator('td[data-role="A"]').get_attribute("data-outcome") == "right"
            assert x2.locator('td[data-role="B"]').get_attribute("data-outcome") == "wrong"
            assert "flipped ×3" in x2.locator('td[data-role="B"]').inner_text()
            # a click on a count filters to its items: only B right
            page.click('#pair-counts .pair-box[data-pair="only_b"]')
            page.wait_for_selector("body[data-loaded=true]")
            assert rows.evaluate_all("rs => rs.map(r => r.dataset.id)") == ["x6"]
            page.select_option("#f-pair", "disagree")
            page.wait_for_selector("body[data-loaded=true]")
            assert "pair=disagree" in page.url  # the filters are in the address: a reload keeps them

            # the side-by-side view of one item, with the paired counts of the whole run at its top
            x2.locator("a.qtext").click()
            page.wait_for_url("**/item?**")
            page.wait_for_selector("body[data-loaded=true]")
            assert page.locator("#side-a").get_attribute("data-protocol") == A
            assert page.locator("#side-b").get_attribute("data-protocol") == B
            top = [int(n) for n in page.locator("#pair-counts .pair-box .n").all_inner_texts()]
            assert top == [4, 1, 1, 0, 2]
            assert page.locator("#side-a .side-answer").inner_text() == "B"  # single stayed right
            assert page.locator("#side-b .side-answer").inner_text() == "A"  # the debate was herded
            assert page.locator("#side-b .round").count() == 3  # two rounds and the decision
            assert page.locator("#side-b .turn-card").count() == 6
            changed = page.locator('#side-b .round[data-round="2"] .answer .flag').all_inner_texts()
            assert changed == ["changed from B"] * 3
            assert "agreement 100% on “A”" in page.locator('#side-b .round[data-round="2"] .round-note').inner_text()
            reasoning = page.locator('#side-a .turn-card[data-round="1"] dd').first.inner_text()
            assert reasoning == f"Thinking it over. {PAYLOAD}"
            assert page.locator("main img, main script").count() == 0  # the markup in it made no element
            assert page.evaluate("document.body.dataset.pwned") is None
            page.screenshot(path=str(tmp_path / "view-side-by-side.png"), full_page=True)
            save(tmp_path / "view-side-by-side.png")

            # one protocol alone, from the item's table of protocols
            page.select_option("#pick-b", "")
            page.wait_for_selector("body[data-loaded=true]")
            assert page.locator("#side-b").is_hidden() and page.locator("#pair-counts").is_hidden()
            assert "pair=disagree" in (page.locator("#back").get_attribute("href") or "")
            page.click("#back")
            page.wait_for_selector("body[data-loaded=true]")
            assert page.locator("#f-pair").input_value() == "disagree"
            assert page.evaluate("document.body.dataset.pwned") is None

            # a link naming a protocol the run does not have says so (it was dropped without a word)
            page.goto(viewer + "/?protocol=nope")
            page.wait_for_selector("body[data-loaded=true]")
            page.wait_for_selector("#filter-error:not([hidden])")
            said = page.locator("#filter-error").inner_text()
            assert said == "no protocol 'nope' in this run: showing every protocol's items"
            assert page.locator("#item-rows tr").count() == 6
        finally:
            browser.close()
    assert errors == []
    assert (tmp_path / "view-run.png").stat().st_size > 10_000

"""Cost in money: user prices (a file or options), embedded models free, unpriced models in tokens
only; a debate's cost against a single call. No price is invented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core import DebateTask, Engine
from moot.core.cost import debate_cost
from moot.core.types import DebateResult, Round, Turn, load_result
from moot.models.base import Usage
from moot.models.pricing import FREE, Price, PriceError, PriceTable, load_prices, parse_price, price_table
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset

runner = CliRunner()


def turn(speaker: str, round_: int, model: str, prompt: int, completion: int, calls: int = 1) -> Turn:
    return Turn(
        speaker=speaker,
        name=speaker,
        round=round_,
        model=model,
        messages=[],
        text="x",
        calls=calls,
        usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
    )


def result_of(*rounds: list[Turn], decision: list[Turn] | None = None) -> DebateResult:
    numbered = [Round(index=i + 1, turns=t) for i, t in enumerate(rounds)]
    return DebateResult(protocol="p", task=DebateTask(question="Q?"), rounds=numbered, decision_turns=decision or [])


@pytest.mark.req("S004-COST")
def test_a_priced_debate_costs_its_tokens_and_compares_with_one_call() -> None:
    prices = PriceTable(prices={"openai:gpt-4o-mini": Price(input=0.15, output=0.60)})
    result = result_of(
        [turn("a", 1, "openai:gpt-4o-mini", 1000, 200), turn("b", 1, "openai:gpt-4o-mini", 1000, 200)],
        [turn("a", 2, "openai:gpt-4o-mini", 2000, 200), turn("b", 2, "openai:gpt-4o-mini", 2000, 200)],
        decision=[turn("decision", 2, "openai:gpt-4o-mini", 3000, 400)],
    )
    cost = debate_cost(result, prices)
    assert cost.prompt_tokens == 9000 and cost.completion_tokens == 1200 and cost.unpriced == []
    assert cost.usd == pytest.approx((9000 * 0.15 + 1200 * 0.60) / 1e6)
    assert cost.single_call_tokens == 1200 and cost.single_call_usd == pytest.approx((1000 * 0.15 + 200 * 0.6) / 1e6)
    assert cost.ratio_to_single_tokens == pytest.approx(10200 / 1200, rel=1e-6)
    assert cost.ratio_to_single_usd == pytest.approx(cost.usd / cost.single_call_usd, rel=1e-5)
    assert cost.models[0].calls == 5
    assert cost.describe().startswith("$0.00207") and "x a single call's cost" in cost.describe()


@pytest.mark.req("S004-COST")
def test_embedded_models_cost_nothing_and_unpriced_models_show_tokens_only() -> None:
    free = debate_cost(result_of([turn("a", 1, "embedded:qwen2.5-0.5b", 500, 100)]))
    assert free.usd == 0.0 and free.ratio_to_single_usd is None and free.ratio_to_single_tokens == 1.0
    assert free.describe().startswith("$0 (embedded models cost 0); 600 tokens")
    mixed = debate_cost(
        result_of([turn("a", 1, "embedded:qwen2.5-0.5b", 500, 100), turn("b", 1, "openai:gpt-x", 5, 5)])
    )
    assert mixed.usd is None and mixed.unpriced == ["openai:gpt-x"]
    assert [m.usd for m in mixed.models] == [0.0, None]
    line = mixed.describe()
    assert line.startswith("tokens only: no price for openai:gpt-x") and "--prices FILE" in line and "$" not in line


def test_carried_and_refused_turns_cost_nothing() -> None:
    cost = debate_cost(
        result_of([turn("a", 1, "openai:m", 100, 10), turn("b", 1, "openai:other", 0, 0, calls=0)]),
        PriceTable(prices={"m": Price(input=1, output=1)}),
    )
    assert [m.model for m in cost.models] == ["openai:m"] and cost.usd == pytest.approx(110 / 1e6)


def test_price_files_and_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    yml = tmp_path / "prices.yaml"
    yml.write_text(
        "openai:gpt-4o-mini: {input: 0.15, output: 0.6}\nembedded:qwen2.5-1.5b: {input: 0.01, output: 0.02}\n"
    )
    table = load_prices(yml)
    assert table.price_for("openai:gpt-4o-mini") == Price(input=0.15, output=0.6)
    assert table.price_for("embedded:qwen2.5-1.5b") == Price(input=0.01, output=0.02)  # a file may price them
    assert table.price_for("embedded:smollm2-135m") == FREE and table.price_for("openai:gpt-4o") is None
    js = tmp_path / "prices.json"
    js.write_text(json.dumps({"gpt-4o": {"input": 2.5, "output": 10}}))
    assert load_prices(js).price_for("openai:gpt-4o") == Price(input=2.5, output=10)  # the bare name matches
    assert parse_price("openai:gpt-4o=2.5, 10") == ("openai:gpt-4o", Price(input=2.5, output=10))
    monkeypatch.setenv("MOOT_PRICES", str(yml))
    merged = price_table(None, ["openai:gpt-4o-mini=1,2"])
    assert merged.price_for("openai:gpt-4o-mini") == Price(input=1, output=2)  # options win over the file
    assert merged.price_for("embedded:qwen2.5-1.5b") == Price(input=0.01, output=0.02)
    monkeypatch.delenv("MOOT_PRICES")
    assert price_table().prices == {}
    for text, message in (
        ("[1, 2]", "holds no prices"),
        ("m: {input: -1, output: 1}", "invalid m.input"),
        ("m: {input: 1, output: 1, cached: 0.5}", "invalid m.cached"),
        ("m: {input: 1", "is not valid YAML"),
    ):
        yml.write_text(text)
        with pytest.raises(PriceError, match=message.replace(".", r"\.")):
            load_prices(yml)
    for bad in ("gpt", "gpt=1", "=1,2", "gpt=a,b", "gpt=-1,2"):
        with pytest.raises(PriceError, match="MODEL=INPUT,OUTPUT"):
            parse_price(bad)
    with pytest.raises(PriceError, match="does not exist"):
        load_prices(tmp_path / "missing.yaml")


MAPPING = (
    "a YAML/JSON mapping like openai:gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075} (USD per "
    "million tokens; cached_input is optional)"
)


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        # the refusal of a file nested past what moot reads had the decoder's "line 1 column 1 (char 0)"
        # spliced between its fix and the file's
        (
            "deep.json",
            "[" * 200 + "]" * 200,
            "is refused: its lists and mappings nest deeper than 100 levels; flatten it to " + MAPPING,
        ),
        ("deep.yaml", "[" * 200 + "]" * 200, "is refused: its lists and mappings nest deeper than 100 levels; flatten"),
        ("bad.json", '{"m": \n', "is not valid JSON (line 2, column 1: Expecting value); give " + MAPPING),
        ("bad.yaml", "m: [\n", "is not valid YAML (line 2, column 1: expected the node content, but found"),
        ("list.json", "[1, 2]", "holds no prices (a list, not a mapping); give " + MAPPING),
        ("text.yaml", "just text\n", "holds no prices (a string, not a mapping); give"),
        ("empty.yaml", "", "holds no prices; give"),
    ],
)
def test_a_price_file_that_is_not_a_mapping_of_prices_is_one_clean_sentence(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PriceError) as info:
        load_prices(path)
    message = " ".join(str(info.value).split())
    assert message.startswith(f"price file {str(path)!r} {said}"), message
    assert "(char " not in message and message.count("give") + message.count("flatten") == 1, message
    result = CliRunner().invoke(app, ["debate", "Q?", "-m", "scripted:none.json", "--prices", str(path)])
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output


@pytest.mark.req("S000-METRICS")
async def test_an_engine_run_is_priced_per_model() -> None:
    spec = get_preset("affirmative-critical").model_copy(update={"rounds": 1})
    engine = Engine(spec, ScriptedModel(["a b c", "d e f", "final"], name="openai:cheap"))
    result = await engine.run("Q?")
    cost = debate_cost(result, PriceTable(prices={"openai:cheap": Price(input=1.0, output=2.0)}))
    assert cost.usd == pytest.approx((result.usage.prompt_tokens + 2 * result.usage.completion_tokens) / 1e6)
    assert cost.models[0].calls == result.llm_calls == 3


@pytest.mark.req("S004-COST")
def test_cli_prices_the_debate(tmp_path: Path) -> None:
    script = tmp_path / "r.json"
    script.write_text(json.dumps(["A one.", "C one.", "A two.", "C two.", "Final."]))
    out = tmp_path / "out.json"
    spec = f"scripted:{script}"
    result = runner.invoke(app, ["debate", "Q?", "-m", spec, "--json", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "tokens only: no price for" in result.output
    saved = load_result(out)
    assert saved.cost is not None and saved.cost.usd is None and saved.cost.unpriced == [spec]
    again = tmp_path / "r2.json"  # a new scripted model: the first one's replies are spent
    again.write_text(script.read_text())
    spec = f"scripted:{again}"
    result = runner.invoke(
        app, ["debate", "Q?", "-m", spec, "--price", f"{spec}=1000,2000", "--json", str(out)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    saved = load_result(out)
    assert saved.cost is not None and saved.cost.usd == pytest.approx(
        (saved.usage.prompt_tokens * 1000 + saved.usage.completion_tokens * 2000) / 1e6
    )
    assert "x a single call's cost" in result.output
    prices = tmp_path / "p.yaml"
    prices.write_text("nope: {input: x}\n")
    for args, message in (
        (["--prices", str(prices)], "invalid nope.input"),
        (["--prices", str(tmp_path / "none.yaml")], "does not exist"),
        (["--price", "broken"], "give MODEL=INPUT,OUTPUT"),
    ):
        result = runner.invoke(app, ["debate", "Q?", "-m", spec, *args])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output


@pytest.mark.req("S004-COST")
def test_prompt_tokens_from_the_servers_cache_cost_the_cached_price() -> None:
    """A provider bills prompt tokens it read from its prompt cache at a discount: with a
    ``cached_input`` price they cost that, without one they cost ``input`` (nothing is assumed)."""
    cached_price = Price(input=0.15, output=0.60, cached_input=0.075)
    assert cached_price.cost(1000, 100, 600) == pytest.approx((400 * 0.15 + 600 * 0.075 + 100 * 0.60) / 1e6)
    assert Price(input=0.15, output=0.60).cost(1000, 100, 600) == pytest.approx((1000 * 0.15 + 100 * 0.60) / 1e6)
    assert cached_price.cost(100, 0, 500) == pytest.approx(100 * 0.075 / 1e6)  # never more cached than sent

    def cached_turn(speaker: str, prompt: int, cached: int) -> Turn:
        t = turn(speaker, 1, "openai:gpt-4o-mini", prompt, 100)
        return t.model_copy(update={"usage": Usage(prompt_tokens=prompt, completion_tokens=100,
                                                   cached_prompt_tokens=cached)})  # fmt: skip

    result = result_of([cached_turn("a", 1000, 0), cached_turn("b", 1000, 800)])
    cost = debate_cost(result, PriceTable(prices={"openai:gpt-4o-mini": cached_price}))
    assert cost.cached_prompt_tokens == 800 and cost.models[0].cached_prompt_tokens == 800
    assert cost.usd == pytest.approx((1200 * 0.15 + 800 * 0.075 + 200 * 0.60) / 1e6)
    # the option takes the cached price as a third value; a fourth is refused with the form
    assert parse_price("openai:gpt-4o-mini=0.15,0.60,0.075") == ("openai:gpt-4o-mini", cached_price)
    with pytest.raises(PriceError, match=r"MODEL=INPUT,OUTPUT\[,CACHED_INPUT\]"):
        parse_price("m=1,2,3,4")


def test_cached_tokens_are_read_from_openai_usage_and_from_responses_stored_before() -> None:
    from moot.models.base import ChatResponse

    assert Usage.from_openai(
        {"prompt_tokens": 50, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 32}}
    ) == Usage(prompt_tokens=50, completion_tokens=5, cached_prompt_tokens=32)
    # servers that leave the details out, or send nulls
    assert Usage.from_openai({"prompt_tokens": 50, "completion_tokens": 5}).cached_prompt_tokens == 0
    assert Usage.from_openai({"prompt_tokens": 50, "completion_tokens": None, "prompt_tokens_details": None}) == Usage(
        prompt_tokens=50
    )
    # a request cache written before the count moved into usage keeps it
    old = {"text": "x", "usage": {"prompt_tokens": 50, "completion_tokens": 5}, "cached_prompt_tokens": 32}
    assert ChatResponse.model_validate(old).usage.cached_prompt_tokens == 32
    assert ChatResponse.model_validate_json(json.dumps(old)).usage.cached_prompt_tokens == 32
    # a backend written against the old field still reports it
    given = ChatResponse(text="x", usage=Usage(prompt_tokens=50), cached_prompt_tokens=32)  # type: ignore[call-arg]
    assert given.usage.cached_prompt_tokens == 32

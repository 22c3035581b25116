"""``moot serve`` as the model of an agent (issue 41, items 3 and 4): retries that join their debate
(``Idempotency-Key``, ``x-should-retry``, ``x-request-id``), and what agent clients send. Debates run on
the loopback fake OpenAI-compatible server."""

# ruff: noqa: F811  (make_server is a fixture of test_serve_api, imported)

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import openai
import pytest

from moot.testing.fake_openai import Fault, example_of
from serving import ServerThread
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

QUESTION = "Is 7 prime?"
CHAT = {"model": "moot/vote", "messages": [{"role": "user", "content": QUESTION}]}


def debate_count(server: ServerThread) -> int:
    return len(httpx.get(server.url + "/v1/debates", params={"limit": 200}).json()["debates"])


def post(server: ServerThread, body: dict[str, Any], key: str | None = None, **headers: str) -> httpx.Response:
    sent = {**headers, **({"Idempotency-Key": key} if key is not None else {})}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=sent, timeout=60)


# ------------------------------------------------------------------------------ Idempotency-Key


def test_the_same_idempotency_key_joins_the_running_debate_then_returns_it(make_server: MakeServer) -> None:
    server, fake = make_server(latency=0.3)
    replies: list[httpx.Response] = []
    first = threading.Thread(target=lambda: replies.append(post(server, CHAT, "key-1")))
    first.start()
    # the second request comes while the first one's debate runs (a retry after a client timeout)
    while debate_count(server) == 0:
        pass
    second = post(server, CHAT, "key-1")
    first.join(60)
    assert second.status_code == 200 == replies[0].status_code, second.text
    assert second.json()["id"] == replies[0].json()["id"]
    assert second.json()["choices"][0]["message"]["content"] == replies[0].json()["choices"][0]["message"]["content"]
    calls = len(fake.requests)
    # after it ended: its stored result, streamed or not; no new debate, no new call
    third = post(server, CHAT, "key-1")
    assert third.json()["id"] == second.json()["id"] and third.json()["choices"] == second.json()["choices"]
    streamed = post(server, {**CHAT, "stream": True}, "key-1")
    assert f'"id":"{second.json()["id"]}"' in streamed.text and streamed.text.rstrip().endswith("data: [DONE]")
    assert len(fake.requests) == calls and debate_count(server) == 1
    # another key, or none, is another debate
    assert post(server, CHAT, "key-2").json()["id"] != second.json()["id"]
    assert debate_count(server) == 2


def test_an_idempotency_key_reused_with_another_body_is_a_409_and_no_debate(make_server: MakeServer) -> None:
    server, _ = make_server()
    assert post(server, CHAT, "key-1").status_code == 200
    other = {**CHAT, "messages": [{"role": "user", "content": "Is 9 prime?"}]}
    refused = post(server, other, "key-1")
    assert refused.status_code == 409 and refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
    assert "another request body" in error["message"]
    assert debate_count(server) == 1
    # a key that is no token is refused by name
    bad = post(server, CHAT, "two words")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"


def test_an_idempotency_keys_body_hash_holds_across_an_upgrade_that_adds_a_field() -> None:
    """The hash was of every field, defaults included: a newer moot with one more field (a default
    the client never sent) answered the retry of a rolling upgrade with a 409. It is now of the
    fields sent; a debate stored with the old hash still matches its retry."""
    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.state.idempotency import _check_body, of_request

    class Newer(ChatCompletionRequest):
        some_new_option: int = 3

    headers = {"Idempotency-Key": "k1"}
    before = of_request(headers, "chat", ChatCompletionRequest.model_validate(CHAT))
    after = of_request(headers, "chat", Newer.model_validate(CHAT))
    assert before is not None and after is not None and before.body == after.body
    _check_body({"idempotency": {"key": "k1", "body": before.before}}, before)  # stored by an earlier moot
    other = of_request(headers, "chat", ChatCompletionRequest.model_validate({**CHAT, "temperature": 0.3}))
    assert other is not None and other.body != before.body


def test_an_idempotency_key_is_the_callers_own_and_per_endpoint(make_server: MakeServer) -> None:
    server, _ = make_server()
    mine = post(server, CHAT, "key-1", Authorization="Bearer alice").json()["id"]
    theirs = post(server, CHAT, "key-1", Authorization="Bearer bob").json()["id"]
    assert mine != theirs
    response = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/vote", "input": QUESTION},
        headers={"Idempotency-Key": "key-1", "Authorization": "Bearer alice"},
        timeout=60,
    )
    assert response.status_code == 200 and response.json()["id"].removeprefix("resp_") != mine.removeprefix("moot-")
    again = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/vote", "input": QUESTION},
        headers={"Idempotency-Key": "key-1", "Authorization": "Bearer alice"},
        timeout=60,
    )
    assert again.json()["id"] == response.json()["id"] and debate_count(server) == 3


def test_an_idempotency_key_survives_a_restart(make_server: MakeServer) -> None:
    server, fake = make_server()
    first = post(server, CHAT, "key-1").json()
    server.__exit__(None, None, None)
    with ServerThread(server.settings) as again:
        calls = len(fake.requests)
        second = post(again, CHAT, "key-1").json()
        assert second["id"] == first["id"] and second["choices"] == first["choices"]
        assert len(fake.requests) == calls and debate_count(again) == 1


# -------------------------------------------------------------------------- retries and request ids


def test_a_failed_debate_tells_the_sdk_not_to_retry(make_server: MakeServer) -> None:
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "bad request upstream")] * 40)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")  # the SDK's default: 2 retries
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": QUESTION}])
    assert err.value.status_code == 502 and err.value.response.headers["x-should-retry"] == "false"
    assert debate_count(server) == 1  # one debate: the SDK did not start two more


def test_every_response_carries_a_request_id(make_server: MakeServer) -> None:
    server, _ = make_server()
    given = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"
    made = httpx.get(server.url + "/v1/models")
    assert made.headers["x-request-id"].startswith("req_") and len(made.headers["x-request-id"]) > 8
    insane = httpx.get(server.url + "/nowhere", headers={"X-Request-Id": "a b\tc"})
    assert insane.status_code == 404 and insane.headers["x-request-id"].startswith("req_")
    refused = post(server, {"model": "moot/nope", "messages": CHAT["messages"]}, None, **{"X-Request-Id": "r-1"})
    assert refused.status_code == 404 and refused.headers["x-request-id"] == "r-1"
    assert post(server, CHAT).headers["x-request-id"].startswith("req_")
    # a misspelt model gets a did-you-mean (a newcomer's trial, session 38)
    misspelt = post(server, {"model": "moot/society-of-mind", "messages": CHAT["messages"]}, None)
    assert misspelt.status_code == 404 and "did you mean moot/society-of-minds?" in misspelt.json()["error"]["message"]


# --------------------------------------------------------------- a decided answer in the caller's form

MULTIPLE_CHOICE = (
    "Answer the following multiple choice question. The entire content of your response should be of the "
    "following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of A,B,C.\n\nWhich is prime?\n\n"
    "A) 4\nB) 7\nC) 9"
)


def answers(answer: str) -> Any:
    """A fake model whose typed answer is ``answer`` (its reasoning says why)."""

    def reply(request: dict[str, Any]) -> str:
        return json.dumps({"reasoning": "7 has no divisor but 1 and itself.", "answer": answer, "confidence": 0.9})

    return reply


@pytest.mark.parametrize("own", ["ANSWER: B", "B", "(b)"])
def test_a_votes_reply_is_a_winning_samples_own_in_the_callers_form(make_server: MakeServer, own: str) -> None:
    server, _ = make_server(reply=answers(own))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": MULTIPLE_CHOICE}]
    line = own if own.startswith("ANSWER") else f"ANSWER: {own}"
    expected = f"7 has no divisor but 1 and itself.\n\n{line}"
    for model in ("moot/vote", "moot/usc", "moot/direct"):
        reply = client.chat.completions.create(model=model, messages=messages)
        content = reply.choices[0].message.content or ""
        wanted = line if model == "moot/direct" else expected  # direct's answers have no reasoning
        assert content == wanted, model
        streamed = client.chat.completions.create(model=model, messages=messages, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == wanted, model
        assert client.responses.create(model=model, input=MULTIPLE_CHOICE).output_text == wanted, model
    # no form asked: the sample's own answer, as it wrote it
    plain = client.chat.completions.create(model="moot/vote", messages=[{"role": "user", "content": "Which is prime?"}])
    assert plain.choices[0].message.content == f"7 has no divisor but 1 and itself.\n\n{own}"


def test_inspect_multiple_choice_scores_a_vote(make_server: MakeServer, tmp_path: Any, monkeypatch: Any) -> None:
    """Inspect's ``multiple_choice()`` asks ``ANSWER: $LETTER``: a vote whose samples answer B scores 1."""
    pytest.importorskip("inspect_ai", reason="inspect-ai is a dev dependency")
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import choice
    from inspect_ai.solver import multiple_choice

    server, _ = make_server(reply=answers("B"))
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    dataset = [Sample(input="Which number is prime?", choices=["4", "7", "9"], target="B")]
    task = Task(dataset=dataset, solver=multiple_choice(), scorer=choice())
    # A model of its own: Inspect memoizes get_model by name, and one made by an earlier test in this
    # process would still point at that test's server (OPENAI_BASE_URL is read when it is made).
    model = get_model("openai/moot/vote", memoize=False)
    log = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")[0]
    assert log.status == "success", log.error
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0


# ------------------------------------------------------------------------------ long conversations

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def conversation(trips: int) -> list[Any]:
    """An agent's conversation of ``trips`` tool round trips (a system prompt, then the question, then
    an assistant call and its tool result each trip, numbered), and a last question."""
    messages: list[Any] = [{"role": "system", "content": "You are a weather agent."}]
    messages.append({"role": "user", "content": "What is the weather in each city I name?"})
    for i in range(trips):
        called = {"name": "get_weather", "arguments": '{"city": "P"}'}
        call = {"id": f"call_{i}", "type": "function", "function": called}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}: {i % 30} C " * 8})
    messages.append({"role": "user", "content": "So, which day was warmest?"})
    return messages


def weather_agent(request: dict[str, Any]) -> str:
    """Each agent: answers (an action when the request has tools, a typed answer when not)."""
    if "get_weather" in json.dumps(request.get("response_format")):
        return json.dumps({"reasoning": "the results say so", "do": "answer", "answer": "day 29"})
    return json.dumps({"reasoning": "the results say so", "answer": "day 29", "confidence": 0.8})


def test_a_200_message_agent_conversation_is_debated(make_server: MakeServer) -> None:
    server, fake = make_server(reply=weather_agent)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = conversation(99)  # 201 messages
    assert len(messages) == 201
    reply = client.chat.completions.create(model="moot/vote", messages=messages, tools=[WEATHER])
    debate_id = (reply.model_extra or {})["moot"]["debate_id"]
    result = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"]
    context = result["task"]["context"]
    # all of it fits (the system message instructs the debaters: not a passage)
    assert len(context) == 199 and not any(c["source"] == "moot" for c in context)
    assert "result 98" in json.dumps(fake.requests[-1]["messages"])  # the latest tool result is read
    # without tools too: every message is read, not the first three passages
    plain = client.chat.completions.create(model="moot/vote", messages=conversation(99))
    assert plain.choices[0].message.content and "result 98" in json.dumps(fake.requests[-1]["messages"])
    # over the budget: the oldest messages are left out, the instructions kept, and the cut recorded
    tight = client.chat.completions.create(
        model="moot/vote", messages=messages, extra_body={"moot": {"budget": {"max_total_tokens": 6000}}}
    )
    trimmed = httpx.get(f"{server.url}/v1/debates/{(tight.model_extra or {})['moot']['debate_id']}").json()["result"]
    kept = trimmed["task"]["context"]
    notes = [c for c in kept if c["source"] == "moot"]
    assert len(notes) == 1 and kept[0] == notes[0]
    assert notes[0]["left_out"] == 199 - (len(kept) - 1) > 0 and f"{notes[0]['left_out']} earlier" in notes[0]["text"]
    assert all(r["messages"][0]["content"].endswith("You are a weather agent.") for r in fake.requests[-5:])
    assert "result 98" in kept[-1]["text"] and "result 0:" not in json.dumps(kept)
    sent = json.dumps(fake.requests[-1]["messages"])
    assert "left out to fit the prompt budget" in sent and "result 98" in sent
    # the round's prompts, sent together, share the budget: one round no longer spends it several times
    # over (each prompt fitted it alone: the round's took 36,975 prompt tokens of a 6,000-token budget;
    # now 7,445: the fit counts moot's lower estimate of a text's tokens, least_tokens, not the model's)
    assert trimmed["usage"]["prompt_tokens"] <= 1.5 * 6000, trimmed["usage"]
    # the Responses API's truncation: auto is that (and echoed as it); disabled refuses such a request
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 60}
             for i in range(99)]  # fmt: skip
    tight_budget = {"moot": {"budget": {"max_total_tokens": 6000}}}
    auto = client.responses.create(model="moot/vote", input=items, truncation="auto", extra_body=tight_budget)
    assert auto.status == "completed" and auto.truncation == "auto" and auto.parallel_tool_calls is True
    assert auto.tool_choice == "auto"  # (OpenAI's echo of a request without tools)
    cut = httpx.get(f"{server.url}/v1/debates/{auto.id.removeprefix('resp_')}").json()["result"]["task"]["context"]
    assert next(c["left_out"] for c in cut if c["source"] == "moot") > 0
    with pytest.raises(openai.BadRequestError, match="context"):
        client.responses.create(model="moot/vote", input=items, truncation="disabled", extra_body=tight_budget)
    # a remaining limit is a flag, with a clear error
    small, _ = make_server(limits={"max_messages": 50})
    refused = httpx.post(
        small.url + "/v1/chat/completions", json={"model": "moot/vote", "messages": messages}, timeout=60
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
    assert "--max-messages" in refused.json()["error"]["message"]
    responses = httpx.post(
        small.url + "/v1/responses",
        json={"model": "moot/vote", "input": [{"role": "user", "content": f"m{i}"} for i in range(60)]},
        timeout=60,
    )
    assert responses.status_code == 400 and responses.json()["error"]["param"] == "input"


# ------------------------------------------------------------------------------------- discovery


def test_models_retrieve_and_what_each_model_accepts(make_server: MakeServer) -> None:
    import moot.apps.absa.protocols  # noqa: F401  (registers ABSA's presets, as `moot serve` may have)

    server, _ = make_server()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    vote = client.models.retrieve("moot/vote")
    extra = vote.model_extra or {}
    assert vote.id == "moot/vote" and vote.owned_by == "moot"
    assert extra["calls"] == 5 and extra["decision"] == "vote" and extra["accepts_tools"] is True
    assert extra["chat"] is True and "tuned" not in extra
    synth = client.models.retrieve("moot/affirmative-critical:trace").model_extra or {}
    assert synth["accepts_typed_output"] is True and synth["accepts_tools"] is True and synth["calls"] == 5
    usc = client.models.retrieve("moot/usc").model_extra or {}
    assert usc["accepts_tools"] is False and usc["accepts_typed_output"] is False
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("moot/nope")
    assert "moot/vote" in missing.value.message  # it lists what is offered
    listed = httpx.get(server.url + "/v1/models").json()
    cards = {c["id"]: c for c in listed["data"]}
    assert all({"calls", "accepts_tools", "accepts_typed_output", "decision"} <= set(c) for c in cards.values())
    assert cards["moot/single"]["calls"] == 1 and cards["moot/mad"]["accepts_typed_output"] is True
    # ABSA's presets are listed apart, as no chat models
    apps = {c["id"]: c for c in listed["applications"]}
    assert {"moot/absa-panel", "moot/absa-patch"} <= set(apps) and not set(apps) & set(cards)
    assert all(c["chat"] is False for c in apps.values())
    assert (client.models.retrieve("moot/absa-panel").model_extra or {})["chat"] is False
    # and are refused as chat models, not offered as ones (a chat completion ran them)
    assert "moot/absa-panel" not in missing.value.message
    for model in ("moot/absa-panel", "moot/absa-patch:trace"):
        with pytest.raises(openai.BadRequestError, match="is an application's protocol, not a chat model"):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Q?"}])
        with pytest.raises(openai.BadRequestError, match="POST /v1/debates"):
            client.responses.create(model=model, input="Q?")


def test_a_tuned_models_card_carries_its_evidence(make_server: MakeServer, tmp_path: Any) -> None:
    from moot.server.tuned import load_tuned
    from test_serve_openai import write_tuned

    tuned = load_tuned(write_tuned(tmp_path / "tuned.yaml", {"preset": "vote", "with": {"k": 3}}))
    server, _ = make_server(tuned=tuned)
    card = openai.OpenAI(base_url=server.url + "/v1", api_key="unused").models.retrieve("moot/auto")
    extra = card.model_extra or {}
    assert extra["tuned"]["chosen"] == "vote@3" and extra["calls"] == 3 and extra["accepts_tools"] is True
    assert extra["protocol"] == "auto"


# ------------------------------------------------------------------------- instructions and nudges


def test_the_agents_instructions_instruct_each_debater(make_server: MakeServer) -> None:
    server, fake = make_server()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [
        {"role": "system", "content": "You are a terse assistant. Reply in French."},
        {"role": "developer", "content": "Never mention the weather."},
        {"role": "user", "content": QUESTION},
    ]
    before = len(fake.requests)
    reply = client.chat.completions.create(model="moot/affirmative-critical", messages=messages)
    result = httpx.get(f"{server.url}/v1/debates/{(reply.model_extra or {})['moot']['debate_id']}").json()["result"]
    assert result["task"]["context"] == []  # no longer numbered context passages
    sent = fake.requests[before:]
    assert len(sent) == 5
    for request in sent:  # every debater's system prompt, and the synthesis', ends with them
        system = request["messages"][0]
        assert system["role"] == "system" and system["content"].endswith(
            "You are a terse assistant. Reply in French.\n\nNever mention the weather."
        )
        assert "[1] You are a terse" not in json.dumps(request["messages"])
    # the Responses API's instructions, likewise
    before = len(fake.requests)
    client.responses.create(model="moot/vote", instructions="Reply in French.", input=QUESTION)
    assert all(r["messages"][0]["content"].endswith("Reply in French.") for r in fake.requests[before:])


def _inspect_nudges() -> list[str]:
    """Inspect AI's own continue prompts, as its react() and basic_agent() send them."""
    from inspect_ai.agent._types import DEFAULT_CONTINUE_PROMPT, DEFAULT_CONTINUE_PROMPT_NO_SUBMIT

    return [DEFAULT_CONTINUE_PROMPT.format(submit="submit").strip(), DEFAULT_CONTINUE_PROMPT_NO_SUBMIT.strip()]


@pytest.mark.parametrize("nudge", ["please proceed", "Continue.", "ok, go on", "Keep going please", *_inspect_nudges()])
def test_a_continuation_nudge_is_not_the_question(make_server: MakeServer, nudge: str) -> None:
    server, _ = make_server(reply=weather_agent)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [*conversation(2)[:-1], {"role": "user", "content": nudge}]
    reply = client.chat.completions.create(model="moot/vote", messages=messages, tools=[WEATHER])
    result = httpx.get(f"{server.url}/v1/debates/{(reply.model_extra or {})['moot']['debate_id']}").json()["result"]
    assert result["task"]["question"] == "What is the weather in each city I name?"
    assert result["task"]["context"][-1] == {"text": nudge, "source": "user"}
    # a short message that is a question of its own stays the question
    own: Any = [*conversation(1)[:-1], {"role": "user", "content": "And Rome?"}]
    asked = client.chat.completions.create(model="moot/vote", messages=own, tools=[WEATHER])
    again = httpx.get(f"{server.url}/v1/debates/{(asked.model_extra or {})['moot']['debate_id']}").json()["result"]
    assert again["task"]["question"] == "And Rome?"
    # ... and so does a nudge whose second sentence asks something
    from moot.server.openai.conversation import is_nudge

    assert not is_nudge("Continue. If you are done, what is 2+3?") and not is_nudge("Proceed to compute 17*24.")
    for instruction in (  # a second sentence that asks for work is the question
        "Go ahead. If you are done, translate the answer into French.",
        "Continue. If you finish early, also write unit tests for the parser.",
        "Next. If solved, explain why 7 is prime",
    ):
        assert not is_nudge(instruction), instruction


def test_refusals_are_worded_for_the_request_that_got_them(make_server: MakeServer) -> None:
    server, _ = make_server()
    chat = {"model": "moot/usc", "messages": [{"role": "user", "content": QUESTION}]}
    tools = httpx.post(server.url + "/v1/chat/completions", json={**chat, "tools": [WEATHER]}, timeout=60).json()
    assert "decided by a selection" in tools["error"]["message"] and "a select " not in tools["error"]["message"]
    legacy = httpx.post(server.url + "/v1/chat/completions", json={**chat, "functions": [WEATHER["function"]]}).json()
    assert legacy["error"]["param"] == "functions" and "cannot call tools" not in legacy["error"]["message"]
    assert 'tools=[{"type": "function", "function": <the function>}]' in legacy["error"]["message"]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    typed = httpx.post(
        server.url + "/v1/responses",
        json={
            "model": "moot/usc",
            "input": QUESTION,
            "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}},
        },
        timeout=60,
    ).json()
    assert typed["error"]["param"] == "text.format" and "response_format" not in typed["error"]["message"], typed


# ------------------------------------------------------------------------- tools and a typed answer

STRICT_WEATHER: Any = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
STRICT_WEATHER["function"]["parameters"] = {**WEATHER["function"]["parameters"], "additionalProperties": False}


def typed_agent(request: dict[str, Any]) -> str:
    """Each agent: calls get_weather until its result is in the context, then answers in the schema."""
    schema = json.dumps(request.get("response_format"))
    if "get_weather" in schema and "the result of the tool call" not in json.dumps(request.get("messages")):
        return json.dumps({"reasoning": "I need the weather", "do": "get_weather", "arguments": {"city": "Paris"}})
    answer = {"city": "Paris", "celsius": 21}
    if '"do"' in schema:  # typed when a schema is asked for, else in words
        said = answer if "an object following the given schema" in schema else "It is 21 C in Paris."
        return json.dumps({"reasoning": "the tool said so", "do": "answer", "answer": said})
    if request.get("response_format") is None:  # a debater's free text, without tools
        return "It is 21 C in Paris."
    own = (request["response_format"].get("json_schema") or {}).get("schema") or {}
    if "celsius" not in schema and own.get("properties"):  # a protocol's own typed turn (a panelist's)
        return json.dumps(example_of(own))
    # the answer, typed (a json_object request has the schema in its prompt, as a model follows it)
    return json.dumps(answer)


VOTES = ("moot/vote", "moot/society-of-minds")


@pytest.mark.parametrize("model", [*VOTES, "moot/affirmative-critical", "moot/panel"])
def test_tools_and_a_typed_final_answer_together(make_server: MakeServer, model: str) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: int

    server, fake = make_server(reply=typed_agent)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.parse(
        model=model, messages=messages, tools=[STRICT_WEATHER], response_format=Weather
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    messages += [
        first.choices[0].message.model_dump(exclude_none=True, exclude={"parsed"}),
        {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'},
    ]
    final = client.chat.completions.parse(
        model=model, messages=messages, tools=[STRICT_WEATHER], response_format=Weather
    )
    assert final.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    sent = [json.dumps(r["response_format"]["json_schema"]["schema"]) for r in fake.requests[-2:]]
    if model in VOTES:  # the agents' answer follows the schema
        assert "celsius" in sent[-1] and "get_weather" in sent[-1]
    else:  # the agents decided to answer; the synthesis or the judge wrote it, under the caller's schema alone
        assert "get_weather" in sent[0] and "get_weather" not in sent[-1] and "celsius" in sent[-1]
        result = httpx.get(f"{server.url}/v1/debates/{(final.model_extra or {})['moot']['debate_id']}").json()
        assert result["result"]["decision"]["action"] == {"type": "answer"}
    # the Responses API, likewise; and a typed answer without tools (LangChain's with_structured_output)
    parsed = client.responses.parse(
        model=model,
        input=[
            *messages[:1],
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": '{"celsius": 21}'},
        ],
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "parameters": STRICT_WEATHER["function"]["parameters"],
                "strict": True,
            }
        ],
        text_format=Weather,
    )
    assert parsed.output_parsed == Weather(city="Paris", celsius=21)
    # streamed: the call as one chunk's tool_calls; then the typed answer as content
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "Weather", "schema": Weather.model_json_schema()}}
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages[:1], tools=[STRICT_WEATHER], response_format=fmt, stream=True
        )
    )
    streamed_calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(streamed_calls) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=messages, tools=[STRICT_WEATHER], response_format=fmt, stream=True
        )
        if c.choices
    )
    assert Weather.model_validate_json(text) == Weather(city="Paris", celsius=21)
    alone = client.chat.completions.parse(model=model, messages=messages[:1], response_format=Weather)
    assert alone.choices[0].message.parsed == Weather(city="Paris", celsius=21)
    card = client.models.retrieve(model).model_extra or {}
    assert card["accepts_tools"] is True and card["accepts_typed_output"] is True


@pytest.mark.parametrize("model", ["moot/affirmative-critical", "moot/panel"])
def test_agent_clients_get_tools_and_a_typed_answer_from_a_synthesis_or_a_judge(
    make_server: MakeServer, model: str
) -> None:
    """Issue 41 b: the four clients that send tools with a typed answer, on a synthesis and on a judge:
    each loop is one debate that calls the tool, then one whose synthesis or judge writes the typed
    answer; bounded by its debates and calls, not by time."""
    agents = pytest.importorskip("agents", reason="openai-agents is a dev dependency")
    pytest.importorskip("langgraph", reason="langgraph is an extra of the dev install")
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: int

    server, fake = make_server(reply=typed_agent)
    planned = openai.OpenAI(base_url=server.url + "/v1", api_key="unused").models.retrieve(model).model_extra or {}
    calls_per_debate = planned["calls"]
    question = "What is the weather in Paris?"

    def bounded(debates: int, before: tuple[int, int]) -> None:
        assert debate_count(server) - before[0] == debates
        assert len(fake.requests) - before[1] <= debates * calls_per_debate

    def mark() -> tuple[int, int]:
        return debate_count(server), len(fake.requests)

    # the OpenAI Agents SDK: output_type with a tool
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "21 C and sunny"

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="weather",
        instructions="Give the weather.",
        tools=[get_weather],
        output_type=Weather,
        model=agents.OpenAIChatCompletionsModel(model=model, openai_client=client),
    )
    before = mark()
    assert agents.Runner.run_sync(agent, question, max_turns=4).final_output == Weather(city="Paris", celsius=21)
    bounded(2, before)

    @tool("get_weather")
    def get_weather_lc(city: str) -> str:
        """The current weather in a city."""
        return "21 C and sunny"

    chat = ChatOpenAI(model=model, base_url=server.url + "/v1", api_key="unused", max_retries=0)
    # LangGraph's ReAct agent with a typed response: the tool loop, then its typed call (no tools)
    before = mark()
    state = create_react_agent(chat, tools=[get_weather_lc], response_format=Weather).invoke(
        {"messages": [("user", question)]}, {"recursion_limit": 8}
    )
    assert state["structured_response"] == Weather(city="Paris", celsius=21)
    bounded(3, before)
    # LangChain's with_structured_output with the tools bound: a tool call, then the typed answer
    typed = chat.with_structured_output(Weather, tools=[get_weather_lc], strict=True, include_raw=True)
    before = mark()
    first = typed.invoke(question)
    assert first["parsed"] is None and first["raw"].tool_calls[0]["name"] == "get_weather"
    result = ToolMessage("21 C and sunny", tool_call_id=first["raw"].tool_calls[0]["id"])
    second = typed.invoke([("user", question), first["raw"], result])
    assert second["parsed"] == Weather(city="Paris", celsius=21)
    bounded(2, before)


# ------------------------------------------------------------- the clients of the clients table

CLIENT_MODELS = ["moot/vote", "moot/affirmative-critical"]


@pytest.mark.parametrize("model", CLIENT_MODELS)
def test_pydantic_ai_with_a_tool_and_a_typed_output(make_server: MakeServer, model: str) -> None:
    """pydantic-ai's agent loop, its output typed by NativeOutput (response_format) and by
    PromptedOutput (the schema in its instructions, json_object), a tool called through the debate."""
    pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim is in the clients extra")
    from pydantic import BaseModel
    from pydantic_ai import Agent, NativeOutput, PromptedOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Weather(BaseModel):
        city: str
        celsius: int

    server, _ = make_server(reply=typed_agent)
    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=server.url + "/v1", api_key="unused"))
    ran: list[str] = []

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        ran.append(city)
        return "21 C and sunny"

    for output in (NativeOutput(Weather), PromptedOutput(Weather)):
        agent = Agent(chat, output_type=output, instructions="Give the weather.", tools=[get_weather])
        before, ran[:] = debate_count(server), []
        assert agent.run_sync("What is the weather in Paris?").output == Weather(city="Paris", celsius=21), output
        assert ran == ["Paris"] and debate_count(server) - before == 2


def react_agent(request: dict[str, Any]) -> str:
    """Each agent of a text-ReAct client (smolagents): calls get_weather, then, its observation in
    the conversation, the client's final_answer tool."""
    schema = json.dumps(request.get("response_format"))
    if "get_weather" in schema and "21 C and sunny" not in json.dumps(request.get("messages")):
        return json.dumps({"reasoning": "I need the weather", "do": "get_weather", "arguments": {"city": "Paris"}})
    return json.dumps({"reasoning": "the tool said so", "do": "final_answer", "arguments": {"answer": "21 C in Paris"}})


@pytest.mark.parametrize("model", CLIENT_MODELS)
def test_smolagents_tool_calling_agent(make_server: MakeServer, model: str) -> None:
    """smolagents' ToolCallingAgent (tool_choice required; its own final_answer tool ends the run)
    sends a tool's result back as a user message, "Observation: ...": the debate's question stays
    the task, not the observation."""
    pytest.importorskip("smolagents", reason="smolagents is in the clients extra")
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city.
        """
        return "21 C and sunny"

    server, _ = make_server(reply=react_agent)
    chat = OpenAIServerModel(model_id=model, api_base=server.url + "/v1", api_key="unused")
    agent = ToolCallingAgent(tools=[get_weather], model=chat, max_steps=4, verbosity_level=0)
    assert agent.run("What is the weather in Paris?") == "21 C in Paris"
    debates = httpx.get(server.url + "/v1/debates").json()["debates"]
    assert len(debates) == 2
    tasks = [httpx.get(f"{server.url}/v1/debates/{d['id']}").json()["result"]["task"] for d in debates]
    assert all(t["question"].endswith("What is the weather in Paris?") for t in tasks), tasks
    second = max(tasks, key=lambda t: len(t["context"]))
    assert second["context"][-1]["text"].startswith("Observation:")  # the result read, last


def test_a_tool_result_sent_as_text_is_not_the_question(make_server: MakeServer) -> None:
    server, _ = make_server(reply=weather_agent)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "Calling tools:\n[{'id': 'c1', 'function': {'name': 'get_weather'}}]"},
        {"role": "user", "content": "Observation:\n21 C and sunny"},
    ]
    reply = client.chat.completions.create(model="moot/vote", messages=messages)
    task = httpx.get(f"{server.url}/v1/debates/{(reply.model_extra or {})['moot']['debate_id']}").json()["result"]
    assert task["task"]["question"] == "What is the weather in Paris?"
    assert task["task"]["context"][-1] == {"text": "Observation:\n21 C and sunny", "source": "user"}
    # a first message that is an observation has nothing before it to ask: it stays the question
    alone = client.chat.completions.create(model="moot/vote", messages=messages[2:])
    again = httpx.get(f"{server.url}/v1/debates/{(alone.model_extra or {})['moot']['debate_id']}").json()["result"]
    assert again["task"]["question"] == "Observation:\n21 C and sunny"


def adder(request: dict[str, Any]) -> str:
    """Each agent of Inspect's react(): add(2, 3), then, its result read, react's own submit tool."""
    if "the result of the tool call" not in json.dumps(request.get("messages")):
        return json.dumps({"reasoning": "add them", "do": "add", "arguments": {"x": 2, "y": 3}})
    return json.dumps({"reasoning": "the tool said 5", "do": "submit", "arguments": {"answer": "5"}})


@pytest.mark.parametrize("model", CLIENT_MODELS)
def test_inspect_react_agent_calls_a_tool_through_the_debate(
    make_server: MakeServer, model: str, tmp_path: Any, monkeypatch: Any
) -> None:
    """Inspect AI's react() agent on /v1/responses: its tool, then its submit tool, each a debate."""
    pytest.importorskip("inspect_ai", reason="inspect-ai is a dev dependency")
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.agent import react
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import includes
    from inspect_ai.tool import Tool, tool

    @tool
    def add() -> Tool:
        async def execute(x: int, y: int) -> int:
            """Add two numbers.

            Args:
                x: The first number.
                y: The second number.
            """
            return x + y

        return execute

    server, _ = make_server(reply=adder)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    task = Task(
        dataset=[Sample(input="What is 2 + 3?", target="5")],
        solver=react(tools=[add()]),
        scorer=includes(),
        message_limit=12,
    )
    log = inspect_eval(task, model=get_model(f"openai/{model}", memoize=False), log_dir=str(tmp_path), display="none")
    assert log[0].status == "success", log[0].error
    assert log[0].results is not None and log[0].results.scores[0].metrics["accuracy"].value == 1.0
    assert debate_count(server) == 2  # the call of add, then the call of submit

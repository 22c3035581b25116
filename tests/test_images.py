"""Images shown with the question: the task's images go to every agent and to a decision that calls
a model, as ``image_url`` parts, on a model that may be sent them; a text-only model is refused
before any call; the OpenAI doors and the debates API read image parts, and refuse bad ones by place."""

# ruff: noqa: F811  (make_server is a fixture of test_serve_api, imported)
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import ValidationError

from moot.core.budget import input_problem
from moot.core.engine import Engine
from moot.core.spec import Budget
from moot.core.types import DebateResult, DebateTask
from moot.models.base import ChatRequest, Message, ModelConfigError, chat_payload, messages_tokens
from moot.models.images import IMAGE_TOKENS, MAX_IMAGES, ImageInput
from moot.models.openai_compat import OpenAICompatModel
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset
from test_serve_api import MakeServer, finished, make_server  # noqa: F401  (the fixture)

#: A 1x1 PNG, inline.
PNG = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
WEB = "https://a.b/c.png"
QUESTION = "What colour is the dot in the image?"


class TextOnly(ScriptedModel):
    reads_images = False


def image_parts(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The image_url parts of a chat-completions request body, in order."""
    return [
        part
        for message in request["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if part["type"] == "image_url"
    ]


# ------------------------------------------------------------------------------------ the models


def test_a_message_without_images_is_written_as_before() -> None:
    plain = Message(role="user", content="hi")
    assert plain.model_dump_json() == '{"role":"user","content":"hi"}'
    assert DebateTask(question="q").model_dump() == {"question": "q", "context": [], "reference": None}
    shown = Message(role="user", content="hi", images=(ImageInput(url=PNG),))
    assert Message.model_validate_json(shown.model_dump_json()) == shown


def test_images_go_as_image_url_parts_after_the_text() -> None:
    request = ChatRequest(
        messages=[
            Message(role="system", content="Be brief."),
            Message(
                role="user",
                content="Look.",
                images=(ImageInput(url=PNG), ImageInput(url="https://a.b/c.png", detail="low")),
            ),
        ]
    )
    payload = chat_payload(request, model="m")
    assert payload["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look."},
                {"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
                {"type": "image_url", "image_url": {"url": WEB, "detail": "low"}},
            ],
        },
    ]
    without = [request.messages[0], Message(role="user", content="Look.")]
    assert messages_tokens(request.messages) == messages_tokens(without) + 2 * IMAGE_TOKENS


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("file:///etc/passwd", "neither an https:// address"),
        ("ftp://host/x.png", "neither an https:// address"),
        ("https://", "neither an https:// address"),
        ("https://a b/x.png", "neither an https:// address"),
        ("data:image/svg+xml;base64,AAAA", "png, jpeg, gif, webp"),
        ("data:image/png,rawbytes", "png, jpeg, gif, webp"),
        ("data:text/plain;base64,AAAA", "png, jpeg, gif, webp"),
    ],
)
def test_an_image_is_an_address_or_an_inline_image(url: str, said: str) -> None:
    with pytest.raises(ValidationError, match=said.replace("+", r"\+")):
        ImageInput(url=url)


def test_an_inline_jpg_is_a_jpeg() -> None:
    """Many clients write image/jpg, which is not a registered type (a review's)."""
    jpeg = "/9j/4AAQSkZJRgABAQ"  # (a JPEG's first bytes)
    assert ImageInput(url=f"data:image/jpg;base64,{jpeg}").url == f"data:image/jpeg;base64,{jpeg}"


def test_an_inline_image_is_checked_by_its_bytes_where_it_comes_in_not_where_it_is_read_back(
    make_server: MakeServer, tmp_path: Any
) -> None:
    """ "hello" labelled PNG went to every agent, and the model's server refused it after the debate's other
    calls were paid for (an outside trial's). Its bytes are checked where it comes in; a transcript
    stored before is read back as it is (it stopped a server's start: a review's), and a real image of
    another type than its label goes on (a model's server reads its bytes)."""
    from moot.models.images import image_given_problem

    hello = "data:image/png;base64,aGVsbG8gbm90IGFuIGltYWdl"
    assert image_given_problem(hello) == "the data holds no png, jpeg, gif, webp image; give the image's own bytes"
    assert image_given_problem("data:image/jpeg;" + PNG.split(";", 1)[1]) is None
    assert image_given_problem("data:image/png;base64," + " \n" * 150 + PNG.split(",", 1)[1]) is None
    assert ImageInput(url=hello).url == hello  # (a stored one is read back)
    server, fake = make_server()
    parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": hello}}]
    body = {"model": "moot/single", "messages": [{"role": "user", "content": parts}]}
    error = httpx.post(server.url + "/v1/chat/completions", json=body).json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url" and "holds no png" in error["message"]
    made = httpx.post(
        server.url + "/v1/debates", json={"protocol": "single", "question": QUESTION, "images": [{"url": hello}]}
    )
    assert made.status_code == 400 and "image 1: the data holds no png" in made.text, made.text
    assert fake.requests == []
    with pytest.raises(ModelConfigError, match="image 1: the data holds no"):
        asyncio.run(
            Engine(get_preset("single"), ScriptedModel(["x"])).run(
                DebateTask(question=QUESTION, images=[ImageInput(url=hello)])
            )
        )


def test_a_text_only_model_is_never_sent_an_image() -> None:
    model = TextOnly(["never"])
    request = ChatRequest(messages=[Message(role="user", content="Look.", images=(ImageInput(url=PNG),))])
    with pytest.raises(ModelConfigError, match=r"reads text only, and 1 image would be shown to it: give a model"):
        asyncio.run(model.complete(request))
    assert model.requests == []


# ------------------------------------------------------------------------------------ the engine


def run(spec_name: str, model: ScriptedModel, task: DebateTask, **params: Any) -> DebateResult:
    return asyncio.run(Engine(get_preset(spec_name, **params), model).run(task))


def test_every_agent_and_the_synthesis_are_shown_the_images_with_the_question() -> None:
    task = DebateTask(question=QUESTION, images=[ImageInput(url=PNG), ImageInput(url="https://a.b/c.png")])
    model = ScriptedModel(["It is red."] * 20)
    result = run("affirmative-critical", model, task, rounds=2)
    assert len(model.requests) == 5 and result.status == "complete", result.error
    for request in model.requests:  # each prompt's question carries the images, once
        shown = [m for m in request.messages if m.images]
        assert len(shown) == 1 and shown[0].role == "user" and QUESTION in shown[0].content
        assert [i.url for i in shown[0].images] == [PNG, "https://a.b/c.png"]
    # The transcript records what each turn was sent, the images included; the task keeps them.
    again = DebateResult.model_validate_json(result.to_json())
    assert again.task.images == task.images
    assert all(any(m.images for m in t.messages) for r in again.rounds for t in r.turns)


def test_a_conversation_shows_the_images_in_its_first_message_only() -> None:
    """A conversation history (society of minds, after Du et al. 2023) sends the question once, then
    the agent's replies: the images go with that first message, not with each later one."""
    model = ScriptedModel(["It is red."] * 20)
    task = DebateTask(question=QUESTION, images=[ImageInput(url=PNG)])
    run("society-of-minds", model, task)
    later = [r for r in model.requests if sum(m.role == "assistant" for m in r.messages)]
    assert later, "the second round continues each conversation"
    for request in later:
        assert [bool(m.images) for m in request.messages].count(True) == 1
        assert request.messages[1].images and request.messages[1].role == "user"


def test_a_text_only_model_is_refused_before_any_call() -> None:
    spec = get_preset("affirmative-critical")
    task = DebateTask(question=QUESTION, images=[ImageInput(url=PNG)])
    blind = TextOnly(["never"])
    problem = input_problem(spec, task, {p.id: blind for p in spec.participants}, blind)
    assert problem is not None and "reads text only, and 1 image would be shown to it" in problem
    seeing = ScriptedModel(["x"])
    assert input_problem(spec, task, {p.id: seeing for p in spec.participants}, seeing) is None
    # The decision's model counts too, when the decision calls one.
    assert input_problem(spec, task, {p.id: seeing for p in spec.participants}, blind) is not None


def test_images_count_in_the_prompt_budget() -> None:
    spec = get_preset("single")
    models = {p.id: ScriptedModel(["x"]) for p in spec.participants}
    plain = DebateTask(question=QUESTION)
    assert input_problem(spec, plain, models) is None
    fits = spec.model_copy(update={"budget": Budget(max_prompt_tokens=200)})
    assert input_problem(fits, plain, models) is None
    many = plain.model_copy(update={"images": [ImageInput(url=PNG)] * 3})
    problem = input_problem(fits, many, models)
    assert problem is not None and problem.startswith("the images and ")


# ------------------------------------------------------------------------------------ the server


def test_chat_and_responses_show_image_parts_to_every_agent(make_server: MakeServer) -> None:
    server, fake = make_server(image_urls=True)  # (an address too: the model's server fetches it)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="moot/affirmative-critical",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": QUESTION},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                ],
            }
        ],
    )
    assert chat.choices[0].message.content
    assert len(fake.requests) == 5  # two rounds of two agents, and the synthesis: each shown the image
    for request in fake.requests:
        assert image_parts(request) == [{"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}]
    before = len(fake.requests)
    response = client.responses.create(
        model="moot/vote",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": QUESTION},
                    {"type": "input_image", "image_url": "https://example.com/dot.png", "detail": "auto"},
                ],
            }
        ],
    )
    assert response.status == "completed"
    sent = fake.requests[before:]
    assert sent and all(
        image_parts(r) == [{"type": "image_url", "image_url": {"url": "https://example.com/dot.png", "detail": "auto"}}]
        for r in sent
    )
    # The stored debate records what each agent was sent, the image included.
    stored = httpx.get(f"{server.url}/v1/responses/{response.id}/input_items").json()["data"]
    assert "https://example.com/dot.png" in json.dumps(stored)


def test_the_older_chat_form_and_the_debates_api_show_images_too(make_server: MakeServer) -> None:
    server, fake = make_server()
    parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": PNG}]
    body = {"model": "moot/single", "messages": [{"role": "user", "content": parts}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert image_parts(fake.requests[-1]) == [{"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}}]
    made = httpx.post(
        server.url + "/v1/debates",
        json={"protocol": "single", "question": QUESTION, "images": [{"url": PNG, "detail": "high"}]},
    )
    assert made.status_code == 202, made.text
    with httpx.stream("GET", f"{server.url}/v1/debates/{made.json()['id']}/events", timeout=60) as events:
        for _ in events.iter_lines():
            pass
    result = httpx.get(f"{server.url}/v1/debates/{made.json()['id']}").json()["result"]
    assert result["task"]["images"] == [{"url": PNG, "detail": "high"}]
    assert image_parts(fake.requests[-1]) == [{"type": "image_url", "image_url": {"url": PNG, "detail": "high"}}]
    refused = httpx.post(
        server.url + "/v1/debates", json={"protocol": "single", "question": QUESTION, "images": [{"url": "file:///x"}]}
    )
    assert refused.status_code in (400, 422) and "images" in json.dumps(refused.json())


@pytest.mark.parametrize(
    ("content", "param", "said"),
    [
        ([{"type": "input_image", "file_id": "file-1"}], "input[0].content[0].file_id", "keeps no uploaded files"),
        ([{"type": "input_image"}], "input[0].content[0].image_url", "give the image's https address"),
        (
            [{"type": "input_image", "image_url": PNG, "detail": "max"}],
            "input[0].content[0].detail",
            "low, high or auto",
        ),
        # An address is fetched by the model's server, from its network: refused unless --image-urls
        # (it was passed on: a review's, session 37).
        (
            [{"type": "input_image", "image_url": "http://169.254.169.254/latest"}],
            "input",
            "takes images sent inline only (a data:image/...;base64 URL)",
        ),
        (
            [{"type": "input_file", "file_data": PNG, "filename": "dot.png"}],
            "input[0].content[0]",
            "send an image as an image part (input_image",
        ),
    ],
)
def test_a_bad_image_part_is_refused_by_its_place(
    make_server: MakeServer, content: list[dict[str, Any]], param: str, said: str
) -> None:
    server, fake = make_server()
    parts = [*content, {"type": "input_text", "text": QUESTION}]
    body = {"model": "moot/single", "input": [{"role": "user", "content": parts}]}
    response = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and said in error["message"], error
    assert fake.requests == []


def test_too_many_images_and_a_text_only_model_are_refused_before_any_call(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, fake = make_server()
    many = [{"type": "image_url", "image_url": {"url": PNG}}] * (MAX_IMAGES + 1)
    parts = [{"type": "text", "text": QUESTION}, *many]
    body = {"model": "moot/single", "messages": [{"role": "user", "content": parts}]}
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
    assert f"over the {MAX_IMAGES} a debate shows" in response.json()["error"]["message"]
    monkeypatch.setattr(OpenAICompatModel, "reads_images", False)
    body["messages"][0]["content"] = body["messages"][0]["content"][:2]
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "messages", error
    assert "openai:fake reads text only, and 1 image would be shown to it" in error["message"]
    assert fake.requests == []


# ------------------------------------------------------------------------------------ the CLI


def test_moot_debate_shows_an_image_file_inline_and_refuses_a_text_only_model_before_any_call(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    from typer.testing import CliRunner

    from moot.cli.main import app

    runner = CliRunner()
    png = base64.b64decode(PNG.split(",", 1)[1])
    (tmp_path / "dot.png").write_bytes(png)
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([{"reasoning": "r", "answer": "red", "confidence": 0.9}] * 3), encoding="utf-8")
    out = tmp_path / "result.json"
    args = ["debate", QUESTION, "-p", "single", "-m", f"scripted:{replies}", "--image", str(tmp_path / "dot.png")]
    ran = runner.invoke(app, [*args, "--image", WEB, "--json", str(out), "--quiet"])
    assert ran.exit_code == 0, ran.output
    result = DebateResult.model_validate_json(out.read_text(encoding="utf-8"))
    assert [i.url for i in result.task.images] == [PNG, WEB]
    assert [i.url for i in result.rounds[0].turns[0].messages[1].images] == [PNG, WEB]
    for bad, said in (
        ([str(tmp_path / "none.png")], "no such file"),
        ([str(replies)], "not a PNG, JPEG, GIF or WebP image"),
        (["https://a b"], "neither an https:// address"),
    ):
        refused = runner.invoke(app, [*args[:6], "--image", *bad])
        assert refused.exit_code == 2 and said in refused.output and "Traceback" not in refused.output, refused.output
    monkeypatch.setattr(ScriptedModel, "reads_images", False)
    blind = runner.invoke(app, args)
    assert blind.exit_code == 2 and "reads text only, and 1 image would be shown to it" in blind.output, blind.output


def test_the_library_refuses_a_text_only_model_before_any_call() -> None:
    """The library ran the debate: a text-only voter was dropped with a warning, a text-only decision
    failed once every other call was paid for (a review's, session 37)."""
    from moot.core import Engine as LibraryEngine

    spec = get_preset("society-of-minds")
    seeing, blind = ScriptedModel(["x"] * 9), TextOnly(["x"] * 9)
    task = DebateTask(question=QUESTION, images=[ImageInput(url=PNG)])
    engine = LibraryEngine(spec, seeing, models={"agent2": blind})
    with pytest.raises(ModelConfigError, match="reads text only, and 1 image would be shown to it"):
        asyncio.run(engine.run(task))
    assert seeing.requests == [] and blind.requests == []


def test_an_image_sent_after_the_question_in_its_own_message_is_shown_with_that_question(
    make_server: MakeServer,
) -> None:
    """ "Describe the next image", then a message with the image alone, was refused: "give at least one user
    message with text" (a review's, session 37)."""
    server, fake = make_server()
    image = {"type": "image_url", "image_url": {"url": PNG}}
    messages = [{"role": "user", "content": QUESTION}, {"role": "user", "content": [image]}]
    body = {"model": "moot/single", "messages": messages}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    sent = fake.requests[-1]["messages"]
    assert QUESTION in json.dumps(sent) and image_parts(fake.requests[-1])[0]["image_url"]["url"] == PNG
    alone = {"model": "moot/single", "messages": [{"role": "user", "content": [image]}]}
    refused = httpx.post(server.url + "/v1/chat/completions", json=alone, timeout=60)
    assert refused.status_code == 400 and "shows images without text" in refused.text
    # Not an earlier question already answered (a review's): the image comes right after its question.
    answered = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    body = {"model": "moot/single", "messages": [*answered, {"role": "user", "content": [image]}]}
    refused = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400 and "say what to do with them" in refused.text


def test_an_image_in_a_tools_result_is_refused_by_its_place_not_pasted_as_text(make_server: MakeServer) -> None:
    """A function_call_output holding an input_image reached the model as its JSON, as text: past every
    image check (an outside trial's, session 37). Its text parts are the result."""
    server, fake = make_server()
    call = {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"}
    image = {"type": "input_image", "image_url": PNG}
    for output, status in (([image], 400), ([{"type": "input_text", "text": "it is red"}], 200)):
        result = {"type": "function_call_output", "call_id": "c1", "output": output}
        body = {"model": "moot/single", "input": [{"role": "user", "content": QUESTION}, call, result]}
        response = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert response.status_code == status, response.text
        if status == 400:
            assert response.json()["error"]["param"] == "input[2].output[0]" and fake.requests == []
    sent = json.dumps(fake.requests[-1]["messages"])
    assert "(the result of the tool call c1:)\\nit is red" in sent and "input_text" not in sent
    # A list of the tool's own records is its JSON, read as text (it was refused as parts: a review's).
    records = {"type": "function_call_output", "call_id": "c1", "output": [{"name": "Bob", "age": 3}]}
    body = {"model": "moot/single", "input": [{"role": "user", "content": QUESTION}, call, records]}
    assert httpx.post(server.url + "/v1/responses", json=body, timeout=60).status_code == 200
    assert "Bob" in json.dumps(fake.requests[-1]["messages"])


def test_an_image_part_of_the_other_api_is_named_as_such(make_server: MakeServer) -> None:
    """An input_image part on chat completions was told "a debate reads text and images only ... (a
    transcript of the audio)" (an outside trial's, session 37); and "an image in a assistant message"."""
    server, _ = make_server()
    parts = [{"type": "text", "text": QUESTION}, {"type": "input_image", "image_url": PNG}]
    body = {"model": "moot/single", "messages": [{"role": "user", "content": parts}]}
    error = httpx.post(server.url + "/v1/chat/completions", json=body).json()["error"]
    assert error["message"] == (
        "messages[0].content[1]: an input_image part is the Responses API's; give an image here as an image_url part"
    )
    pictured = [{"type": "image_url", "image_url": PNG}]
    said = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": pictured}]
    error = httpx.post(server.url + "/v1/chat/completions", json={"model": "moot/single", "messages": said}).json()
    assert "an image in an assistant message" in error["error"]["message"], error


def test_an_image_address_stored_redacted_is_not_sent_on_broken(make_server: MakeServer) -> None:
    """An address holding something shaped like a key is stored redacted (secrets are never stored); a
    chain continuing from it sent the model the broken address (an outside trial's, session 37)."""
    server, fake = make_server(image_urls=True)
    keyed = "https://cdn.example.com/uploads/sk-abcdefghijklmnop1234.png"
    parts = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": keyed}]
    first = httpx.post(
        server.url + "/v1/responses", json={"model": "moot/single", "input": [{"role": "user", "content": parts}]}
    )
    assert first.status_code == 200 and image_parts(fake.requests[-1])[0]["image_url"]["url"] == keyed
    calls = len(fake.requests)
    again = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/single", "input": "And its shape?", "previous_response_id": first.json()["id"]},
    )
    assert again.status_code == 400 and "send the image again" in again.json()["error"]["message"], again.text
    assert len(fake.requests) == calls


def test_a_signed_image_address_reaches_the_model_whole_and_is_stored_without_its_signature(
    make_server: MakeServer,
) -> None:
    """A signed URL's credentials (its query's signature, a key given as ``?key=``) are a secret: the
    model's server gets the address whole, the store keeps it redacted (an outside attack, session 38:
    it was stored as given), and the debate's result says so."""
    server, fake = make_server(image_urls=True)
    signature = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    signed = f"https://bucket.example.com/cat.png?X-Amz-Expires=300&X-Amz-Signature={signature}"
    debate = httpx.post(
        server.url + "/v1/debates", json={"question": QUESTION, "protocol": "single", "images": [{"url": signed}]}
    )
    assert debate.status_code == 202, debate.text
    debate_id = debate.json()["id"]
    assert finished(server.url, debate_id)["status"] == "complete"
    assert image_parts(fake.requests[-1])[0]["image_url"]["url"] == signed
    db = server.settings.db
    assert db is not None
    stored = b"".join(f.read_bytes() for f in db.parent.glob(db.name + "*"))  # the database and its WAL
    assert b"X-Amz-Signature=***" in stored and signature.encode() not in stored
    result = httpx.get(f"{server.url}/v1/debates/{debate_id}/result").json()
    assert result["task"]["images"][0]["url"].endswith("&X-Amz-Signature=***")

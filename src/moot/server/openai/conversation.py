"""A request's messages read as a debate reads them: the text of each message (its inline files as
passages), the caller's instructions apart, and the question (a bare continuation nudge is not one)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pydantic import ValidationError

from moot.core.types import ContextChunk, Persona
from moot.models.images import MAX_IMAGES, ImageInput, image_given_problem
from moot.server.limits import RequestError
from moot.server.openai import input_files
from moot.server.openai.refusals import shown
from moot.server.policy import attach


class Split(NamedTuple):
    """A request's messages as its debate reads them (``chat.split_messages``, ``split_input``)."""

    question: str
    context: list[ContextChunk]
    images: list[ImageInput]


def _a(word: str) -> str:
    return "an" if word[:1] in tuple("aeiou") else "a"


def shown_images(images: list[ImageInput], field: str) -> list[ImageInput]:
    """The images of a request's messages (``field``), at most :data:`~moot.models.base.MAX_IMAGES`."""
    if len(images) > MAX_IMAGES:
        raise RequestError(
            f"{field}: {len(images)} images in the conversation (those of the responses a previous_response_id "
            f"continues count too), over the {MAX_IMAGES} a debate shows (each goes to every agent's prompt); send "
            "fewer, or start a new conversation",
            param=field,
        )
    return images


class Content(NamedTuple):
    """A message's content as a debate reads it."""

    text: str
    #: A passage for each file the message sends inline, its text read before the debate.
    files: list[ContextChunk]
    #: The images it shows, in order (shown with the question to every agent).
    images: list[ImageInput]


def content_text(
    content: str | list[dict[str, Any]] | None, where: str, text_types: frozenset[str], file_type: str, role: str
) -> Content:
    """The text of a ``role`` message's content; a passage for each file it sends inline (``file_type``:
    the Responses API's ``input_file`` part, chat completions' ``file`` part, whose file is its
    ``file`` object), its text read before the debate (:func:`~moot.server.openai.input_files.file_passage`);
    and the images a user message shows (the Responses API's ``input_image`` part, chat completions'
    ``image_url``), by address or inline, never fetched here (:func:`image_of`). Any other part (audio)
    is refused by its place: a debate reads text and images only, and dropping the part would debate
    another question."""
    if content is None:
        return Content("", [], [])
    if isinstance(content, str):
        return Content(content, [], [])
    texts: list[str] = []
    files: list[ContextChunk] = []
    images: list[ImageInput] = []
    image_type = "image_url" if file_type == "file" else "input_image"
    for j, part in enumerate(content):
        kind = part.get("type")
        if isinstance(kind, str) and kind in text_types:
            texts.append(str(part.get("text", part.get("refusal", ""))))
            continue
        if kind == image_type:
            images.append(image_of(part, f"{where}[{j}]", role, nested=image_type == "image_url"))
            continue
        if kind == file_type:
            nested = file_type == "file"
            inner = part.get("file") if nested else part
            place = f"{where}[{j}].file" if nested else f"{where}[{j}]"
            if not isinstance(inner, dict):
                raise RequestError(f"{place}: give the file as an object (file_data and filename)", param=place)
            try:
                files.append(input_files.file_passage(inner, place))
            except input_files.FileProblem as exc:
                raise RequestError(str(exc), param=exc.param) from None
            continue
        named = shown(kind) if kind else "untyped"
        if kind in ("image_url", "input_image"):  # the other API's image part
            raise RequestError(
                f"{where}[{j}]: an {kind} part is the {'Responses' if kind == 'input_image' else 'chat completions'} "
                f"API's; give an image here as an {image_type} part",
                param=f"{where}[{j}]",
            )
        raise RequestError(
            f"{where}[{j}]: {_a(named)} {named} part; a debate reads text and images only, so send the content as "
            f"text (audio: a transcript), an image as an {image_type} part, or a file inline as {_a(file_type)} "
            f"{file_type} part with file_data",
            param=f"{where}[{j}]",
        )
    return Content("\n".join(texts), files, images)


def image_of(part: dict[str, Any], place: str, role: str, *, nested: bool) -> ImageInput:
    """An image part as the image it shows: the Responses API's ``{type: input_image, image_url,
    detail}`` or chat completions' ``{type: image_url, image_url: {url, detail}}`` (``nested``). Its
    address goes to the model's server as it is: this server never fetches it."""
    if role != "user":
        raise RequestError(
            f"{place}: an image in {_a(role)} {role} message; images are shown with the question, so send it in a "
            "user message",
            param=place,
        )
    inner = part.get("image_url") if nested else part
    if nested and isinstance(inner, str):  # (the older form some clients still send: the URL alone)
        inner = {"url": inner}
    field = f"{place}.image_url" if nested else place
    if not isinstance(inner, dict):
        raise RequestError(f"{field}: give the image as an object (url, and detail if you like)", param=field)
    url_key = "url" if nested else "image_url"
    if not nested and inner.get("file_id") is not None:
        raise RequestError(
            f"{place}.file_id: this server keeps no uploaded files; give the image in image_url, as a "
            "data:image/...;base64 URL or its https address",
            param=f"{place}.file_id",
        )
    address = f"{place}.image_url.url" if nested else f"{place}.image_url"
    url, detail = inner.get(url_key), inner.get("detail")
    if not isinstance(url, str):
        raise RequestError(f"{address}: give the image's https address or a data:image/...;base64 URL", param=address)
    try:
        image = ImageInput(url=url, detail="auto" if detail is None else detail)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["loc"] == ("url",):
            raise RequestError(f"{address}: {str(error['msg']).removeprefix('Value error, ')}", param=address) from None
        raise RequestError(f"{field}.detail: give low, high or auto", param=f"{field}.detail") from None
    if (problem := image_given_problem(image.url)) is not None:
        raise RequestError(f"{address}: {problem}", param=address)
    return image


# ------------------------------------------------------------------------ the caller's messages


def tool_call_text(name: Any, arguments: Any, call_id: Any) -> str:
    """A tool call an assistant made (chat's ``tool_calls``, a Responses ``function_call`` item), as
    words every agent reads."""
    return f"(called the tool {name} with {arguments}, call id {call_id})"


def tool_result_header(call_id: Any) -> str:
    """The line before a tool's result (a chat ``tool`` message, a ``function_call_output`` item)."""
    return f"(the result of the tool call {call_id}:)"


def question_and_context(
    messages: list[tuple[str, str]],
    files: list[list[ContextChunk]],
    shown: list[list[ImageInput]],
    field: str,
    context: list[ContextChunk],
) -> Split:
    """A conversation's question, the last user message (a 400 naming ``field`` when there is none
    with text), its context: ``context``, then the other messages with text, each followed by its
    inline files (``files``, by message), the question's own files last of all; and the images the
    messages show (``shown``, by message; :func:`shown_images`). A last user message that shows
    images alone asks what the user message right before it asks: "Describe the next image", then
    the image."""
    users = [i for i, (role, _) in enumerate(messages) if role == "user"]
    last = users[-1] if users else None
    if last is not None and shown[last] and not messages[last][1].strip():
        asked = last - 1  # the user message right before it, which says what to do with the image
        if asked < 0 or messages[asked][0] != "user" or not messages[asked][1].strip():
            raise RequestError(
                f"{field}: the last user message shows images without text; say what to do with them, in it or "
                "in a user message right before it",
                param=field,
            )
        last = asked
    if last is None or not messages[last][1].strip():
        raise RequestError(f"{field}: give at least one user message with text (the question)", param=field)
    context = list(context)
    for i, (role, text) in enumerate(messages):
        if i != last:
            context += [ContextChunk(text=text, source=role)] if text.strip() else []
            context += files[i]
    images = shown_images([image for some in shown for image in some], field)
    return Split(messages[last][1], context + [attach(f) for f in files[last]], images)


def instructed(persona: Persona, instructions: str) -> Persona:
    """``persona`` with the caller's instructions after its own (its whole system prompt then)."""
    own = persona.system_prompt()
    text = f"{own}\n\nThe instructions of the one who asks:\n{instructions}" if own else instructions
    return persona.model_copy(update={"instructions": text})


#: A bare continuation nudge an agent loop sends after a tool's result or its own turn ("please
#: proceed", "continue", "go on"): no question of its own. Inspect's ``react()`` and
#: ``basic_agent()`` send "Please proceed to the next step using your best judgement.", then "If
#: you believe you have completed the task, please call the `submit()` tool with your final answer.":
#: the nudge, then the sentence that says how to end (an agent's own tool to call when done; any
#: other second sentence, "If you finish early, also write tests", is an instruction: the question).
_NUDGE = re.compile(
    r"(?:(?:ok(?:ay)?|yes|sure|thanks?|thank you|good|great)[,.!]*\s+)?(?:please\s+)?"
    r"(?:proceed|continue|go on|go ahead|carry on|keep going|resume|next(?: step)?|do it|next one)"
    r"(?:\s+(?:please|then|now|to the next step|with (?:the|your|that) (?:task|work|plan|next step|answer)"
    r"|(?:using|with|on|by) your (?:own )?best judge?ment))*"
    r"(?:[.!]\s+if you (?:believe|think|are sure) (?:that )?you(?:'ve| have)? (?:completed|finished|solved|done) "
    r"(?:the|your) task,?\s+(?:please\s+)?(?:call|use) the `?[\w.-]+(?:\(\))?`? tool(?: with your final answer)?)?",
    re.IGNORECASE,
)
#: The longest text read as a nudge (Inspect's, above, is 159 characters).
NUDGE_CHARS = 300
#: The context passages that are the caller's instructions (its system and developer messages).
INSTRUCTING = frozenset({"system", "developer", "instructions"})


#: A tool's result sent back as a user message, in the text-ReAct convention of agents that flatten
#: their tool calls into text (smolagents: "Calling tools: [...]", then "Observation: ...").
_OBSERVATION = re.compile(r"\s*(?:observation|tool (?:result|output|response))\s*:", re.IGNORECASE)


def is_nudge(text: str) -> bool:
    text = text.strip()
    core = text.rstrip(".!?").strip()
    if len(text) > NUDGE_CHARS or (text.endswith("?") and re.search(r"[.!]\s", core)):
        return False  # (a second sentence that asks something is a question of its own)
    return _NUDGE.fullmatch(core) is not None


def no_question(text: str) -> bool:
    """Whether a user message after an agent's own turn asks nothing of its own: a continuation
    nudge, or a tool's result sent back as text (an observation)."""
    return is_nudge(text) or _OBSERVATION.match(text) is not None


def conversation_parts(question: str, context: list[ContextChunk]) -> tuple[str, list[ContextChunk], str]:
    """A conversation's question, context and instructions: its system and developer messages (and
    ``instructions``) are the caller's instructions, not passages; a bare continuation nudge, or a
    tool's result sent as text ("Observation: ..."), after an assistant's or a tool's turn is not the
    question: the last user message of substance is, and the nudge stays in the context, last."""
    instructions = "\n\n".join(c.text for c in context if c.source in INSTRUCTING)
    rest = [c for c in context if c.source not in INSTRUCTING]
    if no_question(question) and rest and rest[-1].source in ("assistant", "tool"):
        asked = [i for i, c in enumerate(rest) if c.source == "user" and not no_question(c.text)]
        if asked:
            i = asked[-1]
            nudge = ContextChunk(text=question, source="user")
            question, rest = rest[i].text, [*rest[:i], *rest[i + 1 :], nudge]
    return question, rest, instructions

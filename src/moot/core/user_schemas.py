"""A caller's JSON schema (a tool's ``parameters``, a reply's ``response_format`` / ``text.format``):
checked once before any model call, then validated against without fetching anything and without
a pattern that can stall the process.

- **Bounds.** A schema is at most :data:`MAX_SCHEMA_BYTES` as compact JSON and nests at most
  :data:`MAX_SCHEMA_DEPTH` objects and lists deep; a string in it holds no lone surrogate; with its
  references written out it comes to at most :data:`MAX_SCHEMA_EXPANSION` subschemas (a validation's
  work, which references shared as a chain of pairs make exponential in the schema's size).
- **References stay inside the schema.** A ``$ref`` (``$dynamicRef``, ``$recursiveRef``) anywhere
  in it must be a fragment of the schema itself (``#``, ``#/$defs/NAME``, ``#/definitions/NAME``,
  ``#anchor``) that points at something there; any other is refused. Validators are built with a
  :class:`referencing.Registry` whose ``retrieve`` raises
  :class:`~referencing.exceptions.NoSuchResource`, so a reference that got past the check still
  fetches nothing (``jsonschema`` without a registry would GET any URL it is given).
- **Patterns run on RE2** (``google-re2``): ``pattern``, and the keys of ``patternProperties``,
  match in time linear in the text, whatever the pattern. RE2 has no backtracking: no
  lookaround and no backreferences, which no grammar-constrained decoder (llama.cpp's llguidance,
  OpenAI's structured outputs) honours either; such a pattern, a repetition count over 1,000, or
  patterns that compile to more than :data:`MAX_PATTERN_PROGRAM` RE2 instructions in all are
  refused with the reason. Why RE2 and not the alternatives: ``re`` backtracks (``^(a+)+$`` on 28
  characters held the event loop 47 s) and holds the GIL while it does, so a thread with a
  deadline cannot stop it; ``regex`` with ``timeout=`` bounds matching but not compiling
  (``(?:a{1000}){1000}`` takes a second to compile, and one more level of nesting never ends);
  refusing ``pattern`` would drop a keyword the grammars do honour. The same validator checks a
  model's reply, which an attacker can steer, so the guarantee holds there too.
  ``jsonschema`` matches ``patternProperties`` with ``re`` inside ``unevaluatedProperties``, so a
  schema with both is refused.
- **``format``** is not asserted (JSON Schema 2020-12's default): it reaches the model as a hint.

:func:`check_user_schema` does all of this and returns a :class:`UserSchema`, whose
:meth:`UserSchema.errors` is the only way moot validates against a caller's schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urljoin

import jsonschema
import re2
from jsonschema import Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry, Resource, Specification
from referencing import jsonschema as drafts
from referencing.exceptions import NoSuchResource, Unresolvable

#: The largest schema, as compact JSON (non-ASCII counted as its ``\\u`` escapes).
MAX_SCHEMA_BYTES = 64 * 1024
#: How deep a schema's objects and lists may nest.
MAX_SCHEMA_DEPTH = 32
#: The RE2 instructions all of a schema's patterns may compile to (``.{0,1000}`` alone is 9,002).
MAX_PATTERN_PROGRAM = 100_000
#: The keywords that hold a reference.
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
#: The subschemas a schema may come to with its references written out (each place a definition is
#: referred to counts it again; a reference back into itself, a recursive schema, counts once): what one
#: validation may visit for each value. Sixteen definitions each ``allOf`` two references to the next
#: are 2^16; validating against them held the event loop for seconds, and 2^30, for hours. A nested
#: pydantic model of a ledger (batches of invoices of lines, parties, addresses, money) is 11,235.
MAX_SCHEMA_EXPANSION = 50_000
#: The steps (a subschema applied to a value) one validation may take. The expansion's bound counts a
#: recursive reference once, so a recursive definition whose alternatives each recurse again
#: (``anyOf`` of two references down a list) checks a value nested N deep in 2^N steps: a 192-byte
#: ``response_format`` held the event loop 51 s on a reply 17 lists deep (a review). A 35 KB reply of
#: 400 invoice lines against a nested ledger model takes 4,600; a step is about 10 us.
MAX_VALIDATION_STEPS = 10_000
#: ... or this many a JSON value the reply holds, if more: a long flat reply (1,500 records of five
#: fields, one nullable, 116 KB) took 12,000 steps, and a review saw it refused; an exponential one
#: holds few values for its steps.
STEPS_PER_VALUE = 16


def _values_in(value: Any) -> int:
    """How many JSON values ``value`` holds, itself included."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


class SchemaProblem(ValueError):
    """A caller's schema moot will not use: ``problem`` says why and what to do, ``where`` names the
    schema (``tools[0].parameters``); the message is both, in one line. ``field``: the field of a
    tool at fault (``parameters``, ``description``), for a caller that names it its own way."""

    def __init__(self, problem: str, where: str = "", *, field: str = "") -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.problem = problem
        self.where = where
        self.field = field


def _retrieve_nothing(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


#: The registry of every validator of a caller's schema: it holds nothing and retrieves nothing.
NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the caller's error, not a line on the server's stderr


class _PatternUnusable(Exception):
    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"the pattern {pattern!r} cannot be used: {reason}")


def compile_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2, or :class:`_PatternUnusable` with RE2's reason."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise _PatternUnusable(pattern, f"{reason} (patterns run on RE2: no lookaround, no backreferences, "
                                        "repetition counts up to 1000)") from None  # fmt: skip
    except UnicodeEncodeError:
        raise _PatternUnusable(pattern, "it holds a lone surrogate") from None


#: The compiled patterns of the schema being validated (set by :meth:`UserSchema.errors`).
_PATTERNS: ContextVar[dict[str, Any] | None] = ContextVar("moot_user_schema_patterns", default=None)
#: The steps the validation under way may still take (:data:`MAX_VALIDATION_STEPS`; None: not counted).
_STEPS: ContextVar[list[int] | None] = ContextVar("moot_user_schema_steps", default=None)


class _TooCostly(Exception):
    """A validation past :data:`MAX_VALIDATION_STEPS`."""


def _search(pattern: str, text: str) -> bool:
    table = _PATTERNS.get()
    compiled = table.get(pattern) if table is not None else None
    if compiled is None:  # a pattern the check did not reach (none should be): compiled now, not kept
        compiled = compile_pattern(pattern)
    try:
        return compiled.search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate matches no pattern
        return False


# The keywords of jsonschema that match patterns with ``re``, on RE2 (jsonschema's own code otherwise).
def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)]
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(map(repr, sorted(patterns)))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            shown = ", ".join(repr(each) for each in sorted(extras, key=str))
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({shown} {verb} unexpected)")


_RE2_KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


def _on_re2(base: type[Validator]) -> type[Validator]:
    """``base`` with its pattern keywords on RE2, kept at every step down: jsonschema's ``evolve``
    picks a subschema's validator by its ``$schema`` (``validator_for``), and so would leave RE2 for
    the stock class, whose patterns run on ``re``, wherever a subschema names one (refused by the
    check) or a ``$ref`` comes back to a root that does. The keyword carries nothing else to
    validate: the subschema is checked without it, by this class. Each step also counts against the
    validation's :data:`MAX_VALIDATION_STEPS`."""
    checked: Any = jsonschema.validators.extend(base, _RE2_KEYWORDS)  # type: ignore[no-untyped-call]
    stock = checked.evolve

    def evolve(self: Any, **changes: Any) -> Any:
        steps = _STEPS.get()  # (each step down to a subschema evolves the validator: counted here)
        if steps is not None:
            steps[0] -= 1
            if steps[0] < 0:
                raise _TooCostly
        schema = changes.get("schema", self.schema)
        if isinstance(schema, dict) and "$schema" in schema:
            changes["schema"] = {k: v for k, v in schema.items() if k != "$schema"}
        return stock(self, **changes)

    checked.evolve = evolve
    return cast(type[Validator], checked)


#: The drafts a caller's schema may name in ``$schema`` (none: 2020-12), each with its referencing
#: specification and its validator on RE2.
_DRAFTS: dict[type[Validator], tuple[Specification[Any], type[Validator]]] = {
    base: (spec, _on_re2(base))
    for base, spec in (
        (Draft4Validator, drafts.DRAFT4),
        (Draft6Validator, drafts.DRAFT6),
        (Draft7Validator, drafts.DRAFT7),
        (Draft201909Validator, drafts.DRAFT201909),
        (Draft202012Validator, drafts.DRAFT202012),
    )
}


def _flat_metaschema() -> dict[str, Any] | None:
    """Draft 2020-12's metaschema in one piece: its seven vocabularies' keywords side by side, each
    ``$dynamicRef: "#meta"`` a plain ``$ref: "#"``. For a schema of that draft without vocabularies
    of its own (a caller's) it decides as the official one does, about six times faster: jsonschema
    resolves the dynamic references at every subschema, most of the time it takes to check one.
    None (the official one is used) if the vocabularies hold anything this does not expect."""

    def plain(node: Any) -> Any:
        if isinstance(node, list):
            return [plain(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$dynamicRef" and value == "#meta":
                out["$ref"] = "#"
            elif key == "$ref" and isinstance(value, str) and "#/$defs/" in value:
                out["$ref"] = "#/$defs/" + value.split("#/$defs/", 1)[1]
            elif key == "$ref":
                return None
            else:
                out[key] = plain(value)
        return out

    official = Draft202012Validator.META_SCHEMA
    properties: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    expected = {"$schema", "$id", "$vocabulary", "$dynamicAnchor", "title", "type", "properties", "$defs", "$comment"}
    parts = [SPECIFICATIONS.contents(urljoin(official["$id"], ref["$ref"])) for ref in official["allOf"]]
    for part in [*parts, {k: v for k, v in official.items() if k != "allOf"}]:
        if set(part) - expected - {"allOf"} or part.get("type") != ["object", "boolean"]:
            return None
        for table, found in ((properties, part.get("properties", {})), (defs, part.get("$defs", {}))):
            for key, value in found.items():
                flat = plain(value)
                if flat is None or (key in table and table[key] != flat):
                    return None
                table[key] = flat
    return {"type": ["object", "boolean"], "properties": properties, "$defs": defs}


_FLAT_2020_12 = _flat_metaschema()


@dataclass
class UserSchema:
    """A caller's schema that passed :func:`check_user_schema`, with its validator (no retrieval,
    patterns on RE2) and its patterns compiled once."""

    schema: dict[str, Any]
    validator: Validator
    patterns: dict[str, Any] = field(default_factory=dict)
    #: Its size as compact JSON.
    size: int = 0

    def errors(self, instance: Any) -> list[ValidationError]:
        """Every way ``instance`` fails the schema (empty: it follows it). What cannot be checked (a
        reference to nothing, a value nested past Python's recursion limit) is one error, never an
        exception."""
        token = _PATTERNS.set(self.patterns)
        allowed = max(MAX_VALIDATION_STEPS, STEPS_PER_VALUE * _values_in(instance))
        counted = _STEPS.set([allowed])
        try:
            return list(self.validator.iter_errors(instance))
        except _TooCostly:
            return [
                ValidationError(
                    f"checking the value against the schema took over {allowed:,} steps (alternatives "
                    "that each refer back into a recursive definition branch at every level the value nests); "
                    "give the schema's recursive definition one alternative per shape"
                )
            ]
        except Unresolvable as exc:
            return [ValidationError(f"the schema's reference {exc.ref!r} points at nothing in it")]
        except RecursionError:
            return [ValidationError("the value (or the schema's references) nests too deep to check")]
        except _PatternUnusable as exc:
            return [ValidationError(str(exc))]
        finally:
            _STEPS.reset(counted)
            _PATTERNS.reset(token)


def _scan(schema: Any) -> tuple[int, str | None]:
    """The schema's size as compact JSON, and its first problem found without the metaschema: too
    deep, a lone surrogate, a reference outside it (None: none)."""
    try:
        size = len(json.dumps(schema, separators=(",", ":"), allow_nan=False))
    except (TypeError, ValueError) as exc:
        return 0, f"is not JSON ({exc})"
    if size > MAX_SCHEMA_BYTES:
        return size, (
            f"{size} bytes as compact JSON is over the limit of {MAX_SCHEMA_BYTES}; send a smaller schema (shorter "
            "descriptions, fewer alternatives)"
        )
    stack: list[tuple[Any, str, int]] = [(schema, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return size, f"nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and lists; flatten it"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            here = f"{path}.{key}" if path else str(key)
            for text in (key, value):
                if isinstance(text, str) and not is_text(text):
                    shown = here.encode("utf-8", "backslashreplace").decode("utf-8")
                    return size, f"a string at {shown} holds a lone surrogate (not Unicode text); send text"
            if key in REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                return size, (
                    f"{key} {json.dumps(value)} (at {here}) is not local to the schema: moot fetches no schema from "
                    "anywhere; put the definition in the schema's $defs and refer to it as '#/$defs/NAME'"
                )
            if isinstance(value, dict | list):
                stack.append((value, here, depth + 1))
    return size, None


def is_text(text: str) -> bool:
    """Whether ``text`` is Unicode text (it holds no lone surrogate, which no UTF-8 encoder takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _draft(schema: dict[str, Any]) -> tuple[type[Validator], Specification[Any], type[Validator]]:
    dialect = schema.get("$schema")
    if dialect is None:
        base: type[Validator] = Draft202012Validator
    elif not isinstance(dialect, str):
        raise SchemaProblem("$schema: give the URI of a JSON Schema draft (or leave it out: 2020-12)")
    else:
        found = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
        if found not in _DRAFTS:
            known = "draft-04, draft-06, draft-07, 2019-09, 2020-12"
            raise SchemaProblem(f"$schema {dialect!r} is not a draft moot checks ({known}); leave it out for 2020-12")
        base = found
    spec, checked = _DRAFTS[base]
    return base, spec, checked


def _graph(schema: dict[str, Any], spec: Specification[Any]) -> dict[int, tuple[dict[str, Any], list[int]]]:
    """Every subschema validation can reach, each once (by ``id``), with the subschemas it holds and
    where its references point (which may be anywhere in the schema): the schema's graph. A reference
    to nothing is a :class:`SchemaProblem`."""
    root = spec.create_resource(schema)
    graph: dict[int, tuple[dict[str, Any], list[int]]] = {}
    stack: list[tuple[Resource[Any], Any]] = [(root, NO_RETRIEVAL.resolver_with_root(root))]
    while stack:
        resource, resolver = stack.pop()
        contents = resource.contents
        if not isinstance(contents, dict) or id(contents) in graph:
            continue
        out: list[int] = []
        graph[id(contents)] = (contents, out)
        for keyword in REF_KEYWORDS:
            ref = contents.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable:
                raise SchemaProblem(f"{keyword} {ref!r} points at nothing in the schema; define it in $defs") from None
            if isinstance(resolved.contents, dict):
                out.append(id(resolved.contents))
            target = Resource.from_contents(resolved.contents, default_specification=spec)
            stack.append((target, resolved.resolver))
        for sub in resource.subresources():
            if isinstance(sub.contents, dict):
                out.append(id(sub.contents))
            stack.append((sub, resolver.in_subresource(sub)))
    return graph


def _expansion(graph: dict[int, tuple[dict[str, Any], list[int]]], root: int, cap: int) -> int:
    """How many subschemas the schema whose graph is ``graph`` (:func:`_graph`) comes to with its
    references written out (:data:`MAX_SCHEMA_EXPANSION`), counted up to ``cap + 1`` (no further: the
    count of a hostile schema is astronomical)."""
    # The tree it unfolds into, counted depth first. A reference back up the path (a recursive
    # schema) counts once; a count made with one is not reused elsewhere (from another path the same
    # subschema unfolds otherwise), and the counting itself stops after a bounded amount of work.
    memo: dict[int, int] = {}
    on_path = {root}
    frames: list[list[Any]] = [[root, 0, 1, False]]  # node, next child, count, uses a recursion
    work = 0
    while frames:
        frame = frames[-1]
        children = graph[frame[0]][1]
        if frame[1] < len(children):
            child = children[frame[1]]
            frame[1] += 1
            if child in memo:
                frame[2] = min(cap + 1, frame[2] + memo[child])
            elif child in on_path:
                frame[2], frame[3] = min(cap + 1, frame[2] + 1), True
            else:
                work += 1
                if work > 20 * cap:
                    return cap + 1
                on_path.add(child)
                frames.append([child, 0, 1, False])
            continue
        frames.pop()
        on_path.discard(frame[0])
        if frame[2] > cap:
            return cap + 1
        if not frame[3]:
            memo[frame[0]] = frame[2]
        if not frames:
            return int(frame[2])
        parent = frames[-1]
        parent[2], parent[3] = min(cap + 1, parent[2] + frame[2]), parent[3] or frame[3]
    return cap + 1  # (not reached: the root's frame returns)


def check_user_schema(schema: Any, where: str = "schema") -> UserSchema:
    """``schema`` checked as the module's docstring says, with its validator; else a
    :class:`SchemaProblem` naming ``where``."""
    if not isinstance(schema, dict):
        raise SchemaProblem("give a JSON schema (an object)", where)
    size, problem = _scan(schema)
    if problem is not None:
        raise SchemaProblem(problem, where)
    try:
        base, spec, checked = _draft(schema)
    except SchemaProblem as exc:
        raise SchemaProblem(exc.problem, where) from None
    patterns: dict[str, Any] = {}

    def regex(value: object) -> bool:
        if isinstance(value, str) and value not in patterns:
            patterns[value] = compile_pattern(value)
        return True

    formats = jsonschema.FormatChecker(formats=())
    formats.checks("regex", raises=_PatternUnusable)(regex)
    meta = _FLAT_2020_12 if base is Draft202012Validator and _FLAT_2020_12 is not None else base.META_SCHEMA
    error = next(iter(base(meta, format_checker=formats, registry=NO_RETRIEVAL).iter_errors(schema)), None)
    if error is not None:
        at = ".".join(str(p) for p in error.absolute_path)
        cause = error.cause if isinstance(error.cause, _PatternUnusable) else None
        message = str(cause) if cause is not None else f"not a valid JSON schema: {error.message}"
        raise SchemaProblem(f"{message}" + (f" (at {at})" if at else ""), where) from None
    try:
        unevaluated = pattern_properties = False
        graph = _graph(schema, spec)
        for sub, _ in graph.values():
            if sub is not schema and "$schema" in sub:
                raise SchemaProblem(
                    f"a subschema names its own $schema ({json.dumps(sub['$schema'])}): moot checks a schema in one "
                    "draft; name it once, at the root, or leave it out (2020-12)"
                )
            found = [sub["pattern"]] if isinstance(sub.get("pattern"), str) else []
            if isinstance(sub.get("patternProperties"), dict):
                pattern_properties = True
                found += list(sub["patternProperties"])
            unevaluated = unevaluated or "unevaluatedProperties" in sub
            for pattern in found:
                if pattern not in patterns:
                    patterns[pattern] = compile_pattern(pattern)
    except SchemaProblem as exc:
        raise SchemaProblem(exc.problem, where) from None
    except _PatternUnusable as exc:
        raise SchemaProblem(str(exc), where) from None
    except Exception as exc:  # referencing on a schema the metaschema let through (a sub-$schema it cannot read)
        raise SchemaProblem(f"its subschemas cannot be read ({type(exc).__name__}: {exc})", where) from None
    if _expansion(graph, id(schema), MAX_SCHEMA_EXPANSION) > MAX_SCHEMA_EXPANSION:
        raise SchemaProblem(
            f"its references written out come to more than {MAX_SCHEMA_EXPANSION:,} subschemas (a definition "
            "referred to from many places, or by definitions each referred to twice); refer to each definition from "
            "fewer places",
            where,
        )
    if unevaluated and pattern_properties:
        raise SchemaProblem(
            "patternProperties and unevaluatedProperties together cannot be checked safely; use additionalProperties "
            "instead of unevaluatedProperties",
            where,
        )
    program = sum(p.programsize for p in patterns.values())
    if program > MAX_PATTERN_PROGRAM:
        raise SchemaProblem(
            f"its patterns compile to {program} RE2 instructions, over the limit of {MAX_PATTERN_PROGRAM}; use "
            "fewer or simpler patterns (smaller repetition counts)",
            where,
        )
    return UserSchema(schema=schema, validator=checked(schema, registry=NO_RETRIEVAL), patterns=patterns, size=size)

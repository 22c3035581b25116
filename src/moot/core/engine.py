"""The engine: one loop that runs any :class:`~moot.core.spec.ProtocolSpec`.

The loop's steps are explicit and work over an explicit state, so they can run here, in moot's
own asyncio loop (:meth:`Engine.run`), and as nodes of a LangGraph subgraph, without being
written twice::

    state = engine.start(task)
    while engine.check_stop(state) is None:
        await engine.run_round(state)
    await engine.decide(state)
    result = engine.finish(state)

Model failures never escape a turn: a failed call is recorded in its turn and that participant
is dropped for the round; the debate goes on while someone is still answering.

A debate another process was running when it stopped goes on from its recorded transcript:
``engine.run(engine.resume(result))`` (:meth:`Engine.resume`) keeps every finished turn and runs only
what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from moot.core import budget, decision_step, sight, turn_reply
from moot.core.cost import debate_cost
from moot.core.dynamics import compute_dynamics
from moot.core.events import (
    DebateDone,
    DebateResumed,
    DebateStarted,
    Event,
    EventHandler,
    RoundDone,
    TokenDelta,
    TurnDone,
    TurnRetry,
    TurnStarted,
)
from moot.core.ledger import CallBudgetExhausted as CallBudgetExhausted  # re-exported: it lived here
from moot.core.ledger import CallLedger, TurnCalls
from moot.core.spec import (
    JudgeDecision,
    NoDecision,
    Participant,
    ProtocolSpec,
    RoutingError,
    SelectDecision,
    SpecError,
    SynthesizeDecision,
    TurnFormat,
    VoteDecision,
)
from moot.core.state import DebateState as DebateState  # re-exported: it lived here before
from moot.core.types import DebateResult, DebateStatus, DebateTask, Persona, Round, Turn
from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    Message,
    ModelConfigError,
    ModelError,
    RetryCallback,
    TokenCallback,
    Usage,
)
from moot.models.pricing import PriceTable
from moot.models.registry import OPENAI_OPTIONS, default_spec, resolve_model
from moot.secrets import redact

#: How the error of a turn cut by a cancellation begins (the debate's timeout, or its process
#: stopping): such a turn did not finish, and :meth:`Engine.resume` runs it again.
CUT = "cancelled:"


class DebateTimeout(TimeoutError):
    """The whole-debate timeout expired. ``result`` holds the partial transcript."""

    def __init__(self, result: DebateResult, timeout_s: float) -> None:
        super().__init__(f"the debate did not finish within its timeout of {timeout_s:g} s")
        self.result = result

    @property
    def partial(self) -> DebateResult:
        return self.result


class DebateFailed(RuntimeError):
    """The debate could not produce a decision. ``result`` holds the transcript and the reason."""

    def __init__(self, result: DebateResult) -> None:
        super().__init__(result.error or "the debate failed")
        self.result = result


#: A step run between rounds (:class:`Engine`'s ``between_rounds``); may return an awaitable.
BetweenRounds = Callable[[DebateState, Round], Awaitable[None] | None]


def log_probability_needs(spec: ProtocolSpec) -> set[str]:
    """The signals read from token log-probabilities that ``spec``'s decision weighs or filters its
    vote by (empty for a plain vote, a stated-confidence one, or any other decision)."""
    decision = spec.decision
    needs: set[str] = set()
    if isinstance(decision, VoteDecision):
        if decision.signal not in (None, "stated"):
            needs.add(decision.signal)
        if decision.keep is not None and decision.filter_signal != "stated":
            needs.add(decision.filter_signal)
    return needs


def refuse_blind_models(spec: ProtocolSpec, models: Iterable[BaseChatModel]) -> None:
    """:class:`SpecError`, naming the fix, when ``spec`` needs token log-probabilities
    (:func:`log_probability_needs`) and one of ``models`` is known to return none."""
    needs = log_probability_needs(spec)
    if not needs:
        return
    blind = sorted({m.name for m in models if m.returns_logprobs is False})
    if blind:
        raise SpecError(
            f"protocol {spec.name} weighs its vote by {', '.join(sorted(needs))}, read from token "
            f"log-probabilities, and {', '.join(blind)} returns none: use a model that does (embedded:..., or an "
            "OpenAI-compatible server that returns logprobs) or a plain vote"
        )


class Engine:
    """Runs one protocol spec. Holds no per-debate state: one engine can run many debates."""

    def __init__(
        self,
        spec: ProtocolSpec,
        model: str | BaseChatModel | None = None,
        *,
        models: dict[str, str | BaseChatModel] | None = None,
        on_event: EventHandler | None = None,
        between_rounds: BetweenRounds | None = None,
        schemas: Mapping[str, type[BaseModel]] | None = None,
        prices: PriceTable | None = None,
        **model_options: Any,
    ) -> None:
        """``between_rounds(state, round)`` is an explicit step run after every round, before the
        stop conditions are checked: the one place where a caller may change the running debate
        (ABSA's memory injection adds passages to the task's context there). Event handlers only
        observe: a failing one is kept as a warning and changes nothing. ``schemas``: the turn
        schemas this spec names that are its own (a server request's tools and reply format), looked
        up before the process's registered ones (:func:`moot.structured.register_schema`, the named
        schemas YAML specs use): they live as long as the engine, and nothing else can name them."""
        if not isinstance(spec, ProtocolSpec):
            raise TypeError(
                f"Engine takes a ProtocolSpec, not {type(spec).__name__}: moot.protocols.get_preset('panel'), or "
                "moot.protocols.loader.resolve_protocol('mad(rounds=2)') (a preset with parameters, a protocol file)"
            )
        unknown_options = sorted(set(model_options) - OPENAI_OPTIONS)
        if unknown_options:
            hint = (
                "; a turn's tokens are the spec's budget (spec.with_turn_tokens(n))"
                if {"max_tokens", "max_tokens_per_turn"} & set(unknown_options)
                else ""
            )
            raise TypeError(
                f"Engine: {', '.join(unknown_options)}: not a model option (the openai: models take "
                f"{', '.join(sorted(OPENAI_OPTIONS))}){hint}"
            )
        self.spec = spec
        #: Prices of the models: every result this engine returns carries its ``cost`` (None: left to
        #: the caller, as :func:`moot.core.cost.debate_cost` computes it).
        self.prices = prices
        self.schemas: Mapping[str, type[BaseModel]] = dict(schemas or {})
        self.on_event = on_event
        # Routing: a model per participant id, or per role (seed 004's multi-model routing: the
        # moderator on one model, the debaters on another); ids win over roles.
        overrides = models or {}
        routable = {p.id for p in spec.participants} | {p.persona.role for p in spec.participants if p.persona.role}
        unknown = sorted(set(overrides) - routable - {"decision"})
        if unknown:
            raise RoutingError(f"models given for unknown participant(s) or role(s): {', '.join(unknown)}")

        def pick(chosen: str | BaseChatModel | None) -> BaseChatModel:
            # The default model is resolved only if someone uses it; connection options
            # (base_url, api_key, ...) go to openai: specs only, so debates can mix backends.
            target = chosen if chosen is not None else model
            if target is not None and not isinstance(target, str):
                return resolve_model(target)  # a model object (moot's, or a LangChain chat model)
            spec_str = target or default_spec()
            return resolve_model(target, **(model_options if spec_str.startswith("openai:") else {}))

        self.models: dict[str, BaseChatModel] = {
            p.id: pick(overrides.get(p.id) or overrides.get(p.persona.role) or p.model) for p in spec.participants
        }
        decision_model: str | BaseChatModel | None = overrides.get("decision")
        if decision_model is None and isinstance(spec.decision, SynthesizeDecision):
            decision_model = spec.decision.model
        if decision_model is None and isinstance(spec.decision, JudgeDecision | SelectDecision):
            decision_model = spec.decision.model
        self.decision_model: BaseChatModel | None = pick(decision_model) if spec.decision_calls else None
        self._check_log_probabilities()
        self._stop = spec.stop_condition()
        self.between_rounds = between_rounds

    def _check_log_probabilities(self) -> None:
        """Refuse, before any call, a protocol that weighs or filters votes by token
        log-probabilities on a model known to return none (its every vote would abstain)."""
        refuse_blind_models(self.spec, self.models.values())

    # ------------------------------------------------------------------------------------ steps

    def start(self, task: DebateTask | str) -> DebateState:
        task = DebateTask(question=task) if isinstance(task, str) else task
        if (blind := budget.image_problem(self.spec, task, self.models, self.decision_model)) is not None:
            raise ModelConfigError(blind)  # before any call (the front doors refuse it the same way)
        result = DebateResult(
            protocol=self.spec.name,
            task=task,
            participants=[
                {**p.persona.model_dump(exclude_none=True), "id": p.id, "model": self.models[p.id].name}
                for p in self.spec.participants
            ],
        )
        if (limit := self.spec.max_context_chunks) is not None and len(task.context) > limit:
            note = f"{len(task.context)} context passages were given; the protocol uses the first {limit}"
            result.warnings.append(note)
        if self.spec.unread_rounds():
            result.warnings.append(self.spec.unread_rounds_note())
        return DebateState(result=result)

    def resume(self, result: DebateResult) -> DebateState:
        """The state of a debate interrupted while it ran (its process killed or stopped; another one
        takes it over), to go on with :meth:`run`: every finished turn of ``result`` is kept, neither
        run nor paid again (the totals and the call budget count each once); a turn cut by the
        interruption (:data:`CUT`) is dropped, and so is a decision that had begun (it is made
        again). When the last round was cut, the next :meth:`run_round` completes it, running only
        its speakers with no finished turn: each sees what it would have seen (a simultaneous stage's
        speakers never see each other; a sequential one's see the turns before theirs, kept)."""
        res = result.model_copy(deep=True)
        rounds: list[Round] = []
        for i, rnd in enumerate(res.rounds, 1):
            turns = [t for t in rnd.turns if not (t.error or "").startswith(CUT)]
            if rnd.index != i or not turns:
                break  # a round no turn finished in is run whole, with all that follows
            rounds.append(rnd.model_copy(update={"turns": turns}))
        kept = [t for r in rounds for t in r.turns]
        cut = sum(len(r.turns) for r in res.rounds) - len(kept)
        res.rounds = rounds
        decided = bool(res.decision_turns)
        res.decision_turns = []
        res.usage = sum((t.usage for t in kept), Usage())
        res.llm_calls = sum(t.calls for t in kept)
        res.status, res.stop_reason, res.error = "running", None, None
        res.final_answer = res.decision = res.dynamics = res.cost = res.quality = None
        partial: Round | None = None
        if rounds:
            last = rounds[-1]
            spoke = {t.speaker for t in last.turns}
            if any(sid not in spoke for st in self.spec.round_stages(last.index) for sid in st.speakers):
                partial = last
        going_on = partial.index if partial is not None else len(rounds) + 1
        res.warnings.append(
            f"resumed after an interruption: {len(kept)} finished turn(s) kept, going on in round {going_on}"
            + (f"; {cut} cut turn(s) run again" if cut else "")
            + ("; the decision, begun, made again" if decided else "")
        )
        state = DebateState(result=res, resumed=len(kept), partial=partial)
        state.t0 -= res.elapsed_s  # its time so far counts
        return state

    def check_stop(self, state: DebateState) -> str | None:
        """Why the debate must not run another round, or None to go on: the spec's composed stop
        condition (:meth:`ProtocolSpec.stop_condition`: failures, rounds, budgets, its own ``stop``)."""
        return self._stop.check(state, self.spec)

    async def run_round(self, state: DebateState) -> Round:
        """Run the next round (or complete the one a resumed debate was cut in: :attr:`DebateState.partial`)."""
        rnd, state.partial = state.partial, None
        if rnd is None:
            rnd = Round(index=state.round_count + 1)
            state.result.rounds.append(rnd)
        stages = self.spec.round_stages(rnd.index)
        spoke = {t.speaker for t in rnd.turns}
        state.owed_calls = sum(1 for st in stages for sid in st.speakers if sid not in spoke)
        position = {sid: i for i, sid in enumerate(sid for st in stages for sid in st.speakers)}
        by_id = {p.id: p for p in self.spec.participants}
        try:
            for stage in stages:
                speakers = [by_id[sid] for sid in stage.speakers if sid not in spoke]
                if stage.order == "simultaneous":
                    # What each sees is fixed before any of them speaks: peers never see each other.
                    seen = {p.id: sight.visible_turns(self.spec, state.result.rounds, p, rnd) for p in speakers}
                    try:
                        async with asyncio.TaskGroup() as tg:
                            for p in speakers:
                                tg.create_task(self._debate_turn(state, p, rnd, seen[p.id]))
                    except BaseExceptionGroup as group:
                        # What a turn raised that is no model's failure (those the turn records): raised
                        # as it is, as in a sequential stage, not wrapped in the task group's group.
                        first, *others = group.exceptions
                        for other in others:
                            note = f"also raised by another turn of round {rnd.index}: {other!r}"
                            if other is not first and note not in getattr(first, "__notes__", ()):
                                first.add_note(note)
                        raise first from None
                else:
                    for p in speakers:
                        await self._debate_turn(
                            state, p, rnd, sight.visible_turns(self.spec, state.result.rounds, p, rnd)
                        )
        finally:
            state.owed_calls = 0
            rnd.turns.sort(key=lambda t: position[t.speaker])
        for t in rnd.turns:
            if t.error is not None:
                state.result.warnings.append(f"{t.speaker} was dropped from round {rnd.index}: {t.error}")
        await self.emit(RoundDone(state.result, rnd))
        if self.between_rounds is not None:
            outcome = self.between_rounds(state, rnd)
            if outcome is not None:
                await outcome
        return rnd

    async def decide(self, state: DebateState) -> None:
        """Decide the debate (:func:`moot.core.decision_step.decide`), its stop reason set first;
        the decision model's calls are made here, as every other turn's."""
        res = state.result
        if res.stop_reason is None:
            res.stop_reason = self.check_stop(state) or "max_rounds"
        await decision_step.decide(self.spec, state, self._asker(state))

    def _asker(self, state: DebateState) -> decision_step.Ask:
        """The decision step's way to call the decision model: a turn of ``decision``, recorded in
        the result's ``decision_turns``."""

        async def ask(
            *,
            persona: Persona,
            messages: list[Message],
            max_tokens: int,
            turn_format: TurnFormat | None,
            temperature: float | None,
        ) -> Turn:
            assert self.decision_model is not None
            return await self._call(
                state,
                speaker="decision",
                persona=persona,
                round_index=state.round_count,
                kind="decision",
                model=self.decision_model,
                messages=messages,
                max_tokens=max_tokens,
                turn_format=turn_format,
                temperature=temperature,
                into=state.result.decision_turns,
            )

        return ask

    def finish(self, state: DebateState, status: DebateStatus | None = None) -> DebateResult:
        res = state.result
        res.elapsed_s = state.elapsed()
        if status is None:
            decided = isinstance(self.spec.decision, NoDecision) or res.final_answer is not None
            status = "complete" if decided and res.stop_reason != "all_failed" else "failed"
            if status == "failed" and res.error is None:
                res.error = decision_step.first_error(res) or "the debate produced no decision"
        res.status = status
        res.warnings += [w for w in [budget.tokens_over(self.spec, res.usage.total_tokens)] if w is not None]
        res.dynamics = compute_dynamics(res)
        if self.prices is not None:
            res.cost = debate_cost(res, self.prices)
        return res

    # ------------------------------------------------------------------------------------- run

    async def run(self, task: DebateTask | str | DebateState) -> DebateResult:
        """Run a whole debate. Raises :class:`DebateTimeout` (with the partial transcript) when the
        spec's timeout expires; a debate that could not decide returns with ``status="failed"``.

        However it is stopped, the transcript is finished and kept: cancelled from outside (an
        enclosing timeout, a caller's cancel) the result becomes ``interrupted`` with every finished
        turn, ``DebateDone`` is emitted, and the cancellation goes on. A caller that needs that
        partial result passes its own state (``engine.start(task)``) and reads ``state.result``."""
        state = task if isinstance(task, DebateState) else self.start(task)
        timeout = self.spec.budget.timeout_s
        if state.resumed is None:
            await self.emit(DebateStarted(state.result))
        else:  # it started elsewhere: it goes on, within what is left of its timeout
            going_on = state.partial.index if state.partial is not None else state.round_count + 1
            await self.emit(DebateResumed(state.result, state.resumed, going_on))
            if timeout is not None:
                timeout = max(timeout - state.elapsed(), 0.001)
        try:
            async with asyncio.timeout(timeout) as scope:
                if state.partial is not None:
                    await self.run_round(state)  # the round it was cut in, completed
                while (reason := self.check_stop(state)) is None:
                    await self.run_round(state)
                state.result.stop_reason = reason
                await self.decide(state)
        except TimeoutError:
            if not scope.expired():
                raise
            limit = self.spec.budget.timeout_s
            assert limit is not None
            state.result.stop_reason = "timeout"
            state.result.error = f"timed out after {limit:g} s"
            result = self.finish(state, "timeout")
            await self.emit(DebateDone(result))
            raise DebateTimeout(result, limit) from None
        except asyncio.CancelledError:
            if state.result.status == "running":
                state.result.stop_reason = state.result.stop_reason or "cancelled"
                state.result.error = state.result.error or "cancelled before the debate ended"
                self.finish(state, "interrupted")
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.emit(DebateDone(state.result)))
            raise
        result = self.finish(state)
        await self.emit(DebateDone(result))
        return result

    # --------------------------------------------------------------------------------- helpers

    async def emit(self, event: Event) -> None:
        """Call the event handler. A failing handler (a full disk under the transcript writer, say)
        must not break the debate: its error is kept as a warning, once per message."""
        outcome = self.emit_now(event)
        if outcome is not None:
            await outcome

    def emit_now(self, event: Event) -> Awaitable[None] | None:
        """:meth:`emit` without a coroutine of its own: the handler is called now, and what is left
        to await (an async handler's coroutine, its failure kept as emit keeps it) is returned."""
        if self.on_event is None:
            return None
        try:
            outcome = self.on_event(event)
        except Exception as exc:
            self._handler_failed(event, exc)
            return None
        return None if outcome is None else self._awaited(event, outcome)

    async def _awaited(self, event: Event, outcome: Awaitable[Any]) -> None:
        try:
            await outcome
        except Exception as exc:
            self._handler_failed(event, exc)

    def _handler_failed(self, event: Event, exc: Exception) -> None:
        warning = f"event handler failed on {type(event).__name__}: {type(exc).__name__}: {exc}"
        if warning not in event.result.warnings:
            event.result.warnings.append(redact(warning))

    async def _debate_turn(self, state: DebateState, p: Participant, rnd: Round, seen: list[Turn]) -> None:
        kept = sight.kept_turn(self.spec, state.result.rounds, p, rnd)
        if kept is not None:
            state.owed_calls = max(0, state.owed_calls - 1)
            turn = kept.model_copy(
                update={
                    "round": rnd.index,
                    "usage": Usage(),
                    "calls": 0,
                    "attempts": 0,
                    "cached_calls": 0,
                    "latency_s": 0.0,
                    "started_s": state.elapsed(),
                    "carried": True,
                }
            )
            await self.emit(TurnStarted(state.result, p.id, p.persona.name, rnd.index, turn.kind))
            rnd.turns.append(turn)
            await self.emit(TurnDone(state.result, turn))
            return
        model = self.models[p.id]
        if model.context_tokens is not None:  # its window counted by its own tokenizer, where it has one
            await model.ready_to_count()
        messages, dropped, over = sight.turn_messages(
            self.spec, state.result.task, state.result.rounds, p, rnd, seen, model
        )
        if over is not None:
            state.result.warnings.append(over)
        await self._call(
            state,
            speaker=p.id,
            persona=p.persona,
            round_index=rnd.index,
            kind="debate",
            model=model,
            messages=messages,
            max_tokens=self.spec.max_tokens_for(p),
            turn_format=self.spec.turn_for(p),
            temperature=p.temperature if p.temperature is not None else self.spec.temperature,
            seed=p.seed,
            into=rnd.turns,
            history_trimmed=dropped,
        )

    async def _call(
        self,
        state: DebateState,
        *,
        speaker: str,
        persona: Persona,
        round_index: int,
        kind: str,
        model: BaseChatModel,
        messages: list[Message],
        max_tokens: int,
        turn_format: TurnFormat | None,
        temperature: float | None,
        into: list[Turn],
        seed: int | None = None,
        history_trimmed: int = 0,
    ) -> Turn:
        res = state.result
        turn = Turn(
            speaker=speaker,
            name=persona.name,
            role=persona.role,
            round=round_index,
            kind="decision" if kind == "decision" else "debate",
            model=model.name,
            messages=messages,
            started_s=state.elapsed(),
            history_trimmed=history_trimmed,
        )
        if history_trimmed:
            res.warnings.append(
                f"{speaker}'s prompt in round {round_index} left out {history_trimmed} of the earliest history "
                "entries to fit the prompt budget (budget.max_prompt_tokens or the model's context window)"
            )
        await self.emit(TurnStarted(res, speaker, persona.name, round_index, turn.kind))
        on_token: TokenCallback | None = None
        on_retry: RetryCallback | None = None
        if self.on_event is not None:

            def on_token(piece: str) -> Any:
                # The hot path (every piece a model streams): the handler called here, not through a
                # coroutine of emit's, unless it returns one to await.
                return self.emit_now(TokenDelta(res, speaker, round_index, piece))

            def on_retry(attempt: int, error: str) -> Any:
                return self.emit(TurnRetry(res, speaker, round_index, attempt, error))

        probe = self.spec.probe if turn_format is not None and turn_format.schema_name is not None else None
        request = ChatRequest(
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            logprobs=probe.top_logprobs if probe is not None else None,
        )
        t_start = time.perf_counter()
        calls = TurnCalls(self._ledger(state))
        try:
            await turn_reply.fill(
                turn,
                res,
                model=model,
                request=request,
                max_tokens=max_tokens,
                turn_format=turn_format,
                schemas=self.schemas,
                probe=probe,
                calls=calls,
                first=kind == "debate",
                on_token=on_token,
                on_retry=on_retry,
            )
        except CallBudgetExhausted as exc:
            turn.error = str(exc)
        except ModelError as exc:
            calls.abort()
            turn.calls = turn.calls or max(1, calls.made)
            turn.error = redact(str(exc))
        except asyncio.CancelledError:
            calls.abort()
            turn.error = f"{CUT} the debate's timeout expired during this call"
            turn.calls = max(1, calls.made)
            self._record(res, turn, into, t_start)
            raise
        self._record(res, turn, into, t_start)
        await self.emit(TurnDone(res, turn))
        return turn

    @staticmethod
    def _record(res: DebateResult, turn: Turn, into: list[Turn], t_start: float) -> None:
        turn.latency_s = time.perf_counter() - t_start
        res.usage = res.usage + turn.usage
        into.append(turn)

    def _ledger(self, state: DebateState) -> CallLedger:
        return CallLedger(state, self.spec.budget.max_calls)

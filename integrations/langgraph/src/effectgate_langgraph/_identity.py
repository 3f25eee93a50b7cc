"""The CallContext of a step, from what the application gave the graph (never model output).

- session: the config's `thread_id`.
- origin message: the id of the last `HumanMessage` in the state. LangGraph gives a message
  without an id a fresh uuid4 when it enters the state, so a client that resubmits the same
  message must send its own id (`HumanMessage(content=..., id="m-123")`) for the resubmission to
  count as the same message. Where the state has no HumanMessage with an id (a node invoked with
  the model's message alone), `config["configurable"]["origin_message_id"]`, which the
  application supplies; the state's id always wins over it.
- user_id and agent_id: from the graph's runtime context (`graph.invoke(..., context=...)`, a
  mapping or an object with those attributes), else from `config["configurable"]`; a node built
  with `agent_id=` uses that. Never tool_call_id, task, checkpoint or interrupt ids: those change
  on replay, so they are kept for the audit only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolCall
from langchain_core.runnables import RunnableConfig

from effectgate import CallContext, EffectGate, Refused
from effectgate.adapter import MissingIdentity, is_gated, missing_identity
from effectgate.canonical import args_hash, freeze
from effectgate.errors import ArgumentError

#: Where each identity value goes, for MissingIdentity (see `call_context`).
WHERE_THREAD = (
    "pass config={'configurable': {'thread_id': ...}} to graph.invoke / agent.invoke "
    "(the conversation's id; the checkpointer keys on it too)"
)
WHERE_USER = (
    "pass context=YourContext(user_id=...) to graph.invoke, with StateGraph(..., "
    "context_schema=YourContext) or create_agent(..., context_schema=YourContext) (a mapping "
    "works too: context={'user_id': ...}), or put it in config['configurable']['user_id']"
)
WHERE_AGENT = (
    "build the node or middleware with agent_id=..., or pass agent_id in the runtime context "
    "or config['configurable']['agent_id']"
)
WHERE_MESSAGE = (
    "send the user's message in the input as HumanMessage(text, id=...) (LangGraph gives a "
    "message without an id a fresh one when it enters the state through the messages reducer), "
    "or, for a state without one, put the id in config['configurable']['origin_message_id']"
)


def _field(source: Any, name: str, where: str | None = None) -> str | None:
    """`source`'s (a mapping's or an object's) `name`, when non-empty text. With `where`: a value
    it holds that is not (an integer id, "") is refused, never read as absent and replaced by
    another source's."""
    if source is None:
        return None
    value = source.get(name) if isinstance(source, Mapping) else getattr(source, name, None)
    if where is not None and value is not None and not (isinstance(value, str) and value):
        raise missing_identity(
            f"{name} ({type(value).__name__} {value!r:.40} is not a non-empty string)", where
        )
    return value if isinstance(value, str) and value else None


def state_of(node_input: Any) -> Any:
    """The graph state a tool node was given (unwrapping langgraph's per-call Send payload)."""
    if isinstance(node_input, Mapping) and node_input.get("__type") == "tool_call_with_context":
        return node_input.get("state")
    return node_input


def messages_of(state: Any, key: str = "messages") -> Sequence[AnyMessage]:
    if isinstance(state, list):
        return state
    found = state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)
    return found if isinstance(found, list) else []


def step_calls(messages: Sequence[AnyMessage]) -> list[ToolCall]:
    """The tool calls of the latest AIMessage: the model step being executed."""
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return list(message.tool_calls)
    return []


def origin_message_id(messages: Sequence[AnyMessage]) -> str:
    for message in reversed(messages):
        if getattr(message, "type", None) == "human":
            if not message.id:
                break
            return str(message.id)
    raise missing_identity("id of the user message it answers (no HumanMessage with an id)", WHERE_MESSAGE)


def _origin(messages: Sequence[AnyMessage], conf: Mapping[str, Any]) -> str:
    """The state's user message id; where the state has none, the one the application put in
    `configurable` (never read from model output)."""
    try:
        return origin_message_id(messages)
    except MissingIdentity:
        given = _field(conf, "origin_message_id")
        if given is None:
            raise
        return given


def call_context(
    messages: Sequence[AnyMessage],
    config: RunnableConfig,
    context: Any,
    *,
    agent_id: str | None = None,
) -> CallContext:
    """The CallContext for a step; MissingIdentity when the application did not provide one."""
    conf: Mapping[str, Any] = config.get("configurable") or {}
    thread = conf.get("thread_id")
    if thread is None or str(thread) == "":
        raise missing_identity("thread_id", WHERE_THREAD)
    user = _field(context, "user_id", WHERE_USER) or _field(conf, "user_id", WHERE_USER)
    if user is None:
        given = (
            "no runtime context was passed"
            if context is None
            else f"the runtime context ({type(context).__name__}) has no non-empty string user_id"
        )
        raise missing_identity(f"user_id ({given})", WHERE_USER)
    agent = agent_id or _field(context, "agent_id", WHERE_AGENT) or _field(conf, "agent_id", WHERE_AGENT)
    if agent is None:
        raise missing_identity("agent_id", WHERE_AGENT)
    run = config.get("run_id")
    # the model that proposed the calls, as the application names it: recorded, never deciding
    model = _field(context, "model_id") or _field(conf, "model_id") or ""
    return CallContext(
        session_id=str(thread),
        origin_message_id=_origin(messages, conf),
        user_id=user,
        agent_id=agent,
        run_id=str(run) if run is not None else "",
        model_id=model,
    )


def call_id(call: ToolCall) -> str:
    return str(call.get("id") or "")


def reused_ids(gate: EffectGate, calls: Sequence[ToolCall]) -> frozenset[str]:
    """The tool-call ids the model wrote on more than one call of the step (or left empty on
    more than one) where one of those calls is gated. The id is the model's, and a gated call's
    answer is routed by it (its slot, its settled outcome, the ToolMessage ToolNode files under
    it): two calls under one id would take each other's answer, and one approval would be
    registered that no reviewer is shown. So is an id that is not valid text (a lone surrogate):
    the pause listing it cannot be signed. Such calls are refused unregistered
    (`reused_id_refusal`); nothing runs for them. Reads and writes sharing an id among
    themselves are each answered by their own request, as ToolNode answers them."""
    seen: set[str] = set()
    reused: set[str] = set()
    for c in calls:
        cid = call_id(c)
        (reused if cid in seen or not _is_text(cid) else seen).add(cid)
    gated = {call_id(c) for c in calls if is_gated(gate, c["name"])}
    return frozenset(reused & gated)


def _is_text(cid: str) -> bool:
    try:
        cid.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def reused_id_refusal(call: ToolCall) -> Refused:
    """What the model is told for a call whose id another call of its step also carries, or
    whose id is not valid text."""
    if not _is_text(cid := call_id(call)):
        message = f"the tool-call id {cid!r} is not valid text; {call['name']} did not run. Call again."
        return Refused(code="mismatch", message=message, tool=call["name"])
    return Refused(
        code="mismatch",
        message=(
            f"the tool-call id {cid!r} is on more than one call of this step, so no "
            f"answer could be told apart; {call['name']} did not run (nor did the other calls "
            "with that id). Call again, each call with its own id."
        ),
        tool=call["name"],
    )


def call_hash(gate: EffectGate, name: str, args: Any) -> str:
    """The args hash of a call as it stands in the checkpoint (frozen as the gate freezes it)."""
    spec = gate.table.get(name)
    try:
        return args_hash(name, freeze(args, spec.schema if spec else None))
    except (ArgumentError, TypeError):
        return ""

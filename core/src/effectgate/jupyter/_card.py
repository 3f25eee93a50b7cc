"""The approval card for notebooks: the web card's stored fields, with Approve and Deny buttons.

Everything shown is read from the store (`card_view`), never from the model's text, and every
value is shown as text, never as markup: HTML-escaped in the HTML card, and in the text card with
every character that drives a terminal, breaks the line or renders as nothing written out
(`<U+202E>`). The HTML card shows the stored arguments and subject as they are and, where they
hold hidden characters (bidirectional controls, zero-width), a copy with them written out; every
other value (ids, reasons, decisions, warnings, messages) has them written out. The card's
warnings (text that is not what it looks like: bidirectional overrides, invisible characters,
lookalike scripts; a record that does not verify) come first, above everything else, and a failed
or denied card says why. The buttons call the same gate methods as the inbox with the version the
card shows, so a card left open while the call was amended refuses with "stale" and changes
nothing. A grant's token is never shown. Without ipywidgets the card is plain text, and
`approve()` / `deny()` still work.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Callable, Sequence
from typing import Any, cast

from .._display import card_view, json_line, pretty, when
from .._textcheck import card_line, reveal
from ..context import Approver
from ..errors import EffectGateError, StaleApproval
from ..gate import EffectGate
from ..outcomes import Card, Decision, Executed, Grant, PartialApproval, Pending, Recorded

try:
    import ipywidgets as _widgets  # type: ignore[import-untyped]  # ships no type information
except ImportError:  # the plain-text card; `pip install "effectgate[jupyter]"` for buttons
    _widgets = None


def widgets_available() -> bool:
    return _widgets is not None


def _e(value: Any) -> str:
    """`value` for the HTML card: as text, its hidden characters written out (`reveal`)."""
    return html.escape(reveal(value if isinstance(value, str) else pretty(value)))


_plain = card_line  # a value as one line of the text card (its controls and line breaks written out)


def _revealed(text: str, label: str = "") -> str:
    """The copy of a stored value with its hidden characters written out, when it has any."""
    shown = reveal(text)
    div = f"<div class='effectgate-revealed'>{label}with hidden characters shown"
    return "" if shown == text else f"{div}<pre>{html.escape(shown)}</pre></div>"


def _stored_card(card: Card, outcome: str | None, status: str) -> Card:
    """`card` for `Card.render` in the text card: its text fields one plain line each (the
    arguments and subject are printed as ASCII JSON), with the `status` it shows (`card_status`),
    without the warnings and the reason that the text card shows above it."""
    return dataclasses.replace(
        card,
        warnings=(),
        reason=None if outcome or card.reason is None else _plain(card.reason),
        approval_id=_plain(card.approval_id),
        status=_plain(status),
        tool=_plain(card.tool),
        effect=_plain(card.effect),
        reversibility=_plain(card.reversibility),
        approver_role=_plain(card.approver_role),
        args_hash=_plain(card.args_hash),
        notes=tuple(_plain(n) for n in card.notes),
        version=_stored_int(card.version),
        approvals_required=_stored_int(card.approvals_required),
    )


def _stored_int(value: int) -> int:
    """An integer field for `Card.render`: itself or, edited in the database (SQLite keeps text in
    an integer column; the card says it does not verify), that text as one plain line."""
    return value if isinstance(value, int) else cast(int, _plain(value))


def _warning_heading(warnings: Sequence[str]) -> str:
    count = f"{len(warnings)} warning" + ("" if len(warnings) == 1 else "s")
    return f"{count}: text on this card is not what it looks like. Read it closely before deciding."


def _outcome(card: Card, status: str) -> str | None:
    """Why a card ended, for the statuses (as shown) that end with a reason (failed, denied)."""
    if status in ("failed", "denied"):
        return f"{status.capitalize()}: {card.reason or 'no reason recorded'}"
    return None


def _edited(view: dict[str, Any]) -> str | None:
    """What a card says of a status column (no seal's) that the executions and sealed decisions
    contradict (`_display.card_status`: the card shows the status they say)."""
    column, shown = view["column"], view["shown"]
    said = f"Its status column says {column}, but the executions and sealed decisions say {shown}"
    return None if shown == column else f"{said}: it was changed outside effectgate. Ask an administrator."


class ApprovalCard:
    """A decision surface for one approval, for `approver` (whose role the gate checks).

    `on_grant(grant)` receives the grant once it is minted (e.g. resume the agent, or
    `gate.execute(grant.token)`) and its return value is shown; without it the grant is kept
    in `.grant` for the notebook. `widgets=False` forces the text card."""

    def __init__(
        self,
        gate: EffectGate,
        pending: Pending | Card | str,
        *,
        approver: Approver,
        on_grant: Callable[[Grant], Any] | None = None,
        widgets: bool | None = None,
    ) -> None:
        self.gate = gate
        approval_id = pending if isinstance(pending, str) else getattr(pending, "approval_id", None)
        if not isinstance(approval_id, str):  # refused here, not once a button is pressed
            raise TypeError(f"a card takes a Pending, a Card or an approval id, not {type(pending).__name__}")
        if not isinstance(approver, Approver):
            raise TypeError(f"approver must be an Approver(id, role), not {type(approver).__name__}")
        self.approval_id = approval_id
        self.approver = approver
        self.on_grant = on_grant
        self.grant: Grant | None = None
        self.outcome: Decision | None = None
        self.result: Any = None
        self.message = ""
        self._view = card_view(gate, self.approval_id)
        # the version this card asks about: a Pending's or Card's own (what was reviewed, so an
        # amendment since is refused as stale), else the record's
        given = None if isinstance(pending, str) else getattr(pending, "version", None)
        self.version: int = given if isinstance(given, int) else self._view["card"].version
        use_widgets = widgets_available() if widgets is None else widgets
        if use_widgets and _widgets is None:
            raise EffectGateError('ipywidgets is not installed: pip install "effectgate[jupyter]"')
        self.widget: Any = None
        if use_widgets:
            self._build()

    # -- what the card shows

    @property
    def card(self) -> Card:
        return self._view["card"]  # type: ignore[no-any-return]

    def refresh(self) -> None:
        """Re-read the record (the version the buttons decide stays the one first shown)."""
        self._view = card_view(self.gate, self.approval_id)
        self._update()

    def text(self) -> str:
        """The plain-text card: the same stored fields as the HTML card."""
        v, card = self._view, self.card
        lines: list[str] = []
        if card.warnings:
            lines += [
                f"!! {_warning_heading(card.warnings)}",
                *(f"WARNING: {_plain(w)}" for w in card.warnings),
            ]
        outcome, edited = _outcome(card, v["shown"]), _edited(v)
        lines += [f"!! {_plain(note)}" for note in (edited, outcome) if note is not None]
        # The warnings, and the reason of a failed or denied card, are shown above instead.
        lines += [
            _stored_card(card, outcome, v["shown"]).render(),
            f"owner: {_plain(card.owner or '-')}   "
            f"session/user: {_plain(card.session_id)} / {_plain(card.user_id)}",
            f"expires: {when(card.expires_at)} ({v['expires']})",
        ]
        if v["view"].balance is not None:
            lines.append(f"subject balance: {json_line(v['view'].balance)}")
        for e in v["view"].history:
            effect = ", in effect" if e.in_effect else ""
            args = json.dumps(dict(e.args), sort_keys=True)
            lines.append(f"history: {_plain(e.status)} v{_plain(e.version)}{effect} {args}")
        for d in v["decisions"]:
            lines.append(
                f"decision: v{_plain(d.version)} {_plain(d.decision)} by {_plain(d.approver_id)} "
                f"({_plain(d.role)}) {_plain(d.reason or '')}"
            )
        if self.version != card.version:
            lines.append(
                f"! this card asked about version {_plain(self.version)}; the record is now version "
                f"{_plain(card.version)}"
            )
        if self.message:
            lines.append(f"> {_plain(self.message)}")
        return "\n".join(lines)

    def html(self) -> str:
        v, card = self._view, self.card
        rows = [
            ("approval", f"<code>{_e(card.approval_id)}</code> version {_e(card.version)}"),
            ("status", _e(v["shown"])),
            *([("reason", _e(card.reason))] if card.reason and _outcome(card, v["shown"]) is None else []),
            ("approver role", _e(card.approver_role)),
            ("approvals", f"{_e(card.approvals_given)} of {_e(card.approvals_required)}"),
            ("subject", self._subject(card.subject) if card.subject else "-"),
            ("arguments (stored)", "".join(self._arg(a) for a in v["args"])),
            ("args sha256", f"<code>{_e(card.args_hash)}</code>"),
            ("session / user", f"{_e(card.session_id)} / {_e(card.user_id)}"),
            ("owner", _e(card.owner or "-")),
            ("expires", f"{_e(when(card.expires_at))} ({_e(v['expires'])})"),
        ]
        rows += [("note", _e(n)) for n in card.notes]
        if v["view"].balance is not None:
            rows.append(("subject balance", f"<pre>{_e(v['view'].balance)}</pre>"))
        history = "".join(
            f"<li>{_e(e.status)} v{_e(e.version)}{' (in effect)' if e.in_effect else ''}: "
            f"<code>{_e(json.dumps(dict(e.args), sort_keys=True))}</code></li>"
            for e in v["view"].history
        )
        rows.append(
            (f"other {_e(card.tool)} calls on this subject", f"<ul>{history}</ul>" if history else "none")
        )
        decided = "".join(
            f"<li>v{_e(d.version)} {_e(d.decision)} by {_e(d.approver_id)} ({_e(d.role)}) "
            f"{_e(d.reason or '')}</li>"
            for d in v["decisions"]
        )
        if decided:
            rows.append(("decisions", f"<ul>{decided}</ul>"))
        table = "".join(
            f"<tr><td style='vertical-align:top;padding-right:1em'><b>{k}</b></td><td>{val}</td></tr>"
            for k, val in rows
        )
        head = f"<h4>{_e(card.tool)} [{_e(card.effect)}, {_e(card.reversibility)}]</h4>"
        return f"<div class='effectgate-card'>{head}{self._alerts()}<table>{table}</table></div>"

    def _alerts(self) -> str:
        """The warnings and a failed or denied card's reason, above the fields, escaped."""
        card, out = self.card, []
        if card.warnings:
            items = "".join(f"<li><code>{_e(w)}</code></li>" for w in card.warnings)
            out.append(
                "<div class='effectgate-warnings' role='alert' style='border:2px solid #b00020;"
                "background:#fff0f0;color:#600;padding:0.5em 1em;margin:0.5em 0'>"
                f"<b>&#9888; {_e(_warning_heading(card.warnings))}</b><ul>{items}</ul></div>"
            )
        for outcome in (x for x in (_edited(self._view), _outcome(card, self._view["shown"])) if x):
            out.append(
                "<div class='effectgate-outcome' role='status' style='border:1px solid #888;"
                f"padding:0.5em 1em;margin:0.5em 0'><b>{_e(outcome)}</b></div>"
            )
        return "".join(out)

    @staticmethod
    def _subject(subject: Any) -> str:
        """The stored subject as it is, and a copy with its hidden characters written out."""
        text = pretty(subject)
        return f"<pre>{html.escape(text)}</pre>{_revealed(text)}"

    @staticmethod
    def _arg(a: dict[str, Any]) -> str:
        """One stored argument as it is and, when it holds hidden characters, a copy with them
        written out (inside the fold when the value is folded, which the summary then says)."""
        revealed = _revealed(a["text"], f"{_e(a['name'])} " if not a["folded"] else "")
        body = f"<pre>{html.escape(a['text'])}</pre>"
        if a["folded"]:
            hint = "; has hidden characters" if revealed else ""
            label = f"{_e(a['name'])}: {a['size']} characters (folded; open to read all){hint}"
            return f"<details><summary>{label}</summary>{body}{revealed}</details>"
        return f"<div>{_e(a['name'])}{body}</div>{revealed}"

    # -- decisions (what the buttons call)

    def approve(self) -> Decision | None:
        """Approve the version this card shows; a refusal is shown and returns None."""
        decision: Decision | None = self._decide(
            lambda: self.gate.approve(self.approval_id, version=self.version, approver=self.approver)
        )
        return decision

    def deny(self, reason: str | None = None) -> Any:
        """Deny the version this card shows with `reason` (the model is told); None on refusal."""
        why = reason if reason is not None else (self._reason.value if self.widget is not None else "")
        if not why.strip():
            self._say("Give a reason to deny (the model is told); nothing was changed.")
            return None
        return self._decide(
            lambda: self.gate.deny(
                self.approval_id, approver=self.approver, reason=why.strip(), version=self.version
            )
        )

    def _decide(self, act: Callable[[], Any]) -> Any:
        try:
            outcome = act()
        except StaleApproval as exc:
            self.refresh()
            return self._say(
                f"This card changed since it was shown: it asked about version {exc.given}, the record is "
                f"now version {exc.current}. Nothing was changed; show the card again to review it."
            )
        except EffectGateError as exc:
            self.refresh()
            return self._say(f"Refused: {exc}. Nothing was changed.")
        if isinstance(outcome, Grant):
            self.outcome = self.grant = outcome
            message = f"Approved version {outcome.version} as {self.approver.id} ({self.approver.role})."
            if self.on_grant is not None:
                try:
                    self.result = self.on_grant(outcome)
                except EffectGateError as exc:
                    message += f" The application could not use the grant: {exc}."
                except Exception as exc:  # the tool raised: shown on the card, then raised
                    self.refresh()  # the record as it now is (failed, with its reason, or approved)
                    self._say(f"{message} Running it raised {type(exc).__name__}: {exc}.")
                    raise
                else:
                    shown = self.result.result if isinstance(self.result, Executed) else self.result
                    if shown is not None:
                        message += f" Result: {json_line(shown)}"
        elif isinstance(outcome, PartialApproval | Recorded):
            self.outcome = outcome
            message = f"Recorded: {outcome.message}."
        else:
            message = f"Denied version {self.version} as {self.approver.id}."
        self.refresh()
        self._say(message)
        return outcome

    def _say(self, message: str) -> None:
        if self.grant is not None:  # e.g. an on_grant that returns the token: it is never shown
            message = message.replace(self.grant.token, "<grant token>")
        self.message = _plain(message)  # a tool's error quoting the model: printed, it drives nothing
        self._update()

    # -- widgets

    def _build(self) -> None:
        assert _widgets is not None
        w = _widgets
        self._body = w.HTML()
        self.approve_button = w.Button(description=f"Approve v{self.version}", button_style="success")
        self.deny_button = w.Button(description="Deny", button_style="danger")
        self._reason = w.Text(placeholder="reason (the model is told)")
        self._status = w.HTML()
        self.approve_button.on_click(lambda _b: self._press(self.approve))
        self.deny_button.on_click(lambda _b: self._press(self.deny))
        box = w.VBox(
            [self._body, w.HBox([self.approve_button, self._reason, self.deny_button]), self._status]
        )
        self.widget = box
        self._update()

    def _press(self, act: Callable[[], Any]) -> None:
        """A button: what its action raised is shown on the card, never as a raw traceback."""
        shown = self.message
        try:
            act()
        except Exception as exc:
            if self.message == shown:  # else it is on the card already (`_decide`: the tool's error)
                self._say(f"Error: {type(exc).__name__}: {exc}.")

    def _update(self) -> None:
        if self.widget is None:
            return
        self._body.value = self.html()
        self._status.value = f"<b>{_e(self.message)}</b>" if self.message else ""
        # as the inbox offers no form for a record that does not verify (the gate refuses anyway)
        open_ = self.card.status == "pending" and self.card.version == self.version and self._view["intact"]
        self.approve_button.disabled = self.deny_button.disabled = not open_

    # -- display

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {}
        render = getattr(self.widget, "_repr_mimebundle_", None) if self.widget is not None else None
        if callable(render):  # None once the widget's comm is closed: the static card remains
            bundle.update(render() or {})
        bundle["text/plain"] = self.text()
        bundle["text/html"] = self.html()
        return bundle

    def __repr__(self) -> str:
        # the status the executions and sealed decisions say, as the card shows it (not the column)
        shown = (self.card.tool, self.approval_id, f"v{self.version}", self._view["shown"])
        return f"<ApprovalCard {' '.join(_plain(x) for x in shown)}>"

    def __str__(self) -> str:
        return self.text()


def approval_card(
    gate: EffectGate,
    pending: Pending | Card | str,
    *,
    approver: Approver,
    on_grant: Callable[[Grant], Any] | None = None,
    widgets: bool | None = None,
) -> ApprovalCard:
    """The card for `pending` (a Pending, a Card or an approval id); display it as a cell's value."""
    return ApprovalCard(gate, pending, approver=approver, on_grant=on_grant, widgets=widgets)

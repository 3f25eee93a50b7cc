"""The reviewer inbox: a small server-rendered Starlette app over one gate.

Every card is built from the stored approval record (`gate.card`), never from model text, and
shows the gate's warnings (text that is not what it looks like, a record that does not verify or
is sealed under a key the inbox's keyring lacks) beside the values. Model-written values are
always escaped. The inbox lists what the signed-in approver's role may decide; `/?all=1` lists
every pending card, read-only for the others. Forms to decide or reconcile appear only for an
approver whose role may use them, and the gate refuses anyone else anyway. Nothing changes state
on GET; every POST carries the session's CSRF token, and approve/deny carry the approval id,
version and args hash the reviewer saw. A refusal (stale version, expired, wrong role, failed
confirm check, the same approver twice, a record that does not verify) renders a clear message
with status 4xx and changes nothing: the gate decides, the app only shows. Sign-in is throttled
per approver id and per client address, and sessions are live server-side (see `_sessions`):
signing out ends them. Only requests for an allowed host name are served (a page on another name
re-pointed at the inbox, DNS rebinding, is refused), and an SSO header counts only beside the
proxy's shared secret (any local process can send a header).
"""

from __future__ import annotations

import inspect
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from .._display import card_view, keyring_warnings, pretty, reconciliation_queue, tampered_refusal, when
from .._textcheck import reveal
from ..context import Approver
from ..errors import (
    AlreadyDecided,
    ApprovalExpired,
    ConfirmFailed,
    EffectGateError,
    MissingDependency,
    NeedsReconciliation,
    PolicyViolation,
    StaleApproval,
    TamperedRecord,
    UnknownApproval,
    WrongApprover,
)
from ..gate import EffectGate
from ..outcomes import Card, Executed, Grant, PartialApproval, Recorded
from ..report import figures
from ..report._html import STYLE as REPORT_STYLE
from ..report._html import body as report_body
from ..stores._statements import possible_id
from ._auth import ApproverRegistry, RegisteredApprover, csrf_ok, csrf_token
from ._guard import LOCAL_HOSTS, MIN_SSO_SECRET, PROXY_HEADER, SecurityHeaders, from_proxy, host_guard
from ._history import history_context, withheld
from ._reconciling import unsettled_message
from ._sessions import LoginThrottle, Sessions

OnGrant = Callable[[Grant], Any]
_TEMPLATES = Path(__file__).parent / "templates"
SESSION_SECONDS = 8 * 3600
_UNUSABLE = "The approvers file no longer loads: no one can sign in until it is fixed (see the server log)."
_DAYS = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit() also accepts '²' and '٣'
_VERSION = re.compile(r"[0-9]{1,18}")  # and a version a database column holds


def create_app(
    gate: EffectGate,
    approvers: ApproverRegistry,
    *,
    secret_key: str | None = None,
    on_grant: OnGrant | None = None,
    sso_header: str | None = None,
    sso_secret: str | None = None,
    allowed_hosts: Sequence[str] = LOCAL_HOSTS,
    https_only: bool = False,
    login_failures_per_approver: int = 5,
    login_failures_per_client: int = 20,
    login_window_seconds: float = 900.0,
    latency_targets: Mapping[str, float] | None = None,
) -> Starlette:
    """The inbox over `gate`. `on_grant(grant)` receives each minted grant (e.g. to resume the
    agent, or `gate.execute(grant.token)` for a backend that executes on approval; an `async def`
    is awaited) and may return a result to show; without it the page shows the grant token once.
    `sso_header`: the header a trusted proxy sets; its value goes through `approvers.verify` (or
    is the approver id itself without one) and must name a registered approver. It counts only
    on a request whose `X-Effectgate-Proxy-Secret` header equals `sso_secret` (at least 16
    characters, required with `sso_header`: `ValueError` otherwise), which the proxy sets and
    clients never see; without it the request is treated as if it carried no SSO header.
    `allowed_hosts`: the Host names served (default the loopback names; `"*.example.com"` is a
    wildcard, `"*"` allows any); another name gets 400 and reaches no page.
    After `login_failures_per_approver` failed sign-ins for one approver id, or
    `login_failures_per_client` from one client address, within `login_window_seconds`, sign-in
    answers 429 without checking the secret until the window has passed (behind a proxy every
    client shares the proxy's address). The client address is the ASGI server's: uvicorn by
    default takes it from X-Forwarded-For on any request from 127.0.0.1, so a local process picks
    its own and escapes the per-client limit; run it with `proxy_headers=False`, or
    `forwarded_allow_ips` naming only your proxy, as `effectgate serve` does. `latency_targets`
    (seconds per approver role) are the metrics page's p95 targets. Time is `gate.clock`."""
    if sso_header is not None and (sso_secret is None or len(sso_secret) < MIN_SSO_SECRET):
        raise ValueError(
            f"sso_header needs sso_secret: a secret of at least {MIN_SSO_SECRET} characters that "
            f"the proxy sends in {PROXY_HEADER} (any local process can set the SSO header)"
        )
    proxy_secret = (sso_secret or "").encode()
    env = Environment(loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(default=True))
    env.filters["pretty"] = pretty
    env.filters["when"] = when
    # a value edited in the database may be any JSON (a note that is null): shown as its JSON
    env.filters["reveal"] = lambda value: reveal(value if isinstance(value, str) else pretty(value))
    templates = Jinja2Templates(env=env)
    sessions = Sessions(gate.clock, max_age=SESSION_SECONDS)
    throttle = LoginThrottle(
        gate.clock,
        per_approver=login_failures_per_approver,
        per_client=login_failures_per_client,
        window=login_window_seconds,
    )

    def who(request: Request) -> RegisteredApprover | None:
        if sso_header is not None:
            values = request.headers.getlist(sso_header)
            if any(values) and from_proxy(request, proxy_secret):
                if len(values) > 1:  # a client's copy beside the proxy's (a proxy that appends)
                    return None
                approver_id = approvers.verify(values[0]) if approvers.verify else values[0]
                return approvers.get(approver_id)
        live = sessions.approver(request.session.get("sid"))
        found = approvers.get(live[0]) if live is not None else None
        if found is None and approvers.problem:  # refused while its file does not load, not ended
            return None
        if live is not None and (found is None or found.secret_hash != live[1]):
            sessions.end(request.session.get("sid"))  # revoked, or a new secret (a leak): for good
            return None
        return found

    def may_decide(me: RegisteredApprover, card: Card) -> bool:
        """Whether `me`'s role may decide `card` (the gate checks again on every decision)."""
        return gate.policy.role_satisfies(me.role, card.approver_role)

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        me = who(request)
        base = {"me": me, "csrf": csrf_token(request.session), "now": gate.clock.now()}
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)

    def signed_in(
        handler: Callable[[Request, RegisteredApprover], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            me = who(request)
            if me is None:
                return RedirectResponse("/login", status_code=303)
            if request.method == "POST":
                form = await request.form()
                if not csrf_ok(request.session, form.get("csrf")):
                    message = "Missing or wrong CSRF token; nothing was changed."
                    return page(request, "message.html", 403, title="Refused", message=message)
                if any(not isinstance(value, str) for _, value in form.multi_items()):
                    message = "The form sent a file where text belongs; nothing was changed."
                    return page(request, "message.html", 400, title="Refused", message=message)
            return await handler(request, me)

        return endpoint

    async def login_form(request: Request) -> Response:
        return page(request, "login.html")

    async def login(request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request.session, form.get("csrf")):
            return page(request, "login.html", 403, error="Missing or wrong CSRF token.")
        approver_id = str(form.get("approver", ""))
        client = request.client.host if request.client is not None else "unknown"
        if not len(approvers) and approvers.problem:  # (len reads its file again) no one signs in
            return page(request, "login.html", 503, error=_UNUSABLE)
        wait = throttle.begin(approver_id, client)
        if wait is not None:
            minutes = -(-wait // 60)
            error = (
                "Too many failed sign-in attempts for this approver or from this address. "
                f"Try again in {minutes} minute{'s' if minutes != 1 else ''}; the secret was not checked."
            )
            response = page(request, "login.html", 429, error=error)
            response.headers["retry-after"] = str(wait)
            return response
        found = await run_in_threadpool(approvers.check_secret, approver_id, str(form.get("secret", "")))
        if found is None:
            return page(request, "login.html", 401, error="Unknown approver or wrong secret.")
        throttle.succeeded(approver_id, client)
        sessions.end(request.session.get("sid"))
        request.session.clear()  # a new session on sign-in: no fixation
        request.session["sid"] = sessions.start(found.id, found.secret_hash)
        request.session["csrf"] = secrets.token_urlsafe(32)
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request) -> Response:
        # No CSRF check: a forged sign-out only signs out, and a page's stale token (a tab opened
        # before a re-sign-in) must not leave the session live behind a sign-in page.
        sessions.end(request.session.get("sid"))  # a copy of the cookie stops working too
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    async def inbox(request: Request, me: RegisteredApprover) -> Response:
        show_all = request.query_params.get("all") == "1"
        session = request.query_params.get("session") or None
        role = (request.query_params.get("role") or None) if show_all else me.role
        # a NUL names no session (PostgreSQL's text cannot hold one: the query would fail)
        named = session is None or possible_id(session)
        pending = await run_in_threadpool(gate.pending, role=role, session_id=session) if named else []
        cards = await run_in_threadpool(keyring_warnings, gate, pending)
        yours = {c.approval_id for c in cards if may_decide(me, c)}
        return page(
            request, "inbox.html", cards=cards, yours=yours, show_all=show_all, role=role, session=session
        )

    async def show(request: Request, me: RegisteredApprover) -> Response:
        try:
            context = await run_in_threadpool(card_view, gate, request.path_params["id"])
        except UnknownApproval:
            return page(request, "message.html", 404, title="Not found", message="No such approval.")
        card: Card = context["card"]
        yours = may_decide(me, card)
        decidable = card.status == "pending" and yours and context["intact"]
        held = withheld(gate, me.id, context) if decidable else None  # an approval the gate refuses
        return page(request, "card.html", yours=yours, decidable=decidable, held=held, **context)

    def refused(request: Request, status: int, title: str, message: str, link: str | None = None) -> Response:
        return page(request, "message.html", status, title=title, message=message, link=link)

    async def decide(request: Request, me: RegisteredApprover) -> Response:
        approval_id = request.path_params["id"]
        action = request.path_params["action"]
        if action not in ("approve", "deny"):
            return refused(request, 404, "Not found", "No such action.")
        form = await request.form()
        given = str(form.get("version", ""))  # as a card writes it: int() also takes '١', '+1', ' 1'
        if not _VERSION.fullmatch(given):
            return refused(request, 400, "Refused", "The form names no version; nothing was changed.")
        version = int(given)
        approver = Approver(me.id, me.role)
        try:
            current = await run_in_threadpool(gate.card, approval_id)
            # a version no card showed is refused first; one edited to text is the gate's to refuse
            if isinstance(current.version, int) and version > current.version:  # (an amendment
                raise StaleApproval(approval_id, version, current.version)  # landing would pass)
            if current.version == version and str(form.get("args_hash", "")) != current.args_hash:
                message = (
                    "The arguments you saw are not the stored ones; nothing was changed: review it again."
                )
                return refused(request, 409, "Stale card", message, approval_id)
            if action == "approve":
                outcome: Any = await run_in_threadpool(
                    lambda: gate.approve(approval_id, version=version, approver=approver)
                )
            else:
                reason = str(form.get("reason", "")).strip()
                outcome = await run_in_threadpool(
                    lambda: gate.deny(approval_id, approver=approver, reason=reason, version=version)
                )
        except UnknownApproval:
            return refused(request, 404, "Not found", "No such approval.")
        except StaleApproval as exc:
            if exc.given < exc.current:
                message = (
                    f"This card changed since you opened it: you saw version {exc.given}, it is now "
                    f"version {exc.current}. Nothing was changed; review it again."
                )
            else:
                message = (
                    f"Version {exc.given} of this card does not exist yet: it is at version "
                    f"{exc.current}. Nothing was changed; review the current version."
                )
            return refused(request, 409, "Stale card", message, approval_id)
        except ApprovalExpired:
            return refused(request, 410, "Expired", "This approval expired; nothing changed.", approval_id)
        except WrongApprover as exc:
            return refused(request, 403, "Not yours to decide", f"{exc}. Nothing was changed.", approval_id)
        except TamperedRecord as exc:  # the message says nothing was changed, and what to do
            title, message = await run_in_threadpool(tampered_refusal, gate, exc)
            return refused(request, 409, title, message, approval_id)
        except (ConfirmFailed, AlreadyDecided, PolicyViolation) as exc:
            return refused(request, 409, "Refused", f"{exc}. Nothing was changed.", approval_id)
        shown: Any = None
        token: str | None = None
        if isinstance(outcome, Grant):
            if on_grant is not None:
                try:
                    shown = await run_in_threadpool(on_grant, outcome)
                    shown = await shown if inspect.isawaitable(shown) else shown  # an async on_grant
                except Exception as exc:  # the decision stands: say what happened, never a bare 500
                    shown = f"the application could not use the grant: {type(exc).__name__}: {exc}"
            else:
                token = outcome.token
        shown = shown.result if isinstance(shown, Executed) else shown
        if shown is not None and isinstance(outcome, Grant):  # handed to on_grant: never on the page
            shown = pretty(shown).replace(outcome.token, "<grant token>")
        return page(
            request,
            "decided.html",
            action=action,
            outcome=outcome,
            partial=isinstance(outcome, PartialApproval),
            shadow=isinstance(outcome, Recorded),
            shown=shown,
            token=token,
            approval_id=approval_id,
            version=version,
        )

    async def history(request: Request, me: RegisteredApprover) -> Response:
        return page(request, "history.html", **await run_in_threadpool(history_context, gate))

    async def reconciliation(request: Request, me: RegisteredApprover) -> Response:
        try:
            items = await run_in_threadpool(reconciliation_queue, gate, me.role)
            return page(request, "reconciliation.html", items=items)
        except EffectGateError as exc:  # a record edited outside effectgate (a StoreError naming it)
            return refused(request, 409, "The queue cannot be read", f"{exc}. Nothing was changed.")

    def metrics_context(days: int | None) -> dict[str, Any] | None:
        """The report's figures and charts over the last `days` (all time without), or None
        without the report extra."""
        since = None if days is None else gate.clock.now() - days * 86400
        report = figures(gate.store, since=since, targets=latency_targets, keyring=gate.keyring)
        try:
            drawn = report_body(report)
        except MissingDependency:
            return None
        # markup already: report_body escapes every ledger value itself, the style is a constant
        return {"report": Markup(drawn), "style": Markup(REPORT_STYLE), "days": days}  # noqa: S704

    async def metrics(request: Request, me: RegisteredApprover) -> Response:
        given = request.query_params.get("days", "")
        days = int(given) if _DAYS.fullmatch(given) and 0 < int(given) <= 36500 else None
        if given and days is None:
            return refused(request, 400, "Refused", "days must be a whole number of days, 1 to 36500.")
        context = await run_in_threadpool(metrics_context, days)
        if context is None:
            message = 'The metrics page draws charts with matplotlib: pip install "effectgate[report]".'
            return page(request, "message.html", 501, title="Metrics unavailable", message=message)
        return page(request, "metrics.html", **context)

    async def reconcile(request: Request, me: RegisteredApprover) -> Response:
        approval_id = request.path_params["id"]
        approver = Approver(me.id, me.role)
        try:
            settled = await run_in_threadpool(lambda: gate.reconcile(approval_id, approver=approver))
        except UnknownApproval:
            return refused(request, 404, "Not found", "No such approval.")
        except WrongApprover as exc:
            return refused(request, 403, "Not yours to settle", f"{exc}. Nothing was changed.", approval_id)
        except Exception as exc:  # a refusal changed nothing; a lookup or a run again that raised: said
            if isinstance(exc, EffectGateError) and not isinstance(exc, NeedsReconciliation):
                return refused(request, 409, "Refused", f"{exc}. Nothing was changed.", approval_id)
            message = f"Reconciling raised {type(exc).__name__}: {exc}. Open the card to see where it stands."
            return refused(request, 502, "Reconciliation failed", message, approval_id)
        message = (
            f"Settled: {pretty(settled.result)}"
            if settled is not None
            else await run_in_threadpool(unsettled_message, gate, approval_id)
        )
        return page(request, "message.html", title="Reconciliation", message=message, link=approval_id)

    routes = [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", signed_in(inbox), methods=["GET"]),
        Route("/approvals/{id}", signed_in(show), methods=["GET"]),
        Route("/approvals/{id}/{action:str}", signed_in(decide), methods=["POST"]),
        Route("/history", signed_in(history), methods=["GET"]),
        Route("/reconciliation", signed_in(reconciliation), methods=["GET"]),
        Route("/reconciliation/{id}", signed_in(reconcile), methods=["POST"]),
        Route("/metrics", signed_in(metrics), methods=["GET"]),
    ]
    middleware = [
        Middleware(
            SessionMiddleware,
            secret_key=secret_key or secrets.token_urlsafe(32),
            session_cookie="effectgate_session",
            same_site="lax",  # a card link from Slack or mail opens signed in; no GET decides
            https_only=https_only,
            max_age=SESSION_SECONDS,
        )
    ]
    return Starlette(
        routes=routes, middleware=[Middleware(SecurityHeaders), host_guard(allowed_hosts), *middleware]
    )

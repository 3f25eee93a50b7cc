"""Model proposal against human decision: the disagreement rate per tool and per approver role,
and the rollout figures (`metrics`): p95 approval latency per role against a target, decision
rates per tool, replays absorbed, gated proposals per 1,000 sessions per day (in all and per model
identifier), the reconciliation backlog. `figures` computes all of it; `render_html` draws it.

    rates = disagreement(store, by="tool", since=..., until=..., keyring=keyring)
    report = figures(store, since=..., until=..., targets={"finance": 300}, keyring=keyring)
    write_html(report, "report.html")            # needs the report extra (matplotlib)

Over the gated calls proposed in a window (`created_at` in [since, until); each bound None or a
finite number of seconds, else ValueError), for each tool (or approver role) and mode (shadow or
live):

- `decided`: approved (including those that then ran, failed or await reconciliation) or denied;
- `denied`, and `edited`: a reviewer edited the arguments (an amendment recorded with `edited_by`);
- `disagreement` = (denied or edited) / decided: how often people did not take the model's call
  as it was. A team reads it per tool to see from data when a class may leave shadow mode.
- `undecided` (pending or expired; an approval still pending past its expiry, not yet swept
  by the gate, is expired: it can no longer be decided) and `rejected` (out of scope, never
  shown to a reviewer) are counted beside, never in the rate.

The mode of a call is re-derived, not read from a mutable column: an approval's sealed row
fingerprint names the recorded table row, whose body must hash to that fingerprint; a row whose
body says `shadow` was proposed in shadow mode. The fingerprint is trusted only as far as the
approval's seal: given the ledger's keyring (`figures(store, keyring=...)`), the report checks every
approval's seal, and a call whose seal does not verify, or whose recorded row cannot be verified,
is counted under mode "unverified", never shadow or live (`Figures.unverified` counts the first);
so is a call whose status (no seal covers it) its sealed count of grants contradicts: approved,
run or failed with no grant minted (a shadow call's approval mints none), or pending or expired
with one (a denial edited into an approval is not counted approved), or denied with no sealed
deny decision, or not denied with one, or no status the gate writes.
Without a keyring no seal is checked: the report says its figures are unverified (`Figures.note`,
in the JSON and the page) and points to `effectgate audit`.

The rollout figures (`Metrics`), over the same window (events by their time):

- `latency_p95_s`: per approver role, the p95 (nearest rank, `p95`) of the time from a call's
  proposal to its decision (its deny, else the last approve of its first grant round), read from
  the chained proposal event and the append-only decisions, never from the approval's unsealed
  `created_at`/`decided_at` columns, over its decided calls, against `latency_targets`
  (`latency_met`); a role given a target and no decided call is listed with None (a target is a
  finite number of seconds > 0, else ValueError);
- `decision_rates`: per tool, approved, denied, edited and expired over the calls that settled
  (decided or expired); an edited call is also approved or denied;
- `replays_absorbed` (the same message again, answered from the record) and `replay_rate`, over
  proposals plus replays; `replays_by_day`;
- `gated_by_day`: gated proposals (not rejected) per UTC day against the sessions with any event
  that day; `gated_by_model` splits the proposals by the model identifier that proposed them
  (`CallContext.model_id`, '' when the application gave none), each over the sessions that had a
  call of that model that day (the event log records the model with each call): a model upgrade
  that doubles refund proposals shows as a step in its line, and two models sharing a day's
  traffic each get their own rate;
- `needs_reconciliation`: operations whose outcome is unknown now (not windowed), and
  `backlog_by_day` the same records by the day each began waiting; `backlog_erased`, counted
  apart, the records of calls erased with them (a run that lost its lease came back after its
  call was settled and erased: nothing settles it, so it is no open item). A redaction marker
  in a record's error with no redaction entry for it (given the keyring, none whose seal
  verifies) erases nothing: that record is in the backlog.

Every figure is an aggregate the database computes (`Store.report_rows`), streamed as a few grouped
rows, so the report runs over millions of records within the audit's budget; checking the seals
streams the approvals' sealed fields once more (one HMAC each, `_seal.seal_checker`).
"""

from __future__ import annotations

from ._counting import disagreement, edited_approvals, figures, metrics, modes
from ._figures import Figures, Metrics, Mode, Rate, ToolRates, p95, p95_rank, per_1000
from ._html import check_charts, render_html, write_html

__all__ = [
    "Figures",
    "Metrics",
    "Mode",
    "Rate",
    "ToolRates",
    "check_charts",
    "disagreement",
    "edited_approvals",
    "figures",
    "metrics",
    "modes",
    "p95",
    "p95_rank",
    "per_1000",
    "render_html",
    "write_html",
]

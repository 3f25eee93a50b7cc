"""The reviewer inbox (`effectgate serve`): pending cards from the stored records, approve and
deny as CSRF-protected forms, the reconciliation queue and the decided history.

    from effectgate.web import ApproverRegistry, RegisteredApprover, create_app, hash_secret
    approvers = ApproverRegistry([RegisteredApprover("fiona", "finance", hash_secret("..."))])
    app = create_app(gate, approvers, secret_key=..., on_grant=...)   # an ASGI app

Needs the `web` extra: pip install "effectgate[web]".
"""

from __future__ import annotations

from ..errors import MissingDependency

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by test_web's install-hint test
    raise MissingDependency("starlette and jinja2 (the reviewer inbox)", "web") from exc

from ._app import create_app
from ._auth import ApproverRegistry, RegisteredApprover, hash_secret, verify_secret

__all__ = ["ApproverRegistry", "RegisteredApprover", "create_app", "hash_secret", "verify_secret"]

"""An export's manifest (`effectgate.export`): what one export file holds, signed with the keyring."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ._export_file import read_small, strict_loads
from .canonical import canonical_json
from .errors import EffectGateError, TokenError
from .tokens import Keyring

FORMAT = "effectgate-export/2"
#: Formats `verify_export` reads and an export may continue: /1 put the whole arguments inside the
#: chain (no `personal`); its chain links the same way, so a /2 export continues a /1 chain.
READABLE = ("effectgate-export/1", FORMAT)
#: The fields of a chain line, in the order the exporter writes them, per format.
LINE_FIELDS = {
    "effectgate-export/1": ["seq", "prev", "hash", "record"],
    FORMAT: ["seq", "prev", "hash", "record", "personal"],
}
GENESIS = "0" * 64
PURPOSE = "export-manifest"
#: The largest manifest `Manifest.load` reads (bytes): a few heads, far below it.
MAX_MANIFEST = 1024 * 1024


class ExportError(EffectGateError):
    """The export was refused (the ledger has audit findings, or the previous manifest is not
    this keyring's); nothing was written."""


@dataclass(frozen=True)
class Manifest:
    """What one export file holds, signed: verify the signature before trusting any field."""

    format: str
    key_id: str
    first_seq: int | None
    last_seq: int | None
    count: int
    start: str  # the chain head this file continues (the previous export's, or GENESIS)
    head: str  # the hash of the file's last line (== start when the file is empty)
    after_seq: int  # records with a greater sequence number are in this file or later ones
    created_at: float
    signature: str = ""
    #: the ledger's chain heads at export time (`effectgate._pins`); None in older manifests
    heads: dict[str, dict[str, Any]] | None = None

    def body(self) -> bytes:
        fields = asdict(self)
        fields.pop("signature")
        if fields["heads"] is None:  # a manifest from before pins was signed without the field
            fields.pop("heads")
        return canonical_json(fields)

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=2) + "\n"

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read a manifest (at most MAX_MANIFEST bytes, strict JSON: a repeated key is refused);
        ExportError when it is not one. Its signature is checked by `check`, not here."""
        try:
            data = strict_loads(read_small(path, limit=MAX_MANIFEST))
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            required = {f.name: f.default is MISSING for f in fields(cls)}
            if unknown := sorted(data.keys() - required.keys()):  # its own words, not `__init__()`'s
                raise TypeError(f"unknown field(s) {', '.join(map(repr, unknown[:5]))}")
            if missing := [name for name, needed in required.items() if needed and name not in data]:
                raise TypeError(f"missing field(s) {', '.join(map(repr, missing))}")
            return cls(**data)
        except (OSError, ValueError, TypeError, RecursionError) as exc:
            raise ExportError(f"{path} is not an export manifest: {exc}") from exc

    def check(self, keyring: Keyring) -> None:
        """Raise ExportError unless this manifest was signed with a key of `keyring`."""
        if self.format not in READABLE:
            raise ExportError(f"unknown export format {self.format!r} (this reads {', '.join(READABLE)})")
        try:
            keyring.verify_signature(PURPOSE, self.body(), self.signature)
        except TokenError as exc:
            raise ExportError(f"the manifest's signature does not verify: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # a number canonical JSON cannot carry, or
            # nesting deeper than it reads (an edit): no exporter signed it
            raise ExportError(f"the manifest is not one an export wrote: {exc}") from exc
        if not self.signature.startswith(f"{self.key_id}."):
            raise ExportError("the manifest's key id is not the key that signed it")


def manifest_path(path: str | Path) -> Path:
    return Path(f"{path}.manifest.json")


def refuse_overwriting(target: Path, manifest: Manifest) -> None:
    """Raise ExportError when `target`, or its manifest, is `manifest` (the same signature):
    writing there would replace that export (its records, or the signed manifest itself)."""
    for path in (manifest_path(target), target):
        try:
            held = Manifest.load(path).signature == manifest.signature
        except ExportError:
            continue
        if held:
            raise ExportError(
                f"{target} holds the export this one continues (or its manifest): write the new "
                "export to another file; nothing was exported or written"
            )


def personal_of(path: Path, number: int, line: Mapping[str, Any], user_id: str) -> dict[str, Any]:
    """A line's personal values (outside its chain), as `redact_export` erases them. ExportError
    for a line of `user_id` that has none beside its record (the first format, /1): its arguments
    are inside the chain, where no erasure reaches them and leaves the file verifying."""
    if "personal" not in line and line["record"].get("user_id") == user_id:
        raise ExportError(
            f"{path} was not changed: line {number} is of the first export format ({READABLE[0]}), "
            "whose arguments are inside its chain and cannot be erased: export the ledger anew to "
            "another file and delete this one"
        )
    return {**(line.get("personal") or {})}

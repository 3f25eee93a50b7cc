"""Ready-made tools with their effect rows; add them to an `EffectTable` like your own.

- `effectgate.tools.files`: `file_tools(root, approver_role=...)`, file tools confined to one work
  directory (read, list, search, write with before/after state, delete behind approval), and
  `PathRefused`, the error for a path they will not touch.
"""

from .files import PathRefused, file_tools

__all__ = ["PathRefused", "file_tools"]

"""Save an agent's memory and restore it in another process, signed so a tampered blob is refused.

smolagents has no memory serializer; its steps pickle and unpickle correctly. Pickle runs code
on load, so the blob carries an HMAC from the gate's keyring (with its key id), and nothing is
unpickled until the MAC checks out. Keep the blob server-side all the same.
"""

from __future__ import annotations

import pickle

from smolagents.agents import MultiStepAgent

from effectgate import Keyring
from effectgate.errors import TokenError

_MAGIC = b"effectgate-smolagents-memory/1\n"
_PURPOSE = "smolagents-memory"


def save_memory(agent: MultiStepAgent, keyring: Keyring) -> bytes:
    """The agent's memory steps as a signed blob."""
    data = pickle.dumps(agent.memory.steps, protocol=pickle.HIGHEST_PROTOCOL)
    return _MAGIC + keyring.sign(_PURPOSE, data).encode() + b"\n" + data


def restore_memory(agent: MultiStepAgent, blob: bytes, keyring: Keyring) -> None:
    """Replace the agent's memory steps with the blob's; TokenError (and no change) if tampered."""
    if not blob.startswith(_MAGIC):
        raise TokenError("malformed", "not an effectgate smolagents memory blob")
    signature, sep, data = blob[len(_MAGIC) :].partition(b"\n")
    if not sep:
        raise TokenError("malformed", "the memory blob has no signature line")
    keyring.verify_signature(_PURPOSE, data, signature.decode("ascii", "replace"))
    steps = pickle.loads(data)  # noqa: S301 - verified above: written by save_memory with this keyring
    if not isinstance(steps, list):
        raise TokenError("malformed", "the memory blob does not hold a list of steps")
    agent.memory.steps = steps

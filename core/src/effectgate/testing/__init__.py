"""Public testing helpers: a framework-neutral scripted planner, a fake clock, an effect recorder.

`Script([call("get_order", order_id="1042"), say("It ships today.")])` is what every adapter's
fake model replays. It is strict: asking for a step past the end raises, and `assert_complete()`
fails while steps are left. It never cycles and never branches on message count.
"""

from ._clock import FakeClock
from ._recorder import Effect, EffectRecorder
from ._script import Call, Say, Script, ScriptError, Step, call, say, step

__all__ = [
    "Call",
    "Effect",
    "EffectRecorder",
    "FakeClock",
    "Say",
    "Script",
    "ScriptError",
    "Step",
    "call",
    "say",
    "step",
]

"""The recorder: MCP messages -> token estimates on spans, session budgets, guard actions and metrics.

:class:`TokenRecorder` is the one object adapters and the proxy talk to; each message exchange is a
:class:`Call` it hands out (``recorder.begin(...)``). It composes the session ledger (``ledger``), the span
annotator (``spans``), the guard orchestration (``guarding``), the label bounds (``labels``), the context costs
(``context_costs``) and the one aggregate every emitter reads.
"""

from .call import Call
from .ledger import SIDES, Side
from .spans import CAPTURE_ENV, capture_from_env
from .token_recorder import TokenRecorder

__all__ = ["CAPTURE_ENV", "SIDES", "Call", "Side", "TokenRecorder", "capture_from_env"]

"""The recorder: MCP messages -> token estimates on spans, session budgets, guard actions and metrics.

:class:`TokenRecorder` is the one object adapters and the proxy talk to; it composes the session ledger
(``ledger``), the span annotator (``spans``), the guard orchestration (``guarding``), the label bounds
(``labels``) and the sink fan-out (``fanout``).
"""

from .facade import TokenRecorder
from .ledger import SIDES, Side
from .spans import CAPTURE_ENV, capture_from_env

__all__ = ["CAPTURE_ENV", "SIDES", "Side", "TokenRecorder", "capture_from_env"]

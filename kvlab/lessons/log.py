"""The course's event log: checks and comparison tables append one JSON line each, for the tests.

When $KVLAB_EXERCISE_LOG names a file (the notebook tests set it), every exercise check and every
comparison table appends a record, so a figure that drifts from the lesson fails CI instead of only
showing a mark in the notebook. Unset, logging does nothing.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

LOG_ENV = "KVLAB_EXERCISE_LOG"


def log_event(record: dict[str, Any]) -> None:
    """Append one JSON line to the file named by $KVLAB_EXERCISE_LOG (tests read it); no-op when unset."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as exc:  # logging is for tests; a student's check must still work
        warnings.warn(f"could not append to {LOG_ENV}={path!r}: {exc}", stacklevel=3)

"""Lesson 002: prefix caching for a fleet of chat users.

The flow runs one way: a ``FleetConfig`` names a scenario (``config``);
``chat_traffic`` draws the lesson's requests, many users in multi-turn chats
behind one shared system prompt (``traffic``); each request's full blocks get
chained keys that are equal exactly when the whole prefixes are (``keys``); the
lesson's least-recently-used block store serves them, one store per replica
(``store``); ``simulate`` / ``simulate_many`` route the requests, run the stores
or the engine model (``kvlab.models.prefix_cache``, vLLM's pool, where running
work pins blocks) and return a ``FleetResult`` with a per-request ``FleetTrace``
(``simulate``).

The lesson's six scenarios and their table are lesson material:
``kvlab.lessons.fleet`` (``LESSON_SCENARIOS``, ``lesson_table``).
"""

from kvlab.fleet.config import HASH_SCHEMES, HEADERS, KIB_PER_TOKEN, ROUTINGS, SALTS, FleetConfig
from kvlab.fleet.simulate import FleetResult, FleetTrace, replica_capacities, route, simulate, simulate_many
from kvlab.fleet.traffic import (
    ANSWER_TOKENS,
    MESSAGE_TOKENS,
    VOCAB,
    ChatTraffic,
    UserTurn,
    chat_traffic,
    timestamp_tokens,
)

__all__ = [
    "ANSWER_TOKENS",
    "HASH_SCHEMES",
    "HEADERS",
    "KIB_PER_TOKEN",
    "MESSAGE_TOKENS",
    "ROUTINGS",
    "SALTS",
    "VOCAB",
    "ChatTraffic",
    "FleetConfig",
    "FleetResult",
    "FleetTrace",
    "UserTurn",
    "chat_traffic",
    "replica_capacities",
    "route",
    "simulate",
    "simulate_many",
    "timestamp_tokens",
]

"""One scenario of lesson 002's fleet: ``FleetConfig`` and the choices its fields take.

A config is plain, validated data: it holds no traffic and runs nothing. Two configs
with the same users, turns, seed and system prompt replay the very same requests
(``kvlab.fleet.traffic``); the other fields only change how those requests are keyed,
routed and cached. ``salt_of`` names the salt a user's chains start from, the one
rule about users that the keys and the engine model both need.

Names against the real engines: ``salt`` is vLLM's per-request ``cache_salt``;
``replicas`` with ``routing="user-hash"`` is a sticky-session router in front of
several engine instances, each with its own prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.errors import InvalidArgumentError, brief, check_choice, check_size
from kvlab.fleet.traffic import HEADERS, check_seed, check_traffic_size

KIB_PER_TOKEN = 128  # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes

SALTS = ("none", "user", "tenant")
ROUTINGS = ("round-robin", "user-hash")
HASH_SCHEMES = ("exact", "sha256-repr", "lesson", "vllm")


@dataclass(frozen=True)
class FleetConfig:
    """One scenario of the lesson's simulation.

    ``header`` is where a volatile timestamp goes: ``"none"``; ``"start"``, before
    the system prompt (the lesson's row 5); or ``"before-message"``, in front of
    each new message. A timestamp written before a message is part of that
    message, so it stays in the history the later turns resend.

    ``salt`` gives each user (``"user"``) or each tenant (``"tenant"``, with
    ``tenants``) its own hash chains, as vLLM's ``cache_salt`` does. Tenants are
    contiguous groups of users of near-equal size: user u belongs to tenant
    ``u * tenants // users`` (200 users, 10 tenants: users 0-19 are tenant 0, ...);
    ``tenants`` need not divide ``users``.

    ``replicas`` splits the fleet: each replica has its own store with an equal
    share of ``capacity_blocks`` (the first ``capacity_blocks % replicas`` get one
    block more). ``routing`` sends request i to replica ``i % replicas``
    (``"round-robin"``) or user u always to the replica given by a SHA-256 of
    ``"user-{u}"`` (``"user-hash"``, a sticky session).

    ``hash_scheme`` picks how block keys are made (``kvlab.fleet.keys``); any of
    them gives the same numbers.

    Bounds, all checked here before any traffic is drawn (``kvlab.errors.LIMITS``): users, turns
    and the system prompt as in ``kvlab.fleet.traffic.check_traffic_size`` (which also caps the
    traffic's total tokens at ``LIMITS.total_tokens``); ``block_size`` at most
    ``LIMITS.block_size``; ``replicas`` at most ``LIMITS.replicas``; ``tenants`` at most the users;
    ``capacity_blocks`` at most ``LIMITS.total_tokens`` (a store never holds more blocks than the
    traffic has tokens, so a larger cache is the same cache; the lesson's store only holds what
    it is sent, while the engine model, which builds its pools, is bounded by ``LIMITS.num_blocks``
    per replica in ``simulate_many``).
    """

    users: int = 200
    turns: int = 6
    seed: int = 1
    system_tokens: int = 1200
    block_size: int = 16
    capacity_blocks: int = 20_000
    header: str = "none"
    salt: str = "none"
    tenants: int | None = None
    replicas: int = 1
    routing: str = "round-robin"
    hash_scheme: str = "exact"

    def __post_init__(self) -> None:
        sized = {
            "block_size": check_size("block_size", self.block_size, "block_size", minimum=1),
            "capacity_blocks": check_size("capacity_blocks", self.capacity_blocks, "total_tokens"),
            "replicas": check_size("replicas", self.replicas, "replicas", minimum=1),
            "seed": check_seed(self.seed),
        }
        sized["users"], sized["turns"], sized["system_tokens"] = check_traffic_size(
            self.users, self.turns, self.system_tokens
        )
        for name, value in sized.items():  # numpy ints and int subclasses are kept as plain ints
            object.__setattr__(self, name, value)
        for name, choices in (
            ("header", HEADERS),
            ("salt", SALTS),
            ("routing", ROUTINGS),
            ("hash_scheme", HASH_SCHEMES),
        ):
            # a str subclass equal to a choice is kept as the plain str
            object.__setattr__(self, name, check_choice(name, getattr(self, name), choices))
        if self.salt == "tenant":
            if self.tenants is None:
                raise InvalidArgumentError(
                    "salt='tenant' needs tenants=K, the number of tenants (the lesson uses 10)"
                )
            object.__setattr__(self, "tenants", check_size("tenants", self.tenants, "users", minimum=1))
            if self.tenants > self.users:
                raise InvalidArgumentError(
                    f"tenants ({self.tenants}) cannot exceed users ({self.users}): each tenant needs a user"
                )
        elif self.tenants is not None:
            raise InvalidArgumentError(
                f"tenants={brief(self.tenants)} only applies with salt='tenant' (salt is {self.salt!r}); "
                "set salt='tenant' or leave tenants out"
            )

    @property
    def cache_gib(self) -> float:
        """The cache's size in GiB at the lesson's 128 KiB of KV per token."""
        return self.capacity_blocks * self.block_size * KIB_PER_TOKEN / 2**20

    def describe(self) -> str:
        """A short scenario name that lists what differs from the lesson's stable-prefix row."""
        base = FleetConfig()
        parts = [f"cache {self.capacity_blocks:,} blocks"]
        for name in ("users", "turns", "seed", "system_tokens", "block_size"):
            if getattr(self, name) != getattr(base, name):
                parts.append(f"{name.replace('_', ' ')} {getattr(self, name):,}")
        if self.header == "start":
            parts.append("timestamp before the system prompt")
        elif self.header == "before-message":
            parts.append("timestamp before each message")
        if self.salt == "tenant":
            parts.append(f"salt per tenant ({self.tenants})")
        elif self.salt == "user":
            parts.append("salt per user")
        if self.replicas > 1:
            parts.append(f"{self.replicas} replicas {self.routing}")
        return ", ".join(parts)


def salt_of(config: FleetConfig, user: int) -> str | None:
    """The cache salt of ``user``'s requests: ``"user-{u}"``, ``"tenant-{t}"``, or None (shared by all)."""
    if not isinstance(config, FleetConfig):
        raise InvalidArgumentError(f"config must be a FleetConfig, got {type(config).__name__}")
    user = check_user(config, user)
    if config.salt == "user":
        return f"user-{user}"
    if config.salt == "tenant":
        assert config.tenants is not None
        return f"tenant-{user * config.tenants // config.users}"
    return None


def check_user(config: FleetConfig, user: object) -> int:
    """A user number of ``config``: 0..users - 1."""
    from kvlab.errors import InvalidArgumentError, check_int

    if not isinstance(config, FleetConfig):
        raise InvalidArgumentError(f"config must be a FleetConfig, got {type(config).__name__}")
    return check_int("user", user, minimum=0, maximum=config.users - 1)

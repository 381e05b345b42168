"""What ``kvlab serve`` was started with, and the engine and scheduler it builds from that."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvlab.engine.scheduler import DEFAULT_MAX_NUM_SEQS, MAX_SLOTS
from kvlab.errors import InvalidArgumentError, cdiv, check_choice, check_int, check_optional_str, check_size
from kvlab.serve.protocol import DEFAULT_MAX_BODY_BYTES

DEFAULT_MODEL_NAME = "kvlab-tiny"


@dataclass(frozen=True)
class ServeConfig:
    """The server's options (``python -m kvlab serve --help`` explains each)."""

    host: str = "127.0.0.1"
    port: int = 8000
    cache: str = "blocks"
    block_size: int = 16
    num_blocks: int | None = None
    slots: int = 1
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int = 4096
    num_layers: int = 4
    d_model: int = 256
    slot_save_path: str | None = None
    api_key: str | None = None
    model_name: str = DEFAULT_MODEL_NAME
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    threads: int = 1

    def __post_init__(self) -> None:
        check_choice("cache", self.cache, ("blocks", "slot", "off"), what="cache mode")
        check_int("port", self.port, minimum=0, maximum=65535)
        check_size("block_size", self.block_size, "block_size", minimum=1)
        check_int("slots", self.slots, minimum=1, maximum=MAX_SLOTS)
        check_size("max_num_seqs", self.max_num_seqs, "slots", minimum=1)
        check_size("max_model_len", self.max_model_len, "tokens", minimum=2)
        check_int("num_layers", self.num_layers, minimum=1, maximum=64)
        check_int("d_model", self.d_model, minimum=16, maximum=4096)
        check_int("max_body_bytes", self.max_body_bytes, minimum=1024, maximum=1 << 30)
        check_int("threads", self.threads, minimum=1, maximum=1024)
        check_optional_str("slot_save_path", self.slot_save_path, allow_empty=False)
        check_optional_str("api_key", self.api_key, allow_empty=False)
        if self.slots != 1 and self.cache != "slot":
            raise InvalidArgumentError("--slots is for --cache slot (llama-server's -np)")
        if self.d_model % 8 or (self.d_model // 8) % 2:
            raise InvalidArgumentError("--d-model must be a multiple of 16 (8 heads of an even size)")

    @property
    def pool_blocks(self) -> int:
        """Blocks in the pool: as given, else 4 contexts (blocks), one per slot (slot), or 4 (off)."""
        if self.num_blocks is not None:
            return self.num_blocks
        per_seq = cdiv(self.max_model_len, self.block_size)
        return per_seq * (self.slots if self.cache == "slot" else 4)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["api_key"] = None if self.api_key is None else "***"
        out["num_blocks"] = self.pool_blocks
        return out


def build_scheduler(config: ServeConfig):
    """The Engine (model + pool + cache) and its Scheduler for ``config``."""
    from kvlab.engine.engine import Engine
    from kvlab.engine.model import ModelConfig
    from kvlab.engine.scheduler import Scheduler

    model = ModelConfig(
        num_layers=config.num_layers, d_model=config.d_model, ffn_dim=config.d_model * 43 // 16
    )
    engine = Engine(
        cache=config.cache,
        block_size=config.block_size,
        max_model_len=config.max_model_len,
        num_blocks=config.pool_blocks,
        config=model,
    )
    return Scheduler(engine, max_num_seqs=config.max_num_seqs, slots=config.slots)

"""Checks of user-given values that every loader and the CLI share, and the size limits.

Why one module: a value a user typed (a model setting, a plan field, a profile figure, a CLI
flag) must fail the same way wherever it enters — one line that names the field, shows the
value *cut short* (``quote``: a 10 MB value must not become a 10 MB message) and says the fix.
The limits on sizes live here, in one place (``LIMITS``), so that ``autopar inspect``, the
search and the spec parser refuse the same absurd values before any long work starts, and so
that the cost model can rely on finite arithmetic for whatever passes them.

Torch-free and autopar-free, like the rest of ``costmodels``.
"""
from __future__ import annotations

import difflib
import math
from typing import Any

from costmodels.contracts.errors import AutoparError

QUOTE_LIMIT = 80          # characters of a user's value an error message shows
MESSAGE_LIMIT = 1000      # characters of a whole error line (a last guard, see ``shorten``)

# The largest sizes autopar accepts, each far above any model or cluster built so far, each
# low enough that tracing, the search and the cost model's arithmetic stay quick and finite
# (``autopar inspect`` builds every block: ~7 ms each; the search enumerates every divisor of
# the GPU count and batch). Raise one here, and only here, when a real model needs it.
LIMITS: dict[str, int] = {
    "layers": 2048,              # transformer blocks (GPT-3: 96, Llama 3 405B: 126, DeepNet: 1000)
    "hidden": 131_072,           # model width (GPT-3: 12288, Llama 3 405B: 16384)
    "heads": 4096,               # attention heads
    "kv_heads": 4096,            # key / value heads (grouped-query attention)
    "ffn": 1_048_576,            # MLP width
    "vocab": 16_777_216,         # vocabulary (Llama 3: 128256)
    "seq": 2_097_152,            # tokens per sequence (2M)
    "image": 16_384,             # ViT image side, pixels
    "patch": 16_384,
    "channels": 1024,
    "classes": 16_777_216,
    "in_features": 1_048_576,
    "type_vocab": 65_536,
    "experts": 65_536,           # routed experts per MoE layer (DeepSeek-V3: 256, Kimi K2: 384)
    "top_k": 1024,               # experts each token is routed to
    "expert_ffn": 1_048_576,     # one expert's inner width
    "shared_experts": 1024,      # always-on experts of a MoE layer
    "dense_layers": 2048,        # leading dense blocks of a MoE model
    "kv_lora_rank": 131_072,     # Multi-head Latent Attention's ranks and head widths (DeepSeek-V3:
    "q_lora_rank": 131_072,      # 512, 1536, 128, 64, 128)
    "qk_nope_head_dim": 65_536,
    "qk_rope_head_dim": 65_536,
    "v_head_dim": 65_536,
    "gpus": 262_144,             # GPUs in one search / plan (dp·tp·pp)
    "global_batch": 16_777_216,  # sequences per optimizer step
    "micro_batch": 65_536,       # sequences per micro-batch
}


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters: a longer one keeps its
    start and ends in ``…`` and its full length, so the user still sees which value it was."""
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails (a user object): name its type instead
        text = f"<{type(value).__name__}>"
    if len(text) <= limit:
        return text
    return f"{text[:limit - 1]}… ({len(text)} characters)"


def shorten(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """A whole message at most ``limit`` characters, its start and end kept (the end says the
    fix): the guard behind ``quote`` for values a message did not quote."""
    message = " ".join(str(message).split("\n"))
    if len(message) <= limit:
        return message
    cut = len(message) - limit + 30
    half = (limit - 30) // 2
    return f"{message[:half]} …({cut} characters cut)… {message[-half:]}"


def nearest(name: Any, known, n: int = 1, cutoff: float = 0.6) -> str:
    """``"did you mean 'x'? "`` for the known name(s) closest to ``name`` (up to ``n``), else
    ``""``. A long ``name`` (a pasted blob) has no near name: not worth comparing."""
    if not isinstance(name, str) or len(name) > 200:
        return ""
    close = difflib.get_close_matches(name, [str(k) for k in known], n=n, cutoff=cutoff)
    return f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""


def is_int(value: Any) -> bool:
    """A JSON integer: an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite JSON number: an int or float, not a bool, not NaN or infinite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:     # an int too large for a float
        return False


def int_field(value: Any, name: str, *, low: int = 1, high: int | None = None,
              error: type[AutoparError] = AutoparError, where: str = "", fix: str = "") -> int:
    """``value`` as an integer in [low, high], else ``error`` naming the field and the range."""
    if not is_int(value) or value < low or (high is not None and value > high):
        span = f"an integer >= {low}" if high is None else f"an integer from {low} to {high:,}"
        raise error(f"{where}{name}={quote(value)} must be {span}" + (f"; {fix}" if fix else ""))
    return value


def number_field(value: Any, name: str, *, low: float = 0.0, high: float | None = None,
                 open_low: bool = False, error: type[AutoparError] = AutoparError,
                 where: str = "", fix: str = "") -> float:
    """``value`` as a finite number in [low, high] ((low, high] with ``open_low``), else
    ``error`` naming the field and the range."""
    ok = is_number(value) and (value > low if open_low else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"> {low:g}" if open_low else f">= {low:g}"
        span = f"a finite number {lo}" + (f" and <= {high:g}" if high is not None else "")
        raise error(f"{where}{name}={quote(value)} must be {span}" + (f"; {fix}" if fix else ""))
    return float(value)


def limit(name: str, value: int, error: type[AutoparError] = AutoparError, what: str = "") -> int:
    """``value`` when it is at most ``LIMITS[name]``, else ``error`` naming the limit."""
    top = LIMITS[name]
    if value > top:
        raise error(f"{what or name}={quote(value)} is above autopar's limit of {top:,} "
                    f"(LIMITS['{name}'] in costmodels/contracts/checks.py); use a smaller value")
    return value

"""The checks ``LayerTable.from_dict`` runs on a layer table read from JSON.

Why: a table from a file is the cost model's whole view of a model. A row with a string for its
FLOPs, a negative sequence length or 1e308 saved bytes used to pass and fail later inside the
estimate (ZeroDivisionError, OverflowError, negative throughput). Every field is checked here for
its type and a plausible range, and the few relations the cost model relies on (the saved bytes
split into parts no larger than the whole), so that whatever passes gives finite, non-negative
estimates. Each failure is one ``SpecError`` line naming the row and the field.
"""
from __future__ import annotations

from typing import Any

from costmodels.contracts.checks import LIMITS, int_field, is_int, nearest, number_field, quote
from costmodels.contracts.errors import SpecError

KINDS = ("embedding", "block", "head", "other")
MAX_FLOPS = 1e21          # per row per micro-batch: ~1000× a GPT-3 block at 2M tokens
MAX_BYTES = 1e16          # 10 PB per row per micro-batch
MAX_PARAMS = 10 ** 13     # per row
MAX_MATMUL_DIM = 10 ** 12
MAX_ROWS = LIMITS["layers"] + 64
ACT_DTYPE_BYTES = (1, 2, 4, 8)
FIX = "regenerate the table with 'autopar inspect MODEL --json'"
# keys 'autopar inspect --json' writes beside the table's fields (read, not needed)
INSPECT_EXTRAS = ("total_params", "total_fwd_flops", "total_bwd_flops", "num_layers")
PAIR_KEYS = ("column", "row", "heads", "kv_heads")


def check_table(d: Any, top_fields: tuple[str, ...], row_fields: tuple[str, ...],
                required_row: tuple[str, ...]) -> tuple[dict, list[dict]]:
    """(top-level values, row dicts with tuples where the dataclasses hold tuples), checked."""
    if not isinstance(d, dict):
        raise SpecError(f"a layer table must be a JSON object, got {type(d).__name__}; {FIX}")
    if "rows" not in d and isinstance(d.get("layers"), list):
        # the JSON of 'autopar inspect --json': rows under "layers", the block count in "num_layers"
        rows = d["layers"]
        layers = d.get("num_layers", sum(1 for r in rows if isinstance(r, dict) and r.get("kind") == "block"))
        d = {k: v for k, v in d.items() if k != "layers"} | {"rows": rows, "layers": layers}
    _unknown(d, (*top_fields, "rows", *INSPECT_EXTRAS), "layer table")
    missing = [k for k in ("model", "micro_batch", "seq", "layers", "act_dtype_bytes", "rows") if k not in d]
    if missing:
        raise SpecError(f"layer table has no {', '.join(missing)}; {FIX}")
    top = {
        "model": _string(d["model"], "model"),
        "micro_batch": int_field(d["micro_batch"], "micro_batch", high=LIMITS["micro_batch"], **_E("")),
        "seq": int_field(d["seq"], "seq", high=LIMITS["seq"], **_E("")),
        "layers": int_field(d["layers"], "layers", low=0, high=LIMITS["layers"], **_E("")),
        "act_dtype_bytes": _choice(d["act_dtype_bytes"], "act_dtype_bytes", ACT_DTYPE_BYTES, ""),
    }
    for key in ("hidden", "heads", "kv_heads", "vocab"):
        v = d.get(key)
        top[key] = None if v is None else int_field(v, key, high=LIMITS[key],
                                                   **_E(""))
    if "fused_attention" in d:
        if not isinstance(d["fused_attention"], bool):
            raise SpecError(f"layer table: fused_attention must be true or false, got {d['fused_attention']!r}; {FIX}")
        top["fused_attention"] = d["fused_attention"]
    if top["heads"] and top["kv_heads"] and top["heads"] % top["kv_heads"]:
        raise SpecError(f"layer table: heads={top['heads']} is not a multiple of kv_heads={top['kv_heads']}; {FIX}")
    raw_rows = d["rows"]
    if not isinstance(raw_rows, (list, tuple)) or not raw_rows or len(raw_rows) > MAX_ROWS:
        raise SpecError(f"layer table field 'rows' must be a list of 1 to {MAX_ROWS} row objects; {FIX}")
    rows = [_row(r, i, row_fields, required_row) for i, r in enumerate(raw_rows)]
    if not any(r["fwd_flops"] > 0 for r in rows):
        raise SpecError(f"layer table: no row has forward FLOPs, so the model computes nothing; {FIX}")
    return top, rows


def _row(r: Any, i: int, row_fields, required) -> dict:
    where = f"layer table row {i}: "
    if not isinstance(r, dict):
        raise SpecError(f"{where}must be an object, got {type(r).__name__}; {FIX}")
    _unknown(r, row_fields, f"layer table row {i}")
    missing = [k for k in required if k not in r]
    if missing:
        raise SpecError(f"{where}has no {', '.join(missing)}; {FIX}")
    e = _E(where)
    out = {"name": _string(r["name"], "name", where), "kind": _choice(r["kind"], "kind", KINDS, where),
           "params": int_field(r["params"], "params", low=0, high=MAX_PARAMS, **e)}
    for k, top in (("fwd_flops", MAX_FLOPS), ("bwd_flops", MAX_FLOPS), ("saved_activation_bytes", MAX_BYTES),
                   ("act_tp_bytes", MAX_BYTES), ("act_attention_core_bytes", MAX_BYTES),
                   ("act_attention_mask_bytes", MAX_BYTES), ("boundary_bytes", MAX_BYTES),
                   ("tp_comm_bytes", MAX_BYTES)):
        if k in r:
            number_field(r[k], k, high=top, **e)
            out[k] = r[k]          # as given: the cost model reads ints and floats alike
    saved, tp, core = (out.get(k, 0) for k in ("saved_activation_bytes", "act_tp_bytes", "act_attention_core_bytes"))
    mask = out.get("act_attention_mask_bytes", 0)
    if tp > saved or core > tp or tp + mask > saved:
        raise SpecError(f"{where}the saved bytes must nest: act_attention_core_bytes ({core:g}) <= "
                        f"act_tp_bytes ({tp:g}) and act_tp_bytes + act_attention_mask_bytes ({mask:g}) "
                        f"<= saved_activation_bytes ({saved:g}); {FIX}")
    if r.get("bwd_weight_flops") is not None:
        number_field(r["bwd_weight_flops"], "bwd_weight_flops", high=MAX_FLOPS, **e)
        if r["bwd_weight_flops"] > out.get("bwd_flops", 0):
            raise SpecError(f"{where}field bwd_weight_flops ({r['bwd_weight_flops']:g}) is the weight-"
                            f"gradient part of bwd_flops ({out.get('bwd_flops', 0):g}) and cannot exceed "
                            f"it; {FIX}")
        out["bwd_weight_flops"] = r["bwd_weight_flops"]
    for k in ("expert_params", "experts", "routed_tokens", "dispatch_bytes"):
        if k in r:
            out[k] = int_field(r[k], k, low=0, high=MAX_BYTES, **e)
    if "expert_fwd_flops" in r:
        number_field(r["expert_fwd_flops"], "expert_fwd_flops", high=MAX_FLOPS, **e)
        out["expert_fwd_flops"] = r["expert_fwd_flops"]
    if "tp_replicated_tensors" in r:
        out["tp_replicated_tensors"] = int_field(r["tp_replicated_tensors"], "tp_replicated_tensors",
                                                 low=0, high=10 ** 6, **e)
    out["tp_pairs"] = tuple(_pair(p, where) for p in _list(r.get("tp_pairs", ()), "tp_pairs", where))
    out["tied_params"] = tuple(_string(t, "tied_params[]", where)
                               for t in _list(r.get("tied_params", ()), "tied_params", where))
    out["matmul_dims"] = tuple(_dims(m, where) for m in _list(r.get("matmul_dims", ()), "matmul_dims", where))
    return out


def _E(where: str) -> dict:
    return {"error": SpecError, "where": f"{where}field " if where else "layer table field ", "fix": FIX}


def _unknown(d: dict, known, what: str) -> None:
    extra = [k for k in d if k not in known]
    if extra:
        raise SpecError(f"{what}: unknown field {quote(extra[0], 40)}; {nearest(extra[0], known)}"
                        f"known fields: {', '.join(known)}")


def _string(v: Any, name: str, where: str = "layer table: ") -> str:
    if not isinstance(v, str):
        raise SpecError(f"{where}field {name}={quote(v)} must be a string; {FIX}")
    return v


def _choice(v: Any, name: str, allowed: tuple, where: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, (str, int)) or v not in allowed:
        raise SpecError(f"{where or 'layer table: '}field {name}={quote(v)} must be one of "
                        f"{', '.join(map(str, allowed))}; {FIX}")
    return v


def _list(v: Any, name: str, where: str) -> list | tuple:
    if not isinstance(v, (list, tuple)) or len(v) > 10_000:
        raise SpecError(f"{where}field {name}={quote(v)} must be a list (of at most 10000 items); {FIX}")
    return v


def _pair(p: Any, where: str) -> dict:
    if not isinstance(p, dict) or "column" not in p or "row" not in p:
        raise SpecError(f"{where}each tp_pairs entry must be an object with 'column' (a list of "
                        f"linear names) and 'row' (a name), got {quote(p)}; {FIX}")
    _unknown(p, PAIR_KEYS, f"{where.rstrip(': ')} tp_pairs entry")
    column = _list(p["column"], "tp_pairs.column", where)
    if not column:
        raise SpecError(f"{where}field tp_pairs.column must name at least one linear; {FIX}")
    out = {"column": tuple(_string(c, "tp_pairs.column[]", where) for c in column),
           "row": _string(p["row"], "tp_pairs.row", where)}
    for k in ("heads", "kv_heads"):
        v = p.get(k)
        out[k] = None if v is None else int_field(v, f"tp_pairs.{k}", high=LIMITS["heads"], **_E(where))
    return out


def _dims(m: Any, where: str) -> tuple[int, int, int]:
    if not isinstance(m, (list, tuple)) or len(m) != 3 or not all(is_int(x) and 1 <= x <= MAX_MATMUL_DIM for x in m):
        raise SpecError(f"{where}each matmul_dims entry must be [m, n, k], integers from 1 to "
                        f"{MAX_MATMUL_DIM:.0e}, got {quote(m)}; {FIX}")
    return tuple(m)

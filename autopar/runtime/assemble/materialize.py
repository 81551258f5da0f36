"""Give a model built on ``meta`` real weights, one row at a time.

A model too large for one process is built under ``torch.device("meta")`` (or with
``autopar.models.source.meta_parameters``: parameters on meta, the small computed buffers such
as causal masks and RoPE tables real). ``autopar.apply`` then materialises only the rows this
rank runs, each just before it is cut into this rank's shard (``RowFiller``), so a rank holds its
share plus at most one full row in flight.

Values. A row's values come from the weights file when one is given (``autopar.runtime.assemble.weights``),
else from the model's own initialiser run on the row under a generator seeded by (seed, row
name) (``row_seed``): ``init_fn(row)`` when the user gives one, else the model's
``autopar_init_fn`` (set by autopar's built-in models), else transformers' ``_init_weights``,
else each submodule's ``reset_parameters``. The global RNG is left as it was. A tensor shared
by two rows (a tied embedding and LM head) takes the value of the first row that holds it, on
every rank, whether or not that row runs there. ``init_serial(model, seed)`` runs exactly the
same per-row initialisation in one process, so the serial model of ``autopar verify`` has the
weights every parallel plan starts from. Rows are materialised on the CPU whatever the
accelerator (the runner moves its stages there afterwards): CPU generators give the same values
on every machine, so a plan on GPUs starts from the weights ``init_serial`` gives anywhere.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Callable

import torch
import torch.nn as nn

from autopar.runtime.assemble.computed_buffers import refill_computed_buffers
from costmodels.contracts.errors import PlanError


def row_seed(seed: int, row_name: str) -> int:
    """The generator seed of one row: the same on every rank and in ``init_serial``."""
    digest = hashlib.sha256(f"{int(seed)}:{row_name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def has_meta(module: nn.Module) -> bool:
    """Whether ``module`` was built (partly) on meta: apply then materialises it row by row."""
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def materialize_params(module: nn.Module, device="cpu", model: nn.Module | None = None) -> None:
    """Replace every meta parameter (and buffer) of ``module`` by an uninitialised real tensor
    (a parameter shared by two submodules stays one), also where ``model`` holds the same
    tensor (an fx-cut row holds its own references to the model's parameters)."""
    memo: dict[int, torch.Tensor] = {}
    old: list[torch.Tensor] = []   # kept alive, so that no new tensor takes a replaced one's id
    for m in module.modules(remove_duplicate=False):
        for name, p in list(m._parameters.items()):
            if p is not None and p.is_meta:
                if id(p) not in memo:
                    old.append(p)
                    memo[id(p)] = nn.Parameter(torch.empty_like(p, device=device),
                                               requires_grad=p.requires_grad)
                m._parameters[name] = memo[id(p)]
        for name, b in list(m._buffers.items()):
            if b is not None and b.is_meta:
                if id(b) not in memo:
                    old.append(b)
                    memo[id(b)] = torch.empty_like(b, device=device)
                m._buffers[name] = memo[id(b)]
    if model is not None and memo:
        for m in model.modules():
            for store in (m._parameters, m._buffers):
                for name, t in list(store.items()):
                    if t is not None and id(t) in memo:
                        store[name] = memo[id(t)]


def default_init_fn(model: nn.Module) -> Callable[[nn.Module], None]:
    """The model's own initialiser, applied to one row (see the module docstring)."""
    fn = getattr(model, "autopar_init_fn", None)
    if fn is not None:
        return fn
    for m in (model, getattr(model, "model", None)):
        if m is not None and callable(getattr(m, "_init_weights", None)) and hasattr(m, "config"):
            return lambda row, m=m: row.apply(m._init_weights)
    return reset_parameters


def reset_parameters(row: nn.Module) -> None:
    """Each submodule's own ``reset_parameters``; a submodule with parameters and no
    ``reset_parameters`` cannot be initialised here (one line naming it)."""
    for name, m in row.named_modules():
        if not any(True for _ in m.parameters(recurse=False)):
            continue
        if not callable(getattr(m, "reset_parameters", None)):
            raise PlanError(f"cannot initialise {type(m).__name__} ('{name}') of a meta-built model: "
                            "it has parameters and no reset_parameters(); pass init_fn=... to "
                            "autopar.apply / init_serial, or weights=PATH")
        m.reset_parameters()


def init_row(row: nn.Module, seed: int, name: str, init_fn: Callable) -> None:
    """Run ``init_fn(row)`` under a generator seeded by (seed, name); the global RNG is kept."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(row_seed(seed, name))
        init_fn(row)


class RowFiller:
    """Materialises rows of a meta-built model on demand (``fill(i)``), with values from a
    weights source (``weights.get(key)``) or from the seeded initialiser.

    ``row_keys[i]``: local tensor name -> the serial state-dict keys of that tensor (all
    aliases; the first is canonical), as ``autopar.runtime.assemble.stages.row_state_keys`` gives them.
    """

    def __init__(self, rows, row_keys, *, seed: int = 0, init_fn: Callable | None = None,
                 model: nn.Module | None = None, weights=None, device="cpu", local_rows=None):
        self.rows, self.row_keys, self.seed, self.weights = rows, row_keys, seed, weights
        self.local_rows = set(range(len(rows)) if local_rows is None else local_rows)
        self.inflight_bytes = 0   # the most bytes of another rank's row initialised here at once
        self.init_fn = init_fn or default_init_fn(model)
        self.device, self.model = device, model
        self.owner: dict[str, int] = {}
        self.used_by: dict[str, set[int]] = {}
        for i, names in enumerate(row_keys):
            for keys in names.values():
                self.owner.setdefault(keys[0], i)
                self.used_by.setdefault(keys[0], set()).add(i)
        self._shared: dict[str, torch.Tensor] = {}   # a tied tensor's value, for its later rows
        self._check_buffers()

    def _check_buffers(self) -> None:
        """A buffer built on meta that neither the weights nor an initialiser fill would hold
        garbage: one line, decided alike on every rank before any row is filled."""
        stored = {k for names in self.row_keys for keys in names.values() for k in keys}
        for i, row in enumerate(self.rows.modules):
            for n, b in row.named_buffers():
                if not b.is_meta:
                    continue
                covered = self.weights is not None and self.row_keys[i].get(n) and stored
                if covered or (self.weights is None and self.init_fn is not reset_parameters):
                    continue
                raise PlanError(f"buffer '{n}' of row {self.rows.names[i]} was built on meta and "
                                "nothing gives it values; build the model under autopar.models."
                                "source.meta_parameters() (parameters on meta, buffers real, what "
                                "source.build_meta() does), or pass init_fn=... that fills it")

    def fill(self, i: int) -> nn.Module:
        """Row ``i`` with real values (in place; returns the row module)."""
        self.inflight_bytes = 0
        row = self.rows.modules[i]
        done = {id(t) for t in self._named(row).values() if not t.is_meta}
        meta_buffers = {n for n, b in [*row.named_buffers(remove_duplicate=False),
                                       *row.named_parameters(remove_duplicate=False)] if b.is_meta}
        materialize_params(row, self.device, self.model)
        if self.weights is not None:
            self._load(i, row)
        else:
            with self._scratch_for_owned(i, row, done):
                init_row(row, self.seed, self.rows.names[i], self.init_fn)
                refill_computed_buffers(self.model, row, meta_buffers)   # rotary tables (computed_buffers)
            self._take_owned_values(i, row, done)
        self._remember_shared(i, row)
        return row

    def fill_shard(self, i: int, shard: nn.Module, specs: dict, tp_rank: int, tp: int) -> None:
        """Row ``i`` already cut for this tp rank on meta (``shard``, the rewrite's result with
        its ``autopar_shards`` ``specs``): read only this rank's rectangles of each tensor from
        the weights (a fused qkv shard: its q, k and v slices)."""
        from autopar.runtime.assemble.pieces import tp_rects
        serial = self._named(self.rows.modules[i])
        materialize_params(shard, self.device)
        with torch.no_grad():
            for n, t in self._named(shard).items():
                spec = specs.get(n)
                name = spec.name if spec is not None else n
                keys = self.row_keys[i].get(name)
                if not keys:
                    continue
                dim = getattr(spec, "dim", None)
                for offsets, local, sizes in tp_rects(tuple(t.shape), tuple(serial[name].shape), dim,
                                                      getattr(spec, "segments", None), tp_rank, tp):
                    view = t
                    for d, (o, k) in enumerate(zip(local, sizes)):
                        view = view.narrow(d, o, k)
                    view.copy_(self.weights.get_rect(keys, offsets, sizes))

    def _named(self, row: nn.Module) -> dict[str, torch.Tensor]:
        from autopar.runtime.assemble.stages import tensors
        return dict(tensors(row))

    def _load(self, i: int, row: nn.Module) -> None:
        with torch.no_grad():
            for n, t in self._named(row).items():
                keys = self.row_keys[i].get(n)
                if not keys:
                    continue
                value = self.weights.get(keys)
                if tuple(value.shape) != tuple(t.shape):
                    raise PlanError(f"weights: '{keys[0]}' has shape {list(value.shape)} in "
                                    f"{self.weights.where}, the model's is {list(t.shape)}; load "
                                    "weights saved from this model")
                t.copy_(value)

    @contextlib.contextmanager
    def _scratch_for_owned(self, i: int, row: nn.Module, done: set[int]):
        """While row ``i`` initialises, a tensor an earlier row already gave a value (the same
        Parameter, tied) is swapped for a scratch tensor, so the row's initialiser draws as it
        always does without overwriting that value."""
        swapped = []
        for n, t in self._named(row).items():
            keys = self.row_keys[i].get(n)
            if keys and self.owner[keys[0]] != i and id(t) in done:
                owner, _, leaf = n.rpartition(".")
                mod = row.get_submodule(owner) if owner else row
                store = mod._parameters if leaf in mod._parameters else mod._buffers
                swapped.append((store, leaf, t))
                store[leaf] = nn.Parameter(torch.empty_like(t)) if store is mod._parameters \
                    else torch.empty_like(t)
        try:
            yield
        finally:
            for store, leaf, t in swapped:
                store[leaf] = t

    def _take_owned_values(self, i: int, row: nn.Module, done: set[int]) -> None:
        """A tensor this row shares with an earlier row gets that row's value: remembered when
        that row was filled here, else initialised in flight straight into this row's tensor
        (one that already was that row's Parameter keeps its value)."""
        with torch.no_grad():
            for n, t in self._named(row).items():
                keys = self.row_keys[i].get(n)
                if not keys or self.owner[keys[0]] == i or id(t) in done:
                    continue
                key = keys[0]
                if key in self._shared:
                    t.copy_(self._shared[key])
                    if not any(r > i and r in self.local_rows for r in self.used_by[key]):
                        del self._shared[key]
                else:
                    self._init_into(key, t)

    def _remember_shared(self, i: int, row: nn.Module) -> None:
        """Keep (not copy) a tied tensor's storage for a later row of this rank."""
        for n, t in self._named(row).items():
            keys = self.row_keys[i].get(n)
            if keys and self.owner[keys[0]] == i and any(
                    r > i and r in self.local_rows for r in self.used_by[keys[0]]):
                self._shared[keys[0]] = t.detach()

    def held(self) -> list[torch.Tensor]:
        """Tensors kept for later rows (counted in the rank's peak)."""
        return list(self._shared.values())

    def _init_into(self, key: str, target: torch.Tensor) -> None:
        """Run the owner row's initialiser on a meta copy of it whose tensor ``key`` is
        ``target``'s storage: ``target`` gets the owner's value, the copy's other tensors (one
        row at most) are freed at once."""
        j = self.owner[key]
        tmp = copy.deepcopy(self.rows.modules[j])
        for n, _ in self._named(tmp).items():
            keys = self.row_keys[j].get(n)
            if keys and keys[0] == key:
                owner, _, leaf = n.rpartition(".")
                mod = tmp.get_submodule(owner) if owner else tmp
                if leaf in mod._parameters:
                    mod._parameters[leaf] = nn.Parameter(target, requires_grad=target.requires_grad)
                else:
                    mod._buffers[leaf] = target
        materialize_params(tmp, self.device)
        from autopar.runtime.assemble.stages import live_param_bytes
        self.inflight_bytes = max(self.inflight_bytes, live_param_bytes([tmp], exclude=[target]))
        init_row(tmp, self.seed, self.rows.names[j], self.init_fn)
        del tmp


def init_serial(model: nn.Module, seed: int = 0, init_fn: Callable | None = None,
                weights=None, example_inputs=None) -> nn.Module:
    """Materialise a meta-built ``model`` in this process with exactly the weights
    ``autopar.apply(model, plan, seed=seed, init_fn=init_fn)`` gives every plan (or those of
    ``weights``, a path ``autopar.runtime.assemble.weights.open_weights`` reads). In place; returns it.
    ``example_inputs``: one micro-batch, needed to cut a model that is not built-in into rows."""
    from autopar.runtime.assemble.rows import model_rows
    from autopar.runtime.assemble.stages import row_state_keys
    rows = model_rows(model, example_inputs)
    _, row_keys = row_state_keys(model, rows)
    source = None
    if weights is not None:
        from autopar.runtime.assemble.weights import open_weights
        shapes = {k: tuple(t.shape) for k, t in model.state_dict(keep_vars=True).items()}
        source = open_weights(weights, [ks for names in row_keys for ks in names.values()], shapes)
    filler = RowFiller(rows, row_keys, seed=seed, init_fn=init_fn, model=model, weights=source)
    for i in range(len(rows)):
        filler.fill(i)
    retie(model, row_keys)
    return model


def retie(model: nn.Module, row_keys) -> None:
    """Rows materialised one by one hold one tensor per row; a tensor the meta-built model had
    as one Parameter under several names (a tied embedding and LM head) becomes one again: the
    first name's."""
    for names in row_keys:
        for keys in names.values():
            for alias in keys[1:]:
                owner, _, leaf = alias.rpartition(".")
                mod = model.get_submodule(owner) if owner else model
                first = model.get_parameter(keys[0]) if leaf in mod._parameters else None
                if first is not None and mod._parameters[leaf] is not first:
                    mod._parameters[leaf] = first

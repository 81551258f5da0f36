"""Read a model's weights one tensor at a time, from whatever file they are in.

``open_weights(path, groups)`` gives a ``WeightSource`` whose ``get(keys)`` returns one tensor
of the serial model (``keys``: the model's names for it, a tied tensor has several) and
``get_rect(keys, offsets, sizes)`` one rectangle of it. Nothing is read until asked for, so
``autopar.apply(..., weights=PATH)`` reads only the rows a rank runs, and of a row the
tensor-parallel rewrite cuts only this rank's rectangles (``RowFiller.fill_shard``):

* a ``.safetensors`` file, or a Hugging Face checkpoint directory (``model.safetensors``, or
  sharded with ``model.safetensors.index.json``): ``safetensors.safe_open``, one tensor per call;
* a ``torch.save`` state dict: ``torch.load(mmap=True)``, so only the pages of the tensors read
  are ever in memory;
* an autopar checkpoint directory (``runner.save``): ``torch.distributed.checkpoint`` reading
  only the requested key, without a process group.

Names. A checkpoint's key is matched to the model's name as it is, or with the model's leading
module names dropped (autopar's ``hf:`` wrapper adds ``model.`` before transformers' names), or
(a checkpoint of the bare transformers base model) with ``model.`` dropped from the checkpoint's.
A model tensor found under none of them is one PlanError line, checked before anything is read.
"""
from __future__ import annotations

import json
import os

import torch

from costmodels.contracts.errors import PlanError


class WeightSource:
    def __init__(self, where: str, keys, read, shape, read_rect=None):
        self.where = where
        self._keys = set(keys)
        self._read = read          # checkpoint key -> tensor
        self._shape = shape        # checkpoint key -> shape, without reading the tensor
        self._read_rect = read_rect or (lambda key, offsets, sizes: _narrow(read(key), offsets, sizes))
        self._found: dict[str, str] = {}

    def resolve(self, names: list[str]) -> str | None:
        """The checkpoint key of a model tensor named ``names`` (aliases), or None."""
        for name in names:
            if name in self._found:
                return self._found[name]
            parts = name.split(".")
            for i in range(len(parts)):
                cand = ".".join(parts[i:])
                for key in (cand, "model." + cand):
                    if key in self._keys:
                        self._found[name] = key
                        return key
        return None

    def check(self, groups, shapes=None) -> WeightSource:
        """PlanError (one line) when a model tensor is not in the checkpoint, or (``shapes``:
        serial key -> shape) has another shape there; read from headers only, alike on every
        rank, before anything is loaded."""
        missing = [g[0] for g in groups if self.resolve(list(g)) is None]
        if missing:
            sample = ", ".join(sorted(self._keys)[:3])
            raise PlanError(f"weights {self.where} have no tensor for '{missing[0]}' "
                            f"({len(missing)} model tensor(s) missing; the file has e.g. {sample}); "
                            "load weights saved from this model")
        for g in groups:
            want = (shapes or {}).get(g[0])
            have = tuple(self._shape(self.resolve(list(g))))
            if want is not None and have != tuple(want):
                raise PlanError(f"weights: '{g[0]}' has shape {list(have)} in {self.where}, the "
                                f"model's is {list(want)}; load weights saved from this model")
        return self

    def get_rect(self, names: list[str], offsets, sizes) -> torch.Tensor:
        """The rectangle ``offsets`` + ``sizes`` of one tensor, reading only that (where the
        format allows: safetensors slices, mmap'd pages, DCP chunks)."""
        key = self.resolve(list(names))
        if key is None:
            raise PlanError(f"weights {self.where} have no tensor for '{names[0]}'")
        return self._read_rect(key, tuple(offsets), tuple(sizes))

    def get(self, names: list[str]) -> torch.Tensor:
        key = self.resolve(list(names))
        if key is None:
            raise PlanError(f"weights {self.where} have no tensor for '{names[0]}'")
        return self._read(key)


def open_weights(path, groups, shapes=None) -> WeightSource:
    """A WeightSource for ``path`` checked against the model's tensors ``groups`` (each a list
    of a tensor's names; a plain name is a group of one) and their ``shapes``."""
    groups = [[g] if isinstance(g, str) else list(g) for g in groups]
    path = os.fspath(path)
    if not os.path.exists(path):
        raise PlanError(f"weights '{path}' do not exist; give a torch.save state dict, a "
                        ".safetensors file, a Hugging Face checkpoint directory or an autopar "
                        "checkpoint")
    if os.path.isdir(path):
        source = _open_dir(path)
    elif path.endswith(".safetensors"):
        source = _safetensors([path], path)
    else:
        source = _torch_file(path)
    return source.check(groups, shapes)


def _open_dir(path: str) -> WeightSource:
    from autopar.runtime.checkpoints.dcp_files import checkpoint_dir
    ckpt = checkpoint_dir(path, missing_ok=True)
    if ckpt is not None:
        return _autopar_checkpoint(ckpt, path)
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            raise PlanError(f"weights: {index} is not a safetensors index (no 'weight_map')") from None
        return _safetensors([os.path.join(path, f) for f in files], path)
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return _safetensors([single], path)
    raise PlanError(f"weights directory '{path}' holds no model.safetensors, "
                    "model.safetensors.index.json or autopar checkpoint")


def _safetensors(files: list[str], where: str) -> WeightSource:
    from safetensors import safe_open
    handles, owner = [], {}
    for f in files:
        try:
            h = safe_open(f, framework="pt")
        except Exception as e:  # noqa: BLE001  (safetensors raises its own error types)
            raise PlanError(f"weights '{f}' cannot be read as safetensors ({e})") from None
        handles.append(h)
        for k in h.keys():
            owner[k] = h
    def rect(key, offsets, sizes):
        if not sizes:
            return owner[key].get_tensor(key)
        return owner[key].get_slice(key)[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))]

    return WeightSource(where, owner, lambda key: owner[key].get_tensor(key),
                        lambda key: owner[key].get_slice(key).get_shape(), rect)


def _torch_file(path: str) -> WeightSource:
    try:
        sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # noqa: BLE001  (pickle, zip and torch errors alike)
        raise PlanError(f"weights '{path}' cannot be read by torch.load ({type(e).__name__}); "
                        "give a state dict saved with torch.save") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise PlanError(f"weights '{path}' is not a state dict (a dict of tensors)")
    return WeightSource(path, sd, lambda key: sd[key], lambda key: sd[key].shape)


def _autopar_checkpoint(ckpt: str, where: str) -> WeightSource:
    """Every serial key, tied aliases included (the checkpoint stores a tied tensor once)."""
    from autopar.runtime.checkpoints.dcp_files import MODEL_PREFIX, read_object, read_rect, read_tensor, tensor_metadata
    meta = tensor_metadata(ckpt)
    keys = {k[len(MODEL_PREFIX):]: k for k in meta if k.startswith(MODEL_PREFIX)}
    for alias, canonical in (read_object(ckpt).get("aliases") or {}).items():
        if canonical in keys:
            keys[alias] = keys[canonical]
    def rect(key, offsets, sizes):
        return read_rect(ckpt, keys[key], meta[keys[key]], offsets, sizes)

    return WeightSource(where, keys, lambda key: read_tensor(ckpt, keys[key], meta[keys[key]]),
                        lambda key: meta[keys[key]].size, rect)


def _narrow(t: torch.Tensor, offsets, sizes) -> torch.Tensor:
    for d, (o, n) in enumerate(zip(offsets, sizes)):
        t = t.narrow(d, o, n)
    return t

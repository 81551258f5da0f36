"""The serial model's state dict out of an autopar checkpoint (``autopar checkpoint export``).

``export_checkpoint(ckpt, out)`` writes ``out`` one tensor at a time, never holding the model:

* ``*.safetensors``: the header is written first from the checkpoint's metadata (names, dtypes,
  shapes), then each tensor is read from the checkpoint (``torch.distributed.checkpoint``, this
  tensor's rectangles only) and appended — one tensor in memory at a time;
* a directory, for ``hf:`` models: ``model.safetensors`` under transformers' names (autopar's
  ``hf:`` wrapper adds ``model.`` before them) and the model's ``config.json``;
* ``*.pt`` / ``*.pth``: ``torch.save`` of the whole state dict (the format cannot be streamed, so
  this one holds the model; use safetensors for large models).

Tied tensors (an embedding and its LM head) are written under every name the serial model's
``state_dict`` has, as ``load_state_dict`` expects; for a Hugging Face directory the tied LM head
is left out, as ``save_pretrained`` does.
"""
from __future__ import annotations

import json
import os
import shutil

import torch

from autopar.runtime.checkpoints.dcp_files import (
    MODEL_PREFIX,
    checkpoint_dir,
    read_object,
    read_tensor,
    tensor_metadata,
)
from costmodels.contracts.errors import PlanError

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
           torch.uint8: "U8", torch.bool: "BOOL"}


def serial_keys(ckpt: str) -> tuple[list[tuple[str, str]], dict, dict]:
    """[(serial key, checkpoint key)] in the serial model's order, the tensor metadata and the
    saved ``autopar`` entry."""
    info = read_object(ckpt)
    meta = tensor_metadata(ckpt)
    aliases = info.get("aliases") or {}
    out = []
    for key in info["shapes"]:
        stored = MODEL_PREFIX + aliases.get(key, key)
        if stored in meta:
            out.append((key, stored))
    return out, meta, info


def serial_state_dict(path) -> tuple[dict[str, torch.Tensor], object]:
    """The whole serial state dict and the saved ``extra`` (small models, tests)."""
    ckpt = checkpoint_dir(path)
    keys, meta, info = serial_keys(ckpt)
    cache: dict[str, torch.Tensor] = {}
    out = {}
    for key, stored in keys:
        if stored not in cache:
            cache[stored] = read_tensor(ckpt, stored, meta[stored])
        out[key] = cache[stored]
    return out, info.get("extra")


def export_checkpoint(path, out: str) -> str:
    """Write the checkpoint at ``path`` as ``out`` (see the module docstring); returns what it
    wrote. The file appears whole or not at all (written beside it, then renamed)."""
    ckpt = checkpoint_dir(path)
    keys, meta, info = serial_keys(ckpt)
    spec = info.get("spec") or ""
    if out.endswith(".safetensors"):
        _write_safetensors(out, ckpt, keys, meta)
    elif out.endswith((".pt", ".pth")):
        sd, _ = serial_state_dict(ckpt)
        tmp = out + ".tmp"
        torch.save(sd, tmp)
        os.replace(tmp, out)
    elif not os.path.splitext(out)[1]:
        if not spec.startswith("hf:"):
            raise PlanError(f"export to a directory is for hf: models (this checkpoint is of "
                            f"'{spec or 'an unnamed model'}'); give -o model.safetensors or model.pt")
        _write_hf_dir(out, ckpt, keys, meta, info, spec[3:])
    else:
        raise PlanError(f"cannot export to '{out}': give a .safetensors or .pt file, or a "
                        "directory for a Hugging Face model")
    return out


def _write_safetensors(out: str, ckpt: str, keys, meta) -> None:
    header, at = {}, 0
    for key, stored in keys:
        md = meta[stored]
        dtype = md.properties.dtype
        if dtype not in _DTYPES:
            raise PlanError(f"cannot write '{key}' ({dtype}) to safetensors")
        n = torch.Size(md.size).numel() * torch.empty((), dtype=dtype).element_size()
        header[key] = {"dtype": _DTYPES[dtype], "shape": list(md.size), "data_offsets": [at, at + n]}
        at += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = out + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(len(blob).to_bytes(8, "little"))
            f.write(blob)
            for _key, stored in keys:
                t = read_tensor(ckpt, stored, meta[stored]).contiguous()
                f.write(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
                del t
        os.replace(tmp, out)
    except BaseException:   # a damaged shard, an interrupt: no half-written file is left
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_hf_dir(out: str, ckpt: str, keys, meta, info, config_path: str) -> None:
    aliases = info.get("aliases") or {}
    hf = [(k[len("model."):] if k.startswith("model.") else k, s) for k, s in keys
          if k not in aliases]
    os.makedirs(out, exist_ok=True)
    _write_safetensors(os.path.join(out, "model.safetensors"), ckpt, hf, meta)
    if os.path.isfile(config_path):
        shutil.copyfile(config_path, os.path.join(out, "config.json"))

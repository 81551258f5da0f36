"""The training loop behind ``autopar train`` / ``python -m autopar.train`` (issue 29): ``loop``
(``TrainConfig``, ``train``), ``data`` (token files read per dp rank), ``schedule`` (AdamW,
warm-up + cosine), ``metrics`` (tokens/s, MFU, peak memory, predicted step time)."""

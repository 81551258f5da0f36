"""Stepping: one training step's micro-batches through the local module or a pipelining schedule
(`schedules`), the data-parallel gradient sync around them (`data_parallel`) and gradient clipping
over every parallel dimension (`clipping`)."""

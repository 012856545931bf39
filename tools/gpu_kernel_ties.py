"""How vLLM's CUDA top-k/top-p kernel treats tokens tied at the boundary, against the trainer's two tie rules.

For bf16-rounded N(0, 3²) logits over 32,768 tokens (two seeds, batch 8 and 128, four settings) it counts the rows
where the kernel's kept set equals "lowest_index"'s, equals "keep_all"'s, or lies between them, and details up to
six rows per setting where it differs from "lowest_index" (extra tokens, their logit, the extra probability mass).
Runs on CUDA, or on CPU under the Triton interpreter (``TRITON_INTERPRET=1``, batch 8 and one seed only). Needs the
kernel's source in ``.gpu_kit/`` (tools/gpu_kit.py); run by tools/gpu_checks.sh.

    python tools/gpu_kernel_ties.py OUT.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_rl_clone.contract.sampling import TrainingSamplingParams, keep_boundary, kept_tokens
from tests.unit.vllm_topk_topp_kernel import load_kernel

SETTINGS = ((50, 1.0, 1.0), (None, 0.9, 1.0), (50, 0.9, 0.7), (None, 0.5, 1.0))  # top_k, top_p, temperature


def kept(scaled: torch.Tensor, params: TrainingSamplingParams) -> torch.Tensor:
    return kept_tokens(scaled, *keep_boundary(scaled, params), scaled.argmax(dim=-1))


def detail(scaled: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """One row: how the kernel's set differs from "lowest_index"'s."""
    logits = scaled.double()
    probs = logits.softmax(-1)
    boundary = logits[ours].min()
    extra, missing = theirs & ~ours, ours & ~theirs
    return {
        "ours": int(ours.sum()),
        "theirs": int(theirs.sum()),
        "extra": int(extra.sum()),
        "missing": int(missing.sum()),
        "extra_logits": sorted(set(logits[extra].tolist()))[:4],
        "boundary": boundary.item(),
        "ties_at_boundary": int((logits == boundary).sum()),
        "extra_mass": probs[extra].sum().item(),
    }


def main(out: str) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernel = load_kernel()
    cases = []
    for seed in (0, 1) if device == "cuda" else (0,):
        generator = torch.Generator(device=device).manual_seed(seed)
        for rows in (8, 128) if device == "cuda" else (8,):
            logits = (torch.randn(rows, 32768, device=device, generator=generator) * 3).to(torch.bfloat16).float()
            for top_k, top_p, temperature in SETTINGS:
                params = TrainingSamplingParams(top_k, top_p, temperature, tie_rule="lowest_index")
                scaled = logits / temperature
                k = None if top_k is None else torch.full((rows,), top_k, device=device, dtype=torch.int32)
                p = None if top_p >= 1.0 else torch.full((rows,), top_p, device=device)
                theirs = kernel.apply_top_k_top_p_triton(scaled.clone(), k, p).isfinite()
                lowest, every_tie = kept(scaled, params), kept(scaled, replace(params, tie_rule="keep_all"))
                as_lowest, as_every = (theirs == lowest).all(-1), (theirs == every_tie).all(-1)
                between = ~(lowest & ~theirs).any(-1) & ~(theirs & ~every_tie).any(-1)
                case = {
                    "seed": seed, "rows": rows, "top_k": top_k, "top_p": top_p, "temperature": temperature,
                    "rules_differ": int((lowest != every_tie).any(-1).sum()),
                    "as_lowest_index": int(as_lowest.sum()), "as_keep_all": int(as_every.sum()),
                    "neither": int((~as_lowest & ~as_every).sum()), "between": int(between.sum()),
                }  # fmt: skip
                print(json.dumps(case), flush=True)
                bad = torch.nonzero(~as_lowest).flatten().tolist()[:6]
                case["detail"] = [{"row": r, **detail(scaled[r], lowest[r], theirs[r])} for r in bad]
                cases.append(case)
    Path(out).write_text(json.dumps(cases, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])

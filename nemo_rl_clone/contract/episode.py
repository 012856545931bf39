"""The episode and record protocol that generation and the environments share: how a request names its episode,
what the model server records of each call it answers, and the key of the engine's logprobs on a rollout message.
The engine side (`models/generation`) writes these records; the environment and rollout side reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Names the episode of every request an agent makes; the server records calls by it (generation/vllm/http_server.py).
EPISODE_HEADER = "X-Episode-Id"

# Every message carries its engine logprobs (0 where the engine did not sample), so flattened logs stay aligned.
GENERATION_LOGPROBS = "generation_logprobs"


@dataclass(frozen=True)
class ServedCall:
    """One call the server answered. ``output_logprobs[i]`` is the processed logprob of ``output_token_ids[i]``
    and ``weight_versions[i]`` the number of weight updates the engine had loaded when it sampled that token (a
    call that spans a refit has two versions; None: all 0)."""

    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    weight_versions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a served call has an empty prompt")
        if self.weight_versions is None:
            object.__setattr__(self, "weight_versions", (0,) * len(self.output_token_ids))
        for name in ("output_logprobs", "weight_versions"):
            if len(getattr(self, name)) != len(self.output_token_ids):
                raise ValueError(
                    f"a served call has {len(self.output_token_ids)} output tokens but {len(getattr(self, name))} "
                    f"{name}"
                )

    @property
    def context(self) -> tuple[int, ...]:
        """The conversation's tokens once this call returned: its prompt, then what it generated."""
        return self.prompt_token_ids + self.output_token_ids

"""How a resumed request generates again what its client already has (pure).

After a lost stage is replaced, a held request starts over: its prompt in the same prefill chunks,
then its decode steps. The tokens those steps will sample are already known (the client has them),
so the steps need not wait for each other's sampled token: step k's input is the prompt's last token
(k = 0) or the k-th known token. All of them go out at once, one step per group, the k-th steps of
every resumed request together as one micro-batch — exactly the single-token decode steps they were
(decode rows batch exactly), so the same bits, but pipelined through the stages instead of one
coordinator round trip per token. The last stage still samples each step, and the scheduler compares
every sampled token with the one the client has (`Pipeline._replayed`).
"""

from __future__ import annotations

from orchestrator.engine.coordinator.requests import Active
from orchestrator.engine.tensors import tokens_frame
from orchestrator.engine.wire import Flag, Frame


def replay_inputs(a: Active) -> list[int]:
    """The input token of each decode step that generates `a.replay` again: the prompt's last token,
    then every known token but the last (whose successor is the first new one)."""
    inputs = [a.next_token, *a.replay[:-1]]
    if any(t is None for t in inputs):  # only the final replayed token may be unknown (a test fault)
        raise ValueError("a replayed step's input is unknown")
    return inputs  # type: ignore[return-value]


def replay_groups(members: list[Active]) -> list[list[Frame]]:
    """The decode steps that generate again what `members`' clients have, as groups to send in order:
    group k holds the k-th step of every member with more than k tokens to replay."""
    inputs = {a.rid: replay_inputs(a) for a in members}
    depth = max((len(v) for v in inputs.values()), default=0)
    return [[tokens_frame(a.rid, a.position + k, [inputs[a.rid][k]], Flag.SAMPLE)
             for a in members if len(inputs[a.rid]) > k] for k in range(depth)]


__all__ = ["replay_groups", "replay_inputs"]

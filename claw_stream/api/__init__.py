"""Every extension point: the interface a user's code implements, the setting that names it,
and its docs page (docs/extending/). Part of the contract: it imports no service.

| extension point | interface | named by | docs |
|---|---|---|---|
| reward source | `reward_source.Scorer` (run as a `RewardSource`) | `worker.rewards[].use` or `.function`; entry points `claw_stream.rewards` | docs/extending/reward-source.md |
| loss | `loss.LossFunction` | `trainer.loss`; entry points `claw_stream.losses` | docs/extending/loss.md |
| redaction rule | `redaction.RedactionRule` | `gateway.redaction.redactors` | docs/extending/redaction.md |
| task checker | `task_checker.TaskChecker` | a dataset line's `checker: {kind: python, function}` | docs/extending/task-checker.md |
| replay rule | `replay_rule.ReplayRule` | `eval.replay_rule`; entry points `claw_stream.rewards` | docs/extending/reward-source.md |

Each is named `module:function` (an import path) and loaded once, when its service starts (a
task checker: when an episode is scored): a path that does not import, or an object that
cannot be called with the arguments listed here (`*_ARGUMENTS`, checked by
`claw_stream.plugins.misfit`), is refused with a message naming the setting.
"""

from claw_stream.api.loss import LossConfig, LossFunction, LossOutput, LossResult
from claw_stream.api.redaction import RedactionRule
from claw_stream.api.replay_rule import ReplayRule
from claw_stream.api.reward_source import (
    Metadata,
    RewardSource,
    Score,
    Scorer,
    ScoreValue,
    SourceScore,
    Turn,
)
from claw_stream.api.task_checker import TaskChecker

__all__ = [
    "LossConfig",
    "LossFunction",
    "LossOutput",
    "LossResult",
    "Metadata",
    "RedactionRule",
    "ReplayRule",
    "RewardSource",
    "Score",
    "ScoreValue",
    "Scorer",
    "SourceScore",
    "TaskChecker",
    "Turn",
]

"""Every decoder module mlx-lm ships is either served (a row of the exactness matrix) or refused
with the mechanism the split engine lacks for it, and that reason is what the node agent's
report, the planner and the stage all say."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlx_lm
import pytest

from orchestrator import logs
from orchestrator.agent.inventory import Inventory
from orchestrator.engine.stage.shard import ShardError, StageModel
from orchestrator.families import support
from orchestrator.planner import PlanSettings, Refusal, plan_cluster
from orchestrator.testmodels.families import FAMILIES, build_family_model
from tests.support.builders import GB, facts_for

MODELS = Path(mlx_lm.__file__).parent / "models"
# Words that name a mechanism (or the proof that is impossible) in a refusal.
MECHANISM = re.compile(r"missing: |cannot prove|no test checkpoint|needs the ai2-olmo package")


def shipped() -> list[str]:
    """mlx-lm's model modules: the files defining a `Model` class."""
    return sorted(p.stem for p in MODELS.glob("*.py") if re.search(r"^class Model\(", p.read_text(), re.M))


def test_every_shipped_module_is_served_or_refused_with_its_mechanism() -> None:
    modules = shipped()
    assert len(modules) >= 120, modules  # mlx-lm 0.32.2 ships 125
    families = {m: support.family_of({"model_type": m}) for m in modules}
    unclassified = [m for m, f in families.items() if f not in support.FAMILIES and f not in support.REFUSED]
    assert not unclassified, f"neither served nor refused with a reason: {unclassified}"
    assert not set(support.FAMILIES) & set(support.REFUSED)
    for family, reason in support.REFUSED.items():
        assert MECHANISM.search(reason), f"{family}: the reason names no mechanism: {reason}"
    served = [m for m, f in families.items() if f in support.FAMILIES]
    assert len(served) >= 110, len(served)
    # Every served family is built and compared by the matrix (test_families.py).
    built = {support.family_of({"model_type": spec.model_type}) for spec in FAMILIES.values()}
    assert set(support.FAMILIES) <= built


@pytest.mark.parametrize("model_type,fragment", [
    ("iquestloopcoder", "more than once"),
    ("bitnet", "Metal-only kernel"),
])
def test_the_refusal_reason_reaches_the_agent_planner_and_stage(tmp_path: Path, model_type: str,
                                                                fragment: str) -> None:
    models = tmp_path / "models"
    model = models / model_type
    shutil.copytree(build_family_model(tmp_path / "llama", "llama"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    info = Inventory(models, tmp_path / "cache.json", logs.get("test")).describe(model_type)
    assert not info.supported and fragment in info.unsupported_reason
    plan = plan_cluster(info.description, facts_for(8 * GB, 8 * GB), PlanSettings(), model_name=model_type,
                        mlx_format=info.mlx_format, format_reason=info.reason,
                        unsupported_reason=info.unsupported_reason)
    assert isinstance(plan, Refusal) and fragment in plan.reasons[0].message
    with pytest.raises(ShardError, match=re.escape(fragment)):
        StageModel(model, 0, 2)


def test_a_served_family_is_refused_for_settings_it_cannot_split() -> None:
    assert support.unsupported_reason({"model_type": "nanbeige", "num_loops": 1}) is None
    reason = support.unsupported_reason({"model_type": "nanbeige", "num_loops": 2})
    assert reason and "several times per token" in reason


def test_every_name_mlx_lm_remaps_is_served_as_the_family_it_loads() -> None:
    """mlx-lm loads these model_types with another family's module (mlx_lm.utils MODEL_REMAPPING): the
    registry serves each as that family (a checkpoint named so is not refused as unverified)."""
    from mlx_lm.utils import MODEL_REMAPPING

    for name, module in MODEL_REMAPPING.items():
        family = support.family_of({"model_type": name})
        assert family in support.FAMILIES, (name, family)
        assert family in (name.replace("-", "_"), module), (name, module, family)

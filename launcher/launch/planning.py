"""From a composed config to a plan, with the checks that need the disk (the script, the data, the checkpoint):
what a single run and every job of a sweep do before anything starts."""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.launch.preflight import check_resume, check_script, gather_facts
from launcher.plan import HostFacts, RunPlan, plan_launch
from launcher.plan.script import plan_script


def plan_run(cfg: DictConfig, host: HostFacts, config_dir: str | None = None,
             estimate: bool = True) -> tuple[RunPlan, list[str]]:
    """(the plan, lines about the data and model to show before it); ConfigError for bad input. ``estimate=False``
    (``check``) leaves out the activation estimate, which needs torch."""
    if cfg.script:
        check_script(cfg)
        return plan_script(cfg, host), []
    facts = gather_facts(cfg, config_dir, estimate)
    plan = plan_launch(cfg, host, facts)
    check_resume(plan)
    return plan, [*facts.data.lines, *(facts.model.lines if facts.model else ())]

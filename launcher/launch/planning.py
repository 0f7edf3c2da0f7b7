"""From a composed config to a plan, with the checks that need the disk (the script, the data, the checkpoint):
what a single run and every job of a sweep do before anything starts."""

from __future__ import annotations

from omegaconf import DictConfig

from launcher.errors import ConfigError
from launcher.launch.preflight import check_resume, check_script, gather_facts, resume_checkpoint
from launcher.plan import HostFacts, RunPlan, plan_launch
from launcher.plan.script import plan_script


def plan_run(cfg: DictConfig, host: HostFacts, config_dir: str | None = None,
             estimate: bool = True) -> tuple[RunPlan, list[str]]:
    """(the plan, lines about the data and model to show before it); ConfigError for bad input. ``estimate=False``
    (``check``) leaves out the activation estimate, which needs torch."""
    if cfg.script:
        if cfg.trainer.resume or cfg.trainer.resume_from:
            key = "trainer.resume" if cfg.trainer.resume else "trainer.resume_from"
            raise ConfigError(f"{key}={cfg.trainer[key.split('.')[1]]} with script=: a script loads its own "
                              f"checkpoints (runtime.load_state_dict). Leave {key} empty.")
        check_script(cfg)
        return plan_script(cfg, host), []
    resume = resume_checkpoint(cfg)
    if resume:  # trainer.resume=<run>|latest is that run's newest complete checkpoint: the config says which
        cfg = cfg.copy()
        cfg.trainer.resume_from = resume
    facts = gather_facts(cfg, config_dir, estimate)
    plan = plan_launch(cfg, host, facts)
    check_resume(plan)
    return plan, [*facts.data.lines, *(facts.model.lines if facts.model else ())]

"""Parallelism as parts composed on one mesh: each part a module with its problems, memory, config, rank-side apply
and checkpoint format (registry.py); which parts a run uses (choose.py); how a rank applies them (compose.py).

Plan-side modules import no torch; rank-side code (compose.py, the engines, the parts' ``apply``) imports it lazily
or is imported only inside a rank."""

from launcher.contract import PartRules
from launcher.parallel.choose import (checkpoint_format, checkpoint_layout, choose_data_parallel, config_file,
                                      engine_config, RunFacts, plan_parts, run_facts)
from launcher.parallel.deepspeed_file import adopt_config
from launcher.plan.intents import Intents, PartPlan, intents_of  # the shared types: a leaf of the plan
from launcher.parallel.memory import ModelMemory, rank_memory
from launcher.parallel.registry import DATA_PARALLEL, PARTS, SLOTS

__all__ = ["DATA_PARALLEL", "Intents", "PARTS", "PartPlan", "RULES", "SLOTS", "checkpoint_format",
           "checkpoint_layout", "choose_data_parallel", "config_file", "engine_config",
           "intents_of", "plan_parts", "rank_memory", "run_facts", "ModelMemory", "RunFacts"]

RULES = PartRules(plan_parts=plan_parts, run_facts=run_facts, rank_memory=rank_memory, model_memory=ModelMemory.of,
                  config_file=config_file, adopt_config=adopt_config)
"""What the plan asks of the parts, handed to it in Facts.parts (launcher/facts/preflight.py gather_facts)."""

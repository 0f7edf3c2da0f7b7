"""Parallelism as parts composed on one mesh: each part a module with its problems, memory, config, rank-side apply
and checkpoint format (registry.py); which parts a run uses (choose.py); how a rank applies them (compose.py).

Plan-side modules import no torch; rank-side code (compose.py, the engines, the parts' ``apply``) imports it lazily
or is imported only inside a rank.
"""

from launcher.parallel.choose import (checkpoint_format, choose_data_parallel, config_file, data_parallel_name,
                                      RunFacts, estimate, plan_parts, run_facts)
from launcher.parallel.intents import Intents, PartPlan, intents_of
from launcher.parallel.memory import ModelMemory, rank_memory
from launcher.parallel.registry import DATA_PARALLEL, PARTS, SLOTS

__all__ = ["DATA_PARALLEL", "Intents", "PARTS", "PartPlan", "SLOTS", "checkpoint_format", "choose_data_parallel",
           "config_file", "data_parallel_name", "estimate", "intents_of", "plan_parts", "rank_memory", "run_facts",
           "ModelMemory", "RunFacts"]

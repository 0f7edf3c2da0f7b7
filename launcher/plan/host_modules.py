"""PURE: placement.modules — dense modules whose parameters, gradients, optimizer states and compute live on the host.

MindSpore's Host&Device sample runs each Dense layer's MatMul and Add on the host CPU while the rest stays on the
accelerator. Here a user names modules by path or glob (``placement.modules.dense1: host``, ``dense*: host``); the
plan resolves them against the model's modules (``ModelFacts.modules``: a built-in recipe's ``module_params`` hook,
or the user's model read on the meta device), keeps the outermost of nested matches, and takes their parameters out
of what the parallel parts train: in a rank they stand behind a ``HostModule`` the parts never see
(launcher/worker/host_modules.py), trained by a torch optimizer of the run's own kind on the host, their gradients
averaged over the data-parallel ranks through a gloo group. What that cannot compose with yet is refused here."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

LOCATIONS = ("host", "device")


@dataclass(frozen=True)
class ModulePlan:
    name: str
    """The module's path in the model."""
    params: int
    """Its parameters (each kept in fp32 on the host, with its gradient and optimizer states)."""
    state_floats: int = 0
    """fp32 optimizer state values per parameter (the run's optimizer: SGD 0, Adam 2)."""
    io_floats: int = 0
    """Floats per sample its forward copies in and out (input + output widths); 0 = not known."""
    location: str = "host"

    @property
    def bytes(self) -> int:
        """Host bytes of its parameters, gradients and optimizer states."""
        return self.params * 4 * (2 + self.state_floats)


def named(key: str, modules) -> list[str]:
    """The module paths a placement.modules key names: the path itself, or those its glob matches."""
    return [m for m in modules if m == key or fnmatch.fnmatchcase(m, key)]


def plan_host_modules(wanted: dict[str, str], modules: dict[str, int] | None, recipe: str, state_floats: int,
                      io: dict[str, tuple[int, int]] | None = None) -> tuple[tuple[ModulePlan, ...], list[str]]:
    """(the modules on the host, problems) of placement.modules against the model's modules (path -> parameters;
    None: the recipe does not name them)."""
    if not wanted:
        return (), []
    problems = [f"placement.modules.{k}={v} is not one of {', '.join(LOCATIONS)}. Set placement.modules.{k}=host "
                f"(device is the default)." for k, v in wanted.items() if v not in LOCATIONS]
    if modules is None:
        return (), problems + [f"placement.modules: recipe {recipe} does not name its modules (no module_params hook), "
                               f"so none can be placed. Remove placement.modules."]
    chosen: list[str] = []
    for key, where in wanted.items():
        hits = named(key, modules)
        if not hits:
            some = ", ".join(list(modules)[:12]) + (" ..." if len(modules) > 12 else "")
            problems.append(f"placement.modules.{key}={where}: no module of the model is at {key!r}. Its modules with "
                            f"parameters: {some or 'none'}. Name one of them (or a glob such as dense*).")
        elif where == "host":
            chosen += hits
    device = {m for k, v in wanted.items() if v == "device" for m in named(k, modules)}
    host = [m for m in dict.fromkeys(chosen) if m not in device]
    outer = [m for m in host if not any(m.startswith(o + ".") for o in host if o != m)]
    io = io or {}
    return tuple(ModulePlan(m, modules[m], state_floats, sum(io.get(m, (0, 0)))) for m in outer), problems


def crossing_words(hosted: tuple[ModulePlan, ...], samples: int) -> str:
    """What crosses between the device and the host each step and rank, in words."""
    known = [m for m in hosted if m.io_floats]
    if not known:
        return "the bytes their activations cross with are not known (no module_io hook, no Linear to read them from)"
    each_way = sum(m.io_floats for m in known) * 4 * samples
    rest = "" if len(known) == len(hosted) else f" ({', '.join(m.name for m in hosted if not m.io_floats)} not known)"
    return (f"up to {each_way / 1e6:,.2f} MB each way per step and rank cross with them (inputs and outputs of "
            f"{samples} samples, and their gradients back){rest}")


def composition_problems(hosted: tuple[ModulePlan, ...], cfg) -> list[str]:
    """What host modules cannot run with yet, each with the key to change."""
    if not hosted:
        return []
    names = ", ".join(m.name for m in hosted)
    key = f"placement.modules ({names} on the host)"
    checks = [
        (cfg.parallel.tp > 1 or bool(cfg.parallel.sharding), "parallel.tp / parallel.sharding",
         "tensor parallel or op sharding"),
        (cfg.trainer.grad_clip > 0, f"trainer.grad_clip={cfg.trainer.grad_clip}",
         "gradient clipping (the norm would leave the host modules out)"),
    ]
    return [f"{key} with {what}: {why} with host modules is not built yet. Remove placement.modules or change {what}."
            for bad, what, why in checks if bad]

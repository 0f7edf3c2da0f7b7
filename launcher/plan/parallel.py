"""Topology as data: the parallel degrees dp × pp × tp = world and each rank's coordinates (torchtitan's ParallelDims).

Validated once, with the numbers in the message; the worker turns it into a named DeviceMesh
(``init_device_mesh(device, dims.shape, mesh_dim_names=dims.names)``) and asks the mesh for each dim's group.
The mesh order is (pp, dp, tp): tp varies fastest, so tensor-parallel partners are neighbouring ranks (one host,
fast links), pipeline stages the slowest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    """Data-parallel degree: replicas that see different data and average gradients."""
    pp: int
    """Pipeline stages."""
    tp: int
    """Tensor (op-level) parallel degree: ranks that share one replica's operators."""
    world_size: int

    names: tuple[str, ...] = ("pp", "dp", "tp")
    """Mesh dim names, outermost first."""
    dp_shard: int = 1
    """Of dp, the ranks a data-parallel part shards parameters over (FSDP2); dp / dp_shard replicate. The worker's
    mesh is (pp, dp_replicate, dp_shard, tp), with dp their flattening."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, n) for n in self.names)

    def coords(self, rank: int) -> dict[str, int]:
        """{pp, dp, tp} of a global rank (row-major over shape)."""
        out, rest = {}, rank
        for name, size in reversed(list(zip(self.names, self.shape))):
            out[name] = rest % size
            rest //= size
        return {n: out[n] for n in self.names}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for name, size in zip(self.names, self.shape):
            rank = rank * size + coords[name]
        return rank

    def group(self, rank: int, dim: str) -> tuple[int, ...]:
        """The ranks that share every coordinate of ``rank`` except ``dim``: its group along that dim, in order."""
        c = self.coords(rank)
        return tuple(self.rank_of({**c, dim: i}) for i in range(getattr(self, dim)))


def plan_parallel(dp: int, pp: int, tp: int, world: int, world_words: str) -> tuple[ParallelDims | None, list[str]]:
    """Infer dp=-1 as world / (pp × tp) and check dp × pp × tp = world. ``world_words`` says where world comes from."""
    problems = []
    for key, v in (("parallel.pipeline_stages", pp), ("parallel.tp", tp)):
        if v < 1:
            problems.append(f"{key}={v} must be >= 1.")
    if dp == 0 or dp < -1:
        problems.append(f"parallel.dp={dp} must be a positive integer or -1 (infer).")
    if problems:
        return None, problems
    if dp == -1:
        if world % (pp * tp):
            return None, [
                f"parallel.dp=-1 cannot be inferred: world_size {world} ({world_words}) is not a multiple of "
                f"parallel.pipeline_stages={pp} × parallel.tp={tp} = {pp * tp}. Change cluster.nproc_per_node or "
                f"the degrees."
            ]
        dp = world // (pp * tp)
    if dp * pp * tp != world:
        return None, [
            f"dp({dp}) * pp({pp}) * tp({tp}) = {dp * pp * tp} != world_size {world} ({world_words}). "
            f"Set parallel.dp=-1 to infer it, or make the product equal the world size."
        ]
    return ParallelDims(dp=dp, pp=pp, tp=tp, world_size=world), []

"""gpt: a small decoder-only transformer (token + position embeddings, pre-norm blocks of causal attention and MLP,
a tied or untied head) on a synthetic token stream whose entropy rate is known, so a run reports how close it came
to the floor no model can beat (``entropy_floor``, beside ``uniform_loss`` = ln V of an untrained model).

The data is an order-2 Markov chain with the same conditional entropy after every context (recipes/gpt/markov.py):
seeded, endless, the same global micro-batches however they are split over data-parallel ranks. This is the kind
of model ZeRO-Offload is made for: ``optimizer.target=CPU precision=bf16`` trains it with the Adam states on the host.
"""

from dataclasses import asdict, dataclass

from launcher.contract import DataFacts, Operator
from launcher.recipes.gpt import markov, sizes


MAX_LAYERS = 100_000
"""model.layers beyond this is a typo: the plan lists every block (pipeline cuts, recompute, tensor parallel)."""

@dataclass
class ModelConfig:
    _target_: str = "launcher.recipes.gpt.model.GPT"
    vocab_size: int = 32
    """Tokens in the vocabulary."""
    seq_len: int = 64
    """Tokens per training sequence (the model sees seq_len - 1 and predicts the next of each)."""
    layers: int = 2
    """Transformer blocks."""
    width: int = 64
    """Model width (embedding size)."""
    heads: int = 4
    """Attention heads; must divide width."""
    mlp_ratio: int = 4
    """MLP hidden width = mlp_ratio x width."""
    tie_head: bool = True
    """The output head shares the token embedding's weights."""
    dropout: float = 0.0
    """Dropout after attention, MLP and embeddings (0 = off)."""


@dataclass
class MarkovDataConfig:
    """data=markov: an order-2 Markov token stream with a known entropy rate."""

    _target_: str = "launcher.recipes.gpt.data.MarkovTokens"
    vocab_size: int = 32
    """Must equal model.vocab_size."""
    seq_len: int = 64
    """Must equal model.seq_len."""
    candidates: int = 4
    """Possible next tokens after each two-token context."""
    skew: float = 1.0
    """Their probabilities: p_i proportional to i^-skew (0 = uniform over the candidates)."""
    seed: int = 0
    """Seed of the chain itself (which tokens follow which); the sample stream follows trainer.seed."""


class GPTRecipe:
    name = "gpt"
    model_config = ModelConfig
    data_configs = {"markov": MarkovDataConfig}

    def data_facts(self, data: MarkovDataConfig) -> DataFacts:
        """An endless stream; the floor of the mean next-token loss and the loss of a uniform guess, exactly."""
        if data.seq_len < 3 or data.candidates < 1 or data.vocab_size < data.candidates or not 0 <= data.skew < 1e6:
            return DataFacts()  # problems() names the bad values (a huge skew only overflows the floor's math)
        floor = markov.entropy_floor(data.vocab_size, data.seq_len, data.candidates, data.skew)
        return DataFacts(reference={"entropy_floor": round(floor, 6),
                                    "uniform_loss": round(markov.uniform_loss(data.vocab_size), 6)},
                         binary_labels=False)

    def model_spec(self, model: ModelConfig, facts: DataFacts) -> dict:
        return asdict(model)

    def tables(self, model: dict) -> dict[str, tuple[int, int]]:
        """None: the token embedding is small and dense, it trains inside the engine."""
        return {}

    def dense_param_count(self, model: dict) -> int:
        return sizes.param_count(model["vocab_size"], model["seq_len"], model["layers"], model["width"],
                                 model["heads"], model["mlp_ratio"], model["tie_head"])

    def problems(self, model: dict, data, micro_group: int) -> list[str]:
        out = []
        for key in ("vocab_size", "seq_len"):
            if model[key] != getattr(data, key):
                out.append(f"data.{key}={getattr(data, key)} differs from model.{key}={model[key]}. Set both to the "
                           f"same value (the recipe links them: override model.{key} only).")
        if model["seq_len"] < 3:
            out.append(f"model.seq_len={model['seq_len']} must be >= 3 (two context tokens and one to predict).")
        if model["vocab_size"] < 2:
            out.append(f"model.vocab_size={model['vocab_size']} must be >= 2 (a vocabulary of one token has "
                       f"nothing to predict).")
        if model["mlp_ratio"] < 1:
            out.append(f"model.mlp_ratio={model['mlp_ratio']} must be >= 1 (the MLP's hidden width is mlp_ratio x "
                       f"width).")
        if not 0 <= model["dropout"] < 1:
            out.append(f"model.dropout={model['dropout']} must be in [0, 1) (0 = off).")
        if model["layers"] < 1 or model["width"] < 1 or model["heads"] < 1:
            out.append(f"model.layers={model['layers']}, model.width={model['width']} and model.heads="
                       f"{model['heads']} must be >= 1.")
        elif model["layers"] > MAX_LAYERS:
            out.append(f"model.layers={model['layers']}: more than {MAX_LAYERS:,} blocks, which the plan would list one "
                       f"by one (the deepest transformers trained have a few hundred). Set model.layers to the "
                       f"blocks you mean, e.g. model.layers=12.")
        elif model["width"] % model["heads"]:
            out.append(f"model.heads={model['heads']} must divide model.width={model['width']}. "
                       f"Set model.heads to a divisor, e.g. model.heads={_divisor(model['width'], model['heads'])}.")
        if model["vocab_size"] >= 2 and not 1 <= data.candidates <= data.vocab_size:
            out.append(f"data.candidates={data.candidates} must be between 1 and the vocabulary size "
                       f"({data.vocab_size}).")
        if data.skew < 0:
            out.append(f"data.skew={data.skew} must be >= 0 (0 = uniform over the candidates).")
        return out

    def layer_names(self, model: dict) -> list[str]:
        return ["embedding", *(f"block.{i}" for i in range(model["layers"])), "head"]

    def layers(self, model) -> list:
        """embedding, block.0 ... block.{n-1}, head: running them in order is the model's forward."""
        return model.named_layers()

    def tp_plan(self, model: dict, tp: int) -> tuple[list[Operator], list[str]]:
        """parallel.tp: Megatron-style tensor parallel in every block. Attention's qkv is column-split (its rows are
        grouped by head: a rank keeps whole heads), its out row-split; the MLP's first Linear column-split, its second
        row-split. Embeddings, norms and the head stay replicated."""
        w, r, t = model["width"], model["mlp_ratio"], model["seq_len"] - 1
        problems = []
        if model["heads"] % tp:
            problems.append(f"parallel.tp={tp} splits attention by heads, and model.heads={model['heads']} is not "
                            f"divisible by {tp}. Set model.heads to a multiple of {tp} that divides model.width "
                            f"({w}), or parallel.tp to a divisor of {model['heads']}.")
        ops = []
        for i in range(model["layers"]):
            p = f"blocks.{i}"
            ops += [Operator(f"{p}.attn.qkv", "colwise", "matmul", w, 3 * w, ("model.width", "model.width"), t)]
            ops += [Operator(f"{p}.attn.out", "rowwise", "matmul", w, w, ("model.width", "model.width"), t),
                    Operator(f"{p}.mlp.0", "colwise", "matmul", w, r * w, ("model.width", "model.mlp_ratio"), t),
                    Operator(f"{p}.mlp.2", "rowwise", "matmul", r * w, w, ("model.mlp_ratio", "model.width"), t)]
        return ops, problems


def _divisor(width: int, heads: int) -> int:
    return max(d for d in range(1, min(heads, width) + 1) if width % d == 0)  # a divisor is at most width


RECIPE = GPTRecipe()

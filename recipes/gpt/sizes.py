"""Torch-free sizes of the gpt recipe's model, for the planner (must equal ``model.GPT``'s, see the tests)."""


def param_count(
    vocab_size: int, seq_len: int, layers: int, width: int, heads: int, mlp_ratio: int, tie_head: bool
) -> int:
    """Parameters of ``GPT`` with these sizes, a tied head counted once. heads splits width and adds none."""
    norm = 2 * width  # LayerNorm weight and bias
    hidden = mlp_ratio * width
    embedding = vocab_size * width + seq_len * width
    attention = (width * 3 * width + 3 * width) + (width * width + width)  # q, k, v and output projections
    mlp = (width * hidden + hidden) + (hidden * width + width)
    head = norm + (0 if tie_head else width * vocab_size)
    return embedding + layers * (2 * norm + attention + mlp) + head

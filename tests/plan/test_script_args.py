"""The words after ``--`` reach a script's sys.argv as they were typed: they travel as a ``script_args=[...]``
override, quoted for Hydra and escaped for OmegaConf so that nothing is interpolated, unquoted or unescaped."""

import random

from omegaconf import OmegaConf

from launcher.config import compose_config
from launcher.plan.script import script_args_override

TRICKY = ["--name=${x}", "${oc.env:HOME}", "\\${x}", "\\\\${x}", "${x}\\", "$${x}", "${${x}}", "--q=a'b", '--dq="x"',
          "--lit=\\\\n", "a b", "", "--", "k=v", "a,b", "[1, 2]", "{a: 1}", "null", "1", "True", "\\", "\\'", "'",
          "ünï€ 🏖", "tab\there", "new\nline\\\n", "\x00\x1b[31m"]


def test_tricky_words_come_back_from_the_composed_config_as_they_were():
    cfg = compose_config(["script=train.py", script_args_override(TRICKY)])
    assert OmegaConf.to_container(cfg.script_args, resolve=True) == TRICKY
    assert list(cfg.script_args) == TRICKY  # as plan_script reads them


def test_random_words_of_quotes_backslashes_and_braces_round_trip():
    """script_args_override reads its override back with Hydra's parser and OmegaConf's resolution, and raises
    ConfigError for a word that does not come back: none may."""
    pieces = ["$", "{", "}", "${", "\\", "'", '"', "a", " ", ",", "[", "]", "=", ":", "\n", "ü", "#", "%"]
    rng = random.Random(0)
    for _ in range(1000):
        words = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 10))) for _ in range(3)]
        script_args_override(words)


def test_no_words_is_an_empty_list():
    assert script_args_override([]) == "script_args=[]"

"""Hydra config tree, installed as the package ``launcher.conf`` (Hydra search path ``pkg://launcher.conf``)."""

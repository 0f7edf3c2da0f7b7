"""Write a CTR-style CSV with mixed column types and a known logistic ground truth (for tests and the README).

    python tests/data/make_ctr_csv.py out.csv [rows] [--gzip]
"""

from __future__ import annotations

import csv
import gzip
import math
import random
import sys

JOBS = ["engineer", "teacher", "nurse", "artist", "clerk", "driver", "chef", "lawyer"]
DEVICES = ["ios", "android", "desktop"]


def write_ctr_csv(path: str, rows: int, seed: int = 0, gz: bool = False) -> None:
    rnd = random.Random(seed)
    city_effect = {c: rnd.gauss(0, 0.8) for c in range(500)}
    job_effect = {j: rnd.gauss(0, 0.6) for j in JOBS}
    opener = gzip.open if gz else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "age", "hours", "job", "city", "device", "clicked"])
        for i in range(rows):
            age = rnd.randint(18, 80)
            hours = "" if rnd.random() < 0.05 else f"{rnd.uniform(0, 12):.2f}"  # some missing values
            job = rnd.choice(JOBS)
            city = int(500 ** rnd.random()) - 1  # skewed: a few big cities
            device = rnd.choice(DEVICES)
            logit = -1.0 + 0.03 * (age - 45) + (0.15 * (float(hours) - 6) if hours else 0) + job_effect[job]
            logit += city_effect[city] + (0.7 if device == "ios" and job == "engineer" else 0)
            clicked = "yes" if rnd.random() < 1 / (1 + math.exp(-logit)) else "no"
            w.writerow([f"u{i}", age, hours, job, f"city{city}", device, clicked])


if __name__ == "__main__":
    write_ctr_csv(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 50_000, gz="--gzip" in sys.argv)

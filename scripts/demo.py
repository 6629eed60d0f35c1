"""Train DiLoCo and the synchronous baseline on the bundled digits and compare them.

    make demo      # or: python scripts/demo.py
"""

import time

from diloco import DiLoCoConfig, communication_savings, train_diloco, train_synchronous_baseline
from diloco.data import load_digits_split

config = DiLoCoConfig()
data = load_digits_split(seed=config.seed)
print(f"digits: {len(data.y_train)} train / {len(data.y_test)} test; K={config.num_workers} workers, "
      f"H={config.inner_steps} inner steps, {config.rounds} rounds")
rows = []
for name, trainer in (("DiLoCo", train_diloco), ("sync", train_synchronous_baseline)):
    start = time.perf_counter()
    result = trainer(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
    last = result.history[-1]
    rows.append((name, last["eval_loss"], last["eval_accuracy"],
                 sum(r["all_reduces"] for r in result.history), last["cumulative_bytes"],
                 time.perf_counter() - start))
print(f"{'algorithm':<10}{'held-out loss':>15}{'accuracy':>10}{'all-reduces':>13}{'bytes/worker':>15}{'time s':>8}")
for name, loss, acc, reduces, sent, seconds in rows:
    print(f"{name:<10}{loss:>15.4f}{acc:>10.4f}{reduces:>13d}{sent:>15.3e}{seconds:>8.1f}")
num_params = sum(w.size for w in result.params.values())
report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds, bytes_per_value=8)
print(f"communication savings: {report.savings_factor:.0f}x fewer bytes for DiLoCo")

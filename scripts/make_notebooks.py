"""Write the five teaching notebooks in notebooks/ from the cell sources below.

    .venv/bin/python scripts/make_notebooks.py            # write the notebooks, no outputs
    .venv/bin/python scripts/make_notebooks.py --execute  # write them with their outputs (notebooks extra)
    .venv/bin/python scripts/make_notebooks.py --execute 03_noniid.ipynb  # only the ones named

The notebooks use only the library's public API (``diloco``, ``diloco.data``,
``diloco.tools.studies.ablations``, ``diloco.tools.studies.plots``); nothing here copies library code. The test
suite (tests/tooling/test_notebooks.py) executes them and checks they match these
sources.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"

QUICKSTART = [
    ("md", """# DiLoCo in five minutes: against synchronous training, and the communication it saves

**DiLoCo** (Douillard et al., 2023, [arXiv:2311.08105](https://arxiv.org/abs/2311.08105)) trains one
model on $K$ workers that talk rarely. Each round, every worker starts from the global parameters
$\\theta$ and takes $H$ AdamW steps on its own shard, reaching $\\theta_k$. The workers then average
their **pseudo-gradients** $\\Delta = \\frac{1}{K}\\sum_k (\\theta - \\theta_k)$ in one all-reduce, and an
outer Nesterov-momentum optimizer applies $\\Delta$ to $\\theta$.

The **synchronous baseline** (plain data parallelism) all-reduces a gradient after *every* step. At
equal compute, both take `rounds * H` steps per worker on `batch_size` examples each, so DiLoCo
sends $H$ times fewer bytes. The question is what that costs in quality."""),
    ("code", """%matplotlib inline
import time

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

import diloco
from diloco import DiLoCoConfig, communication_savings
from diloco.data import load_digits_split
from diloco.tools.studies.ablations import default_engine, trainer
from diloco.tools.studies.plots import plot_curves
from diloco.tools.studies.study_stats import format_bytes  # the CLI's byte format

data = load_digits_split(seed=0)
print(f"digits: {data.x_train.shape[0]} training and {data.x_test.shape[0]} held-out images "
      f"of {data.x_train.shape[1]} pixels, {data.num_classes} classes")"""),
    ("md", """## Train both at equal compute

The paper's setting, scaled down: $K = 8$ workers, $H = 50$ inner steps, outer Nesterov with
learning rate 0.7 and momentum 0.9 (the `DiLoCoConfig` defaults), here for 5 rounds and a
hidden layer of 64 units. Both trainers
use the same seed, so they see exactly the same mini-batches and differ only in how they combine
the workers' work.

Like `.venv/bin/diloco study`, the runs use `default_engine()` (`config.engine`, turned into a
training function by `trainer`): the fast engine `diloco.engine` (the same algorithm, equal up to
rounding) where it is installed, and your own `train_diloco` and `train_synchronous_baseline`
(milestones 26 and 27) in a learner workspace."""),
    ("code", """config = DiLoCoConfig(num_workers=8, inner_steps=50, rounds=5, hidden_sizes=(64,), engine=default_engine())
print(f"engine: {config.engine}")
results, seconds = {}, {}
for name in ("diloco", "sync"):
    start = time.perf_counter()
    results[name] = trainer(name, config.engine)(data.x_train, data.y_train, config,
                                                 x_eval=data.x_test, y_eval=data.y_test)
    seconds[name] = time.perf_counter() - start

rows = ["| algorithm | held-out loss | held-out accuracy | all-reduces | bytes per worker | wall s |",
        "|---|---:|---:|---:|---:|---:|"]
for name, result in results.items():
    last = result.history[-1]
    all_reduces = sum(record["all_reduces"] for record in result.history)
    rows.append(f"| {name} | {last['eval_loss']:.4f} | {last['eval_accuracy']:.4f} | {all_reduces} "
                f"| {format_bytes(last['cumulative_bytes'])} | {seconds[name]:.1f} |")
display(Markdown("\\n".join(rows)))"""),
    ("md", """## The communication saved

Under a ring all-reduce each worker sends $2\\frac{K-1}{K} N b$ bytes per synchronisation ($N$
values of $b$ bytes). `communication_savings` counts them for both algorithms; the ratio is $H$ at
equal precision."""),
    ("code", """num_params = sum(value.size for value in results["diloco"].params.values())
report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds,
                               bytes_per_value=8)  # float64 parameters
print(f"{num_params} parameters")
print(f"synchronous: {report.sync_all_reduces} all-reduces, {format_bytes(report.sync_bytes_per_worker)} per worker")
print(f"DiLoCo:      {report.diloco_all_reduces} all-reduces, {format_bytes(report.diloco_bytes_per_worker)} per worker")
print(f"savings factor: {report.savings_factor:.0f}x (= H)")
# The same numbers, from the histories the trainers recorded:
assert np.isclose(results["sync"].history[-1]["cumulative_bytes"], report.sync_bytes_per_worker)
assert np.isclose(results["diloco"].history[-1]["cumulative_bytes"], report.diloco_bytes_per_worker)"""),
    ("md", """## Quality per round, and per byte

Against rounds (equal compute at every point), the two curves are close. Against bytes sent on a
log axis, DiLoCo's curve sits $H$ times further left: the same quality for a fiftieth of the
traffic."""),
    ("code", """histories = {name: result.history for name, result in results.items()}
display(plot_curves(histories, x="round", title="held-out quality against round"))
display(plot_curves(histories, x="bytes", title="held-out quality against bytes communicated"))"""),
    ("md", """## The same on a transformer language model

`model="transformer"` (`--model transformer` on the command line) swaps the MLP for a causal
transformer language model in NumPy ([docs/transformer.md](../docs/transformer.md)): 2 blocks,
$d = 64$, 4 heads, reading 64 characters of Tiny Shakespeare and predicting the next one at every
position. Nothing else changes: the same trainers, shards, outer step and records. A short run,
so the notebook stays quick:"""),
    ("code", """from diloco.text import load_shakespeare

text = load_shakespeare(64, eval_windows=256)  # windows of 64 characters, 256 held out
lm = DiLoCoConfig(num_workers=2, inner_steps=10, rounds=5, batch_size=8, model="transformer", dtype="float32",
                  engine=default_engine())
chars = text.dataset
lm_results = {name: trainer(name, lm.engine)(chars.x_train, chars.y_train, lm, x_eval=chars.x_test,
                                           y_eval=chars.y_test, encode=text.encode)
              for name in ("diloco", "sync")}
for name, result in lm_results.items():
    print(f"{name}: held-out perplexity {result.history[-1]['eval_perplexity']:.1f}")
display(plot_curves({name: result.history for name, result in lm_results.items()}, x="round",
                    title="transformer LM (K=2, H=10): held-out quality against round"))"""),
    ("md", """## What to take away

* At equal compute DiLoCo gets close to the synchronous baseline's held-out accuracy while
  all-reducing $H = 50$ times less often.
* The baseline usually keeps a small edge in held-out *loss*: it takes one well-averaged step per
  batch, while DiLoCo's workers drift apart for $H$ steps before they are averaged.
* The same comparison from the command line, with a run folder and plots: `.venv/bin/diloco compare`
  (`make demo`). Notebook 02 tests the paper's ablations; notebook 03 looks at non-IID data."""),
]

ABLATIONS = [
    ("md", """# The paper's claims, tested at small scale

Douillard et al. (2023) report, for language models with 150M-400M parameters:

1. DiLoCo roughly matches synchronous training while communicating $H$ times less;
2. quality degrades only slowly as the number of inner steps $H$ grows;
3. an outer **Nesterov** optimizer beats FedAvg (outer SGD with learning rate 1), each optimizer
   with its outer learning rate tuned (notebook 03 looks at non-IID data);
4. more workers help at a fixed amount of compute per worker.

Here we test them on the 8x8 digits with a one-hidden-layer MLP (and claim 2 again on a transformer
language model), using `diloco.tools.studies.ablations`, the code behind `.venv/bin/diloco study NAME`.
The runs are tiny (2 seeds) so the notebook finishes in well under a
minute; `docs/results.md` reruns the paper's tables with 5 seeds on larger tasks. Like `.venv/bin/diloco study`,
the runs use `default_engine()`: the fast engine `diloco.engine` (the same algorithm, equal up to
rounding) where it is installed, and your own milestone functions in a learner workspace."""),
    ("code", """%matplotlib inline
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from diloco import DiLoCoConfig
from diloco.data import load_digits_split
from diloco.tools.studies.plots import plot_curves, plot_study
from diloco.tools.studies.ablations import STUDIES, default_engine, markdown_table, mean_curves, run_study, summarise

data = load_digits_split(seed=0)
seeds = [0, 1]
base = DiLoCoConfig(num_workers=4, hidden_sizes=(64,), batch_size=32, engine=default_engine())


class Recorder:
    \"\"\"Collects every round of every run, tagged with its variant and seed (what the CLI writes
    to history.jsonl), for the mean curves.\"\"\"

    def __init__(self):
        self.records = []

    def callback(self, algo, **tags):
        return lambda record: self.records.append({"algo": algo, **tags, **record})


def study(name, config, values, dataset=data):
    recorder = Recorder()
    rows = summarise(run_study(STUDIES[name], config, dataset, seeds, values, history=recorder))
    display(Markdown(markdown_table(rows, digits=3)))
    return rows, recorder.records"""),
    ("md", """## Claim 2: inner steps $H$ at fixed total compute

Every run takes 100 AdamW steps per worker; $H$ only decides how often the workers synchronise
(`rounds = 100 / H`). $H = 1$ synchronises every step, like the baseline, but averages *parameters*
after a local step rather than gradients."""),
    ("code", """rows, records = study("inner-steps", base.replace(inner_steps=1, rounds=100), ("1", "10", "100"))
display(plot_study(rows, title="inner steps H at 100 steps per worker", xlabel="H"))
display(plot_curves(mean_curves(records), x="bytes", title="mean held-out quality against bytes sent"))"""),
    ("md", """Larger $H$ costs a little held-out quality and saves a factor $H$ in communication. With only
one round ($H = 100$) the outer optimizer gets a single step and the workers have drifted for the
whole run, so that point is the weakest."""),
    ("md", """## Claim 3: the outer optimizer

Nesterov (lr 0.7, momentum 0.9, the paper's choice) against FedAvg (outer SGD, lr 1, no momentum:
the new global model is just the average of the workers') and heavy-ball momentum, on IID shards
and on strongly label-skewed shards (Dirichlet $\\alpha = 0.1$)."""),
    ("code", """rows, _ = study("outer-optimizer", base.replace(inner_steps=20, rounds=5, alpha=0.1),
                ("nesterov", "fedavg"))
display(plot_study(rows, title="outer optimizer", xlabel="shards / optimizer"))"""),
    ("md", """## Claim 4: more workers at fixed per-worker compute

Every worker takes the same 100 steps on 32 examples per step; more workers means more total
compute *and* smaller shards (the 1,438 training images are split $K$ ways)."""),
    ("code", """rows, _ = study("workers", base.replace(inner_steps=20, rounds=5), ("1", "2", "4", "8"))
display(plot_study(rows, title="workers K at fixed per-worker compute", xlabel="K"))"""),
    ("md", """## Claim 2 on a transformer language model

The same study on the transformer language model of notebook 01 (`model="transformer"`,
`--model transformer`; [docs/transformer.md](../docs/transformer.md)), reading 64-character windows
of Tiny Shakespeare: $K = 2$ workers, 80 AdamW steps of 8 windows per worker, $H$ = 5, 20 or 80, the
paper's outer step (Nesterov, lr 0.7, momentum 0.9) untuned, 2 seeds, 64 held-out windows. That
is a tiny scale, seconds of training per run, so the table says what happens in the first 80 steps
and nothing more; `docs/results-transformer.md` runs 500 steps with 5 seeds and every arm's outer
step tuned. `run_study` is what `.venv/bin/diloco study inner-steps --data shakespeare` runs."""),
    ("code", """from diloco.text import load_shakespeare

text = load_shakespeare(64, eval_windows=64)  # windows of 64 characters, 64 held out
chars = text.dataset._replace(encode=text.encode)  # run_study finds the windows' encoder on the data set
lm = DiLoCoConfig(num_workers=2, batch_size=8, model="transformer", dtype="float32", engine=default_engine())
rows, _ = study("inner-steps", lm.replace(inner_steps=5, rounds=16), ("5", "20", "80"), dataset=chars)
display(plot_study(rows, title="transformer LM: inner steps H at 80 steps per worker", xlabel="H"))"""),
    ("md", """## Reading the numbers

Two seeds give wide intervals: treat differences smaller than the interval widths as noise.
`docs/results.md` reports which claims hold at five seeds, including those that do not hold on
this small problem, and the commands that reproduce every number."""),
]

NONIID = [
    ("md", """# Non-IID data: what label skew does, and why the outer optimizer matters

In federated and cross-datacentre training each worker's data can differ in distribution. The
simplest model is **label skew**: `noniid_shard_dataset` draws, for every class, the proportions
of that class sent to each worker from a Dirichlet($\\alpha$) distribution. Small $\\alpha$ puts
most of a class on one or two workers; large $\\alpha$ approaches an IID split."""),
    ("code", """%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from diloco import DiLoCoConfig, iid_shard_dataset, noniid_shard_dataset
from diloco.data import load_digits_split
from diloco.tools.studies.ablations import default_engine, trainer

data = load_digits_split(seed=0)
num_workers = 8
fig, axes = plt.subplots(1, 4, figsize=(15, 3.2), sharey=True)
splits = [("IID", iid_shard_dataset(data.x_train, data.y_train, num_workers, np.random.default_rng(0)))]
for alpha in (10.0, 1.0, 0.1):
    shards = noniid_shard_dataset(data.x_train, data.y_train, num_workers, np.random.default_rng(0), alpha=alpha)
    splits.append((f"alpha = {alpha:g}", shards))
for ax, (title, shards) in zip(axes, splits):
    counts = np.array([np.bincount(y_k, minlength=10) for _, y_k in shards])  # (K, classes)
    bottom = np.zeros(num_workers)
    for label in range(10):
        ax.bar(range(num_workers), counts[:, label], bottom=bottom, color=plt.cm.tab10(label))
        bottom += counts[:, label]
    ax.set_title(title)
    ax.set_xlabel("worker")
axes[0].set_ylabel("examples (colour = class)")
fig.suptitle(f"Training examples of each class on each of {num_workers} workers: IID and Dirichlet(alpha) splits")
fig.legend([plt.Rectangle((0, 0), 1, 1, color=plt.cm.tab10(label)) for label in range(10)],
           [str(label) for label in range(10)], title="class", loc="center right", fontsize=8)
plt.tight_layout(rect=(0, 0, 0.95, 1))
plt.show()"""),
    ("md", """## Why skew hurts local training

With $\\alpha = 0.1$ a worker sees only a few classes. During its $H$ inner steps it fits *its*
classes and drifts away from a model that is good on all ten; the workers' pseudo-gradients point
in different directions and partly cancel. The synchronous baseline does not suffer the same way:
it averages the $K$ workers' gradients at every step, so each step sees a batch drawn from all
shards.

We train DiLoCo with two outer optimizers on IID and on skewed shards, and the baseline on both:

* **FedAvg**: outer SGD with lr 1 and no momentum, so the new global model is the average of the
  workers' models;
* **Nesterov** (lr 0.7, momentum 0.9): the outer momentum accumulates the *consistent* part of the
  pseudo-gradients across rounds, while the worker-specific parts, which change sign from round to
  round, average out.

The runs use `default_engine()`, as `.venv/bin/diloco study` does: the fast engine `diloco.engine`
(the same algorithm, equal up to rounding) where it is installed, your own milestone functions in
a learner workspace."""),
    ("code", """base = DiLoCoConfig(num_workers=num_workers, inner_steps=20, rounds=6, hidden_sizes=(64,), alpha=0.1,
                    engine=default_engine())
arms = {
    "Nesterov": dict(outer_lr=0.7, outer_momentum=0.9, nesterov=True),
    "FedAvg": dict(outer_lr=1.0, outer_momentum=0.0, nesterov=False),
}
runs = {}
for shards_name, iid in (("IID", True), ("alpha=0.1", False)):
    for arm, changes in arms.items():
        config = base.replace(iid=iid, **changes)
        runs[(shards_name, arm)] = trainer("diloco", config.engine)(data.x_train, data.y_train, config,
                                                                    x_eval=data.x_test, y_eval=data.y_test)
    runs[(shards_name, "sync")] = trainer("sync", base.engine)(data.x_train, data.y_train, base.replace(iid=iid),
                                                               x_eval=data.x_test, y_eval=data.y_test)
for (shards_name, arm), result in runs.items():
    last = result.history[-1]
    print(f"{shards_name:>10} {arm:>9}: held-out accuracy {last['eval_accuracy']:.3f}, loss {last['eval_loss']:.3f}")"""),
    ("code", """fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
colours = {"Nesterov": "tab:blue", "FedAvg": "tab:red", "sync": "black"}
for (shards_name, arm), result in runs.items():
    rounds = [r["round"] for r in result.history]
    style = dict(color=colours[arm], linestyle="-" if shards_name == "IID" else ":", marker="o" if shards_name == "IID" else "s",
                 label=f"{arm}, {shards_name}")
    axes[0].plot(rounds, [r["eval_accuracy"] for r in result.history], **style)
    axes[1].plot(rounds, [r["inner_loss"] for r in result.history], **style)
    if arm != "sync":  # the baseline has no pseudo-gradient
        axes[2].plot(rounds, [r["pseudo_grad_norm"] for r in result.history], **style)
axes[0].set_ylabel("held-out accuracy")
axes[1].set_ylabel("mean inner (training) loss")
axes[2].set_ylabel("pseudo-gradient norm |Delta|")
for ax in axes:
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
fig.suptitle(f"DiLoCo with outer Nesterov or FedAvg against the synchronous baseline, on IID and skewed "
             f"(alpha=0.1) shards (digits, K={num_workers}, H={base.inner_steps})")
plt.tight_layout()
plt.show()"""),
    ("md", """## The spread between workers

Each history record keeps every worker's mean inner loss. Under skew the workers disagree: a
worker holding "easy" classes reaches a low local loss that says little about the global model."""),
    ("code", """for key in (("IID", "Nesterov"), ("alpha=0.1", "Nesterov")):
    losses = np.array(runs[key].history[-1]["worker_losses"])
    print(f"{key[0]:>10}: worker inner losses in the last round {np.round(losses, 3)} (spread {np.ptp(losses):.3f})")"""),
    ("md", """## Topic and speaker shards on a transformer language model

On Tiny Shakespeare a worker's text can differ by more than its next-character histogram. `noniid_split="topic"`
(`--noniid-split topic`) cuts the training text into 64 stretches and spreads them over the workers by
Dirichlet($\\alpha$); `noniid_split="speaker"` gives each worker whole speeches of its own speakers. The
cell trains DiLoCo on the transformer language model of notebook 01 (`model="transformer"`) on
IID, topic ($\\alpha = 0.1$) and speaker shards, and prints beside each held-out perplexity how far the
split is from IID shards: the mean KL divergence of a shard's next character, given the previous
one, from the whole text's (`split_report`, what `train` and `compare` print). $K = 4$, $H = 10$,
5 rounds, one seed: seconds of training, so the perplexities are not a verdict;
`docs/results-transformer.md` has the 5-seed study:
`.venv/bin/diloco study splits --data shakespeare --model transformer`."""),
    ("code", """from IPython.display import display

from diloco.corpus.shard_divergence import split_report, split_sentence
from diloco.text import load_shakespeare
from diloco.tools.studies.plots import plot_curves

text = load_shakespeare(64, eval_windows=128)  # windows of 64 characters, 128 held out
chars = text.dataset
lm = DiLoCoConfig(num_workers=4, inner_steps=10, rounds=5, batch_size=8, model="transformer", dtype="float32",
                  engine=default_engine())
text_splits = {"IID": dict(iid=True), "topic a=0.1": dict(iid=False, noniid_split="topic", alpha=0.1),
               "speaker": dict(iid=False, noniid_split="speaker")}
lm_runs = {}
for name, split in text_splits.items():
    config = lm.replace(**split)
    lm_runs[name] = trainer("diloco", config.engine)(chars.x_train, chars.y_train, config, x_eval=chars.x_test,
                                                     y_eval=chars.y_test, encode=text.encode).history
    print(f"held-out perplexity {lm_runs[name][-1]['eval_perplexity']:.2f}; "
          + split_sentence(split_report(chars.x_train, chars.y_train, config, text=True)))
display(plot_curves(lm_runs, x="round", left="eval_perplexity",
                    title=f"transformer LM, DiLoCo (K={lm.num_workers}, H={lm.inner_steps}): IID, topic and speaker shards"))"""),
    ("md", """## What to take away

* Label skew slows DiLoCo down: workers drift toward their own classes between synchronisations.
  The synchronous baseline, which mixes all shards in every step, is far less affected.
* The outer optimizer is where DiLoCo fights back. Momentum over rounds keeps the direction the
  workers agree on; FedAvg's plain average has no memory. How large the gap is on this small
  problem, over several seeds and values of $\\alpha$, is in `docs/results.md`
  (`.venv/bin/diloco study noniid` and `.venv/bin/diloco study outer-optimizer`)."""),
]

# --- notebook 04: beyond the 2023 paper (diloco.core) ----------------------------------------

BEYOND = [
    ("md", """# Beyond the 2023 paper: compressed outer gradients, Streaming DiLoCo, eager updates

DiLoCo (2023) sends $H$ times fewer bytes than data parallelism. Its successors send fewer
and hide them better:

* **compressed outer gradients**: 4-bit floats (E2M1) in Streaming DiLoCo, fp16/int8 in OpenDiLoCo,
  sign pruning in the DiLoCo paper's Table 6;
* **Streaming DiLoCo** (Douillard et al., 2025): $P$ fragments synchronised in turn, each overlapped
  with $\\tau$ inner steps and blended by a mixing factor;
* **eager updates** (Kale et al., 2025): the whole all-reduce overlapped with the next round.

`diloco.core` builds each of them from the 30 milestone functions. This notebook runs each one
small, checks the reductions to DiLoCo, and turns bytes into time with the network simulator;
section 6 runs Streaming on a transformer language model, whose fragments are its blocks.
The concept pages in `docs/concepts/` have the equations; `docs/results-family.md` the measured
studies.

Each method is a `DiLoCoConfig.family` setting, so `run` below trains it the way
`.venv/bin/diloco study` does: on `default_engine()`, the fast engine `diloco.engine` (the same
algorithm, equal up to rounding) where it is installed, your own milestone functions in a learner
workspace. Only the two bit-for-bit reductions (sections 3 and 4) call the family's entry points
`train_streaming` and `train_eager` on the reference path, where the milestone functions run:
the fast engine equals `train_diloco` only up to rounding."""),
    ("code", """%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from diloco import DiLoCoConfig, train_diloco
from diloco.data import load_digits_split
from diloco.config import FamilyConfig
from diloco.core.netsim import parse_bandwidth, simulate
from diloco.core.quantize import FORMATS, encode, quantize
from diloco.core.schedule import fragment_layers, sync_steps
from diloco.core.trainers import train_eager, train_streaming
from diloco.tools.studies.ablations import default_engine, trainer

data = load_digits_split(seed=0)
config = DiLoCoConfig(num_workers=4, inner_steps=20, rounds=6, hidden_sizes=(32, 32, 32), engine=default_engine())
print(f"engine: {config.engine}")


def run(family=None, cfg=config, algo="diloco"):
    \"\"\"Train ``algo`` on ``cfg.engine``, with ``family`` as the config's family section.\"\"\"
    cfg = cfg if family is None else cfg.replace(family=family)
    return trainer(algo, cfg.engine)(data.x_train, data.y_train, cfg, x_eval=data.x_test, y_eval=data.y_test)"""),
    ("md", """## 1. The wire formats

Each format turns a tensor into codes (and, for int8 and fp4, one power-of-two scale byte per block
of 32 values). What comes back, and at what price in bytes:"""),
    ("code", """rng = np.random.default_rng(0)
x = rng.normal(scale=1e-3, size=4096)  # about the size of an outer gradient here
rows = ["| format | bytes | bits per value | max abs error / max abs value |", "|---|---:|---:|---:|"]
for fmt in FORMATS:
    encoded = encode(x, fmt, block_size=32)
    error = np.abs(quantize(x, fmt, block_size=32) - x).max() / np.abs(x).max()
    rows.append(f"| {fmt} | {encoded.nbytes} | {8 * encoded.nbytes / x.size:.2f} | {error:.1e} |")
display(Markdown("\\n".join(rows)))"""),
    ("md", """## 2. Compressed outer gradients in training

Every worker's pseudo-gradient is encoded, the receivers decode it into float64 and average, and the
bytes the records count are the encoded ones. Does 4-bit cost quality here?"""),
    ("code", """arms = {"native (float64)": None, "float16": FamilyConfig(comm_dtype="float16"),
        "int8": FamilyConfig(comm_dtype="int8"), "fp4": FamilyConfig(comm_dtype="fp4"),
        "fp4 + error feedback": FamilyConfig(comm_dtype="fp4", error_feedback=True),
        "sign-prune 0.5": FamilyConfig(sign_prune=0.5)}
results = {name: run(family) for name, family in arms.items()}
rows = ["| outer gradients | held-out loss | held-out accuracy | bytes per worker |", "|---|---:|---:|---:|"]
for name, result in results.items():
    last = result.history[-1]
    rows.append(f"| {name} | {last['eval_loss']:.4f} | {last['eval_accuracy']:.4f} | {last['cumulative_bytes']:,.0f} |")
display(Markdown("\\n".join(rows)))"""),
    ("md", """## 3. Streaming DiLoCo

Strided fragments and their schedule: fragment $p$ syncs every $H$ steps, offset by $pH/P$. With
$P = 1$, $\\tau = 0$ and mix 1 it *is* DiLoCo, bit for bit. That check compares like with like, so it
stays on the reference path: `train_streaming` on its default `executor="reference"` against
`train_diloco`, the milestone functions."""),
    ("code", """print("fragments of 4 layers, P=2:", fragment_layers(4, 2))
print("fragment 1 of 2 syncs at steps", sync_steps(1, 2, config.inner_steps, 60))
diloco = train_diloco(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
p1 = train_streaming(data.x_train, data.y_train, config, FamilyConfig(fragments=1, overlap=0, mix=1.0),
                     x_eval=data.x_test, y_eval=data.y_test)
same = all(np.array_equal(diloco.params[k], p1.params[k]) for k in diloco.params)
print("P=1, tau=0, mix=1 equals train_diloco bit for bit:", same)

streaming = {f"P={p} tau={tau} mix={mix}": run(FamilyConfig(fragments=p, overlap=tau, mix=mix))
             for p, tau, mix in ((1, 0, 1.0), (2, 0, 1.0), (4, 0, 1.0), (4, 4, 0.5))}
rows = ["| arm | held-out loss | peak bytes per sync | bytes per worker |", "|---|---:|---:|---:|"]
for name, result in streaming.items():
    last = result.history[-1]
    peak = last.get("peak_sync_bytes", last["bytes_sent"])  # P=1 is plain DiLoCo: one whole-model sync a round
    rows.append(f"| {name} | {last['eval_loss']:.4f} | {peak:,.0f} | {last['cumulative_bytes']:,.0f} |")
display(Markdown("\\n".join(rows)))"""),
    ("md", """## 4. Eager updates

One worker: eager training is DiLoCo, bit for bit (checked on the reference path, `train_eager`
against `train_diloco`, like section 3). Several workers with a one-round overlap: it is not, and
the paper's claim is only that it comes close."""),
    ("code", """one = config.replace(num_workers=1)
single = train_diloco(data.x_train, data.y_train, one)
eager_single = train_eager(data.x_train, data.y_train, one, FamilyConfig(eager=True))
print("K=1: eager equals DiLoCo:", all(np.array_equal(single.params[k], eager_single.params[k]) for k in single.params))
eager = {mu: run(FamilyConfig(eager=True), config.replace(outer_momentum=mu)) for mu in (0.9, 0.5)}
for mu, result in eager.items():
    print(f"K=4 eager, outer momentum {mu}: held-out loss {result.history[-1]['eval_loss']:.4f}")"""),
    ("md", """## 5. From bytes to time: the network simulator

Each run's records say which all-reduces happened when and how long their results may wait.
Replayed on links of several bandwidths, with 10 ms of compute per inner step, they give the
simulated time to reach a held-out loss of 0.6 (an arm that never gets there in its 6 rounds has
no points, and the cell names it):"""),
    ("code", """sync = run(algo="sync")
arms = {"sync": sync.history, "DiLoCo": results["native (float64)"].history,
        "Streaming P=4 tau=4 fp4": run(FamilyConfig(fragments=4, overlap=4, mix=0.5, comm_dtype="fp4")).history,
        "eager (mu 0.5)": eager[0.5].history}
bandwidths = ["100kbit", "1Mbit", "10Mbit", "100Mbit", "1Gbit"]


def time_to(history, bandwidth, target=0.6, step_time=0.01):
    sim = simulate(history, config.num_workers, config.inner_steps, parse_bandwidth(bandwidth), 0.0, step_time)
    times = [s["sim_cumulative_seconds"] for r, s in zip(history, sim) if r["eval_loss"] <= target]
    return times[0] if times else np.nan


never = [name for name, history in arms.items() if min(r["eval_loss"] for r in history) > 0.6]
fig, ax = plt.subplots(figsize=(6, 4))
for name, history in arms.items():
    if name not in never:  # an arm with no point would still take a place in the legend
        ax.plot([parse_bandwidth(b) for b in bandwidths], [time_to(history, b) for b in bandwidths], "o-", label=name)
ax.set(xscale="log", yscale="log", xlabel="bandwidth (bit/s)", ylabel="simulated seconds to loss 0.6",
       title="time to target against bandwidth" + (f"\\n(never at loss 0.6: {', '.join(never)})" if never else ""))
ax.legend()
plt.show()
print(f"never at loss 0.6 within {config.rounds} rounds:", ", ".join(never) or "none")"""),
    ("md", """## 6. Streaming on a transformer: the fragments are its blocks

On the MLP above a fragment is a set of layers. On the transformer language model of notebook 01
(`model="transformer"`, 2 blocks, reading 64-character windows of Tiny Shakespeare) it is a set of
its blocks: the embeddings (`wte`, `wpe`), each transformer block (`h0`, `h1`) and the final
LayerNorm (`ln_f`; the output head is tied to `wte`). The cell prints each fragment's blocks for
$P = 2$ and $P = 4$, then trains DiLoCo and Streaming ($\\tau = 0$, mix 1) with $K = 2$, $H = 10$,
5 rounds and one seed, and tabulates the bytes: the same in all, sent in smaller pieces. Seconds of
training, so the perplexities are not a verdict; `docs/results-transformer.md` compares Streaming at
$P = 2$ with DiLoCo over 5 seeds."""),
    ("code", """from diloco.core.model_seam import data_model
from diloco.core.schedule import block_fragment_keys
from diloco.text import load_shakespeare

text = load_shakespeare(64, eval_windows=128)  # windows of 64 characters, 128 held out
chars = text.dataset
lm = DiLoCoConfig(num_workers=2, inner_steps=10, rounds=5, batch_size=8, model="transformer", dtype="float32",
                  engine=default_engine())
blocks = data_model(lm, chars.x_train, text.encode).blocks()  # the fragment units, input to output
for p in (2, 4):
    print(f"P={p}, the blocks of each fragment:",
          [sorted({key.split(".")[0] for key in fragment}) for fragment in block_fragment_keys(blocks, p)])
rows = ["| transformer LM | held-out perplexity | all-reduces | peak bytes per sync | bytes per worker |",
        "|---|---:|---:|---:|---:|"]
for name, family in (("DiLoCo", None), ("Streaming P=2", FamilyConfig(fragments=2, overlap=0, mix=1.0)),
                     ("Streaming P=4", FamilyConfig(fragments=4, overlap=0, mix=1.0))):
    cfg = lm if family is None else lm.replace(family=family)
    history = trainer("diloco", cfg.engine)(chars.x_train, chars.y_train, cfg, x_eval=chars.x_test,
                                            y_eval=chars.y_test, encode=text.encode).history
    last = history[-1]
    peak = last.get("peak_sync_bytes", last["bytes_sent"])  # DiLoCo: one whole-model sync a round
    rows.append(f"| {name} | {last['eval_perplexity']:.2f} | {sum(r['all_reduces'] for r in history)} "
                f"| {peak:,.0f} | {last['cumulative_bytes']:,.0f} |")
display(Markdown("\\n".join(rows)))"""),
    ("md", """## Exercises

Seven graded exercises sit outside the course's 30 milestones (`docs/exercises/`): `x01` (the fp4
E2M1 quantiser with a power-of-two scale per block), `x02` (the streaming fragment schedule),
`x03` (top-k with error feedback), and `x04`-`x07`, the transformer language model of notebook 01
(its attention forward and backward, LayerNorm and GELU, the head and the residual stream's
gradient). In a workspace they are stubs of the library's own functions (`diloco.core.quantize`,
`diloco.core.schedule`, `diloco.methods.sparse`, `diloco.models.layers`,
`diloco.models.transformer`): `make test M=x01` runs one, and `make grade` reports them under the
30 milestones, outside the score. With `x04`-`x07` done, `model="transformer"` trains on your own
functions."""),
]


BEYOND_2025 = [
    ("md", """# Beyond DiLoCo, 2024-2025: asynchronous workers, sparse outer gradients, Muon

Three methods that followed DiLoCo, each a transform or a sync schedule of the one training core
(`diloco.core.driver.train`), so each runs on every executor with checkpoints, the divergence
guard and `--config`:

* **asynchronous DiLoCo** (Liu et al. 2024, arXiv 2401.09135): the server applies each worker's
  pseudo-gradient when it arrives, so a slow worker no longer holds the others back; delayed
  Nesterov momentum and dynamic local updates are the paper's two fixes for stale updates;
* **sparse outer gradients** (SparseLoCo, arXiv 2508.15706; DeMo, arXiv 2411.19870): each worker
  sends the top 1-3% of its pseudo-gradient per chunk, with error feedback;
* **a Muon inner optimizer** (MuLoCo, arXiv 2505.23725): Newton-Schulz orthogonalised momentum
  for the weight matrices, AdamW for the biases.

One small run of each on the digits, one figure per method, and Muon once more on a transformer
language model (section 4). The concept pages in
`docs/concepts/` have the equations; `docs/results-beyond.md` the 5-seed studies and their
verdicts (this notebook's single runs prove nothing by themselves).

Each method is a `DiLoCoConfig` setting, so `run` below trains it the way `.venv/bin/diloco study`
does: on `default_engine()`, the fast engine `diloco.engine` (the same algorithm, equal up to
rounding) where it is installed, your own milestone functions in a learner workspace. Only the
bit-for-bit reduction of section 1 runs on the reference path (`engine="reference"`)."""),
    ("code", """%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from diloco import DiLoCoConfig, train_diloco
from diloco.config import MuonConfig
from diloco.config.sections import AsyncConfig, FamilyConfig
from diloco.data import load_digits_split
from diloco.tools.studies.ablations import default_engine, trainer
from diloco.tools.studies.plots import log_where_decades
from diloco.tools.studies.study_stats import format_bytes  # the CLI's byte format

data = load_digits_split(seed=0)
config = DiLoCoConfig(num_workers=4, inner_steps=20, rounds=8, hidden_sizes=(32, 32), engine=default_engine())
print(f"engine: {config.engine}")


def run(cfg, algo="diloco"):
    \"\"\"Train ``algo`` under ``cfg`` on ``cfg.engine``.\"\"\"
    return trainer(algo, cfg.engine)(data.x_train, data.y_train, cfg, x_eval=data.x_test, y_eval=data.y_test)


def losses(result):
    return [r["eval_loss"] for r in result.history]


def log_loss_axis(ax):
    \"\"\"A log loss axis when the drawn losses span half a decade, labelled 0.5, 1, 2 (plain numbers).\"\"\"
    log_where_decades(ax, "y", [y for line in ax.get_lines() for y in line.get_ydata()], at_least=0.5)"""),
    ("md", """## 1. Asynchronous DiLoCo with a straggler

Worker 3 is four times slower. Synchronous DiLoCo waits for it every round; asynchronous
DiLoCo applies each group of arrivals to the current global model. The records carry the
simulated clock (`sim_cumulative_seconds`, one second per inner step of a normal worker). With
equal speeds the asynchronous schedule *is* DiLoCo, bit for bit; that check compares like with
like, so its asynchronous run takes the reference path, the milestone functions that
`train_diloco` runs (the fast engine equals them only up to rounding):"""),
    ("code", """equal = run(config.replace(asynchrony=AsyncConfig(asynchronous=True), engine="reference"))
plain = train_diloco(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
print("equal speeds: asynchronous equals train_diloco bit for bit:",
      all(np.array_equal(equal.params[k], plain.params[k]) for k in plain.params))

slow = dict(straggler=3, straggler_factor=4.0)
arms = {"synchronous DiLoCo": AsyncConfig(**slow),
        "asynchronous": AsyncConfig(asynchronous=True, **slow),
        "asynchronous + delayed Nesterov (N=4)": AsyncConfig(asynchronous=True, delayed_nesterov=4, **slow),
        "+ dynamic local steps": AsyncConfig(asynchronous=True, delayed_nesterov=4, dynamic_local_steps=True,
                                             **slow)}
horizon = run(config.replace(asynchrony=arms["synchronous DiLoCo"])).history[-1]["sim_cumulative_seconds"]
fig, ax = plt.subplots(figsize=(6, 4))
for name, spec in arms.items():
    rounds = config.rounds if name.startswith("synchronous") else 4 * config.rounds
    history = run(config.replace(asynchrony=spec, rounds=rounds)).history
    points = [(r["sim_cumulative_seconds"], r["eval_loss"]) for r in history if r["sim_cumulative_seconds"] <= horizon]
    ax.plot(*zip(*points), "o-", markersize=3, label=name)
ax.set(xlabel="simulated seconds", ylabel="held-out loss", title="one worker 4x slower: loss against simulated time")
log_loss_axis(ax)
ax.legend(fontsize=8)
plt.show()"""),
    ("md", """## 2. Sparse outer gradients

Each worker keeps the largest 2% of its pseudo-gradient per chunk of 4096 values and sends the
values with their indices; error feedback carries what it did not send into its next round.
The records count the bytes of indices and values at their real widths. With every entry kept
and no quantisation the exchange is DiLoCo's mean:"""),
    ("code", """dense = run(config)
full = run(config.replace(family=FamilyConfig(topk=1.0)))
gap = max(float(np.max(np.abs(full.params[k] - dense.params[k]))) for k in dense.params)
print(f"top-k at 100%: largest parameter difference from DiLoCo {gap:.1e}")

sparse = {"DiLoCo (float64)": config, "DiLoCo, fp4": config.replace(family=FamilyConfig(comm_dtype="fp4")),
          "top-2% + error feedback": config.replace(family=FamilyConfig(topk=0.02, error_feedback=True)),
          "top-2%, 2-bit values + error feedback": config.replace(
              family=FamilyConfig(topk=0.02, topk_bits=2, error_feedback=True))}
fig, ax = plt.subplots(figsize=(6, 4))
for name, cfg in sparse.items():
    history = run(cfg).history
    ax.plot([r["cumulative_bytes"] for r in history], [r["eval_loss"] for r in history], "o-", markersize=3,
            label=name)
ax.set(xlabel="bytes sent per worker", ylabel="held-out loss", title="loss against bytes sent")
log_where_decades(ax, "x", [x for line in ax.get_lines() for x in line.get_xdata()], formatter=format_bytes)
ax.legend(fontsize=8)
plt.show()"""),
    ("md", """## 3. Muon as the inner optimizer

Muon orthogonalises each weight matrix's momentum with five Newton-Schulz steps before the
update; the biases keep AdamW. MuLoCo's claim is that it combines well with DiLoCo as $K$ grows;
here one seed, $K = 1$ and $K = 4$, with Muon at its default lr (0.02), which nobody tuned for
this model: the 5-seed study on the results page tunes each optimizer's lr on a separate seed
first, and only its verdicts say which optimizer is better."""),
    ("code", """fig, ax = plt.subplots(figsize=(6, 4))
for workers in (1, 4):
    for name, cfg in (("AdamW", config), ("Muon", config.replace(inner_optimizer="muon", muon=MuonConfig()))):
        history = run(cfg.replace(num_workers=workers)).history
        ax.plot([r["round"] for r in history], [r["eval_loss"] for r in history], "o-" if workers == 4 else "s--",
                markersize=3, label=f"{name}, K={workers}")
ax.set(xlabel="outer round", ylabel="held-out loss", title="inner AdamW against inner Muon")
log_loss_axis(ax)
ax.legend(fontsize=8)
plt.show()"""),
    ("md", """## 4. Muon on a transformer's hidden matrices

The MLP above gives Muon only small weight matrices. On the transformer language model of
notebook 01 (`model="transformer"`, 2 blocks, reading 64-character windows of Tiny Shakespeare),
Muon orthogonalises the attention and MLP matrices of each block (printed below) and leaves the
embeddings, the tied output head, the LayerNorms and the biases to AdamW. DiLoCo with inner AdamW
against inner Muon at its default lr, $K = 2$, $H = 10$, 5 rounds, one seed: seconds of training,
so the perplexities are not a verdict; `docs/results-transformer.md` tunes both optimizers and
compares them over 5 seeds."""),
    ("code", """from IPython.display import display

from diloco.core.model_seam import data_model
from diloco.text import load_shakespeare
from diloco.tools.studies.plots import plot_curves

text = load_shakespeare(64, eval_windows=128)  # windows of 64 characters, 128 held out
chars = text.dataset
lm = DiLoCoConfig(num_workers=2, inner_steps=10, rounds=5, batch_size=8, model="transformer", dtype="float32",
                  engine=default_engine())
print("Muon acts on:", ", ".join(data_model(lm, chars.x_train, text.encode).muon_keys()))
lm_runs = {name: trainer("diloco", cfg.engine)(chars.x_train, chars.y_train, cfg, x_eval=chars.x_test,
                                              y_eval=chars.y_test, encode=text.encode).history
           for name, cfg in (("inner AdamW", lm), ("inner Muon", lm.replace(inner_optimizer="muon", muon=MuonConfig())))}
for name, history in lm_runs.items():
    print(f"{name}: held-out perplexity {history[-1]['eval_perplexity']:.2f}")
display(plot_curves(lm_runs, x="round", left="eval_perplexity",
                    title=f"transformer LM, DiLoCo (K={lm.num_workers}, H={lm.inner_steps}): inner AdamW against Muon"))"""),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_ablations.ipynb": ABLATIONS,
    "03_noniid.ipynb": NONIID,
    "04_beyond_diloco.ipynb": BEYOND,
    "05_beyond_diloco_2025.ipynb": BEYOND_2025,
}


def build(cells) -> nbformat.NotebookNode:
    notebook = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src)
                                   for kind, src in cells])
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"  # stable ids: regenerating changes nothing
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    return notebook


def execute(notebook: nbformat.NotebookNode, cwd: Path, timeout: int = 300) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"only these notebooks (default: all of "
                        f"{', '.join(NOTEBOOKS)})")
    parser.add_argument("--execute", action="store_true", help="run the notebooks and keep their outputs")
    parser.add_argument("--out", type=Path, default=NOTEBOOK_DIR, help="output folder (notebooks/)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in NOTEBOOKS]
    if unknown:
        parser.error(f"no notebook {unknown[0]!r}; the notebooks are {', '.join(NOTEBOOKS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or NOTEBOOKS:
        notebook = build(NOTEBOOKS[name])
        if args.execute:
            execute(notebook, args.out)
        nbformat.write(notebook, args.out / name)
        print(f"wrote {args.out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

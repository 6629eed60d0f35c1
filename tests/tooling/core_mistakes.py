"""The realistic mistakes ``scripts/plant_core_mistakes.py`` plants in the training core, one at a time.

Each is a text edit of one file of ``src/diloco`` (``old`` must occur exactly once), the
kind of slip a refactoring of the round loop makes: a merge one step late, the mixing
side swapped, a dropped worker's residual forgotten, shard weights ignored under top-k,
unequal arrival groups mishandled. The oracle tests (``test_oracles.py``) must catch
every one. The table lives here, under ``tests/tooling``, because ``scripts/`` is copied
into learner workspaces and several ``old`` texts are exercise solutions (x02, x03).
When the core is refactored, update an ``old`` text to the new code rather than drop it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Mistake", "MISTAKES"]


class Mistake(NamedTuple):
    name: str
    path: str  # inside src/diloco
    old: str
    new: str
    what: str


MISTAKES = (
    Mistake("merge-off-by-one", "core/schedule.py", "+ h + tau\n", "+ h + tau + 1\n",
            "a received fragment is merged one step late"),
    Mistake("merge-stops-before-syncs", "core/synchronisers.py",
            "        while done < inner_steps:  # the next stop is taken after each one: a merge due in this round "
            "is a stop\n"
            "            stops = event_steps(self.plan, [item[0] for item in state.pending], round_index, "
            "inner_steps)\n",
            "        stops = event_steps(self.plan, [item[0] for item in state.pending], round_index, inner_steps)\n"
            "        while done < inner_steps:\n",
            "the round's stops are taken before its syncs add their merges (the bug f050480 fixed)"),
    Mistake("mix-side", "core/sync.py", "mix * value + (1.0 - mix) * local[key]",
            "(1.0 - mix) * value + mix * local[key]", "mix weights the local side instead of the received one"),
    Mistake("first-fragment-offset", "core/schedule.py", "SyncEvent(offset if offset > 0 else inner_steps, p,",
            "SyncEvent(max(offset, 1), p,", "fragment 0 syncs after step 1 (offset 0 read as step 1, not H)"),
    Mistake("offsets-rounded", "core/schedule.py", "[(p * inner_steps) // fragments for p in range(fragments)]",
            "[round(p * inner_steps / fragments) for p in range(fragments)]",
            "t_p = round(pH/P) instead of floor(pH/P)"),
    Mistake("drop-rule-swapped", "core/sync.py", 'return tuple(arriving) if drop_rule == "restart"',
            'return tuple(arriving) if drop_rule == "carry"', "carry and restart swapped"),
    Mistake("all-dropped-steps", "core/sync.py",
            "        received = {key: value.copy() for key, value in sub_global.items()}\n"
            "        same = copy_outer_state(outer_state) if isinstance(outer_state, OuterState) else outer_state\n",
            "        received, same = outer_optimizer(config).update(sub_global, delta, outer_state, config)\n",
            "a round with every worker dropped still takes an outer step (on a zero gradient)"),
    Mistake("absent-residuals-lost", "core/sync.py", "new_residuals = {**residuals, **ex.residuals}",
            "new_residuals = dict(ex.residuals)", "a dropped worker's error-feedback residual is forgotten"),
    Mistake("dense-weights-ignored", "core/comm.py",
            "    w = None if weights is None else [weights[k] for k in order]\n",
            "    w = None\n", "shard-size weights ignored in the all-reduce"),
    Mistake("topk-weights-ignored", "core/codecs.py", "return average_params(decoded, weights), 0",
            "return average_params(decoded), 0", "shard-size weights ignored under top-k"),
    Mistake("topk-bytes", "core/codecs.py", "float((len(messages) - 1) * mean_message)",
            "float(len(messages) * mean_message)", "the all-gather counted as K messages instead of K - 1"),
    Mistake("topk-ties-late", "methods/sparse.py", 'np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :counts[0]]',
            'np.argsort(np.abs(rows), axis=1, kind="stable")[:, ::-1][:, :counts[0]]',
            "top-k ties go to the later index"),
    Mistake("topk-floor", "methods/sparse.py", "math.ceil(round(config.density * n, 9))", "int(config.density * n)",
            "k per chunk rounded down"),
    Mistake("decay-on-delta", "methods/sparse.py", "config.decay * old + value", "config.decay * (old + value)",
            "the error-feedback decay also scales the fresh outer gradient"),
    Mistake("eager-own-previous", "core/sync.py",
            "others = subtract_params(global_previous, scale_params(local_previous, share))",
            "others = global_previous", "eager: the others' previous average keeps the worker's own share"),
    Mistake("eager-consensus-unweighted", "core/sync.py",
            "return average_params([everyone[k] for k in sorted(everyone)], weights)",
            "return average_params([everyone[k] for k in sorted(everyone)])",
            "eager: the evaluated consensus ignores shard weights"),
    Mistake("group-count-ignored", "methods/asynchrony.py", "(count * delta[k] / period)", "(delta[k] / period)",
            "delayed Nesterov: a group of g arrivals moves the model as one arrival"),
    Mistake("pending-unweighted", "methods/asynchrony.py",
            "average_params([d for _, d in pending], [c for c, _ in pending])",
            "average_params([d for _, d in pending])", "delayed Nesterov: pending groups averaged, not by count"),
    Mistake("ties-not-grouped", "core/schedule.py", "while j < n and arrivals.time[j] == arrivals.time[i]:",
            "while j < n and j == i:", "simultaneous arrivals applied one by one, not as one group"),
    Mistake("non-arrivals-kept", "core/sync.py", "kept = [k for k in arriving if k not in dropped]",
            "kept = [k for k in range(num_workers) if k not in dropped]",
            "a group's average includes workers that did not arrive"),
    Mistake("version-per-group", "core/synchronisers.py", "version += len(group.workers)", "version += 1",
            "staleness counts groups, not arrivals"),
    Mistake("start-version", "methods/asynchrony.py", "(restart + float(duration[k]), k, applied))",
            "(restart + float(duration[k]), k, applied - len(group)))",
            "a restarted worker's version omits its own group"),
    Mistake("dylu-ceil", "methods/asynchrony.py", "np.floor(inner_steps * ratio + 1e-9)",
            "np.ceil(inner_steps * ratio - 1e-9)", "dynamic local steps rounded up"),
    Mistake("streaming-dropped-repeats", "core/synchronisers.py",
            "dropped = sorted(set(log.dropped)) if len(self.plan) > 1 else log.dropped",
            "dropped = log.dropped", "Streaming: a worker dropped by two fragments is listed twice"),
    Mistake("fragment-residual-replaced", "core/codecs.py", "{**residual, **state.residual} if feedback",
            "dict(state.residual) if feedback",
            "a fragment's sync replaces the worker's whole residual (the other fragments' are lost)"),
    Mistake("pattern-ignored", "core/schedule.py", 'if pattern == "strided":', "if True:",
            "every pattern taken as strided"),
    Mistake("one-spawn-per-round", "core/synchronisers.py",
            "        for group in self.groups[round_index - 1]:\n"
            "            self._steps(group, executor, rng.spawn(self.config.num_workers), log)\n",
            "        rngs = rng.spawn(self.config.num_workers)\n"
            "        for group in self.groups[round_index - 1]:\n"
            "            self._steps(group, executor, rngs, log)\n",
            "asynchronous: one batch stream per round, not per group of arrivals"),
    Mistake("async-base-current", "core/sync.py", "    if starts is None:\n", "    if True:\n",
            "asynchronous: pseudo-gradients measured from the current model, not the worker's start"),
    Mistake("dn-off-by-one", "methods/asynchrony.py", "    if held < period:\n", "    if held <= period:\n",
            "delayed Nesterov: the momentum step one arrival late"),
)

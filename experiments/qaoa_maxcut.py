"""QAOA MaxCut on a random 3-regular graph: the Pauli estimator beside the exact state vector.

Problem: networkx.random_regular_graph(--degree, --nodes, seed=--graph-seed), unit weights, the cut
observable C = sum_<a,b> (1 - Z_a Z_b) / 2 (`pp.hamiltonians.maxcut`). Reference: the exact MaxCut,
by brute force over all 2^n bitstrings (numpy).

Ansatz: `pp.ansatz.qaoa(edges, --layers)`: H on every qubit, then per layer exp(-i gamma C) and the
mixer exp(-i beta sum X); parameters (gamma_0, beta_0, gamma_1, ...). --starts start points, start s
drawn uniformly from [0, --init-range)^(2p) with numpy seed s. Each start is optimized with
optax.adam (--lr, --steps; --decay: cosine decay to 1%) maximizing <C>, once per estimator, from the same point:
  pauli        pp.expectation_fn(..., method="pauli"). Untruncated where it fits (default up to 10
               nodes: 5.1e5 words at 10 nodes, p = 3); larger graphs default to min_abs_coeff 1e-3
               (16 nodes, p = 3 near the optimum: 1.2e5 words; 3e-4 needs 7.9e5 words and 8 s per
               step here, untruncated does not fit in 10 GB). --min-abs-coeff overrides (0: exact).
               Capacity: expectation_fn's choice at the first start (or --capacity); a step that
               overflows is redone at twice the capacity (a new compilation), so no step loses terms.
  statevector  pp.expectation_fn(..., method="statevector"): the dense 2^n reference.
The truncated estimator is biased, so every Pauli optimum is also evaluated exactly (state vector at
its angles). Checks, recorded in the JSON (exit code 1 if one fails): untruncated, the best Pauli
value equals the best state-vector value to --rtol (default 1e-6); truncated, the exact value at the
Pauli angles is within --rtol (default 1e-2) of the state-vector optimum.

Timing: one jax.jit per estimator of (value_and_grad + adam update); `first_step_s` includes its
compilation (and the first start's capacity search in `build_s`); `step_s` is the mean of the rest.

Examples
  python experiments/qaoa_maxcut.py                          # 16 nodes, p = 3, 3 starts x 150 steps
  python experiments/qaoa_maxcut.py --nodes 8 --steps 100    # untruncated: Pauli == state vector
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import benchtools  # noqa: E402  (experiments/benchtools.py)
import pauliprop as pp  # noqa: E402

EXACT_UP_TO_NODES = 10  # default: untruncated Pauli propagation up to this many nodes (p = 3)


def graph_edges(nodes: int, degree: int, seed: int) -> list[tuple[int, int]]:
    import networkx as nx

    return sorted(tuple(sorted(e)) for e in nx.random_regular_graph(degree, nodes, seed=seed).edges())


def brute_force_maxcut(edges, nodes: int) -> tuple[int, str]:
    """The largest cut over all 2^n bitstrings, and one bitstring reaching it (character q = node q)."""
    a, b = np.array(edges).T
    z = np.arange(1 << nodes, dtype=np.int64)
    cut = np.zeros(z.size, np.int16)
    for u, v in zip(a, b):
        cut += ((z >> u) ^ (z >> v)) & 1
    best = int(np.argmax(cut))
    return int(cut[best]), "".join(str((best >> q) & 1) for q in range(nodes))


class Objective:
    """-<C> and its adam step for one estimator; for the Pauli one, rebuilt at twice the capacity
    whenever a step overflowed (the step is then redone)."""

    def __init__(self, circuit, C, x0, method, truncation, capacity, lr):
        self.circuit, self.C, self.method, self.truncation = circuit, C, method, truncation
        self.opt, self.compiles, self.overflows, self.capacities = optax.adam(lr), 0, 0, []
        t0 = time.perf_counter()
        self._build(x0, capacity)
        self.build_s = time.perf_counter() - t0

    def _build(self, x0, capacity):
        pauli = self.method == "pauli"
        f = pp.expectation_fn(self.circuit, self.C, x0, truncation=self.truncation, method=self.method,
                              capacity=capacity, return_stats=pauli)
        self.capacity = f.capacity if pauli else None
        self.capacities.append(self.capacity)
        opt = self.opt

        def step(x, state):
            if pauli:
                (loss, stats), g = jax.value_and_grad(lambda y: _neg(f(y)), has_aux=True)(x)
                info = (stats.overflow, stats.max_terms_seen)
            else:
                loss, g = jax.value_and_grad(lambda y: -f(y))(x)
                info = (jnp.bool_(False), jnp.int32(0))
            u, state = opt.update(g, state, x)
            return optax.apply_updates(x, u), state, -loss, info

        cpu = pauli and jax.default_backend() == "cpu"
        self.step = jax.jit(step, compiler_options=pp.CPU_COMPILER_OPTIONS if cpu else None)
        self.value = jax.jit(lambda x: f(x)[0] if pauli else f(x))
        self.compiles += 1

    def optimize(self, x0, steps) -> dict:
        x, state = jnp.asarray(x0), self.opt.init(jnp.asarray(x0))
        values, times, peak = [], [], 0
        for _ in range(steps):
            t0 = time.perf_counter()
            while True:
                with warnings.catch_warnings():  # an overflow is handled here: grow and redo
                    warnings.filterwarnings("ignore", message=".*overflowed.*", category=RuntimeWarning)
                    xn, sn, v, (overflow, seen) = self.step(x, state)
                    overflow = bool(overflow)
                if not overflow:
                    break
                self.overflows += 1
                self._build(x, 2 * self.capacity)
            x, state = xn, sn
            values.append(float(v))
            peak = max(peak, int(seen))
            times.append(time.perf_counter() - t0)
        return dict(x=x, values=values, final_value=float(self.value(x)), first_step_s=times[0],
                    step_s=float(np.mean(times[1:])) if steps > 1 else None, loop_s=float(sum(times)),
                    peak_terms=peak if self.method == "pauli" else None)


def _neg(vs):
    v, stats = vs
    return -v, stats


def plot(records, maxcut: int, path: Path) -> bool:
    """<C> per step for every start and estimator; False when matplotlib is missing."""
    plt = benchtools.pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    styles = {"pauli": "-", "statevector": ":"}
    for r in records:
        for s, run in enumerate(r["starts"]):
            ax.plot(run["values"], styles[r["method"]], color=f"C{s}", label=f"{r['method']}, start {s}")
    ax.axhline(maxcut, color="k", lw=0.8, label=f"MaxCut = {maxcut}")
    ax.set_xlabel("adam step")
    ax.set_ylabel("<C>")
    ax.set_title("QAOA MaxCut")
    ax.legend(fontsize=7)
    benchtools.save_figure(fig, path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--nodes", type=int, default=16, help="graph nodes (16)")
    ap.add_argument("--degree", type=int, default=3, help="graph degree (3)")
    ap.add_argument("--graph-seed", type=int, default=0, help="networkx seed of the graph (0)")
    ap.add_argument("--layers", type=int, default=3, help="QAOA depth p (3)")
    ap.add_argument("--starts", type=int, default=3, help="random start points, seeds 0.. (3)")
    ap.add_argument("--init-range", type=float, default=0.8, help="start angles uniform in [0, this) (0.8)")
    ap.add_argument("--steps", type=int, default=150, help="adam steps per start (150)")
    ap.add_argument("--lr", type=float, default=0.05, help="adam learning rate (0.05)")
    ap.add_argument("--decay", action="store_true", help="cosine-decay the learning rate to 1%% over the steps "
                    "(both estimators), so the last iterates settle instead of hopping around the optimum")
    ap.add_argument("--min-abs-coeff", type=float, default=None, help="Pauli truncation threshold; 0 = exact "
                    f"(default: exact up to {EXACT_UP_TO_NODES} nodes, else 1e-3)")
    ap.add_argument("--capacity", type=int, default=None, help="Pauli term capacity (default: expectation_fn's "
                    "choice at the first start; doubled on overflow)")
    ap.add_argument("--methods", default="pauli,statevector", help="comma list of pauli, statevector")
    ap.add_argument("--rtol", type=float, default=None, help="check tolerance (default 1e-6 untruncated, 1e-2 "
                    "truncated; see the docstring)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default experiments/results/"
                    "qaoa_maxcut<n>_p<p>_<backend>_<date>.json)")
    ap.add_argument("--no-plot", action="store_true", help="no convergence plot (PNG beside the JSON)")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.replace(" ", "").split(",") if m]
    if any(m not in ("pauli", "statevector") for m in methods):
        ap.error(f"--methods: choose from pauli, statevector, got {args.methods!r}")
    thr = args.min_abs_coeff if args.min_abs_coeff is not None else (0.0 if args.nodes <= EXACT_UP_TO_NODES else 1e-3)
    truncation = pp.Truncation(min_abs_coeff=thr) if thr > 0 else None
    rtol = args.rtol if args.rtol is not None else (1e-6 if truncation is None else 1e-2)

    env = dict(benchtools.environment(("optax", "networkx")), git=benchtools.git_state())
    out = args.out or benchtools.default_out(f"qaoa_maxcut{args.nodes}_p{args.layers}", env["jax_backend"])
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"# {env['date_utc']}: {env['cpu_model']} ({env['cpu_count']} cpus, load {env['load_average_1_5_15']}), "
          f"jax {env['versions']['jax']} on {env['jax_backend']}; writing {out}", flush=True)

    edges = graph_edges(args.nodes, args.degree, args.graph_seed)
    C = pp.hamiltonians.maxcut(edges, args.nodes)
    circuit = pp.ansatz.qaoa(edges, args.layers, args.nodes)
    t0 = time.perf_counter()
    maxcut, best_bits = brute_force_maxcut(edges, args.nodes)
    brute_s = time.perf_counter() - t0
    starts = [np.random.default_rng(s).uniform(0, args.init_range, circuit.num_params) for s in range(args.starts)]
    print(f"# {args.nodes} nodes, {len(edges)} edges, p = {args.layers}; MaxCut = {maxcut} ({best_bits}, brute "
          f"force {brute_s:.2f} s); Pauli truncation: {'none (exact)' if truncation is None else f'min_abs_coeff {thr:g}'}",
          flush=True)

    exact = jax.jit(lambda x: pp.expectation(circuit, C, x, method="statevector"))
    records = []
    for m in methods:
        lr = optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01) if args.decay else args.lr
        obj = Objective(circuit, C, starts[0], m, truncation if m == "pauli" else None, args.capacity, lr)
        runs = []
        for s, x0 in enumerate(starts):
            run = obj.optimize(x0, args.steps)
            x = run.pop("x")
            run.update(seed=s, x0=x0.tolist(), x=np.asarray(x).tolist(), exact_value=float(exact(x)))
            runs.append(run)
            print(f"{m:<12} start {s}: <C> = {run['final_value']:.8f} (exact at these angles {run['exact_value']:.8f}), "
                  f"first step {run['first_step_s']:.1f} s, then {1e3 * run['step_s']:.1f} ms/step"
                  + (f", peak {run['peak_terms']} words, capacity {obj.capacity}" if m == "pauli" else ""), flush=True)
        best = max(range(len(runs)), key=lambda i: runs[i]["final_value"])
        records.append(dict(method=m, build_s=obj.build_s, compiles=obj.compiles, overflow_regrowths=obj.overflows,
                            capacity=obj.capacity, capacities=obj.capacities, truncation=None if m != "pauli" or truncation is None
                            else dict(min_abs_coeff=thr), best_start=best, best_value=runs[best]["final_value"],
                            best_exact_value=runs[best]["exact_value"], approximation_ratio=runs[best]["exact_value"] / maxcut,
                            total_s=obj.build_s + sum(r["loop_s"] for r in runs), starts=runs))

    by = {r["method"]: r for r in records}
    check = None
    if "pauli" in by and "statevector" in by:
        p, sv = by["pauli"], by["statevector"]
        if truncation is None:
            rel = abs(p["best_value"] - sv["best_value"]) / abs(sv["best_value"])
            what = "untruncated: |best Pauli <C> - best state-vector <C>| / best state-vector <C>"
        else:
            rel = abs(p["best_exact_value"] - sv["best_value"]) / abs(sv["best_value"])
            what = "truncated: |exact <C> at the best Pauli angles - best state-vector <C>| / best state-vector <C>"
        check = dict(what=what, rel_diff=rel, rtol=rtol, passed=bool(rel <= rtol),
                     pauli_estimate_rel_bias=abs(p["best_value"] - p["best_exact_value"]) / p["best_exact_value"])
        print(f"check ({what}): {rel:.2e} <= {rtol:g}: {check['passed']}")
    for r in records:
        print(f"{r['method']:<12} best <C> {r['best_value']:.8f} (exact {r['best_exact_value']:.8f}), ratio "
              f"{r['approximation_ratio']:.5f}, total {r['total_s']:.1f} s, {r['compiles']} compile(s)")

    result = dict(meta=dict(env, args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                            edges=edges, num_params=circuit.num_params),
                  maxcut=maxcut, maxcut_bitstring=best_bits, brute_force_s=brute_s, check=check, records=records)
    if not args.no_plot and plot(records, maxcut, out.with_suffix(".png")):
        result["plot"] = out.with_suffix(".png").name
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(f"wrote {out}" + (f" and {result['plot']}" if "plot" in result else ""))
    return 1 if check is not None and not check["passed"] else 0


if __name__ == "__main__":
    sys.exit(main())

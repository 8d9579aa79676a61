"""Where the stabilizer's time goes, step by step (issue 18), one GPU process:

    python experiments/probes/stabilizer_steps_probe.py packed    # d = 5, 1e6 shots (SHOTS=...): the chunk program, the
                                                     # page-locked copy, np.asarray, the copy into the output
    python experiments/probes/stabilizer_steps_probe.py measure   # 10,000 qubits (NQ=...): gates, measure-all, a block's
                                                     # plan and apply (KMODE=pallas|jax) (QuaSARQ: stabilizer_bench.py,
                                                     # which runs it in a subprocess: it aborts here);
                                                     # PROFILE=1: the device's kernels of measure-all and gates
    python experiments/probes/stabilizer_steps_probe.py measure-compile   # measure-all's program at NQ qubits: lowering and
                                                     # compiling alone, the persistent cache off
    python experiments/probes/stabilizer_steps_probe.py phases    # TableauSimulator.do on the measure-all circuit, its host
                                                     # steps apart (each waited for), beside the whole call
    python experiments/probes/stabilizer_steps_probe.py timeline  # one measure-all run under the profiler (FULL=0: gates
                                                     # only): the device's kernels in order around the middle
                                                     # block, where the device idles, the host's events

For an A/B of a change, run a mode against the previous commit's package first on PYTHONPATH
(`git archive HEAD~1 stabilizer | tar -x -C /tmp/old`, then PYTHONPATH=/tmp/old:...), alternating.

Writes probe_<mode>.json under $OUT (default /tmp). Run from the repository root."""
import json, os, sys, time
import numpy as np
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # probes/, experiments/
import jax, jax.numpy as jnp
from stabilizer_bench import surface_circuit_text, random_circuit
import stabilizer as st
from stabilizer.frames import frames as F, sampler as smp
from stabilizer.tableau import tableau as T

OUT = os.environ.get("OUT", "/tmp")
res = {}

def best(fn, r=5):
    fn(); ts = []
    for _ in range(r):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts), ts

if "packed" in sys.argv:
    shots = int(os.environ.get("SHOTS", 10**6))
    s = st.compile_detector_sampler(st.Circuit(surface_circuit_text(5, 1e-3)), seed=1)
    full = lambda: s.sample(shots, separate_observables=True, bit_packed=True)
    res["sample_packed_host"] = best(full)
    dev = lambda: jax.block_until_ready(s.sample(shots, separate_observables=True, bit_packed=True, on_device=True))
    res["sample_device"] = best(dev)
    plan = s._plan(shots); print("plan", plan)
    tables = s._layouts[(False, False, True)]
    prog = s.program
    def chunk():
        start, n, words = plan[0]
        with jax.enable_x64(True):
            return smp._chunk(s._structure, s._tables, s._key, np.array([1, start], np.uint32), tables, prog.num_qubits,
                              prog.num_measurements, words, F.frame_engine("auto", words), s._limits, True)
    res["chunk_dev"] = best(lambda: jax.block_until_ready(chunk()))
    parts = jax.block_until_ready(chunk())
    print([p.shape for p in parts], [p.nbytes for p in parts])
    def pinned():
        return jax.block_until_ready([smp._start_host_copy(jnp.copy(p)) for p in parts])
    res["copy+pinned"] = best(pinned)
    res["copy_only"] = best(lambda: jax.block_until_ready([jnp.copy(p) for p in parts]))
    pins = pinned()
    print("pinned kinds", [p.sharding.memory_kind for p in pins])
    def asarr_pinned():
        ps = pinned(); t0 = time.perf_counter(); a = [np.asarray(p) for p in ps]; return time.perf_counter() - t0
    res["asarray_of_pinned"] = sorted(asarr_pinned() for _ in range(5))
    def asarr_gpu():
        ps = jax.block_until_ready([jnp.copy(p) for p in parts]); t0 = time.perf_counter(); a = [np.asarray(p) for p in ps]; return time.perf_counter() - t0
    res["asarray_of_gpu"] = sorted(asarr_gpu() for _ in range(5))
    def asarr_async():
        ps = jax.block_until_ready([jnp.copy(p) for p in parts]); t0 = time.perf_counter()
        for p in ps: p.copy_to_host_async()
        a = [np.asarray(p) for p in ps]; return time.perf_counter() - t0
    res["asarray_async"] = sorted(asarr_async() for _ in range(5))
    def devget():
        ps = jax.block_until_ready([jnp.copy(p) for p in parts]); t0 = time.perf_counter(); a = jax.device_get(ps); return time.perf_counter() - t0
    res["device_get"] = sorted(devget() for _ in range(5))
    n = shots
    def copy_into():
        a = [np.asarray(p) for p in pins]
        t0 = time.perf_counter()
        outs = [np.empty((n,) + x.shape[1:], np.uint8) for x in a]
        for o, x in zip(outs, a): o[:] = x[:n]
        return time.perf_counter() - t0
    res["copy_into_fresh"] = sorted(copy_into() for _ in range(5))
    # sliced on device then pinned, then asarray (no host copy after)
    def sliced():
        t0 = time.perf_counter()
        ps = chunk()
        ps = [smp._start_host_copy(p[:n]) for p in ps]
        a = [np.asarray(p) for p in ps]
        return time.perf_counter() - t0
    res["chunk_slice_pinned_asarray"] = sorted(sliced() for _ in range(5))
    def sliced_pageable():
        t0 = time.perf_counter()
        ps = chunk()
        ps = [p[:n] for p in ps]
        for p in ps: p.copy_to_host_async()
        a = [np.asarray(p) for p in ps]
        return time.perf_counter() - t0
    res["chunk_slice_pageable"] = sorted(sliced_pageable() for _ in range(5))
    try:
        def dl():
            ps = pinned(); t0 = time.perf_counter(); a = [np.from_dlpack(p) for p in ps]; return time.perf_counter() - t0
        res["from_dlpack_pinned"] = sorted(dl() for _ in range(5))
    except Exception as e:
        res["from_dlpack_pinned"] = repr(e)[:300]

if "measure" in sys.argv:
    n = int(os.environ.get("NQ", 10000))
    gates = random_circuit(n, 100, 0, False, text=False)
    fullc = random_circuit(n, 100, 0, True, text=False)
    def run(c):
        sim = st.TableauSimulator(seed=0, num_qubits=n); sim.do(c); jax.block_until_ready(sim._tableau); return sim
    t0 = time.perf_counter(); sim = run(gates); res["gates_first"] = time.perf_counter() - t0
    res["gates"] = best(lambda: run(gates), 3)
    t0 = time.perf_counter(); run(fullc); res["full_first"] = time.perf_counter() - t0
    res["full"] = best(lambda: run(fullc), 3)
    t = sim._tableau
    print("capacity", t.capacity, t.xs.shape)
    qubits = jnp.arange(n, dtype=jnp.int32); active = jnp.ones(n, bool); guesses = jnp.zeros(n, bool)
    cp = lambda: jax.tree.map(jnp.copy, t)
    def meas():
        tt = jax.block_until_ready(cp()); t0 = time.perf_counter()
        jax.block_until_ready(T.measure_many_z(tt, qubits, active, guesses)); return time.perf_counter() - t0
    res["measure_many"] = sorted(meas() for _ in range(4))
    if os.environ.get("PROFILE"):  # the device's kernels by name, one call each
        from benchtools import device_kernels
        tt = jax.block_until_ready(cp())
        res["measure_many_kernels"] = device_kernels(
            lambda: jax.block_until_ready(T.measure_many_z(tt, qubits, active, guesses)), top=40)
        res["gates_kernels"] = device_kernels(lambda: run(gates), top=20)
    rows = n + jnp.arange(32)
    sub = T.Tableau(t.xs[rows], t.zs[rows], t.signs[rows])
    planf = jax.jit(T._plan_block, static_argnums=(3,))
    K = os.environ.get("KMODE", "pallas")
    plan = jax.block_until_ready(planf(sub, jnp.ones(32, bool), jnp.zeros(32, bool), K))
    res["plan_block"] = best(lambda: jax.block_until_ready(planf(sub, jnp.ones(32, bool), jnp.zeros(32, bool), K)), 5)
    applyf = jax.jit(T._apply_block, static_argnums=(2,))
    res["apply_block"] = best(lambda: jax.block_until_ready(applyf(cp(), plan, K)), 5)
    res["copy_only"] = best(lambda: jax.block_until_ready(cp()), 5)
    res["random_in_block"] = int(np.sum(np.asarray(plan.random)))

if "measure-compile" in sys.argv:  # measure-all's program alone at NQ qubits: lowering and compiling, the
    # persistent cache off (run against two checkouts, alternating, for an A/B of a change)
    jax.config.update("jax_enable_compilation_cache", False)
    n = int(os.environ.get("NQ", 10000))
    t, args = T.identity(n), (jnp.arange(n, dtype=jnp.int32), jnp.ones(n, bool), jnp.zeros(n, bool))
    t0 = time.perf_counter()
    lowered = jax.jit(T._measure_many_inner, static_argnames=("kernel",)).lower(t, *args, kernel="pallas")
    t1 = time.perf_counter()
    lowered.compile()
    res |= {"lower_s": t1 - t0, "compile_s": time.perf_counter() - t1, "module": T.__file__,
            "triton_kernels": lowered.as_text().count("__gpu$xla.gpu.triton")}

if "phases" in sys.argv:
    from stabilizer.circuits import program
    n = int(os.environ.get("NQ", 10000))
    c = random_circuit(n, 100, 0, True, text=False)

    def whole():
        sim = st.TableauSimulator(seed=0, num_qubits=n); sim.do(c); jax.block_until_ready(sim._tableau)
        sim.current_measurement_record()

    whole(); whole()
    names = ["ctor", "set_num_qubits", "lowered+tables", "guesses", "key", "dispatch", "run", "record", "whole_do"]
    rows = []
    for _ in range(6):  # _do_program's steps, each waited for, then the whole call
        ts = [time.perf_counter()]
        sim = st.TableauSimulator(seed=0, num_qubits=n); jax.block_until_ready(sim._tableau); ts.append(time.perf_counter())
        sim.set_num_qubits(c.num_qubits); jax.block_until_ready(sim._tableau); ts.append(time.perf_counter())
        prog = program.lowered(c, spare=sim._n, merge_gates=True, runs=True)
        structure, tables = prog.structure(), program.device_tables(prog); ts.append(time.perf_counter())
        guesses = jax.block_until_ready(jnp.asarray(sim._rng.integers(2, size=prog.num_measurements).astype(bool)))
        ts.append(time.perf_counter())
        key = jax.block_until_ready(jax.random.key(int(sim._rng.integers(2**62)))); ts.append(time.perf_counter())
        _, record = T.run_program(structure, tables, sim._tableau, guesses, key, noisy=True); ts.append(time.perf_counter())
        jax.block_until_ready(record); ts.append(time.perf_counter())
        np.asarray(record).tolist(); ts.append(time.perf_counter())
        t0 = time.perf_counter(); whole()
        rows.append(list(np.diff(ts) * 1e3) + [(time.perf_counter() - t0) * 1e3])
    res |= {"names": names, "best_ms": [round(float(x), 3) for x in np.min(np.array(rows), axis=0)],
            "rows": [[round(float(x), 3) for x in r] for r in rows]}

if "timeline" in sys.argv:
    import collections, glob, gzip, tempfile
    n = int(os.environ.get("NQ", 10000))
    full = os.environ.get("FULL", "1") == "1"
    c = random_circuit(n, 100, 0, full, text=False)

    def run():
        sim = st.TableauSimulator(seed=0, num_qubits=n); sim.do(c); jax.block_until_ready(sim._tableau)

    for _ in range(3):
        run()
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True); run(); jax.profiler.stop_trace()
        trace = json.load(gzip.open(glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)[0]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    pids = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    on_gpu = lambda e: "GPU" in pids.get(e.get("pid"), "")
    dev = sorted((e for e in events if e.get("ph") == "X" and on_gpu(e)), key=lambda e: e["ts"])
    host = [e for e in events if e.get("ph") == "X" and not on_gpu(e)]
    key = "apply" if full else "prepend"
    mid = [i for i, e in enumerate(dev) if key in e["name"]]
    if not mid:
        raise SystemExit(f"timeline: no {key} kernel in the device's trace (it probes the GPU kernels)")
    mid = mid[len(mid) // 2]
    t0, start = dev[mid]["ts"], dev[0]["ts"]
    res["device_mid"] = [(e["name"][:40], round(e["ts"] - t0, 1), round(e["dur"], 1)) for e in dev[mid - 2: mid + 20]]
    idle = collections.Counter()
    for a, b in zip(dev, dev[1:]):
        idle[a["name"][:30] + " -> " + b["name"][:30]] += b["ts"] - a["ts"] - a["dur"]
    res["idle_by_pair_us"] = [(k, round(v, 1)) for k, v in idle.most_common(25)]
    marks = {}
    for e in dev:
        for k in ("prepend", "apply", "replay"):
            if k in e["name"]:
                marks.setdefault(k, [e["ts"], 0])[1] = e["ts"] + e["dur"]
    res["marks_ms"] = {k: (round((a - start) / 1e3, 3), round((b - start) / 1e3, 3)) for k, (a, b) in marks.items()}
    res["span_device_ms"] = (dev[-1]["ts"] + dev[-1]["dur"] - start) / 1e3
    busy, count = collections.Counter(), collections.Counter()
    for e in host:
        busy[e["name"][:50]] += e["dur"]; count[e["name"][:50]] += 1
    res["host_top"] = [(k, round(v / 1e3, 3), count[k]) for k, v in busy.most_common(40)]

res["device"] = str(jax.devices()[0]); res["jax"] = jax.__version__
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(OUT, "probe_%s.json" % "_".join(sys.argv[1:])), "w"), indent=1)

"""Where the stabilizer's time goes, step by step (issue 18), one GPU process:

    python experiments/stabilizer_steps_probe.py packed    # d = 5, 1e6 shots (SHOTS=...): the chunk program, the
                                                     # page-locked copy, np.asarray, the copy into the output
    python experiments/stabilizer_steps_probe.py measure   # 10,000 qubits (NQ=...): gates, measure-all, a block's
                                                     # plan and apply (KMODE=pallas|jax) (QuaSARQ: stabilizer_bench.py,
                                                     # which runs it in a subprocess: it aborts here);
                                                     # PROFILE=1: the device's kernels of measure-all and gates
    python experiments/stabilizer_steps_probe.py measure-compile   # measure-all's program at NQ qubits: lowering and
                                                     # compiling alone, the persistent cache off

Writes probe_<mode>.json under $OUT (default /tmp). Run from the repository root."""
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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

res["device"] = str(jax.devices()[0]); res["jax"] = jax.__version__
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(OUT, "probe_%s.json" % "_".join(sys.argv[1:])), "w"), indent=1)

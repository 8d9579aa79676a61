"""Pauli terms sharded over devices (pauliprop/propagation/sharded.py): on meshes of 1, 2 and 4 devices (forced
CPU host devices, in a subprocess, since JAX fixes its device count when it starts) the propagated
terms and the expectation values equal the single-device ones, untruncated and truncated (the
same kept set under max_terms, whose ties are common at equal angles), every word sits on its
owner, an overflowing bucket grows and the run resumes, gradients (JAX's reverse mode through the
shards) equal the engine's adjoint ones, and bad meshes and inputs name the cause."""

from __future__ import annotations

import textwrap

import pytest

from .._devices import forced_devices_result

SCRIPT = textwrap.dedent("""
    import json, math, os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import pauliprop as pp
    from pauliprop import models
    from pauliprop.propagation import sharded

    def terms(s):
        x, z, c = (np.asarray(a) for a in (s.x, s.z, s.coeffs))
        return {(x[i].tobytes(), z[i].tobytes()): float(c[i]) for i in np.flatnonzero(c)}

    out = {"devices": len(jax.devices()), "cases": [], "placement": [], "bucket": [], "errors": {}}
    meshes = {nd: sharded.default_mesh(jax.devices()[:nd]) for nd in (1, 2, 4)}

    def case(name, c, h, p, trunc, state="0", nds=(1, 2, 4), **kw):
        ref, ref_stats = pp.propagate(c, h, p, truncation=trunc)
        want = float(pp.expectation(c, h, p, state=state, truncation=trunc))
        R = terms(ref)
        for nd in nds:
            got, stats = sharded.propagate(c, h, p, truncation=trunc, mesh=meshes[nd], **kw)
            value = float(sharded.expectation(c, h, p, state=state, truncation=trunc, mesh=meshes[nd], **kw))
            S = terms(got)
            out["cases"].append(dict(
                name=name, devices=nd, truncated=trunc is not None, terms=len(R), same_words=set(S) == set(R),
                coeff_error=max((abs(S[k] - R[k]) for k in R if k in S), default=0.0),
                value_error=abs(value - want), value=want,
                dropped_error=float(np.abs(np.asarray(ref_stats.dropped_norm) - stats.dropped_norm).max()),
                dropped=float(np.sum(ref_stats.dropped_norm)),
                peak=[int(ref_stats.max_terms_seen), stats.max_terms_seen]))
            if nd > 1:  # every live word in its owner's shard
                per = stats.capacity // nd
                words = jnp.concatenate([got.x, got.z], axis=1)
                own = np.asarray(sharded.owner(words, nd))
                live = np.asarray(got.coeffs) != 0
                out["placement"].append(bool(np.all(own[live] == np.arange(stats.capacity)[live] // per)))

    rng = np.random.default_rng(7)
    # Clifford gates and rotations (fixed and parametrized, a 3-qubit generator), a mixed observable
    c = hea = pp.ansatz.hardware_efficient(6, 3, rotations=("ry", "rz"), entangler="cx")
    c.h(2).t(3).s(0).rzz(1, 4, 0.3).swap(0, 5).pauli_rotation("XYZ", [5, 2, 4], 0.7).cz(3, 5)
    p = hea_params = rng.uniform(-1, 1, c.num_params)
    h = tfim = pp.hamiltonians.tfim(6)
    case("clifford+rotations", c, h, p, None, state="0+1-r0", initial_capacity=8192)
    case("clifford+rotations", c, h, p, pp.Truncation(max_terms=20))
    case("clifford+rotations", c, h, p, pp.Truncation(min_abs_coeff=1e-2, max_weight=3))
    # the kicked Ising at pi/4: 3 distinct magnitudes among the 20 kept, so the max_terms cut splits ties
    # by merge.tie_keys (reversing the tie order in sharded._keep_largest fails this case)
    ki, z62 = models.kicked_ising(3, math.pi / 4), models.single_z(62)
    case("kicked_ising", ki, z62, None, pp.Truncation(max_terms=20, min_abs_coeff=1e-6), initial_capacity=2048)
    # random small circuits with noise (amplitude damping merges, depolarizing channels), per layer, max_sins
    for seed in (1, 2):
        r = np.random.default_rng(seed)
        n = 5
        c = pp.Circuit(n)
        for _ in range(3):
            for q in range(n):
                getattr(c, str(r.choice(["rx", "ry", "rz"])))(q, float(r.uniform(-2, 2)))
            for q in r.permutation(n - 1):
                getattr(c, str(r.choice(["cx", "cz", "iswap"])))(int(q), int(q) + 1)
            c.depolarize(int(r.integers(n)), 0.05).amplitude_damp(int(r.integers(n)), 0.1).t(int(r.integers(n)))
        h = pp.PauliSum.from_list([("ZZ", [0, 1], 1.0), ("X", [3], 0.5), ("Y", [4], -0.3), ("XZ", [2, 4], 0.2)], n)
        case(f"random{seed}", c, h, None, None, state="0+1-r")
        case(f"random{seed}", c, h, None, pp.Truncation(max_terms=15, max_sins=3, per="layer"))
        case(f"random{seed}", c, h, None, pp.Truncation(max_sins=2, min_abs_coeff=1e-3))
    # a mesh of 3 devices (the hash works modulo any count)
    meshes[3] = sharded.default_mesh(jax.devices()[:3])
    case("three_devices", ki, z62, None, pp.Truncation(max_terms=20, min_abs_coeff=1e-6), nds=(3,),
         initial_capacity=3 * 1024)

    # gradients: JAX's reverse mode through the sharded static loop (jitted) equals the engine's adjoint
    out["gradients"] = []
    gc = pp.ansatz.hardware_efficient(5, 2, rotations=("ry", "rz"), entangler="cx")
    gc.h(2).t(3).pauli_rotation("XYZ", [4, 2, 3], 0.7)
    gp = jnp.asarray(rng.uniform(-1, 1, gc.num_params))
    gh = pp.hamiltonians.tfim(5)
    for nd, trunc in ((4, pp.Truncation(max_terms=40)),):
        g0 = np.asarray(jax.grad(lambda q: pp.expectation(gc, gh, q, truncation=trunc, capacity=2048))(gp))
        v0 = float(pp.expectation(gc, gh, gp, truncation=trunc))
        f = lambda q: sharded.expectation(gc, gh, q, truncation=trunc, mesh=meshes[nd], capacity=256 * nd)
        v, g = jax.jit(jax.value_and_grad(f))(gp)
        out["gradients"].append(dict(devices=nd, truncated=trunc is not None, value_error=abs(float(v) - v0),
                                     grad_error=float(np.abs(np.asarray(g) - g0).max()),
                                     grad_norm=float(np.abs(g0).max())))
    import warnings
    # fixed shards under a trace (one device: the engine's own cut): an overflow is warned about
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.block_until_ready(jax.grad(lambda q: sharded.expectation(gc, gh, q, mesh=meshes[1], capacity=64))(gp))
    out["traced_overflow"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    # buckets of one word overflow at once: the driver doubles them and resumes at the unit
    trunc = pp.Truncation(max_terms=15, max_sins=3, per="layer")
    want = float(pp.expectation(c, h, None, truncation=trunc))
    for nd in (2, 4):
        v, stats = sharded.expectation(c, h, None, truncation=trunc, mesh=meshes[nd], bucket=1, return_stats=True)
        out["bucket"].append(dict(devices=nd, error=abs(float(v) - want), bucket=stats.bucket, resumed=stats.resumed))

    def error(f, kind=ValueError):
        try:
            f()
        except kind as e:
            return str(e)
        return None

    small = pp.Circuit(2).h(0).rx(1, pp.Param(0))
    zz = pp.PauliSum.from_list([("ZZ", [0, 1], 1.0)], 2)
    out["errors"]["not_dividing"] = error(lambda: sharded.expectation(small, zz, [0.1], capacity=200,
                                                                      mesh=sharded.default_mesh(jax.devices()[:3])))
    two_axes = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
    out["errors"]["two_axes"] = error(lambda: sharded.expectation(small, zz, [0.1], mesh=two_axes))
    out["errors"]["not_a_mesh"] = error(lambda: sharded.expectation(small, zz, [0.1], mesh=jax.devices()), TypeError)
    out["errors"]["traced_propagate"] = error(lambda: jax.jit(lambda q: sharded.propagate(small, zz, q)[0].coeffs)(
        jnp.array([0.1])), TypeError)
    out["errors"]["traced_stats"] = error(lambda: jax.grad(
        lambda q: sharded.expectation(small, zz, q, return_stats=True)[0])(jnp.array([0.1])))
    out["errors"]["batch"] = error(lambda: sharded.expectation(small, zz, np.zeros((2, 1))))
    out["errors"]["bucket"] = error(lambda: sharded.expectation(small, zz, [0.1], bucket=0))
    out["errors"]["too_small"] = error(lambda: sharded.expectation(small, zz, [0.1], capacity=8))
    out["errors"]["fixed_overflow"] = error(lambda: sharded.expectation(hea, tfim, hea_params, capacity=128,
                                                                        mesh=meshes[2]), MemoryError)
    out["errors"]["no_params"] = error(lambda: sharded.expectation(small, zz))
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return forced_devices_result(SCRIPT, "test_sharded", tmp_path_factory)


SELECT_SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import Mesh, PartitionSpec as P
    from pauliprop.propagation.sharded import radix_select

    mesh = Mesh(np.array(jax.devices()), ("d",))
    out = {"devices": len(jax.devices()), "checked": 0, "wrong": []}
    rng = np.random.default_rng(3)
    most = 160  # every case in one shape (one program a dtype and direction): values past n are not selected
    select = {largest: jax.jit(jax.shard_map(
        lambda v, s, ks, largest=largest: jax.vmap(lambda k: radix_select(v, s, k, "d", largest))(ks),
        mesh=mesh, in_specs=(P("d"), P("d"), P()), out_specs=P(), check_vma=False)) for largest in (True, False)}
    for dtype in (np.uint32, np.uint64):
        for case in range(12):
            n = 4 * int(rng.integers(1, 40))
            # few distinct values (ties, and counts that end exactly at a digit's boundary) or any
            pool = rng.integers(0, np.iinfo(dtype).max, size=int(rng.integers(1, 20)), dtype=dtype, endpoint=True)
            values = rng.choice(pool, most) if case % 2 else rng.integers(0, np.iinfo(dtype).max, most, dtype=dtype)
            sel = (rng.random(most) < rng.uniform(0.2, 1.0)) & (np.arange(most) < n)
            chosen = np.sort(values[sel])
            if not len(chosen):
                continue
            ks = jnp.arange(1, most + 1, dtype=jnp.int32)
            for largest in (True, False):
                got = np.asarray(select[largest](jnp.asarray(values), jnp.asarray(sel), ks))[:len(chosen)]
                want = chosen[::-1] if largest else chosen
                out["checked"] += len(want)
                out["wrong"] += [[str(dtype.__name__), case, largest, int(k)] for k in np.flatnonzero(got != want)][:3]
    print("RESULT " + json.dumps(out))
""")


def test_the_radix_select_finds_the_kth_value_over_the_devices_for_every_k(tmp_path_factory):
    """radix_select (the max_terms cut's threshold and tie key) equals the k-th largest and smallest
    of the selected values spread over 4 devices, for every k, with many ties and without."""
    out = forced_devices_result(SELECT_SCRIPT, "test_sharded_select", tmp_path_factory)
    assert out["checked"] > 1000 and out["wrong"] == [], out


def test_untruncated_terms_and_values_equal_the_single_device_ones(result):
    rows = [r for r in result["cases"] if not r["truncated"]]
    assert len(rows) == 9 and {r["devices"] for r in rows} == {1, 2, 4}
    for r in rows:
        assert r["same_words"] and r["coeff_error"] < 1e-12 and r["value_error"] < 1e-12, r
        assert r["terms"] > 100 and r["peak"][0] == r["peak"][1], r


def test_truncated_runs_keep_the_single_device_terms_and_drop_the_same_norm(result):
    rows = [r for r in result["cases"] if r["truncated"]]
    assert len(rows) == 22 and {r["devices"] for r in rows} == {1, 2, 3, 4}
    for r in rows:
        assert r["same_words"] and r["coeff_error"] < 1e-12 and r["value_error"] < 1e-12, r
        assert r["dropped_error"] < 1e-12 and r["peak"][0] == r["peak"][1], r
    # the cases truncate something (else they would test nothing the untruncated ones do not)
    assert all(r["dropped"] > 1e-3 for r in rows), [r["name"] for r in rows if r["dropped"] <= 1e-3]


def test_every_word_lives_on_the_device_its_hash_names(result):
    assert len(result["placement"]) == 21 and all(result["placement"])


def test_an_overflowing_bucket_grows_and_the_run_resumes_to_the_same_value(result):
    assert [r["devices"] for r in result["bucket"]] == [2, 4]
    for r in result["bucket"]:
        assert r["resumed"] >= 1 and r["bucket"] > 1 and r["error"] < 1e-12, r


def test_gradients_through_the_exchange_equal_the_engine_adjoints(result):
    rows = result["gradients"]
    assert [(r["devices"], r["truncated"]) for r in rows] == [(4, True)]
    for r in rows:
        assert r["value_error"] < 1e-12 and r["grad_error"] < 1e-12 and r["grad_norm"] > 0.1, r


def test_an_overflow_under_a_trace_is_warned_about_not_silent(result):
    assert len(result["traced_overflow"]) == 1 and "pass a larger capacity" in result["traced_overflow"][0]


def test_bad_meshes_and_inputs_name_the_cause(result):
    e = result["errors"]
    assert "capacity 200 does not divide over the mesh's 3 devices" in e["not_dividing"]
    assert "mesh of one axis" in e["two_axes"] and "('a', 'b')" in e["two_axes"]
    assert "must be a jax.sharding.Mesh, got list" in e["not_a_mesh"]
    assert "sharded.propagate runs outside jax transformations" in e["traced_propagate"]
    assert "returns the value only (return_stats=False)" in e["traced_stats"]
    assert "one parameter set" in e["batch"]
    assert "bucket must be a positive int, got 0" in e["bucket"]
    assert "capacity 8 over 4 devices leaves 2 slots a device; at least 64" in e["too_small"]
    assert "a shard needs" in e["fixed_overflow"] and "pass a larger capacity" in e["fixed_overflow"]
    assert "uses 1 parameter(s)" in e["no_params"] and "but params is None" in e["no_params"]

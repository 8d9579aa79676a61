"""Compiled programs that outlive the process: JAX's persistent compilation cache, on by default.

pauliprop's programs depend on the shapes of a circuit's tables, not on its gates
(propagation/schedule.py), so a second process running the same job finds every program it needs on
disk and compiles nothing.
`enable()` runs when pauliprop is imported. It points JAX's cache at the user's cache directory,
`$XDG_CACHE_HOME/pauliprop/jax` (default `~/.cache/pauliprop/jax`), or at `$PAULIPROP_CACHE_DIR`,
and caches every program (JAX's own default skips programs that compile in under a second, which
are most of ours). It leaves alone a cache that is already configured (`jax_compilation_cache_dir`
or `$JAX_COMPILATION_CACHE_DIR`), and does nothing when `$PAULIPROP_NO_CACHE` is set to a
non-empty value other than 0.

Beside it, `Jitted` stores the engine's programs whole, keyed by what fixes them (below), in
`<cache directory>/programs`: a later process loads them without tracing or lowering (with the
same switch: PAULIPROP_NO_CACHE turns both off).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os
import pickle
import threading
from pathlib import Path

import jax
import numpy as np
from jax.experimental import serialize_executable

from . import devices

NO_CACHE = "PAULIPROP_NO_CACHE"
CACHE_DIR = "PAULIPROP_CACHE_DIR"


def cache_directory() -> Path:
    """Where pauliprop keeps compiled programs (whether or not the cache is on)."""
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pauliprop" / "jax"


def disabled() -> bool:
    return os.environ.get(NO_CACHE, "") not in ("", "0")


def enable() -> str | None:
    """Turn JAX's persistent cache on at cache_directory(); returns the directory in use (None: off)."""
    configured = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if configured:
        return str(configured)
    if disabled():
        return None
    path = cache_directory()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: run without the cache
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)


# ---- compiled programs by our own key ---------------------------------------------------------------------
# JAX's cache is keyed by the lowered program, so a process that finds a program there still traces and
# lowers it first: the 127-qubit kicked Ising's loop 0.70 s of tracing and 1.10 s of lowering on an H200,
# where loading the executable took 0.16 s (2026-11-28). A Jitted program given a key is stored whole
# (jax.experimental.serialize_executable) under a digest of that key, the arguments' shapes and dtypes,
# pauliprop's source, the versions of jax and jaxlib, the device and the XLA flags, and a later process
# loads it without tracing anything.

PROGRAMS = "programs"  # the folder of stored executables, inside cache_directory()
MAX_PROGRAMS = 256  # the oldest stored executables past this many are deleted


def programs_directory() -> Path | None:
    """Where stored executables live (None: the cache is off)."""
    return None if disabled() else cache_directory() / PROGRAMS


@functools.cache
def _source_digest() -> str:
    """sha256 of pauliprop's Python source: any change to the code is a new key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.cache
def _environment(backend: str) -> tuple:
    import jaxlib

    device = jax.devices(backend)[0]
    return (_source_digest(), jax.__version__, jaxlib.__version__, device.platform, device.client.platform_version,
            device.device_kind, jax.device_count(backend), os.environ.get("XLA_FLAGS", ""),
            bool(jax.config.jax_enable_x64))


@functools.cache
def _dtype_name(dtype) -> str:
    """numpy's name of a dtype (asked once a dtype: numpy computes it in Python, and a GPU call's signature
    has some fifty leaves)."""
    return np.dtype(dtype).name


def _leaf_type(x) -> tuple:
    dtype = getattr(x, "dtype", None)
    if dtype is None:  # a Python scalar: a weak type
        return (), np.dtype(np.result_type(x)).name, True
    shape = x.shape if hasattr(x, "shape") else np.shape(x)  # arrays, numpy scalars, jax.ShapeDtypeStruct
    return tuple(shape), _dtype_name(dtype), bool(getattr(x, "weak_type", False))


def signature(args) -> tuple:
    """The arguments' structure and each leaf's (shape, dtype, weak type): what a program is compiled for."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple(_leaf_type(x) for x in leaves)


def _stored_path(key: tuple, options: dict | None, kw: dict, sig: tuple) -> Path | None:
    folder = programs_directory()
    if folder is None:
        return None
    backend = devices.backend()
    text = repr((key, sorted((options or {}).items()), sorted(kw.items()), str(sig[0]), sig[1],
                 _environment(backend)))
    return folder / (hashlib.sha256(text.encode()).hexdigest()[:40] + ".bin")


def _load(path: Path):
    try:
        payload = path.read_bytes()
    except OSError:
        return None
    try:
        compiled = serialize_executable.deserialize_and_load(*pickle.loads(payload))
    except Exception:  # noqa: BLE001  a file of another build or a broken one: compile instead
        path.unlink(missing_ok=True)
        return None
    os.utime(path)  # recently used: the last to go
    return compiled


def _store(path: Path, compiled) -> None:
    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError, TypeError, pickle.PicklingError):  # not serializable: not stored
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(payload)
        os.replace(tmp, path)
        stored = sorted(path.parent.glob("*.bin"), key=lambda p: p.stat().st_mtime)
        for old in stored[:max(0, len(stored) - MAX_PROGRAMS)]:
            old.unlink(missing_ok=True)
    except OSError:  # a read-only or full disk: run without storing
        pass


class _Loaded:
    """The executables Jitted programs run in this process, the least recently used dropped past
    `size`; jax.clear_caches() empties it with JAX's own caches (a long process releases executables so:
    XLA:CPU maps each kernel of one separately, and the process's memory maps are limited)."""

    def __init__(self, size: int):
        self._size, self._items = size, collections.OrderedDict()

    def get(self, key):
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key, value):
        self._items[key] = value
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def cache_clear(self):
        self._items.clear()

    def cache_info(self):
        return len(self._items)

    def cache_keys(self):
        return list(self._items)


class _Called:
    """(Jitted, signature) of the keyed programs jax.jit ran in this process with the cache off (its own
    cache holds them): emptied with JAX's caches."""

    def __init__(self):
        self._items = set()

    def add(self, item):
        self._items.add(item)

    def __contains__(self, item):
        return item in self._items

    def cache_clear(self):
        self._items.clear()

    def cache_info(self):
        return len(self._items)


_LOADED = _Loaded(64)
_CALLED = _Called()
try:  # JAX's registry of the caches jax.clear_caches() empties (internal: absent, we only keep more alive)
    from jax._src.util import register_cache

    register_cache(_LOADED, "pauliprop stored programs")
    register_cache(_CALLED, "pauliprop programs run by jax.jit")
except ImportError:
    pass


HIT = "/jax/compilation_cache/cache_hits"  # jax.monitoring's event of a program read from JAX's cache


@contextlib.contextmanager
def _jax_cache_hits():
    """A list that gets an entry for each program JAX's persistent cache supplies in this thread while open."""
    me, hits = threading.get_ident(), []

    def listen(event, **_):
        if event == HIT and threading.get_ident() == me:
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        yield hits
    finally:  # (a jax without unregister_event_listener keeps it: a closure a compilation, its list read by none)
        unregister = getattr(jax.monitoring, "unregister_event_listener", None)
        if unregister is not None:
            unregister(listen)


class Jitted:
    """jax.jit(fn, compiler_options=options, **kw), with two additions.

    * Compiled again without the options this jaxlib's XLA does not know if it rejects one (option names
      come and go between versions: jax 0.11 has no xla_cpu_use_fusion_emitters).
    * Given a `key` (a repr-stable tuple that, with the arguments' shapes, fixes the program: the static
      configuration fn closes over), each compiled executable is stored in programs_directory() and a
      later process loads it instead of tracing, lowering and compiling (see above). Without a key, or
      with the cache off, it is jax.jit's own path. `ready(*args)` says whether a call would find its
      program compiled (kept in this process, or stored)."""

    def __init__(self, fn, options: dict | None, key: tuple | None = None, **kw):
        self._fn, self._options, self._key, self._kw = fn, options, key, kw
        self._jitted = jax.jit(fn, compiler_options=options, **kw)
        self._lock = threading.Lock()

    def _without_unknown_options(self, exc: Exception) -> bool:
        if not self._options or not _rejects_an_option(exc):
            return False
        self._options = {k: v for k, v in self._options.items() if xla_knows(k, v)}
        self._jitted = jax.jit(self._fn, compiler_options=self._options, **self._kw)
        return True

    def _stored(self, sig):
        path = _stored_path(self._key, self._options, self._kw, sig)
        return path, (_load(path) if path is not None and path.exists() else None)

    def _compiled_and_stored(self, args, path: Path | None):
        """Compiled, and stored unless JAX's persistent cache supplied the executable: XLA:CPU serializes
        an executable it loaded from there without some of its kernels, so a later process loading that
        file fails at its first run ("NOT_FOUND: Function subtract_sqrt_fusion not found": the key of a
        program whose code is unchanged after an upgrade, or past MAX_PROGRAMS). That program is traced
        and served by JAX's cache again in a later process, correct, if not as fast."""
        with _jax_cache_hits() as hits:
            compiled = self._jitted.lower(*args).compile()
        if path is not None and not hits:
            _store(path, compiled)
        return compiled

    def _program(self, args, sig):
        with self._lock:
            compiled = _LOADED.get((self, sig))
            if compiled is not None:
                return compiled
            path, compiled = self._stored(sig)
            if compiled is None:
                try:
                    compiled = self._compiled_and_stored(args, path)
                except jax.errors.JaxRuntimeError as exc:
                    if not self._without_unknown_options(exc):
                        raise
                    path, compiled = self._stored(sig)  # the key without the unknown options
                    compiled = compiled or self._compiled_and_stored(args, path)
            _LOADED.put((self, sig), compiled)
            return compiled

    def ready(self, *args) -> bool:
        """Whether a call with arguments of these shapes and dtypes (arrays or jax.ShapeDtypeStruct) finds its
        program compiled: kept in this process or stored on disk (a keyed program; else False)."""
        if self._key is None:
            return False
        sig = signature(args)
        if _LOADED.get((self, sig)) is not None or (self, sig) in _CALLED:
            return True
        path = _stored_path(self._key, self._options, self._kw, sig)
        return path is not None and path.exists()

    def __call__(self, *args):
        if self._key is not None and programs_directory() is not None:
            return self._program(args, signature(args))(*args)
        if self._key is not None:  # the cache off: jax.jit's own cache holds the program; ready() notes it
            _CALLED.add((self, signature(args)))
        try:
            return self._jitted(*args)
        except jax.errors.JaxRuntimeError as exc:  # raised while compiling: no buffer was donated
            if not self._without_unknown_options(exc):
                raise
            return self._jitted(*args)

    def __getattr__(self, name):  # trace, lower, ...
        return getattr(self._jitted, name)


@functools.cache
def xla_knows(option: str, value) -> bool:
    """Whether XLA takes this compile option (a trivial CPU program compiled with it, once a process)."""
    try:
        with jax.default_device(jax.devices("cpu")[0]):
            jax.jit(lambda x: x + 1, compiler_options={option: value}).lower(np.float32(0)).compile()
    except jax.errors.JaxRuntimeError as exc:
        if _rejects_an_option(exc):
            return False
        raise
    return True


def _rejects_an_option(exc: Exception) -> bool:
    """Whether XLA's error is its refusal of a compile option it does not know."""
    return "compile option" in str(exc) or "setting option" in str(exc)

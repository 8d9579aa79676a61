"""JAX-level support that knows nothing of Pauli words or circuits: the persistent compilation cache
(compilation), array primitives tuned per backend (prefix: prefix sums, first-k selection, on_cpu),
a batching rule under which a vmapped batch shares one branch per step (batching), the device's
memory and what is free of it, and the host's cores (memory), and the device and platform computations run
on, following jax.default_device (devices).

Imports nothing else of pauliprop; every other folder may import it."""

"""runtime.devices: the device and platform every part of pauliprop runs on follow jax.default_device."""

from __future__ import annotations

import jax
import pytest

from pauliprop.runtime import devices


def test_without_a_default_device_it_is_jaxs_default_backend():
    assert devices.device() == jax.devices()[0]
    assert devices.backend() == jax.default_backend()


def test_a_default_device_set_in_a_block_is_followed_there_only():
    cpu = jax.devices("cpu")[-1]
    with jax.default_device(cpu):
        assert devices.device() == cpu and devices.backend() == "cpu"
    with jax.default_device("cpu"):  # a platform's name
        assert devices.device().platform == "cpu" and devices.backend() == "cpu"
    assert devices.device() == jax.devices()[0]


def test_resolve_takes_devices_and_platform_names_and_names_what_it_refuses():
    assert devices.resolve("cpu").platform == "cpu"
    assert devices.resolve(jax.devices()[0]) == jax.devices()[0]
    with pytest.raises(ValueError, match="device 'nosuch'"):
        devices.resolve("nosuch")
    with pytest.raises(TypeError, match="jax.Device or a platform's name"):
        devices.resolve(3)

"""Test-wide setup: 8 simulated CPU devices, so mesh-sharded code runs here.

Must run before jax is imported anywhere, which is why it lives in conftest.
"""
import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: takes more than ~30 s on 2 cores")
